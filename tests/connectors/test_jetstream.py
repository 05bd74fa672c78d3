"""JetStreamSource and JetStreamSink against a real nats-server (tests/nats_server.py)."""

from __future__ import annotations

import asyncio
import pickle
import uuid
from typing import Any

import pytest

from epochstream.connectors.base import SinkContext, SourceContext
from epochstream.connectors.jetstream import (
    JetStreamSink,
    JetStreamSource,
    JetStreamSplit,
    WriteAheadEntry,
)
from epochstream.core.clock import ManualClock
from epochstream.exceptions import ConfigurationError, SinkError, SourceDecodeError

nats = pytest.importorskip("nats")


async def _admin(url: str, work: Any) -> Any:
    nc = await nats.connect(url)
    try:
        return await work(nc.jetstream())
    finally:
        await nc.close()


def make_stream(url: str, subjects: list[str], window: float = 120.0) -> str:
    from nats.js.api import StreamConfig

    name = f"S{uuid.uuid4().hex[:10]}"

    async def work(js: Any) -> None:
        await js.add_stream(StreamConfig(name=name, subjects=subjects, duplicate_window=window))

    asyncio.run(_admin(url, work))
    return name


def publish(url: str, subject: str, payloads: list[bytes]) -> None:
    async def work(js: Any) -> None:
        for p in payloads:
            await js.publish(subject, p)

    asyncio.run(_admin(url, work))


def stream_messages(url: str, stream: str) -> list[tuple[str, bytes, str | None]]:
    """Every message of ``stream``: subject, payload, Nats-Msg-Id."""

    async def work(js: Any) -> list[tuple[str, bytes, str | None]]:
        info = await js.stream_info(stream)
        out: list[tuple[str, bytes, str | None]] = []
        if info.state.messages == 0:
            return out
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            msg = await js.get_msg(stream, seq)
            out.append((msg.subject, msg.data, (msg.headers or {}).get("Nats-Msg-Id")))
        return out

    return asyncio.run(_admin(url, work))


def consumer_ack_floor(url: str, stream: str) -> list[int]:
    async def work(js: Any) -> list[int]:
        consumers = await js.consumers_info(stream)
        return [c.ack_floor.stream_seq for c in consumers]

    return asyncio.run(_admin(url, work))


def source_ctx() -> SourceContext:
    return SourceContext(0, 1, ManualClock())


def read(reader: Any, want: int, tries: int = 200) -> list[bytes]:
    out: list[bytes] = []
    for _ in range(tries):
        if len(out) >= want:
            break
        out += reader.poll(7)
    return out


def test_source_reads_by_sequence_resumes_from_a_snapshot_and_acks_on_completion(
    nats_url: str,
) -> None:
    name = make_stream(nats_url, [f"{s}.>" for s in ("in",)])
    publish(nats_url, "in.a", [f"m{i}".encode() for i in range(20)])
    publish(nats_url, "in.b", [b"other"])
    source = JetStreamSource(nats_url, name, subject="in.a", start_sequence=3)
    (split,) = source.create_splits(4)
    assert split == JetStreamSplit(name, name, "in.a", 3)
    reader = source.create_reader(source_ctx())
    assert reader.needs_splits, "a subtask without the stream asks (and waits)"
    reader.add_splits([split])
    assert not reader.needs_splits, "a stream is never finished"
    first = read(reader, 10)
    assert first[:10] == [f"m{i}".encode() for i in range(2, 12)]
    state = pickle.loads(pickle.dumps(reader.snapshot(1)))
    assert state[0].next_sequence == 2 + len(first) + 1
    assert consumer_ack_floor(nats_url, name) == [0], "nothing acked before completion"
    reader.notify_checkpoint_complete(1)
    assert consumer_ack_floor(nats_url, name) == [state[0].next_sequence - 1]
    reader.close()

    again = source.create_reader(source_ctx())
    again.add_splits(state)
    rest = read(again, 20 - 2 - len(first))
    assert first + rest == [f"m{i}".encode() for i in range(2, 20)], "each message once, in order"
    assert not again.exhausted
    assert again.poll(5) == [], "in.b is filtered out"
    again.close()


def sink_ctx(subtask: int = 0, attempt: int = 0) -> SinkContext:
    return SinkContext(subtask, 2, attempt, "jobjobjob", checkpointing=True)


def test_sink_publishes_after_completion_with_deterministic_ids(nats_url: str) -> None:
    name = make_stream(nats_url, ["out.1"])
    w = JetStreamSink(nats_url, "out.1", sink_id="counts").create_writer(sink_ctx(subtask=1))
    w.restore([])
    w.write_batch([b"a", "b"])
    entries = w.snapshot(5)
    assert entries == [WriteAheadEntry("jobjobjo/counts", 1, 5, (b"a", b"b"))]
    assert stream_messages(nats_url, name) == [], "nothing before the checkpoint completes"
    w.write_batch([b"c"])
    w.notify_checkpoint_complete(5)
    assert stream_messages(nats_url, name) == [
        ("out.1", b"a", "jobjobjo/counts/1/5/0"),
        ("out.1", b"b", "jobjobjo/counts/1/5/1"),
    ]
    w.close()


def test_recovery_republishes_and_the_server_drops_duplicates(nats_url: str) -> None:
    name = make_stream(nats_url, ["out.2"])
    sink = JetStreamSink(nats_url, "out.2")
    old = sink.create_writer(sink_ctx())
    old.restore([])
    old.write_batch([b"x", b"y"])
    entries = old.snapshot(1)
    old.write_batch([b"z"])
    entries2 = old.snapshot(2)  # checkpoint 2 completes; the crash comes mid-publish
    old.notify_checkpoint_complete(1)
    old.close()
    for subtask in (0, 1):  # both recover; subtask 0 publishes
        new = sink.create_writer(sink_ctx(subtask=subtask, attempt=1))
        new.restore(entries2)
        new.close()
    assert [m[1] for m in stream_messages(nats_url, name)] == [b"x", b"y", b"z"]
    assert entries2[0] == entries[0]


def test_bad_records_and_settings_are_named(nats_url: str) -> None:
    w = JetStreamSink(nats_url, "out.3").create_writer(sink_ctx())
    with pytest.raises(SinkError, match=r"record 42 of type int is neither bytes nor str"):
        w.write_batch([b"ok", 42])
    with pytest.raises(ConfigurationError, match="start_sequence"):
        JetStreamSource(nats_url, "S", start_sequence=0)
    with pytest.raises(ConfigurationError, match="servers"):
        JetStreamSink([], "x")


def test_json_payloads_come_as_batches_and_a_bad_one_names_stream_and_sequence(
    nats_url: str,
) -> None:
    import pyarrow as pa

    name = make_stream(nats_url, ["js.x"])
    good = [f'{{"k": "k{i}", "v": {i}, "extra": true}}'.encode() for i in range(4)]
    publish(nats_url, "js.x", [*good, b'{"k": "k4", "v": 1.5}', b'{"k": "k5", "v": 5}'])
    schema = pa.schema([("k", pa.string()), ("v", pa.int64())])
    source = JetStreamSource(nats_url, name, json_schema=schema)
    assert source.columnar
    reader = source.create_reader(source_ctx())
    reader.add_splits(source.create_splits(1))
    batches = []
    with pytest.raises(SourceDecodeError) as info:
        for _ in range(200):
            batch = reader.poll(100)
            if len(batch):
                batches.append(batch)
    assert pa.Table.from_batches(batches, schema).to_pylist() == [
        {"k": f"k{i}", "v": i} for i in range(4)
    ]
    err = info.value
    assert (err.path, err.offset) == (name, 5)
    assert f"JetStream message {name} at sequence 5 as json" in str(err)
    # The bad message is read again after a restore: the split stops before it.
    assert reader.snapshot(1)[0].next_sequence == 5
    reader.close()


def test_a_reader_restored_at_the_end_of_the_stream_polls_nothing(nats_url: str) -> None:
    name = make_stream(nats_url, ["end.x"])
    publish(nats_url, "end.x", [b"only"])
    reader = JetStreamSource(nats_url, name).create_reader(source_ctx())
    reader.add_splits([JetStreamSplit(name, name, None, 2)])
    assert [reader.poll(10) for _ in range(3)] == [[], [], []]
    publish(nats_url, "end.x", [b"next"])
    assert read(reader, 1) == [b"next"]
    reader.close()


def test_a_large_checkpoint_is_published_in_windows(nats_url: str) -> None:
    name = make_stream(nats_url, ["big.1"])
    w = JetStreamSink(nats_url, "big.1").create_writer(sink_ctx())
    w.restore([])
    w.write_batch([f"r{i}" for i in range(5000)])
    w.snapshot(1)
    w.notify_checkpoint_complete(1)
    got = stream_messages(nats_url, name)
    assert [m[1] for m in got] == [f"r{i}".encode() for i in range(5000)], "all, once, in order"
    w.close()


def test_batches_publish_one_message_per_row_and_recovery_keeps_exactly_once(
    nats_url: str,
) -> None:
    import decimal

    import pyarrow as pa

    name = make_stream(nats_url, ["cols.1"])
    sink = JetStreamSink(nats_url, "cols.1", sink_id="cols")
    old = sink.create_writer(sink_ctx())
    old.restore([])
    # One string column (besides _ts): its values are the payloads.
    old.write_batch(pa.record_batch({"line": ["a", "b"], "_ts": [1, 2]}))
    old.write_batch(
        pa.record_batch({"k": [1], "d": pa.array([decimal.Decimal("1.5")], pa.decimal128(3, 1))})
    )
    entries = old.snapshot(1)  # checkpoint 1 completes; the crash comes before publishing
    old.close()
    assert stream_messages(nats_url, name) == []
    for attempt in (1, 2):  # the second recovery re-publishes: the server drops them
        new = sink.create_writer(sink_ctx(attempt=attempt))
        new.restore(entries)
        new.close()
    assert stream_messages(nats_url, name) == [
        ("cols.1", b"a", "jobjobjo/cols/0/1/0"),
        ("cols.1", b"b", "jobjobjo/cols/0/1/1"),
        ("cols.1", b'{"k":1,"d":"1.5"}', "jobjobjo/cols/0/1/2"),
    ]
    w = sink.create_writer(sink_ctx())
    with pytest.raises(SinkError, match="'line' of a batch holds nulls"):
        w.write_batch(pa.record_batch({"line": pa.array([None, "x"], pa.string())}))
