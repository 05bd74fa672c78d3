"""The SQL tests' oracle: the same Flink SQL, rewritten for DuckDB and run over the same
events as Arrow tables.

Window TVFs become subqueries that add ``window_start``/``window_end``/``window_time``
(one row per window a row belongs to), and Flink functions whose DuckDB namesake
behaves differently are spelled out (``REGEXP_EXTRACT``'s NULL on no match and default
group, ``AVG`` of integers, ``DATE_FORMAT``'s Java patterns, ``SPLIT_INDEX``). sqlglot's
own transpilation is not trusted for these: it drops ``REGEXP_EXTRACT``'s group, which
DuckDB then reads as group 0.

Example::

    rows = run_duckdb("SELECT auction FROM bid WHERE price > 10", {"bid": bid_table})
"""

from __future__ import annotations

from typing import Any

import duckdb
import pyarrow as pa
import sqlglot
from sqlglot import exp

from epochstream.sql.catalog import interval_ms
from epochstream.sql.dialect import WindowTVF, parse_script


def _duckdb(sql: str) -> exp.Expression:
    return sqlglot.parse_one(sql, read="duckdb")


def _tvf_subquery(tvf: WindowTVF) -> exp.Expression:
    kind = tvf.kind
    src = tvf.args["table"].sql(dialect="duckdb")
    t = f"epoch_ms(CAST({tvf.args['timecol'].sql(dialect='duckdb')} AS TIMESTAMP))"
    off = interval_ms(tvf.args["offset"]) if tvf.args.get("offset") else 0
    size = interval_ms(tvf.args["size"]) if tvf.args.get("size") else 0
    if kind == "TUMBLE":
        ws = f"({t} - (({t} - {off}) % {size} + {size}) % {size})"
        body = f"SELECT *, {ws} AS __ws, {ws} + {size} AS __we FROM {src}"
    elif kind == "HOP":
        slide = interval_ms(tvf.args["slide"])
        last = f"({t} - (({t} - {off}) % {slide} + {slide}) % {slide})"
        n = -(-size // slide)
        body = (
            f"SELECT * EXCLUDE (__k), __ws, __ws + {size} AS __we FROM (SELECT *, "
            f"{last} - __k * {slide} AS __ws FROM {src} CROSS JOIN range(0, {n}) AS __r(__k)) "
            f"WHERE __ws + {size} > {t}"
        )
    elif kind == "CUMULATE":
        step = interval_ms(tvf.args["step"])
        base = f"({t} - (({t} - {off}) % {size} + {size}) % {size})"
        body = (
            f"SELECT * EXCLUDE (__k), {base} AS __ws, {base} + __k * {step} AS __we FROM {src} "
            f"CROSS JOIN range(1, {size // step + 1}) AS __r(__k) WHERE {base} + __k * {step} > {t}"
        )
    elif kind == "SESSION":
        gap = interval_ms(tvf.args["gap"])
        part = ", ".join(c.sql(dialect="duckdb") for c in tvf.args.get("partition_by") or [])
        by = f"PARTITION BY {part} " if part else ""
        per_session = f"PARTITION BY __sid{', ' + part if part else ''}"
        # Sessions that touch merge (Flink's TimeWindow.intersects is inclusive).
        body = (
            f"SELECT * EXCLUDE (__new, __sid), min({t}) OVER ({per_session}) AS __ws, "
            f"max({t}) OVER ({per_session}) + {gap} AS __we FROM ("
            f"SELECT *, sum(__new) OVER ({by}ORDER BY {t} ROWS UNBOUNDED PRECEDING) AS __sid FROM ("
            f"SELECT *, CASE WHEN {t} - lag({t}) OVER ({by}ORDER BY {t}) <= {gap} THEN 0 ELSE 1 END "
            f"AS __new FROM {src}))"
        )
    else:
        raise ValueError(f"no DuckDB rewrite for {kind}")
    outer = (
        "SELECT * EXCLUDE (__ws, __we), make_timestamp_ms(__ws) AS window_start, "
        "make_timestamp_ms(__we) AS window_end, make_timestamp_ms(__we - 1) AS window_time "
        f"FROM ({body})"
    )
    alias = tvf.args.get("alias") or exp.TableAlias(this=exp.to_identifier(f"__{kind.lower()}"))
    return exp.Subquery(this=_duckdb(outer), alias=alias)


def _over(window: exp.Window, call: str) -> str:
    """``call`` over ``window``'s OVER clause, as DuckDB SQL."""
    over = window.copy()
    over.set("this", _duckdb(f"SELECT {call}").selects[0])
    return over.sql("duckdb")


def _flink_functions(tree: exp.Expression) -> None:
    java = {"yyyy": "%Y", "MM": "%m", "dd": "%d", "HH": "%H", "mm": "%M", "ss": "%S"}
    for f in list(tree.find_all(exp.Anonymous, exp.RegexpExtract, exp.Avg)):
        if isinstance(f, exp.RegexpExtract):
            s, pat = f.this.sql("duckdb"), f.expression.sql("duckdb")
            # Flink: the third argument is the group (sqlglot files it as "position").
            group = f.args.get("group") or f.args.get("position")
            g = group.sql("duckdb") if group is not None else "1"
            f.replace(
                _duckdb(
                    f"SELECT CASE WHEN regexp_matches({s}, {pat}) "
                    f"THEN regexp_extract({s}, {pat}, {g}) END"
                ).selects[0]
            )
        elif isinstance(f, exp.Avg):
            # Flink's AVG of an integer column is an integer (the sum divided, truncated).
            arg = f.this.sql("duckdb")
            total, mean, target = f"sum({arg})", f"avg({arg})", f
            if isinstance(f.parent, exp.Window):  # an OVER aggregate: each call over it
                target = f.parent
                total, mean = (_over(target, call) for call in (total, mean))
            target.replace(
                _duckdb(
                    f"SELECT CASE WHEN typeof({total}) IN ('HUGEINT', 'BIGINT', 'INTEGER') "
                    f"THEN CAST(trunc({mean}) AS BIGINT) ELSE {mean} END"
                ).selects[0]
            )
        elif isinstance(f, exp.Anonymous) and f.name.upper() == "DATE_FORMAT":
            pattern = f.expressions[1].name
            for k, v in java.items():
                pattern = pattern.replace(k, v)
            f.replace(
                _duckdb(f"SELECT strftime({f.expressions[0].sql('duckdb')}, '{pattern}')").selects[
                    0
                ]
            )
        elif isinstance(f, exp.Anonymous) and f.name.upper() == "SPLIT_INDEX":
            s, d, i = (a.sql("duckdb") for a in f.expressions)
            f.replace(_duckdb(f"SELECT list_extract(string_split({s}, {d}), {i} + 1)").selects[0])


_LEGACY = {"TUMBLE": ("size",), "HOP": ("slide", "size"), "SESSION": ("gap",)}


def _legacy_group_windows(select: exp.Select) -> None:
    """``GROUP BY k, SESSION(t, gap)`` with ``SESSION_START(..)`` etc. as the TVF they
    mean (SESSION partitioned by the other keys), written independently of the planner."""
    group = select.args.get("group")
    for g in list(group.expressions if group is not None else []):
        if not (isinstance(g, exp.Anonymous) and g.name.upper() in _LEGACY):
            continue
        kind = g.name.upper()
        time, *intervals = g.expressions
        keys = [k for k in group.expressions if k is not g]
        table = select.args["from_"].this
        tvf = WindowTVF(
            this=exp.Var(this=kind),
            table=exp.Table(this=table.this.copy()),
            timecol=exp.column(time.name),
            **dict(zip(_LEGACY[kind], intervals, strict=True)),
        )
        if kind == "SESSION":
            tvf.set("partition_by", [exp.column(k.name) for k in keys])
        tvf.set("alias", table.args.get("alias"))
        table.replace(tvf)
        group.set("expressions", [*keys, exp.column("window_start"), exp.column("window_end")])
        for f in list(select.find_all(exp.Anonymous)):
            head, _, prop = f.name.upper().rpartition("_")
            if head == kind and prop in ("START", "END", "ROWTIME"):
                f.replace(
                    exp.column(
                        {"START": "window_start", "END": "window_end"}.get(prop, "window_time")
                    )
                )


def to_duckdb(flink_sql: str) -> str:
    """DuckDB SQL for one Flink query (or the query of an ``INSERT``)."""
    [tree] = parse_script(flink_sql)
    query = tree.expression if isinstance(tree, exp.Insert) else tree
    assert isinstance(query, exp.Expression)
    for select in list(query.find_all(exp.Select)):
        _legacy_group_windows(select)
    for tvf in list(query.find_all(WindowTVF)):
        tvf.replace(_tvf_subquery(tvf))
    _flink_functions(query)
    return query.sql(dialect="duckdb")


def run_duckdb(flink_sql: str, tables: dict[str, pa.Table]) -> list[tuple[Any, ...]]:
    """The rows of ``flink_sql`` over ``tables`` (name -> Arrow table), sorted."""
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    # Nexmark q14's UDF.
    con.execute("CREATE MACRO count_char(s, c) AS length(s) - length(replace(s, c, ''))")
    for name, table in tables.items():
        con.register(f"__{name}", table)
        con.execute(f'CREATE VIEW "{name}" AS SELECT * FROM "__{name}"')
    rows = con.execute(to_duckdb(flink_sql)).fetchall()
    return sorted(rows, key=_sort_key)


def _sort_key(row: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple((v is None, str(type(v)), v if v is not None else 0) for v in row)
