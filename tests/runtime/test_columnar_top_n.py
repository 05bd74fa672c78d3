"""The Top-N without a window on batches: its changelog for a kept row number, for a
deduplication (n = 1) and for n > 1 without row numbers, held against a Python ranking
of every row so far (ties by arrival) after every batch, on both backends, and through
a snapshot restored at another parallelism."""

from __future__ import annotations

import collections
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from aggregate_support import BACKENDS, operator_on, snapshot_target
from columnar_support import MAX_P
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from epochstream.core.changelog import OP, kind_names, with_kinds
from epochstream.core.clock import ManualClock
from epochstream.exceptions import ConfigurationError, DataError, StateError
from epochstream.graph.specs import TopNSpec
from epochstream.state.column_keygroups import key_groups_by_columns
from epochstream.state.handles import OperatorRestore

KIND = "columnar_top_n"
SCHEMA = pa.schema([("p", pa.int64()), ("q", pa.string()), ("x", pa.int64()), ("id", pa.int64())])


def _op(
    spec: TopNSpec,
    subtask: int = 0,
    parallelism: int = 1,
    backend: str = "heap",
    local_dir: str = "",
) -> Any:
    return operator_on(
        KIND,
        spec,
        spec.partition_by,
        subtask=subtask,
        parallelism=parallelism,
        backend=backend,
        local_dir=local_dir,
    )


def _batch(rows: list[dict[str, Any]]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(rows, schema=SCHEMA)


def _applied(batches: list[pa.RecordBatch]) -> collections.Counter:
    """The rows a changelog leaves (a multiset; a retraction of a row not there fails)."""
    held: collections.Counter = collections.Counter()
    for batch in batches:
        kinds = kind_names(batch.column(OP)).to_pylist()
        for row, kind in zip(batch.drop_columns([OP]).to_pylist(), kinds, strict=True):
            key = tuple(row.items())
            if kind in ("-U", "-D"):
                assert held[key] > 0, f"{kind} of a row not there: {row}"
                held[key] -= 1
            else:
                held[key] += 1
    return +held


def _reference(rows: list[dict[str, Any]], spec: TopNSpec) -> collections.Counter:
    """The first n rows per partition of ``rows`` (arrival order breaks ties)."""
    parts: dict[Any, list[tuple[int, dict[str, Any]]]] = collections.defaultdict(list)
    for i, row in enumerate(rows):
        parts[tuple(row[c] for c in spec.partition_by)].append((i, row))

    def key(item: tuple[int, dict[str, Any]]) -> tuple[Any, ...]:
        parts_ = []
        for column, direction in spec.order_by:
            value = item[1][column]
            # NULLs first ascending, last descending.
            if direction == "asc":
                parts_.append((value is not None, value if value is not None else 0))
            else:
                parts_.append((value is None, -value if value is not None else 0))
        return (*parts_, item[0])

    out: collections.Counter = collections.Counter()
    for members in parts.values():
        for rank, (_, row) in enumerate(sorted(members, key=key)[: spec.n], start=1):
            shown = dict(row)
            if spec.rank_column:
                shown[spec.rank_column] = rank
            out[tuple(shown.items())] += 1
    return out


def test_a_dedup_updates_its_partitions_row_and_a_ranking_its_row_numbers() -> None:
    dedup = TopNSpec(("p",), (("x", "desc"),), 1)
    op, out = _op(dedup)
    op.process_batch(_batch([{"p": 1, "q": "a", "x": 5, "id": 0}]), None)
    op.process_batch(_batch([{"p": 1, "q": "a", "x": 5, "id": 1}]), None)  # a tie: stays
    op.process_batch(_batch([{"p": 1, "q": "a", "x": 9, "id": 2}]), None)
    kinds = [kind_names(b.column(OP)).to_pylist() for b in out.batches()]
    assert kinds == [["+I"], ["-U", "+U"]]
    assert [r["id"] for r in out.batches()[1].to_pylist()] == [0, 2]
    ranked = TopNSpec(("p",), (("x", "asc"),), 2, "rn")
    op, out = _op(ranked)
    op.process_batch(_batch([{"p": 1, "q": "a", "x": 5, "id": 0}]), None)
    op.process_batch(_batch([{"p": 1, "q": "a", "x": 3, "id": 1}]), None)
    second = out.batches()[1].to_pylist()
    assert [(r[OP], r["rn"], r["id"]) for r in second] == [(1, 1, 0), (2, 1, 1), (0, 2, 0)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_keeping_the_first_row_by_arrival_is_insert_only(tmp_path: Path, backend: str) -> None:
    """No order keys: each partition's first row to arrive, once, as a plain insert (no
    ``_op``); later rows of a partition, in the same batch or later ones, and after a
    restore at another parallelism, are dropped."""
    spec = TopNSpec(("p",), (), 1)
    assert spec.by_arrival
    rng = random.Random(5)
    rows = [{"p": rng.randint(0, 20), "q": "a", "x": i % 7, "id": i} for i in range(400)]
    first = {}
    for row in rows:
        first.setdefault(row["p"], row["id"])
    emitted: list[pa.RecordBatch] = []
    handles = []
    for subtask in range(2):
        op, out = _op(spec, subtask, 2, backend, str(tmp_path))
        groups = op.keyed.key_group_range
        for i in range(0, 200, 25):
            batch = _batch(rows[i : i + 25])
            kgs = key_groups_by_columns([batch.column("p")], MAX_P, rows=batch.num_rows)
            op.process_batch(batch.filter(pa.array([int(g) in groups for g in kgs])), None)
        emitted += out.batches()
        handle = op.snapshot(snapshot_target(tmp_path, 1, subtask)).keyed.run()
        if handle is not None:
            handles.append(handle)
    for subtask in range(3):
        op, out = _op(spec, subtask, 3, backend, str(tmp_path))
        groups = op.keyed.key_group_range
        op.initialize_state(
            OperatorRestore(keyed=[p for h in handles if (p := h.restricted_to(groups))]), 1
        )
        batch = _batch(rows[200:])
        kgs = key_groups_by_columns([batch.column("p")], MAX_P, rows=batch.num_rows)
        op.process_batch(batch.filter(pa.array([int(g) in groups for g in kgs])), None)
        emitted += out.batches()
    assert all(OP not in b.schema.names for b in emitted)
    got = sorted((r["p"], r["id"]) for b in emitted for r in b.to_pylist())
    assert got == sorted(first.items())


def test_a_top_n_without_order_keys_is_only_a_first_row() -> None:
    with pytest.raises(ConfigurationError, match="first row by arrival: n=1, no rank"):
        TopNSpec(("p",), (), 2)
    with pytest.raises(ConfigurationError, match="first row by arrival"):
        TopNSpec(("p",), (), 1, "rn")


def test_a_changelog_input_and_a_taken_rank_name_are_refused() -> None:
    op, _ = _op(TopNSpec(("p",), (("x", "desc"),), 1))
    with pytest.raises(DataError, match=r"columnar_top_n \(1/1\): the input is a changelog"):
        op.process_batch(with_kinds(_batch([{"p": 1, "q": "a", "x": 1, "id": 0}]), [3]), None)
    op, _ = _op(TopNSpec(("p",), (("x", "desc"),), 1, "x"))
    with pytest.raises(DataError, match="has a column 'x' already"):
        op.process_batch(_batch([{"p": 1, "q": "a", "x": 1, "id": 0}]), None)


@st.composite
def _scenarios(draw: Any) -> tuple[TopNSpec, list[list[dict[str, Any]]]]:
    partition = draw(st.sampled_from([(), ("p",), ("p", "q")]))
    order = draw(
        st.sampled_from([(("x", "desc"),), (("x", "asc"),), (("x", "desc"), ("id", "asc"))])
    )
    n = draw(st.integers(1, 4))
    rank = draw(st.sampled_from([None, "rn"]))
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    rows = [
        {
            "p": rng.choice([None, 1, 2]),
            "q": rng.choice([None, "a", "é"]),
            "x": rng.choice([None, rng.randint(0, 6)]),
            "id": i,
        }
        for i in range(draw(st.integers(1, 80)))
    ]
    cuts = (
        sorted(rng.sample(range(1, len(rows)), min(len(rows) - 1, rng.randint(0, 8))))
        if len(rows) > 1
        else []
    )
    batches = [rows[a:b] for a, b in zip([0, *cuts], [*cuts, len(rows)], strict=True)]
    return TopNSpec(partition, order, n, rank), batches


def _run(scenario: Any, backend: str) -> None:
    spec, batches = scenario
    scratch = tempfile.mkdtemp(prefix="tn-test-")
    try:
        op, out = _op(spec, backend=backend, local_dir=scratch)
        seen: list[dict[str, Any]] = []
        for batch in batches:
            op.process_batch(_batch(batch), None)
            seen += batch
            assert _applied(out.batches()) == _reference(seen, spec)
        op.keyed.dispose()
    finally:
        shutil.rmtree(scratch)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_scenarios())
def test_the_changelog_leaves_the_first_rows_after_every_batch(scenario: Any) -> None:
    _run(scenario, "heap")


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_scenarios())
def test_the_changelog_leaves_the_first_rows_after_every_batch_on_rocksdb(scenario: Any) -> None:
    _run(scenario, "rocksdb")


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_restore_at_another_parallelism_continues_the_changelog(
    tmp_path: Path, backend: str
) -> None:
    rng = random.Random(2)
    spec = TopNSpec(("p", "q"), (("x", "desc"),), 2, "rn")
    rows = [
        {"p": rng.randint(0, 9), "q": rng.choice(["a", None]), "x": rng.randint(0, 50), "id": i}
        for i in range(300)
    ]
    first, second = _batch(rows[:150]), _batch(rows[150:])

    def mine(batch: pa.RecordBatch, groups: range) -> pa.RecordBatch:
        kgs = key_groups_by_columns(
            [batch.column("p"), batch.column("q")], MAX_P, rows=batch.num_rows
        )
        return batch.filter(pa.array([int(g) in groups for g in kgs]))

    emitted: list[pa.RecordBatch] = []
    handles = []
    for subtask in range(2):
        op, out = _op(spec, subtask, 2, backend, str(tmp_path))
        for i in range(0, first.num_rows, 30):
            op.process_batch(mine(first.slice(i, 30), op.keyed.key_group_range), None)
        emitted += out.batches()
        handle = op.snapshot(snapshot_target(tmp_path, 1, subtask)).keyed.run()
        if handle is not None:
            handles.append(handle)
    for subtask in range(3):
        op, out = _op(spec, subtask, 3, backend, str(tmp_path))
        groups = op.keyed.key_group_range
        op.initialize_state(
            OperatorRestore(keyed=[p for h in handles if (p := h.restricted_to(groups))]), 1
        )
        op.process_batch(mine(second, groups), None)
        emitted += out.batches()
    assert _applied(emitted) == _reference(rows, spec)


def test_restore_refuses_state_of_another_query(tmp_path: Path) -> None:
    op, _ = _op(TopNSpec(("p",), (("x", "desc"),), 1))
    op.process_batch(_batch([{"p": 1, "q": "a", "x": 1, "id": 0}]), None)
    handle = op.snapshot(snapshot_target(tmp_path, 1, 0)).keyed.run()
    new, _ = _op(TopNSpec(("p",), (("missing", "desc"),), 1))
    with pytest.raises(StateError, match="another uid"):
        new.initialize_state(OperatorRestore(keyed=[handle]), 1)


def _changes(out: Any) -> list[tuple[Any, ...]]:
    """The changes emitted since the last call, as sorted (kind, p, x, rank)."""
    rows = []
    for batch in out.batches():
        kinds = kind_names(batch.column(OP)).to_pylist()
        for row, kind in zip(batch.to_pylist(), kinds, strict=True):
            rows.append((kind, row["p"], row["x"], row["r"]))
    out.items.clear()
    return sorted(rows, key=repr)


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_a_partition_expires_silently_under_a_state_ttl_and_starts_afresh(
    tmp_path: Path, backend: str
) -> None:
    clock = ManualClock(start=1_000.0)
    spec = TopNSpec(("p",), (("x", "desc"),), 2, "r", state_ttl_ms=10_000)
    op, out = operator_on(KIND, spec, ("p",), backend=backend, local_dir=str(tmp_path), clock=clock)

    def rows(*pxs: tuple[int, int]) -> pa.RecordBatch:
        return _batch([{"p": p, "q": "a", "x": x, "id": 0} for p, x in pxs])

    op.process_batch(rows((1, 5), (1, 4), (2, 3)), None)
    assert _changes(out) == [("+I", 1, 4, 2), ("+I", 1, 5, 1), ("+I", 2, 3, 1)]
    clock.advance(6)
    op.process_batch(rows((2, 1)), None)
    assert _changes(out) == [("+I", 2, 1, 2)]
    clock.advance(5)  # partition 1 was written 11 s ago: expired; partition 2 5 s ago
    op.process_watermark(1)
    assert _changes(out) == []
    assert sorted(op.state_table().column("p").to_pylist()) == [2, 2]
    # Partition 1 starts afresh: 1 ranks first (5 and 4 are gone), an insert.
    op.process_batch(rows((1, 1)), None)
    assert _changes(out) == [("+I", 1, 1, 1)]


def test_switching_a_top_n_s_ttl_on_against_kept_state_asks_for_a_new_uid(
    tmp_path: Path,
) -> None:
    spec = TopNSpec(("p",), (("x", "desc"),), 1)
    op, _ = _op(spec)
    op.process_batch(_batch([{"p": 1, "q": "a", "x": 1, "id": 0}]), None)
    handle = op.snapshot(snapshot_target(tmp_path, 1)).keyed.run()
    with_ttl, _ = _op(TopNSpec(("p",), (("x", "desc"),), 1, state_ttl_ms=5))
    with pytest.raises(StateError, match=r"switching table\.exec\.state\.ttl on or off"):
        with_ttl.initialize_state(OperatorRestore(keyed=[handle]), 1)
