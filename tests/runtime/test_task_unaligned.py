"""A stream task with unaligned checkpoints, driven directly (fakes from ``task_support``):
the snapshot taken at an overtaking barrier, the input and output channel state it
acknowledges, the aligned timeout, and replaying that state on restore."""

from __future__ import annotations

import pickle
import threading
from pathlib import Path
from typing import Any

from task_support import (
    END_OF_TIME,
    Control,
    ListChannel,
    barrier,
    chain_with,
    feed,
    finish_when_done,
    make_task,
    map_graph,
    wait_for,
)

from epochstream.core.events import END_OF_INPUT, CheckpointBarrier
from epochstream.core.filesystems import storage_fs
from epochstream.runtime.batches import RowBatch
from epochstream.runtime.frames import FrameEncoder
from epochstream.runtime.messages import AcknowledgeCheckpoint
from epochstream.runtime.task import Task
from epochstream.state.channel_state import (
    INPUT,
    OUTPUT,
    ChannelRestore,
    ChannelStateHandle,
    read_frames,
)


def overtaking(n: int) -> CheckpointBarrier:
    return barrier(n, unaligned=True)


def frames_of(handle: ChannelStateHandle) -> dict[tuple[str, str, int], list[Any]]:
    """Per (direction, edge, channel), the items a channel state file holds."""
    fs = storage_fs(handle.path)
    return {
        (e.direction, e.edge, e.channel): [pickle.loads(f) for f in read_frames(fs, handle, e)]
        for e in handle.entries
    }


def run_to_end(task: Task, control: Control) -> None:
    finish_when_done(control, task)
    task.run()


def the_ack(control: Control) -> AcknowledgeCheckpoint:
    [ack] = control.of(AcknowledgeCheckpoint)
    return ack


# ---------------------------------------------------------------- input channel state


def test_overtaking_barrier_snapshots_first_and_keeps_the_records_before_it(
    tmp_path: Path,
) -> None:
    graph = map_graph()
    chain = chain_with(graph, "map")
    control = Control()
    task, outputs = make_task(graph, chain, tmp_path, control, unaligned=True)
    feed(task, 0, [1], overtaking(1), [2], END_OF_INPUT)
    feed(task, 1, [3], [4], overtaking(1), [5], END_OF_INPUT)
    run_to_end(task, control)

    assert control.kinds() == ["AcknowledgeCheckpoint", "TaskFinished"]
    ack = the_ack(control)
    assert ack.checkpoint_id == 1
    handle = ack.states[chain.head.uid].channel
    assert handle is not None
    key = graph.edge_key(chain.inputs[0])
    assert frames_of(handle) == {
        (INPUT, key, 0): [RowBatch([1])],
        (INPUT, key, 1): [RowBatch([3]), RowBatch([4])],
    }
    assert ack.stats.unaligned and ack.stats.channel_state_bytes == handle.size
    (channels,) = outputs.values()
    for channel in channels:
        assert channel.items[0] == overtaking(1), "the barrier went on before any record"
        assert channel.events == [overtaking(1), END_OF_TIME, END_OF_INPUT]
    assert sorted(r for c in channels for r in c.records_between(1, None)) == [10, 20, 30, 40, 50]


def test_expired_aligned_timeout_turns_queued_barriers_unaligned(tmp_path: Path) -> None:
    graph = map_graph()
    chain = chain_with(graph, "map")
    control = Control()
    task, outputs = make_task(graph, chain, tmp_path, control, unaligned=True)
    # Triggered at wall-clock second 1001 with a 1 ms timeout: long past.
    timed = barrier(1, unaligned=True, aligned_timeout=0.001)
    feed(task, 0, [1], timed, [2], END_OF_INPUT)
    feed(task, 1, [3], [4], timed, [5], END_OF_INPUT)
    run_to_end(task, control)

    handle = the_ack(control).states[chain.head.uid].channel
    assert handle is not None
    key = graph.edge_key(chain.inputs[0])
    assert frames_of(handle) == {
        (INPUT, key, 0): [RowBatch([1])],
        (INPUT, key, 1): [RowBatch([3]), RowBatch([4])],
    }
    (channels,) = outputs.values()
    for channel in channels:
        assert channel.items[0] == timed.unaligned_now(), "forwarded overtaking"


def test_aligned_timeout_not_reached_aligns_and_keeps_no_channel_state(tmp_path: Path) -> None:
    graph = map_graph()
    chain = chain_with(graph, "map")
    control = Control()
    task, outputs = make_task(graph, chain, tmp_path, control, unaligned=True)
    timed = barrier(1, unaligned=True, aligned_timeout=1e12)  # its deadline never comes
    feed(task, 0, [1], timed, [2], END_OF_INPUT)
    feed(task, 1, [3], [4], timed, [5], END_OF_INPUT)
    run_to_end(task, control)

    ack = the_ack(control)
    assert ack.states.get(chain.head.uid) is None or ack.states[chain.head.uid].channel is None
    assert not ack.stats.unaligned and ack.stats.channel_state_bytes == 0
    (channels,) = outputs.values()
    assert sorted(r for c in channels for r in c.records_between(None, 1)) == [10, 30, 40]
    assert sorted(r for c in channels for r in c.records_between(1, None)) == [20, 50]
    for channel in channels:
        assert timed in channel.events, "forwarded in line, its timeout still running"


# ---------------------------------------------------------------- output channel state


class QueueChannel(ListChannel):
    """An output channel that never gets credit: batches stay queued; an overtaking
    barrier returns them as the frames it overtook (``CreditedNetworkChannel``'s way)."""

    def __init__(self) -> None:
        super().__init__()
        self.queued: list[Any] = []

    def send(self, item: Any) -> None:
        if type(item) is RowBatch:
            self.queued.append(item)
        else:
            self.items.append(item)

    def send_barrier(self, barrier: Any) -> list[bytes]:
        self.items.append(barrier)
        if not barrier.overtakes:
            return []
        encode = FrameEncoder().encode
        return [encode(item) for item in self.queued]


def test_frames_the_barrier_overtook_are_output_channel_state(tmp_path: Path) -> None:
    graph = map_graph()
    chain = chain_with(graph, "map")
    control = Control()
    task, _ = make_task(graph, chain, tmp_path, control, unaligned=True)
    [(edge_id, writer)] = task.writers.items()
    queues = [QueueChannel() for _ in writer.channels]
    writer.channels[:] = queues
    finish_when_done(control, task)
    thread = threading.Thread(target=task.run, name="task-under-test", daemon=True)
    thread.start()
    try:
        feed(task, 0, [1])
        feed(task, 1, [2])
        wait_for(lambda: task.metrics.head.records_in == 2)
        feed(task, 0, overtaking(1), END_OF_INPUT)
        feed(task, 1, overtaking(1), END_OF_INPUT)
        thread.join(10)
        assert not thread.is_alive()
    finally:
        task.gate.cancel()
        thread.join(10)

    handle = the_ack(control).states[chain.head.uid].channel
    assert handle is not None
    key = graph.edge_key(next(e for e in graph.edges if e.edge_id == edge_id))
    expected = {(OUTPUT, key, ch): queue.queued for ch, queue in enumerate(queues) if queue.queued}
    assert frames_of(handle) == expected
    assert sorted(r for batches in expected.values() for b in batches for r in b.records) == [
        10,
        20,
    ]


# ---------------------------------------------------------------- restore


def test_restore_sends_outputs_then_replays_inputs_before_new_input(tmp_path: Path) -> None:
    graph = map_graph()
    chain = chain_with(graph, "map")
    control = Control()
    task, _ = make_task(graph, chain, tmp_path, control, unaligned=True)
    feed(task, 0, [1], overtaking(1), [2], END_OF_INPUT)
    feed(task, 1, [3], [4], overtaking(1), [5], END_OF_INPUT)
    run_to_end(task, control)
    handle = the_ack(control).states[chain.head.uid].channel
    assert handle is not None

    restored_control = Control()
    restored, outputs = make_task(
        graph,
        chain,
        tmp_path / "restored",
        restored_control,
        unaligned=True,
        restored_checkpoint=1,
        channel_state=[ChannelRestore(handle, entry) for entry in handle.entries],
    )
    feed(restored, 0, [6], END_OF_INPUT)
    feed(restored, 1, END_OF_INPUT)
    run_to_end(restored, restored_control)
    (channels,) = outputs.values()
    # All four records have key 0 (mod 2): one channel, in-flight records first, in order.
    assert [c.records for c in channels if c.records] == [[10, 30, 40, 60]]


def test_mixed_copies_one_overtaking_one_timed_out_lose_no_record(tmp_path: Path) -> None:
    # Channel 0's upstream timed out first and forwarded barrier 1 overtaking; channel 1's
    # copy is still in line, its (long past) deadline due when the task next reads.
    graph = map_graph()
    chain = chain_with(graph, "map")
    control = Control()
    task, outputs = make_task(graph, chain, tmp_path, control, unaligned=True)
    timed = barrier(1, unaligned=True, aligned_timeout=0.001)
    feed(task, 0, [1], timed.unaligned_now(), [2], END_OF_INPUT)
    feed(task, 1, [3], [4], timed, [5], END_OF_INPUT)
    run_to_end(task, control)

    handle = the_ack(control).states[chain.head.uid].channel
    assert handle is not None
    key = graph.edge_key(chain.inputs[0])
    assert frames_of(handle) == {
        (INPUT, key, 0): [RowBatch([1])],
        (INPUT, key, 1): [RowBatch([3]), RowBatch([4])],
    }
    (channels,) = outputs.values()
    assert sorted(r for c in channels for r in c.records) == [10, 20, 30, 40, 50]
