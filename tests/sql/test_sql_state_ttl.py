"""``SET 'table.exec.state.ttl'`` reaches every stateful operator without a window: the
GROUP BY's and the Top-N's specs carry it (as the regular join's does,
test_sql_joins), and ``explain`` shows it; without it their state is kept for the
job's life. The expiry itself is tested on the operators (tests/runtime)."""

from __future__ import annotations

import pytest
from nexmark_tables import nexmark_ddl

import epochstream as es

#: A query per operator kind.
QUERIES = {
    "columnar_group_aggregate": "SELECT auction, COUNT(*) AS n FROM bid GROUP BY auction",
    "columnar_top_n": (
        "SELECT auction, price FROM (SELECT auction, price, ROW_NUMBER() OVER (PARTITION BY "
        "auction ORDER BY price DESC) AS rownum FROM bid) WHERE rownum <= 1"
    ),
}


def _env(setup: str = "") -> es.Environment:
    env = es.Environment(parallelism=1, runner="local")
    env.execute_sql(nexmark_ddl(events=100))
    if setup:
        env.execute_sql(setup)
    return env


def _ttls(env: es.Environment, kind: str) -> list[int]:
    """The state TTL of each operator of ``kind`` of the job built so far."""
    return [t.payload.state_ttl_ms for t in env._graph.transformations if t.kind == kind]


@pytest.mark.parametrize("kind", sorted(QUERIES))
def test_set_state_ttl_reaches_the_operator_and_explain_shows_it(kind: str) -> None:
    env = _env("SET 'table.exec.state.ttl' = '1 h'")
    text = env.explain_sql(QUERIES[kind])
    assert "each until 3600000 ms after it was last written (table.exec.state.ttl)" in text
    assert "kept for the job's life" not in text
    env.sql_query(QUERIES[kind])
    assert _ttls(env, kind) == [3_600_000]


@pytest.mark.parametrize("kind", sorted(QUERIES))
def test_without_a_state_ttl_the_state_is_kept_for_the_job_s_life(kind: str) -> None:
    env = _env()
    assert "kept for the job's life" in env.explain_sql(QUERIES[kind])
    env.sql_query(QUERIES[kind])
    assert _ttls(env, kind) == [0]
