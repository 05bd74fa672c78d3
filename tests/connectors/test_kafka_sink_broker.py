"""KafkaSink writers against a real Kafka-protocol broker (Tansu, tests/kafka_server.py):
commit on checkpoint completion, a restore committing a pre-committed transaction and
aborting the failed attempt's, at-least-once flushes and a record too large.

Committed output is read with ``kafka_server.read_committed`` (by control markers:
Tansu's read_committed fetches also return aborted records)."""

from __future__ import annotations

from typing import Any

import pytest

from epochstream.connectors.base import SinkContext
from epochstream.connectors.kafka.sink import KafkaSink
from epochstream.exceptions import SinkError

pytest.importorskip("kafka")


def _ctx(attempt: int = 0, job_id: str = "brokerjob-1") -> SinkContext:
    return SinkContext(0, 1, attempt=attempt, job_id=job_id, checkpointing=True)


def _values(kafka_server: Any, topic: str) -> list[Any]:
    return sorted(kafka_server.read_committed_json(topic, 2))


def _sink(kafka_server: Any, topic: str, **kw: Any) -> KafkaSink:
    kw.setdefault("transactional_id_prefix", f"p-{topic}")
    return KafkaSink(kafka_server.bootstrap, topic=topic, key_fn=lambda r: r % 2, **kw)


def test_exactly_once_commits_when_the_checkpoint_completes(kafka_server: Any) -> None:
    topic = kafka_server.new_topic("sink", partitions=2)
    w = _sink(kafka_server, topic).create_writer(_ctx())
    try:
        w.restore([])
        w.write_batch(list(range(10)))
        w.snapshot(1)
        assert _values(kafka_server, topic) == []  # pre-committed: in the log, not committed
        w.write_batch([10, 11])
        w.notify_checkpoint_complete(1)
        assert _values(kafka_server, topic) == list(range(10))
        w.snapshot(2)
        w.notify_checkpoint_complete(2)
        assert _values(kafka_server, topic) == list(range(12))
    finally:
        w.close()


def test_restore_commits_the_pre_committed_transaction_and_aborts_the_rest(
    kafka_server: Any,
) -> None:
    topic = kafka_server.new_topic("sink", partitions=2)
    sink = _sink(kafka_server, topic)
    crashed = sink.create_writer(_ctx())
    crashed.restore([])
    crashed.write_batch([1, 2, 3])
    entries = crashed.snapshot(1)  # checkpoint 1 completes, the commit never happens
    crashed.write_batch([100, 101])  # the failed attempt's next transaction: in the log, open
    crashed._current.txn.producer.flush()  # type: ignore[attr-defined]
    assert len(kafka_server.read_open(topic, 2)) == 5
    # The "crash": producers go away without ending their transactions.
    crashed._current.txn.producer.close()  # type: ignore[attr-defined]
    for t in crashed._pending[1]:  # type: ignore[attr-defined]
        t.txn.producer.close()
    for attempt in (1, 2):  # the second restore repeats the commit: harmless
        restored = sink.create_writer(_ctx(attempt))
        try:
            restored.restore(entries)
            assert _values(kafka_server, topic) == [1, 2, 3]
            assert kafka_server.read_open(topic, 2) == []  # 100, 101 aborted, not left open
        finally:
            restored.close()
    # The restored writer goes on with ids nobody used, and its output commits.
    again = sink.create_writer(_ctx(3))
    try:
        again.restore(entries)
        again.write_batch([4])
        again.snapshot(2)
        again.notify_checkpoint_complete(2)
    finally:
        again.close()
    assert _values(kafka_server, topic) == [1, 2, 3, 4]


def test_at_least_once_flushes_at_the_barrier(kafka_server: Any) -> None:
    topic = kafka_server.new_topic("sink", partitions=2)
    w = _sink(kafka_server, topic, delivery="at_least_once").create_writer(_ctx())
    try:
        w.restore([])
        w.write_batch([5, 6, 7])
        assert w.snapshot(1) == []
        assert _values(kafka_server, topic) == [5, 6, 7]
    finally:
        w.close()


def test_none_flushes_at_end_of_input(kafka_server: Any) -> None:
    topic = kafka_server.new_topic("sink", partitions=2)
    w = _sink(kafka_server, topic, delivery="none").create_writer(_ctx())
    try:
        w.restore([])
        w.write_batch([8, 9])
        w.end_input()
        assert _values(kafka_server, topic) == [8, 9]
    finally:
        w.close()


def test_a_record_too_large_fails_without_restarts_naming_topic_and_record(
    kafka_server: Any,
) -> None:
    topic = kafka_server.new_topic("sink", partitions=2)
    sink = KafkaSink(
        kafka_server.bootstrap, topic=topic, value_format="bytes", delivery="at_least_once"
    )
    w = sink.create_writer(_ctx())
    try:
        with pytest.raises(
            SinkError, match=f"to topic '{topic}' failed: MessageSizeTooLargeError"
        ) as info:
            w.write_batch([b"x" * (2 << 20)])
        assert info.value.suppress_restarts
    finally:
        w.close()


def test_restore_at_lower_parallelism_aborts_ids_of_subtasks_that_are_gone(
    kafka_server: Any,
) -> None:
    topic = kafka_server.new_topic("sink", partitions=2)
    sink = _sink(kafka_server, topic)
    entries: list[Any] = []
    old = [
        sink.create_writer(SinkContext(s, 2, attempt=0, job_id="rescale-1", checkpointing=True))
        for s in (0, 1)
    ]
    for s, w in enumerate(old):
        w.restore([])
        w.write_batch([s])
        entries += w.snapshot(1)
    for s, w in enumerate(old):  # checkpoint 1 completed; both die mid-transaction
        w.write_batch([10 + s])
        w._current.txn.producer.flush()  # type: ignore[attr-defined]
        w._current.txn.producer.close()  # type: ignore[attr-defined]
        for t in w._pending[1]:  # type: ignore[attr-defined]
            t.txn.producer.close()
    assert len(kafka_server.read_open(topic, 2)) == 4
    new = sink.create_writer(SinkContext(0, 1, attempt=1, job_id="rescale-1", checkpointing=True))
    try:
        new.restore(entries)  # subtask 0 of 1 handles old subtasks 0 and 1
    finally:
        new.close()
    assert _values(kafka_server, topic) == [0, 1]
    assert kafka_server.read_open(topic, 2) == []


def test_batches_send_one_json_record_per_row_in_the_same_transactions(
    kafka_server: Any,
) -> None:
    import datetime

    import pyarrow as pa

    topic = kafka_server.new_topic("sink", partitions=2)
    sink = KafkaSink(
        kafka_server.bootstrap,
        topic=topic,
        key_fn=lambda r: r["k"],
        transactional_id_prefix=f"p-{topic}",
    )
    when = datetime.datetime(2026, 11, 28, 10, 0)

    def batch(ks: list[int]) -> pa.RecordBatch:
        n = len(ks)
        return pa.record_batch(
            {"k": ks, "at": pa.array([when] * n, pa.timestamp("ms")), "_ts": [0] * n}
        )

    crashed = sink.create_writer(_ctx(job_id="batchjob-1"))
    crashed.restore([])
    crashed.write_batch(batch([1, 2, 3]))
    crashed.write_batch([{"k": 4, "at": "row"}])  # a union of forms: the same transaction
    entries = crashed.snapshot(1)  # checkpoint 1 completes, the commit never happens
    crashed.write_batch(batch([100]))
    crashed._current.txn.producer.flush()  # type: ignore[attr-defined]
    crashed._current.txn.producer.close()  # type: ignore[attr-defined]
    for t in crashed._pending[1]:  # type: ignore[attr-defined]
        t.txn.producer.close()
    restored = sink.create_writer(_ctx(attempt=1, job_id="batchjob-1"))
    try:
        restored.restore(entries)
        assert kafka_server.read_open(topic, 2) == [], "the failed attempt's batch is aborted"
    finally:
        restored.close()
    got = sorted(kafka_server.read_committed_json(topic, 2), key=lambda r: r["k"])
    iso = "2026-11-28T10:00:00.000"  # Arrow's ISO-8601, to the column's milliseconds
    assert got == [
        {"k": 1, "at": iso},
        {"k": 2, "at": iso},
        {"k": 3, "at": iso},
        {"k": 4, "at": "row"},
    ]
