"""The window operator: keyed windows on keyed state and timers (Flink's WindowOperator).

Per record: the assigner gives its windows; a window whose end plus the allowed
lateness the watermark has passed is skipped (a record skipped by all its windows
is late: dropped, or sent to the late side output). Otherwise the record goes into
the window's contents, the trigger decides (fire, purge), and a cleanup timer is set
for the window's end plus the allowed lateness, when its state goes.

Contents live in keyed state namespaced by window: a namespaced value table of
accumulators for ``reduce``/``aggregate`` (entries keyed ``(key, window)``), or a
namespaced list state of the records for ``process``. Triggers keep per-window
state through their context, timers are the operator's (in keyed state too), so
open windows, their contents and pending firings are all in every checkpoint and
savepoint and follow their key on rescale.

A ProcessWindowFunction's per-window state (``ctx.window_state()``) is keyed state
namespaced by the window as well (see ``window_state``), dropped at cleanup after the
function's ``clear(ctx)``; ``ctx.global_state()`` is the key's plain keyed state.

Merging (session) windows keep, per key, which windows exist and in which
*state window* (namespace) each keeps its contents, so a merge moves nothing but
the other windows' contents into one (Flink's MergingWindowSet).

Example::

    op = WindowOperator(spec, ctx)         # spec.payload is a WindowSpec
    op.open()
    op.process_batch(records, timestamps)
    op.process_watermark(5_000)            # windows ending by 5 s fire
"""

from __future__ import annotations

from typing import Any

from epochstream.core.events import MAX_WATERMARK
from epochstream.core.functions import ReduceFunction
from epochstream.core.state_descriptors import (
    ListStateDescriptor,
    StateDescriptor,
    ValueStateDescriptor,
)
from epochstream.core.time import TimeDomain
from epochstream.exceptions import StateError, UserFunctionError
from epochstream.graph.specs import WindowSpec
from epochstream.graph.triggers import EventTimeTrigger
from epochstream.runtime.operators.base import Operator, OperatorContext
from epochstream.runtime.operators.collect import OutputBuffer, SideOutputs
from epochstream.runtime.operators.window_state import WindowStates, WindowStateView
from epochstream.state.handles import OperatorRestore

__all__ = ["WindowOperator"]

_MISSING: Any = object()
CONTENTS = "window-contents"
MERGING = "window-merging"


class _TriggerContext:
    """What a trigger sees: times, timers and per-window state of the current key."""

    __slots__ = ("_op", "merged", "window")

    def __init__(self, op: WindowOperator) -> None:
        self._op = op
        self.window: Any = None
        #: The windows merged into ``window`` (during ``on_merge``).
        self.merged: list[Any] = []

    def current_watermark(self) -> int:
        return self._op.timers.current_watermark  # type: ignore[union-attr]

    def current_processing_time(self) -> int:
        return self._op.ctx.clock_ms()

    def register_event_time_timer(self, time: int) -> None:
        self._op.timers.register_event_time_timer(self.window, time)  # type: ignore[union-attr]

    def register_processing_time_timer(self, time: int) -> None:
        self._op.timers.register_processing_time_timer(self.window, time)  # type: ignore[union-attr]

    def delete_event_time_timer(self, time: int) -> None:
        self._op.timers.delete_event_time_timer(self.window, time)  # type: ignore[union-attr]

    def delete_processing_time_timer(self, time: int) -> None:
        self._op.timers.delete_processing_time_timer(self.window, time)  # type: ignore[union-attr]

    def get_partitioned_state(self, descriptor: StateDescriptor) -> Any:
        """Trigger state of the current key and window (value or list state)."""
        state = self._op.trigger_state(descriptor)
        state.set_namespace(self.window)
        return state

    def merge_partitioned_state(self, name: str, combine: Any) -> None:
        """Combine the merged windows' value state ``name`` into ``window``'s."""
        state = self._op.trigger_state(ValueStateDescriptor(name))
        result = None
        for window in (self.window, *self.merged):
            state.set_namespace(window)
            value = state.value()
            if value is not None:
                result = value if result is None else combine(result, value)
            if window is not self.window:
                state.clear()
        state.set_namespace(self.window)
        if result is not None:
            state.update(result)


class _WindowContext:
    """What a ProcessWindowFunction sees: the window, times, side outputs, per-window
    and global keyed state."""

    __slots__ = ("_op", "states", "window")

    def __init__(self, op: WindowOperator, states: WindowStates) -> None:
        self._op = op
        self.window: Any = None
        #: The operator's per-window state (kept here: see WindowOperator._restored).
        self.states = states

    def window_state(self) -> WindowStateView:
        """Keyed state of the current key in this window, dropped with the window."""
        return self.states.bind(self.window, self._op.ctx.task_name)

    def global_state(self) -> OperatorContext:
        """Keyed state of the current key, shared by all its windows."""
        return self._op.ctx

    def current_watermark(self) -> int:
        return self._op.timers.current_watermark  # type: ignore[union-attr]

    def current_processing_time(self) -> int:
        return self._op.ctx.clock_ms()

    def output(self, tag: Any, value: Any) -> None:
        self._op._side.add(tag, value)


class WindowOperator(Operator):
    """Keyed windows (see the module docstring)."""

    # Instances keep at most 30 attributes: CPython 3.11 shares the keys of instance
    # dicts only up to 30 names, and past that every attribute read on the per-record
    # path gets slower (measured: about a fifth on the general path). New state goes on
    # helper objects (per-window state is on the window context).

    #: True when keyed state was restored (set by ``initialize_state``, before ``open``).
    _restored = False

    def open(self) -> None:
        spec: WindowSpec = self.function
        backend = self.keyed
        assert backend is not None and self.spec.key_selector is not None
        self.window_spec = spec
        self._assigner = spec.assigner
        self._trigger = spec.trigger
        self._lateness = spec.allowed_lateness
        self._event_time = spec.assigner.event_time
        # An evicting window keeps every element, whatever its function (Flink's
        # EvictingWindowOperator): see evicting.py.
        self._incremental = spec.kind in ("reduce", "aggregate") and spec.evictor is None
        if self._incremental:
            self._table = backend.value_table(ValueStateDescriptor(CONTENTS), namespaced=True)
            fn = spec.function
            self._reduce = fn.reduce if isinstance(fn, ReduceFunction) else fn
            self._touched: list[Any] = []
        else:
            self._elements = backend.get_namespaced_state(ListStateDescriptor(CONTENTS))
        self._merging = (
            backend.get_state(ValueStateDescriptor(MERGING)) if spec.assigner.merging else None
        )
        self._trigger_states: dict[str, Any] = {}
        self._out = OutputBuffer()
        self._timer_out = OutputBuffer()
        self._side = SideOutputs(self.side_outputs)
        self._tctx = _TriggerContext(self)
        # Per-window state (ctx.window_state()) exists where a ProcessWindowFunction runs
        # and windows do not merge (Flink refuses it on merging windows too).
        has_window_fn = spec.kind == "process" or spec.window_function is not None
        self._wctx = _WindowContext(
            self,
            WindowStates(
                backend, allowed=has_window_fn and self._merging is None, restored=self._restored
            ),
        )
        self.create_timer_service(self._on_timer, namespace_of=spec.assigner.window_from)
        # Most windowed jobs are event-time windows that never merge, aggregated as records
        # come, with the default trigger: their per-record work is inlined (same result).
        self._fast = (
            self._event_time
            and self._incremental
            and self._merging is None
            and type(self._trigger) is EventTimeTrigger
        )
        for fn in (spec.function, spec.window_function):
            if fn is not None and hasattr(fn, "open"):
                fn.open(self.ctx)

    def close(self) -> None:
        try:
            for fn in (self.window_spec.function, self.window_spec.window_function):
                if fn is not None and hasattr(fn, "close"):
                    fn.close()
        finally:
            super().close()

    def initialize_state(self, restore: OperatorRestore | None, checkpoint_id: int | None) -> None:
        super().initialize_state(restore, checkpoint_id)
        self._restored = bool(restore is not None and restore.keyed)

    def trigger_state(self, descriptor: StateDescriptor) -> Any:
        """The namespaced state a trigger asked for (one object per name)."""
        state = self._trigger_states.get(descriptor.name)
        if state is None:
            assert self.keyed is not None
            state = self._trigger_states[descriptor.name] = self.keyed.get_namespaced_state(
                descriptor
            )
        return state

    # ------------------------------------------------------------------ records

    def process_batch(self, records: list[Any], timestamps: list[Any] | None) -> None:
        self._out.start(timed=True)
        try:
            if self._fast and timestamps is not None:
                self._add_event_time_incremental(records, timestamps)
            else:
                self._add_records(records, timestamps)
        finally:
            self._flush_touched()
        self._out.flush(self.output)
        self._side.flush()

    def _add_records(self, records: list[Any], timestamps: list[Any] | None) -> None:
        """Assign each record to its windows, add it and run the trigger."""
        now = self.ctx.clock_ms()
        key_of = self.spec.key_selector
        assert key_of is not None, "a window operator reads a keyed stream"
        backend = self.keyed
        assert backend is not None
        set_key = backend.set_current_key
        assign = self._assigner.assign_windows
        x = None
        try:
            for i, x in enumerate(records):
                ts = None if timestamps is None else timestamps[i]
                key = key_of(x)
                set_key(key)
                windows = assign(x, ts, now)
                if self._merging is not None:
                    skipped = self._add_merging(key, x, ts, windows)
                else:
                    skipped = True
                    for window in windows:
                        if self._window_late(window):
                            continue
                        skipped = False
                        self._add(key, window, window, x, ts)
                if skipped and windows and self._element_late(ts):
                    self._late(x, ts)
        except UserFunctionError:
            raise
        except Exception as exc:
            raise UserFunctionError(self.ctx.task_name, x, exc) from exc

    def _add_event_time_incremental(self, records: list[Any], timestamps: list[Any]) -> None:
        """``_add_records`` for non-merging event-time windows, aggregated incrementally,
        with the ``EventTimeTrigger``: what the general path does, without a trigger call
        and two timer registrations per record. A (key, window) pair's timers are set when
        its first record arrives (its contents were missing): later records find them set.
        """
        key_of = self.spec.key_selector
        assert key_of is not None, "a window operator reads a keyed stream"
        assert self.keyed is not None and self.timers is not None
        set_key = self.keyed.set_current_key
        assign = self._assigner.assign_windows
        timers = self.timers
        register = timers.register_event_time_timer_for
        watermark = timers.current_watermark
        lateness = self._lateness
        table = self._table
        get = table.get
        touched = self._touched
        reducing = self.window_spec.kind == "reduce"
        fn = self.window_spec.function
        reduce = self._reduce
        x = None
        try:
            for i, x in enumerate(records):
                ts = timestamps[i]
                key = key_of(x)
                windows = assign(x, ts, 0)
                skipped = True
                for window in windows:
                    end = window.end - 1  # max_timestamp
                    cleanup = end + lateness
                    if cleanup <= watermark:
                        continue
                    skipped = False
                    kw = (key, window)
                    cur = get(kw, _MISSING)
                    if reducing:
                        table[kw] = x if cur is _MISSING else reduce(cur, x)
                    else:
                        table[kw] = fn.add(x, fn.create_accumulator() if cur is _MISSING else cur)
                    touched.append(kw)
                    if cur is _MISSING:
                        if end > watermark:
                            register(key, window, end)
                        if cleanup != end:
                            register(key, window, cleanup)
                    if end <= watermark:  # a late record within the allowed lateness
                        set_key(key)
                        self._fire(key, window, window, self._out)
                if skipped and windows and ts + lateness <= watermark:
                    self._late(x, ts)
        except UserFunctionError:
            raise
        except Exception as exc:
            raise UserFunctionError(self.ctx.task_name, x, exc) from exc

    def _window_late(self, window: Any) -> bool:
        return self._event_time and self._cleanup_time(window) <= self.timers.current_watermark  # type: ignore[union-attr]

    def _element_late(self, ts: int | None) -> bool:
        return (
            self._event_time
            and ts is not None
            and ts + self._lateness <= self.timers.current_watermark  # type: ignore[union-attr]
        )

    def _cleanup_time(self, window: Any) -> int:
        if not self._event_time:
            return int(window.max_timestamp())
        end = window.max_timestamp() + self._lateness
        return end if end >= window.max_timestamp() else MAX_WATERMARK  # overflow

    def _late(self, record: Any, ts: int | None) -> None:
        tag = self.window_spec.late_tag
        if tag is not None:
            self._side.ts = ts
            self._side.add(tag, record)
        else:
            self.counters.late_records_dropped += 1

    def _add(self, key: Any, window: Any, state_window: Any, x: Any, ts: int | None) -> None:
        """Put ``x`` into ``window`` (contents in ``state_window``) and run the trigger."""
        if self._incremental:
            kw = (key, state_window)
            table = self._table
            cur = table.get(kw, _MISSING)
            table[kw] = self._accumulate(cur, x)
            self._touched.append(kw)
        else:
            self._elements.set_namespace(state_window)
            self._elements.add(x)
        self._on_element(key, window, state_window, x, ts)

    def _on_element(self, key: Any, window: Any, state_window: Any, x: Any, ts: int | None) -> None:
        """``x`` is in ``window``'s contents: run the trigger, fire or purge, set the cleanup timer."""
        tctx = self._tctx
        tctx.window = window
        result = self._trigger.on_element(x, ts, window, tctx)
        if result.fire:
            self._fire(key, window, state_window, self._out)
        if result.purge:
            self._clear_contents(key, state_window)
        self._register_cleanup(window)

    def _accumulate(self, cur: Any, x: Any) -> Any:
        spec = self.window_spec
        if spec.kind == "reduce":
            return x if cur is _MISSING else self._reduce(cur, x)
        fn = spec.function
        return fn.add(x, fn.create_accumulator() if cur is _MISSING else cur)

    def _register_cleanup(self, window: Any) -> None:
        time = self._cleanup_time(window)
        if time == MAX_WATERMARK:
            return  # the global window is never cleaned up
        assert self.timers is not None
        if self._event_time:
            self.timers.register_event_time_timer(window, time)
        else:
            self.timers.register_processing_time_timer(window, time)

    def _flush_touched(self) -> None:
        if self._incremental and self._touched:
            self._table.touched(self._touched)
            self._touched = []

    # ------------------------------------------------------------------ merging windows

    def _windows_of(self) -> dict[Any, Any]:
        """The current key's session windows: window -> state window."""
        assert self._merging is not None
        stored = self._merging.value()
        if not stored:
            return {}
        window_from = self._assigner.window_from
        return {window_from(w): window_from(s) for w, s in stored}

    def _save_windows(self, mapping: dict[Any, Any]) -> None:
        assert self._merging is not None
        self._merging.update(tuple(mapping.items()) if mapping else None)

    def _add_merging(self, key: Any, x: Any, ts: int | None, windows: list[Any]) -> bool:
        mapping = self._windows_of()
        skipped = True
        for new in windows:
            actual = self._merge_in(key, mapping, new)
            state_window = mapping[actual]
            if self._window_late(actual):
                del mapping[actual]
                self._clear_contents(key, state_window)
                continue
            skipped = False
            self._add(key, actual, state_window, x, ts)
        self._save_windows(mapping)
        return skipped

    def _merge_in(self, key: Any, mapping: dict[Any, Any], new: Any) -> Any:
        """Add ``new`` to the key's windows, merging as the assigner says; the window
        ``new`` ended up in."""
        result = new
        merged_new = False
        groups = [
            (cover, list(members))
            for cover, members in self._assigner.merge_windows([*mapping, new])  # type: ignore[attr-defined]
            if len(members) > 1
        ]
        for cover, members in groups:
            if new in members:
                members.remove(new)
                merged_new = True
                result = cover
            state_window = mapping[members[0]]
            others = [mapping.pop(w) for w in members if w in mapping]
            mapping[cover] = state_window
            others.remove(state_window)
            if not (cover in members and len(members) == 1):
                self._on_merge(key, cover, members, state_window, others)
        if not groups or (result == new and not merged_new):
            mapping[result] = result
        return result

    def _on_merge(
        self, key: Any, cover: Any, merged: list[Any], state_window: Any, others: list[Any]
    ) -> None:
        if self._event_time and self._cleanup_time(cover) <= self.timers.current_watermark:  # type: ignore[union-attr]
            raise StateError(
                f"{self.ctx.task_name}: merging windows {merged} gives {cover}, whose end the "
                "watermark has passed"
            )
        tctx = self._tctx
        tctx.window, tctx.merged = cover, merged
        self._trigger.on_merge(cover, tctx)
        tctx.merged = []
        for window in merged:
            tctx.window = window
            self._trigger.clear(window, tctx)
            self._delete_cleanup(window)
        self._merge_contents(key, state_window, others)

    def _merge_contents(self, key: Any, target: Any, sources: list[Any]) -> None:
        if not sources:
            return
        if self._incremental:
            table = self._table
            acc = table.get((key, target), _MISSING)
            for window in sources:
                other = table.get((key, window), _MISSING)
                table.delete((key, window))
                self._touched.append((key, window))
                if other is _MISSING:
                    continue
                acc = other if acc is _MISSING else self._merge_accumulators(acc, other)
            if acc is not _MISSING:
                table[(key, target)] = acc
                self._touched.append((key, target))
            return
        elements = self._elements
        moved: list[Any] = []
        for window in sources:
            elements.set_namespace(window)
            moved.extend(elements.get())
            elements.clear()
        elements.set_namespace(target)
        elements.add_all(moved)

    def _merge_accumulators(self, a: Any, b: Any) -> Any:
        spec = self.window_spec
        if spec.kind == "reduce":
            return self._reduce(a, b)
        return spec.function.merge(a, b)

    def _delete_cleanup(self, window: Any) -> None:
        time = self._cleanup_time(window)
        assert self.timers is not None
        if self._event_time:
            self.timers.delete_event_time_timer(window, time)
        else:
            self.timers.delete_processing_time_timer(window, time)

    # ------------------------------------------------------------------ firing

    def _contents(self, key: Any, state_window: Any) -> list[Any] | None:
        if self._incremental:
            acc = self._table.get((key, state_window), _MISSING)
            if acc is _MISSING:
                return None
            spec = self.window_spec
            return [acc if spec.kind == "reduce" else spec.function.get_result(acc)]
        self._elements.set_namespace(state_window)
        elements = self._elements.get()
        return elements or None

    def _fire(self, key: Any, window: Any, state_window: Any, out: OutputBuffer) -> None:
        contents = self._contents(key, state_window)
        if contents is None:
            return
        out.ts = self._side.ts = window.max_timestamp()
        window_fn = self.window_spec.window_function
        if window_fn is None and self.window_spec.kind != "process":
            out.collector.collect(contents[0])
            return
        fn = window_fn if window_fn is not None else self.window_spec.function
        self._wctx.window = window
        fn.process(key, self._wctx, contents, out.collector)

    def _clear_contents(self, key: Any, state_window: Any) -> None:
        if self._incremental:
            self._table.delete((key, state_window))
            self._touched.append((key, state_window))
        else:
            self._elements.set_namespace(state_window)
            self._elements.clear()

    def _on_timer(self, domain: TimeDomain, time: int, key: Any, window: Any) -> None:
        event = domain is TimeDomain.EVENT_TIME
        state_window = window
        mapping = None
        if self._merging is not None:
            mapping = self._windows_of()
            state_window = mapping.get(window)
            if state_window is None:
                return  # the window was merged into another: its timers are stale
        tctx = self._tctx
        tctx.window = window
        try:
            if event:
                result = self._trigger.on_event_time(time, window, tctx)
            else:
                result = self._trigger.on_processing_time(time, window, tctx)
            if result.fire:
                self._fire(key, window, state_window, self._timer_out)
            if result.purge:
                self._clear_contents(key, state_window)
            if event == self._event_time and time == self._cleanup_time(window):
                self._clear_all(key, window, state_window, mapping)
        except Exception as exc:
            raise UserFunctionError(f"{self.ctx.task_name} window {window}", key, exc) from exc
        finally:
            self._flush_touched()

    def _clear_all(
        self, key: Any, window: Any, state_window: Any, mapping: dict[Any, Any] | None
    ) -> None:
        self._clear_contents(key, state_window)
        tctx = self._tctx
        tctx.window = window
        self._trigger.clear(window, tctx)
        window_fn = self.window_spec.window_function or (
            self.window_spec.function if self.window_spec.kind == "process" else None
        )
        if window_fn is not None:
            self._wctx.window = window
            window_fn.clear(self._wctx)
        # Flink leaves this to clear(ctx); dropping it here too keeps a function that
        # forgets from growing state without end.
        self._wctx.states.clear(window)
        if mapping is not None:
            mapping.pop(window, None)
            self._save_windows(mapping)

    def process_watermark(self, watermark: int) -> None:
        self._timer_out.start(timed=True)
        super().process_watermark(watermark)

    def on_processing_time(self, now_ms: int) -> None:
        self._timer_out.start(timed=True)
        super().on_processing_time(now_ms)

    def flush_timer_output(self) -> None:
        self._flush_touched()
        self._timer_out.flush(self.output)
        self._side.flush()
