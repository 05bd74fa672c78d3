"""Logical graph -> job graph: operator chains (forward edges fused) and network edges.

A forward edge whose consumer has exactly one input is *chained*: both operators
run in the same task and hand batches over by a function call. Every other edge
(rebalance, key-group hash, broadcast) becomes a :class:`JobEdge` between chains,
i.e. channels between tasks.

Example::

    jg = build_job_graph(graph, name="wc", parallelism=2, max_parallelism=128)
    [c.chain_id for c in jg.chains]   # e.g. ['source-5f0c3a9e1b', 'reduce-81d2e44c07']
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from epochstream.exceptions import ConfigurationError
from epochstream.graph.transformations import LogicalGraph, Partitioning, Transformation

__all__ = [
    "STATEFUL_KINDS",
    "ChainSpec",
    "JobEdge",
    "JobGraph",
    "OperatorSpec",
    "OutputSpec",
    "build_job_graph",
    "stateful_without_uid",
]


@dataclass(frozen=True)
class OutputSpec:
    """One output of an operator: to a chained operator (``uid``) or a network edge."""

    tag: str
    chained_uid: str | None = None
    edge_id: int | None = None


@dataclass
class OperatorSpec:
    """An operator of a chain, with the user payload (function, source or sink)."""

    uid: str
    name: str
    kind: str
    payload: Any
    key_selector: Callable[[Any], Any] | None = None
    outputs: list[OutputSpec] = field(default_factory=list)
    #: Per input, its key selector (keyed two-input operators; else None).
    input_key_selectors: list[Callable[[Any], Any]] | None = None
    #: A source's watermark strategy (None: records leave the source without timestamps).
    watermark_strategy: Any = None


@dataclass(frozen=True)
class JobEdge:
    """A network edge between two chains; every upstream subtask feeds every downstream one."""

    edge_id: int
    source_chain: str
    source_uid: str
    tag: str
    target_chain: str
    partitioning: Partitioning


@dataclass
class ChainSpec:
    """Operators fused into one task; ``operators[0]`` is the head."""

    chain_id: str
    operators: list[OperatorSpec]
    inputs: list[JobEdge] = field(default_factory=list)

    @property
    def head(self) -> OperatorSpec:
        return self.operators[0]

    @property
    def is_source(self) -> bool:
        return self.head.kind == "source"

    @property
    def name(self) -> str:
        return " -> ".join(op.name for op in self.operators)


@dataclass
class JobGraph:
    """What a slot needs to build its tasks; shipped to slots cloudpickled."""

    name: str
    chains: list[ChainSpec]
    edges: list[JobEdge]
    parallelism: int
    max_parallelism: int
    batch_size: int = 1024
    buffer_timeout: float = 0.05
    #: Milliseconds between watermarks of sources and timestamp assigners.
    auto_watermark_interval: int = 200
    #: The clock of processing time in the slots (``None``: the system clock).
    clock: Any = None

    def chain(self, chain_id: str) -> ChainSpec:
        for c in self.chains:
            if c.chain_id == chain_id:
                return c
        raise KeyError(chain_id)

    def outgoing(self, chain_id: str) -> list[JobEdge]:
        return [e for e in self.edges if e.source_chain == chain_id]

    def edge_key(self, edge: JobEdge) -> str:
        """A name for ``edge`` that holds across restarts of the same job (operator uids,
        not chain ids or edge numbers): channel state is filed under it.

        Example: ``graph.edge_key(edge)  # "map-1[] -> sum-2 #0"``
        """
        target = self.chain(edge.target_chain)
        position = next(i for i, e in enumerate(target.inputs) if e.edge_id == edge.edge_id)
        return f"{edge.source_uid}[{edge.tag}] -> {target.head.uid} #{position}"

    @property
    def operator_uids(self) -> list[str]:
        return [op.uid for c in self.chains for op in c.operators]

    def operator(self, uid: str) -> OperatorSpec:
        for c in self.chains:
            for op in c.operators:
                if op.uid == uid:
                    return op
        raise KeyError(uid)


def _is_chained(t: Transformation, graph: LogicalGraph) -> bool:
    if len(t.inputs) != 1:
        return False
    edge = t.inputs[0]
    return edge.partitioning.kind == "forward" and graph.get(edge.source_id).kind != "sink"


#: Operator kinds that keep state a restore must hand back (sources: positions;
#: sinks: pending transactions; keyed operators: keyed state).
STATEFUL_KINDS = frozenset(
    {"source", "sink", "reduce", "process", "window", "co_process", "interval_join", "deduplicate"}
)


def _assign_uids(graph: LogicalGraph) -> dict[int, str]:
    """Explicit uids as given; the others derived from the operator's place in the graph.

    An automatic uid hashes the operator's kind and name, its inputs' uids and its rank
    among operators with the same of all three (Flink derives its operator ids the same
    way), so adding or removing an operator elsewhere does not hand one operator's state
    to another. It still changes when an operator is inserted *upstream*, hence the
    warning for stateful operators without an explicit uid.
    """
    uids: dict[int, str] = {}
    seen: set[str] = set()
    ranks: dict[str, int] = {}
    for t in graph.transformations:
        uid = t.uid
        if uid is None:
            parents = ",".join(
                f"{uids[e.source_id]}:{e.tag}:{e.partitioning.kind}" for e in t.inputs
            )
            signature = f"{t.kind}|{t.name}|{parents}"
            rank = ranks.get(signature, 0)
            ranks[signature] = rank + 1
            digest = hashlib.sha256(f"{signature}|{rank}".encode()).hexdigest()[:10]
            uid = f"{t.kind}-{digest}"
        if uid in seen:
            raise ConfigurationError(f"operator uid {uid!r} is used twice; uids must be unique")
        seen.add(uid)
        uids[t.id] = uid
    return uids


def stateful_without_uid(graph: LogicalGraph) -> list[str]:
    """Names of stateful operators that rely on an automatic uid (warned at submission).

    Sinks count only when transactional (their pending transactions are state), process
    functions only when keyed.
    """
    return [
        f"{t.kind} {t.name!r}"
        for t in graph.transformations
        if t.uid is None
        and t.kind in STATEFUL_KINDS
        and (t.kind != "sink" or getattr(t.payload, "transactional", False))
        and (t.kind not in ("process", "co_process") or t.key_selector is not None)
    ]


def build_job_graph(
    graph: LogicalGraph,
    *,
    name: str,
    parallelism: int,
    max_parallelism: int,
    batch_size: int = 1024,
    buffer_timeout: float = 0.05,
    auto_watermark_interval: int = 200,
    clock: Any = None,
) -> JobGraph:
    """Fuse forward edges into chains and turn the rest into network edges."""
    if not graph.transformations:
        raise ConfigurationError("the job has no operators")
    if not any(t.kind == "sink" for t in graph.transformations):
        raise ConfigurationError("the job has no sink: add sink_to(...) or print()")
    uids = _assign_uids(graph)
    chain_of: dict[int, str] = {}
    specs: dict[int, OperatorSpec] = {}
    chains: dict[str, ChainSpec] = {}
    for t in graph.transformations:
        spec = OperatorSpec(
            uid=uids[t.id],
            name=t.name,
            kind=t.kind,
            payload=t.payload,
            key_selector=t.key_selector,
            input_key_selectors=t.input_key_selectors,
            watermark_strategy=t.watermark_strategy,
        )
        specs[t.id] = spec
        if _is_chained(t, graph):
            chain_id = chain_of[t.inputs[0].source_id]
            chains[chain_id].operators.append(spec)
        else:
            if t.kind != "source" and not t.inputs:
                raise ConfigurationError(f"operator {spec.uid} has no input")
            chain_id = spec.uid
            chains[chain_id] = ChainSpec(chain_id=chain_id, operators=[spec])
        chain_of[t.id] = chain_id

    edges: list[JobEdge] = []
    for t in graph.transformations:
        for edge in t.inputs:
            up = specs[edge.source_id]
            if _is_chained(t, graph):
                up.outputs.append(OutputSpec(tag=edge.tag, chained_uid=specs[t.id].uid))
                continue
            je = JobEdge(
                edge_id=len(edges),
                source_chain=chain_of[edge.source_id],
                source_uid=up.uid,
                tag=edge.tag,
                target_chain=chain_of[t.id],
                partitioning=edge.partitioning,
            )
            edges.append(je)
            up.outputs.append(OutputSpec(tag=edge.tag, edge_id=je.edge_id))
            chains[chain_of[t.id]].inputs.append(je)
    return JobGraph(
        name=name,
        chains=list(chains.values()),
        edges=edges,
        parallelism=parallelism,
        max_parallelism=max_parallelism,
        batch_size=batch_size,
        buffer_timeout=buffer_timeout,
        auto_watermark_interval=auto_watermark_interval,
        clock=clock,
    )
