"""DDL tables to sources and sinks: the ``WITH`` options of ``CREATE TABLE``, named as
Flink's connectors name them, mapped onto epochstream's connectors.

| ``'connector'`` | reads with | writes with |
|---|---|---|
| ``nexmark`` | ``NexmarkSource`` (columnar, one event kind) | |
| ``filesystem`` | ``FileSource`` (Parquet columnar; JSON lines, CSV as rows) | ``FileSink`` (exactly-once) |
| ``kafka`` | ``KafkaSource`` (JSON, columnar) | ``KafkaSink`` (JSON, transactional) |
| ``upsert-kafka`` | | ``KafkaSink(upsert_key=...)`` (changes by key, tombstones; transactional) |
| ``jdbc`` (PostgreSQL) | | ``PostgresSink`` (upsert by the primary key, else two-phase) |
| ``delta`` | | ``DeltaSink`` (merge by the primary key, else appends) |
| ``jetstream`` | ``JetStreamSource`` (JSON, columnar, unbounded) | ``JetStreamSink`` |
| ``print`` | | ``PrintSink`` |
| ``blackhole`` | | ``DiscardSink`` |

An option a connector does not know is refused with its position, so a typo never
passes silently; values that hold secrets are never repeated in errors.

Example::

    binding = source_binding(table, ["auction", "price", "dateTime"])
    binding.source, binding.watermark_strategy, binding.adapter
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import quote

import pyarrow as pa

from epochstream.connectors.base import Sink, Source
from epochstream.connectors.delta import DeltaSink
from epochstream.connectors.filesink import FileSink
from epochstream.connectors.formats import FileSource
from epochstream.connectors.jetstream import JetStreamSink, JetStreamSource
from epochstream.connectors.kafka.sink import KafkaSink
from epochstream.connectors.kafka.source import KafkaSource
from epochstream.connectors.nexmark import KINDS, NexmarkConfig, NexmarkSource
from epochstream.connectors.postgres import PostgresSink
from epochstream.connectors.simple import DiscardSink, PrintSink
from epochstream.core.watermarks import WatermarkStrategy
from epochstream.exceptions import ConfigurationError, SqlError
from epochstream.sql.catalog import TableDef
from epochstream.sql.dialect import sql_error
from epochstream.sql.options import parse_duration_ms
from epochstream.sql.plan import ColumnAdapter

__all__ = ["SinkBinding", "SourceBinding", "sink_binding", "source_binding"]

# Flink's Nexmark tables name columns in camelCase; the generator's are snake_case.
_NEXMARK_ALIASES = {
    "dateTime": "date_time",
    "itemName": "item_name",
    "initialBid": "initial_bid",
    "emailAddress": "email_address",
    "creditCard": "credit_card",
}

_FILE_FORMATS = {"parquet": "parquet", "json": "jsonl", "csv": "csv"}


@dataclass(frozen=True)
class SourceBinding:
    """How to read a DDL table: the source, its watermark strategy (None without a
    ``WATERMARK``), the adapter to the declared columns, and, for a source of rows,
    the Arrow schema to batch them with (``rows_schema``)."""

    source: Source
    watermark_strategy: WatermarkStrategy | None
    adapter: ColumnAdapter
    rows_schema: pa.Schema | None = None


@dataclass(frozen=True)
class SinkBinding:
    """How to write a DDL table: the sink, whether it takes Arrow batches (else the
    planner converts to rows first), and which results it takes: ``append`` (inserts
    only), ``upsert`` (a changelog, written by the table's PRIMARY KEY) or ``all``
    (every change as it is)."""

    sink: Sink
    takes_batches: bool
    changelog: str = "append"


class _Options:
    """The options of one table, each read at most once; what is left over is an error."""

    def __init__(self, table: TableDef, role: str) -> None:
        self.table = table
        self.role = role
        self._left = dict(table.options)
        self._left.pop("connector")

    def take(self, key: str, default: str | None = None, *, required: bool = False) -> str | None:
        if key in self._left:
            return self._left.pop(key)
        if required:
            raise self.table.option_error(
                key, f"is required by the {self.table.connector} connector"
            )
        return default

    def take_int(self, key: str, default: int) -> int:
        text = self.take(key)
        if text is None:
            return default
        try:
            return int(text)
        except ValueError:
            raise self.table.option_error(key, f"must be an integer, got {text!r}") from None

    def take_prefixed(self, prefix: str) -> dict[str, str]:
        found = {k[len(prefix) :]: v for k, v in self._left.items() if k.startswith(prefix)}
        for key in found:
            self._left.pop(prefix + key)
        return found

    def done(self) -> None:
        for key in self._left:
            raise self.table.option_error(
                key, f"is not an option of the {self.table.connector} connector as a {self.role}"
            )


def _adapter(table: TableDef, columns: list[str], physical: Callable[[str], str]) -> ColumnAdapter:
    out = []
    for name in columns:
        declared = table.field(name)
        if declared is None or name == table.proctime:
            continue
        out.append((name, physical(name), declared.type.to_arrow()))
    return ColumnAdapter(out)


def _watermarks(
    table: TableDef, options: _Options, physical: Callable[[str], str]
) -> WatermarkStrategy | None:
    idle = options.take("scan.watermark.idle-timeout")
    if table.rowtime is None:
        if idle is not None:
            raise table.option_error("scan.watermark.idle-timeout", "needs a WATERMARK")
        return None
    strategy = WatermarkStrategy.bounded_out_of_orderness(table.watermark_delay_ms)
    strategy = strategy.with_timestamp_column(physical(table.rowtime))
    if idle is not None:
        seconds = _seconds(table, "scan.watermark.idle-timeout", idle)
        strategy = strategy.with_idleness(int(seconds * 1000))
    return strategy


def _declared_schema(table: TableDef, columns: list[str]) -> pa.Schema:
    return pa.schema(
        [(n, table.field(n).type.to_arrow()) for n in columns if n != table.proctime]  # type: ignore[union-attr]
    )


def source_binding(
    table: TableDef, columns: list[str], *, batch_size: int = 65_536
) -> SourceBinding:
    """How to read ``columns`` (declared names) of the DDL table ``table``.

    Only the named columns are read where the connector can skip the rest (Parquet).

    Example: ``source_binding(bid_table, ["auction", "price", "dateTime"])``
    """
    options = _Options(table, "source")
    connector = table.connector
    if table.partition_by:
        raise sql_error(
            table.partition_node,
            f"table {table.name!r}: a PARTITIONED BY table can only be written (no source "
            "reads partition directories)",
        )
    try:
        if connector == "nexmark":
            binding = _nexmark_source(table, columns, options, batch_size)
        elif connector == "filesystem":
            binding = _file_source(table, columns, options, batch_size)
        elif connector == "kafka":
            binding = _kafka_source(table, columns, options)
        elif connector == "jetstream":
            binding = _jetstream_source(table, columns, options)
        elif connector in ("print", "blackhole", "upsert-kafka"):
            raise table.option_error("connector", f"'{connector}' tables can only be written")
        else:
            raise table.option_error(
                "connector",
                f"unknown source connector {connector!r} (nexmark, filesystem, kafka, jetstream)",
            )
    except SqlError:
        raise
    except ConfigurationError as err:
        # The connector's own check (a bad value): reported at the table's options.
        raise table.option_error("connector", str(err)) from None
    options.done()
    return binding


def _nexmark_source(
    table: TableDef, columns: list[str], options: _Options, batch_size: int
) -> SourceBinding:
    kind = options.take("kind", table.name if table.name in KINDS else None, required=True)
    if kind not in KINDS:
        raise table.option_error("kind", f"must be one of {', '.join(KINDS)}, got {kind!r}")
    config = NexmarkConfig(
        events=options.take_int("events.num", 1_000_000),
        seed=options.take_int("seed", 0),
        events_per_second=float(options.take_int("first-event.rate", 10_000)),
    )
    rate = options.take("rate")
    batch = options.take_int("batch-size", batch_size)
    source = NexmarkSource(
        config, batch_size=batch, kind=kind, rate=None if rate is None else float(rate)
    )

    def physical(name: str) -> str:
        return _NEXMARK_ALIASES.get(name, name)

    return SourceBinding(
        source, _watermarks(table, options, physical), _adapter(table, columns, physical)
    )


def _file_source(
    table: TableDef, columns: list[str], options: _Options, batch_size: int
) -> SourceBinding:
    path = options.take("path", required=True)
    fmt = options.take("format", required=True)
    if fmt not in _FILE_FORMATS:
        raise table.option_error(
            "format", f"must be one of {', '.join(_FILE_FORMATS)}, got {fmt!r}"
        )
    interval = options.take("source.monitor-interval")
    # Parquet reads only the columns the query uses (and the event-time column).
    wanted = [
        *columns,
        *([table.rowtime] if table.rowtime and table.rowtime not in columns else []),
    ]
    source = FileSource(
        path,  # type: ignore[arg-type]
        _FILE_FORMATS[fmt],
        columns=tuple(wanted) if fmt == "parquet" else None,
        monitor_interval=None
        if interval is None
        else _seconds(table, "source.monitor-interval", interval),
        batch_size=batch_size if fmt == "parquet" else None,
    )
    rows_schema = None if fmt == "parquet" else _declared_schema(table, columns)
    return SourceBinding(
        source,
        _watermarks(table, options, str),
        _adapter(table, columns, str),
        rows_schema=rows_schema,
    )


def _kafka_source(table: TableDef, columns: list[str], options: _Options) -> SourceBinding:
    topic = options.take("topic", required=True)
    servers = options.take("properties.bootstrap.servers", required=True)
    fmt = options.take("format", "json")
    if fmt != "json":
        raise table.option_error("format", f"only 'json' is supported, got {fmt!r}")
    mode = options.take("scan.startup.mode", "earliest-offset")
    starts = {"earliest-offset": "earliest", "latest-offset": "latest"}
    if mode not in starts:
        raise table.option_error("scan.startup.mode", f"must be one of {', '.join(starts)}")
    bounded = options.take("scan.bounded.mode", "unbounded")
    if bounded not in ("unbounded", "latest-offset"):
        raise table.option_error(
            "scan.bounded.mode", f"must be 'unbounded' or 'latest-offset', got {bounded!r}"
        )
    group = options.take("properties.group.id")
    properties = options.take_prefixed("properties.")
    # The JSON decoder reads the declared columns; the adapter then orders them.
    schema = _declared_schema(table, [f.name for f in table.fields])
    source = KafkaSource(
        servers,  # type: ignore[arg-type]
        [topic],  # type: ignore[list-item]
        group_id=group,
        starting_offsets=starts[str(mode)],
        bounded="latest" if bounded == "latest-offset" else None,
        value_format="json",
        columnar=True,
        schema=schema,
        properties=dict(properties) or None,
    )
    return SourceBinding(source, _watermarks(table, options, str), _adapter(table, columns, str))


def _jetstream_source(table: TableDef, columns: list[str], options: _Options) -> SourceBinding:
    """A JetStream stream of JSON messages, read from ``'scan.startup.sequence'`` on
    (default 1, the first); ``'subject'`` filters it. Unbounded: JetStreamSource has no
    bounded mode."""
    servers = options.take("servers", required=True)
    stream = options.take("stream", required=True)
    subject = options.take("subject")
    fmt = options.take("format", "json")
    if fmt != "json":
        raise table.option_error("format", f"only 'json' is supported, got {fmt!r}")
    start = options.take_int("scan.startup.sequence", 1)
    if start < 1:
        raise table.option_error("scan.startup.sequence", f"must be >= 1, got {start}")
    # The JSON decoder reads the declared columns; the adapter then orders them.
    source = JetStreamSource(
        str(servers).split(","),
        str(stream),
        subject,
        start,
        json_schema=_declared_schema(table, [f.name for f in table.fields]),
    )
    return SourceBinding(source, _watermarks(table, options, str), _adapter(table, columns, str))


def _seconds(table: TableDef, key: str, text: str) -> float:
    """Seconds of a duration option in Flink's syntax (``'10 s'``, ``'500 ms'``,
    ``'1 min'``; a bare number is milliseconds, as in Flink)."""
    try:
        return parse_duration_ms(text) / 1000
    except ValueError as e:
        raise table.option_error(key, str(e)) from None


def _postgres_sink(table: TableDef, options: _Options) -> Sink:
    """Flink's JDBC connector options for PostgreSQL: a table with a primary key takes
    changes by it, a checkpoint's in one transaction (exactly-once upserts and
    deletes), one without is written in two-phase-commit transactions (exactly-once)."""
    url = str(options.take("url", required=True))
    if not url.startswith("jdbc:postgresql://"):
        raise table.option_error(
            "url", "only PostgreSQL is supported: 'jdbc:postgresql://host:port/db'"
        )
    name = str(options.take("table-name", required=True))
    user = options.take("username")
    password = options.take("password")
    credentials = ""
    if user is not None:
        credentials = quote(user, safe="")
        if password is not None:
            credentials += ":" + quote(password, safe="")
        credentials += "@"
    dsn = "postgresql://" + credentials + url[len("jdbc:postgresql://") :]
    columns = [f.name for f in table.fields]
    if table.primary_key:
        # By key, a checkpoint's changes in one transaction (exactly-once upserts).
        return PostgresSink(
            dsn, name, "transactional_upsert", list(table.primary_key), columns=columns
        )
    return PostgresSink(dsn, name, columns=columns)


#: The column a filesystem table with ``'changelog-mode' = 'all'`` writes row kinds to.
CHANGELOG_COLUMN = "op"


def _changelog_column(table: TableDef, options: _Options) -> str | None:
    """``'changelog-mode'`` of a filesystem sink (epochstream's option; Flink's
    filesystem connector takes appends only): ``'all'`` writes every change with its
    kind in a string column ``op``; ``'insert-only'`` (the default) takes appends only."""
    mode = options.take("changelog-mode", "insert-only")
    if mode not in ("insert-only", "all"):
        raise table.option_error("changelog-mode", f"must be 'insert-only' or 'all', got {mode!r}")
    if mode == "insert-only":
        return None
    if table.field(CHANGELOG_COLUMN) is not None:
        raise table.option_error(
            "changelog-mode",
            f"'all' writes the row kinds to a column {CHANGELOG_COLUMN!r}, which the table "
            "declares already",
        )
    return CHANGELOG_COLUMN


def _kafka_sink(table: TableDef, options: _Options) -> Sink:
    """Flink's Kafka options: ``kafka`` writes each row as a JSON value; ``upsert-kafka``
    (a PRIMARY KEY required, as in Flink) writes changes keyed by the key columns'
    JSON, a ``-D`` as a tombstone (``KafkaSink(upsert_key=...)``). Both in Kafka
    transactions unless ``'sink.delivery-guarantee' = 'at-least-once'``."""
    upsert = table.connector == "upsert-kafka"
    topic = options.take("topic", required=True)
    servers = options.take("properties.bootstrap.servers", required=True)
    except_key = False
    if upsert:
        if not table.primary_key:
            raise table.option_error(
                "connector",
                "'upsert-kafka' tables need a PRIMARY KEY (...) NOT ENFORCED: it is the record key",
            )
        for key in ("key.format", "value.format"):
            fmt = options.take(key, required=True)
            if fmt != "json":
                raise table.option_error(key, f"only 'json' is supported, got {fmt!r}")
        include = options.take("value.fields-include", "ALL")
        if include not in ("ALL", "EXCEPT_KEY"):
            raise table.option_error(
                "value.fields-include", f"must be 'ALL' or 'EXCEPT_KEY', got {include!r}"
            )
        except_key = include == "EXCEPT_KEY"
    else:
        fmt = options.take("format", "json")
        if fmt != "json":
            raise table.option_error("format", f"only 'json' is supported, got {fmt!r}")
    guarantee = options.take("sink.delivery-guarantee", "exactly-once")
    deliveries = {"exactly-once": "exactly_once", "at-least-once": "at_least_once"}
    if guarantee not in deliveries:
        raise table.option_error(
            "sink.delivery-guarantee", f"must be one of {', '.join(deliveries)}"
        )
    prefix = options.take("sink.transactional-id-prefix")
    if guarantee == "exactly-once" and prefix is None:
        raise table.option_error(
            "sink.transactional-id-prefix",
            "is required with 'sink.delivery-guarantee' = 'exactly-once'",
        )
    properties = options.take_prefixed("properties.")
    return KafkaSink(
        servers,  # type: ignore[arg-type]
        topic,
        value_format="json",
        delivery=deliveries[guarantee],
        transactional_id_prefix=prefix,
        properties=dict(properties) or None,
        upsert_key=list(table.primary_key) if upsert else None,
        value_except_key=except_key,
    )


def sink_binding(table: TableDef) -> SinkBinding:
    """How to write the DDL table ``table``.

    Example: ``sink_binding(out_table).sink``
    """
    options = _Options(table, "sink")
    connector = table.connector
    if table.partition_by and connector != "filesystem":
        raise sql_error(
            table.partition_node,
            f"table {table.name!r}: PARTITIONED BY is supported by the filesystem connector "
            f"only, not {connector!r}",
        )
    sink: Sink
    every_change = connector in ("print", "blackhole")  # else appends, or upserts by key
    if connector == "print":
        sink = PrintSink(options.take("print-identifier"))
    elif connector == "blackhole":
        sink = DiscardSink()
    elif connector == "filesystem":
        path = options.take("path", required=True)
        fmt = options.take("format", required=True)
        if fmt not in _FILE_FORMATS:
            raise table.option_error("format", f"must be one of {', '.join(_FILE_FORMATS)}")
        column = _changelog_column(table, options)
        sink = FileSink(
            path,  # type: ignore[arg-type]
            _FILE_FORMATS[fmt],
            partition_by=table.partition_by,
            changelog_column=column,
        )
        every_change = column is not None
    elif connector in ("kafka", "upsert-kafka"):
        sink = _kafka_sink(table, options)
    elif connector == "jdbc":
        sink = _postgres_sink(table, options)
    elif connector == "delta":
        path = str(options.take("table-path", required=True))
        # With a primary key: a checkpoint's changes merged by it (exactly-once upserts).
        key = list(table.primary_key or ())
        sink = DeltaSink(path, "upsert", key=key) if key else DeltaSink(path)
    elif connector == "jetstream":
        servers = options.take("servers", required=True)
        subject = options.take("subject", required=True)
        sink = JetStreamSink(str(servers).split(","), str(subject))
    else:
        raise table.option_error(
            "connector",
            f"unknown sink connector {connector!r} (print, blackhole, filesystem, kafka, "
            "upsert-kafka, jdbc, delta, jetstream)",
        )
    options.done()
    changelog = "append"
    if every_change:
        changelog = "all"
    elif connector == "upsert-kafka" or (connector in ("jdbc", "delta") and table.primary_key):
        changelog = "upsert"
    return SinkBinding(
        sink, takes_batches=bool(getattr(sink, "accepts_batches", False)), changelog=changelog
    )
