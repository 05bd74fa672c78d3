"""What SQL statements can name: tables (from DDL or from a DataStream), views and
functions, with the time attributes and connector options of each table.

A table from ``CREATE TABLE`` keeps its declared columns (Flink types), the rowtime
column and watermark delay from ``WATERMARK FOR``, a ``PROCTIME()`` column if declared,
its primary key, and its ``WITH`` options (read by :mod:`epochstream.sql.connectors`).
A table from :meth:`Environment.create_table <epochstream.Environment.create_table>`
keeps the stream it reads (an opaque handle: this layer never touches the API).

Example::

    catalog = Catalog()
    [create] = parse_script("CREATE TABLE t (a BIGINT, ts TIMESTAMP(3), "
                            "WATERMARK FOR ts AS ts - INTERVAL '1' SECOND) "
                            "WITH ('connector' = 'blackhole')")
    table = catalog.create_table(create)
    table.rowtime, table.watermark_delay_ms      # 'ts', 1000
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

from sqlglot import exp

from epochstream.exceptions import SqlError
from epochstream.sql.dialect import MetadataColumn, WithOptions, primary_key, sql_error
from epochstream.sql.expressions import Field, interval_ms
from epochstream.sql.functions import FunctionCatalog
from epochstream.sql.types import SqlType

__all__ = ["Catalog", "TableDef", "interval_ms"]


@dataclass(frozen=True)
class TableDef:
    """One table: its columns, time attributes, options and where it comes from.

    ``fields``: the columns a query sees, in order. ``rowtime``: the event-time column
    (its values are also the batches' ``_ts``), with ``watermark_delay_ms``.
    ``proctime``: a ``PROCTIME()`` column (filled when read). ``options``: the ``WITH``
    options (connector tables). ``stream``: the DataStream of a registered stream.
    ``partition_by``: the ``PARTITIONED BY`` columns (``partition_node`` its position).

    Example: ``TableDef("t", (Field("a", SqlType.parse("BIGINT")),), {"connector": "print"})``
    """

    name: str
    fields: tuple[Field, ...]
    options: dict[str, str] = field(default_factory=dict)
    rowtime: str | None = None
    watermark_delay_ms: int = 0
    proctime: str | None = None
    primary_key: tuple[str, ...] = ()
    stream: Any = None
    #: The positions of the options' values in the DDL, for errors that name them.
    option_nodes: dict[str, exp.Expression] = field(default_factory=dict, compare=False)
    partition_by: tuple[str, ...] = ()
    partition_node: exp.Expression | None = field(default=None, compare=False)

    @property
    def connector(self) -> str | None:
        """The ``'connector'`` option, or None for a registered stream."""
        return self.options.get("connector")

    def field(self, name: str) -> Field | None:
        """The column ``name`` (case-sensitive, as Flink), or None."""
        for f in self.fields:
            if f.name == name:
                return f
        return None

    def option_error(self, key: str, message: str) -> SqlError:
        """A :class:`SqlError` at the option ``key``'s position in the DDL."""
        return sql_error(
            self.option_nodes.get(key), f"table {self.name!r}, option '{key}': {message}"
        )


class Catalog:
    """Tables, views and functions by name (names are case-sensitive, as in Flink).

    Example: ``catalog.table("bid")`` after ``catalog.create_table(create_stmt)``
    """

    def __init__(self, functions: FunctionCatalog | None = None) -> None:
        self.functions = functions if functions is not None else FunctionCatalog()
        self._tables: dict[str, TableDef] = {}
        self._views: dict[str, exp.Expression] = {}

    # -------------------------------------------------------------- lookups

    def table(self, name: str) -> TableDef | None:
        """The table ``name`` or None."""
        return self._tables.get(name)

    def view(self, name: str) -> exp.Expression | None:
        """The query of view ``name`` (a copy: planning rewrites it) or None."""
        query = self._views.get(name)
        return None if query is None else query.copy()

    def names(self) -> list[str]:
        """Every table and view name, sorted (for "unknown table" errors)."""
        return sorted({*self._tables, *self._views})

    # -------------------------------------------------------------- registration

    def _check_free(self, name: str, node: exp.Expression, if_not_exists: bool) -> bool:
        if name in self._tables or name in self._views:
            if if_not_exists:
                return False
            raise sql_error(node, f"table or view {name!r} exists already")
        return True

    def add_stream(
        self, name: str, stream: Any, fields: tuple[Field, ...], rowtime: str | None
    ) -> TableDef:
        """Register a DataStream under ``name`` (see ``Environment.create_table``)."""
        if name in self._tables or name in self._views:
            raise SqlError(f"table or view {name!r} exists already")
        table = TableDef(name, fields, rowtime=rowtime, stream=stream)
        self._tables[name] = table
        return table

    def create_view(self, create: exp.Create) -> None:
        """``CREATE [TEMPORARY] VIEW name AS query``."""
        name = create.this.name
        if self._check_free(name, create.this, bool(create.args.get("exists"))):
            self._views[name] = create.expression

    def drop(self, drop: exp.Drop) -> None:
        """``DROP TABLE|VIEW [IF EXISTS] name``."""
        for table in drop.args.get("tables") or [drop.this]:
            name = table.name
            if self._tables.pop(name, None) is None and self._views.pop(name, None) is None:
                if not drop.args.get("exists"):
                    raise sql_error(table, f"no table or view {name!r}")

    def create_function(self, create: exp.Create) -> None:
        """``CREATE [TEMPORARY] FUNCTION name AS 'package.module.function' LANGUAGE PYTHON``:
        the function is imported now (an error names what failed) and registered."""
        name = create.this.name
        props = create.args.get("properties")
        language = next(
            (
                p.this.name.upper()
                for p in (props.expressions if props else [])
                if isinstance(p, exp.LanguageProperty)
            ),
            None,
        )
        if language != "PYTHON":
            raise sql_error(
                create.this,
                f"CREATE FUNCTION {name}: only Python functions are supported; add "
                "LANGUAGE PYTHON and name a module-level function as 'package.module.function'",
            )
        target = create.expression.name if create.expression is not None else ""
        module_name, _, attr = target.rpartition(".")
        if not module_name:
            raise sql_error(
                create.expression, f"expected 'package.module.function', got {target!r}"
            )
        try:
            fn = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as err:
            raise sql_error(
                create.expression, f"CREATE FUNCTION {name}: cannot import {target!r}: {err}"
            ) from None
        self.functions.register(name, fn)

    def create_table(self, create: exp.Create) -> TableDef:
        """Register ``CREATE TABLE`` (columns, ``WATERMARK``, ``PROCTIME()``, key, ``WITH``)."""
        name = create.this.this.name
        if not self._check_free(name, create.this, bool(create.args.get("exists"))):
            return self._tables[name]
        if create.expression is not None:
            raise sql_error(create.expression, "CREATE TABLE ... AS SELECT is not supported")
        fields: list[Field] = []
        rowtime: str | None = None
        delay = 0
        proctime: str | None = None
        for node in create.this.expressions:
            if isinstance(node, exp.ColumnDef):
                proctime = self._column(node, fields, proctime)
            elif isinstance(node, exp.WatermarkColumnConstraint):
                if rowtime is not None:
                    raise sql_error(node, "a table has at most one WATERMARK")
                rowtime, delay = _watermark(node)
        columns = [f.name for f in fields]
        if len(set(columns)) != len(columns):
            raise sql_error(create.this, f"table {name!r} declares a column twice")
        if rowtime is not None:
            declared = next((f for f in fields if f.name == rowtime), None)
            if declared is None:
                raise sql_error(create.this, f"WATERMARK FOR {rowtime}: no column {rowtime!r}")
            if not declared.type.name.startswith("TIMESTAMP"):
                raise sql_error(
                    create.this,
                    f"WATERMARK FOR {rowtime}: the column is {declared.type.sql()}, "
                    "a rowtime attribute must be TIMESTAMP(3) or TIMESTAMP_LTZ(3)",
                )
        key, not_enforced = primary_key(create)
        if key and not not_enforced:
            raise sql_error(
                create.this,
                "PRIMARY KEY must be declared NOT ENFORCED (Flink does not own the data to "
                "check it)",
            )
        options, option_nodes, partitioned = _options(create)
        partition_by = _partition_columns(name, partitioned, columns)
        if "connector" not in options:
            raise sql_error(create.this, f"table {name!r} needs a 'connector' option in WITH (...)")
        table = TableDef(
            name,
            tuple(fields),
            options=options,
            rowtime=rowtime,
            watermark_delay_ms=delay,
            proctime=proctime,
            primary_key=tuple(key),
            option_nodes=option_nodes,
            partition_by=partition_by,
            partition_node=partitioned,
        )
        self._tables[name] = table
        return table

    def _column(self, node: exp.ColumnDef, fields: list[Field], proctime: str | None) -> str | None:
        kind = node.args.get("kind")
        computed = next(
            (c.kind for c in node.constraints if isinstance(c.kind, exp.ComputedColumnConstraint)),
            None,
        )
        if any(isinstance(c.kind, MetadataColumn) for c in node.constraints):
            raise sql_error(node, f"column {node.name}: METADATA columns are not supported yet")
        if computed is not None:
            expr = computed.this
            if isinstance(expr, exp.Anonymous) and expr.name.upper() == "PROCTIME":
                if proctime is not None:
                    raise sql_error(node, "a table has at most one PROCTIME() column")
                fields.append(Field(node.name, SqlType.parse("TIMESTAMP_LTZ(3)")))
                return node.name
            raise sql_error(
                expr,
                f"computed column {node.name}: only 'AS PROCTIME()' is supported; compute "
                "other values in the query",
            )
        if kind is None:
            raise sql_error(node, f"column {node.name} needs a type")
        fields.append(Field(node.name, SqlType.from_ddl(kind)))
        return proctime


def _watermark(node: exp.WatermarkColumnConstraint) -> tuple[str, int]:
    column = node.this.name
    expr = node.expression
    if isinstance(expr, exp.Column) and expr.name == column:
        return column, 0
    if (
        isinstance(expr, exp.Sub)
        and isinstance(expr.this, exp.Column)
        and expr.this.name == column
        and isinstance(expr.expression, exp.Interval)
    ):
        return column, interval_ms(expr.expression)
    raise sql_error(
        expr,
        f"WATERMARK FOR {column} supports '{column}' or '{column} - INTERVAL '<n>' <unit>'",
    )


def _options(
    create: exp.Create,
) -> tuple[dict[str, str], dict[str, exp.Expression], exp.PartitionedByProperty | None]:
    """The ``WITH`` options, their nodes, and the ``PARTITIONED BY`` clause if any."""
    options: dict[str, str] = {}
    nodes: dict[str, exp.Expression] = {}
    partitioned: exp.PartitionedByProperty | None = None
    props = create.args.get("properties")
    for prop in props.expressions if props is not None else []:
        if isinstance(prop, exp.PartitionedByProperty):
            partitioned = prop
            continue
        if not isinstance(prop, WithOptions):
            raise sql_error(prop, f"unsupported table property {prop.sql()}")
        for option in prop.expressions:
            key = option.this.name
            if key in options:
                raise sql_error(option, f"option '{key}' given twice")
            options[key] = option.expression.name
            nodes[key] = option
    return options, nodes, partitioned


def _partition_columns(
    table: str, node: exp.PartitionedByProperty | None, columns: list[str]
) -> tuple[str, ...]:
    """The ``PARTITIONED BY (a, b)`` columns: declared ones, each once."""
    if node is None:
        return ()
    target = node.this
    items = target.expressions if isinstance(target, exp.Schema) else [target]
    names: list[str] = []
    for item in items:
        if not isinstance(item, exp.Identifier | exp.Column):
            raise sql_error(item, f"table {table!r}: PARTITIONED BY takes column names")
        name = item.name
        if name not in columns:
            raise sql_error(item, f"table {table!r}: PARTITIONED BY {name}: no column {name!r}")
        if name in names:
            raise sql_error(item, f"table {table!r}: PARTITIONED BY names {name!r} twice")
        names.append(name)
    return tuple(names)
