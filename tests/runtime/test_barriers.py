"""State-machine tests of the barrier handler (alignment, counting, aborts, end-of-input)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from epochstream.core.clock import ManualClock
from epochstream.exceptions import CheckpointError, ConfigurationError
from epochstream.runtime.barriers import (
    AbortAlignment,
    Action,
    BarrierHandler,
    EndOfAllInputs,
    HandlerState,
    TriggerSnapshot,
)


def aligned(num_channels: int, clock: ManualClock | None = None) -> BarrierHandler:
    return BarrierHandler(
        num_channels=num_channels, exactly_once=True, clock=clock or ManualClock()
    )


def counting(num_channels: int, clock: ManualClock | None = None) -> BarrierHandler:
    return BarrierHandler(
        num_channels=num_channels, exactly_once=False, clock=clock or ManualClock()
    )


def blocked_set(handler: BarrierHandler) -> set[int]:
    return {index for index, flag in enumerate(handler.blocked) if flag}


# ---------------------------------------------------------------- construction


@pytest.mark.parametrize("bad", [0, -1, True, 2.0])
def test_invalid_channel_count_is_a_configuration_error(bad: object) -> None:
    with pytest.raises(ConfigurationError, match="num_channels"):
        BarrierHandler(num_channels=bad, exactly_once=True, clock=ManualClock())  # type: ignore[arg-type]


def test_fresh_handler_is_idle_with_everything_open() -> None:
    handler = aligned(3)
    assert handler.state is HandlerState.IDLE
    assert handler.pending_checkpoint is None
    assert handler.blocked == [False, False, False]
    assert handler.open_channels == 3


# ---------------------------------------------------------------- exactly-once alignment


def test_single_channel_triggers_at_once_without_blocking() -> None:
    handler = aligned(1)
    assert handler.on_barrier(0, 1) == [TriggerSnapshot(1, 0.0)]
    assert handler.blocked == [False]
    assert handler.state is HandlerState.IDLE
    assert handler.on_barrier(0, 2) == [TriggerSnapshot(2, 0.0)]


def test_two_channels_block_then_trigger() -> None:
    handler = aligned(2)
    assert handler.on_barrier(1, 5) == []
    assert handler.state is HandlerState.ALIGNING
    assert handler.pending_checkpoint == 5
    assert handler.blocked == [False, True]
    assert handler.on_barrier(0, 5) == [TriggerSnapshot(5, 0.0)]
    assert handler.blocked == [False, False]
    assert handler.state is HandlerState.IDLE
    assert handler.pending_checkpoint is None


def test_three_channels_trigger_only_when_the_last_one_arrives() -> None:
    handler = aligned(3)
    gate_view = handler.blocked  # the input gate keeps this reference
    assert handler.on_barrier(2, 1) == []
    assert handler.on_barrier(0, 1) == []
    assert blocked_set(handler) == {0, 2}
    assert gate_view[0] and gate_view[2] and not gate_view[1]
    assert handler.on_barrier(1, 1) == [TriggerSnapshot(1, 0.0)]
    assert gate_view == [False, False, False]
    assert handler.blocked is gate_view


def test_alignment_time_runs_from_first_barrier_to_trigger() -> None:
    clock = ManualClock(start=50.0)
    handler = aligned(3, clock)
    clock.advance(10.0)  # time before the first barrier does not count
    handler.on_barrier(0, 1)
    clock.advance(0.25)
    handler.on_barrier(1, 1)
    clock.advance(0.5)
    [trigger] = handler.on_barrier(2, 1)
    assert isinstance(trigger, TriggerSnapshot)
    assert trigger.checkpoint_id == 1
    assert trigger.alignment_s == pytest.approx(0.75)


def test_consecutive_checkpoints_align_independently() -> None:
    clock = ManualClock()
    handler = aligned(2, clock)
    handler.on_barrier(0, 1)
    clock.advance(2.0)
    assert handler.on_barrier(1, 1) == [TriggerSnapshot(1, 2.0)]
    handler.on_barrier(1, 2)
    assert blocked_set(handler) == {1}
    clock.advance(1.0)
    assert handler.on_barrier(0, 2) == [TriggerSnapshot(2, 1.0)]


def test_newer_barrier_subsumes_the_pending_alignment() -> None:
    handler = aligned(3)
    handler.on_barrier(0, 1)
    assert handler.on_barrier(1, 2) == [AbortAlignment(1, "subsumed by checkpoint 2")]
    assert handler.pending_checkpoint == 2
    assert blocked_set(handler) == {1}
    assert handler.state is HandlerState.ALIGNING
    # channel 2's barrier 1 is stale now; channel 0 was unblocked and delivers 2 next.
    assert handler.on_barrier(2, 1) == []
    assert handler.on_barrier(0, 2) == []
    assert blocked_set(handler) == {0, 1}
    assert handler.on_barrier(2, 2) == [TriggerSnapshot(2, 0.0)]


def test_older_barrier_while_aligning_is_ignored() -> None:
    handler = aligned(3)
    handler.on_barrier(0, 1)
    handler.on_barrier(1, 2)  # subsumes 1
    handler.on_barrier(0, 2)
    assert handler.on_barrier(2, 1) == []
    assert handler.pending_checkpoint == 2
    assert blocked_set(handler) == {0, 1}


def test_barriers_up_to_the_last_triggered_id_are_stale() -> None:
    handler = aligned(2)
    handler.on_barrier(0, 3)
    handler.on_barrier(1, 3)
    assert handler.on_barrier(0, 3) == []
    assert handler.on_barrier(1, 2) == []
    assert handler.state is HandlerState.IDLE
    assert handler.blocked == [False, False]


def test_barrier_on_a_blocked_channel_is_a_protocol_error() -> None:
    handler = aligned(2)
    handler.on_barrier(0, 4)
    with pytest.raises(CheckpointError, match=r"barrier 5 on channel 0.*checkpoint 4"):
        handler.on_barrier(0, 5)
    with pytest.raises(CheckpointError, match=r"barrier 4 on channel 0.*checkpoint 4"):
        handler.on_barrier(0, 4)


def test_out_of_range_channel_and_negative_id_are_protocol_errors() -> None:
    handler = aligned(2)
    with pytest.raises(CheckpointError, match=r"channel 2.*0\.\.1"):
        handler.on_barrier(2, 1)
    with pytest.raises(CheckpointError, match=r"channel -1"):
        handler.on_end_of_input(-1)
    with pytest.raises(CheckpointError, match="negative checkpoint id -3 on channel 1"):
        handler.on_barrier(1, -3)


# ---------------------------------------------------------------- end of input


def test_end_of_input_completes_a_pending_alignment() -> None:
    clock = ManualClock()
    handler = aligned(3, clock)
    handler.on_barrier(0, 7)
    handler.on_barrier(1, 7)
    clock.advance(3.0)
    assert handler.on_end_of_input(2) == [TriggerSnapshot(7, 3.0)]
    assert handler.blocked == [False, False, False]
    assert handler.open_channels == 2
    assert handler.is_closed(2)
    # the ended channel is not awaited for the next checkpoint either
    handler.on_barrier(1, 8)
    assert handler.on_barrier(0, 8) == [TriggerSnapshot(8, 0.0)]


def test_end_of_input_that_does_not_complete_alignment() -> None:
    handler = aligned(3)
    handler.on_barrier(0, 1)
    assert handler.on_end_of_input(2) == []
    assert handler.state is HandlerState.ALIGNING
    assert handler.on_barrier(1, 1) == [TriggerSnapshot(1, 0.0)]


def test_end_of_every_channel_emits_end_of_all_inputs_once() -> None:
    handler = aligned(2)
    assert handler.on_end_of_input(1) == []
    assert handler.open_channels == 1
    # one open channel left: barriers trigger at once
    assert handler.on_barrier(0, 1) == [TriggerSnapshot(1, 0.0)]
    assert handler.on_end_of_input(0) == [EndOfAllInputs()]
    assert handler.state is HandlerState.CLOSED
    assert handler.open_channels == 0
    with pytest.raises(CheckpointError, match="channel 0 after its end-of-input"):
        handler.on_barrier(0, 2)


def test_barrier_after_end_of_input_is_a_protocol_error() -> None:
    handler = aligned(3)
    handler.on_end_of_input(1)
    with pytest.raises(CheckpointError, match="barrier 1 on channel 1 after its end-of-input"):
        handler.on_barrier(1, 1)


def test_double_end_of_input_and_end_on_blocked_channel_are_protocol_errors() -> None:
    handler = aligned(3)
    handler.on_end_of_input(2)
    with pytest.raises(CheckpointError, match="second end-of-input on channel 2"):
        handler.on_end_of_input(2)
    handler.on_barrier(0, 1)
    with pytest.raises(CheckpointError, match=r"channel 0, which is blocked.*checkpoint 1"):
        handler.on_end_of_input(0)


# ---------------------------------------------------------------- coordinator aborts


def test_abort_of_the_pending_checkpoint_unblocks_and_makes_it_stale() -> None:
    handler = aligned(3)
    handler.on_barrier(0, 2)
    handler.on_barrier(1, 2)
    [action] = handler.on_abort(2)
    assert isinstance(action, AbortAlignment)
    assert action.checkpoint_id == 2
    assert "aborted" in action.reason
    assert handler.state is HandlerState.IDLE
    assert handler.blocked == [False, False, False]
    assert handler.on_barrier(2, 2) == []
    assert handler.state is HandlerState.IDLE
    handler.on_barrier(0, 3)
    handler.on_barrier(1, 3)
    assert handler.on_barrier(2, 3) == [TriggerSnapshot(3, 0.0)]


def test_abort_of_an_older_id_changes_nothing() -> None:
    handler = aligned(2)
    handler.on_barrier(0, 5)
    assert handler.on_abort(4) == []
    assert handler.pending_checkpoint == 5
    assert blocked_set(handler) == {0}
    assert handler.on_barrier(1, 5) == [TriggerSnapshot(5, 0.0)]


def test_abort_of_a_future_id_while_idle_makes_its_barriers_stale() -> None:
    handler = aligned(2)
    assert handler.on_abort(3) == []
    assert handler.on_barrier(0, 2) == []
    assert handler.on_barrier(0, 3) == []
    assert handler.blocked == [False, False]
    assert handler.on_barrier(0, 4) == []
    assert handler.pending_checkpoint == 4


def test_abort_of_a_newer_id_drops_the_older_pending_alignment() -> None:
    handler = aligned(2)
    handler.on_barrier(0, 1)
    [action] = handler.on_abort(2)
    assert action == AbortAlignment(1, "subsumed by aborted checkpoint 2")
    assert handler.blocked == [False, False]
    assert handler.on_barrier(1, 1) == []
    assert handler.on_barrier(1, 2) == []
    assert handler.state is HandlerState.IDLE


# ---------------------------------------------------------------- cancel


def test_cancel_unblocks_closes_and_ignores_later_events() -> None:
    handler = aligned(2)
    handler.on_barrier(0, 1)
    handler.cancel()
    assert handler.state is HandlerState.CLOSED
    assert handler.blocked == [False, False]
    assert handler.pending_checkpoint is None
    assert handler.on_barrier(1, 1) == []
    assert handler.on_barrier(0, 2) == []
    assert handler.on_end_of_input(0) == []
    assert handler.on_abort(2) == []
    assert handler.state is HandlerState.CLOSED


# ---------------------------------------------------------------- at-least-once


def test_at_least_once_counts_without_blocking() -> None:
    clock = ManualClock()
    handler = counting(3, clock)
    assert handler.on_barrier(0, 1) == []
    assert handler.state is HandlerState.COUNTING
    assert handler.blocked == [False, False, False]
    assert handler.on_barrier(0, 1) == []  # duplicate is ignored, not counted twice
    assert handler.on_barrier(1, 1) == []
    clock.advance(1.5)
    assert handler.on_barrier(2, 1) == [TriggerSnapshot(1, 1.5)]
    assert handler.state is HandlerState.IDLE
    assert handler.blocked == [False, False, False]


def test_at_least_once_newer_barrier_subsumes_the_count() -> None:
    handler = counting(2)
    handler.on_barrier(0, 1)
    # channel 0 is not blocked, so it can deliver barrier 2 before channel 1 delivers 1
    assert handler.on_barrier(0, 2) == [AbortAlignment(1, "subsumed by checkpoint 2")]
    assert handler.pending_checkpoint == 2
    assert handler.on_barrier(1, 1) == []
    assert handler.on_barrier(1, 2) == [TriggerSnapshot(2, 0.0)]


def test_at_least_once_end_of_input_of_a_counted_channel() -> None:
    handler = counting(3)
    handler.on_barrier(0, 1)
    handler.on_barrier(1, 1)
    # channel 0 ends: it is no longer awaited, so its barrier no longer counts either
    assert handler.on_end_of_input(0) == []
    assert handler.open_channels == 2
    assert handler.on_barrier(2, 1) == [TriggerSnapshot(1, 0.0)]


def test_at_least_once_last_end_of_input_triggers_before_end_of_all_inputs() -> None:
    handler = counting(2)
    handler.on_barrier(0, 1)
    assert handler.on_end_of_input(0) == []
    assert handler.on_end_of_input(1) == [TriggerSnapshot(1, 0.0), EndOfAllInputs()]
    assert handler.state is HandlerState.CLOSED


def test_at_least_once_abort() -> None:
    handler = counting(2)
    handler.on_barrier(1, 3)
    assert handler.on_abort(3) == [AbortAlignment(3, "checkpoint 3 aborted by the coordinator")]
    assert handler.state is HandlerState.IDLE
    assert handler.on_barrier(0, 3) == []
    assert handler.pending_checkpoint is None


# ---------------------------------------------------------------- property-style interleavings


@dataclass
class Run:
    """Outcome of one simulated interleaving."""

    triggers: list[int] = field(default_factory=list)
    trigger_step: dict[int, int] = field(default_factory=dict)
    aborted: set[int] = field(default_factory=set)
    ends: int = 0
    # (channel, position in channel, step at which the reader took it) for every record
    reads: list[tuple[int, int, int]] = field(default_factory=list)


def build_channels(rng: random.Random, num_channels: int, k: int) -> list[list[tuple]]:
    channels: list[list[tuple]] = []
    for _ in range(num_channels):
        last = k if rng.random() < 0.6 else rng.randint(0, k)  # some end early
        items: list[tuple] = []
        for checkpoint_id in range(1, last + 1):
            items.extend(("record",) for _ in range(rng.randint(0, 3)))
            items.append(("barrier", checkpoint_id))
        items.extend(("record",) for _ in range(rng.randint(0, 3)))
        items.append(("end",))
        channels.append(items)
    return channels


def barrier_position(channel: list[tuple], checkpoint_id: int) -> int | None:
    for position, item in enumerate(channel):
        if item == ("barrier", checkpoint_id):
            return position
    return None


def simulate(seed: int, *, exactly_once: bool, abort_rate: float) -> tuple[Run, list[list[tuple]]]:
    rng = random.Random(seed)
    num_channels = rng.randint(1, 4)
    k = rng.randint(1, 6)
    channels = build_channels(rng, num_channels, k)
    clock = ManualClock()
    handler = BarrierHandler(num_channels=num_channels, exactly_once=exactly_once, clock=clock)
    gate_blocked = handler.blocked
    positions = [0] * num_channels
    last_barrier = [0] * num_channels
    run = Run()
    step = 0

    def apply(actions: list[Action]) -> None:
        for action in actions:
            assert run.ends == 0, f"seed {seed}: action {action} after EndOfAllInputs"
            if isinstance(action, TriggerSnapshot):
                n = action.checkpoint_id
                assert n not in run.trigger_step, f"seed {seed}: {n} triggered twice"
                assert not run.triggers or n > run.triggers[-1], f"seed {seed}: order {n}"
                assert action.alignment_s >= 0.0
                run.triggers.append(n)
                run.trigger_step[n] = step
                check_snapshot_cut(n)
            elif isinstance(action, AbortAlignment):
                assert n_not_triggered(action.checkpoint_id)
                run.aborted.add(action.checkpoint_id)
            else:
                run.ends += 1

    def n_not_triggered(n: int) -> bool:
        return n not in run.trigger_step

    def check_snapshot_cut(n: int) -> None:
        for c, channel in enumerate(channels):
            at = barrier_position(channel, n)
            if exactly_once:
                # exactly the records before barrier n, and the barrier itself, were read
                expected = len(channel) if at is None else at + 1
                assert positions[c] == expected, (
                    f"seed {seed}: checkpoint {n} cut on channel {c} at {positions[c]}, "
                    f"expected {expected}"
                )
            else:
                assert handler.is_closed(c) or last_barrier[c] == n, (
                    f"seed {seed}: checkpoint {n} triggered before channel {c} delivered it"
                )

    while any(positions[c] < len(channels[c]) for c in range(num_channels)):
        readable = [
            c
            for c in range(num_channels)
            if not gate_blocked[c] and positions[c] < len(channels[c])
        ]
        assert readable, f"seed {seed}: deadlock with blocked={gate_blocked}"
        if not exactly_once:
            assert not any(gate_blocked)
        step += 1
        clock.advance(rng.random())
        if abort_rate and rng.random() < abort_rate:
            apply(handler.on_abort(rng.randint(1, k)))
            continue
        c = rng.choice(readable)
        item = channels[c][positions[c]]
        positions[c] += 1
        if item[0] == "record":
            run.reads.append((c, positions[c] - 1, step))
        elif item[0] == "barrier":
            last_barrier[c] = item[1]
            apply(handler.on_barrier(c, item[1]))
        else:
            apply(handler.on_end_of_input(c))
    assert run.ends == 1, f"seed {seed}: EndOfAllInputs emitted {run.ends} times"
    assert handler.state is HandlerState.CLOSED
    return run, channels


def assert_no_record_after_barrier_read_before_trigger(
    run: Run, channels: list[list[tuple]]
) -> None:
    for c, position, step in run.reads:
        for n, trigger_step in run.trigger_step.items():
            at = barrier_position(channels[c], n)
            if at is not None and position > at:
                assert step > trigger_step, (
                    f"record {position} on channel {c} read at step {step}, "
                    f"before checkpoint {n} triggered at step {trigger_step}"
                )


@pytest.mark.parametrize("seed", range(300))
def test_random_interleavings_exactly_once(seed: int) -> None:
    run, channels = simulate(seed, exactly_once=True, abort_rate=0.0)
    carried = {item[1] for channel in channels for item in channel if item[0] == "barrier"}
    # FIFO channels with in-order barriers never subsume: every carried checkpoint triggers
    assert run.triggers == sorted(carried)
    assert not run.aborted
    assert_no_record_after_barrier_read_before_trigger(run, channels)


@pytest.mark.parametrize("seed", range(300))
def test_random_interleavings_exactly_once_with_aborts(seed: int) -> None:
    run, channels = simulate(seed, exactly_once=True, abort_rate=0.08)
    assert not set(run.triggers) & run.aborted
    assert_no_record_after_barrier_read_before_trigger(run, channels)


@pytest.mark.parametrize("seed", range(300))
def test_random_interleavings_at_least_once(seed: int) -> None:
    run, channels = simulate(seed, exactly_once=False, abort_rate=0.0)
    carried = {item[1] for channel in channels for item in channel if item[0] == "barrier"}
    if carried:
        # the newest checkpoint is never subsumed, so it always completes
        assert run.triggers[-1] == max(carried)
    assert set(run.triggers) | run.aborted <= carried
    assert not set(run.triggers) & run.aborted
