"""The logical graph the API builds: one :class:`Transformation` per operator call.

Example::

    g = LogicalGraph()
    src = g.add("source", "numbers", payload=SequenceSource(0, 10))
    g.add("map", "double", payload=lambda x: 2 * x, inputs=[Edge(src.id)])
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from epochstream.exceptions import ConfigurationError

__all__ = [
    "COLUMNAR_BACKEND_KINDS",
    "COLUMNAR_OUTPUT_KINDS",
    "KINDS",
    "TWO_INPUT_KINDS",
    "ColumnKey",
    "ColumnKeys",
    "Edge",
    "LogicalGraph",
    "Partitioning",
    "Transformation",
    "describe_callable",
]

#: Keyed columnar kinds: their state is in the keyed-state backend (column tables for
#: aggregations and windows, row tables for session windows and joins).
COLUMNAR_BACKEND_KINDS = frozenset(
    {
        "columnar_aggregate",
        "columnar_window",
        "columnar_processing_window",
        "columnar_session_window",
        "columnar_session_aggregate",
        "columnar_group_aggregate",
        "columnar_join",
        "columnar_window_join",
        "columnar_equi_join",
        "columnar_regular_join",
        "columnar_window_aggregate",
        "columnar_processing_window_aggregate",
        "columnar_window_top_n",
        "columnar_top_n",
        "columnar_over_aggregate",
    }
)
#: Kinds whose output is columnar (Arrow record batches).
COLUMNAR_OUTPUT_KINDS = (
    frozenset({"map_batches", "filter_batches", "to_batches", "columnar_window_assign"})
    | COLUMNAR_BACKEND_KINDS
)
#: Kinds that need a keyed input (key-group hash partitioning and a key selector).
KEYED_KINDS = (
    frozenset({"reduce", "window", "interval_join", "deduplicate"}) | COLUMNAR_BACKEND_KINDS
)
#: Operator kinds the runtime knows how to run.
KINDS = (
    frozenset(
        {
            "source",
            "map",
            "flat_map",
            "filter",
            "process",
            "timestamps",
            "co_map",
            "co_flat_map",
            "co_process",
            "sink",
            "to_rows",
        }
    )
    | KEYED_KINDS
    | COLUMNAR_OUTPUT_KINDS
)
#: Kinds with exactly two inputs (first and second stream).
TWO_INPUT_KINDS = frozenset(
    {
        "co_map",
        "co_flat_map",
        "co_process",
        "interval_join",
        "columnar_join",
        "columnar_window_join",
        "columnar_equi_join",
        "columnar_regular_join",
    }
)


def describe_callable(fn: Any) -> str:
    """A user function's name and where it is defined, for error messages.

    Example::

        describe_callable(lambda r: r[0])   # "<lambda> (job.py:12)"
    """
    target = getattr(fn, "__func__", fn)
    name = getattr(target, "__qualname__", None) or type(fn).__qualname__
    code = getattr(target, "__code__", None)
    if code is None and callable(fn):  # a callable object: name where its class is defined
        code = getattr(type(fn).__call__, "__code__", None)
    if code is None:
        return name
    return f"{name} ({code.co_filename.rsplit('/', 1)[-1]}:{code.co_firstlineno})"


@dataclass(frozen=True)
class ColumnKey:
    """The key selector of ``key_by("column")``: a column of a columnar stream.

    Columnar batches are routed by the whole column at once (its key groups equal the
    row path's for the same values); called on one row (a dict, after ``to_rows()``),
    it returns that row's field, so the same key reaches the same subtask either way.

    Example::

        ColumnKey("user")({"user": "u7", "n": 1}) == "u7"
    """

    column: str

    def __call__(self, record: Any) -> Any:
        return record[self.column]


@dataclass(frozen=True)
class ColumnKeys:
    """The key selector of ``key_by(["a", "b"])``: the tuple of several columns' values
    (none: one key ``()`` for every row, a global aggregation's).

    Batches are routed by the key groups of the tuples (``key_groups_of_columns``),
    equal to the row path's for the same tuple key; called on one row it returns the
    tuple. ``key_by(["a"])`` is ``key_by("a")`` (a :class:`ColumnKey`).

    Example::

        ColumnKeys(("auction", "bidder"))({"auction": 1, "bidder": 7, "price": 5}) == (1, 7)
    """

    columns: tuple[str, ...]

    def __call__(self, record: Any) -> Any:
        return tuple(record[c] for c in self.columns)


@dataclass(frozen=True)
class Partitioning:
    """How records move along an edge: forward, rebalance, hash (key groups) or broadcast."""

    kind: str = "forward"
    key_selector: Callable[[Any], Any] | None = None
    #: The key selector's :func:`describe_callable`, taken where the job is built: a
    #: function shipped to the slots by value may lose its file name on the way
    #: (cloudpickle 3.1.3 names its code ``<dynamic-code>``), and errors should name it.
    selector_label: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if self.kind not in ("forward", "rebalance", "hash", "broadcast"):
            raise ConfigurationError(f"unknown partitioning {self.kind!r}")
        if self.kind == "hash" and self.key_selector is None:
            raise ConfigurationError("hash partitioning needs a key selector")
        if self.key_selector is not None and not self.selector_label:
            object.__setattr__(self, "selector_label", describe_callable(self.key_selector))


@dataclass(frozen=True)
class Edge:
    """An input of a transformation: upstream id, partitioning, and the upstream output tag."""

    source_id: int
    partitioning: Partitioning = field(default_factory=Partitioning)
    tag: str = "main"


@dataclass
class Transformation:
    """One operator in the logical graph."""

    id: int
    kind: str
    name: str
    payload: Any
    inputs: list[Edge] = field(default_factory=list)
    uid: str | None = None
    #: A source's watermark strategy (``from_source(..., watermark_strategy=)``).
    watermark_strategy: Any = None
    #: Its output is columnar (Arrow record batches) rather than rows.
    columnar: bool = False

    @property
    def key_selector(self) -> Callable[[Any], Any] | None:
        for edge in self.inputs:
            if edge.partitioning.kind == "hash":
                return edge.partitioning.key_selector
        return None

    @property
    def input_key_selectors(self) -> list[Callable[[Any], Any]] | None:
        """Per input, its key selector, when every input is keyed (keyed two-input operators)."""
        selectors = [e.partitioning.key_selector for e in self.inputs]
        if self.kind in TWO_INPUT_KINDS and all(e.partitioning.kind == "hash" for e in self.inputs):
            return selectors  # type: ignore[return-value]
        return None


class LogicalGraph:
    """An append-only list of transformations, in creation order (a topological order)."""

    def __init__(self) -> None:
        self.transformations: list[Transformation] = []

    def add(
        self, kind: str, name: str, *, payload: Any, inputs: list[Edge] | None = None
    ) -> Transformation:
        """Append a transformation and return it."""
        if kind not in KINDS:
            raise ConfigurationError(f"unknown operator kind {kind!r}")
        t = Transformation(
            id=len(self.transformations),
            kind=kind,
            name=name,
            payload=payload,
            inputs=list(inputs or []),
        )
        if kind in KEYED_KINDS and t.key_selector is None:
            raise ConfigurationError(f"{kind} needs a keyed stream: call key_by() first")
        if kind in TWO_INPUT_KINDS and len(t.inputs) != 2:
            raise ConfigurationError(f"{kind} needs exactly two inputs")
        self.transformations.append(t)
        return t

    def get(self, tid: int) -> Transformation:
        return self.transformations[tid]

    def consumers(self, tid: int) -> list[tuple[Transformation, Edge]]:
        """Transformations that read ``tid``'s output, with the edge they read it by."""
        return [(t, e) for t in self.transformations for e in t.inputs if e.source_id == tid]
