"""Checkpoint barrier handling for one task input gate, as an explicit state machine.

The handler is pure logic in the style of Flink's ``CheckpointBarrierHandler``: the task
feeds it the in-band events of its input channels (barriers, end-of-input) and the
coordinator's aborts, and executes the actions it returns. It owns :attr:`BarrierHandler.blocked`,
which the input gate reads before taking the next item from a channel.

Exactly-once mode aligns: a channel that delivered barrier ``n`` is blocked until barrier
``n`` arrived on every open channel, so the snapshot sees exactly the records before ``n``.
At-least-once mode only counts barriers and never blocks.

Unaligned checkpoints: a barrier that *overtakes* (delivered ahead of the records queued
before it) triggers the snapshot at once; the records still queued before it, and those
arriving on the other channels until their barrier does, become the checkpoint's channel
state (recorded by the input gate, :class:`~epochstream.runtime.overtaking_gate.OvertakingInputGate`).
The handler tracks which channels have delivered it and says when the recording is
complete (:class:`ChannelStateComplete`). An aligned barrier with a deadline (the aligned
timeout) aligns as usual and switches to unaligned when :meth:`BarrierHandler.on_alignment_timeout`
says its deadline passed. Several unaligned checkpoints may be in flight; one that a
later barrier overtook on some channel can never complete there and is aborted.

Example::

    handler = BarrierHandler(num_channels=2, exactly_once=True, clock=SystemClock())
    handler.on_barrier(0, 1)            # [] - channel 0 is now blocked
    assert handler.blocked[0]
    handler.on_barrier(1, 1)            # [TriggerSnapshot(checkpoint_id=1, alignment_s=...)]
    assert not any(handler.blocked)
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from epochstream.core.clock import Clock
from epochstream.exceptions import CheckpointError, ConfigurationError

__all__ = [
    "AbortAlignment",
    "Action",
    "BarrierHandler",
    "ChannelStateComplete",
    "EndOfAllInputs",
    "HandlerState",
    "TriggerSnapshot",
]


class HandlerState(enum.Enum):
    """Where a :class:`BarrierHandler` is.

    Example::

        assert BarrierHandler(num_channels=1, exactly_once=True,
                              clock=SystemClock()).state is HandlerState.IDLE
    """

    #: No checkpoint pending.
    IDLE = "idle"
    #: Exactly-once: a checkpoint is pending and the channels that delivered it are blocked.
    ALIGNING = "aligning"
    #: Exactly-once, unaligned: snapshots were taken; the channels that have not delivered
    #: their barrier yet are recorded as channel state (nothing is blocked). Next: IDLE
    #: once every open channel delivered it (ChannelStateComplete), or ALIGNING.
    UNALIGNED = "unaligned"
    #: At-least-once: a checkpoint is pending; barriers are counted, nothing is blocked.
    COUNTING = "counting"
    #: Every input ended, or the task was cancelled; nothing more will be triggered.
    CLOSED = "closed"


@dataclass(frozen=True)
class TriggerSnapshot:
    """Take the synchronous snapshot of ``checkpoint_id`` now and forward the barrier.

    ``alignment_s`` is the time from the first barrier of the checkpoint to this trigger.
    ``unaligned``: the snapshot does not wait for the other channels; their in-flight
    records are recorded as channel state until :class:`ChannelStateComplete`.

    Example::

        TriggerSnapshot(checkpoint_id=3, alignment_s=0.25)
    """

    checkpoint_id: int
    alignment_s: float
    unaligned: bool = False


@dataclass(frozen=True)
class ChannelStateComplete:
    """Every open channel delivered the barrier of unaligned ``checkpoint_id``: its
    recorded channel state is complete.

    Example::

        ChannelStateComplete(checkpoint_id=3)
    """

    checkpoint_id: int


@dataclass(frozen=True)
class AbortAlignment:
    """Drop the pending alignment of ``checkpoint_id`` locally (subsumed or aborted).

    Example::

        AbortAlignment(checkpoint_id=3, reason="subsumed by checkpoint 4")
    """

    checkpoint_id: int
    reason: str


@dataclass(frozen=True)
class EndOfAllInputs:
    """Every input channel has ended; the task can finish its operators.

    Example::

        assert EndOfAllInputs() == EndOfAllInputs()
    """


Action = TriggerSnapshot | AbortAlignment | ChannelStateComplete | EndOfAllInputs


class BarrierHandler:
    """Aligns (exactly-once) or counts (at-least-once) checkpoint barriers of one input gate.

    One aligned checkpoint is pending at a time; a newer barrier subsumes it. Unaligned
    checkpoints may overlap (each waits for its barrier on every open channel). Checkpoint
    ids are non-negative and each channel carries them in increasing order (channels are
    FIFO). ``blocked`` is a list of ``num_channels`` booleans whose identity never changes,
    so the input gate may keep a reference to it; in at-least-once mode it stays all
    ``False``.

    Example::

        clock = ManualClock()
        handler = BarrierHandler(num_channels=3, exactly_once=True, clock=clock)
        handler.on_barrier(0, 7)
        handler.on_end_of_input(1)
        clock.advance(0.5)
        assert handler.on_barrier(2, 7) == [TriggerSnapshot(7, 0.5)]
    """

    def __init__(self, *, num_channels: int, exactly_once: bool, clock: Clock) -> None:
        if isinstance(num_channels, bool) or not isinstance(num_channels, int):
            raise ConfigurationError(
                f"BarrierHandler: num_channels must be an int, got {num_channels!r}"
            )
        if num_channels < 1:
            raise ConfigurationError(
                f"BarrierHandler: num_channels must be >= 1, got {num_channels}"
            )
        self._num_channels = num_channels
        self._exactly_once = exactly_once
        self._clock = clock
        #: Channels the input gate must not read now (indexed by channel).
        self.blocked: list[bool] = [False] * num_channels
        # Which open channels delivered the pending barrier. In exactly-once mode this is the
        # very same list as ``blocked``: a channel is blocked exactly when its barrier arrived.
        self._arrived: list[bool] = self.blocked if exactly_once else [False] * num_channels
        self._num_arrived = 0
        self._closed: list[bool] = [False] * num_channels
        self._open = num_channels
        self._pending: int | None = None
        self._pending_since = 0.0
        # Unaligned checkpoints whose snapshot was taken: which channels delivered them.
        self._unaligned: dict[int, list[bool]] = {}
        # Highest checkpoint id triggered, aborted or subsumed; barriers <= it are stale.
        self._settled = -1
        self._state = HandlerState.IDLE
        self._cancelled = False

    # ------------------------------------------------------------------ inspection

    @property
    def state(self) -> HandlerState:
        """The current :class:`HandlerState`."""
        return self._state

    @property
    def pending_checkpoint(self) -> int | None:
        """Id of the checkpoint being aligned or counted, or ``None``."""
        return self._pending

    @property
    def unaligned_in_flight(self) -> list[int]:
        """Ids of the unaligned checkpoints still recording channel state, oldest first."""
        return sorted(self._unaligned)

    @property
    def open_channels(self) -> int:
        """How many channels have not delivered end-of-input yet."""
        return self._open

    @property
    def num_channels(self) -> int:
        """How many input channels the gate has."""
        return self._num_channels

    @property
    def exactly_once(self) -> bool:
        """True when barriers are aligned (channels blocked), False when only counted."""
        return self._exactly_once

    def is_closed(self, channel: int) -> bool:
        """True when ``channel`` delivered end-of-input."""
        self._check_channel(channel, "is_closed")
        return self._closed[channel]

    # ------------------------------------------------------------------ events

    def on_barrier(
        self,
        channel: int,
        checkpoint_id: int,
        *,
        overtakes: bool = False,
    ) -> list[Action]:
        """Barrier ``checkpoint_id`` was read from ``channel``; returns the actions to run.

        ``overtakes``: the barrier came ahead of the records queued before it (unaligned).
        Raises :class:`CheckpointError` for protocol
        violations: a barrier on a blocked or ended channel, a negative id, or a channel
        index out of range.

        Example::

            actions = handler.on_barrier(channel=1, checkpoint_id=4)
            actions = handler.on_barrier(channel=0, checkpoint_id=5, overtakes=True)
        """
        if self._cancelled:
            return []  # late events from a draining gate are meaningless
        self._check_channel(channel, "barrier")
        if checkpoint_id < 0:
            raise CheckpointError(
                f"barrier with negative checkpoint id {checkpoint_id} on channel {channel}"
            )
        if self._closed[channel]:
            raise CheckpointError(
                f"barrier {checkpoint_id} on channel {channel} after its end-of-input"
            )
        actions: list[Action] = []
        if self._unaligned:
            self._unaligned_arrival(channel, checkpoint_id, actions)
            if checkpoint_id in self._unaligned or checkpoint_id <= self._settled:
                self._update_state()
                return actions
        pending = self._pending
        if self._arrived[channel] and not overtakes:
            if self._exactly_once:
                raise CheckpointError(
                    f"barrier {checkpoint_id} on channel {channel}, which is blocked "
                    f"aligning checkpoint {pending}"
                )
            if checkpoint_id == pending:
                return actions  # at-least-once duplicate
        if checkpoint_id <= self._settled:
            return actions
        if pending is not None and checkpoint_id < pending:
            return actions
        if pending is not None and checkpoint_id == pending:
            if overtakes and not self._exactly_once:
                raise CheckpointError(
                    f"overtaking barrier {checkpoint_id} on channel {channel} in at-least-once mode"
                )
            if overtakes:  # the sender found its alignment timed out: switch now
                self._arrived[channel] = True
                self._switch_to_unaligned(actions)
                return actions
            self._arrived[channel] = True
            self._num_arrived += 1
            return self._complete_if_aligned(actions)
        now = self._clock.now()
        if pending is not None:
            actions.append(AbortAlignment(pending, f"subsumed by checkpoint {checkpoint_id}"))
            self._reset(pending)
        if overtakes:
            self._start_unaligned(channel, checkpoint_id, 0.0, actions)
            return actions
        self._start(channel, checkpoint_id, now)
        return self._complete_if_aligned(actions)

    def on_alignment_timeout(self, checkpoint_id: int) -> list[Action]:
        """The aligned timeout of ``checkpoint_id`` passed (the input gate keeps the
        deadlines of the barriers it queued): a pending alignment of it switches to
        unaligned (snapshot now, the blocked channels are released).

        Example::

            handler.on_alignment_timeout(4)  # [TriggerSnapshot(4, 0.5, unaligned=True)]
        """
        actions: list[Action] = []
        if not self._cancelled and self._pending == checkpoint_id and self._exactly_once:
            self._switch_to_unaligned(actions)
        return actions

    def on_end_of_input(self, channel: int) -> list[Action]:
        """``channel`` ended; it is never read or blocked again.

        May complete a pending alignment (the ended channel no longer has to deliver the
        barrier) and returns :class:`EndOfAllInputs` once every channel has ended.

        Example::

            handler.on_end_of_input(0)
        """
        if self._cancelled:
            return []
        self._check_channel(channel, "end-of-input")
        if self._closed[channel]:
            raise CheckpointError(f"second end-of-input on channel {channel}")
        if self._arrived[channel]:
            if self._exactly_once:
                raise CheckpointError(
                    f"end-of-input on channel {channel}, which is blocked aligning "
                    f"checkpoint {self._pending}"
                )
            # At-least-once: its barrier no longer counts, since only open channels are awaited.
            self._arrived[channel] = False
            self._num_arrived -= 1
        self._closed[channel] = True
        self._open -= 1
        actions: list[Action] = []
        for checkpoint_id in sorted(self._unaligned):
            self._complete_if_recorded(checkpoint_id, actions)
        if self._pending is not None:
            actions = self._complete_if_aligned(actions)
        if self._open == 0:
            actions.append(EndOfAllInputs())
            self._unaligned.clear()
            self._state = HandlerState.CLOSED
        else:
            self._update_state()
        return actions

    def on_abort(self, checkpoint_id: int) -> list[Action]:
        """The coordinator aborted ``checkpoint_id`` (timeout or decline elsewhere).

        A pending alignment of that id, or of an older id, is dropped; later barriers with an
        id up to ``checkpoint_id`` are ignored as stale.

        Example::

            handler.on_abort(4)   # [AbortAlignment(4, ...)] if 4 was being aligned
        """
        pending = self._pending
        actions: list[Action] = []
        for old in sorted(c for c in self._unaligned if c <= checkpoint_id):
            del self._unaligned[old]
            actions.append(AbortAlignment(old, f"checkpoint {checkpoint_id} aborted"))
        if pending is not None and checkpoint_id >= pending:
            if checkpoint_id == pending:
                reason = f"checkpoint {pending} aborted by the coordinator"
            else:
                # Keeping it would wait forever: barriers up to the aborted id are now stale.
                reason = f"subsumed by aborted checkpoint {checkpoint_id}"
            actions.append(AbortAlignment(pending, reason))
            self._reset(pending)
        if checkpoint_id > self._settled:
            self._settled = checkpoint_id
        if self._state is not HandlerState.CLOSED:
            self._update_state()
        return actions

    def cancel(self) -> None:
        """The task was cancelled: drop any alignment, unblock everything, ignore later events.

        Example::

            handler.cancel()
            assert handler.state is HandlerState.CLOSED and not any(handler.blocked)
        """
        if self._pending is not None:
            self._reset(self._pending)
        self._unaligned.clear()
        self._cancelled = True
        self._state = HandlerState.CLOSED

    # ------------------------------------------------------------------ internals

    def _start(self, channel: int, checkpoint_id: int, now: float) -> None:
        self._pending = checkpoint_id
        self._pending_since = now
        self._arrived[channel] = True
        self._num_arrived = 1
        self._state = HandlerState.ALIGNING if self._exactly_once else HandlerState.COUNTING

    def _start_unaligned(
        self, channel: int, checkpoint_id: int, alignment_s: float, actions: list[Action]
    ) -> None:
        """Snapshot ``checkpoint_id`` now; record the channels that have not delivered it."""
        if not self._exactly_once:
            raise CheckpointError(
                f"overtaking barrier {checkpoint_id} on channel {channel} in at-least-once mode"
            )
        arrived = [False] * self._num_channels
        arrived[channel] = True
        self._unaligned[checkpoint_id] = arrived
        if checkpoint_id > self._settled:
            self._settled = checkpoint_id
        actions.append(TriggerSnapshot(checkpoint_id, alignment_s, unaligned=True))
        self._complete_if_recorded(checkpoint_id, actions)
        self._update_state()

    def _switch_to_unaligned(self, actions: list[Action]) -> None:
        """The pending alignment goes unaligned: the channels that delivered its barrier
        (those blocked, plus the one just marked) count as arrived."""
        pending = self._pending
        assert pending is not None
        alignment = max(0.0, self._clock.now() - self._pending_since)
        arrived = list(self._arrived)
        self._reset(pending)
        self._unaligned[pending] = arrived
        actions.append(TriggerSnapshot(pending, alignment, unaligned=True))
        self._complete_if_recorded(pending, actions)
        self._update_state()

    def _unaligned_arrival(self, channel: int, checkpoint_id: int, actions: list[Action]) -> None:
        """Barrier ``checkpoint_id`` on ``channel`` against the unaligned checkpoints in
        flight: it completes its own, and aborts older ones this channel skipped."""
        for old in sorted(self._unaligned):
            arrived = self._unaligned[old]
            if old == checkpoint_id:
                arrived[channel] = True  # a second copy (aligned, then overtaking) is harmless
                self._complete_if_recorded(old, actions)
            elif old < checkpoint_id and not arrived[channel]:
                # Channels are FIFO: barrier ``old`` can no longer come on this channel.
                del self._unaligned[old]
                actions.append(
                    AbortAlignment(old, f"barrier {checkpoint_id} overtook it on channel {channel}")
                )

    def _complete_if_recorded(self, checkpoint_id: int, actions: list[Action]) -> None:
        arrived = self._unaligned[checkpoint_id]
        closed = self._closed
        if all(arrived[i] or closed[i] for i in range(self._num_channels)):
            del self._unaligned[checkpoint_id]
            actions.append(ChannelStateComplete(checkpoint_id))

    def _complete_if_aligned(self, actions: list[Action]) -> list[Action]:
        pending = self._pending
        if pending is None or self._num_arrived < self._open:
            return actions
        alignment = max(0.0, self._clock.now() - self._pending_since)
        actions.append(TriggerSnapshot(pending, alignment))
        self._reset(pending)
        self._update_state()
        return actions

    def _reset(self, settled_id: int) -> None:
        arrived = self._arrived
        for index in range(self._num_channels):
            arrived[index] = False  # in place: the gate holds a reference to ``blocked``
        self._num_arrived = 0
        self._pending = None
        if settled_id > self._settled:
            self._settled = settled_id

    def _update_state(self) -> None:
        if self._pending is not None:
            self._state = HandlerState.ALIGNING if self._exactly_once else HandlerState.COUNTING
        elif self._unaligned:
            self._state = HandlerState.UNALIGNED
        else:
            self._state = HandlerState.IDLE

    def _check_channel(self, channel: int, event: str) -> None:
        if not 0 <= channel < self._num_channels:
            raise CheckpointError(
                f"{event} on channel {channel}, but the gate has channels "
                f"0..{self._num_channels - 1}"
            )

    def __repr__(self) -> str:
        return (
            f"BarrierHandler(state={self._state.name}, pending={self._pending}, "
            f"unaligned={sorted(self._unaligned)}, "
            f"blocked={[i for i, b in enumerate(self.blocked) if b]}, open={self._open})"
        )
