"""Query shapes beyond single Nexmark queries, each equal to DuckDB over the same events:
cascading window aggregation, UNION ALL, WITH, views, HAVING, several aggregates."""

from __future__ import annotations

from pathlib import Path

import pytest
from duckdb_oracle import run_duckdb
from nexmark_tables import nexmark_arrow_tables, run_select

EVENTS = 20_000


@pytest.fixture(scope="module")
def tables() -> dict:
    return nexmark_arrow_tables(events=EVENTS)


def _norm(rows: list[tuple[object, ...]]) -> list[tuple[object, ...]]:
    out = [tuple(round(v, 6) if isinstance(v, float) else v for v in r) for r in rows]
    return sorted(out, key=lambda r: tuple((v is None, str(v)) for v in r))


COUNT_BIDS = (
    "SELECT count(*) AS num, window_start AS starttime, window_end AS endtime "
    "FROM TABLE(HOP(TABLE bid, DESCRIPTOR(`dateTime`), INTERVAL '2' SECOND, "
    "INTERVAL '10' SECOND)) GROUP BY auction, window_start, window_end"
)

CASES = {
    # Nexmark q5's MaxBids: a window aggregation grouped again by its window bounds.
    "cascade": (
        f"SELECT max(CountBids.num) AS maxn, CountBids.starttime, CountBids.endtime "
        f"FROM ({COUNT_BIDS}) AS CountBids GROUP BY CountBids.starttime, CountBids.endtime",
        [("maxn", "BIGINT"), ("starttime", "TIMESTAMP(3)"), ("endtime", "TIMESTAMP(3)")],
    ),
    "session_tvf": (
        "WITH big AS (SELECT * FROM bid WHERE price > 1000) "
        "SELECT bidder, window_start, window_end, MAX(price) AS top "
        "FROM TABLE(SESSION(TABLE big PARTITION BY bidder, DESCRIPTOR(`dateTime`), "
        "INTERVAL '3' SECOND)) GROUP BY bidder, window_start, window_end",
        [
            ("bidder", "BIGINT"),
            ("window_start", "TIMESTAMP(3)"),
            ("window_end", "TIMESTAMP(3)"),
            ("top", "BIGINT"),
        ],
    ),
    "session_many_aggregates": (
        "SELECT bidder, auction, window_start, window_end, COUNT(*) AS n, "
        "COUNT(DISTINCT channel) AS channels, SUM(price) AS total, AVG(price) AS mean, "
        "MIN(price) AS low, MAX(price) FILTER (WHERE price > 1000) AS high "
        "FROM TABLE(SESSION(TABLE bid PARTITION BY (bidder, auction), DESCRIPTOR(`dateTime`), "
        "INTERVAL '2' SECOND)) GROUP BY bidder, auction, window_start, window_end",
        [
            ("bidder", "BIGINT"),
            ("auction", "BIGINT"),
            ("window_start", "TIMESTAMP(3)"),
            ("window_end", "TIMESTAMP(3)"),
            ("n", "BIGINT"),
            ("channels", "BIGINT"),
            ("total", "BIGINT"),
            ("mean", "BIGINT"),
            ("low", "BIGINT"),
            ("high", "BIGINT"),
        ],
    ),
    # Each UNION ALL column in the type all inputs convert to (INT and DOUBLE: DOUBLE).
    "union_common_type": (
        "SELECT auction AS id, CAST(price AS INT) AS x FROM bid WHERE price < 1000 "
        "UNION ALL SELECT id, CAST(initialBid AS DOUBLE) / 7 FROM auction WHERE category = 10",
        [("id", "BIGINT"), ("x", "DOUBLE")],
    ),
    "session_global": (
        "WITH rare AS (SELECT * FROM bid WHERE MOD(price, 97) = 0) "
        "SELECT window_start, window_end, COUNT(*) AS n, MAX(price) AS top "
        "FROM TABLE(SESSION(TABLE rare, DESCRIPTOR(`dateTime`), INTERVAL '50' MILLISECOND)) "
        "GROUP BY window_start, window_end",
        [
            ("window_start", "TIMESTAMP(3)"),
            ("window_end", "TIMESTAMP(3)"),
            ("n", "BIGINT"),
            ("top", "BIGINT"),
        ],
    ),
    # Window Top-N over a window aggregation (the shape of Flink's documentation).
    "window_top_n": (
        "SELECT * FROM ("
        " SELECT *, ROW_NUMBER() OVER (PARTITION BY window_start, window_end "
        "   ORDER BY price DESC) AS rownum"
        " FROM (SELECT window_start, window_end, auction, SUM(price) AS price"
        "       FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(`dateTime`), INTERVAL '5' SECOND))"
        "       GROUP BY window_start, window_end, auction)"
        ") WHERE rownum <= 3",
        [
            ("window_start", "TIMESTAMP(3)"),
            ("window_end", "TIMESTAMP(3)"),
            ("auction", "BIGINT"),
            ("price", "BIGINT"),
            ("rownum", "BIGINT"),
        ],
    ),
    "window_top_n_per_key": (
        "SELECT bidder, price, window_end FROM ("
        " SELECT *, ROW_NUMBER() OVER (PARTITION BY window_start, window_end, bidder "
        "   ORDER BY price DESC, auction) AS rn"
        " FROM (SELECT window_start, window_end, bidder, auction, MAX(price) AS price"
        "       FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(`dateTime`), INTERVAL '5' SECOND))"
        "       GROUP BY window_start, window_end, bidder, auction)"
        ") WHERE rn = 1",
        [("bidder", "BIGINT"), ("price", "BIGINT"), ("window_end", "TIMESTAMP(3)")],
    ),
    "window_assign": (
        "SELECT auction, price, window_start, window_end, window_time "
        "FROM TABLE(HOP(TABLE bid, DESCRIPTOR(`dateTime`), INTERVAL '2' SECOND, "
        "INTERVAL '6' SECOND)) WHERE price > 8000000",
        [
            ("auction", "BIGINT"),
            ("price", "BIGINT"),
            ("window_start", "TIMESTAMP(3)"),
            ("window_end", "TIMESTAMP(3)"),
            ("window_time", "TIMESTAMP(3)"),
        ],
    ),
    # Flink's "window Top-N follows a windowing TVF": the top bids of each window.
    "window_top_n_over_tvf": (
        "SELECT auction, bidder, price, window_end FROM ("
        " SELECT *, ROW_NUMBER() OVER (PARTITION BY window_start, window_end "
        "   ORDER BY price DESC, bidder, auction) AS rn"
        " FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(`dateTime`), INTERVAL '5' SECOND))"
        ") WHERE rn <= 2",
        [
            ("auction", "BIGINT"),
            ("bidder", "BIGINT"),
            ("price", "BIGINT"),
            ("window_end", "TIMESTAMP(3)"),
        ],
    ),
    "union_all": (
        "SELECT auction AS id, price FROM bid WHERE price > 5000000 "
        "UNION ALL SELECT id, initialBid FROM auction WHERE category = 10",
        [("id", "BIGINT"), ("price", "BIGINT")],
    ),
    "with_having": (
        "WITH big AS (SELECT * FROM bid WHERE price > 1000) "
        "SELECT bidder, window_start, COUNT(*) AS n, AVG(price) AS avg_price, "
        "MIN(channel) AS first_channel, COUNT(DISTINCT auction) FILTER (WHERE price > 5000) AS d "
        "FROM TABLE(TUMBLE(TABLE big, DESCRIPTOR(`dateTime`), INTERVAL '5' SECOND)) "
        "GROUP BY bidder, window_start, window_end HAVING COUNT(*) > 1",
        [
            ("bidder", "BIGINT"),
            ("window_start", "TIMESTAMP(3)"),
            ("n", "BIGINT"),
            ("avg_price", "BIGINT"),
            ("first_channel", "STRING"),
            ("d", "BIGINT"),
        ],
    ),
    "cumulate_expression_keys": (
        "SELECT MOD(auction, 7) AS bucket, window_start, window_end, SUM(price) AS total, "
        "MAX(price) - MIN(price) AS spread "
        "FROM TABLE(CUMULATE(TABLE bid, DESCRIPTOR(`dateTime`), INTERVAL '2' SECOND, "
        "INTERVAL '6' SECOND)) GROUP BY MOD(auction, 7), window_start, window_end",
        [
            ("bucket", "BIGINT"),
            ("window_start", "TIMESTAMP(3)"),
            ("window_end", "TIMESTAMP(3)"),
            ("total", "BIGINT"),
            ("spread", "BIGINT"),
        ],
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_query_equals_duckdb(case: str, tables: dict, tmp_path: Path) -> None:
    select, columns = CASES[case]
    got = run_select(select, columns, str(tmp_path), events=EVENTS)
    expected = run_duckdb(select, tables)
    assert len(got) == len(expected)
    assert _norm(got) == _norm(expected)


def test_a_view_is_planned_inline(tables: dict, tmp_path: Path) -> None:
    setup = "CREATE VIEW expensive AS SELECT auction, price FROM bid WHERE price > 3000000"
    select = "SELECT auction, price FROM expensive WHERE MOD(auction, 2) = 0"
    got = run_select(
        select,
        [("auction", "BIGINT"), ("price", "BIGINT")],
        str(tmp_path),
        events=EVENTS,
        setup=setup,
    )
    expected = run_duckdb(
        "SELECT auction, price FROM bid WHERE price > 3000000 AND MOD(auction, 2) = 0", tables
    )
    assert _norm(got) == _norm(expected)


def test_where_over_a_session_tvf_filters_the_rows_the_sessions_are_cut_from(
    tables: dict, tmp_path: Path
) -> None:
    """Flink applies a WHERE over a SESSION TVF before the sessions are cut (as for
    TUMBLE): the same as the TVF over the filtered input. ``window_time`` may be grouped
    by too (it follows from window_end)."""
    columns = [
        ("bidder", "BIGINT"),
        ("window_start", "TIMESTAMP(3)"),
        ("window_end", "TIMESTAMP(3)"),
        ("n", "BIGINT"),
        ("total", "BIGINT"),
    ]
    tail = (
        "DESCRIPTOR(`dateTime`), INTERVAL '1' SECOND)) {where}GROUP BY bidder, window_start, "
        "window_end, window_time HAVING COUNT(*) > 1"
    )
    head = "SELECT bidder, window_start, window_end, COUNT(*) AS n, SUM(price) AS total FROM "
    select = (
        head
        + "TABLE(SESSION(TABLE bid PARTITION BY bidder, "
        + tail.format(where="WHERE MOD(price, 3) = 0 ")
    )
    filtered = (
        "WITH f AS (SELECT * FROM bid WHERE MOD(price, 3) = 0) "
        + head
        + "TABLE(SESSION(TABLE f PARTITION BY bidder, "
        + tail.format(where="")
    )
    got = run_select(select, columns, str(tmp_path), events=EVENTS)
    expected = run_duckdb(filtered, tables)
    assert len(got) == len(expected)
    assert _norm(got) == _norm(expected)
