"""A task's input gate: bounded FIFO input channels plus the task's mailbox.

Producers (a reader thread per network channel, or an upstream task in the same
slot) append whole batches and block while a channel is full: that is the
backpressure, and over TCP it propagates upstream through the socket buffers.
The task thread is the only consumer. It takes mail first (checkpoint triggers,
notifications, cancellation), then the next batch or event from any channel that
the barrier handler has not blocked, round-robin. One lock per *batch*, never per
record.

Example::

    gate = InputGate(num_channels=2, capacity=4)
    gate.put(1, [1, 2, 3])
    gate.take(timeout=0.1)      # (1, [1, 2, 3])
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from epochstream.runtime.metrics import WaitClock

__all__ = ["MAIL", "Cancelled", "InputGate"]

#: Channel index reported by ``take`` for mailbox items.
MAIL = -1


#: What :meth:`InputGate._poll` found: the item ``take`` returns (``None``: return
#: ``None`` now) and what to run once the gate's lock is released.
Polled = tuple[tuple[int, Any] | None, Callable[[], None] | None]


class Cancelled(Exception):
    """Raised to producers and the consumer of a gate once it is cancelled."""


class InputGate:
    """Bounded per-channel queues and a mailbox behind one condition variable."""

    def __init__(self, num_channels: int, *, capacity: int = 16) -> None:
        self.num_channels = num_channels
        self.capacity = capacity
        self._cond = threading.Condition()
        self._queues: list[deque[Any]] = [deque() for _ in range(num_channels)]
        self._mail: deque[Any] = deque()
        self._next = 0
        self._cancelled = False
        #: ``blocked[ch]`` is true while the task must not read channel ``ch``; the
        #: barrier handler owns this list (mutated in place) and the gate only reads it.
        self.blocked: list[bool] = [False] * num_channels
        #: Time the consumer waited for input (the task's idle time).
        self.idle = WaitClock()

    def put(
        self,
        channel: int,
        item: Any,
        pressure: WaitClock | None = None,
        frame: bytes | None = None,
    ) -> None:
        """Append a batch or event to ``channel``; blocks while the channel is full.

        ``pressure`` (the producing task's backpressure clock) counts that blocking.
        ``frame``: the item's encoded bytes when it came over the network (kept only by
        a gate that records channel state).
        """
        cond = self._cond
        with cond:
            queue = self._queues[channel]
            if len(queue) >= self.capacity:
                if pressure is not None:
                    pressure.begin()
                try:
                    while len(queue) >= self.capacity:
                        if self._cancelled:
                            raise Cancelled()
                        cond.wait(0.5)
                finally:
                    if pressure is not None:
                        pressure.end()
            if self._cancelled:
                raise Cancelled()
            queue.append(item)
            cond.notify_all()

    def put_mail(self, mail: Any) -> None:
        """Hand a control message to the task; mail is taken before any input."""
        with self._cond:
            self._mail.append(mail)
            self._cond.notify_all()

    def take(self, timeout: float | None, *, data: bool = True) -> tuple[int, Any] | None:
        """The next mail (channel ``MAIL``) or input item; ``None`` if ``timeout`` passed.

        ``data=False``: mail only (and what a subclass's :meth:`_poll` never holds back).
        """
        cond = self._cond
        deadline = None if timeout is None else time.monotonic() + timeout
        with cond:
            while True:
                if self._mail:
                    return MAIL, self._mail.popleft()
                if self._cancelled:
                    raise Cancelled()
                found = self._poll(data)
                if found is not None:
                    break
                if deadline is None:
                    remaining = None
                else:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return None
                self.idle.begin()
                cond.wait(remaining)
                self.idle.end()
        got, after = found
        if after is not None:
            after()  # outside the lock (a socket write, another gate's lock)
        return got

    def _poll(self, data: bool) -> Polled | None:
        """Under the lock: the next input item, if any (``None``: wait for one)."""
        if not data:
            return None
        n = self.num_channels
        blocked = self.blocked
        start = self._next
        for i in range(n):
            ch = (start + i) % n
            queue = self._queues[ch]
            if queue and not blocked[ch]:
                self._next = ch + 1
                item = queue.popleft()
                self._cond.notify_all()
                return (ch, item), None
        return None

    def has_input(self) -> bool:
        """True if a non-blocked channel has an item (used to decide when to flush)."""
        with self._cond:
            return any(q and not self.blocked[ch] for ch, q in enumerate(self._queues))

    def fill(self) -> float:
        """How full the input channels are, 0.0 to 1.0 (a lock-free estimate for metrics)."""
        if not self.num_channels:
            return 0.0
        queued = sum(len(q) for q in self._queues)
        return min(queued / (self.num_channels * self.capacity), 1.0)

    def cancel(self) -> None:
        """Wake and fail every waiting producer and the consumer."""
        with self._cond:
            self._cancelled = True
            self._cond.notify_all()

    @property
    def cancelled(self) -> bool:
        return self._cancelled
