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

__all__ = ["Clock", "ManualClock", "SystemClock", "wall_ms"]


class Clock(Protocol):
    """Monotonic seconds (``now``) and wall-clock epoch seconds (``wall``)."""

    def now(self) -> float: ...

    def wall(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


def wall_ms(clock: Clock) -> int:
    """Wall-clock time of ``clock`` in int milliseconds (processing time).

    Clocks may provide ``wall_ms()`` themselves (exact); otherwise ``wall()`` seconds are
    rounded, never truncated, so a clock set to a whole millisecond reads it back.
    Example: ``wall_ms(ManualClock(start=1.5)) == 1500``
    """
    exact = getattr(clock, "wall_ms", None)
    return int(exact()) if exact is not None else round(clock.wall() * 1000)


class SystemClock:
    """The real clock: ``time.monotonic`` and ``time.time``."""

    def now(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()

    def wall_ms(self) -> int:
        return time.time_ns() // 1_000_000

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
