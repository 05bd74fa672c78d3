"""The operator base class and the context user functions see.

Each operator gets ``process_batch(records, timestamps)`` (``timestamps`` is a list
parallel to ``records``, or ``None`` when the records carry no event time) and hands
its results to ``self.output.collect(records, timestamps)`` (side outputs:
``self.side_outputs[tag]``), an :class:`~epochstream.runtime.operator_outputs.Output`
that ``wire_chain`` set: the next chained operator or a network edge's record writer.
A keyed operator fed by a hash edge gets ``process_keyed(records, keys, timestamps)``
instead: the keys the upstream writer computed to route the records, so the key
selector runs once per record in the whole job. Watermarks arrive in
``process_watermark``: an operator with timers fires the event-time timers it reached,
then passes the watermark on (``emit_watermark``, to every output). The task calls
``on_processing_time`` as its clock moves, for processing-time timers and idleness.

Checkpointing: ``prepare_snapshot_pre_barrier(checkpoint_id)`` lets an operator emit
what it holds back (a mini-batch) before the barrier; ``snapshot(target)`` is the
synchronous part, run when the barrier is aligned; it returns a :class:`SnapshotParts`
whose keyed part (a ``SnapshotJob`` of the keyed-state backend) writes its files later
on the asynchronous snapshot thread.
All keyed state, timers included, goes through the operator's
:class:`~epochstream.state.backends.base.KeyedStateBackend`.

Example::

    op = create_operator(spec, ctx)
    op.output = ChainedOutput(next_op, produced=op.counters, consumed=next_op.counters)
    op.process_batch([1, 2, 3], None)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from epochstream.core.clock import Clock, SystemClock, wall_ms
from epochstream.core.functions import CheckpointListener, Function, OutputTag
from epochstream.core.state_descriptors import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
)
from epochstream.core.time import TimeDomain
from epochstream.exceptions import ConfigurationError, UserFunctionError
from epochstream.graph.jobgraph import OperatorSpec
from epochstream.runtime.metrics import OperatorCounters
from epochstream.runtime.operator_outputs import DISCARD, Output
from epochstream.runtime.timers import InternalTimerService, TimerService
from epochstream.state.backends.base import KeyedStateBackend, SnapshotJob, SnapshotTarget
from epochstream.state.handles import OperatorRestore
from epochstream.state.operator import OperatorStateStore

__all__ = ["Operator", "OperatorContext", "SnapshotParts"]


@dataclass
class SnapshotParts:
    """An operator's synchronous snapshot; ``keyed`` writes its files asynchronously."""

    keyed: SnapshotJob | None = None
    operator_lists: dict[str, list[Any]] = field(default_factory=dict)
    union_lists: dict[str, list[Any]] = field(default_factory=dict)


class OperatorContext:
    """The runtime context user functions see, in ``open(ctx)`` and per record.

    Per record (process functions): ``timestamp()`` of the record being processed
    (``None`` without event time), ``output(tag, value)`` to a side output, and in
    keyed functions ``current_key``, keyed state and ``timer_service()``; in
    ``on_timer`` also ``time_domain()``.

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
        clock: Clock | None = None,
        watermark_interval_ms: int = 200,
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
        self._timers: TimerService | None = None
        #: The job's clock (processing time, idleness, TTL).
        self.clock: Clock = clock or SystemClock()
        #: How often sources and ``assign_timestamps_and_watermarks`` send watermarks.
        self.watermark_interval_ms = watermark_interval_ms
        #: Console output of this subtask (print sinks); routed to the driver by the slot.
        self.console: Callable[[str], None] | None = None
        #: Endpoint and credentials of object-store checkpoint storage (state files).
        self.storage_options: dict[str, Any] | None = None
        # Per record, set by the operator running a process function.
        self._timestamp: int | None = None
        self._domain: TimeDomain | None = None
        self._side: Callable[[Any, Any], None] = self._no_side_outputs

    def clock_ms(self) -> int:
        """Processing time: int milliseconds since the epoch on the job's clock."""
        return wall_ms(self.clock)

    # per record ---------------------------------------------------------------
    def timestamp(self) -> int | None:
        """The event timestamp (int ms) of the record being processed, or of the firing
        event-time timer; ``None`` when it has none."""
        return self._timestamp

    def time_domain(self) -> TimeDomain | None:
        """In ``on_timer``: whether an event-time or a processing-time timer fired."""
        return self._domain

    def output(self, tag: OutputTag, value: Any) -> None:
        """Emit ``value`` to the side output ``tag`` (read with ``stream.get_side_output(tag)``).

        Example: ``ctx.output(late_tag, value)``
        """
        self._side(tag, value)

    def _no_side_outputs(self, tag: Any, value: Any) -> None:
        raise ConfigurationError(
            f"{self.task_name}: side outputs (ctx.output) are for process functions"
        )

    # operator state -----------------------------------------------------------
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

    # keyed access ---------------------------------------------------------------
    def _backend(self) -> KeyedStateBackend:
        if self._keyed is None:
            raise ConfigurationError(
                f"{self.task_name}: keyed state is only available after key_by()"
            )
        return self._keyed

    @property
    def current_key(self) -> Any:
        """The key of the record being processed (or of the firing timer)."""
        return self._backend().current_key

    def get_current_key(self) -> Any:
        """Flink's name for :attr:`current_key`."""
        return self.current_key

    def timer_service(self) -> TimerService:
        """Timers of the current key (keyed process functions).

        Example: ``ctx.timer_service().register_event_time_timer(ctx.timestamp() + 60_000)``
        """
        if self._timers is None:
            raise ConfigurationError(
                f"{self.task_name}: timers exist only in keyed process functions "
                "(KeyedStream.process, a keyed connect)"
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
    """Base operator: lifecycle, outputs, watermarks, timers and checkpoint hooks."""

    def __init__(self, spec: OperatorSpec, ctx: OperatorContext) -> None:
        self.spec = spec
        self.uid = spec.uid
        self.ctx = ctx
        self.operator_state: OperatorStateStore = ctx._operator_state
        self.keyed: KeyedStateBackend | None = ctx._keyed
        #: Where the main stream goes (set by ``wire_chain``; nobody reads it until then).
        self.output: Output = DISCARD
        #: Where each side output that something reads goes, by tag name.
        self.side_outputs: dict[str, Output] = {}
        self.function: Any = spec.payload
        #: Event- and processing-time timers, for operators that use them.
        self.timers: InternalTimerService | None = None
        #: The operator's metrics; the task's own once the chain is wired.
        self.counters = OperatorCounters(spec.uid, spec.name)

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

    def create_timer_service(
        self, fire: Callable[[TimeDomain, int, Any, Any], None], namespace_of: Any = None
    ) -> InternalTimerService:
        """Timers in this operator's keyed state (call in ``open``, after restore)."""
        assert self.keyed is not None
        self.timers = InternalTimerService(
            self.keyed, self.ctx.clock_ms, fire, namespace_of=namespace_of
        )
        return self.timers

    def initialize_state(self, restore: OperatorRestore | None, checkpoint_id: int | None) -> None:
        """Load restored state (before ``open``) of checkpoint ``checkpoint_id``."""
        if restore is None:
            return
        self.operator_state.restore(restore.operator_lists, restore.union_lists)
        if self.keyed is not None and restore.keyed:
            self.keyed.set_class_changes(restore.class_changes)
            self.keyed.restore(restore.keyed, checkpoint_id=checkpoint_id, owned=restore.owned)

    def open(self) -> None:
        if isinstance(self.function, Function):
            self.function.open(self.ctx)

    def process_batch(self, records: list[Any], timestamps: list[Any] | None) -> None:
        raise NotImplementedError(f"{type(self).__name__} takes no input")

    def process_keyed(
        self, records: list[Any], keys: list[Any], timestamps: list[Any] | None
    ) -> None:
        """``records`` with their keys (by this operator's key selector), as a hash edge
        delivers them. Operators that look keys up per record override it; the others
        get ``process_batch``."""
        self.process_batch(records, timestamps)

    def keys_of(self, records: list[Any]) -> list[Any]:
        """The key of each record, by this operator's key selector (input that did not
        come over a hash edge: tests, operators driven directly)."""
        key_of = self.spec.key_selector
        assert key_of is not None
        keys: list[Any] = []
        append = keys.append
        x = None
        try:
            for x in records:
                append(key_of(x))
        except Exception as exc:
            raise UserFunctionError(self.ctx.task_name, x, exc) from exc
        return keys

    def emit_watermark(self, watermark: int) -> None:
        """Send ``watermark`` on to every consumer, side outputs' included."""
        self.output.emit_watermark(watermark)
        for side in self.side_outputs.values():
            side.emit_watermark(watermark)

    def emit_status(self, idle: bool) -> None:
        """Send the input's idleness on to every consumer, side outputs' included."""
        self.output.emit_status(idle)
        for side in self.side_outputs.values():
            side.emit_status(idle)

    def process_watermark(self, watermark: int) -> None:
        """Fire the event-time timers ``watermark`` reached, then pass it on."""
        if self.timers is not None:
            self.timers.advance_watermark(watermark)
            self.flush_timer_output()
        self.emit_watermark(watermark)

    def process_status(self, idle: bool) -> None:
        """The operator's input went idle or active: pass it on."""
        self.emit_status(idle)

    def on_processing_time(self, now_ms: int) -> None:
        """The clock moved: fire due processing-time timers."""
        if self.timers is not None:
            self.timers.on_processing_time(now_ms)
            self.flush_timer_output()

    def next_processing_time(self) -> int | None:
        """When this operator next needs ``on_processing_time`` (``None``: not before
        the next record)."""
        return None if self.timers is None else self.timers.next_processing_time()

    def flush_timer_output(self) -> None:
        """Emit what timers produced (operators with timers override it)."""

    def prepare_snapshot_pre_barrier(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id``'s barrier is about to pass: emit what must come
        before it (Flink's ``prepareSnapshotPreBarrier``; a mini-batch folds its buffer).
        The task calls it on every operator of the chain, head first, before any
        :meth:`snapshot`, so what an operator emits here reaches the next one before
        that one snapshots."""

    def snapshot(self, target: SnapshotTarget) -> SnapshotParts:
        if self.timers is not None:
            self.timers.flush()
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
