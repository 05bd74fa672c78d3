"""SQL plans as DataStreams: each node of a physical plan (:mod:`epochstream.sql.plan`)
becomes the DataStream call a hand-written columnar job would make, with the node's
uid and the SQL it computes as the operator name. So a SQL job is an ordinary job:
the same operators, checkpoints, savepoints, rescaling, metrics and dashboard.

Example::

    stream = build_stream(env, planner.plan_query(select))
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from epochstream.api.columnar_joins import equi_join
from epochstream.api.datastream import DataStream, DataStreamSink
from epochstream.graph.specs import SessionAggregateSpec, WindowTvf
from epochstream.graph.windowing import (
    CumulativeEventTimeWindows,
    EventTimeSessionWindows,
    SlidingEventTimeWindows,
    SlidingProcessingTimeWindows,
    TumblingEventTimeWindows,
    TumblingProcessingTimeWindows,
    WindowAssigner,
)
from epochstream.sql.connectors import source_binding
from epochstream.sql.plan import (
    CalcNode,
    GroupAggregateNode,
    JoinNode,
    OverAggregateNode,
    PlanNode,
    ScanNode,
    SinkNode,
    StreamScanNode,
    TopNNode,
    UnionNode,
    WindowAggregateNode,
    WindowAssignNode,
    WindowTopNNode,
)

if TYPE_CHECKING:
    from epochstream.api.environment import Environment

__all__ = ["StreamBuilder"]


class StreamBuilder:
    """Builds the DataStreams of one job's plans. Nodes with the same uid compute the
    same thing from the same inputs, so each uid is built once: a source shared by the
    INSERTs of a statement set, or a subquery written twice (Nexmark q5's two HOP
    counts), runs once and feeds both (Flink's sub-plan reuse).

    Example: ``StreamBuilder(env).sink(sink_node)``
    """

    def __init__(self, env: Environment) -> None:
        self.env = env
        self._built: dict[str, DataStream] = {}

    def stream(self, node: PlanNode) -> DataStream:
        """The columnar DataStream of ``node``'s output."""
        built = self._built.get(node.uid)
        if built is None:
            built = self._build(node)
            self._built[node.uid] = built
        return built

    def sink(self, node: SinkNode) -> DataStreamSink:
        """Write ``node``'s input into its table's sink."""
        stream = self.stream(node.inputs[0])
        if not node.binding.takes_batches:
            stream = stream.to_rows()
        return stream.sink_to(node.binding.sink).name(node.label).uid(node.uid)

    def _build(self, node: PlanNode) -> DataStream:
        if isinstance(node, ScanNode):
            return self._scan(node)
        if isinstance(node, StreamScanNode):
            stream: DataStream = node.table.stream
            return stream
        if isinstance(node, CalcNode):
            return (
                self.stream(node.inputs[0]).map_batches(node.program).name(node.label).uid(node.uid)
            )
        if isinstance(node, WindowAggregateNode):
            return self._window_aggregate(node)
        if isinstance(node, GroupAggregateNode):
            grouped: Any = self.stream(node.inputs[0]).key_by(list(node.spec.keys))
            result: DataStream = grouped.aggregate(
                *node.spec.aggs,
                updating_input=node.spec.updating_input,
                mini_batch=node.spec.mini_batch,
                state_ttl_ms=node.spec.state_ttl_ms,
            )
            return result.name(node.label).uid(node.uid)
        if isinstance(node, JoinNode):
            left, right = (self.stream(i) for i in node.inputs)
            return equi_join(left, right, node.spec, name=node.label).uid(node.uid)
        if isinstance(node, WindowAssignNode):
            assigned = self.stream(node.inputs[0]).window_assign(node.window)
            return assigned.name(node.label).uid(node.uid)
        if isinstance(node, WindowTopNNode):
            keyed: Any = self.stream(node.inputs[0]).key_by(list(node.partition))
            order = [
                (column, "desc" if descending else "asc") for column, descending, _ in node.order
            ]
            ranked: DataStream = keyed.window_top_n(
                node.n, order_by=order, rank_column=node.rank_column
            )
            return ranked.name(node.label).uid(node.uid)
        if isinstance(node, TopNNode):
            partitioned: Any = self.stream(node.inputs[0]).key_by(list(node.partition))
            order = [
                (column, "desc" if descending else "asc") for column, descending, _ in node.order
            ]
            top: DataStream = (
                partitioned.top_n(
                    node.n,
                    order_by=order,
                    rank_column=node.rank_column,
                    state_ttl_ms=node.state_ttl_ms,
                )
                if order
                else partitioned.keep_first(state_ttl_ms=node.state_ttl_ms)
            )
            return top.name(node.label).uid(node.uid)
        if isinstance(node, OverAggregateNode):
            spec = node.spec
            over: Any = self.stream(node.inputs[0]).key_by(list(spec.partition_by))
            aggregated: DataStream = over.over_aggregate(
                *spec.aggs, frame=spec.frame, preceding=spec.preceding, proctime=spec.proctime
            )
            return aggregated.name(node.label).uid(node.uid)
        if isinstance(node, UnionNode):
            first, *others = (self.stream(i) for i in node.inputs)
            return first.union(*others)
        raise TypeError(f"no DataStream for plan node {type(node).__name__}")

    def _scan(self, node: ScanNode) -> DataStream:
        binding = source_binding(node.table, list(node.columns), batch_size=65_536)
        stream = self.env.from_source(
            binding.source, name=node.label, watermark_strategy=binding.watermark_strategy
        ).uid(node.uid)
        if binding.rows_schema is not None:
            stream = stream.to_batches(binding.rows_schema).uid(node.uid + "-batches")
        return (
            stream.map_batches(binding.adapter)
            .name(f"{node.label}: columns")
            .uid(node.uid + "-columns")
        )

    def _window_aggregate(self, node: WindowAggregateNode) -> DataStream:
        spec = node.spec
        assigner: WindowAssigner
        if isinstance(spec, SessionAggregateSpec):
            assigner = EventTimeSessionWindows.with_gap(spec.gap)
        else:
            assigner = _assigner(spec.window, proctime=spec.proctime)
        keyed: Any = self.stream(node.inputs[0]).key_by(list(spec.keys))
        result: DataStream = keyed.window(assigner).aggregate(*spec.aggs)
        return result.name(node.label).uid(node.uid)


def _assigner(window: WindowTvf, *, proctime: bool) -> WindowAssigner:
    """The DataStream window assigner of a TUMBLE, HOP or CUMULATE window."""
    if proctime and window.kind == "tumble":
        return TumblingProcessingTimeWindows.of(window.size, window.offset)
    if proctime and window.kind == "hop":
        return SlidingProcessingTimeWindows.of(window.size, window.slide, window.offset)
    if window.kind == "tumble":
        return TumblingEventTimeWindows.of(window.size, window.offset)
    if window.kind == "hop":
        return SlidingEventTimeWindows.of(window.size, window.slide, window.offset)
    return CumulativeEventTimeWindows.of(window.size, window.step, window.offset)
