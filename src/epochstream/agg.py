"""The aggregate calls of a columnar SQL window aggregation (``.window(...).aggregate``):
each returns an :class:`~epochstream.graph.specs.AggCall`, the output column name last.

Example::

    (bids.key_by(["auction", "bidder"])
        .window(es.SlidingEventTimeWindows.of(10_000, 2_000))
        .aggregate(
            es.agg.count_star("bids"),
            es.agg.sum("price", "total"),
            es.agg.count("channel", "channels", distinct=True),
            es.agg.max("price", "top", filter="is_new"),
        ))
"""

from __future__ import annotations

from epochstream.graph.specs import AggCall

__all__ = ["avg", "count", "count_star", "max", "min", "sum"]


def count_star(output: str, *, filter: str | None = None) -> AggCall:
    """``COUNT(*)``: rows per key and window. Example: ``es.agg.count_star("n")``"""
    return AggCall("count_star", None, output, filter=filter)


def count(
    column: str, output: str, *, distinct: bool = False, filter: str | None = None
) -> AggCall:
    """``COUNT([DISTINCT] column)``: its non-null (distinct) values.
    Example: ``es.agg.count("bidder", "bidders", distinct=True)``"""
    return AggCall("count", column, output, distinct=distinct, filter=filter)


def sum(column: str, output: str, *, filter: str | None = None) -> AggCall:
    """``SUM(column)``: int64 for integers, float64 for floats, NULL if all NULL.
    Example: ``es.agg.sum("price", "total")``"""
    return AggCall("sum", column, output, filter=filter)


def min(column: str, output: str, *, filter: str | None = None) -> AggCall:
    """``MIN(column)`` (the column's type; NaN only when every value is NaN).
    Example: ``es.agg.min("price", "low")``"""
    return AggCall("min", column, output, filter=filter)


def max(column: str, output: str, *, filter: str | None = None) -> AggCall:
    """``MAX(column)`` (the column's type; NaN if any value is NaN).
    Example: ``es.agg.max("price", "top")``"""
    return AggCall("max", column, output, filter=filter)


def avg(column: str, output: str, *, filter: str | None = None) -> AggCall:
    """``AVG(column)``: float64 for floats; for integers an int64 truncated toward zero
    (Flink's integer AVG). Example: ``es.agg.avg("price", "mean_price")``"""
    return AggCall("avg", column, output, filter=filter)
