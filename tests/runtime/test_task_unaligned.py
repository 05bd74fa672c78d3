"""A Task of a job with unaligned checkpoints, driven directly (fakes from
``task_support``): the snapshot is taken at the first overtaking barrier, the records
queued before the barriers become the acknowledged channel state, a restored task
processes them again before anything new, and an aligned barrier with a timeout still
queued in an output overtakes there at its deadline."""

from __future__ import annotations

import pickle
import time
from pathlib import Path
from typing import Any

from task_support import (
    Control,
    ListChannel,
    barrier,
    chain_with,
    feed,
    finish_when_done,
    make_task,
    map_graph,
)

from epochstream.core.events import END_OF_INPUT, CheckpointBarrier, CheckpointOptions
from epochstream.runtime.messages import AcknowledgeCheckpoint, FinishSlot
from epochstream.state.channel_state import INPUT, OUTPUT, ChannelRestore


def _records(channels: list[ListChannel]) -> list[Any]:
    return sorted(r for c in channels for r in c.records)


def _overtaking_run(tmp_path: Path) -> tuple[AcknowledgeCheckpoint, list[ListChannel]]:
    graph = map_graph()
    control = Control()
    task, outputs = make_task(graph, chain_with(graph, "map"), tmp_path, control, unaligned=True)
    # Records 1, 3 and 4 are queued before the barriers; 2 and 5 come after them.
    feed(task, 0, [1], barrier(1, unaligned=True), [2], END_OF_INPUT)
    feed(task, 1, [3], [4], barrier(1, unaligned=True), [5], END_OF_INPUT)
    finish_when_done(control, task)
    task.run()
    (ack,) = control.of(AcknowledgeCheckpoint)
    (channels,) = outputs.values()
    return ack, channels


def test_the_barrier_overtakes_and_the_queued_records_become_channel_state(
    tmp_path: Path,
) -> None:
    ack, channels = _overtaking_run(tmp_path)
    # Snapshot first: the barrier left before any record (all were queued behind it).
    for channel in channels:
        assert channel.records_between(None, 1) == []
    assert _records(channels) == [10, 20, 30, 40, 50]
    stats = ack.stats
    assert stats.unaligned and stats.channel_state_bytes > 0
    (state,) = ack.states.values()
    handle = state.channel
    assert handle is not None and all(e.direction == INPUT for e in handle.entries)
    saved = {
        e.channel: [pickle.loads(f).records for f in _frames(handle, e)] for e in handle.entries
    }
    assert saved == {0: [[1]], 1: [[3], [4]]}, "exactly the records before each cut"


def _frames(handle: Any, entry: Any) -> list[bytes]:
    data = Path(handle.path).read_bytes()
    return [data[offset : offset + length] for offset, length in entry.frames]


def test_a_restored_task_processes_its_channel_state_before_new_input(tmp_path: Path) -> None:
    ack, _ = _overtaking_run(tmp_path / "first")
    (state,) = ack.states.values()
    assert state.channel is not None
    restores = [ChannelRestore(state.channel, entry) for entry in state.channel.entries]
    graph = map_graph()
    control = Control()
    task, outputs = make_task(
        graph,
        chain_with(graph, "map"),
        tmp_path / "second",
        control,
        unaligned=True,
        channel_state=restores,
        restored_checkpoint=1,
    )
    # After the restore the source sends what followed its barrier: 2 and 5.
    feed(task, 0, [2], END_OF_INPUT)
    feed(task, 1, [5], END_OF_INPUT)
    finish_when_done(control, task)
    task.run()
    (channels,) = outputs.values()
    assert _records(channels) == [10, 20, 30, 40, 50], "each record once, none lost"
    for channel in channels:  # the restored records went out before the new ones
        order = channel.records
        restored = [i for i, r in enumerate(order) if r in (10, 30, 40)]
        new = [i for i, r in enumerate(order) if r in (20, 50)]
        assert not restored or not new or max(restored) < min(new), order


class _QueuedChannel(ListChannel):
    """An output whose barrier stays queued until its deadline makes it overtake."""

    def __init__(self) -> None:
        super().__init__()
        self.pending: set[int] = set()
        self.promoted: list[int] = []

    def send_barrier(self, barrier: Any) -> list[bytes]:
        self.items.append(barrier)
        if barrier.alignment_deadline is not None:
            self.pending.add(barrier.checkpoint_id)
        return []

    def barrier_pending(self, checkpoint_id: int) -> bool:
        return checkpoint_id in self.pending

    def promote_barrier(self, checkpoint_id: int) -> list[bytes]:
        self.pending.discard(checkpoint_id)
        self.promoted.append(checkpoint_id)
        return [b"overtaken frame"]


def test_a_barrier_queued_in_an_output_overtakes_at_its_deadline(tmp_path: Path) -> None:
    graph = map_graph()
    control = Control()
    task, outputs = make_task(graph, chain_with(graph, "map"), tmp_path, control, unaligned=True)
    (edge_id,) = outputs
    queued = [_QueuedChannel() for _ in outputs[edge_id]]
    task.writers[edge_id].channels = list(queued)
    # Aligned with a timeout: the task aligns in time, but its barrier stays queued.
    options = CheckpointOptions(unaligned=True, aligned_timeout=0.2)
    late = CheckpointBarrier(1, time.time(), options)
    feed(task, 0, [1], late)
    feed(task, 1, [3], late)

    def react(msg: Any) -> None:
        if isinstance(msg, AcknowledgeCheckpoint):
            task.gate.put_mail(FinishSlot())

    control.react = react
    task.run()
    (ack,) = control.of(AcknowledgeCheckpoint)
    assert all(c.promoted == [1] for c in queued)
    assert ack.stats.unaligned
    (state,) = ack.states.values()
    assert state.channel is not None
    entries = state.channel.entries
    assert sorted(e.channel for e in entries) == [0, 1]
    assert all(e.direction == OUTPUT for e in entries)
    assert all(_frames(state.channel, e) == [b"overtaken frame"] for e in entries)
