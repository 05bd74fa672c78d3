"""Record writers: partitioning by key group, rebalance, broadcast, batching, event order."""

from __future__ import annotations

from typing import Any

import pytest

from epochstream.core.events import END_OF_INPUT, CheckpointBarrier
from epochstream.graph.transformations import Partitioning
from epochstream.runtime.batches import RowBatch
from epochstream.runtime.outputs import Channel, RecordWriter
from epochstream.state.keygroups import key_group_for_key, operator_index_for_key_group


class ListChannel(Channel):
    def __init__(self) -> None:
        self.items: list[Any] = []

    def send(self, item: Any) -> None:
        self.items.append(item)

    @property
    def records(self) -> list[Any]:
        return [r for item in self.items if type(item) is RowBatch for r in item.records]


def _writer(
    kind: str, n: int, batch_size: int = 4, key=None
) -> tuple[RecordWriter, list[ListChannel]]:
    channels = [ListChannel() for _ in range(n)]
    w = RecordWriter(
        channels, partitioning=Partitioning(kind, key), max_parallelism=128, batch_size=batch_size
    )
    return w, channels


def test_hash_partitioning_follows_key_group_formula() -> None:
    w, channels = _writer("hash", 3, batch_size=1000, key=lambda t: t[0])
    records = [(f"k{i % 50}", i) for i in range(500)]
    w.write(records)
    w.flush()
    for ch, channel in enumerate(channels):
        for key, _ in channel.records:
            kg = key_group_for_key(key, 128)
            assert operator_index_for_key_group(128, 3, kg) == ch
    assert sorted(r for c in channels for r in c.records) == sorted(records)


def test_rebalance_spreads_evenly() -> None:
    w, channels = _writer("rebalance", 2, batch_size=1000)
    w.write(list(range(101)))
    w.flush()
    sizes = [len(c.records) for c in channels]
    assert sum(sizes) == 101 and max(sizes) - min(sizes) <= 1


def test_broadcast_sends_everything_everywhere() -> None:
    w, channels = _writer("broadcast", 3, batch_size=1000)
    w.write([1, 2, 3])
    w.flush()
    assert all(c.records == [1, 2, 3] for c in channels)


@pytest.mark.parametrize("kind", ["hash", "rebalance", "broadcast", "forward"])
def test_timestamps_travel_with_their_records_whatever_the_partitioning(kind: str) -> None:
    w, channels = _writer(
        kind, 3, batch_size=1000, key=(lambda r: r % 7) if kind == "hash" else None
    )
    w.write([1, 2, 3], None)  # records without event time, before some with it
    w.write(list(range(10, 40)), [1_000 + i for i in range(10, 40)])
    w.write([4, 5], None)
    w.flush()
    pairs = []
    for channel in channels:
        for item in channel.items:
            assert type(item) is RowBatch
            records, timestamps = item.records, item.timestamps
            if timestamps is None:
                pairs += [(r, None) for r in records]
            else:
                assert len(records) == len(timestamps), "one timestamp per record"
                pairs += list(zip(records, timestamps, strict=True))
    expected = [(r, None) for r in (1, 2, 3, 4, 5)] + [(r, 1_000 + r) for r in range(10, 40)]
    copies = 3 if kind == "broadcast" else 1
    assert sorted(pairs, key=repr) == sorted(expected * copies, key=repr)


def test_ships_full_buffers_and_keeps_events_after_records() -> None:
    w, channels = _writer("rebalance", 1, batch_size=4)
    w.write([1, 2, 3, 4, 5])
    assert channels[0].items == [RowBatch([1, 2, 3, 4, 5])]
    w.write([6])
    assert channels[0].items == [RowBatch([1, 2, 3, 4, 5])]
    barrier = CheckpointBarrier(1, 0.0)
    w.broadcast_event(barrier)
    w.broadcast_event(END_OF_INPUT)
    assert channels[0].items == [RowBatch([1, 2, 3, 4, 5]), RowBatch([6]), barrier, END_OF_INPUT]


# ---------------------------------------------------------------- errors that name the place

import pickle  # noqa: E402
import threading  # noqa: E402

import pytest  # noqa: E402

from epochstream.exceptions import (  # noqa: E402
    KeyEncodingError,
    SerializationError,
    UserFunctionError,
)
from epochstream.runtime.outputs import NetworkChannel  # noqa: E402


def _tag_list(record: dict) -> list:
    return record["tags"]


def test_unhashable_key_names_selector_edge_and_record() -> None:
    channels = [ListChannel(), ListChannel()]
    w = RecordWriter(
        channels,
        partitioning=Partitioning("hash", _tag_list),
        max_parallelism=128,
        batch_size=4,
        edge="parse -> counts (hash)",
    )
    with pytest.raises(KeyEncodingError) as info:
        w.write([{"tags": ["a", "b"], "id": 7}])
    message = str(info.value)
    assert "_tag_list (test_outputs.py:" in message
    assert "parse -> counts (hash)" in message
    assert "'id': 7" in message and "unhashable" in message and "tuple" in message
    assert info.value.suppress_restarts


@pytest.mark.parametrize("timed", [False, True])
def test_key_selector_error_is_a_user_function_error_naming_the_record(timed: bool) -> None:
    w = RecordWriter(
        [ListChannel()],
        partitioning=Partitioning("hash", lambda r: r["missing"]),
        max_parallelism=128,
        batch_size=4,
        edge="src -> sink (hash)",
    )
    with pytest.raises(UserFunctionError) as info:
        w.write([{"present": 1}], [5] if timed else None)
    assert "<lambda> (test_outputs.py:" in str(info.value) and "'present': 1" in str(info.value)
    assert "KeyError" in str(info.value)


def test_unencodable_key_names_the_record() -> None:
    w = RecordWriter(
        [ListChannel()],
        partitioning=Partitioning("hash", lambda r: r[1]),
        max_parallelism=128,
        batch_size=4,
        edge="a -> b (hash)",
    )
    with pytest.raises(KeyEncodingError) as info:
        w.write([("x", object())])
    assert "a -> b (hash)" in str(info.value) and "record ('x'," in str(info.value)


class _Frames:
    """Stands in for a FramedConnection: keeps the frames sent."""

    def __init__(self) -> None:
        self.frames: list[bytes] = []

    def send_bytes(self, data: bytes) -> None:
        self.frames.append(data)

    def close(self) -> None:
        pass


def test_network_channel_names_the_record_that_does_not_pickle() -> None:
    frames = _Frames()
    channel = NetworkChannel(frames, "src -> sum (hash)")  # type: ignore[arg-type]
    lock = threading.Lock()
    with pytest.raises(SerializationError) as info:
        channel.send(RowBatch([1, ("holds a lock", lock), 3]))
    message = str(info.value)
    assert "position 1" in message and "holds a lock" in message
    assert "src -> sum (hash)" in message
    assert info.value.suppress_restarts and frames.frames == []


def test_network_channel_falls_back_to_by_value_pickling() -> None:
    """Instances of a class only known by value (as in a job script) still cross."""
    import cloudpickle

    namespace: dict = {}
    exec("class Point:\n    def __init__(self, x): self.x = x\n", namespace)
    point_class = namespace["Point"]
    point_class.__module__ = "__main__"  # not importable under that name here
    frames = _Frames()
    channel = NetworkChannel(frames)  # type: ignore[arg-type]
    channel.send(RowBatch([point_class(3)]))
    channel.send(RowBatch([point_class(4)]))
    assert [pickle.loads(f).records[0].x for f in frames.frames] == [3, 4]
    assert channel.encoder._dumps is cloudpickle.dumps


# ---------------------------------------------------------------- keys travel on hash edges


@pytest.mark.parametrize("timed", [False, True])
def test_hash_edge_ships_each_records_key_with_it(timed: bool) -> None:
    calls: list[Any] = []

    def key_of(record: tuple[str, int]) -> str:
        calls.append(record)
        return record[0]

    w, channels = _writer("hash", 2, batch_size=1000, key=key_of)
    records = [(f"k{i % 9}", i) for i in range(60)]
    w.write(records, [1_000 + i for i in range(60)] if timed else None)
    w.flush()
    assert len(calls) == 60, "the selector runs once per record"
    seen = []
    for channel in channels:
        for item in channel.items:
            assert type(item) is RowBatch and item.keys is not None
            assert item.keys == [r[0] for r in item.records]
            if timed:
                assert item.timestamps == [1_000 + r[1] for r in item.records]
            else:
                assert item.timestamps is None
            seen += item.records
    assert sorted(seen) == sorted(records)


@pytest.mark.parametrize("timed", [False, True])
def test_every_nan_key_ships_as_one_key_object(timed: bool) -> None:
    """NaN keys share a key group but equal nothing: on the receiving side each record's
    NaN was a key of its own in heap state (a reduce restarted from every NaN record)."""
    w, channels = _writer("hash", 2, batch_size=1000, key=lambda r: r[0])
    nans = [float("nan"), -float("nan"), float("inf") - float("inf")]
    records = [(nans[i % 3], i) for i in range(9)] + [(1.5, 9)]
    w.write(records, list(range(10)) if timed else None)
    w.flush()
    keys = [k for channel in channels for item in channel.items for k in item.keys]
    nan_keys = [k for k in keys if k != k]
    assert len(nan_keys) == 9 and len({id(k) for k in nan_keys}) == 1
    assert len(dict.fromkeys(keys)) == 2  # a dict (heap state) holds two keys
    assert 1.5 in keys


def test_a_hash_batch_mixing_timed_and_untimed_records_keeps_keys_and_timestamps_aligned() -> None:
    w, channels = _writer("hash", 1, batch_size=1000, key=lambda r: r % 3)
    w.write([1, 2], [10, 20])
    w.write([3, 4], None)
    w.flush()
    (item,) = channels[0].items
    assert item == RowBatch([1, 2, 3, 4], [10, 20, None, None], [1, 2, 0, 1])


def test_keyed_batches_cross_a_network_channel_whole() -> None:
    batch = RowBatch([("a", 1), ("b", 2)], [5, None], ["a", "b"])
    copy = pickle.loads(pickle.dumps(batch, protocol=5))
    assert type(copy) is RowBatch and copy == batch
    assert (copy.records, copy.timestamps, copy.keys) == (
        [("a", 1), ("b", 2)],
        [5, None],
        ["a", "b"],
    )


@pytest.mark.parametrize("kind", ["rebalance", "broadcast", "forward"])
def test_edges_that_do_not_hash_ship_batches_without_keys(kind: str) -> None:
    w, channels = _writer(kind, 2, batch_size=1000)
    w.write([1, 2, 3])
    w.flush()
    items = [item for c in channels for item in c.items]
    assert items and all(type(item) is RowBatch and item.keys is None for item in items)
    assert all(item.timestamps is None for item in items)
