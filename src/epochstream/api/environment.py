"""The entry point of a job: settings, sources, and ``execute``.

Example::

    import epochstream as es

    env = es.Environment(parallelism=2)
    env.enable_checkpointing(interval=1.0, storage="checkpoints")
    env.from_sequence(0, 1000).map(lambda i: i * i).print()
    result = env.execute("squares")
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from sqlglot import exp

from epochstream.api.datastream import DataStream
from epochstream.api.sql_streams import StreamBuilder
from epochstream.connectors.base import Source as SourceBase
from epochstream.connectors.formats import FileSource
from epochstream.connectors.generators import CollectionSource, SequenceSource
from epochstream.core.checkpoint_config import CheckpointConfig
from epochstream.core.clock import Clock
from epochstream.core.functions import DEAD_LETTERS
from epochstream.core.restart import RestartStrategy, fixed_delay, none
from epochstream.core.time import to_millis
from epochstream.core.watermarks import WatermarkStrategy
from epochstream.exceptions import ConfigurationError, SqlError
from epochstream.graph.jobgraph import JobGraph, build_job_graph, stateful_without_uid
from epochstream.graph.launch import JobDescription, JobHandle, JobResult, Launcher
from epochstream.graph.transformations import LogicalGraph
from epochstream.sql.catalog import Catalog
from epochstream.sql.dialect import parse_script, sql_error
from epochstream.sql.expressions import Field
from epochstream.sql.options import SqlOptions
from epochstream.sql.plan import explain
from epochstream.sql.planner import Planner
from epochstream.sql.types import SqlType
from epochstream.state.backends.base import StateBackend
from epochstream.state.backends.heap.backend import HeapStateBackend
from epochstream.state.keygroups import default_max_parallelism

if TYPE_CHECKING:
    from epochstream.connectors.base import Sink, Source

__all__ = ["Environment", "set_default_launcher", "set_overrides"]

log = logging.getLogger(__name__)


# What SET 'key' = 'value' may set in execute_sql.
def _one_statement(text: str) -> list[exp.Expression]:
    statements = parse_script(text)
    if len(statements) != 1 or isinstance(statements[0], list):
        raise SqlError(f"expected one statement, got {len(statements)}")
    return statements  # type: ignore[return-value]


def _statement_name(inserts: list[exp.Expression]) -> str:
    return "; ".join(f"INSERT INTO {i.this.name}" for i in inserts)


_RUNNERS = ("spark", "local")
# Settings the CLI (`epochstream run`) applies to every Environment a script creates,
# the way `flink run -p` overrides what the program says.
_OVERRIDES: dict[str, Any] = {}
_OVERRIDE_KEYS = (
    "parallelism",
    "runner",
    "spark_master",
    "checkpoint_dir",
    "restore_from",
    "allow_non_restored_state",
    "resume",
    "trust_shared_storage",
)


# What execute() runs jobs with when it is handed no launcher: deploy/'s, set by the
# package root (the API may not import deploy/, which sits above it).
_default_launcher: Launcher | None = None


def set_default_launcher(launcher: Launcher) -> None:
    """The launcher ``execute`` and ``execute_async`` use when given none.

    Importing ``epochstream`` sets :class:`~epochstream.deploy.client.DriverLauncher`.

    Example: ``set_default_launcher(DriverLauncher())``
    """
    global _default_launcher
    _default_launcher = launcher


def set_overrides(**settings: Any) -> None:
    """Apply settings to every Environment created afterwards (used by ``epochstream run``).

    Keys: ``parallelism``, ``runner``, ``spark_master``, ``checkpoint_dir``, ``restore_from``,
    ``allow_non_restored_state``, ``resume``, ``trust_shared_storage``. ``None`` values
    are ignored.

    Example: ``set_overrides(parallelism=4, runner="local")``
    """
    for key, value in settings.items():
        if key not in _OVERRIDE_KEYS:
            raise ConfigurationError(f"unknown override {key!r}")
        if value is None:
            _OVERRIDES.pop(key, None)
        else:
            _OVERRIDES[key] = value


class Environment:
    """Builds a job and runs it on Spark (default) or the local runner.

    ``runner="spark"`` runs each slot as a long-running Spark barrier task, on
    ``spark_master`` (default ``local[<parallelism>]``) or on an existing ``spark``
    session. ``runner="local"`` runs the same slot code in subprocesses without Spark.
    ``endpoint_host``: where the job's authenticated HTTP endpoint listens (used by
    ``epochstream list/savepoint/cancel/status``, the REST API, ``/metrics`` and the
    dashboard); ``None`` turns it off. ``endpoint_linger``: seconds the endpoint keeps
    serving the job's final state after it ends (while the driver lives).
    ``endpoint_savepoints_anywhere``: let ``POST /v1/savepoints`` and ``/v1/cancel``
    (``epochstream savepoint/cancel``) write savepoints outside the savepoint root
    (``savepoint_dir``, else ``<storage>/savepoints``); off by default, so whoever holds
    the token cannot make the job write elsewhere with its permissions and credentials.
    ``metrics_interval``: seconds between the slots' metrics reports (0 turns reports off).

    Example::

        env = es.Environment(parallelism=2, runner="local")
    """

    def __init__(
        self,
        parallelism: int | None = None,
        *,
        runner: str = "spark",
        spark_master: str | None = None,
        spark: Any = None,
        max_parallelism: int | None = None,
        batch_size: int = 1024,
        buffer_timeout: float = 0.05,
        heartbeat_interval: float = 1.0,
        heartbeat_timeout: float = 20.0,
        endpoint_host: str | None = "127.0.0.1",
        endpoint_linger: float = 60.0,
        endpoint_savepoints_anywhere: bool = False,
        metrics_interval: float = 1.0,
    ) -> None:
        parallelism = _OVERRIDES.get("parallelism", parallelism)
        runner = _OVERRIDES.get("runner", runner)
        spark_master = _OVERRIDES.get("spark_master", spark_master)
        if parallelism is None:
            parallelism = min(os.cpu_count() or 1, 4)
        if not isinstance(parallelism, int) or parallelism < 1:
            raise ConfigurationError(f"parallelism must be a positive int, got {parallelism!r}")
        if runner not in _RUNNERS:
            raise ConfigurationError(f"runner must be one of {_RUNNERS}, got {runner!r}")
        if metrics_interval < 0 or endpoint_linger < 0:
            raise ConfigurationError(
                f"metrics_interval ({metrics_interval}) and endpoint_linger ({endpoint_linger}) "
                "must be >= 0"
            )
        if batch_size < 1:
            raise ConfigurationError(f"batch_size must be >= 1, got {batch_size}")
        self.parallelism = parallelism
        self.max_parallelism = max_parallelism or default_max_parallelism(parallelism)
        # Unset, the max parallelism of a restored checkpoint wins (key groups are fixed
        # for the life of the state); set, it must match.
        self.max_parallelism_explicit = max_parallelism is not None
        if not parallelism <= self.max_parallelism <= 32768:
            raise ConfigurationError(
                f"max_parallelism {self.max_parallelism} must be in [parallelism={parallelism}, 32768]"
            )
        self.runner = runner
        self.spark_master = spark_master
        self.spark = spark
        self.batch_size = batch_size
        self.buffer_timeout = buffer_timeout
        self.heartbeat_interval = heartbeat_interval
        self.heartbeat_timeout = heartbeat_timeout
        self.endpoint_host = endpoint_host
        self.endpoint_linger = endpoint_linger
        self.endpoint_savepoints_anywhere = endpoint_savepoints_anywhere
        self.metrics_interval = metrics_interval
        self.checkpoint_config: CheckpointConfig | None = None
        self._restart_strategy: RestartStrategy | None = None
        self._state_backend: StateBackend = HeapStateBackend()
        self.auto_watermark_interval = 200
        self.clock: Clock | None = None
        self._graph = LogicalGraph()
        self._catalog = Catalog()
        self._sql_options = SqlOptions()
        # Columns and time attribute of each sql_query() result, for create_table().
        self._sql_results: dict[int, tuple[tuple[Field, ...], str | None]] = {}

    # ------------------------------------------------------------------ settings

    def enable_checkpointing(
        self,
        interval: float = 1.0,
        *,
        storage: str | None = None,
        mode: str = "exactly_once",
        **options: Any,
    ) -> Environment:
        """Take a checkpoint every ``interval`` seconds into ``storage``.

        ``storage`` is a local path or an ``s3://bucket/prefix`` URI (default: a directory
        private to the user). ``mode`` is ``"exactly_once"`` (aligned barriers) or
        ``"at_least_once"``. Other options: ``min_pause``, ``max_concurrent``,
        ``timeout``, ``tolerable_failures``, ``retained``, ``retain_on_cancel``,
        ``storage_options`` (object-store endpoint and credentials), ``savepoint_dir``,
        ``trust_shared_storage``, ``unaligned`` (barriers overtake in-flight records, which
        become part of the checkpoint) and ``aligned_timeout`` (with ``unaligned``: start
        aligned, turn unaligned after that many seconds) (see CheckpointConfig).

        A local ``storage`` (and savepoint or restore path) that other local users could
        change is refused when the job starts: checkpoints hold pickles, so whoever can
        write there can run code as you. ``trust_shared_storage=True`` opts out.

        Example: ``env.enable_checkpointing(1.0, storage="s3://bucket/ckpt")``, or under
        backpressure ``env.enable_checkpointing(1.0, unaligned=True, aligned_timeout=0.5)``
        """
        storage = _OVERRIDES.get("checkpoint_dir", storage)
        kwargs: dict[str, Any] = {"interval": interval, "mode": mode, **options}
        if _OVERRIDES.get("trust_shared_storage"):
            kwargs["trust_shared_storage"] = True
        if storage is not None:
            kwargs["storage"] = storage
        self.checkpoint_config = CheckpointConfig(**kwargs)
        return self

    def set_restart_strategy(self, strategy: RestartStrategy) -> Environment:
        """How to react to failures.

        Example: ``env.set_restart_strategy(es.restart.fixed_delay(attempts=3, delay=1.0))``.
        Default: ``fixed_delay(attempts=3, delay=1.0)`` with checkpointing on, ``none()`` without.
        """
        if not isinstance(strategy, RestartStrategy):
            raise ConfigurationError("set_restart_strategy needs a strategy from es.restart")
        self._restart_strategy = strategy
        return self

    def set_state_backend(self, backend: StateBackend) -> Environment:
        """Where keyed state lives: ``es.state.HeapStateBackend()`` (default) or
        ``es.state.RocksDBStateBackend()``. Switching backends goes through a savepoint.

        Example: ``env.set_state_backend(es.state.RocksDBStateBackend(incremental=True))``
        """
        if not isinstance(backend, StateBackend):
            raise ConfigurationError(
                f"set_state_backend needs a backend from es.state, got {type(backend).__name__}"
            )
        self._state_backend = backend
        return self

    def set_auto_watermark_interval(self, interval: Any) -> Environment:
        """How often sources and ``assign_timestamps_and_watermarks`` send watermarks
        (ms or timedelta; default 200 ms, as Flink). A late record always gets its
        watermark ahead of it, whatever the interval.

        Example: ``env.set_auto_watermark_interval(50)``
        """
        self.auto_watermark_interval = to_millis(interval, "watermark interval", allow_zero=False)
        return self

    def set_clock(self, clock: Clock) -> Environment:
        """The clock of processing time in every slot: processing-time timers and
        windows, idleness, state TTL. It must be picklable (it is shipped to the slots);
        ``es.testing.FileClock`` is a clock a test moves by hand, across processes.

        Example: ``env.set_clock(es.testing.FileClock("/tmp/clock"))``
        """
        if not all(callable(getattr(clock, m, None)) for m in ("now", "wall", "sleep")):
            raise ConfigurationError(
                f"set_clock needs a clock with now(), wall() and sleep(), got {type(clock).__name__}"
            )
        self.clock = clock
        return self

    @property
    def state_backend(self) -> StateBackend:
        """The keyed-state backend jobs of this environment use."""
        return self._state_backend

    @property
    def trusts_shared_storage(self) -> bool:
        """Whether local checkpoint, savepoint and restore paths other users could change
        are used anyway: ``enable_checkpointing(trust_shared_storage=True)``, or
        ``epochstream run --trust-shared-storage`` (which also covers a job that restores
        a savepoint without checkpointing).

        Example: ``env.enable_checkpointing(trust_shared_storage=True).trusts_shared_storage``
        """
        configured = (
            self.checkpoint_config is not None and self.checkpoint_config.trust_shared_storage
        )
        return configured or bool(_OVERRIDES.get("trust_shared_storage"))

    @property
    def restart_strategy(self) -> RestartStrategy:
        if self._restart_strategy is not None:
            return self._restart_strategy
        return fixed_delay(attempts=3, delay=1.0) if self.checkpoint_config else none()

    # ------------------------------------------------------------------ sources

    def from_source(
        self,
        source: Source,
        *,
        name: str | None = None,
        watermark_strategy: WatermarkStrategy | None = None,
    ) -> DataStream:
        """Read from any :class:`~epochstream.connectors.base.Source`.

        ``watermark_strategy`` gives records their timestamps at the source and
        generates watermarks per source split (a split that falls behind holds the
        watermark back; an idle one, with ``with_idleness``, does not).

        Example: ``env.from_source(MySource(), watermark_strategy=strategy)``
        """

        if not isinstance(source, SourceBase):
            raise ConfigurationError(f"from_source needs a Source, got {type(source).__name__}")
        if watermark_strategy is not None and not isinstance(watermark_strategy, WatermarkStrategy):
            raise ConfigurationError(
                f"watermark_strategy must be an es.WatermarkStrategy, got "
                f"{type(watermark_strategy).__name__}"
            )
        t = self._graph.add("source", name or type(source).__name__, payload=source)
        t.watermark_strategy = watermark_strategy
        t.columnar = bool(getattr(source, "columnar", False))
        return DataStream(self, t)

    def from_text_file(
        self, path: str, *, encoding: str = "utf-8", dead_letter: Sink | None = None
    ) -> DataStream:
        """Lines of a text file (or a directory / glob of files), re-settable by (file, byte offset).

        ``from_files(path, "text")`` with a sink for its dead letters: a line that does
        not decode fails the job with an error naming file and byte offset, unless
        ``dead_letter`` (a sink, e.g. ``FileSink``) is given: then such lines go there as
        ``{"file", "offset", "error", "line"}`` records (the stream's
        :data:`~epochstream.DEAD_LETTERS` side output, consumed by that sink).

        Example: ``env.from_text_file("book.txt").flat_map(str.split)``
        """
        ds = self.from_files(
            path,
            "text",
            encoding=encoding,
            on_error="fail" if dead_letter is None else "dead_letter",
        )
        if dead_letter is not None:
            ds.get_side_output(DEAD_LETTERS).sink_to(dead_letter).name("dead-letter")
        return ds

    def from_files(
        self,
        path_or_glob: str | os.PathLike[str],
        format: str = "text",
        *,
        monitor_interval: float | None = None,
        on_error: str = "fail",
        encoding: str = "utf-8",
        watermark_strategy: WatermarkStrategy | None = None,
        batch_size: int | None = None,
    ) -> DataStream:
        """Records of a file, a directory's files or a glob's files, exactly-once.

        ``format``: ``"text"``, ``"jsonl"``, ``"csv"`` (dicts keyed by the header) or
        ``"parquet"`` (row groups as splits, rows as dicts). ``monitor_interval``
        (seconds): keep listing the path and read new files as they appear (the stream
        never ends). ``on_error="fail"`` (default) fails the job at a bad record naming
        file, offset or row and reason; ``"dead_letter"`` sends such records, with that
        context, to ``stream.get_side_output(es.DEAD_LETTERS)``, which must be consumed.
        ``batch_size`` (Parquet only): a columnar stream of Arrow record batches of up to
        that many rows (what :meth:`from_parquet` asks for). See
        :mod:`epochstream.connectors.formats`.

        Example: ``env.from_files("in/*.jsonl", format="jsonl", monitor_interval=1.0)``
        """

        source = FileSource(
            path_or_glob,
            format,
            monitor_interval=monitor_interval,
            on_error=on_error,
            encoding=encoding,
            batch_size=batch_size,
        )
        name = f"{format}({os.path.basename(os.fspath(path_or_glob))})"
        return self.from_source(source, name=name, watermark_strategy=watermark_strategy)

    def from_collection(
        self, items: Iterable[Any], *, watermark_strategy: WatermarkStrategy | None = None
    ) -> DataStream:
        """A bounded, re-settable stream of the given items (split into contiguous ranges,
        one per subtask). Example: ``env.from_collection([1, 2, 3])``
        """

        return self.from_source(
            CollectionSource(list(items)), name="collection", watermark_strategy=watermark_strategy
        )

    def from_sequence(
        self, start: int, stop: int, *, rate: float | None = None, batch_size: int | None = None
    ) -> DataStream:
        """Integers ``start <= i < stop``, optionally throttled to ``rate`` records/s in total.

        With ``batch_size`` the stream is columnar: Arrow record batches of up to
        ``batch_size`` rows with one int64 column ``value``.

        Example: ``env.from_sequence(0, 10_000_000, batch_size=65_536)``
        """

        source = SequenceSource(start, stop, rate=rate, batch_size=batch_size)
        return self.from_source(source, name="sequence")

    def from_parquet(
        self,
        path_or_glob: str | os.PathLike[str],
        *,
        batch_size: int = 65_536,
        monitor_interval: float | None = None,
        on_error: str = "fail",
        watermark_strategy: WatermarkStrategy | None = None,
    ) -> DataStream:
        """A columnar stream of Parquet files: each row group's rows as Arrow record
        batches of up to ``batch_size`` rows (row groups are the splits; exactly-once).
        Other arguments as :meth:`from_files`.

        Example: ``env.from_parquet("events/*.parquet").filter(pc.field("price") > 100)``
        """
        return self.from_files(
            path_or_glob,
            "parquet",
            monitor_interval=monitor_interval,
            on_error=on_error,
            watermark_strategy=watermark_strategy,
            batch_size=batch_size,
        )

    # ------------------------------------------------------------------ SQL

    @property
    def catalog(self) -> Catalog:
        """The tables, views and functions SQL statements of this environment can name.

        Example: ``env.catalog.table("bid").rowtime``
        """
        return self._catalog

    def execute_sql(
        self,
        script: str,
        *,
        wait: bool = True,
        from_savepoint: str | None = None,
        restore_from: str | None = None,
        allow_non_restored_state: bool = False,
    ) -> JobResult | JobHandle | None:
        """Run a script of ``;``-separated Flink SQL statements.

        ``CREATE TABLE`` (with ``WITH ('connector' = ...)``), ``CREATE VIEW``, ``DROP``
        and ``SET`` change the catalog; each ``INSERT INTO`` (or ``EXECUTE STATEMENT SET
        BEGIN ... END``, planned as one job) runs a job, as :meth:`execute` would, with
        uids derived from the query, so the same statement restores ``from_savepoint``.
        ``wait=False`` returns the running job's client instead of its result. Returns
        ``None`` for a script without INSERT. Errors are :class:`~epochstream.SqlError`
        naming the line and column.

        Example::

            env.execute_sql(
                "CREATE TABLE out (auction BIGINT, price BIGINT) WITH ('connector' = 'print');"
                "INSERT INTO out SELECT auction, price FROM bid WHERE price > 1000"
            )
        """
        result: JobResult | JobHandle | None = None
        for statement in parse_script(script):
            inserts = statement if isinstance(statement, list) else [statement]
            if not isinstance(statement, list) and not isinstance(statement, exp.Insert):
                self._sql_ddl(statement)
                continue
            builder = StreamBuilder(self)
            planner = Planner(self._catalog, self._sql_options)
            for insert in inserts:
                if not isinstance(insert, exp.Insert):
                    raise sql_error(insert, "a statement set holds INSERT INTO statements only")
                builder.sink(planner.plan_insert(insert))
            name = self._sql_options.pipeline_name or _statement_name(inserts)
            handle = self.execute_async(
                name,
                from_savepoint=from_savepoint,
                restore_from=restore_from,
                allow_non_restored_state=allow_non_restored_state,
            )
            result = handle.result() if wait else handle
        return result

    def _sql_ddl(self, statement: exp.Expression) -> None:
        if isinstance(statement, exp.Create):
            kind = (statement.args.get("kind") or "").upper()
            if kind == "TABLE":
                self._catalog.create_table(statement)
            elif kind == "VIEW":
                self._catalog.create_view(statement)
            elif kind == "FUNCTION":
                self._catalog.create_function(statement)
            else:
                raise sql_error(
                    statement, f"CREATE {kind} is not supported (TABLE, VIEW, FUNCTION)"
                )
        elif isinstance(statement, exp.Drop):
            self._catalog.drop(statement)
        elif isinstance(statement, exp.Set):
            for item in statement.expressions:
                eq = item.this
                key, value = eq.this.name, eq.expression.name
                try:
                    self._sql_options = self._sql_options.with_option(key, value)
                except ValueError as e:
                    raise sql_error(item, str(e)) from None
        elif isinstance(statement, exp.Select | exp.Union):
            raise sql_error(
                statement,
                "execute_sql runs statements; for a query use sql_query() (a DataStream) "
                "or INSERT INTO a table",
            )
        else:
            raise sql_error(statement, f"unsupported statement {type(statement).__name__.upper()}")

    def sql_query(self, query: str) -> DataStream:
        """The result of a ``SELECT`` as a columnar DataStream to keep building on: Arrow
        batches of the query's columns, plus ``_ts`` (event time) when a time attribute
        survives (Flink's ``sqlQuery``).

        Example: ``env.sql_query("SELECT auction, price FROM bid WHERE price > 100").print()``
        """
        [statement] = _one_statement(query)
        node = Planner(self._catalog, self._sql_options).plan_query(statement)
        stream = StreamBuilder(self).stream(node)
        self._sql_results[stream._t.id] = (node.fields, node.rowtime)
        return stream

    def explain_sql(self, statement: str) -> str:
        """The plan of a ``SELECT`` or ``INSERT``: each operator with its uid, columns and
        types, keys, state and watermarks. Builds nothing.

        Example: ``print(env.explain_sql("SELECT auction FROM bid"))``
        """
        [parsed] = _one_statement(statement)
        planner = Planner(self._catalog, self._sql_options)
        if isinstance(parsed, exp.Insert):
            return explain(planner.plan_insert(parsed))
        return explain(planner.plan_query(parsed))

    def create_table(
        self,
        name: str,
        stream: DataStream,
        *,
        schema: pa.Schema | None = None,
        rowtime: str | None = None,
    ) -> None:
        """Let SQL statements read ``stream`` as the table ``name``.

        A columnar stream from :meth:`sql_query` brings its columns; any other needs
        ``schema`` (a ``pyarrow.Schema``; a stream of rows is batched with it).
        ``rowtime``: the timestamp column that is the event-time attribute (its values
        must be the stream's event timestamps, ``_ts``), for window TVFs.

        Example: ``env.create_table("people", stream, schema=pa.schema([("name", pa.string())]))``
        """
        if not isinstance(stream, DataStream):
            raise ConfigurationError(
                f"create_table needs a DataStream, got {type(stream).__name__}"
            )
        known = self._sql_results.get(stream._t.id)
        if schema is not None:
            if not stream.columnar:
                stream = stream.to_batches(schema)
            fields = tuple(Field(f.name, SqlType.from_arrow(f.type)) for f in schema)
            rowtime_column = rowtime
        elif known is not None:
            fields, rowtime_column = known
            rowtime_column = rowtime or rowtime_column
        else:
            raise ConfigurationError(
                f"create_table({name!r}): give schema=pyarrow.Schema(...) for this stream"
            )
        if rowtime_column is not None and not any(f.name == rowtime_column for f in fields):
            raise ConfigurationError(
                f"create_table({name!r}): rowtime {rowtime_column!r} is not a column"
            )
        self._catalog.add_stream(name, stream, fields, rowtime_column)

    def create_temporary_function(
        self, name: str, fn: Any, *, result_type: str | None = None
    ) -> None:
        """Let SQL statements call ``fn`` as ``name`` (a vectorized scalar function:
        Arrow arrays in, an Arrow array out; see :func:`epochstream.sql.udf`).

        Example: ``env.create_temporary_function("to_usd", to_usd)``
        """
        self._catalog.functions.register(name, fn, result_type=result_type)

    # ------------------------------------------------------------------ running

    def job_graph(self, job_name: str = "job") -> JobGraph:
        """The job graph ``execute`` would run (chains and edges), for inspection."""
        return build_job_graph(
            self._graph,
            name=job_name,
            parallelism=self.parallelism,
            max_parallelism=self.max_parallelism,
            batch_size=self.batch_size,
            buffer_timeout=self.buffer_timeout,
            auto_watermark_interval=self.auto_watermark_interval,
            clock=self.clock,
        )

    def job_description(
        self,
        job_name: str = "job",
        *,
        from_savepoint: str | None = None,
        restore_from: str | None = None,
        allow_non_restored_state: bool = False,
    ) -> JobDescription:
        """What ``execute`` with these arguments hands its launcher: the job graph of
        the operators built so far and every setting of this environment (with the
        settings of ``epochstream run`` applied).

        Example::

            description = env.job_description("wordcount", from_savepoint="/sp/savepoint-1")
            description.restore_from == "/sp/savepoint-1"
        """
        if from_savepoint is not None and restore_from is not None:
            raise ConfigurationError("give from_savepoint or restore_from, not both")
        restore = _OVERRIDES.get("restore_from", from_savepoint or restore_from)
        return JobDescription(
            graph=self.job_graph(job_name),
            max_parallelism_explicit=self.max_parallelism_explicit,
            runner=self.runner,
            spark_master=self.spark_master,
            spark=self.spark,
            checkpoint_config=self.checkpoint_config,
            restart_strategy=self.restart_strategy,
            state_backend=self.state_backend,
            heartbeat_interval=self.heartbeat_interval,
            heartbeat_timeout=self.heartbeat_timeout,
            endpoint_host=self.endpoint_host,
            endpoint_linger=self.endpoint_linger,
            endpoint_savepoints_anywhere=self.endpoint_savepoints_anywhere,
            metrics_interval=self.metrics_interval,
            trust_shared_storage=self.trusts_shared_storage,
            restore_from=restore,
            allow_non_restored_state=_OVERRIDES.get(
                "allow_non_restored_state", allow_non_restored_state
            ),
            resume=bool(_OVERRIDES.get("resume")) and restore is None,
        )

    def execute_async(
        self,
        job_name: str = "job",
        *,
        from_savepoint: str | None = None,
        restore_from: str | None = None,
        allow_non_restored_state: bool = False,
        launcher: Launcher | None = None,
    ) -> JobHandle:
        """Start the job and return a :class:`~epochstream.deploy.client.JobClient` at
        once (see :meth:`execute`).

        Each call runs the operators built since the previous one; streams built before
        it cannot be extended afterwards. ``launcher``: what runs the job (default: a
        job master in this process, slots on Spark or local processes); it is handed
        :meth:`job_description` and returns the handle this returns.

        Example::

            client = env.execute_async("wc")
            client.wait_for_checkpoint(1)
            result = client.result()
        """
        if launcher is None:
            launcher = _default_launcher
        if launcher is None:
            raise ConfigurationError("no launcher: pass launcher=..., or import epochstream")
        description = self.job_description(
            job_name,
            from_savepoint=from_savepoint,
            restore_from=restore_from,
            allow_non_restored_state=allow_non_restored_state,
        )
        unnamed = stateful_without_uid(self._graph)
        if unnamed and self.checkpoint_config is not None:
            log.warning(
                "job %r: stateful operators without an explicit uid: %s. Their state is matched "
                "by a uid derived from the graph, which changes when an operator is inserted "
                "upstream; give each a stable .uid(...) before taking savepoints you will "
                "restore into a changed job",
                job_name,
                ", ".join(unnamed),
            )
        handle = launcher.launch(description)
        # As in Flink, the next execute() runs only what is built after this one.
        self._graph = LogicalGraph()
        return handle

    def execute(
        self,
        job_name: str = "job",
        *,
        from_savepoint: str | None = None,
        restore_from: str | None = None,
        allow_non_restored_state: bool = False,
        launcher: Launcher | None = None,
    ) -> JobResult:
        """Run the job to completion; raises JobExecutionError when restarts are exhausted.

        ``from_savepoint`` starts this job from a savepoint (a new version of a job);
        ``restore_from`` from a retained checkpoint of an earlier job (a ``chk-<n>``
        directory, its ``_metadata`` file, or a directory holding checkpoints, whose
        latest is used). Either works at any parallelism up to the state's max
        parallelism: keyed state moves by key group, operators are matched by uid,
        source positions and pending sink transactions come along, operators new in
        this job start empty. State of operators whose uid is not in this job is an
        error unless ``allow_non_restored_state``. ``launcher``: as :meth:`execute_async`.

        Example: ``result = env.execute("wordcount", from_savepoint="/sp/savepoint-3f2a9c-...")``
        """
        return self.execute_async(
            job_name,
            from_savepoint=from_savepoint,
            restore_from=restore_from,
            allow_non_restored_state=allow_non_restored_state,
            launcher=launcher,
        ).result()
