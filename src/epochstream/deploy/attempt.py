"""One deployment attempt's progress: how far its slots got, and which phase comes next.

The job master's event loop (:mod:`epochstream.deploy.jobmaster`) hands every message of
the current attempt's slots to an :class:`AttemptProgress`. Each method records one kind
of message and returns the :class:`Phase` the attempt moves to, ``None`` when it stays;
the job master switches phase and sends what the new phase needs (deployments, peer
addresses, ``FinishSlot``)::

    REGISTERING --every slot registered--> DEPLOYING --every slot ready--> CONNECTING
    CONNECTING --every slot running--> RUNNING --every task finished and the final
    checkpoint committed--> FINISHING --every slot closed (or the slots exited)--> DONE
    any phase --a failure--> FAILING

A stop-with-savepoint also moves RUNNING to FINISHING (once the savepoint completed),
and the job master itself sets FAILING and DONE when it tears the attempt down.

The progress holds no connections and sends nothing; the time comes in as ``now``
from the job master's clock, so it is driven by plain values.

Example::

    progress = AttemptProgress(attempt=1, parallelism=2, tasks={("c", 0), ("c", 1)},
                               sources={("c", 0), ("c", 1)}, started=clock.now(),
                               registration_timeout=180.0, heartbeat_timeout=20.0)
    progress.registered(0, now=clock.now())      # None: slot 1 is still missing
    progress.registered(1, now=clock.now())      # Phase.DEPLOYING
"""

from __future__ import annotations

import enum
from collections.abc import Set
from dataclasses import dataclass

from epochstream.deploy.failures import Failure
from epochstream.runtime.messages import RegisterSlot, TaskKey

__all__ = ["AttemptProgress", "Ended", "Phase"]


class Phase(enum.Enum):
    """Where the current attempt is; each phase names what it waits for."""

    REGISTERING = "waiting for every slot to register"
    DEPLOYING = "waiting for every slot to open its data plane"
    CONNECTING = "waiting for every slot to connect its channels"
    RUNNING = "running; checkpoints are triggered"
    FINISHING = "input ended and committed; waiting for slots to close"
    FAILING = "cancelling the attempt"
    DONE = "finished"


@dataclass(frozen=True)
class Ended:
    """An attempt is over: ``failure`` says why, ``None`` when the job finished (or
    stopped after its savepoint).

    Example::

        return Ended(Failure("slot 1 missed heartbeats for 20.3s"))
    """

    failure: Failure | None


class AttemptProgress:
    """Which slots of one attempt registered, opened their data plane, run and closed,
    which tasks ended their input, and when each slot was last heard from."""

    def __init__(
        self,
        *,
        attempt: int,
        parallelism: int,
        tasks: Set[TaskKey],
        sources: Set[TaskKey],
        started: float,
        registration_timeout: float,
        heartbeat_timeout: float,
    ) -> None:
        self.attempt = attempt
        self._parallelism = parallelism
        self._tasks = tasks
        self._sources = sources
        self._registration_timeout = registration_timeout
        self._deadline = started + registration_timeout
        self._heartbeat_timeout = heartbeat_timeout
        # Registered slots, in registration order, with the time each was last heard from.
        self._last_seen: dict[int, float] = {}
        self._addresses: dict[int, tuple[str, int]] = {}
        self._running: set[int] = set()
        #: Slots that reported ``SlotClosed``: their connection may end without a failure.
        self.closed: set[int] = set()
        self._exhausted: set[TaskKey] = set()
        self._finished: set[TaskKey] = set()

    # ------------------------------------------------------------------ registration

    def accepts(self, msg: RegisterSlot, phase: Phase) -> bool:
        """Whether ``msg`` registers a slot of this attempt that is not registered yet."""
        return (
            msg.attempt == self.attempt
            and phase is Phase.REGISTERING
            and msg.slot not in self._last_seen
        )

    def registered(self, slot: int, now: float) -> Phase | None:
        """Slot ``slot`` registered: DEPLOYING once every slot has."""
        self._last_seen[slot] = now
        return Phase.DEPLOYING if len(self._last_seen) == self._parallelism else None

    def heard_from(self, slot: int, now: float) -> None:
        """Any message of a registered slot counts as its heartbeat."""
        self._last_seen[slot] = now

    # ------------------------------------------------------------------ phases

    def ready(self, slot: int, address: tuple[str, int]) -> Phase | None:
        """Slot ``slot`` listens for data connections at ``address``: CONNECTING once
        every slot does."""
        self._addresses[slot] = address
        return Phase.CONNECTING if len(self._addresses) == self._parallelism else None

    @property
    def addresses(self) -> dict[int, tuple[str, int]]:
        """The data-plane address of every slot that is ready (a copy)."""
        return dict(self._addresses)

    def slot_running(self, slot: int) -> Phase | None:
        """Slot ``slot`` connected its channels: RUNNING once every slot did."""
        self._running.add(slot)
        return Phase.RUNNING if len(self._running) == self._parallelism else None

    def source_exhausted(self, task: TaskKey) -> bool:
        """Source ``task`` read all its splits; True once every source has."""
        self._exhausted.add(task)
        return self._exhausted == self._sources

    def task_finished(self, task: TaskKey) -> None:
        """Task ``task`` saw the end of its input."""
        self._finished.add(task)

    def finishing(self, phase: Phase, final_committed: bool) -> Phase | None:
        """FINISHING when the attempt runs, every task finished and the final checkpoint
        (if checkpointing is on) committed."""
        if phase is Phase.RUNNING and self._finished == self._tasks and final_committed:
            return Phase.FINISHING
        return None

    def slot_closed(self, slot: int, phase: Phase) -> Phase | None:
        """Slot ``slot`` closed: DONE once every slot has while FINISHING."""
        self.closed.add(slot)
        if phase is Phase.FINISHING and len(self.closed) == self._parallelism:
            return Phase.DONE
        return None

    def lost(self, attempt: int | None, slot: int | None) -> bool:
        """Whether a control connection that closed loses a slot of this attempt: one
        that registered with it and had not reported ``SlotClosed``."""
        return attempt == self.attempt and slot is not None and slot not in self.closed

    # ------------------------------------------------------------------ time

    def registration_overdue(self, now: float, phase: Phase) -> str | None:
        """Why the attempt fails when its slots did not all register in time, else None."""
        if phase is not Phase.REGISTERING or now <= self._deadline:
            return None
        p = self._parallelism
        return (
            f"only {len(self._last_seen)} of {p} slots registered within "
            f"{self._registration_timeout:.0f}s (does the cluster have {p} free task slots?)"
        )

    def silent_slot(self, now: float) -> str | None:
        """A slot that is still open but missed its heartbeats, described; else None."""
        for slot, seen in self._last_seen.items():
            if now - seen > self._heartbeat_timeout and slot not in self.closed:
                return f"slot {slot} missed heartbeats for {now - seen:.1f}s"
        return None
