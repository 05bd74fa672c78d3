"""KafkaSink writers against a fake broker: the transaction state machine (begin,
pre-commit, commit, resume-commit after a restore, abort of stale transactions), the
at-least-once flush and ``none``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from epochstream.connectors.base import SinkContext
from epochstream.connectors.kafka.producer import delivery_error
from epochstream.connectors.kafka.sink import (
    IdRange,
    KafkaDeliveryWriter,
    KafkaSink,
    KafkaTransactionalWriter,
    PendingTxn,
    RecordEncoder,
)
from epochstream.exceptions import ConfigurationError, SinkError


@dataclass
class TxnId:
    """The broker's state of one transactional id."""

    producer_id: int
    epoch: int = 0
    open: list[tuple[str, bytes | None, bytes]] = field(default_factory=list)
    ongoing: bool = False


class FakeBroker:
    """Kafka's transaction coordinator, reduced to what the sink relies on."""

    def __init__(self) -> None:
        self.ids: dict[str, TxnId] = {}
        self.committed: list[tuple[str, bytes | None, bytes]] = []
        self.aborted: list[tuple[str, bytes | None, bytes]] = []
        self.plain: list[tuple[str, bytes | None, bytes]] = []
        self.next_pid = 1
        self.fail_next_send: BaseException | None = None
        self.producers: list[FakeProducer] = []

    def init(self, tid: str) -> tuple[int, int]:
        state = self.ids.get(tid)
        if state is None:
            state = self.ids[tid] = TxnId(self.next_pid)
            self.next_pid += 1
            return state.producer_id, 0
        self.aborted += state.open  # fencing aborts what the id holds open
        state.open, state.ongoing = [], False
        state.epoch += 1
        return state.producer_id, state.epoch

    def end(self, tid: str, pid: int, epoch: int, commit: bool) -> None:
        state = self.ids[tid]
        if (state.producer_id, state.epoch) != (pid, epoch):
            raise SinkError(f"fenced: {tid}")
        if not state.ongoing:
            return  # a repeated EndTxn: harmless
        (self.committed if commit else self.aborted).extend(state.open)
        state.open, state.ongoing = [], False

    def committed_values(self) -> list[bytes]:
        return [v for _, _, v in self.committed]


class FakeProducer:
    def __init__(self, broker: FakeBroker, tid: str | None) -> None:
        self.broker, self.tid = broker, tid
        self.pid, self.epoch = -1, -1
        self.buffer: list[tuple[str, bytes | None, bytes]] = []
        self.closed = False
        self.error: SinkError | None = None
        broker.producers.append(self)

    def send(self, topic: str, key: bytes | None, value: bytes, record: Any) -> None:
        assert not self.closed
        if self.broker.fail_next_send is not None:
            self.error = delivery_error(topic, record, self.broker.fail_next_send)
            self.broker.fail_next_send = None
        self.buffer.append((topic, key, value))

    def check(self) -> None:
        if self.error is not None:
            raise self.error

    def flush(self) -> None:
        self.check()
        if self.tid is None:
            self.broker.plain += self.buffer
        else:
            state = self.broker.ids[self.tid]
            if (state.producer_id, state.epoch) != (self.pid, self.epoch):
                raise SinkError("fenced")
            state.open += self.buffer
        self.buffer = []

    def init_transactions(self) -> None:
        assert self.tid is not None
        self.pid, self.epoch = self.broker.init(self.tid)

    def resume(self, producer_id: int, epoch: int) -> None:
        self.pid, self.epoch = producer_id, epoch

    def producer_id_and_epoch(self) -> tuple[int, int]:
        return self.pid, self.epoch

    def begin(self) -> None:
        assert self.tid is not None
        self.broker.ids[self.tid].ongoing = True

    def commit(self) -> None:
        assert self.tid is not None
        self.flush()
        self.broker.end(self.tid, self.pid, self.epoch, True)

    def abort(self) -> None:
        assert self.tid is not None
        self.buffer = []
        self.broker.end(self.tid, self.pid, self.epoch, False)

    def close(self) -> None:
        self.closed = True


def ctx(subtask: int = 0, parallelism: int = 1, attempt: int = 0) -> SinkContext:
    return SinkContext(
        subtask, parallelism, attempt=attempt, job_id="job12345xyz", checkpointing=True
    )


def sink(**kw: Any) -> KafkaSink:
    kw.setdefault("transactional_id_prefix", "t-out")
    return KafkaSink("127.0.0.1:1", topic="out", **kw)


def txn_writer(
    broker: FakeBroker, c: SinkContext | None = None, **kw: Any
) -> KafkaTransactionalWriter:
    return KafkaTransactionalWriter(sink(**kw), c or ctx(), lambda tid: FakeProducer(broker, tid))


def test_one_transaction_per_checkpoint_committed_when_it_completes() -> None:
    broker = FakeBroker()
    w = txn_writer(broker)
    w.restore([])
    w.write_batch([{"n": 1}, {"n": 2}])
    assert w.current_transaction is not None
    tid = w.current_transaction.txn.transactional_id
    assert tid == "t-out-job12345-0-0"
    entries = w.snapshot(1)
    assert broker.ids[tid].open and broker.committed == []  # pre-committed: flushed, invisible
    # epoch 1: the restore probed the id first (epoch 0)
    assert entries == [PendingTxn(tid, 1, 1, 0, 0), IdRange("t-out-job12345-0", 0, 1)]
    w.write_batch([{"n": 3}])
    w.notify_checkpoint_complete(1)
    assert broker.committed_values() == [b'{"n":1}', b'{"n":2}']
    entries = w.snapshot(2)
    assert [e.transactional_id for e in entries if isinstance(e, PendingTxn)] == [
        "t-out-job12345-0-1"
    ]
    w.notify_checkpoint_complete(2)
    assert broker.committed_values() == [b'{"n":1}', b'{"n":2}', b'{"n":3}']
    w.close()


def test_a_checkpoint_without_records_begins_no_transaction() -> None:
    broker = FakeBroker()
    w = txn_writer(broker)
    w.restore([])
    assert w.snapshot(1) == [IdRange("t-out-job12345-0", 0, 0)]
    w.notify_checkpoint_complete(1)
    assert broker.ids == {"t-out-job12345-0-0": TxnId(1)}  # only the restore's probe


def test_aborted_checkpoint_commits_with_the_next_completed_one() -> None:
    broker = FakeBroker()
    w = txn_writer(broker)
    w.restore([])
    w.write_batch([1])
    w.snapshot(1)
    w.notify_checkpoint_aborted(1)
    w.write_batch([2])
    w.snapshot(2)
    assert broker.committed == []
    w.notify_checkpoint_complete(2)
    assert broker.committed_values() == [b"1", b"2"]


def test_restore_commits_the_recorded_transaction_once_even_if_repeated() -> None:
    broker = FakeBroker()
    w = txn_writer(broker)
    w.restore([])
    w.write_batch(["a"])
    entries = w.snapshot(1)
    w.write_batch(["lost"])  # the failed attempt's next transaction, never checkpointed
    w.current_transaction.txn.producer.flush()  # type: ignore[union-attr]
    # Crash: checkpoint 1 completed, but the writer died before it committed.
    for attempt in (1, 2):  # a second failure repeats the recovery: harmless
        again = txn_writer(broker, ctx(attempt=attempt))
        again.restore(entries)
        again.close()
    assert broker.committed_values() == [b'"a"']
    assert broker.aborted == [("out", None, b'"lost"')]
    assert all(not s.ongoing for s in broker.ids.values())


def test_restore_aborts_every_transaction_of_the_failed_attempt() -> None:
    broker = FakeBroker()
    w = txn_writer(broker)
    w.restore([])
    w.write_batch(["a"])
    entries = w.snapshot(1)
    w.notify_checkpoint_complete(1)
    w.write_batch(["b"])
    w.snapshot(2)  # pre-committed, but checkpoint 2 never completes
    w.write_batch(["c"])  # open
    w.current_transaction.txn.producer.flush()  # type: ignore[union-attr]
    again = txn_writer(broker, ctx(attempt=1))
    again.restore(entries)
    assert broker.committed_values() == [b'"a"']
    assert sorted(v for _, _, v in broker.aborted) == [b'"b"', b'"c"']
    assert all(not s.ongoing for s in broker.ids.values())
    again.write_batch(["d"])  # continues after the probed ids: never reuses one
    assert again.current_transaction is not None
    assert again.current_transaction.txn.transactional_id == "t-out-job12345-0-3"
    again.snapshot(2)
    again.notify_checkpoint_complete(2)
    assert broker.committed_values() == [b'"a"', b'"d"']


def test_rescale_down_aborts_ids_of_subtasks_that_no_longer_exist() -> None:
    broker = FakeBroker()
    old = [txn_writer(broker, ctx(s, 2)) for s in (0, 1)]
    entries: list[Any] = []
    for w in old:
        w.restore([])
        w.write_batch([f"s{w.ctx.subtask_index}"])
        entries += w.snapshot(1)
    for w in old:  # checkpoint 1 completed; both crash before committing, mid-transaction
        w.write_batch(["late"])
        w.current_transaction.txn.producer.flush()  # type: ignore[union-attr]
    new = txn_writer(broker, ctx(0, 1, attempt=1))
    new.restore(entries)
    assert sorted(broker.committed_values()) == [b'"s0"', b'"s1"']
    assert [v for _, _, v in broker.aborted] == [b'"late"', b'"late"']
    assert all(not s.ongoing for s in broker.ids.values())


def test_close_aborts_the_open_transaction_and_leaves_pre_committed_ones() -> None:
    broker = FakeBroker()
    w = txn_writer(broker)
    w.restore([])
    w.write_batch(["kept"])
    w.snapshot(1)
    w.write_batch(["dropped"])
    w.current_transaction.txn.producer.flush()  # type: ignore[union-attr]
    w.close()
    assert [v for _, _, v in broker.aborted] == [b'"dropped"']
    assert broker.ids["t-out-job12345-0-0"].ongoing  # for the restore to commit


def test_delivery_error_fails_the_checkpoint_naming_topic_and_record() -> None:
    from kafka.errors import MessageSizeTooLargeError

    broker = FakeBroker()
    w = txn_writer(broker)
    w.restore([])
    broker.fail_next_send = MessageSizeTooLargeError("too big")
    w.write_batch([{"big": "x"}])
    with pytest.raises(SinkError, match=r"record \{'big': 'x'\} to topic 'out'") as info:
        w.snapshot(1)
    assert info.value.suppress_restarts  # a restart cannot make it fit


def test_at_least_once_flushes_at_every_barrier() -> None:
    broker = FakeBroker()
    w = KafkaDeliveryWriter(sink(delivery="at_least_once"), FakeProducer(broker, None))
    w.restore([])
    w.write_batch([1, 2])
    assert broker.plain == []
    assert w.snapshot(1) == []
    assert [v for _, _, v in broker.plain] == [b"1", b"2"]


def test_none_flushes_only_at_end_of_input_but_still_raises_errors() -> None:
    from kafka.errors import KafkaTimeoutError

    broker = FakeBroker()
    producer = FakeProducer(broker, None)
    w = KafkaDeliveryWriter(sink(delivery="none"), producer)
    w.write_batch([1])
    w.snapshot(1)
    assert broker.plain == []
    w.end_input()
    assert [v for _, _, v in broker.plain] == [b"1"]
    broker.fail_next_send = KafkaTimeoutError("no ack")
    w.write_batch([2])
    with pytest.raises(SinkError, match="KafkaTimeoutError") as info:
        w.snapshot(2)
    assert not info.value.suppress_restarts  # a timeout may pass: restart


def test_encoding_keys_topics_and_formats() -> None:
    s = KafkaSink(
        "h:1",
        topic_fn=lambda r: f"t{r[0]}",
        key_fn=lambda r: r[0],
        value_format="text",
        delivery="none",
    )
    assert s.encoder.encode((1, "x")) == ("t1", b"1", b"(1, 'x')")
    with pytest.raises(SinkError, match="value_format='bytes' needs bytes"):
        KafkaSink("h:1", topic="t", value_format="bytes", delivery="none").encoder.encode("s")
    with pytest.raises(ConfigurationError, match="transactional_id_prefix"):
        KafkaSink("h:1", topic="t")
    with pytest.raises(ConfigurationError, match="exactly one of topic"):
        KafkaSink("h:1", delivery="none")
    assert sink(properties={"linger.ms": 5}).config["linger_ms"] == 5


def test_every_producer_is_closed_once_its_transaction_ends() -> None:
    broker = FakeBroker()
    w = txn_writer(broker)
    w.restore([])  # the probe's producer
    w.write_batch([1])
    entries = w.snapshot(1)
    w.notify_checkpoint_complete(1)
    w.write_batch([2])
    w.snapshot(2)  # pre-committed, left for a restore
    w.write_batch([3])  # open, aborted by close
    w.close()
    assert all(p.closed for p in broker.producers)
    again = txn_writer(broker, ctx(attempt=1))
    again.restore(entries)
    again.close()
    assert all(p.closed for p in broker.producers)


def test_sink_arguments_that_cannot_work_are_refused_naming_them() -> None:
    with pytest.raises(ConfigurationError, match="bootstrap_servers"):
        KafkaSink(bootstrap_servers="", topic="out", transactional_id_prefix="p")
    with pytest.raises(ConfigurationError, match="transactional_id_prefix must be a string"):
        KafkaSink("h:1", "out", transactional_id_prefix=123)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="acks=0"):
        KafkaSink("h:1", "out", delivery="at_least_once", properties={"acks": 0})


def test_json_values_refuse_nan_naming_the_record() -> None:
    encoder = RecordEncoder("out", None, None, "json")
    with pytest.raises(SinkError, match=r"cannot encode record \{'x': nan\}") as err:
        encoder.encode({"x": float("nan")})
    assert err.value.suppress_restarts


def test_equal_keys_encode_to_equal_bytes_whatever_their_insertion_order() -> None:
    encoder = RecordEncoder("out", None, lambda r: r["k"], "json")
    _, a, _ = encoder.encode({"k": {"x": 1, "y": 2}})
    _, b, _ = encoder.encode({"k": {"y": 2, "x": 1}})
    assert a == b == b'{"x":1,"y":2}'


def test_a_batch_encodes_one_record_per_row_with_its_row_dict() -> None:
    import decimal

    import pyarrow as pa

    batch = pa.record_batch(
        {
            "k": ["a", "b"],
            "d": pa.array([decimal.Decimal("1.5"), None], pa.decimal128(3, 1)),
            "_ts": [1, 2],
        }
    )
    encoded = RecordEncoder("out", None, lambda r: r["k"], "json").encode_batch(batch)
    assert encoded == [
        ("out", b"a", b'{"k":"a","d":"1.5"}', {"k": "a", "d": decimal.Decimal("1.5")}),
        ("out", b"b", b'{"k":"b","d":null}', {"k": "b", "d": None}),
    ]
    by_fn = RecordEncoder(None, lambda r: f"t-{r['k']}", None, lambda r: r["k"].encode())
    assert [e[:3] for e in by_fn.encode_batch(batch)] == [("t-a", None, b"a"), ("t-b", None, b"b")]
    with pytest.raises(SinkError, match=r"cannot encode a batch of \['f'\] as JSON") as info:
        RecordEncoder("out", None, None, "json").encode_batch(
            pa.record_batch({"f": [float("nan")]})
        )
    assert info.value.suppress_restarts
