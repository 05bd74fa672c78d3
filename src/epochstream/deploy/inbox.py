"""The job master's event queue, and the waits that read it outside an attempt's loop.

Every input of the job master arrives on one queue as ``(kind, conn, msg)``: slot
messages and closed connections (``message``, ``closed``), storage callbacks
(``io-done``), user requests (``cancel``, ``savepoint``) and the runner's exit
(``runner-exit``). The attempt loop in :mod:`epochstream.deploy.jobmaster` handles them
while slots run; this module holds the short waits around it: the final reports of
slots that exited cleanly, the root cause behind a broken channel, and the time between
attempts (restart delay, stale events of the attempt that ended).

Example::

    inbox = Inbox(events, clock, job_id, metrics)
    failure = inbox.root_cause(failure, attempt, closed)   # a channel broke: why?
    inbox.sleep(2.0)                                        # JobCancelled on cancel
"""

from __future__ import annotations

import queue
from collections.abc import Iterable
from typing import Any

from epochstream.core.clock import Clock
from epochstream.deploy.failures import Failure
from epochstream.deploy.metrics import JobMetrics
from epochstream.exceptions import JobCancelled
from epochstream.runtime.messages import (
    CancelSlot,
    RegisterSlot,
    SlotClosed,
    SlotMetrics,
    TaskFailed,
)
from epochstream.runtime.slotlogs import SlotLog, log_slot_record

__all__ = ["ROOT_CAUSE_GRACE", "Inbox"]

#: How long to wait for the real cause after a symptom (a broken channel), or for the
#: final reports of slots that exited.
ROOT_CAUSE_GRACE = 1.0


class Inbox:
    """The job master's queue with the waits that happen outside the attempt loop."""

    def __init__(
        self, events: queue.Queue[Any], clock: Clock, job_id: str, metrics: JobMetrics
    ) -> None:
        self.events = events
        self._clock = clock
        self._job_id = job_id
        self._metrics = metrics

    def take_final_reports(self, slots: Iterable[int], attempt: int, closed: set[int]) -> None:
        """The slots exited cleanly: record the final metrics they sent before closing,
        whose frames may still be on their way, for up to ROOT_CAUSE_GRACE."""
        waiting = set(slots) - closed
        deadline = self._clock.now() + ROOT_CAUSE_GRACE
        while waiting and (remaining := deadline - self._clock.now()) > 0:
            try:
                kind, conn, msg = self.events.get(timeout=remaining)
            except queue.Empty:
                return
            if kind == "io-done":
                conn(msg)
            elif kind in ("message", "closed") and conn.attempt == attempt:
                if isinstance(msg, SlotMetrics):
                    self._metrics.record(msg.samples, wall=self._clock.wall())
                elif isinstance(msg, SlotLog):
                    log_slot_record(msg)
                elif kind == "closed" or isinstance(msg, SlotClosed):
                    waiting.discard(conn.slot)
            elif kind in ("cancel", "savepoint"):
                self.events.put((kind, conn, msg))  # for the job master's run() to handle
                return

    def root_cause(self, secondary: Failure, attempt: int, closed: set[int]) -> Failure:
        """A broken channel is a symptom: wait briefly for the failure that caused it."""
        deadline = self._clock.now() + ROOT_CAUSE_GRACE
        while (remaining := deadline - self._clock.now()) > 0:
            try:
                kind, conn, msg = self.events.get(timeout=remaining)
            except queue.Empty:
                break
            if kind == "cancel" or kind == "savepoint":
                self.events.put((kind, conn, msg))
                break
            if kind == "io-done":
                conn(msg)
                continue
            if kind == "closed" and conn.attempt == attempt and conn.slot not in closed:
                return Failure.lost_slot(conn, msg)
            if kind == "message" and isinstance(msg, TaskFailed) and not msg.secondary:
                return Failure.of_task(msg)
        return secondary

    def between_attempts(self, event: tuple[Any, Any, Any]) -> bool:
        """Handle an event that may come while no attempt runs; False to keep it."""
        kind, conn, msg = event
        if kind == "io-done":
            conn(msg)
            return True
        if kind == "message" and isinstance(msg, RegisterSlot):
            # A slot of the attempt that ended, which was still starting: without an
            # answer it would wait for its deployment until the control server closes.
            conn.send(CancelSlot(f"attempt {msg.attempt} of job {self._job_id} has ended"))
            conn.close()
            return True
        if kind == "savepoint":
            msg.fail(f"job {self._job_id} is restarting")
            return True
        return kind != "cancel"

    def drain_stale(self) -> None:
        """Drop what the attempt that ended left behind; keep a cancel for later."""
        keep = []
        while True:
            try:
                event = self.events.get_nowait()
            except queue.Empty:
                break
            if not self.between_attempts(event):
                keep.append(event)
        for event in keep:
            self.events.put(event)

    def sleep(self, seconds: float) -> None:
        """Wait out a restart delay, serving events; JobCancelled when a cancel comes."""
        deadline = self._clock.now() + seconds
        while True:
            remaining = deadline - self._clock.now()
            if remaining <= 0:
                return
            try:
                event = self.events.get(timeout=remaining)
            except queue.Empty:
                return
            if not self.between_attempts(event):
                raise JobCancelled(f"job {self._job_id} was cancelled")
