"""A Task driven directly: a fake control sender, list channels, scripted mail, no slot.

Most tests run ``Task.run`` on the test's own thread. The fake job master (``Control``)
answers messages with mail (``TaskFinished`` -> ``FinishSlot``...), the synchronous
snapshot executor acknowledges inside the barrier, and sources pause at a chosen
record, so every interleaving is fixed by the script rather than by timing. The fakes
and builders are in ``task_support``.

This module: barrier alignment and the end of input in a stream task.
"""

from __future__ import annotations

import threading
from pathlib import Path

from task_support import (
    END_OF_TIME,
    Control,
    barrier,
    chain_with,
    feed,
    finish_when_done,
    make_task,
    map_graph,
    wait_for,
)

from epochstream.core.events import END_OF_INPUT
from epochstream.runtime.messages import (
    AcknowledgeCheckpoint,
    NotifyCheckpointAborted,
    TaskFinished,
)
from epochstream.runtime.task import Task

# ---------------------------------------------------------------- stream tasks: alignment


def _queue_unaligned_barriers(task: Task) -> None:
    # Channel 0 delivers barrier 1 early; records 2 and 5 come after it on their channels.
    feed(task, 0, [1], barrier(1), [2], END_OF_INPUT)
    feed(task, 1, [3], [4], barrier(1), [5], END_OF_INPUT)


def test_exactly_once_aligns_barriers_before_snapshotting(tmp_path: Path) -> None:
    graph = map_graph()
    chain = chain_with(graph, "map")
    control = Control()
    task, outputs = make_task(graph, chain, tmp_path, control)
    _queue_unaligned_barriers(task)
    finish_when_done(control, task)
    task.run()

    (channels,) = outputs.values()
    before = sorted(r for c in channels for r in c.records_between(None, 1))
    after = sorted(r for c in channels for r in c.records_between(1, None))
    assert before == [10, 30, 40], "record 2 waited behind channel 0's barrier"
    assert after == [20, 50]
    for channel in channels:
        assert channel.events == [barrier(1), END_OF_TIME, END_OF_INPUT]
    assert control.kinds() == ["AcknowledgeCheckpoint", "TaskFinished"]
    assert control.of(AcknowledgeCheckpoint)[0].checkpoint_id == 1


def test_at_least_once_does_not_block_a_channel_that_delivered_its_barrier(
    tmp_path: Path,
) -> None:
    graph = map_graph()
    chain = chain_with(graph, "map")
    control = Control()
    task, outputs = make_task(graph, chain, tmp_path, control, exactly_once=False)
    _queue_unaligned_barriers(task)
    finish_when_done(control, task)
    task.run()
    (channels,) = outputs.values()
    before = sorted(r for c in channels for r in c.records_between(None, 1))
    assert 20 in before, "at-least-once reads on past the first barrier"
    assert sorted(r for c in channels for r in c.records) == [10, 20, 30, 40, 50]
    assert [m.checkpoint_id for m in control.of(AcknowledgeCheckpoint)] == [1]


def test_end_of_input_on_every_channel_is_forwarded_and_reported(tmp_path: Path) -> None:
    graph = map_graph()
    chain = chain_with(graph, "map")
    control = Control()
    task, outputs = make_task(graph, chain, tmp_path, control, subtask=1)
    feed(task, 0, [1, 2], END_OF_INPUT)
    feed(task, 1, END_OF_INPUT)
    finish_when_done(control, task)
    task.run()
    assert control.sent == [TaskFinished((chain.chain_id, 1))]
    (channels,) = outputs.values()
    assert sorted(r for c in channels for r in c.records) == [10, 20]
    for channel in channels:
        assert channel.items[-1] == END_OF_INPUT
        assert channel.events == [END_OF_TIME, END_OF_INPUT]


def test_an_aborted_alignment_unblocks_the_channel(tmp_path: Path) -> None:
    graph = map_graph()
    chain = chain_with(graph, "map")
    control = Control()
    task, outputs = make_task(graph, chain, tmp_path, control)
    finish_when_done(control, task)
    thread = threading.Thread(target=task.run, name="task-under-test", daemon=True)
    thread.start()
    try:
        feed(task, 0, [1], barrier(1), [2])
        wait_for(lambda: task.barriers.blocked[0] and task.barriers.pending_checkpoint == 1)
        assert task.gate.has_input() is False, "record 2 waits behind the barrier"
        task.gate.put_mail(NotifyCheckpointAborted(1, "declined elsewhere"))
        wait_for(lambda: not task.barriers.blocked[0])
        feed(task, 1, [3], barrier(1), END_OF_INPUT)  # a stale barrier of the aborted one
        feed(task, 0, END_OF_INPUT)
        thread.join(10)
        assert not thread.is_alive()
    finally:
        task.gate.cancel()
        thread.join(10)
    assert control.kinds() == ["TaskFinished"], "the aborted checkpoint is never snapshotted"
    (channels,) = outputs.values()
    assert sorted(r for c in channels for r in c.records) == [10, 20, 30]
    assert all(barrier(1) not in c.items for c in channels)
