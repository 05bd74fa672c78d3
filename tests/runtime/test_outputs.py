"""Record writers: partitioning by key group, rebalance, broadcast, batching, event order."""

from __future__ import annotations

from typing import Any

from epochstream.graph.transformations import Partitioning
from epochstream.runtime.events import END_OF_INPUT, CheckpointBarrier
from epochstream.runtime.outputs import Channel, RecordWriter
from epochstream.state.keygroups import key_group_for_key, operator_index_for_key_group


class ListChannel(Channel):
    def __init__(self) -> None:
        self.items: list[Any] = []

    def send(self, item: Any) -> None:
        self.items.append(item)

    @property
    def records(self) -> list[Any]:
        return [r for item in self.items if isinstance(item, list) for r in item]


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


def test_ships_full_buffers_and_keeps_events_after_records() -> None:
    w, channels = _writer("rebalance", 1, batch_size=4)
    w.write([1, 2, 3, 4, 5])
    assert channels[0].items == [[1, 2, 3, 4, 5]]
    w.write([6])
    assert channels[0].items == [[1, 2, 3, 4, 5]]
    barrier = CheckpointBarrier(1, 0.0)
    w.broadcast_event(barrier)
    w.broadcast_event(END_OF_INPUT)
    assert channels[0].items == [[1, 2, 3, 4, 5], [6], barrier, END_OF_INPUT]
