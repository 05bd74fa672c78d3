"""Injected clocks, so that time-dependent logic (restart strategies, checkpoint
intervals and timeouts, alignment timing) can be tested without sleeping.

Example::

    clock = ManualClock(start=100.0)
    clock.advance(5.0)
    assert clock.now() == 105.0
"""

from __future__ import annotations

import threading
import time
from typing import Protocol

__all__ = ["Clock", "ManualClock", "SystemClock"]


class Clock(Protocol):
    """Monotonic seconds (``now``) and wall-clock epoch seconds (``wall``)."""

    def now(self) -> float: ...

    def wall(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """The real clock: ``time.monotonic`` and ``time.time``."""

    def now(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


class ManualClock:
    """A clock that moves only when told to; ``sleep`` advances it instantly."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._now

    def wall(self) -> float:
        return self.now()

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            self.advance(seconds)
