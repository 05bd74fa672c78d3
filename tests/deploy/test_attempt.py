"""One attempt's progress, driven by plain messages and times (no job master, no slots)."""

from __future__ import annotations

from epochstream.deploy.attempt import AttemptProgress, Phase
from epochstream.runtime.messages import RegisterSlot

SRC0, SRC1, SINK0, SINK1 = ("src", 0), ("src", 1), ("sink", 0), ("sink", 1)


def _progress(**kw: float) -> AttemptProgress:
    return AttemptProgress(
        attempt=3,
        parallelism=2,
        tasks={SRC0, SRC1, SINK0, SINK1},
        sources={SRC0, SRC1},
        started=kw.get("started", 100.0),
        registration_timeout=kw.get("registration_timeout", 10.0),
        heartbeat_timeout=kw.get("heartbeat_timeout", 5.0),
    )


def _register(slot: int, attempt: int = 3) -> RegisterSlot:
    return RegisterSlot(slot=slot, attempt=attempt, pid=1000 + slot, host="127.0.0.1")


def test_phases_advance_only_once_every_slot_reported() -> None:
    progress = _progress()
    assert progress.registered(0, now=100.0) is None
    assert progress.registered(1, now=100.5) is Phase.DEPLOYING
    assert progress.ready(1, ("127.0.0.1", 4001)) is None
    assert progress.ready(0, ("127.0.0.1", 4000)) is Phase.CONNECTING
    assert progress.addresses == {0: ("127.0.0.1", 4000), 1: ("127.0.0.1", 4001)}
    assert progress.slot_running(0) is None
    assert progress.slot_running(1) is Phase.RUNNING


def test_registration_refuses_other_attempts_duplicates_and_late_slots() -> None:
    progress = _progress()
    assert progress.accepts(_register(0), Phase.REGISTERING)
    assert not progress.accepts(_register(0, attempt=2), Phase.REGISTERING)
    progress.registered(0, now=100.0)
    assert not progress.accepts(_register(0), Phase.REGISTERING)
    assert not progress.accepts(_register(1), Phase.DEPLOYING)


def test_addresses_are_a_copy() -> None:
    progress = _progress()
    progress.ready(0, ("h", 1))
    progress.addresses[1] = ("x", 2)
    assert progress.addresses == {0: ("h", 1)}


def test_all_sources_exhausted_is_reported_once_every_source_is() -> None:
    progress = _progress()
    assert not progress.source_exhausted(SRC0)
    assert not progress.source_exhausted(SRC0)
    assert progress.source_exhausted(SRC1)


def test_finishing_needs_running_every_task_and_the_final_commit() -> None:
    progress = _progress()
    for task in (SRC0, SRC1, SINK0):
        progress.task_finished(task)
    assert progress.finishing(Phase.RUNNING, final_committed=True) is None
    progress.task_finished(SINK1)
    assert progress.finishing(Phase.RUNNING, final_committed=False) is None
    assert progress.finishing(Phase.CONNECTING, final_committed=True) is None
    assert progress.finishing(Phase.RUNNING, final_committed=True) is Phase.FINISHING


def test_done_once_every_slot_closed_while_finishing() -> None:
    progress = _progress()
    assert progress.slot_closed(0, Phase.RUNNING) is None
    assert progress.slot_closed(1, Phase.RUNNING) is None  # closed, but not finishing
    assert progress.closed == {0, 1}
    finishing = _progress()
    assert finishing.slot_closed(1, Phase.FINISHING) is None
    assert finishing.slot_closed(0, Phase.FINISHING) is Phase.DONE


def test_a_closed_connection_loses_only_an_open_slot_of_this_attempt() -> None:
    progress = _progress()
    assert progress.lost(3, 0)
    assert not progress.lost(2, 0)  # a slot of an earlier attempt
    assert not progress.lost(None, None)  # closed before it registered
    progress.slot_closed(0, Phase.RUNNING)
    assert not progress.lost(3, 0)


def test_registration_overdue_names_how_many_registered() -> None:
    progress = _progress(started=100.0, registration_timeout=10.0)
    progress.registered(1, now=101.0)
    assert progress.registration_overdue(110.0, Phase.REGISTERING) is None
    assert progress.registration_overdue(110.1, Phase.DEPLOYING) is None
    overdue = progress.registration_overdue(110.1, Phase.REGISTERING)
    assert overdue == (
        "only 1 of 2 slots registered within 10s (does the cluster have 2 free task slots?)"
    )


def test_a_silent_slot_is_named_unless_it_closed() -> None:
    progress = _progress(heartbeat_timeout=5.0)
    progress.registered(0, now=100.0)
    progress.registered(1, now=100.0)
    progress.heard_from(0, now=104.0)
    assert progress.silent_slot(105.0) is None
    assert progress.silent_slot(105.5) == "slot 1 missed heartbeats for 5.5s"
    progress.slot_closed(1, Phase.RUNNING)
    assert progress.silent_slot(105.5) is None
    assert progress.silent_slot(109.5) == "slot 0 missed heartbeats for 5.5s"
