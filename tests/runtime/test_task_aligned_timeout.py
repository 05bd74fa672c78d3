"""A Task of a job with an aligned timeout whose barrier stays queued in an output (its
receiver has no credit): at the deadline it overtakes there, and the frames it passed
join the snapshot, which waits for that (fakes from ``task_support``)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from task_support import Control, ListChannel, chain_with, feed, make_task, map_graph

from epochstream.core.events import CheckpointBarrier, CheckpointOptions
from epochstream.runtime.messages import AcknowledgeCheckpoint, FinishSlot
from epochstream.state.channel_state import OUTPUT


def _frames(handle: Any, entry: Any) -> list[bytes]:
    data = Path(handle.path).read_bytes()
    return [data[offset : offset + length] for offset, length in entry.frames]


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
