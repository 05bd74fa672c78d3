"""DeltaSink(mode="upsert"): changelogs folded by key per checkpoint and merged into a
real Delta table (deltalake) in one commit, exactly once; checked against a Python
reference of the changelog applied by key."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from epochstream.connectors.base import SinkContext
from epochstream.connectors.delta import DeltaSink
from epochstream.connectors.delta_upsert import fold_by_key
from epochstream.core.changelog import OP, RowKind
from epochstream.exceptions import ConfigurationError, SinkError

deltalake = pytest.importorskip("deltalake")

SCHEMA = pa.schema([("k", pa.string()), ("n", pa.int64()), (OP, pa.int8())])


def ctx(subtask: int = 0, attempt: int = 0) -> SinkContext:
    return SinkContext(subtask, 2, attempt, "cafebabe00", True)


def changes(*rows: tuple[str | None, int, RowKind]) -> pa.RecordBatch:
    return pa.record_batch(
        [
            pa.array([r[0] for r in rows], pa.string()),
            pa.array([r[1] for r in rows], pa.int64()),
            pa.array([r[2].value for r in rows], pa.int8()),
        ],
        schema=SCHEMA,
    )


def table_rows(path: Path) -> dict[str | None, int]:
    table = deltalake.DeltaTable(str(path)).to_pyarrow_table()
    assert table.schema.names == ["k", "n"]
    out = {r["k"]: r["n"] for r in table.to_pylist()}
    assert len(out) == table.num_rows, "one row per key"
    return out


def commits(path: Path) -> list[tuple[str, list[Any]]]:
    """Each Delta commit's operation and its application transactions' versions."""
    out = []
    for log in sorted((path / "_delta_log").glob("*.json")):
        actions = [json.loads(line) for line in log.read_text().splitlines()]
        op = next(a["commitInfo"]["operation"] for a in actions if "commitInfo" in a)
        out.append((op, [a["txn"]["version"] for a in actions if "txn" in a]))
    return out


def apply(state: dict[str | None, int], rows: list[tuple[str | None, int, RowKind]]) -> None:
    """The reference: a changelog applied by key."""
    for k, n, kind in rows:
        if kind == RowKind.DELETE:
            state.pop(k, None)
        elif kind != RowKind.UPDATE_BEFORE:
            state[k] = n


def test_fold_keeps_the_last_change_of_each_key() -> None:
    folded = fold_by_key(
        pa.Table.from_batches(
            [
                changes(
                    ("a", 1, RowKind.INSERT),
                    ("b", 1, RowKind.INSERT),
                    ("a", 1, RowKind.UPDATE_BEFORE),
                    ("a", 2, RowKind.UPDATE_AFTER),
                    ("b", 1, RowKind.DELETE),
                    (None, 7, RowKind.INSERT),
                    ("c", 3, RowKind.UPDATE_BEFORE),
                )
            ]
        ),
        ["k"],
    )
    assert folded.to_pylist() == [
        {"k": "a", "n": 2, OP: 2},
        {"k": "b", "n": 1, OP: 3},
        {"k": None, "n": 7, OP: 0},
    ]


def test_changelog_merges_once_per_checkpoint_and_equals_the_reference(tmp_path: Path) -> None:
    path = tmp_path / "t"
    sink = DeltaSink(path, mode="upsert", key=["k"])
    writers = [sink.create_writer(ctx(subtask=i)) for i in range(2)]
    committer = sink.create_committer("job")
    rng = random.Random(7)
    expected: dict[str | None, int] = {}
    previous: dict[str | None, int] = {}
    current: dict[str | None, int] = {}
    for checkpoint in range(1, 9):
        for _ in range(3):
            rows: list[tuple[str | None, int, RowKind]] = []
            for _ in range(40):
                k = rng.choice(["a", "b", "c", "d", "e", None])
                if k in current and rng.random() < 0.3:
                    rows.append((k, current.pop(k), RowKind.DELETE))
                elif k in current:
                    rows.append((k, current[k], RowKind.UPDATE_BEFORE))
                    current[k] = rng.randrange(100)
                    rows.append((k, current[k], RowKind.UPDATE_AFTER))
                else:
                    current[k] = rng.randrange(100)
                    rows.append((k, current[k], RowKind.INSERT))
            # A key's changes go to one subtask, as a keyed result's do.
            for i, w in enumerate(writers):
                w.write_batch(changes(*[r for r in rows if (r[0] in ("a", "c", None)) == (i == 0)]))
            apply(expected, rows)
        entries = [e for w in writers for e in w.snapshot(checkpoint)]
        assert {e.checkpoint_id for e in entries} == ({4, 5} if checkpoint == 5 else {checkpoint})
        if checkpoint > 1:  # nothing shows before the checkpoint completes
            assert table_rows(path) == previous
        committer.commit(checkpoint, entries)
        # Subtask 1 misses checkpoint 4's completion: it sends those changes again with
        # checkpoint 5's, and the committer leaves them out (merged already).
        for w in writers if checkpoint != 4 else writers[:1]:
            w.notify_checkpoint_complete(checkpoint)
        assert table_rows(path) == expected, checkpoint
        previous = dict(expected)
    assert [c[1] for c in commits(path)] == [[i] for i in range(1, 9)]
    assert {c[0] for c in commits(path)[1:]} == {"MERGE"}


def test_a_replayed_commit_does_nothing_and_aborted_changes_roll_forward(tmp_path: Path) -> None:
    path = tmp_path / "t"
    sink = DeltaSink(path, mode="upsert", key=["k"], sink_id="counts")
    w = sink.create_writer(ctx())
    w.restore([])
    w.write_batch(changes(("a", 1, RowKind.INSERT), ("b", 1, RowKind.INSERT)))
    sink.create_committer("job").commit(1, w.snapshot(1))
    w.notify_checkpoint_complete(1)
    w.write_batch(changes(("a", 1, RowKind.UPDATE_BEFORE), ("a", 2, RowKind.UPDATE_AFTER)))
    w.snapshot(2)  # checkpoint 2 aborted: its changes stay pending
    w.write_batch(changes(("b", 1, RowKind.DELETE)))
    third = w.snapshot(3)
    assert [e.checkpoint_id for e in third] == [2, 3]
    w.close()  # crash: checkpoint 3 completed, its merge did not happen
    committer = sink.create_committer("job")
    committer.commit(3, third)  # the restore merges the restored checkpoint ...
    committer.commit(3, third)  # ... a second restore repeats it: nothing happens
    sink.create_committer("job2").commit(3, third)
    assert table_rows(path) == {"a": 2}
    assert [c[1] for c in commits(path)] == [[1], [3]]
    # The restored attempt goes on from the checkpoint's state.
    restored = sink.create_writer(ctx(attempt=1))
    restored.restore(third)
    restored.write_batch(changes(("b", 5, RowKind.INSERT)))
    committer.commit(4, restored.snapshot(4))
    assert table_rows(path) == {"a": 2, "b": 5}


def test_rows_upsert_and_bad_input_fails_clearly(tmp_path: Path) -> None:
    sink = DeltaSink(tmp_path / "t", mode="upsert", key=["k"])
    w = sink.create_writer(ctx())
    w.write_batch([{"k": "a", "n": 1}, {"k": "a", "n": 4}])
    sink.create_committer("job").commit(1, w.snapshot(1))
    assert table_rows(tmp_path / "t") == {"a": 4}
    with pytest.raises(SinkError, match=r"lack the key columns \['k'\]") as info:
        w.write_batch(pa.record_batch({"n": [1]}))
    assert info.value.suppress_restarts
    w.write_batch(changes(("a", 1, RowKind.INSERT)))
    with pytest.raises(SinkError, match="schema differs"):
        w.write_batch(pa.record_batch({"k": ["b"], "n": pa.array([1], pa.int32())}))


def test_upsert_settings_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="needs key"):
        DeltaSink(tmp_path / "t", mode="upsert")
    with pytest.raises(ConfigurationError, match="key applies to mode='upsert'"):
        DeltaSink(tmp_path / "t", key=["k"])
    with pytest.raises(ConfigurationError, match="row kind"):
        DeltaSink(tmp_path / "t", mode="upsert", key=[OP])
    with pytest.raises(TypeError):
        DeltaSink(tmp_path / "t", "upsert", ["k"])  # type: ignore[misc]


KEYS, N = 37, 6_000


def _change(i: int) -> tuple[int, int, str]:
    """Value ``i``'s change: an upsert of key ``i % KEYS`` to ``i``, every fifth round a
    delete."""
    return (i % KEYS, i, "-D" if (i // KEYS) % 5 == 4 else "+U")


@pytest.mark.slow
def test_a_job_restored_mid_stream_merges_each_change_once(tmp_path: Path) -> None:
    import epochstream as es

    env = es.Environment(parallelism=1, runner="local")
    env.enable_checkpointing(0.2, storage=str(tmp_path / "ck"))
    env.set_restart_strategy(es.restart.fixed_delay(attempts=2, delay=0.1))
    injector = es.testing.FailOnce(
        after_records=N // 2, after_checkpoints=2, marker_dir=str(tmp_path)
    )
    schema = pa.schema([("k", pa.int64()), ("n", pa.int64()), ("op", pa.string())])
    (
        env.from_sequence(0, N, rate=3_000)
        .uid("numbers")
        .map(injector)
        .uid("fail")
        .map(_change)
        .to_batches(schema)
        .from_changelog("op")
        .sink_to(DeltaSink(tmp_path / "t", mode="upsert", key=["k"]))
        .uid("delta")
    )
    result = env.execute("delta-upsert-restore")
    assert result.restarts == 1 and injector.failures_so_far() == 1
    expected: dict[int, int] = {}
    for i in range(N):
        k, n, op = _change(i)
        if op == "-D":
            expected.pop(k, None)
        else:
            expected[k] = n
    table = deltalake.DeltaTable(str(tmp_path / "t")).to_pyarrow_table()
    assert {r["k"]: r["n"] for r in table.to_pylist()} == expected
    assert table.num_rows == len(expected)
    versions = [v for _, txns in commits(tmp_path / "t") for v in txns]
    assert versions == sorted(set(versions)) and len(versions) > 2
