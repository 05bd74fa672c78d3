"""User function base classes (Flink's rich functions) and the contexts they get.

Plain callables work everywhere a function is expected; subclass these when a
function needs ``open``/``close``, operator state, or checkpoint notifications.

Example::

    class Tokenize(es.FlatMapFunction):
        def open(self, ctx):
            self.subtask = ctx.subtask_index

        def flat_map(self, line):
            return line.split()
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from epochstream.exceptions import ConfigurationError

__all__ = [
    "DEAD_LETTERS",
    "CheckpointListener",
    "CoFlatMapFunction",
    "CoMapFunction",
    "CoProcessFunction",
    "Collector",
    "FilterFunction",
    "FlatMapFunction",
    "Function",
    "KeyedCoProcessFunction",
    "KeyedProcessFunction",
    "MapFunction",
    "OutputTag",
    "ProcessFunction",
    "ProcessJoinFunction",
    "ReduceFunction",
    "RuntimeContext",
]


class RuntimeContext(Protocol):
    """What ``open(ctx)`` receives: where the function runs and access to its state.

    ``get_list_state(name)``/``get_union_list_state(name)`` give operator (non-keyed)
    list state that is snapshotted with every checkpoint and redistributed on rescale.
    Keyed functions also have ``get_state(descriptor)``, ``get_list_state(ListStateDescriptor)``,
    ``get_map_state``, ``get_reducing_state`` and ``get_aggregating_state``, scoped to
    the current key, and ``timer_service()``.

    Example::

        def open(self, ctx):
            self.count = ctx.get_state(es.state.ValueStateDescriptor("count", default=0))
    """

    subtask_index: int
    parallelism: int
    max_parallelism: int
    attempt: int
    job_id: str
    task_name: str

    def get_list_state(self, state: Any) -> Any:
        """Operator list state ``state`` (a name), or keyed list state (a descriptor)."""
        ...

    def get_union_list_state(self, state: Any) -> Any:
        """Operator list state that every subtask gets whole on restore."""
        ...

    def get_state(self, descriptor: Any) -> Any:
        """Keyed value state of the current key (keyed functions only)."""
        ...


class Function:
    """Base of every rich function: optional lifecycle hooks.

    Example::

        class Enrich(es.MapFunction):
            def open(self, ctx):
                self.table = load_lookup_table()
    """

    def open(self, ctx: RuntimeContext) -> None:
        """Called once per subtask before the first record, after state is restored."""

    def close(self) -> None:
        """Called once when the subtask ends (finished or cancelled)."""


class CheckpointListener(ABC):
    """Mixin: be told when a checkpoint completed (or was aborted).

    Example::

        class Audit(es.MapFunction, es.CheckpointListener):
            def map(self, v): return v
            def notify_checkpoint_complete(self, checkpoint_id): print("done", checkpoint_id)
    """

    @abstractmethod
    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """The checkpoint with this id is complete and durable."""

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:  # noqa: B027 - optional hook
        """The checkpoint with this id was aborted."""


class MapFunction(Function, ABC):
    """One record in, one record out. Example: ``class Upper(MapFunction): def map(self, s): return s.upper()``."""

    @abstractmethod
    def map(self, value: Any) -> Any:
        """Transform one record."""


class FlatMapFunction(Function, ABC):
    """One record in, any number out. Example: ``def flat_map(self, line): return line.split()``."""

    @abstractmethod
    def flat_map(self, value: Any) -> Iterable[Any]:
        """Return an iterable of output records."""


class FilterFunction(Function, ABC):
    """Keep records for which ``filter`` is true. Example: ``def filter(self, n): return n % 2 == 0``."""

    @abstractmethod
    def filter(self, value: Any) -> bool:
        """True to keep the record."""


class ReduceFunction(Function, ABC):
    """Combine two values of the same key. Example: ``def reduce(self, a, b): return a + b``."""

    @abstractmethod
    def reduce(self, a: Any, b: Any) -> Any:
        """Return the combination of ``a`` (accumulated) and ``b`` (new)."""


class Collector:
    """Where a process function emits records: ``out.collect(value)``.

    Example::

        def process_element(self, value, ctx, out):
            out.collect(value)
    """

    __slots__ = ("collect",)

    def __init__(self, sink: Callable[[Any], None]) -> None:
        self.collect = sink


@dataclass(frozen=True)
class OutputTag:
    """Names a side output: ``ctx.output(tag, value)`` in a process function (or late
    records of a window), read with ``stream.get_side_output(tag)``.

    Example::

        late = es.OutputTag("late")
        counts = windowed.side_output_late_data(late).sum(1)
        counts.get_side_output(late).print()
    """

    name: str

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or self.name in _RESERVED_TAGS:
            raise ConfigurationError(
                f"an OutputTag needs a non-empty name other than {sorted(_RESERVED_TAGS)}, "
                f"got {self.name!r}"
            )


#: Output names the runtime uses itself.
_RESERVED_TAGS = frozenset({"main", "dead_letter"})


def _reserved_tag(name: str) -> OutputTag:
    tag = object.__new__(OutputTag)
    object.__setattr__(tag, "name", name)
    return tag


#: The side output of records a source could not read, each a dict naming the place
#: (``file``, ``offset`` or ``row_group``, ``error``, ``line``). Example::
#:
#:     stream = env.from_files("in/", format="jsonl", on_error="dead_letter")
#:     stream.get_side_output(es.DEAD_LETTERS).sink_to(es.sinks.FileSink("bad/"))
DEAD_LETTERS: OutputTag = _reserved_tag("dead_letter")


class ProcessFunction(Function, ABC):
    """The most general per-record function on a (non-keyed) stream.

    ``ctx.timestamp()`` is the record's event timestamp (or ``None``);
    ``ctx.output(tag, value)`` emits to a side output. Timers need a keyed stream
    (:class:`KeyedProcessFunction`).

    Example::

        class Split(es.ProcessFunction):
            def process_element(self, value, ctx, out):
                if value < 0:
                    ctx.output(NEGATIVE, value)
                else:
                    out.collect(value)
    """

    @abstractmethod
    def process_element(self, value: Any, ctx: Any, out: Collector) -> None:
        """Handle one record."""


class KeyedProcessFunction(Function, ABC):
    """Per-key processing with keyed state (``ctx.get_state(descriptor)``) and timers.

    ``ctx`` in ``process_element`` is the same object ``open`` received; its
    ``current_key`` is the key of ``value``, ``timestamp()`` its event timestamp, and
    state handles obtained from it (in ``open`` or later) always read and write the
    current key's entry. Outputs get the input record's timestamp.

    Example::

        class Count(es.KeyedProcessFunction):
            def open(self, ctx):
                self.count = ctx.get_state(es.state.ValueStateDescriptor("n", default=0))

            def process_element(self, value, ctx, out):
                self.count.update(self.count.value() + 1)
                out.collect((ctx.current_key, self.count.value()))
    """

    @abstractmethod
    def process_element(self, value: Any, ctx: Any, out: Collector) -> None:
        """Handle one record of the current key."""

    def on_timer(self, timestamp: int, ctx: Any, out: Collector) -> None:
        """A timer of ``ctx.current_key`` fired (see ``ctx.timer_service()``).

        ``ctx.time_domain()`` says which kind; outputs of an event-time timer get
        ``timestamp`` as their timestamp. Timers are kept in keyed state: they survive
        failures, are in savepoints and follow their key on rescale. Example::

            def process_element(self, value, ctx, out):
                ctx.timer_service().register_event_time_timer(ctx.timestamp() + 60_000)

            def on_timer(self, timestamp, ctx, out):
                out.collect((ctx.current_key, "no event for a minute"))
        """


class CoMapFunction(Function, ABC):
    """A map over two connected streams: ``map1`` for the first, ``map2`` for the second.

    Example::

        class Tag(es.CoMapFunction):
            def map1(self, value): return ("left", value)
            def map2(self, value): return ("right", value)
    """

    @abstractmethod
    def map1(self, value: Any) -> Any:
        """Transform a record of the first input."""

    @abstractmethod
    def map2(self, value: Any) -> Any:
        """Transform a record of the second input."""


class CoFlatMapFunction(Function, ABC):
    """A flat_map over two connected streams. Example: ``def flat_map1(self, v): return [v]``."""

    @abstractmethod
    def flat_map1(self, value: Any) -> Iterable[Any]:
        """Outputs for a record of the first input."""

    @abstractmethod
    def flat_map2(self, value: Any) -> Iterable[Any]:
        """Outputs for a record of the second input."""


class CoProcessFunction(Function, ABC):
    """A process function over two connected (non-keyed) streams.

    Example::

        class Merge(es.CoProcessFunction):
            def process_element1(self, value, ctx, out): out.collect(value)
            def process_element2(self, value, ctx, out): ctx.output(OTHER, value)
    """

    @abstractmethod
    def process_element1(self, value: Any, ctx: Any, out: Collector) -> None:
        """Handle a record of the first input."""

    @abstractmethod
    def process_element2(self, value: Any, ctx: Any, out: Collector) -> None:
        """Handle a record of the second input."""


class KeyedCoProcessFunction(Function, ABC):
    """A process function over two streams keyed alike: state and timers of the current
    key are shared by both inputs.

    Example::

        class Enrich(es.KeyedCoProcessFunction):
            def open(self, ctx):
                self.profile = ctx.get_state(es.state.ValueStateDescriptor("profile"))
            def process_element1(self, click, ctx, out):
                out.collect((click, self.profile.value()))
            def process_element2(self, profile, ctx, out):
                self.profile.update(profile)
    """

    @abstractmethod
    def process_element1(self, value: Any, ctx: Any, out: Collector) -> None:
        """Handle a record of the first input (its key is current)."""

    @abstractmethod
    def process_element2(self, value: Any, ctx: Any, out: Collector) -> None:
        """Handle a record of the second input (its key is current)."""

    def on_timer(self, timestamp: int, ctx: Any, out: Collector) -> None:
        """A timer of ``ctx.current_key`` fired (as in :class:`KeyedProcessFunction`)."""


class ProcessJoinFunction(Function, ABC):
    """Called for each matching pair of an interval join.

    ``ctx.left_timestamp()``, ``ctx.right_timestamp()`` and ``ctx.timestamp()`` (the
    larger of the two, which the output gets) are available.

    Example::

        class Pair(es.ProcessJoinFunction):
            def process_element(self, left, right, ctx, out):
                out.collect((left, right))
    """

    @abstractmethod
    def process_element(self, left: Any, right: Any, ctx: Any, out: Collector) -> None:
        """Handle one joined pair."""
