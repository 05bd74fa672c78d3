"""PostgresSink against a real PostgreSQL server (tests/pg_server.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from epochstream.connectors.base import SinkContext
from epochstream.connectors.postgres import PostgresSink
from epochstream.exceptions import ConfigurationError, SinkError

psycopg = pytest.importorskip("psycopg")

JOB = "feedc0de00000000"


def ctx(
    subtask: int = 0, attempt: int = 0, job_id: str = JOB, *, checkpointing: bool = True
) -> SinkContext:
    return SinkContext(subtask, 2, attempt, job_id, checkpointing=checkpointing)


def query(dsn: str, sql: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(sql).fetchall()


@pytest.fixture
def dsn(postgres_dsn: str) -> str:
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE counts (word text, n bigint)")
        conn.execute("CREATE TABLE latest (word text PRIMARY KEY, n bigint, note text)")
    return postgres_dsn


def prepared(dsn: str) -> list[str]:
    return [r[0] for r in query(dsn, "SELECT gid FROM pg_prepared_xacts ORDER BY gid")]


def test_prepare_at_snapshot_commit_on_completion(dsn: str) -> None:
    w = PostgresSink(dsn, "counts").create_writer(ctx(subtask=1))
    w.restore([])
    w.write_batch([{"word": "a", "n": 1}, ("b", 2)])
    w.write_batch([("c", 3)])
    (gid,) = w.snapshot(4)
    assert gid == "es-counts-feedc0de-a0-s1-c4-1", "names sink, job, attempt, subtask, checkpoint"
    assert query(dsn, "SELECT count(*) FROM counts") == [(0,)], "prepared rows are invisible"
    assert prepared(dsn) == [gid]
    w.write_batch([("d", 4)])  # the next checkpoint's transaction
    w.notify_checkpoint_complete(4)
    assert sorted(query(dsn, "SELECT word, n FROM counts")) == [("a", 1), ("b", 2), ("c", 3)]
    assert prepared(dsn) == []
    w.close()
    assert query(dsn, "SELECT count(*) FROM counts") == [(3,)], "the open transaction is dropped"


def test_recovery_commits_recorded_and_rolls_back_other_prepared_transactions(dsn: str) -> None:
    sink = PostgresSink(dsn, "counts")
    old = [sink.create_writer(ctx(subtask=i)) for i in range(2)]
    for i, w in enumerate(old):
        w.restore([])
        w.write_batch([(f"cp5-{i}", 5)])
    entries = [e for w in old for e in w.snapshot(5)]  # checkpoint 5 completes ...
    for i, w in enumerate(old):
        w.write_batch([(f"cp6-{i}", 6)])
    for w in old:
        w.snapshot(6)  # ... checkpoint 6 is prepared but never completes: a crash
    old[0].notify_checkpoint_complete(5)  # subtask 0 heard of 5 before the crash; 1 did not
    for w in old:
        w.close()
    assert len(prepared(dsn)) == 3

    new = [sink.create_writer(ctx(subtask=i, attempt=1)) for i in range(2)]
    for w in new:
        w.restore(entries)
    assert sorted(query(dsn, "SELECT word FROM counts")) == [("cp5-0",), ("cp5-1",)]
    assert prepared(dsn) == [], "checkpoint 6's transactions are rolled back"
    for w in new:
        w.close()


def test_recovery_leaves_other_sinks_prepared_transactions_alone(dsn: str) -> None:
    other = PostgresSink(dsn, "counts", sink_id="other").create_writer(ctx())
    other.restore([])
    other.write_batch([("x", 1)])
    (gid,) = other.snapshot(1)
    mine = PostgresSink(dsn, "counts").create_writer(ctx(attempt=3))
    mine.restore([])
    assert prepared(dsn) == [gid]
    other.notify_checkpoint_complete(1)
    for w in (other, mine):
        w.close()


def test_upsert_mode_keeps_the_last_value_per_key_and_is_idempotent(dsn: str) -> None:
    sink = PostgresSink(dsn, "latest", mode="upsert", key_columns=["word"])
    assert sink.transactional is False
    for _ in range(2):  # the second run replays the same records
        w = sink.create_writer(ctx())
        w.restore([])
        w.write_batch([{"word": "a", "n": 1, "note": "x"}, {"word": "b", "n": 1, "note": "y"}])
        w.write_batch([{"word": "a", "n": 2, "note": "z"}, {"word": "a", "n": 3, "note": "w"}])
        assert w.snapshot(1) == []
        w.close()
    assert sorted(query(dsn, "SELECT word, n, note FROM latest")) == [("a", 3, "w"), ("b", 1, "y")]


def test_bad_configuration_and_records_are_named(dsn: str) -> None:
    with pytest.raises(ConfigurationError, match="needs key_columns"):
        PostgresSink(dsn, "latest", mode="upsert")
    with pytest.raises(ConfigurationError, match="mode"):
        PostgresSink(dsn, "latest", mode="merge")
    with pytest.raises(ConfigurationError, match="'nope' does not exist"):
        PostgresSink(dsn, "nope").create_writer(ctx())
    with pytest.raises(ConfigurationError, match=r"no columns \['wrd'\]"):
        PostgresSink(dsn, "counts", columns=["wrd"]).create_writer(ctx())
    w = PostgresSink(dsn, "counts").create_writer(ctx())
    w.restore([])
    with pytest.raises(SinkError, match=r"record \{'word': 'a'\} lacks columns") as info:
        w.write_batch([{"word": "a"}])
    assert info.value.suppress_restarts
    with pytest.raises(SinkError, match=r"record \('a',\) is not a dict or a 2-tuple"):
        w.write_batch([("a",)])
    w.close()


def _batch(words: list[str], ns: list[int], **extra: Any) -> Any:
    import pyarrow as pa

    # The runtime's event-time column rides along; the sink leaves it out.
    return pa.record_batch(
        {"n": pa.array(ns, pa.int64()), "word": words, "_ts": [0] * len(words), **extra}
    )


def test_batches_are_copied_by_column_name_and_a_restore_keeps_exactly_once(dsn: str) -> None:
    sink = PostgresSink(dsn, "counts")
    crashed = sink.create_writer(ctx())
    crashed.restore([])
    crashed.write_batch(_batch(["a", "b"], [1, 2]))
    crashed.write_batch([("c", 3)])  # a union of forms: rows into the same transaction
    entries = crashed.snapshot(1)  # checkpoint 1 completes; the commit never happens
    crashed.write_batch(_batch(["lost"], [9]))
    crashed.snapshot(2)  # checkpoint 2 never completes
    crashed.close()
    assert query(dsn, "SELECT count(*) FROM counts") == [(0,)]
    restored = sink.create_writer(ctx(attempt=1))
    restored.restore(entries)
    assert sorted(query(dsn, "SELECT word, n FROM counts")) == [("a", 1), ("b", 2), ("c", 3)]
    assert prepared(dsn) == [], "checkpoint 2's transaction is rolled back"
    restored.write_batch(_batch(["d"], [4]))
    restored.snapshot(2)
    restored.notify_checkpoint_complete(2)
    restored.close()
    assert sorted(query(dsn, "SELECT word FROM counts")) == [("a",), ("b",), ("c",), ("d",)]


def test_batches_upsert_their_last_row_per_key_and_missing_columns_are_named(dsn: str) -> None:
    import pyarrow as pa

    sink = PostgresSink(dsn, "latest", mode="upsert", key_columns=["word"])
    for _ in range(2):  # the second run replays the same batch
        w = sink.create_writer(ctx())
        w.restore([])
        w.write_batch(_batch(["a", "b", "a"], [1, 1, 3], note=pa.array(["x", "y", None])))
        w.snapshot(1)
        w.close()
    assert sorted(query(dsn, "SELECT word, n, note FROM latest")) == [("a", 3, None), ("b", 1, "y")]
    w = sink.create_writer(ctx())
    with pytest.raises(SinkError, match=r"lacks \['note'\] of the columns written") as info:
        w.write_batch(_batch(["a"], [1]))
    assert info.value.suppress_restarts
    w.close()


def test_columnar_job_into_postgres_commits_its_input_exactly(dsn: str, tmp_path: Path) -> None:
    import epochstream as es

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE seq (value bigint)")
    env = es.Environment(parallelism=2, runner="local")
    env.enable_checkpointing(0.1, storage=str(tmp_path / "ckpt"))
    (
        env.from_sequence(0, 3_000, batch_size=100, rate=15_000)
        .uid("numbers")
        .sink_to(PostgresSink(dsn, "seq"))
        .uid("pg")
    )
    env.execute("columnar-postgres")
    assert [r[0] for r in query(dsn, "SELECT value FROM seq ORDER BY value")] == list(range(3_000))
    assert prepared(dsn) == []


def test_a_changelog_batch_upserts_deletes_and_skips_update_befores(dsn: str) -> None:
    import pyarrow as pa

    from epochstream.core.changelog import RowKind, with_kinds

    sink = PostgresSink(dsn, "latest", mode="upsert", key_columns=["word"])
    w = sink.create_writer(ctx())
    w.restore([])
    w.write_batch(_batch(["a", "b", "c"], [1, 1, 1], note=pa.array(["x", "y", "z"])))
    changes = with_kinds(
        _batch(["a", "a", "b", "c", "c"], [1, 2, 1, 1, 5], note=pa.array([None] * 5)),
        [
            RowKind.UPDATE_BEFORE,
            RowKind.UPDATE_AFTER,
            RowKind.DELETE,
            RowKind.DELETE,
            RowKind.INSERT,
        ],
    )
    w.write_batch(changes)  # a: updated; b: deleted; c: deleted then inserted again
    w.snapshot(1)
    w.close()
    assert sorted(query(dsn, "SELECT word, n, note FROM latest")) == [
        ("a", 2, None),
        ("c", 5, None),
    ]


def test_transactional_upserts_apply_a_checkpoints_changes_of_every_subtask_at_once(
    dsn: str,
) -> None:
    import pyarrow as pa

    from epochstream.connectors.postgres import COMMITS_TABLE, UpsertEntry
    from epochstream.core.changelog import RowKind, with_kinds

    sink = PostgresSink(dsn, "latest", mode="transactional_upsert", key_columns=["word"])
    assert sink.transactional
    committer = sink.create_committer(JOB)
    assert committer is not None and committer.last_committed() == 0
    first, second = sink.create_writer(ctx(0)), sink.create_writer(ctx(1))
    first.restore([])
    second.restore([])
    first.write_batch(_batch(["a", "b"], [1, 1], note=pa.array(["x", "y"])))
    first.write_batch(
        with_kinds(
            _batch(["a", "a", "b"], [1, 2, 1], note=pa.array([None, None, None])),
            [RowKind.UPDATE_BEFORE, RowKind.UPDATE_AFTER, RowKind.DELETE],
        )
    )
    second.write_batch(_batch(["c"], [3], note=pa.array(["z"])))
    entries = first.snapshot(1) + second.snapshot(1)
    assert [type(e) for e in entries] == [UpsertEntry, UpsertEntry]
    assert entries[0].upserts == (("a", 2, None),) and entries[0].deletes == (("b",),)
    assert query(dsn, "SELECT word FROM latest") == []  # nothing before the completion
    committer.commit(1, entries)  # both subtasks' changes in one transaction
    assert sorted(query(dsn, "SELECT word, n FROM latest")) == [("a", 2), ("c", 3)]
    assert committer.last_committed() == 1

    # Checkpoint 2 was taken before the writers heard of 1's completion: their snapshots
    # still hold checkpoint 1's entries, which the commit of 2 must not apply again.
    first.write_batch(_batch(["a"], [9], note=pa.array([None])))
    late = first.snapshot(2) + second.snapshot(2)
    assert sorted(e.checkpoint_id for e in late) == [1, 1, 2]
    with psycopg.connect(dsn, autocommit=True) as conn:  # someone else's write
        conn.execute("UPDATE latest SET n = 100 WHERE word = 'c'")
    committer.commit(2, late)
    assert sorted(query(dsn, "SELECT word, n FROM latest")) == [("a", 9), ("c", 100)]
    # A restore replays the restored checkpoint's commit: skipped, as is an older one.
    committer.commit(2, late)
    committer.commit(1, entries)
    assert sorted(query(dsn, "SELECT word, n FROM latest")) == [("a", 9), ("c", 100)]
    assert query(dsn, f"SELECT sink, checkpoint FROM {COMMITS_TABLE}") == [("latest", 2)]
    first.notify_checkpoint_complete(2)
    assert first.snapshot(3) == []
    for closing in (first, second, committer):
        closing.close()


def test_transactional_upserts_without_checkpointing_apply_at_the_end(dsn: str) -> None:
    import pyarrow as pa

    sink = PostgresSink(dsn, "latest", mode="transactional_upsert", key_columns=["word"])
    writer = sink.create_writer(ctx(checkpointing=False))
    writer.restore([])
    writer.write_batch(_batch(["a", "a"], [1, 2], note=pa.array([None, "y"])))
    writer.end_input()
    writer.close()
    assert query(dsn, "SELECT word, n, note FROM latest") == [("a", 2, "y")]


def test_transactional_upserts_need_key_columns(dsn: str) -> None:
    with pytest.raises(ConfigurationError, match="needs key_columns"):
        PostgresSink(dsn, "latest", mode="transactional_upsert")
