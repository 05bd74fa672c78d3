"""epochstream: Flink's exactly-once stream processing model in Python, on Apache Spark.

Example::

    import epochstream as es

    env = es.Environment(parallelism=2)
    env.enable_checkpointing(interval=1.0, storage="/tmp/ckpt", mode="exactly_once")
    (env.from_text_file("book.txt")
        .flat_map(str.split)
        .map(lambda w: (w.lower(), 1))
        .key_by(lambda t: t[0])
        .reduce(lambda a, b: (a[0], a[1] + b[1]))
        .sink_to(es.sinks.FileSink("out/", format="jsonl")))
    result = env.execute("wordcount")
"""

from epochstream import restart, savepoint, sinks, sources, state, testing
from epochstream.api.datastream import DataStream, DataStreamSink, KeyedStream
from epochstream.api.environment import Environment
from epochstream.api.functions import (
    CheckpointListener,
    Collector,
    FilterFunction,
    FlatMapFunction,
    Function,
    KeyedProcessFunction,
    MapFunction,
    ReduceFunction,
    RuntimeContext,
)
from epochstream.api.result import JobResult
from epochstream.checkpoint.config import CheckpointConfig
from epochstream.checkpoint.metadata import CheckpointStats
from epochstream.deploy.client import JobClient
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
    StateError,
    TaskFailure,
    UserFunctionError,
)
from epochstream.runtime.messages import TaskCheckpointStats

__version__ = "0.1.0"

__all__ = [
    "AuthenticationError",
    "CheckpointConfig",
    "CheckpointError",
    "CheckpointListener",
    "CheckpointStats",
    "Collector",
    "ConfigurationError",
    "CorruptStateError",
    "DataError",
    "DataStream",
    "DataStreamSink",
    "Environment",
    "EpochstreamError",
    "FilterFunction",
    "FlatMapFunction",
    "Function",
    "InjectedFailure",
    "JobCancelled",
    "JobClient",
    "JobExecutionError",
    "JobResult",
    "KeyEncodingError",
    "KeyedProcessFunction",
    "KeyedStream",
    "MapFunction",
    "ReduceFunction",
    "RuntimeContext",
    "SerializationError",
    "SinkError",
    "SourceDecodeError",
    "StateError",
    "TaskCheckpointStats",
    "TaskFailure",
    "UserFunctionError",
    "__version__",
    "restart",
    "savepoint",
    "sinks",
    "sources",
    "state",
    "testing",
]
