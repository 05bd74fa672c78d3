"""Windows with an evictor (Flink's EvictingWindowOperator).

Such a window keeps every element with its timestamp, ``(value, timestamp)`` pairs in
the same namespaced list state as a ``process`` window's elements, so they are in
every checkpoint and savepoint and follow their key on rescale; whatever the window
function (``reduce`` and ``aggregate`` too). When the window fires, the evictor's
``evict_before`` sees them as :class:`~epochstream.graph.evictors.TimestampedValue`
lists, the function runs over what is left (``reduce``/``aggregate`` fold it then),
``evict_after`` runs, and the elements left are written back for the next firing.

Non-evicting windows never reach this module: ``create_operator`` picks this subclass
only when the window has an evictor, so their per-record path is unchanged.

Example::

    op = EvictingWindowOperator(spec, ctx)   # spec.payload.evictor is set
    op.open()
    op.process_batch(records, timestamps)
"""

from __future__ import annotations

from typing import Any

from epochstream.core.functions import ReduceFunction
from epochstream.graph.evictors import Evictor, TimestampedValue
from epochstream.runtime.operators.collect import OutputBuffer
from epochstream.runtime.operators.windows import WindowOperator

__all__ = ["EvictingWindowOperator"]


class _EvictorContext:
    """What an evictor sees besides the elements: the key and the operator's times."""

    __slots__ = ("_op", "evictor", "key")

    def __init__(self, op: WindowOperator, evictor: Evictor) -> None:
        self._op = op
        self.evictor = evictor
        self.key: Any = None

    def current_watermark(self) -> int:
        return self._op.timers.current_watermark  # type: ignore[union-attr]

    def current_processing_time(self) -> int:
        return self._op.ctx.clock_ms()


class EvictingWindowOperator(WindowOperator):
    """Keyed windows whose elements an evictor trims at each firing (module docstring)."""

    def open(self) -> None:
        super().open()
        spec = self.window_spec
        assert spec.evictor is not None
        # The evictor lives on its context: the operator keeps at most 30 attributes
        # (see WindowOperator).
        self._ectx = _EvictorContext(self, spec.evictor)
        fn = spec.function
        self._reduce = fn.reduce if isinstance(fn, ReduceFunction) else fn

    def _add(self, key: Any, window: Any, state_window: Any, x: Any, ts: int | None) -> None:
        elements = self._elements
        elements.set_namespace(state_window)
        elements.add((x, ts))  # TimeEvictor needs the timestamps
        self._on_element(key, window, state_window, x, ts)

    def _fire(self, key: Any, window: Any, state_window: Any, out: OutputBuffer) -> None:
        elements = self._elements
        elements.set_namespace(state_window)
        stored = elements.get()
        if not stored:
            return
        kept = [TimestampedValue(value, ts) for value, ts in stored]
        ectx = self._ectx
        ectx.key = key
        evictor = ectx.evictor
        evictor.evict_before(kept, len(kept), window, ectx)
        out.ts = self._side.ts = window.max_timestamp()
        self._apply(key, window, [e.value for e in kept], out)
        evictor.evict_after(kept, len(kept), window, ectx)
        if len(kept) != len(stored) or any(
            e.value is not s[0] for e, s in zip(kept, stored, strict=False)
        ):
            elements.set_namespace(state_window)  # the function may have used other windows
            elements.update([(e.value, e.timestamp) for e in kept])

    def _apply(self, key: Any, window: Any, values: list[Any], out: OutputBuffer) -> None:
        """The window function over the elements left after ``evict_before``."""
        spec = self.window_spec
        wctx = self._wctx
        wctx.window = window
        if spec.kind == "process":
            spec.function.process(key, wctx, values, out.collector)
            return
        if spec.kind == "reduce":
            if not values:
                return  # everything was evicted: nothing to reduce
            result = values[0]
            for value in values[1:]:
                result = self._reduce(result, value)
        else:
            fn = spec.function
            acc = fn.create_accumulator()
            for value in values:
                acc = fn.add(value, acc)
            result = fn.get_result(acc)
        if spec.window_function is None:
            out.collector.collect(result)
        else:
            spec.window_function.process(key, wctx, [result], out.collector)
