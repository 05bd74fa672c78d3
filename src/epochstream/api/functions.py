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
from typing import Any, Protocol

__all__ = [
    "CheckpointListener",
    "Collector",
    "FilterFunction",
    "FlatMapFunction",
    "Function",
    "KeyedProcessFunction",
    "MapFunction",
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
    """

    subtask_index: int
    parallelism: int
    max_parallelism: int
    attempt: int
    job_id: str
    task_name: str

    def get_list_state(self, state: Any) -> Any: ...

    def get_union_list_state(self, state: Any) -> Any: ...

    def get_state(self, descriptor: Any) -> Any: ...


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


class KeyedProcessFunction(Function, ABC):
    """Per-key processing with keyed state (``ctx.get_state(descriptor)``).

    ``ctx`` in ``process_element`` is the same object ``open`` received; its
    ``current_key`` is the key of ``value``, and state handles obtained from it
    (in ``open`` or later) always read and write the current key's entry.

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

    def on_timer(self, timestamp: float, ctx: Any, out: Collector) -> None:
        """A processing-time timer of ``ctx.current_key`` fired (see ``ctx.timer_service()``).

        Timers are kept in keyed state: they survive failures and follow their key on
        rescale. Example::

            def process_element(self, value, ctx, out):
                ts = ctx.timer_service()
                ts.register_processing_time_timer(ts.current_processing_time() + 60)

            def on_timer(self, timestamp, ctx, out):
                out.collect((ctx.current_key, "idle for a minute"))
        """
