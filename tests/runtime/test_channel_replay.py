"""Replaying a restoring task's channel state: output frames first (to their channel, or
through the edge's partitioner on rescale), then input frames (filtered to the subtask's
key groups on rescale), and damaged state."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from epochstream.core.arrow import KG
from epochstream.core.filesystems import StorageFS, storage_fs
from epochstream.exceptions import CorruptStateError
from epochstream.graph.transformations import ColumnKey, Partitioning
from epochstream.runtime.batches import RowBatch
from epochstream.runtime.channel_replay import ChannelReplay
from epochstream.runtime.columnar_routing import with_key_groups
from epochstream.runtime.frames import FrameEncoder
from epochstream.runtime.outputs import Channel, RecordWriter
from epochstream.state.channel_state import (
    INPUT,
    OUTPUT,
    ChannelFrames,
    ChannelRestore,
    ChannelStateHandle,
    write_channel_state,
)
from epochstream.state.keygroups import KeyGroupAssigner

MAX_P = 128
EDGE_IN = "src[main] -> sum #0"
EDGE_IN_2 = "other[main] -> sum #1"
EDGE_OUT = "sum[main] -> sink #0"
LOWER_HALF = range(0, 64)


def key_group(key: Any) -> int:
    return KeyGroupAssigner.shared(MAX_P).key_group(key)


class LogChannel(Channel):
    """An output channel writing what it is sent into a log shared with the deliveries."""

    def __init__(self, log: list[tuple[str, int, Any]], index: int) -> None:
        self.log = log
        self.index = index

    def send(self, item: Any) -> None:
        self.log.append(("out", self.index, item))


class Replay:
    """A replay into fake writers (one per output edge) and a fake deliver, one log."""

    def __init__(
        self,
        partitioning: Partitioning,
        *,
        channels: int = 2,
        key_groups: range = range(0, MAX_P),
        fs_of: Any = storage_fs,
    ) -> None:
        self.log: list[tuple[str, int, Any]] = []
        self.writer = RecordWriter(
            [LogChannel(self.log, i) for i in range(channels)],
            partitioning=partitioning,
            max_parallelism=MAX_P,
            batch_size=1000,  # only the replay's flush ships rerouted records
            edge=EDGE_OUT,
        )
        self.replay = ChannelReplay(
            fs_of,
            {EDGE_OUT: self.writer},
            lambda position, item: self.log.append(("in", position, item)),
            key_groups=key_groups,
            max_parallelism=MAX_P,
            input_positions={EDGE_IN: 0, EDGE_IN_2: 1},
        )

    def run(self, restores: list[ChannelRestore]) -> None:
        self.replay.run(restores)

    def outputs(self, channel: int) -> list[Any]:
        return [item for kind, index, item in self.log if kind == "out" and index == channel]

    def inputs(self, position: int) -> list[Any]:
        return [item for kind, index, item in self.log if kind == "in" and index == position]


def write(tmp_path, *channels: tuple[str, str, int, list[Any]], name: str = "channels-sum-0"):
    """A channel state file of the given (direction, edge, channel, items)."""
    encode = FrameEncoder().encode
    path = str(tmp_path / "chk-3" / name)
    handle = write_channel_state(
        storage_fs(path),
        path,
        [
            ChannelFrames(d, edge, ch, [encode(item) for item in items])
            for d, edge, ch, items in channels
        ],
    )
    assert handle is not None
    return handle


def restores(handle: ChannelStateHandle, *, reroute: bool = False) -> list[ChannelRestore]:
    return [ChannelRestore(handle, entry, reroute) for entry in handle.entries]


def keyed(records: list[tuple[str, int]], timestamps: list[int] | None = None) -> RowBatch:
    return RowBatch(records, timestamps, [r[0] for r in records])


def by_key() -> Partitioning:
    return Partitioning("hash", key_selector=lambda record: record[0])


# ---------------------------------------------------------------- order and same parallelism


def test_outputs_are_sent_before_any_input_is_delivered(tmp_path) -> None:
    handle = write(
        tmp_path,
        (INPUT, EDGE_IN, 0, [keyed([("a", 1)])]),
        (OUTPUT, EDGE_OUT, 1, [RowBatch([("x", 1)])]),
        (INPUT, EDGE_IN_2, 1, [RowBatch([("b", 2)])]),
        (OUTPUT, EDGE_OUT, 0, [RowBatch([("y", 2)])]),
    )
    replay = Replay(Partitioning("rebalance"))
    replay.run(restores(handle))
    assert [(kind, index) for kind, index, _ in replay.log] == [
        ("out", 1),
        ("out", 0),
        ("in", 0),
        ("in", 1),
    ]


def test_same_parallelism_sends_every_output_frame_back_to_its_channel(tmp_path) -> None:
    first = keyed([("a", 1), ("b", 2)], [10, 20])
    second = keyed([("c", 3)])
    handle = write(tmp_path, (OUTPUT, EDGE_OUT, 1, [first, second]))
    replay = Replay(by_key())
    replay.run(restores(handle))
    assert replay.outputs(1) == [first, second], "whole batches, keys and timestamps kept"
    assert replay.outputs(0) == []


def test_same_parallelism_delivers_input_frames_unfiltered(tmp_path) -> None:
    batch = keyed([(str(i), i) for i in range(20)], list(range(20)))
    columns = with_key_groups(pa.record_batch({"k": list(range(20))}), ColumnKey("k"), MAX_P)
    handle = write(tmp_path, (INPUT, EDGE_IN, 0, [batch, columns]))
    replay = Replay(by_key(), key_groups=LOWER_HALF)
    replay.run(restores(handle))
    delivered = replay.inputs(0)
    assert delivered[0] == batch
    assert delivered[1].equals(columns)


def test_columnar_output_frames_go_back_to_their_channel(tmp_path) -> None:
    batch = pa.record_batch({"k": [1, 2, 3], "v": ["a", "b", "c"]})
    handle = write(tmp_path, (OUTPUT, EDGE_OUT, 0, [batch]))
    replay = Replay(Partitioning("hash", key_selector=ColumnKey("k")))
    replay.run(restores(handle))
    [sent] = replay.outputs(0)
    assert sent.equals(batch)


# ---------------------------------------------------------------- rescale


def test_rescaled_output_goes_through_the_hash_partitioner(tmp_path) -> None:
    records = [(f"key{i}", i) for i in range(40)]
    handle = write(tmp_path, (OUTPUT, EDGE_OUT, 0, [keyed(records[:25]), keyed(records[25:])]))
    replay = Replay(by_key(), channels=3)
    replay.run(restores(handle, reroute=True))
    for channel in range(3):
        sent = [r for batch in replay.outputs(channel) for r in batch.records]
        expected = [r for r in records if key_group(r[0]) * 3 // MAX_P == channel]
        assert sent == expected, f"channel {channel}"
    assert sum(len(replay.outputs(ch)) for ch in range(3)) <= 3, "one flush per channel"


def test_rescaled_output_keeps_its_timestamps(tmp_path) -> None:
    records = [(f"key{i}", i) for i in range(10)]
    handle = write(tmp_path, (OUTPUT, EDGE_OUT, 1, [keyed(records, [i * 100 for i in range(10)])]))
    replay = Replay(by_key(), channels=2)
    replay.run(restores(handle, reroute=True))
    for channel in range(2):
        for batch in replay.outputs(channel):
            assert batch.timestamps == [r[1] * 100 for r in batch.records]


def test_rescaled_output_of_a_rebalance_edge_is_spread_round_robin(tmp_path) -> None:
    handle = write(tmp_path, (OUTPUT, EDGE_OUT, 5, [RowBatch(list(range(6)))]))
    replay = Replay(Partitioning("rebalance"), channels=3)
    replay.run(restores(handle, reroute=True))
    assert sorted(r for ch in range(3) for b in replay.outputs(ch) for r in b.records) == list(
        range(6)
    )
    assert all(len(b.records) == 2 for ch in range(3) for b in replay.outputs(ch))


def test_rescaled_columnar_output_is_routed_by_its_key_column(tmp_path) -> None:
    batch = pa.record_batch({"k": list(range(30)), "v": [str(i) for i in range(30)]})
    handle = write(tmp_path, (OUTPUT, EDGE_OUT, 0, [batch]))
    replay = Replay(Partitioning("hash", key_selector=ColumnKey("k")), channels=2)
    replay.run(restores(handle, reroute=True))
    for channel in range(2):
        [sent] = replay.outputs(channel)
        groups = sent.column(KG).to_pylist()
        assert all(kg * 2 // MAX_P == channel for kg in groups)
        assert sorted(sent.column("k").to_pylist()) == [
            k for k in range(30) if key_group(k) * 2 // MAX_P == channel
        ]


def test_rescaled_row_input_keeps_only_this_subtasks_key_groups(tmp_path) -> None:
    records = [(f"key{i}", i) for i in range(50)]
    batch = keyed(records, [i + 1000 for i in range(50)])
    handle = write(tmp_path, (INPUT, EDGE_IN, 0, [batch]))
    replay = Replay(by_key(), key_groups=LOWER_HALF)
    replay.run(restores(handle, reroute=True))
    [mine] = replay.inputs(0)
    expected = [r for r in records if key_group(r[0]) in LOWER_HALF]
    assert 0 < len(expected) < len(records)
    assert mine == RowBatch(expected, [r[1] + 1000 for r in expected], [r[0] for r in expected])


def test_rescaled_columnar_input_keeps_only_this_subtasks_key_groups(tmp_path) -> None:
    batch = with_key_groups(
        pa.record_batch({"k": list(range(60)), "v": [i * 2 for i in range(60)]}),
        ColumnKey("k"),
        MAX_P,
    )
    handle = write(tmp_path, (INPUT, EDGE_IN, 0, [batch]))
    upper = range(64, MAX_P)
    replay = Replay(by_key(), key_groups=upper)
    replay.run(restores(handle, reroute=True))
    [mine] = replay.inputs(0)
    expected = [k for k in range(60) if key_group(k) in upper]
    assert 0 < len(expected) < 60
    assert mine.column("k").to_pylist() == expected
    assert mine.column("v").to_pylist() == [k * 2 for k in expected]


def test_a_rescaled_input_batch_with_none_of_this_subtasks_keys_is_not_delivered(
    tmp_path,
) -> None:
    outside = next(f"key{i}" for i in range(1000) if key_group(f"key{i}") not in LOWER_HALF)
    inside = next(f"key{i}" for i in range(1000) if key_group(f"key{i}") in LOWER_HALF)
    handle = write(tmp_path, (INPUT, EDGE_IN, 0, [keyed([(outside, 1)]), keyed([(inside, 2)])]))
    replay = Replay(by_key(), key_groups=LOWER_HALF)
    replay.run(restores(handle, reroute=True))
    assert replay.inputs(0) == [keyed([(inside, 2)])]


# ---------------------------------------------------------------- files and damage


class CountingFS:
    """Reads through to a real filesystem, counting whole-file reads."""

    def __init__(self, fs: StorageFS) -> None:
        self.fs = fs
        self.reads: list[str] = []

    def read_bytes(self, path: str) -> bytes:
        self.reads.append(path)
        return self.fs.read_bytes(path)


def test_a_file_is_read_once_for_all_its_entries(tmp_path) -> None:
    handle = write(
        tmp_path,
        (OUTPUT, EDGE_OUT, 0, [RowBatch([1])]),
        (INPUT, EDGE_IN, 0, [RowBatch([2])]),
        (INPUT, EDGE_IN_2, 0, [RowBatch([3])]),
    )
    counting = CountingFS(storage_fs(handle.path))
    replay = Replay(Partitioning("rebalance"), fs_of=lambda path: counting)
    replay.run(restores(handle))
    assert counting.reads == [handle.path]
    assert replay.inputs(0) == [RowBatch([2])] and replay.inputs(1) == [RowBatch([3])]


def test_a_frame_that_does_not_unpickle_is_corrupt_state(tmp_path) -> None:
    path = str(tmp_path / "chk-3" / "channels-sum-0")
    handle = write_channel_state(
        storage_fs(path), path, [ChannelFrames(INPUT, EDGE_IN, 0, [b"\x80\x05not a pickle"])]
    )
    assert handle is not None
    with pytest.raises(CorruptStateError, match="does not unpickle") as info:
        Replay(by_key()).run(restores(handle))
    assert info.value.path == path and path in str(info.value)


def test_a_damaged_file_is_corrupt_state(tmp_path) -> None:
    handle = write(tmp_path, (INPUT, EDGE_IN, 0, [RowBatch([1, 2, 3])]))
    with open(handle.path, "r+b") as f:
        f.seek(handle.size - 1)
        f.write(b"\xff")
    with pytest.raises(CorruptStateError, match="is damaged") as info:
        Replay(by_key()).run(restores(handle))
    assert info.value.path == handle.path


@pytest.mark.parametrize(
    ("direction", "fragment"),
    [
        (OUTPUT, "holds output of edge gone[main] -> x #0, which this task does not write"),
        (INPUT, "holds input of edge gone[main] -> x #0, which this task does not read"),
    ],
)
def test_state_of_an_edge_the_task_does_not_have_is_corrupt_state(
    tmp_path, direction: str, fragment: str
) -> None:
    handle = write(tmp_path, (direction, "gone[main] -> x #0", 0, [RowBatch([1])]))
    with pytest.raises(CorruptStateError, match=fragment.replace("[", r"\[").replace("]", r"\]")):
        Replay(by_key()).run(restores(handle))
