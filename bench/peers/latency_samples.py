"""The pure arithmetic of the peers' W1 latency runs (``spark_ss_job.py``, ``bytewax_job.py``).

Standard library only: the Bytewax peer imports it from its own virtualenv.

- :class:`Schedule`: a source throttled to ``rate`` events/s releases event ``i`` at
  ``start + i / rate``; its due time is the event's creation time.
- :func:`pick`: a micro-batch's latency samples drawn from the quantiles of its rows'
  creation times, as many as its share of the rows.
- :func:`offered_ms`: when Spark's ``rate`` source offered a row to the query (it
  offers whole seconds of its schedule, once each second has passed).
- :func:`batch_end`: a micro-batch's end wall time from its progress report.

Example::

    schedule = Schedule(rate=1000.0, start=100.0, n=5000)
    schedule.released(101.0)                                  # 1001 events due by then
    created = pick([1000, 1500, 2000], rows=400, rows_per_sample=200)   # [1000, 2000]
    latencies = [2.5 - ms / 1000 for ms in created]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TypeVar

__all__ = ["Schedule", "batch_end", "offered_ms", "pick"]

Q = TypeVar("Q", int, float)


@dataclass(frozen=True)
class Schedule:
    """``n`` events at ``rate`` per second from wall time ``start`` (``time.time()``).

    Example: ``Schedule(rate=4.0, start=10.0, n=100).due(6) == 11.5``
    """

    rate: float
    start: float
    n: int

    def due(self, i: int) -> float:
        """Wall time event ``i`` is released: its creation time."""
        return self.start + i / self.rate

    def released(self, now: float) -> int:
        """How many events are due by ``now`` (events ``0 .. released - 1``), at most ``n``.

        Example: ``Schedule(rate=4.0, start=10.0, n=100).released(11.0) == 5``
        """
        if now < self.start:
            return 0
        return min(self.n, math.floor((now - self.start) * self.rate) + 1)


def pick(quantiles: Sequence[Q], rows: int, rows_per_sample: float) -> list[Q]:
    """One value of ``quantiles`` per ``rows_per_sample`` rows of the batch (at least one).

    ``quantiles`` are a batch's equally spaced quantiles (ascending, each standing for
    the same share of its ``rows``); the ``k`` picks are spread evenly over them (the
    middle of each ``len(quantiles) / k`` of them), so every batch weighs in the pooled
    percentiles by its number of rows, not by its number of quantiles. An empty batch
    gives no samples.

    Example: ``pick([1.0, 2.0, 3.0, 4.0], rows=100, rows_per_sample=50) == [2.0, 4.0]``
    """
    if not quantiles or rows <= 0:
        return []
    k = max(1, round(rows / rows_per_sample))
    m = len(quantiles)
    return [quantiles[min(m - 1, int((j + 0.5) * m / k))] for j in range(k)]


def offered_ms(created_ms: int, origin_ms: int) -> int:
    """When Spark's ``rate`` source offered the row created at ``created_ms``.

    The source's offsets are whole seconds since its creation (``origin_ms``, the
    creation time of row 0): the rows of second ``s`` are offered once that second has
    passed, at ``origin_ms + (s + 1) * 1000``.

    Example: ``offered_ms(5_999, 5_000) == 6_000 and offered_ms(6_000, 5_000) == 7_000``
    """
    return origin_ms + ((created_ms - origin_ms) // 1000 + 1) * 1000


def batch_end(timestamp: str, trigger_execution_ms: int) -> float:
    """Wall time (seconds) a Structured Streaming micro-batch ended: its progress report's
    ``timestamp`` (trigger start, ISO 8601 UTC) plus ``durationMs.triggerExecution``.

    Example: ``batch_end("1970-01-01T00:00:10.250Z", 500) == 10.75``
    """
    return datetime.fromisoformat(timestamp).timestamp() + trigger_execution_ms / 1000.0
