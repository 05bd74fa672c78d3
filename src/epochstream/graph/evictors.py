"""Evictors: which elements a window keeps, before and after its function runs (Flink's
Evictor, CountEvictor, TimeEvictor and DeltaEvictor).

A window with an evictor keeps every element (with its timestamp) until it fires, even
with ``reduce``/``aggregate``: when it fires, ``evict_before`` may remove elements, the
window function runs over the rest (``reduce``/``aggregate`` fold them then), and
``evict_after`` may remove more. What is left stays in the window for its next firing.

Example::

    (keyed.window(es.GlobalWindows.create())
        .trigger(es.CountTrigger.of(2))
        .evictor(es.CountEvictor.of(5))       # what count_window(5, 2) builds
        .sum(1))
"""

from __future__ import annotations

from abc import ABC
from collections.abc import Callable
from typing import Any, NamedTuple

from epochstream.core.time import to_millis
from epochstream.exceptions import ConfigurationError

__all__ = ["CountEvictor", "DeltaEvictor", "Evictor", "TimeEvictor", "TimestampedValue"]


class TimestampedValue(NamedTuple):
    """A window element and its event timestamp (``None`` when it has none).

    Example: ``TimestampedValue("click", 1_000).timestamp == 1_000``
    """

    value: Any
    timestamp: int | None

    def has_timestamp(self) -> bool:
        """True when the element has an event timestamp."""
        return self.timestamp is not None


class Evictor(ABC):  # noqa: B024 - both hooks are optional, as in Flink
    """Removes elements from a firing window: ``elements`` is a list of
    :class:`TimestampedValue` in arrival order; delete from it in place (``del
    elements[:n]``, ``elements.remove(e)``) to evict. ``size`` is ``len(elements)``;
    ``ctx`` has ``current_watermark()``, ``current_processing_time()`` and ``key``.

    Example::

        class KeepPositive(es.Evictor):
            def evict_before(self, elements, size, window, ctx):
                elements[:] = [e for e in elements if e.value[1] > 0]
    """

    def evict_before(  # noqa: B027 (optional hook: a no-op unless overridden)
        self, elements: list[TimestampedValue], size: int, window: Any, ctx: Any
    ) -> None:
        """Before the window function: remove what it should not see."""

    def evict_after(  # noqa: B027 (optional hook: a no-op unless overridden)
        self, elements: list[TimestampedValue], size: int, window: Any, ctx: Any
    ) -> None:
        """After the window function: remove what later firings should not see."""


class _BeforeOrAfter(Evictor):
    """Evicts by one rule, before the function or (``do_evict_after``) after it."""

    def __init__(self, do_evict_after: bool) -> None:
        if not isinstance(do_evict_after, bool):
            raise ConfigurationError(f"do_evict_after must be a bool, got {do_evict_after!r}")
        self.do_evict_after = do_evict_after

    def _evict(self, elements: list[TimestampedValue], size: int) -> None:
        raise NotImplementedError

    def evict_before(
        self, elements: list[TimestampedValue], size: int, window: Any, ctx: Any
    ) -> None:
        if not self.do_evict_after:
            self._evict(elements, size)

    def evict_after(
        self, elements: list[TimestampedValue], size: int, window: Any, ctx: Any
    ) -> None:
        if self.do_evict_after:
            self._evict(elements, size)


class CountEvictor(_BeforeOrAfter):
    """Keeps the last ``max_count`` elements (the oldest go first).

    Example: ``.evictor(es.CountEvictor.of(100))``
    """

    def __init__(self, max_count: int, do_evict_after: bool = False) -> None:
        super().__init__(do_evict_after)
        if not isinstance(max_count, int) or isinstance(max_count, bool) or max_count < 0:
            raise ConfigurationError(f"CountEvictor needs a count >= 0, got {max_count!r}")
        self.max_count = max_count

    @staticmethod
    def of(max_count: int, do_evict_after: bool = False) -> CountEvictor:
        """Keep ``max_count`` elements; evict after the window function if ``do_evict_after``."""
        return CountEvictor(max_count, do_evict_after)

    def _evict(self, elements: list[TimestampedValue], size: int) -> None:
        if size > self.max_count:
            del elements[: size - self.max_count]


class TimeEvictor(_BeforeOrAfter):
    """Keeps the elements less than ``window_size`` older than the newest one: those
    with ``timestamp <= max timestamp - window_size`` go (nothing goes when the
    elements have no timestamps).

    Example: ``.evictor(es.TimeEvictor.of(timedelta(seconds=10)))``
    """

    def __init__(self, window_size: Any, do_evict_after: bool = False) -> None:
        super().__init__(do_evict_after)
        self.window_size = to_millis(window_size, "TimeEvictor window size")

    @staticmethod
    def of(window_size: Any, do_evict_after: bool = False) -> TimeEvictor:
        """Keep ``window_size`` (ms or timedelta) of elements, measured from the newest."""
        return TimeEvictor(window_size, do_evict_after)

    def _evict(self, elements: list[TimestampedValue], size: int) -> None:
        # Flink looks at the first element only to decide whether timestamps exist.
        if not elements or not elements[0].has_timestamp():
            return
        cutoff = max(e.timestamp for e in elements if e.timestamp is not None) - self.window_size
        elements[:] = [e for e in elements if e.timestamp is None or e.timestamp > cutoff]


class DeltaEvictor(_BeforeOrAfter):
    """Evicts every element whose ``delta_fn(element, last element) >= threshold`` (the
    last one is compared with itself, so a delta of 0 keeps it unless ``threshold <= 0``).

    Example: ``.evictor(es.DeltaEvictor.of(10.0, lambda a, b: abs(a[1] - b[1])))``
    """

    def __init__(
        self, threshold: float, delta_fn: Callable[[Any, Any], float], do_evict_after: bool = False
    ) -> None:
        super().__init__(do_evict_after)
        if not callable(delta_fn):
            raise ConfigurationError("DeltaEvictor needs a callable delta_fn(a, b) -> float")
        if isinstance(threshold, bool) or not isinstance(threshold, int | float):
            raise ConfigurationError(f"DeltaEvictor needs a numeric threshold, got {threshold!r}")
        self.threshold = threshold
        self.delta_fn = delta_fn

    @staticmethod
    def of(
        threshold: float, delta_fn: Callable[[Any, Any], float], do_evict_after: bool = False
    ) -> DeltaEvictor:
        """Evict elements at least ``threshold`` away (by ``delta_fn``) from the last one."""
        return DeltaEvictor(threshold, delta_fn, do_evict_after)

    def _evict(self, elements: list[TimestampedValue], size: int) -> None:
        if not elements:
            return
        last = elements[-1].value
        delta, threshold = self.delta_fn, self.threshold
        elements[:] = [e for e in elements if delta(e.value, last) < threshold]
