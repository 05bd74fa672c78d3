"""Stream operators: what runs inside a task, one batch at a time.

Each operator gets ``process_batch(batch)`` and hands its results to ``emit`` (the
next chained operator's ``process_batch`` or a record writer). The per-record work
is the user's function plus, for keyed operators, one dict lookup of state: no
locks, no syscalls.

Checkpointing: ``snapshot(target)`` is the synchronous part, run when the barrier is
aligned; it returns a :class:`SnapshotParts` whose keyed part (a ``SnapshotJob`` of
the keyed-state backend) writes its files later on the asynchronous snapshot thread.
All keyed state, built-in reduce and timers included, goes through the operator's
:class:`~epochstream.state.backends.base.KeyedStateBackend`.

Example::

    op = create_operator(spec, ctx)
    op.emit = print
    op.process_batch([1, 2, 3])
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from epochstream.api.functions import (
    CheckpointListener,
    Collector,
    FilterFunction,
    FlatMapFunction,
    Function,
    MapFunction,
    ReduceFunction,
)
from epochstream.exceptions import ConfigurationError, UserFunctionError
from epochstream.graph.jobgraph import OperatorSpec
from epochstream.runtime.timers import TimerService
from epochstream.state.backends.base import KeyedStateBackend, SnapshotJob, SnapshotTarget
from epochstream.state.descriptors import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    ValueStateDescriptor,
)
from epochstream.state.handles import OperatorRestore
from epochstream.state.operator import OperatorStateStore

__all__ = ["Operator", "OperatorContext", "SnapshotParts", "create_operator"]

_MISSING = object()


def _discard(batch: list[Any]) -> None:
    """Default emit of an operator whose output nobody reads."""


@dataclass
class SnapshotParts:
    """An operator's synchronous snapshot; ``keyed`` writes its files asynchronously."""

    keyed: SnapshotJob | None = None
    operator_lists: dict[str, list[Any]] = field(default_factory=dict)
    union_lists: dict[str, list[Any]] = field(default_factory=dict)


class OperatorContext:
    """The runtime context user functions see in ``open(ctx)``.

    Example::

        def open(self, ctx):
            self.seen = ctx.get_list_state("seen")   # operator list state
    """

    def __init__(
        self,
        *,
        subtask_index: int,
        parallelism: int,
        max_parallelism: int,
        attempt: int,
        job_id: str,
        task_name: str,
        operator_state: OperatorStateStore,
        keyed_backend: KeyedStateBackend | None = None,
        checkpointing: bool = False,
    ) -> None:
        self.checkpointing = checkpointing
        self.subtask_index = subtask_index
        self.parallelism = parallelism
        self.max_parallelism = max_parallelism
        self.attempt = attempt
        self.job_id = job_id
        self.task_name = task_name
        self._operator_state = operator_state
        self._keyed = keyed_backend
        self._timers: Any = None
        #: Console output of this subtask (print sinks); routed to the driver by the slot.
        self.console: Callable[[str], None] | None = None

    def get_list_state(self, state: str | ListStateDescriptor) -> Any:
        """List state, following Flink's rules.

        In a keyed function (after ``key_by``) a :class:`ListStateDescriptor` gives
        *keyed* list state of the current key. A plain name, or a descriptor in a
        non-keyed function, gives operator list state: one list per subtask,
        redistributed round-robin on rescale.
        """
        if isinstance(state, ListStateDescriptor):
            if self._keyed is not None:
                return self._keyed.get_state(state)
            return self._operator_state.get_list_state(state.name)
        return self._operator_state.get_list_state(state)

    def get_union_list_state(self, state: str | ListStateDescriptor) -> Any:
        """Operator union list state: every subtask gets all entries on restore."""
        name = state.name if isinstance(state, ListStateDescriptor) else state
        return self._operator_state.get_union_list_state(name)

    # keyed access ------------------------------------------------------------
    def _backend(self) -> KeyedStateBackend:
        if self._keyed is None:
            raise ConfigurationError(
                f"{self.task_name}: keyed state is only available after key_by()"
            )
        return self._keyed

    @property
    def current_key(self) -> Any:
        """The key of the record being processed."""
        return self._backend().current_key

    def timer_service(self) -> Any:
        """Processing-time timers of the current key (keyed process functions only).

        Example: ``ctx.timer_service().register_processing_time_timer(ts)``
        """
        if self._timers is None:
            raise ConfigurationError(
                f"{self.task_name}: timers exist only in KeyedStream.process()"
            )
        return self._timers

    def get_state(self, descriptor: StateDescriptor) -> Any:
        """Keyed state for any descriptor (value, list, map, reducing, aggregating)."""
        return self._backend().get_state(descriptor)

    def get_map_state(self, descriptor: MapStateDescriptor) -> Any:
        """Keyed map state of the current key."""
        return self._backend().get_state(descriptor)

    def get_reducing_state(self, descriptor: ReducingStateDescriptor) -> Any:
        """Keyed reducing state of the current key."""
        return self._backend().get_state(descriptor)

    def get_aggregating_state(self, descriptor: AggregatingStateDescriptor) -> Any:
        """Keyed aggregating state of the current key."""
        return self._backend().get_state(descriptor)


class Operator:
    """Base operator: lifecycle, operator state and checkpoint hooks."""

    def __init__(self, spec: OperatorSpec, ctx: OperatorContext) -> None:
        self.spec = spec
        self.uid = spec.uid
        self.ctx = ctx
        self.operator_state: OperatorStateStore = ctx._operator_state
        self.keyed: KeyedStateBackend | None = ctx._keyed
        self.emit: Callable[[list[Any]], None] = _discard
        self.side_emits: dict[str, Callable[[list[Any]], None]] = {}
        self.function: Any = spec.payload

    def _per_record(self, fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
        """``fn`` as is on a plain stream; on a keyed stream, ``fn`` with its record's key
        set as current first, so a rich function can use keyed state."""
        if self.keyed is None:
            return fn
        assert self.spec.key_selector is not None
        key_of, set_key = self.spec.key_selector, self.keyed.set_current_key

        def keyed(value: Any) -> Any:
            set_key(key_of(value))
            return fn(value)

        return keyed

    def initialize_state(self, restore: OperatorRestore | None, checkpoint_id: int | None) -> None:
        """Load restored state (before ``open``) of checkpoint ``checkpoint_id``."""
        if restore is None:
            return
        self.operator_state.restore(restore.operator_lists, restore.union_lists)
        if self.keyed is not None and restore.keyed:
            self.keyed.restore(restore.keyed, checkpoint_id=checkpoint_id, owned=restore.owned)

    def open(self) -> None:
        if isinstance(self.function, Function):
            self.function.open(self.ctx)

    def process_batch(self, batch: list[Any]) -> None:
        raise NotImplementedError(f"{type(self).__name__} takes no input")

    def snapshot(self, target: SnapshotTarget) -> SnapshotParts:
        lists, unions = self.operator_state.snapshot()
        keyed = self.keyed.snapshot(target) if self.keyed is not None else None
        return SnapshotParts(keyed=keyed, operator_lists=lists, union_lists=unions)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        if self.keyed is not None:
            self.keyed.notify_checkpoint_complete(checkpoint_id)
        if isinstance(self.function, CheckpointListener):
            self.function.notify_checkpoint_complete(checkpoint_id)

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        if isinstance(self.function, CheckpointListener):
            self.function.notify_checkpoint_aborted(checkpoint_id)

    def end_input(self) -> None:
        """All input ended (bounded streams)."""

    def close(self) -> None:
        try:
            if isinstance(self.function, Function):
                self.function.close()
        finally:
            if self.keyed is not None:
                self.keyed.dispose()


# The per-record loops below are plain ``for`` loops rather than comprehensions: when a
# user function raises, the loop variable still holds the record, so the error can
# name it at no cost on the normal path.


class MapOperator(Operator):
    def process_batch(self, batch: list[Any]) -> None:
        fn = self._per_record(
            self.function.map if isinstance(self.function, MapFunction) else self.function
        )
        out: list[Any] = []
        append = out.append
        x = None
        try:
            for x in batch:
                append(fn(x))
        except Exception as exc:
            raise UserFunctionError(self.ctx.task_name, x, exc) from exc
        self.emit(out)


class FlatMapOperator(Operator):
    def process_batch(self, batch: list[Any]) -> None:
        fn = self._per_record(
            self.function.flat_map if isinstance(self.function, FlatMapFunction) else self.function
        )
        out: list[Any] = []
        extend = out.extend
        x = None
        try:
            for x in batch:
                extend(fn(x))
        except Exception as exc:
            raise UserFunctionError(self.ctx.task_name, x, exc) from exc
        if out:
            self.emit(out)


class FilterOperator(Operator):
    def process_batch(self, batch: list[Any]) -> None:
        fn = self._per_record(
            self.function.filter if isinstance(self.function, FilterFunction) else self.function
        )
        out: list[Any] = []
        append = out.append
        x = None
        try:
            for x in batch:
                if fn(x):
                    append(x)
        except Exception as exc:
            raise UserFunctionError(self.ctx.task_name, x, exc) from exc
        if out:
            self.emit(out)


class ReduceOperator(Operator):
    """Rolling reduce: one value per key, the updated value emitted per record.

    The per-key values live in a backend value table; the keys written are declared
    to it once per batch (``touched``), which keeps the loop to one lookup and one
    store per record.
    """

    STATE = ValueStateDescriptor("_reduce")

    def open(self) -> None:
        super().open()
        assert self.keyed is not None
        self._table = self.keyed.value_table(self.STATE)
        fn = self.function
        self._fn = fn.reduce if isinstance(fn, ReduceFunction) else fn
        selector = self.spec.key_selector
        assert selector is not None
        self._key = selector

    def process_batch(self, batch: list[Any]) -> None:
        key_of = self._key
        table = self._table
        get = table.get
        fn = self._fn
        out: list[Any] = []
        append = out.append
        keys: list[Any] = []
        remember = keys.append
        x = None
        try:
            for x in batch:
                k = key_of(x)
                remember(k)
                cur = get(k, _MISSING)
                if cur is not _MISSING:
                    table[k] = cur = fn(cur, x)
                    append(cur)
                else:
                    table[k] = x
                    append(x)
        except Exception as exc:
            raise UserFunctionError(self.ctx.task_name, x, exc) from exc
        finally:
            table.touched(keys)
        self.emit(out)


class KeyedProcessOperator(Operator):
    """Runs a KeyedProcessFunction with the backend's current key set per record."""

    def open(self) -> None:
        assert self.keyed is not None and self.spec.key_selector is not None
        # Before the user's open(): it may register timers or ask for the service.
        self.timers = TimerService(self.keyed)
        self.ctx._timers = self.timers
        super().open()
        self._key = self.spec.key_selector
        self._collector = Collector(_discard)

    def fire_timers(self, now: float) -> None:
        """Call ``on_timer`` for every due timer, each with its key set as current."""
        due = self.timers.pop_due(now)
        if not due:
            return
        out: list[Any] = []
        self._collector.collect = out.append
        backend = self.keyed
        assert backend is not None
        on_timer = self.function.on_timer
        ts = 0.0
        try:
            for ts, key in due:
                backend.set_current_key(key)
                on_timer(ts, self.ctx, self._collector)
        except Exception as exc:
            raise UserFunctionError(f"{self.ctx.task_name} on_timer", ts, exc) from exc
        if out:
            self.emit(out)

    def process_batch(self, batch: list[Any]) -> None:
        out: list[Any] = []
        collector = self._collector
        collector.collect = out.append
        key_of = self._key
        backend = self.keyed
        assert backend is not None
        set_key = backend.set_current_key
        process = self.function.process_element
        ctx = self.ctx
        x = None
        try:
            for x in batch:
                set_key(key_of(x))
                process(x, ctx, collector)
        except Exception as exc:
            raise UserFunctionError(self.ctx.task_name, x, exc) from exc
        if out:
            self.emit(out)


_FACTORIES: dict[str, type[Operator]] = {
    "map": MapOperator,
    "flat_map": FlatMapOperator,
    "filter": FilterOperator,
    "reduce": ReduceOperator,
    "process": KeyedProcessOperator,
}


def create_operator(spec: OperatorSpec, ctx: OperatorContext) -> Operator:
    """Instantiate the runtime operator for ``spec`` (sources and sinks: see connector_ops)."""
    if spec.kind in ("source", "sink"):
        from epochstream.runtime.connector_ops import SinkOperator, SourceOperator

        return SourceOperator(spec, ctx) if spec.kind == "source" else SinkOperator(spec, ctx)
    try:
        factory = _FACTORIES[spec.kind]
    except KeyError:
        raise ConfigurationError(f"no operator for kind {spec.kind!r}") from None
    return factory(spec, ctx)
