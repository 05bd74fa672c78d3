"""epochstream: Flink's exactly-once stream processing model in Python, on Apache Spark.

Example::

    import epochstream as es

    env = es.Environment(parallelism=2)
    env.enable_checkpointing(interval=1.0, storage="checkpoints", mode="exactly_once")
    (env.from_text_file("book.txt")
        .flat_map(str.split)
        .map(lambda w: (w.lower(), 1))
        .key_by(lambda t: t[0])
        .reduce(lambda a, b: (a[0], a[1] + b[1]))
        .sink_to(es.sinks.FileSink("out/", format="jsonl")))
    result = env.execute("wordcount")
"""

import importlib
import warnings
from typing import Any

from epochstream import agg, restart, savepoint, sinks, sources, sql, state, testing
from epochstream.api.columnar_joins import ColumnarJoinedStreams
from epochstream.api.columnar_keyed import ColumnarKeyedStream
from epochstream.api.columnar_windows import ColumnarWindowedStream
from epochstream.api.datastream import DataStream, DataStreamSink, KeyedStream
from epochstream.api.environment import Environment, set_default_launcher
from epochstream.api.joins import ConnectedStreams, IntervalJoin, JoinedStreams, JoinFunction
from epochstream.api.windowed import WindowedStream
from epochstream.core.checkpoint_config import CheckpointConfig
from epochstream.core.checkpoint_stats import CheckpointStats
from epochstream.core.functions import (
    DEAD_LETTERS,
    CheckpointListener,
    CoFlatMapFunction,
    Collector,
    CoMapFunction,
    CoProcessFunction,
    FilterFunction,
    FlatMapFunction,
    Function,
    KeyedCoProcessFunction,
    KeyedProcessFunction,
    MapFunction,
    OutputTag,
    ProcessFunction,
    ProcessJoinFunction,
    ReduceFunction,
    RuntimeContext,
)
from epochstream.core.state_descriptors import AggregateFunction
from epochstream.core.time import TimeDomain
from epochstream.core.watermarks import WatermarkGenerator, WatermarkStrategy
from epochstream.deploy.client import DriverLauncher, JobClient
from epochstream.exceptions import (
    AuthenticationError,
    CheckpointError,
    ConfigurationError,
    CorruptStateError,
    DataError,
    EpochstreamError,
    InjectedFailure,
    JobCancelled,
    JobExecutionError,
    KeyEncodingError,
    SerializationError,
    SinkError,
    SourceDecodeError,
    SqlError,
    StateError,
    StorageUnavailableError,
    TaskFailure,
    UntrustedStorageError,
    UserFunctionError,
)
from epochstream.graph.evictors import (
    CountEvictor,
    DeltaEvictor,
    Evictor,
    TimeEvictor,
    TimestampedValue,
)
from epochstream.graph.launch import JobResult
from epochstream.graph.triggers import (
    ContinuousEventTimeTrigger,
    ContinuousProcessingTimeTrigger,
    CountTrigger,
    EventTimeTrigger,
    ProcessingTimeTrigger,
    PurgingTrigger,
    Trigger,
    TriggerResult,
)
from epochstream.graph.windowing import (
    CumulativeEventTimeWindows,
    EventTimeSessionWindows,
    GlobalWindow,
    GlobalWindows,
    ProcessingTimeSessionWindows,
    ProcessWindowFunction,
    SlidingEventTimeWindows,
    SlidingProcessingTimeWindows,
    TimeWindow,
    TumblingEventTimeWindows,
    TumblingProcessingTimeWindows,
    WindowAssigner,
)

# The API runs jobs through the launcher it is handed and may not import deploy/, which
# sits above it: the root, which imports everything, makes deploy/'s the default.
set_default_launcher(DriverLauncher())

__version__ = "0.1.0"

__all__ = [
    "DEAD_LETTERS",
    "AggregateFunction",
    "AuthenticationError",
    "CheckpointConfig",
    "CheckpointError",
    "CheckpointListener",
    "CheckpointStats",
    "CoFlatMapFunction",
    "CoMapFunction",
    "CoProcessFunction",
    "Collector",
    "ColumnarJoinedStreams",
    "ColumnarKeyedStream",
    "ColumnarWindowedStream",
    "ConfigurationError",
    "ConnectedStreams",
    "ContinuousEventTimeTrigger",
    "ContinuousProcessingTimeTrigger",
    "CorruptStateError",
    "CountEvictor",
    "CountTrigger",
    "CumulativeEventTimeWindows",
    "DataError",
    "DataStream",
    "DataStreamSink",
    "DeltaEvictor",
    "Environment",
    "EpochstreamError",
    "EventTimeSessionWindows",
    "EventTimeTrigger",
    "Evictor",
    "FilterFunction",
    "FlatMapFunction",
    "Function",
    "GlobalWindow",
    "GlobalWindows",
    "InjectedFailure",
    "IntervalJoin",
    "JobCancelled",
    "JobClient",
    "JobExecutionError",
    "JobResult",
    "JoinFunction",
    "JoinedStreams",
    "KeyEncodingError",
    "KeyedCoProcessFunction",
    "KeyedProcessFunction",
    "KeyedStream",
    "MapFunction",
    "OutputTag",
    "ProcessFunction",
    "ProcessJoinFunction",
    "ProcessWindowFunction",
    "ProcessingTimeSessionWindows",
    "ProcessingTimeTrigger",
    "PurgingTrigger",
    "ReduceFunction",
    "RuntimeContext",
    "SerializationError",
    "SinkError",
    "SlidingEventTimeWindows",
    "SlidingProcessingTimeWindows",
    "SourceDecodeError",
    "SqlError",
    "StateError",
    "StorageUnavailableError",
    "TaskFailure",
    "TimeDomain",
    "TimeEvictor",
    "TimeWindow",
    "TimestampedValue",
    "Trigger",
    "TriggerResult",
    "TumblingEventTimeWindows",
    "TumblingProcessingTimeWindows",
    "UntrustedStorageError",
    "UserFunctionError",
    "WatermarkGenerator",
    "WatermarkStrategy",
    "WindowAssigner",
    "WindowedStream",
    "__version__",
    "agg",
    "restart",
    "savepoint",
    "sinks",
    "sources",
    "sql",
    "state",
    "testing",
]


#: Names the package root used to export, and where each lives now. They still resolve
#: (with a DeprecationWarning) so jobs written against the old root keep running.
_MOVED = {
    "MIN_WATERMARK": ("epochstream.core.watermarks", "WatermarkGenerator.MIN_WATERMARK"),
    "MAX_WATERMARK": ("epochstream.core.watermarks", "WatermarkGenerator.MAX_WATERMARK"),
    "NexmarkSource": ("epochstream.connectors.nexmark", "NexmarkSource"),
    "NexmarkConfig": ("epochstream.connectors.nexmark", "NexmarkConfig"),
    "write_nexmark_files": ("epochstream.connectors.nexmark", "write_nexmark_files"),
    "TaskCheckpointStats": ("epochstream.core.checkpoint_stats", "TaskCheckpointStats"),
}
_NEW_HOME = {
    "MIN_WATERMARK": "es.WatermarkGenerator.MIN_WATERMARK",
    "MAX_WATERMARK": "es.WatermarkGenerator.MAX_WATERMARK",
    "NexmarkSource": "es.sources.NexmarkSource",
    "NexmarkConfig": "es.sources.nexmark.NexmarkConfig",
    "write_nexmark_files": "es.sources.nexmark.write_nexmark_files",
    "TaskCheckpointStats": "the values of es.CheckpointStats.tasks",
}


def __getattr__(name: str) -> Any:
    """Resolve a name that moved off the package root, warning where it lives now."""
    if name not in _MOVED:
        raise AttributeError(f"module 'epochstream' has no attribute {name!r}")
    module, path = _MOVED[name]
    warnings.warn(f"es.{name} moved: use {_NEW_HOME[name]}", DeprecationWarning, stacklevel=2)
    value: Any = importlib.import_module(module)
    for part in path.split("."):
        value = getattr(value, part)
    return value
