"""Time as epochstream counts it: int milliseconds, and the two time domains.

Event timestamps, watermarks, timer times, window bounds and processing time are
all int milliseconds since the epoch (as in Flink). Durations (window sizes, gaps,
out-of-orderness bounds, allowed lateness, idleness timeouts) take int milliseconds
or a :class:`datetime.timedelta`.

Example::

    to_millis(timedelta(seconds=5)) == 5000
    to_millis(250) == 250
"""

from __future__ import annotations

import enum
from datetime import timedelta
from typing import Any

from epochstream.exceptions import ConfigurationError

__all__ = ["TimeDomain", "to_millis", "to_signed_millis"]


class TimeDomain(enum.Enum):
    """Which clock a timer follows: event time (watermarks) or processing time (the clock).

    Example: ``if ctx.time_domain() is es.TimeDomain.EVENT_TIME: ...``
    """

    EVENT_TIME = "event_time"
    PROCESSING_TIME = "processing_time"


def to_millis(value: Any, what: str = "duration", *, allow_zero: bool = True) -> int:
    """A duration as int milliseconds: an int as it is, a ``timedelta`` converted.

    Negative durations, floats and other types raise :class:`ConfigurationError` naming
    ``what`` (floats are refused because seconds-vs-milliseconds mix-ups are common).

    Example: ``to_millis(timedelta(minutes=1), "window size") == 60_000``
    """
    if isinstance(value, timedelta):
        ms = value // timedelta(milliseconds=1)
    elif isinstance(value, int) and not isinstance(value, bool):
        ms = value
    else:
        raise ConfigurationError(
            f"{what} must be int milliseconds or a datetime.timedelta, got "
            f"{type(value).__name__} {value!r}"
        )
    if ms < 0 or (ms == 0 and not allow_zero):
        raise ConfigurationError(f"{what} must be {'>=' if allow_zero else '>'} 0 ms, got {ms}")
    return ms


def to_signed_millis(value: Any, what: str = "duration") -> int:
    """Like :func:`to_millis`, but negative values are allowed (window offsets, interval
    join bounds). Example: ``to_signed_millis(timedelta(hours=-8)) == -28_800_000``
    """
    if isinstance(value, timedelta) and value < timedelta(0):
        return -to_millis(-value, what)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return to_millis(value, what)
