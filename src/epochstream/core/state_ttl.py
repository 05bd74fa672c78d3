"""State time-to-live: entries expire a fixed time after they were last written (or read).

A descriptor with ``ttl=`` stores each entry together with the processing time of its
last update (Flink's ``StateTtlConfig`` with ``NeverReturnExpired``): an expired entry
reads as absent, is deleted when it is accessed, and is left out of every full
snapshot (savepoints, materializations). ``ttl_update="on_write"`` (default) refreshes
the timestamp on writes; ``"on_read_and_write"`` also on reads. Map state expires per
user key, list state per element, the other kinds per key.

Times come from the backend's clock (wall-clock seconds), injectable in tests.

Example::

    desc = es.state.ValueStateDescriptor("last-seen", ttl=timedelta(hours=1))
    desc.ttl_config.seconds == 3600.0
"""

from __future__ import annotations

import datetime as _dt
import math
from dataclasses import dataclass
from typing import Any

from epochstream.exceptions import ConfigurationError

__all__ = ["TTL_UPDATES", "TtlConfig", "TtlValue"]

TTL_UPDATES = ("on_write", "on_read_and_write")


@dataclass(frozen=True)
class TtlConfig:
    """``seconds`` of life; ``update_on_read`` refreshes an entry when it is read.

    Example::

        TtlConfig.of(_dt.timedelta(minutes=5), "on_write").seconds == 300.0
    """

    seconds: float
    update_on_read: bool = False

    @staticmethod
    def of(ttl: Any, update: str) -> TtlConfig:
        """Validate a descriptor's ``ttl`` (timedelta or seconds) and ``ttl_update``."""
        if isinstance(ttl, _dt.timedelta):
            seconds = ttl.total_seconds()
        elif isinstance(ttl, int | float) and not isinstance(ttl, bool):
            seconds = float(ttl)
        else:
            raise ConfigurationError(f"ttl must be a timedelta or seconds, got {ttl!r}")
        if not math.isfinite(seconds) or seconds <= 0:
            raise ConfigurationError(f"ttl must be positive and finite, got {ttl!r}")
        if update not in TTL_UPDATES:
            raise ConfigurationError(f"ttl_update must be one of {TTL_UPDATES}, got {update!r}")
        return TtlConfig(seconds, update == "on_read_and_write")

    def expired(self, stored: TtlValue, now: float) -> bool:
        """Whether ``stored`` is past its time at ``now``."""
        return now - stored.timestamp >= self.seconds


class TtlValue(tuple[Any, float]):
    """A state value with the time of its last update: ``(value, timestamp)``.

    Example::

        TtlValue.of("x", 10.0).value == "x"
    """

    __slots__ = ()

    @staticmethod
    def of(value: Any, timestamp: float) -> TtlValue:
        return TtlValue((value, timestamp))

    @property
    def value(self) -> Any:
        return self[0]

    @property
    def timestamp(self) -> float:
        return float(self[1])

    def __reduce__(self) -> tuple[Any, ...]:
        return (TtlValue, (tuple(self),))
