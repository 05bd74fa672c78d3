"""State-machine tests of the barrier handler's unaligned checkpoints: overtaking barriers,
the aligned timeout, several unaligned checkpoints in flight, aborts and cancellation."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from epochstream.core.clock import ManualClock
from epochstream.exceptions import CheckpointError
from epochstream.runtime.barriers import (
    AbortAlignment,
    Action,
    BarrierHandler,
    ChannelStateComplete,
    EndOfAllInputs,
    HandlerState,
    TriggerSnapshot,
)


def aligned(num_channels: int, clock: ManualClock | None = None) -> BarrierHandler:
    return BarrierHandler(
        num_channels=num_channels, exactly_once=True, clock=clock or ManualClock()
    )


def counting(num_channels: int) -> BarrierHandler:
    return BarrierHandler(num_channels=num_channels, exactly_once=False, clock=ManualClock())


def unaligned_trigger(checkpoint_id: int, alignment_s: float = 0.0) -> TriggerSnapshot:
    return TriggerSnapshot(checkpoint_id, alignment_s, unaligned=True)


# ---------------------------------------------------------------- overtaking barriers


def test_overtaking_barrier_triggers_at_once_and_records_until_every_channel_delivered_it() -> None:
    clock = ManualClock(start=10.0)
    handler = aligned(3, clock)
    clock.advance(4.0)
    assert handler.on_barrier(1, 5, overtakes=True) == [unaligned_trigger(5)]
    assert handler.state is HandlerState.UNALIGNED
    assert handler.unaligned_in_flight == [5]
    assert handler.pending_checkpoint is None
    assert handler.blocked == [False, False, False], "unaligned never blocks a channel"
    assert handler.on_barrier(0, 5, overtakes=True) == []
    assert handler.state is HandlerState.UNALIGNED
    assert handler.on_barrier(1, 5, overtakes=True) == [], "a repeated copy is harmless"
    assert handler.on_barrier(2, 5, overtakes=True) == [ChannelStateComplete(5)]
    assert handler.state is HandlerState.IDLE
    assert handler.unaligned_in_flight == []
    assert handler.on_barrier(2, 5, overtakes=True) == [], "stale once complete"


def test_single_channel_gate_completes_its_channel_state_at_once() -> None:
    handler = aligned(1)
    assert handler.on_barrier(0, 3, overtakes=True) == [
        unaligned_trigger(3),
        ChannelStateComplete(3),
    ]
    assert handler.state is HandlerState.IDLE
    assert handler.unaligned_in_flight == []


def test_ended_channels_are_not_awaited_by_an_overtaking_barrier() -> None:
    handler = aligned(3)
    handler.on_end_of_input(0)
    handler.on_end_of_input(2)
    assert handler.on_barrier(1, 4, overtakes=True) == [
        unaligned_trigger(4),
        ChannelStateComplete(4),
    ]
    assert handler.state is HandlerState.IDLE


def test_end_of_input_on_the_remaining_channel_completes_the_recording() -> None:
    handler = aligned(3)
    assert handler.on_barrier(0, 4, overtakes=True) == [unaligned_trigger(4)]
    assert handler.on_end_of_input(1) == []
    assert handler.state is HandlerState.UNALIGNED
    assert handler.on_end_of_input(2) == [ChannelStateComplete(4)]
    assert handler.state is HandlerState.IDLE
    assert handler.open_channels == 1


def test_end_of_every_input_completes_the_recording_before_ending() -> None:
    handler = aligned(2)
    handler.on_barrier(0, 4, overtakes=True)
    # Channel 0 delivered barrier 4 without being blocked: it may end at once.
    assert handler.on_end_of_input(0) == []
    assert handler.on_end_of_input(1) == [ChannelStateComplete(4), EndOfAllInputs()]
    assert handler.state is HandlerState.CLOSED
    assert handler.unaligned_in_flight == []


# ---------------------------------------------------------------- the aligned timeout


def test_alignment_timeout_switches_to_unaligned_and_releases_the_blocked_channels() -> None:
    clock = ManualClock(start=100.0)
    handler = aligned(3, clock)
    gate_view = handler.blocked  # the input gate keeps this reference
    clock.advance(7.0)  # time before the first barrier does not count
    assert handler.on_barrier(0, 2) == []
    clock.advance(0.3)
    assert handler.on_barrier(2, 2) == []
    assert handler.blocked == [True, False, True]
    clock.advance(0.2)
    [trigger] = handler.on_alignment_timeout(2)
    assert trigger == TriggerSnapshot(2, pytest.approx(0.5), unaligned=True)  # type: ignore[arg-type]
    assert gate_view == [False, False, False] and handler.blocked is gate_view
    assert handler.state is HandlerState.UNALIGNED
    assert handler.pending_checkpoint is None
    assert handler.unaligned_in_flight == [2]
    # Channels 0 and 2 delivered barrier 2 before the switch: only channel 1 is awaited.
    assert handler.on_barrier(1, 2, overtakes=True) == [ChannelStateComplete(2)]
    assert handler.state is HandlerState.IDLE


def test_alignment_timeout_then_an_in_line_copy_completes_without_blocking() -> None:
    handler = aligned(2)
    handler.on_barrier(0, 6)
    handler.on_alignment_timeout(6)
    # A copy that was already taken from its queue before the gate promoted it.
    assert handler.on_barrier(1, 6) == [ChannelStateComplete(6)]
    assert handler.blocked == [False, False]
    assert handler.state is HandlerState.IDLE


def test_alignment_timeout_of_a_checkpoint_not_pending_does_nothing() -> None:
    handler = aligned(2)
    assert handler.on_alignment_timeout(1) == []
    handler.on_barrier(0, 2)
    assert handler.on_alignment_timeout(1) == [], "only the pending id switches"
    assert handler.on_barrier(1, 2) == [TriggerSnapshot(2, 0.0)]
    assert handler.on_alignment_timeout(2) == [], "already triggered aligned"
    assert handler.state is HandlerState.IDLE


def test_alignment_timeout_in_at_least_once_mode_does_nothing() -> None:
    handler = counting(2)
    handler.on_barrier(0, 1)
    assert handler.on_alignment_timeout(1) == []
    assert handler.state is HandlerState.COUNTING


def test_overtaking_copy_of_the_pending_checkpoint_switches_it_to_unaligned() -> None:
    clock = ManualClock()
    handler = aligned(3, clock)
    handler.on_barrier(0, 2)
    clock.advance(0.4)
    # The upstream task of channel 1 timed out first and forwarded the barrier unaligned.
    [trigger] = handler.on_barrier(1, 2, overtakes=True)
    assert trigger == TriggerSnapshot(2, pytest.approx(0.4), unaligned=True)  # type: ignore[arg-type]
    assert handler.blocked == [False, False, False]
    assert handler.unaligned_in_flight == [2]
    assert handler.on_barrier(2, 2, overtakes=True) == [ChannelStateComplete(2)]


def test_overtaking_copy_on_the_blocked_channel_switches_it_too() -> None:
    handler = aligned(2)
    handler.on_barrier(0, 2)
    # Priority barriers are read even from a blocked channel (a second copy of 2 there).
    assert handler.on_barrier(0, 2, overtakes=True) == [unaligned_trigger(2)]
    assert handler.blocked == [False, False]
    assert handler.on_barrier(1, 2, overtakes=True) == [ChannelStateComplete(2)]


def test_newer_overtaking_barrier_on_a_blocked_channel_subsumes_the_alignment() -> None:
    handler = aligned(2)
    handler.on_barrier(0, 1)
    assert handler.on_barrier(0, 2, overtakes=True) == [
        AbortAlignment(1, "subsumed by checkpoint 2"),
        unaligned_trigger(2),
    ]
    assert handler.blocked == [False, False]
    assert handler.on_barrier(1, 1) == [], "stale"
    assert handler.on_barrier(1, 2, overtakes=True) == [ChannelStateComplete(2)]


# ---------------------------------------------------------------- several in flight


def test_two_unaligned_checkpoints_in_flight_complete_in_order() -> None:
    handler = aligned(2)
    assert handler.on_barrier(0, 1, overtakes=True) == [unaligned_trigger(1)]
    assert handler.on_barrier(0, 2, overtakes=True) == [unaligned_trigger(2)]
    assert handler.unaligned_in_flight == [1, 2]
    assert handler.state is HandlerState.UNALIGNED
    assert handler.on_barrier(1, 1, overtakes=True) == [ChannelStateComplete(1)]
    assert handler.unaligned_in_flight == [2]
    assert handler.on_barrier(1, 2, overtakes=True) == [ChannelStateComplete(2)]
    assert handler.unaligned_in_flight == []
    assert handler.state is HandlerState.IDLE


def test_a_newer_barrier_on_a_channel_that_skipped_an_unaligned_one_aborts_it() -> None:
    handler = aligned(3)
    handler.on_barrier(0, 1, overtakes=True)
    handler.on_barrier(1, 1, overtakes=True)
    # Channel 2 is FIFO: barrier 1 can no longer come after barrier 2 there.
    assert handler.on_barrier(2, 2, overtakes=True) == [
        AbortAlignment(1, "barrier 2 overtook it on channel 2"),
        unaligned_trigger(2),
    ]
    assert handler.unaligned_in_flight == [2]
    assert handler.on_barrier(2, 1, overtakes=True) == [], "stale"
    handler.on_barrier(0, 2, overtakes=True)
    assert handler.on_barrier(1, 2, overtakes=True) == [ChannelStateComplete(2)]
    assert handler.state is HandlerState.IDLE


def test_a_newer_barrier_aborts_only_the_older_ones_its_channel_skipped() -> None:
    handler = aligned(2)
    handler.on_barrier(0, 1, overtakes=True)
    handler.on_barrier(1, 2, overtakes=True)  # aborts 1 (channel 1 skipped it), triggers 2
    handler.on_barrier(1, 3, overtakes=True)  # channel 1 delivered 2: 2 stays
    assert handler.unaligned_in_flight == [2, 3]
    assert handler.on_barrier(0, 2, overtakes=True) == [ChannelStateComplete(2)]
    assert handler.on_barrier(0, 3, overtakes=True) == [ChannelStateComplete(3)]


def test_newer_aligned_barrier_while_an_unaligned_one_is_in_flight() -> None:
    clock = ManualClock()
    handler = aligned(3, clock)
    handler.on_barrier(0, 1, overtakes=True)
    assert handler.on_barrier(0, 2) == [], "savepoint 2 aligns (channel 0 delivered 1)"
    assert handler.state is HandlerState.ALIGNING
    assert handler.pending_checkpoint == 2
    assert handler.unaligned_in_flight == [1]
    assert handler.blocked == [True, False, False]
    assert handler.on_barrier(1, 1, overtakes=True) == []
    assert handler.on_barrier(2, 1, overtakes=True) == [ChannelStateComplete(1)]
    assert handler.state is HandlerState.ALIGNING, "2 is still aligning"
    assert handler.on_barrier(1, 2) == []
    clock.advance(1.0)
    assert handler.on_barrier(2, 2) == [TriggerSnapshot(2, 1.0)]
    assert handler.state is HandlerState.IDLE


def test_newer_aligned_barrier_on_a_channel_that_skipped_the_unaligned_one() -> None:
    handler = aligned(2)
    handler.on_barrier(0, 1, overtakes=True)
    assert handler.on_barrier(1, 2) == [AbortAlignment(1, "barrier 2 overtook it on channel 1")]
    assert handler.pending_checkpoint == 2
    assert handler.blocked == [False, True]
    assert handler.unaligned_in_flight == []
    assert handler.on_barrier(0, 2) == [TriggerSnapshot(2, 0.0)]


def test_alignment_timeout_while_an_older_unaligned_checkpoint_is_in_flight() -> None:
    handler = aligned(2)
    handler.on_barrier(0, 1, overtakes=True)
    handler.on_barrier(0, 2)
    assert handler.state is HandlerState.ALIGNING
    assert handler.on_alignment_timeout(2) == [unaligned_trigger(2)]
    assert handler.state is HandlerState.UNALIGNED
    assert handler.unaligned_in_flight == [1, 2]
    assert handler.on_barrier(1, 1, overtakes=True) == [ChannelStateComplete(1)]
    assert handler.on_barrier(1, 2, overtakes=True) == [ChannelStateComplete(2)]
    assert handler.state is HandlerState.IDLE


# ---------------------------------------------------------------- aborts and cancel


def test_aborted_unaligned_checkpoint_stops_and_its_later_barriers_are_ignored() -> None:
    handler = aligned(2)
    handler.on_barrier(0, 3, overtakes=True)
    assert handler.on_abort(3) == [AbortAlignment(3, "checkpoint 3 aborted")]
    assert handler.state is HandlerState.IDLE
    assert handler.unaligned_in_flight == []
    assert handler.on_barrier(1, 3, overtakes=True) == []
    assert handler.on_barrier(1, 3) == []
    assert handler.blocked == [False, False]
    assert handler.on_barrier(1, 4, overtakes=True) == [unaligned_trigger(4)]


def test_abort_of_one_unaligned_checkpoint_keeps_the_newer_one() -> None:
    handler = aligned(2)
    handler.on_barrier(0, 3, overtakes=True)
    handler.on_barrier(0, 4, overtakes=True)
    assert handler.on_abort(3) == [AbortAlignment(3, "checkpoint 3 aborted")]
    assert handler.unaligned_in_flight == [4]
    assert handler.on_barrier(1, 3, overtakes=True) == []
    assert handler.on_barrier(1, 4, overtakes=True) == [ChannelStateComplete(4)]


def test_abort_of_a_newer_id_drops_every_older_unaligned_checkpoint() -> None:
    handler = aligned(2)
    handler.on_barrier(0, 3, overtakes=True)
    handler.on_barrier(0, 4, overtakes=True)
    assert handler.on_abort(5) == [
        AbortAlignment(3, "checkpoint 5 aborted"),
        AbortAlignment(4, "checkpoint 5 aborted"),
    ]
    assert handler.state is HandlerState.IDLE
    assert handler.on_barrier(1, 4, overtakes=True) == []


def test_abort_of_an_older_id_leaves_the_unaligned_checkpoint_running() -> None:
    handler = aligned(2)
    handler.on_barrier(0, 3, overtakes=True)
    assert handler.on_abort(2) == []
    assert handler.unaligned_in_flight == [3]
    assert handler.on_barrier(1, 3, overtakes=True) == [ChannelStateComplete(3)]


def test_cancel_drops_the_unaligned_checkpoints_and_ignores_later_events() -> None:
    handler = aligned(3)
    handler.on_barrier(0, 1, overtakes=True)
    handler.on_barrier(1, 2)
    handler.cancel()
    assert handler.state is HandlerState.CLOSED
    assert handler.unaligned_in_flight == []
    assert handler.pending_checkpoint is None
    assert handler.blocked == [False, False, False]
    assert handler.on_barrier(2, 1, overtakes=True) == []
    assert handler.on_barrier(2, 3, overtakes=True) == []
    assert handler.on_alignment_timeout(2) == []
    assert handler.on_end_of_input(2) == []
    assert handler.on_abort(3) == []
    assert handler.state is HandlerState.CLOSED


# ---------------------------------------------------------------- at-least-once


def test_at_least_once_refuses_an_overtaking_barrier() -> None:
    handler = counting(2)
    with pytest.raises(CheckpointError, match="overtaking barrier 1 on channel 0 in at-least-once"):
        handler.on_barrier(0, 1, overtakes=True)


def test_at_least_once_refuses_an_overtaking_copy_of_the_counted_checkpoint() -> None:
    handler = counting(2)
    handler.on_barrier(0, 1)
    with pytest.raises(CheckpointError, match="at-least-once"):
        handler.on_barrier(1, 1, overtakes=True)


def test_repr_names_the_unaligned_checkpoints() -> None:
    handler = aligned(2)
    handler.on_barrier(0, 7, overtakes=True)
    assert "UNALIGNED" in repr(handler) and "unaligned=[7]" in repr(handler)


# ---------------------------------------------------------------- property: random gates


@dataclass
class Item:
    """One in-band item of a simulated channel: a barrier (``checkpoint_id``) or its end."""

    checkpoint_id: int | None
    overtakes: bool = False
    taken: bool = False


@dataclass
class Outcome:
    """Every action the handler returned, and per unaligned trigger its closing actions."""

    actions: list[Action] = field(default_factory=list)
    closings: dict[int, list[Action]] = field(default_factory=dict)


def _channel(data: st.DataObject, k: int) -> list[Item]:
    ids = sorted(data.draw(st.sets(st.integers(1, k), max_size=k)))
    return [Item(n, overtakes=data.draw(st.booleans())) for n in ids] + [Item(None)]


def _moves(handler: BarrierHandler, channels: list[list[Item]]) -> list[tuple[int, Item]]:
    """What a gate may hand the task next. Per channel: its first overtaking barrier not
    yet taken (priority: even from a blocked channel, and ahead of the items queued
    before it), and, if the channel is not blocked, its first item not yet taken when
    that one waits in line (nothing put after an overtaking barrier is taken before it)."""
    moves = []
    for ch, items in enumerate(channels):
        waiting = [item for item in items if not item.taken]
        priority = next((item for item in waiting if item.overtakes), None)
        if priority is not None:
            moves.append((ch, priority))
        if waiting and not waiting[0].overtakes and not handler.blocked[ch]:
            moves.append((ch, waiting[0]))
    return moves


def _simulate(data: st.DataObject) -> Outcome:
    """A random gate of 1-4 channels, each carrying some of checkpoints 1..k (overtaking
    or in line) then its end, read in a random order a gate allows, with alignment
    timeouts and coordinator aborts in between."""
    num_channels = data.draw(st.integers(1, 4))
    k = data.draw(st.integers(1, 6))
    channels = [_channel(data, k) for _ in range(num_channels)]
    clock = ManualClock()
    handler = aligned(num_channels, clock)
    outcome = Outcome()

    def apply(actions: list[Action]) -> None:
        for action in actions:
            assert not any(isinstance(a, EndOfAllInputs) for a in outcome.actions), action
            outcome.actions.append(action)
            if isinstance(action, TriggerSnapshot) and action.unaligned:
                assert action.checkpoint_id not in outcome.closings, f"{action} twice"
                outcome.closings[action.checkpoint_id] = []
            elif isinstance(action, ChannelStateComplete | AbortAlignment):
                closing = outcome.closings.get(action.checkpoint_id)
                if closing is not None:
                    closing.append(action)
                else:
                    assert isinstance(action, AbortAlignment), f"{action} was never triggered"

    while not all(handler.is_closed(ch) for ch in range(num_channels)):
        pending = handler.pending_checkpoint
        kind = data.draw(st.sampled_from(["take", "take", "take", "timeout", "abort"]))
        if kind == "take" or (kind == "timeout" and pending is None):
            moves = _moves(handler, channels)
            assert moves, f"the gate is stuck: {handler!r}"
            ch, item = data.draw(st.sampled_from(moves))
            item.taken = True
            clock.advance(0.1)
            if item.checkpoint_id is None:
                apply(handler.on_end_of_input(ch))
            else:
                apply(handler.on_barrier(ch, item.checkpoint_id, overtakes=item.overtakes))
        elif kind == "timeout":
            # The gate promotes every copy of the pending checkpoint still queued in line.
            for items in channels:
                for item in items:
                    if item.checkpoint_id == pending and not item.taken:
                        item.overtakes = True
            apply(handler.on_alignment_timeout(pending))  # type: ignore[arg-type]
        else:
            apply(handler.on_abort(data.draw(st.integers(1, k))))
    assert handler.state is HandlerState.CLOSED
    assert handler.unaligned_in_flight == []
    return outcome


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_random_barrier_sequences_close_every_unaligned_checkpoint_exactly_once(
    data: st.DataObject,
) -> None:
    outcome = _simulate(data)
    for checkpoint_id, closing in outcome.closings.items():
        assert len(closing) == 1, f"checkpoint {checkpoint_id}: {closing}"
    assert isinstance(outcome.actions[-1], EndOfAllInputs)
    triggered = [a.checkpoint_id for a in outcome.actions if isinstance(a, TriggerSnapshot)]
    assert len(triggered) == len(set(triggered)), "no checkpoint triggers twice"
    assert triggered == sorted(triggered), "triggers come in id order"
