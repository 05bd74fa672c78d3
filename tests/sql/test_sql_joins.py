"""SQL regular joins (inner, LEFT, RIGHT, FULL OUTER) over append-only tables and over a
GROUP BY's changelog: the changelog ``sql_query`` gives, applied as a multiset, equals
DuckDB's result over the same events (local runner, parallelism 2, checkpoints on).
Also what the planner makes of them: ON conjuncts of a preserved side, WHERE after an
outer join, nullable padded columns, ``updating``, the join type in ``explain``."""

from __future__ import annotations

from pathlib import Path

import pytest
from duckdb_oracle import run_duckdb
from nexmark_tables import changelog_result, nexmark_arrow_tables, nexmark_ddl, read_sink_rows

import epochstream as es
from epochstream.exceptions import SqlError

EVENTS = 6_000


@pytest.fixture(scope="module")
def tables() -> dict:
    return nexmark_arrow_tables(events=EVENTS)


def _sorted(rows: list[tuple[object, ...]]) -> list[tuple[object, ...]]:
    return sorted(rows, key=lambda r: tuple((v is None, str(v)) for v in r))


def _env(tmp_path: Path, setup: str = "") -> es.Environment:
    env = es.Environment(parallelism=2, runner="local")
    env.enable_checkpointing(interval=0.5, storage=str(tmp_path / "ck"))
    env.execute_sql(nexmark_ddl(events=EVENTS))
    if setup:
        env.execute_sql(setup)
    return env


def _changelog(env: es.Environment, select: str, tmp_path: Path) -> list[tuple[object, ...]]:
    """``select``'s changelog written with its row kinds, applied."""
    changes = env.sql_query(select)
    changes.sink_to(es.sinks.FileSink(str(tmp_path / "out"), "parquet")).uid("changes")
    env.execute("join")
    return changelog_result(str(tmp_path / "out"))


COUNTS = "(SELECT auction, COUNT(*) AS n, MAX(price) AS top FROM bid GROUP BY auction)"

CASES = {
    # Persons and their auctions of one category: a right-only ON conjunct filters the
    # auctions; a person without one is padded (LEFT, FULL).
    "people": (
        "SELECT P.id, P.name, A.id AS aid, A.reserve FROM person AS P {join} auction AS A "
        "ON P.id = A.seller AND A.category = 10"
    ),
    # A GROUP BY's changelog joined with a table (its -U/+U retract joined rows).
    "counts": (
        f"SELECT C.auction, C.n, C.top, A.seller FROM {COUNTS} AS C {{join}} auction AS A "
        "ON C.auction = A.id AND A.category <> 12"
    ),
    # A residual condition between the sides: matches only where it holds.
    "residual": (
        f"SELECT C.auction, C.top, A.reserve FROM {COUNTS} AS C {{join}} auction AS A "
        "ON C.auction = A.id AND C.top > A.reserve"
    ),
}


@pytest.mark.parametrize("join", ["JOIN", "LEFT JOIN", "RIGHT JOIN", "FULL OUTER JOIN"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_regular_join_changelog_equals_duckdb(
    case: str, join: str, tables: dict, tmp_path: Path
) -> None:
    select = CASES[case].format(join=join)
    env = _env(tmp_path)
    got = _sorted(_changelog(env, select, tmp_path))
    expected = _sorted(run_duckdb(select, tables))
    assert len(got) == len(expected)
    assert got == expected


def test_an_on_conjunct_of_the_preserved_side_keeps_its_rows_and_where_filters_after(
    tables: dict, tmp_path: Path
) -> None:
    # P.state = 'OR' decides matches, not which persons stay; the WHERE over the
    # nullable side runs after the join (keeping the padded rows it lets through).
    select = (
        "SELECT P.id, P.state, A.id AS aid FROM person AS P LEFT JOIN auction AS A "
        "ON P.id = A.seller AND P.state = 'OR' WHERE A.id IS NULL OR A.reserve > 1000"
    )
    env = _env(tmp_path)
    got = _sorted(_changelog(env, select, tmp_path))
    expected = _sorted(run_duckdb(select, tables))
    assert len(got) == len(expected)
    assert got == expected
    assert any(r[1] != "OR" for r in got)  # persons the ON conjunct did not filter out


def test_an_inner_join_of_tables_stays_append_only_and_goes_to_an_append_sink(
    tables: dict, tmp_path: Path
) -> None:
    out = str(tmp_path / "out")
    env = _env(
        tmp_path,
        f"CREATE TABLE result (id BIGINT, aid BIGINT) WITH ('connector' = 'filesystem', "
        f"'path' = '{out}', 'format' = 'parquet')",
    )
    select = "SELECT P.id, A.id AS aid FROM person AS P JOIN auction AS A ON P.id = A.seller"
    assert "changelog" not in env.explain_sql(select)
    env.execute_sql(f"INSERT INTO result {select}")
    assert _sorted(read_sink_rows(out)) == _sorted(run_duckdb(select, tables))


def test_explain_shows_the_join_type_the_changelog_and_the_ttl(tmp_path: Path) -> None:
    env = _env(tmp_path, "SET 'table.exec.state.ttl' = '1 h'")
    text = env.explain_sql(
        "SELECT P.id, A.id AS aid FROM person AS P LEFT JOIN auction AS A ON P.id = A.seller"
    )
    assert "left outer join" in text
    assert "regular LEFT OUTER join on id = seller" in text
    assert "changelog: +I, -U" not in text  # the Calc above passes +I, -D on
    assert "changelog: +I, -D" in text
    assert "3600000 ms after it was written" in text
    assert "columns: id BIGINT, id0 BIGINT, seller BIGINT" in text


def test_append_sinks_refuse_outer_joins_and_cross_joins_are_refused(tmp_path: Path) -> None:
    out = str(tmp_path / "out")
    env = _env(
        tmp_path,
        f"CREATE TABLE result (id BIGINT, aid BIGINT) WITH ('connector' = 'filesystem', "
        f"'path' = '{out}', 'format' = 'parquet')",
    )
    with pytest.raises(SqlError, match="result is updating"):
        env.execute_sql(
            "INSERT INTO result SELECT P.id, A.id FROM person AS P LEFT JOIN auction AS A "
            "ON P.id = A.seller"
        )
    with pytest.raises(SqlError, match="CROSS JOIN is not supported"):
        env.explain_sql("SELECT P.id FROM person AS P CROSS JOIN auction AS A")


def test_a_join_of_two_updating_results_has_both_unique_keys(tmp_path: Path) -> None:
    env = _env(tmp_path)
    text = env.explain_sql(
        f"SELECT C.auction, C.n, D.seller, D.m FROM {COUNTS} AS C JOIN (SELECT seller, "
        "COUNT(*) AS m FROM auction GROUP BY seller) AS D ON C.auction = D.seller"
    )
    assert "changelog: +I, -D (unique key: auction, seller)" in text
