"""Rewrites of Flink's older syntax into what the planner plans: the deprecated group
windows (``GROUP BY k, SESSION(t, INTERVAL ..)`` with ``SESSION_START(..)``,
``_END``, ``_ROWTIME``; TUMBLE and HOP alike) as the window TVFs they mean.

Example: ``legacy_group_window(select)`` for Nexmark q11's ``GROUP BY B.bidder, SESSION(...)``
"""

from __future__ import annotations

from sqlglot import exp

from epochstream.sql.conditions import text_of
from epochstream.sql.dialect import WindowTVF, sql_error

__all__ = ["legacy_group_window"]


_LEGACY = {"TUMBLE": ("size",), "HOP": ("slide", "size"), "SESSION": ("gap",)}
_LEGACY_PROPERTIES = {"START": "window_start", "END": "window_end", "ROWTIME": "window_time"}


def legacy_group_window(select: exp.Select) -> exp.Select:
    """Flink's deprecated group windows (``GROUP BY k, SESSION(t, INTERVAL ..)`` with
    ``SESSION_START(..)``/``_END``/``_ROWTIME``, and TUMBLE/HOP alike) as the window TVF
    they mean (SESSION partitioned by the other group keys); other SELECTs unchanged."""
    group = select.args.get("group")
    calls = [
        g
        for g in (group.expressions if group is not None else [])
        if isinstance(g, exp.Anonymous) and g.name.upper() in _LEGACY
    ]
    if not calls:
        return select
    if len(calls) > 1:
        raise sql_error(calls[1], "GROUP BY takes one group window")
    call = calls[0]
    kind = call.name.upper()
    source = select.args["from_"].this
    if not isinstance(source, exp.Table) or select.args.get("joins"):
        raise sql_error(call, f"GROUP BY {kind}(...) reads one table; use the {kind} window TVF")
    time, *intervals = call.expressions
    if not isinstance(time, exp.Column) or len(intervals) != len(_LEGACY[kind]):
        raise sql_error(call, f"{kind}(time_column, {', '.join(_LEGACY[kind])})")
    rewritten = select.copy()
    group = rewritten.args["group"]
    keys = [g for g in group.expressions if text_of(g) != text_of(call)]
    tvf = WindowTVF(
        this=exp.Var(this=kind),
        table=exp.Table(this=source.this.copy()),
        timecol=exp.column(time.name),
        **{name: value.copy() for name, value in zip(_LEGACY[kind], intervals, strict=True)},
    )
    if kind == "SESSION":
        tvf.set("partition_by", [exp.column(k.name) for k in keys if isinstance(k, exp.Column)])
    tvf.set("alias", source.args.get("alias"))
    tvf.meta.update(call.meta)
    rewritten.args["from_"].set("this", tvf)
    group.set("expressions", [*keys, exp.column("window_start"), exp.column("window_end")])
    for f in list(rewritten.find_all(exp.Anonymous)):
        prefix, _, prop = f.name.upper().rpartition("_")
        if prefix == kind and prop in _LEGACY_PROPERTIES:
            f.replace(exp.column(_LEGACY_PROPERTIES[prop]))
    return rewritten
