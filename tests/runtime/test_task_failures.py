"""How a stream task fails, driven as in ``test_task``: failing snapshots, user and data
errors, corrupt state on restore, unexpected input, cancel and early finish."""

from __future__ import annotations

from pathlib import Path

import pytest
from task_support import (
    MAX_P,
    Control,
    LogSink,
    Mark,
    barrier,
    chain_with,
    feed,
    finish_when_done,
    make_task,
    map_graph,
    reduce_graph,
)

import epochstream as es
from epochstream.core.events import END_OF_INPUT, EndOfInput
from epochstream.exceptions import CorruptStateError, UserFunctionError
from epochstream.runtime.messages import DeclineCheckpoint, FinishSlot, TaskFailed
from epochstream.state.handles import HeapSnapshotHandle, HeapStateFile, OperatorRestore
from epochstream.state.keygroups import key_group_for_key


def _explode_on_13(i: int) -> int:
    if i == 13:
        raise ValueError("thirteen is unlucky")
    return i


# ---------------------------------------------------------------- stream tasks: failures


def test_a_failing_synchronous_snapshot_declines_and_fails_the_task(tmp_path: Path) -> None:
    sink = LogSink(fail_snapshot=True)
    graph = reduce_graph(sink)
    chain = chain_with(graph, "reduce")
    control = Control()
    task, _ = make_task(graph, chain, tmp_path, control)
    feed(task, 0, [("a", 1)], barrier(4), END_OF_INPUT)
    task.run()
    key = (chain.chain_id, 0)
    assert control.kinds() == ["DeclineCheckpoint", "TaskFailed"]
    decline, failed = control.sent
    assert decline.checkpoint_id == 4 and decline.task == key
    assert "snapshot failed" in decline.reason and "sink cannot pre-commit" in decline.reason
    assert failed.task == key and "sink cannot pre-commit" in failed.description


def test_a_failed_task_closes_its_sink_after_the_cancel_says_what_to_abandon(
    tmp_path: Path,
) -> None:
    # The job master's CancelSlot names the highest checkpoint that may have completed;
    # the failed task waits for it, so its sink aborts what only later checkpoints hold.
    import time

    sink = LogSink(fail_snapshot=True)
    graph = reduce_graph(sink)
    chain = chain_with(graph, "reduce")
    control = Control()
    task, _ = make_task(graph, chain, tmp_path, control)
    control.react = lambda msg: task.cancel.cancelled(3) if isinstance(msg, TaskFailed) else None
    feed(task, 0, [("a", 1)], barrier(4), END_OF_INPUT)
    t0 = time.monotonic()
    task.run()
    assert time.monotonic() - t0 < 2.0
    assert sink.log[-1] == Mark("abandon", 3)


def test_a_failed_task_without_a_cancel_closes_after_the_wait_abandoning_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from epochstream.runtime import task as task_module

    monkeypatch.setattr(task_module, "CANCEL_WAIT", 0.1)
    sink = LogSink(fail_snapshot=True)
    graph = reduce_graph(sink)
    control = Control()
    task, _ = make_task(graph, chain_with(graph, "reduce"), tmp_path, control)
    feed(task, 0, [("a", 1)], barrier(4), END_OF_INPUT)
    task.run()
    assert control.kinds() == ["DeclineCheckpoint", "TaskFailed"]
    assert not any(isinstance(r, Mark) and r.what == "abandon" for r in sink.log)


def test_a_failing_asynchronous_snapshot_declines_and_the_task_goes_on(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "occupied"
    not_a_dir.write_text("a file where the checkpoint directory should be")
    sink = LogSink()
    graph = reduce_graph(sink)
    chain = chain_with(graph, "reduce")
    control = Control()
    task, _ = make_task(graph, chain, tmp_path, control, checkpoint_dir=str(not_a_dir / "job"))
    feed(task, 0, [("a", 1)], barrier(1), [("a", 2)], END_OF_INPUT)
    finish_when_done(control, task)
    task.run()
    assert control.kinds() == ["DeclineCheckpoint", "TaskFinished"]
    decline = control.of(DeclineCheckpoint)[0]
    assert decline.checkpoint_id == 1 and "async snapshot failed" in decline.reason
    assert sink.records == [("a", 1), ("a", 3)]


def test_user_error_is_reported_naming_the_operator_and_record(tmp_path: Path) -> None:
    graph = map_graph(_explode_on_13)
    chain = chain_with(graph, "map")
    control = Control()
    task, outputs = make_task(graph, chain, tmp_path, control, subtask=1)
    feed(task, 0, [11, 12], [13, 14], END_OF_INPUT)
    feed(task, 1, END_OF_INPUT)
    task.run()
    (failed,) = control.of(TaskFailed)
    assert control.sent == [failed]
    assert failed.task == (chain.chain_id, 1)
    assert failed.description.startswith("map(_explode_on_13) (2/2): UserFunctionError: ")
    assert "map(_explode_on_13) (2/2) failed on record 13" in failed.description
    assert "ValueError: thirteen is unlucky" in failed.description
    assert isinstance(failed.error, UserFunctionError)
    assert not failed.suppress_restarts and not failed.secondary
    assert "ValueError" in failed.traceback
    (channels,) = outputs.values()
    assert all(END_OF_INPUT not in c.items for c in channels)


def test_data_error_in_a_task_asks_for_no_restarts(tmp_path: Path) -> None:
    def reject(i: int) -> int:
        raise es.DataError(f"row {i} is malformed")

    graph = map_graph(reject)
    control = Control()
    task, _ = make_task(graph, chain_with(graph, "map"), tmp_path, control)
    feed(task, 0, [7])
    task.run()
    (failed,) = control.of(TaskFailed)
    assert failed.suppress_restarts and "row 7 is malformed" in failed.description


def test_corrupt_state_on_restore_is_reported_with_the_restored_checkpoint(
    tmp_path: Path,
) -> None:
    graph = reduce_graph(LogSink())
    chain = chain_with(graph, "reduce")
    reduce_uid = chain.head.uid
    # A file missing from a store that is there (a whole missing store is an outage).
    (tmp_path / "ckpt" / "job" / "shared").mkdir(parents=True)
    missing = str(tmp_path / "ckpt" / "job" / "shared" / "7-gone.kst")
    kg = key_group_for_key("a", MAX_P)
    handle = HeapSnapshotHandle(
        range(0, MAX_P), (HeapStateFile(missing, True, {kg: (0, 64)}, 64),), {"_reduce": "value"}
    )
    control = Control()
    task, _ = make_task(
        graph,
        chain,
        tmp_path,
        control,
        restore={reduce_uid: OperatorRestore(keyed=[handle], owned=True)},
        restored_checkpoint=7,
    )
    task.run()  # fails while restoring: no input, no mail needed
    (failed,) = control.sent
    assert isinstance(failed, TaskFailed)
    assert isinstance(failed.error, CorruptStateError)
    assert failed.error.checkpoint_id == 7 and failed.error.path == missing
    assert f"restoring checkpoint 7 of operator {reduce_uid}" in failed.description


def test_unexpected_input_item_fails_the_task(tmp_path: Path) -> None:
    graph = map_graph()
    chain = chain_with(graph, "map")
    control = Control()
    task, _ = make_task(graph, chain, tmp_path, control)
    feed(task, 0, "not a batch")
    task.run()
    (failed,) = control.of(TaskFailed)
    assert "unexpected item str on channel 0" in failed.description


def test_cancel_mail_stops_a_task_without_reporting(tmp_path: Path) -> None:
    from epochstream.runtime.messages import CancelSlot

    graph = map_graph()
    control = Control()
    task, outputs = make_task(graph, chain_with(graph, "map"), tmp_path, control)
    feed(task, 0, [1])
    task.gate.put_mail(CancelSlot("failover"))
    task.run()
    assert control.sent == []
    (channels,) = outputs.values()
    assert all(not any(isinstance(i, EndOfInput) for i in c.items) for c in channels)


@pytest.mark.parametrize("stopped", [False, True])
def test_finish_before_the_input_ended_stops_the_task(
    tmp_path: Path, stopped: bool, caplog: pytest.LogCaptureFixture
) -> None:
    graph = map_graph()
    control = Control()
    task, _ = make_task(graph, chain_with(graph, "map"), tmp_path, control)
    task.gate.put_mail(FinishSlot(stopped=stopped))
    task.run()
    assert control.sent == []
    warned = "asked to finish before its input ended" in caplog.text
    assert warned is not stopped
