"""The Nexmark queries as DuckDB SQL over the files of ``es.sources.nexmark.write_nexmark_files``: the
expected results epochstream's (and the peers') outputs are checked against.

:func:`expected` runs a query's SQL; :func:`canonical` turns a job's output rows into
the same form. The canonical form of each query:

- q0, q1, q2, q3, q5, q7, q8, q11: the sorted list of result rows as tuples (every row
  is final: these outputs are append-only). q1 computes ``0.908 * price`` in double
  precision and truncates, as Python's ``int()`` and Flink's ``CAST(... AS BIGINT)`` do
  (DuckDB's own decimal product and rounding cast would differ by one on some rows).
- q4 emits an update per winning bid; the canonical form is the final
  ``(category, average, auctions)`` per category (the row with the most auctions).
- q12 windows follow processing time, which no oracle can know: the canonical form is
  the total number of bids per bidder over all windows, ``(bidder, bids)`` sorted.

Window boundaries are aligned to the epoch (``date_time // size * size``), as the
API's windows with offset 0. No record is late in these comparisons: the generator's
out-of-orderness (under one shuffle group of event time) stays below the 4 s watermark
bound, which the tests check.

Example::

    es.sources.nexmark.write_nexmark_files("/tmp/nx", config)
    assert canonical("q7", rows) == expected("q7", "/tmp/nx")
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import duckdb

__all__ = ["SQL", "canonical", "expected"]

_W = 10_000
_SLIDE = 2_000

SQL: dict[str, str] = {
    "q0": "SELECT auction, bidder, price, date_time, extra FROM bid",
    "q1": """
        SELECT auction, bidder, CAST(trunc(CAST(0.908 AS DOUBLE) * price) AS BIGINT), date_time, extra
        FROM bid""",
    "q2": "SELECT auction, price FROM bid WHERE auction % 123 = 0",
    "q3": """
        SELECT p.name, p.city, p.state, a.id
        FROM auction a JOIN person p ON a.seller = p.id
        WHERE a.category = 10 AND p.state IN ('OR', 'ID', 'CA')""",
    "q4": """
        WITH winning AS (
            SELECT a.id, a.category, max(b.price) AS final
            FROM auction a JOIN bid b
              ON a.id = b.auction AND b.date_time BETWEEN a.date_time AND a.expires
            GROUP BY a.id, a.category)
        SELECT category, sum(final) // count(*), count(*) FROM winning GROUP BY category""",
    "q5": f"""
        WITH hop AS (
            SELECT auction, (date_time // {_SLIDE} - k) * {_SLIDE} AS ws
            FROM bid CROSS JOIN range(0, {_W // _SLIDE}) AS t(k)),
        counts AS (SELECT ws, auction, count(*) AS num FROM hop GROUP BY ws, auction),
        most AS (SELECT ws, max(num) AS num FROM counts GROUP BY ws)
        SELECT c.ws, c.auction, c.num FROM counts c JOIN most m ON c.ws = m.ws AND c.num = m.num""",
    "q7": f"""
        WITH w AS (SELECT *, date_time // {_W} * {_W} AS ws FROM bid),
        top AS (SELECT ws, max(price) AS price FROM w GROUP BY ws)
        SELECT w.auction, w.price, w.bidder, w.date_time, w.extra
        FROM w JOIN top t ON w.ws = t.ws AND w.price = t.price""",
    "q8": f"""
        SELECT p.id, p.name, p.date_time // {_W} * {_W} AS ws
        FROM person p
        JOIN (SELECT DISTINCT seller, date_time // {_W} * {_W} AS ws FROM auction) a
          ON p.id = a.seller AND p.date_time // {_W} * {_W} = a.ws""",
    # A bid opens a new session when it comes more than the gap after the bidder's
    # previous one (bids exactly one gap apart share a session, as touching windows merge).
    "q11": f"""
        WITH ordered AS (
            SELECT bidder, date_time,
                   CASE WHEN date_time - lag(date_time) OVER (PARTITION BY bidder ORDER BY date_time)
                             <= {_W} THEN 0 ELSE 1 END AS starts
            FROM bid),
        numbered AS (
            SELECT bidder, date_time,
                   sum(starts) OVER (PARTITION BY bidder ORDER BY date_time
                                     ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS session
            FROM ordered)
        SELECT bidder, count(*), min(date_time), max(date_time) + {_W}
        FROM numbered GROUP BY bidder, session""",
    "q12": "SELECT bidder, count(*) FROM bid GROUP BY bidder",
}


def expected(query: str, directory: str | os.PathLike[str]) -> list[tuple[Any, ...]]:
    """The canonical result of ``query`` over the Parquet files in ``directory``.

    Example: ``expected("q2", "/tmp/nx")[:1] == [(1107, 2755)]``
    """
    if query not in SQL:
        raise ValueError(f"unknown Nexmark query {query!r}; known: {sorted(SQL)}")
    db = duckdb.connect()
    try:
        for table in ("person", "auction", "bid"):
            path = os.path.join(os.fspath(directory), f"{table}.parquet")
            db.execute(f"CREATE VIEW {table} AS SELECT * FROM read_parquet('{path}')")
        rows = db.execute(SQL[query]).fetchall()
    finally:
        db.close()
    return sorted(tuple(r) for r in rows)


def canonical(query: str, rows: Iterable[Iterable[Any]]) -> list[tuple[Any, ...]]:
    """A job's output rows of ``query`` in the form :func:`expected` returns.

    Example: ``canonical("q4", [(10, 500, 1), (10, 450, 2)]) == [(10, 450, 2)]``
    """
    tuples = [tuple(r) for r in rows]
    if query == "q4":
        final: dict[Any, tuple[Any, ...]] = {}
        for row in tuples:
            if row[0] not in final or row[2] > final[row[0]][2]:
                final[row[0]] = row
        return sorted(final.values())
    if query == "q12":
        totals: dict[Any, int] = {}
        for bidder, count, *_ in tuples:
            totals[bidder] = totals.get(bidder, 0) + count
        return sorted(totals.items())
    return sorted(tuples)
