"""OVER aggregations in SQL, end to end: Flink's OVER queries over the Nexmark bids
(INSERT INTO a Parquet table, parallelism 2, checkpoints) equal to DuckDB's window
functions with the same frames over the same events, and Flink's refusals with their
positions."""

from __future__ import annotations

from pathlib import Path

import pytest
from duckdb_oracle import run_duckdb
from nexmark_tables import nexmark_arrow_tables, nexmark_ddl, run_select

import epochstream as es

EVENTS = 8_000


@pytest.fixture(scope="module")
def tables() -> dict:
    return nexmark_arrow_tables(events=EVENTS)


def _norm(rows: list[tuple[object, ...]]) -> list[tuple[object, ...]]:
    out = [tuple(round(v, 6) if isinstance(v, float) else v for v in r) for r in rows]
    return sorted(out, key=lambda r: tuple((v is None, str(v)) for v in r))


RANGE_10S = (
    "PARTITION BY auction ORDER BY `dateTime` RANGE BETWEEN INTERVAL '10' SECOND PRECEDING "
    "AND CURRENT ROW"
)
CASES = {
    # Every aggregate over a 10 s RANGE frame (peers of equal time included).
    "range": (
        f"SELECT auction, price, `dateTime`, COUNT(*) OVER ({RANGE_10S}) AS n, "
        f"SUM(price) OVER ({RANGE_10S}) AS total, AVG(price) OVER ({RANGE_10S}) AS mean, "
        f"MIN(price) OVER ({RANGE_10S}) AS low, MAX(price) OVER ({RANGE_10S}) AS high "
        "FROM bid WHERE MOD(auction, 3) = 0",
        [
            ("auction", "BIGINT"),
            ("price", "BIGINT"),
            ("dateTime", "TIMESTAMP(3)"),
            ("n", "BIGINT"),
            ("total", "BIGINT"),
            ("mean", "BIGINT"),
            ("low", "BIGINT"),
            ("high", "BIGINT"),
        ],
    ),
    # A named window, UNBOUNDED RANGE (Flink's default frame), a computed argument.
    "unbounded_named": (
        "SELECT bidder, price, `dateTime`, COUNT(*) OVER w AS n, MAX(price * 2) OVER w AS top "
        "FROM bid WINDOW w AS (PARTITION BY bidder ORDER BY `dateTime`)",
        [
            ("bidder", "BIGINT"),
            ("price", "BIGINT"),
            ("dateTime", "TIMESTAMP(3)"),
            ("n", "BIGINT"),
            ("top", "BIGINT"),
        ],
    ),
    # ROWS frames: DuckDB orders ties arbitrarily, so only what does not tell tied rows
    # apart is compared (each (auction, dateTime) with its counts).
    "rows": (
        "SELECT auction, `dateTime`, COUNT(*) OVER (PARTITION BY auction ORDER BY "
        "`dateTime` ROWS BETWEEN 3 PRECEDING AND CURRENT ROW) AS n FROM bid",
        [("auction", "BIGINT"), ("dateTime", "TIMESTAMP(3)"), ("n", "BIGINT")],
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_over_query_equals_duckdb(case: str, tables: dict, tmp_path: Path) -> None:
    select, columns = CASES[case]
    got = run_select(select, columns, str(tmp_path), events=EVENTS)
    expected = run_duckdb(select, tables)
    assert len(got) == len(expected) > 0
    assert _norm(got) == _norm(expected)


REFUSED = [
    (
        "SELECT SUM(price) OVER (PARTITION BY auction ORDER BY price) FROM bid",
        "must be defined on a time attribute",
    ),
    (
        "SELECT SUM(price) OVER (PARTITION BY auction ORDER BY `dateTime` DESC) FROM bid",
        "ascending, not DESC",
    ),
    (
        "SELECT SUM(price) OVER (PARTITION BY auction ORDER BY `dateTime` ROWS BETWEEN "
        "CURRENT ROW AND 2 FOLLOWING) FROM bid",
        "ends at CURRENT ROW",
    ),
    (
        "SELECT SUM(price) OVER (PARTITION BY auction ORDER BY `dateTime`), COUNT(*) OVER "
        "(PARTITION BY bidder ORDER BY `dateTime`) FROM bid",
        "must be computed on the same window",
    ),
    (
        "SELECT SUM(n) OVER (PARTITION BY auction ORDER BY t) FROM (SELECT auction, "
        "COUNT(*) AS n, MAX(`dateTime`) AS t FROM bid GROUP BY auction)",
        "an OVER aggregation over an updating input",
    ),
    (
        "SELECT SUM(price) OVER (PARTITION BY auction ORDER BY `dateTime` RANGE BETWEEN 5 "
        "PRECEDING AND CURRENT ROW) FROM bid",
        "takes an INTERVAL",
    ),
    ("SELECT SUM(price) OVER w FROM bid WINDOW v AS (ORDER BY `dateTime`)", "unknown window"),
    (
        "SELECT SUM(price) OVER (PARTITION BY auction ORDER BY `dateTime` ROWS BETWEEN 2 "
        "PRECEDING AND 1 PRECEDING) FROM bid",
        "ends at CURRENT ROW",
    ),
    (
        "SELECT RANK() OVER (PARTITION BY auction ORDER BY `dateTime`) FROM bid",
        "OVER is not supported",
    ),
]


@pytest.mark.parametrize(("sql", "message"), REFUSED)
def test_refused_over_queries_name_the_position_and_reason(sql: str, message: str) -> None:
    env = es.Environment(parallelism=1, runner="local")
    env.execute_sql(nexmark_ddl(events=100))
    with pytest.raises(es.SqlError, match=r"line \d+, column \d+: ") as info:
        env.explain_sql(sql)
    assert message in str(info.value)


def test_explain_shows_the_over_aggregate_its_frame_and_state() -> None:
    env = es.Environment(parallelism=1, runner="local")
    env.execute_sql(nexmark_ddl(events=100))
    plan = env.explain_sql(
        "SELECT auction, SUM(price) OVER (PARTITION BY auction ORDER BY `dateTime` ROWS "
        "BETWEEN 3 PRECEDING AND CURRENT ROW) AS s FROM bid"
    )
    assert "over-aggregate [sql-over-aggregate-" in plan
    short = env.explain_sql(  # Flink's short form: ROWS 3 PRECEDING
        "SELECT auction, SUM(price) OVER (PARTITION BY auction ORDER BY `dateTime` ROWS 3 "
        "PRECEDING) AS s FROM bid"
    )
    assert "frame: ROWS BETWEEN 3 PRECEDING AND CURRENT ROW" in short
    assert "frame: ROWS BETWEEN 3 PRECEDING AND CURRENT ROW" in plan
    assert "state: rows until the watermark passes them; per key the last 3 rows" in plan
    # Only the columns the query reads pass through the operator (and the time attribute).
    assert "columns: auction BIGINT, price BIGINT, dateTime TIMESTAMP(3) *ROWTIME*, $o0" in plan


@pytest.mark.slow
def test_processing_time_over_counts_each_keys_rows_by_arrival(tmp_path: Path) -> None:
    """Over processing time the frames depend on arrival, but an UNBOUNDED ROWS count
    does not: each bidder's rows come out numbered 1, 2, ... once each."""
    setup = "CREATE VIEW pbid AS SELECT *, PROCTIME() AS p FROM bid"
    got = run_select(
        "SELECT bidder, COUNT(*) OVER (PARTITION BY bidder ORDER BY p ROWS BETWEEN UNBOUNDED "
        "PRECEDING AND CURRENT ROW) AS n FROM pbid",
        [("bidder", "BIGINT"), ("n", "BIGINT")],
        str(tmp_path),
        events=2_000,
        setup=setup,
    )
    per_bidder: dict[object, list[object]] = {}
    for bidder, n in got:
        per_bidder.setdefault(bidder, []).append(n)
    assert per_bidder
    assert all(sorted(ns) == list(range(1, len(ns) + 1)) for ns in per_bidder.values())


def test_explain_marks_a_processing_time_over() -> None:
    env = es.Environment(parallelism=1, runner="local")
    env.execute_sql(nexmark_ddl(events=100))
    env.execute_sql("CREATE VIEW pbid AS SELECT *, PROCTIME() AS p FROM bid")
    plan = env.explain_sql(
        "SELECT auction, SUM(price) OVER (PARTITION BY auction ORDER BY p RANGE BETWEEN "
        "INTERVAL '1' SECOND PRECEDING AND CURRENT ROW) AS s FROM pbid"
    )
    assert "RANGE BETWEEN 1000 ms PRECEDING AND CURRENT ROW (processing time)" in plan
    assert "emits: each row once, on arrival" in plan


def test_over_a_top_n_is_refused_with_its_reason() -> None:
    """A Top-N's ranking is updating (refused, as Nexmark q6 is); a window Top-N's rows
    carry no event-time attribute (its rows' time is their window's end)."""
    env = es.Environment(parallelism=1, runner="local")
    env.execute_sql(nexmark_ddl(events=100))
    ranked = "SELECT *, ROW_NUMBER() OVER (PARTITION BY {p} ORDER BY price DESC) AS rn FROM {t}"
    over = "COUNT(*) OVER (PARTITION BY auction ORDER BY `dateTime`)"
    with pytest.raises(es.SqlError, match="an OVER aggregation over an updating input"):
        env.explain_sql(
            f"SELECT auction, {over} FROM ({ranked.format(p='auction', t='bid')}) WHERE rn <= 1"
        )
    windowed = "TABLE(TUMBLE(TABLE bid, DESCRIPTOR(`dateTime`), INTERVAL '10' SECOND))"
    with pytest.raises(es.SqlError, match="must be defined on a time attribute"):
        env.explain_sql(
            f"SELECT auction, {over} AS n FROM "
            f"({ranked.format(p='window_start, window_end', t=windowed)}) WHERE rn <= 3"
        )
