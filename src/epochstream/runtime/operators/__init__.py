"""Stream operators: what runs inside a task, one batch at a time (see ``base``).

One module per operator family: ``basic`` (map, flat_map, filter, rolling reduce),
``columnar`` (Arrow batches: map_batches, expression filters, conversions, columnar
aggregations), ``columnar_sessions`` (columnar session and processing-time windows),
``columnar_joins`` (window and regular joins of batches), ``columnar_equi_join`` (the
SQL interval and window joins: composite keys, interval and window-end retention),
``columnar_regular_join`` (SQL's regular joins: inner and outer, changelogs, state TTL),
``columnar_window_aggregates`` (SQL window aggregations: tumble, hop, cumulate, over
event or processing time),
``columnar_window_assign`` (window table functions without aggregation),
``columnar_window_topn`` (window Top-N),
``process`` (process functions), ``timestamps`` (timestamps and watermarks),
``windows`` (window operators), ``evicting`` (windows with an evictor), ``twoinput`` (connect, joins), ``dedup``
(``deduplicate``) and ``connectors`` (source readers and sink writers).

Example::

    op = create_operator(spec, ctx)
    op.output = ChainedOutput(next_op, produced=op.counters, consumed=next_op.counters)
    op.process_batch([1, 2, 3], None)
"""

from __future__ import annotations

from epochstream.exceptions import ConfigurationError
from epochstream.graph.jobgraph import OperatorSpec
from epochstream.runtime.operators.base import Operator, OperatorContext, SnapshotParts
from epochstream.runtime.operators.basic import (
    FilterOperator,
    FlatMapOperator,
    MapOperator,
    ReduceOperator,
)
from epochstream.runtime.operators.columnar_aggregates import (
    ColumnarAggregateOperator,
    ColumnarWindowOperator,
)
from epochstream.runtime.operators.columnar_equi_join import ColumnarEquiJoinOperator
from epochstream.runtime.operators.columnar_group_aggregates import (
    ColumnarGroupAggregateOperator,
)
from epochstream.runtime.operators.columnar_joins import (
    ColumnarRegularJoinOperator,
    ColumnarWindowJoinOperator,
)
from epochstream.runtime.operators.columnar_over_aggregates import ColumnarOverAggregateOperator
from epochstream.runtime.operators.columnar_processing_windows import (
    ColumnarProcessingTimeWindowOperator,
)
from epochstream.runtime.operators.columnar_regular_join import ColumnarStreamingJoinOperator
from epochstream.runtime.operators.columnar_sessions import (
    ColumnarSessionAggregateOperator,
    ColumnarSessionOperator,
)
from epochstream.runtime.operators.columnar_top_n import ColumnarTopNOperator
from epochstream.runtime.operators.columnar_transforms import (
    FilterBatchesOperator,
    MapBatchesOperator,
    ToBatchesOperator,
    ToRowsOperator,
)
from epochstream.runtime.operators.columnar_window_aggregates import (
    ColumnarWindowAggregateOperator,
    ProcessingTimeWindowAggregateOperator,
)
from epochstream.runtime.operators.columnar_window_assign import ColumnarWindowAssignOperator
from epochstream.runtime.operators.columnar_window_topn import ColumnarWindowTopNOperator
from epochstream.runtime.operators.dedup import DeduplicateOperator
from epochstream.runtime.operators.evicting import EvictingWindowOperator
from epochstream.runtime.operators.process import KeyedProcessOperator, ProcessOperator
from epochstream.runtime.operators.timestamps import TimestampsOperator
from epochstream.runtime.operators.twoinput import (
    CoFlatMapOperator,
    CoMapOperator,
    CoProcessOperator,
    IntervalJoinOperator,
    TwoInputOperator,
)
from epochstream.runtime.operators.windows import WindowOperator

__all__ = [
    "CoFlatMapOperator",
    "CoMapOperator",
    "CoProcessOperator",
    "ColumnarAggregateOperator",
    "ColumnarEquiJoinOperator",
    "ColumnarGroupAggregateOperator",
    "ColumnarOverAggregateOperator",
    "ColumnarProcessingTimeWindowOperator",
    "ColumnarRegularJoinOperator",
    "ColumnarSessionAggregateOperator",
    "ColumnarSessionOperator",
    "ColumnarStreamingJoinOperator",
    "ColumnarTopNOperator",
    "ColumnarWindowAggregateOperator",
    "ColumnarWindowAssignOperator",
    "ColumnarWindowJoinOperator",
    "ColumnarWindowOperator",
    "ColumnarWindowTopNOperator",
    "DeduplicateOperator",
    "EvictingWindowOperator",
    "FilterBatchesOperator",
    "FilterOperator",
    "FlatMapOperator",
    "IntervalJoinOperator",
    "KeyedProcessOperator",
    "MapBatchesOperator",
    "MapOperator",
    "Operator",
    "OperatorContext",
    "ProcessOperator",
    "ProcessingTimeWindowAggregateOperator",
    "ReduceOperator",
    "SnapshotParts",
    "TimestampsOperator",
    "ToBatchesOperator",
    "ToRowsOperator",
    "TwoInputOperator",
    "WindowOperator",
    "create_operator",
]

_FACTORIES: dict[str, type[Operator]] = {
    "map": MapOperator,
    "flat_map": FlatMapOperator,
    "filter": FilterOperator,
    "reduce": ReduceOperator,
    "timestamps": TimestampsOperator,
    "window": WindowOperator,
    "co_map": CoMapOperator,
    "co_flat_map": CoFlatMapOperator,
    "co_process": CoProcessOperator,
    "interval_join": IntervalJoinOperator,
    "deduplicate": DeduplicateOperator,
    "map_batches": MapBatchesOperator,
    "filter_batches": FilterBatchesOperator,
    "to_rows": ToRowsOperator,
    "to_batches": ToBatchesOperator,
    "columnar_aggregate": ColumnarAggregateOperator,
    "columnar_window": ColumnarWindowOperator,
    "columnar_session_window": ColumnarSessionOperator,
    "columnar_session_aggregate": ColumnarSessionAggregateOperator,
    "columnar_group_aggregate": ColumnarGroupAggregateOperator,
    "columnar_processing_window": ColumnarProcessingTimeWindowOperator,
    "columnar_join": ColumnarRegularJoinOperator,
    "columnar_window_join": ColumnarWindowJoinOperator,
    "columnar_equi_join": ColumnarEquiJoinOperator,
    "columnar_regular_join": ColumnarStreamingJoinOperator,
    "columnar_window_aggregate": ColumnarWindowAggregateOperator,
    "columnar_processing_window_aggregate": ProcessingTimeWindowAggregateOperator,
    "columnar_window_assign": ColumnarWindowAssignOperator,
    "columnar_window_top_n": ColumnarWindowTopNOperator,
    "columnar_top_n": ColumnarTopNOperator,
    "columnar_over_aggregate": ColumnarOverAggregateOperator,
}


def create_operator(spec: OperatorSpec, ctx: OperatorContext) -> Operator:
    """Instantiate the runtime operator for ``spec``."""
    if spec.kind == "process":
        keyed = spec.key_selector is not None
        return KeyedProcessOperator(spec, ctx) if keyed else ProcessOperator(spec, ctx)
    if spec.kind == "window" and getattr(spec.payload, "evictor", None) is not None:
        return EvictingWindowOperator(spec, ctx)
    if spec.kind in ("source", "sink"):
        from epochstream.runtime.operators.connectors import SinkOperator, SourceOperator

        return SourceOperator(spec, ctx) if spec.kind == "source" else SinkOperator(spec, ctx)
    try:
        factory = _FACTORIES[spec.kind]
    except KeyError:
        raise ConfigurationError(f"no operator for kind {spec.kind!r}") from None
    return factory(spec, ctx)
