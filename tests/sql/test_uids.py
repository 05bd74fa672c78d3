"""SQL operator uids are derived from the plan, and savepoints are keyed by them: a
change to a node's digest orphans every savepoint taken before it. These uids are
pinned; change one only deliberately (and say so in the release notes)."""

from __future__ import annotations

import re

import pytest
from nexmark_tables import nexmark_ddl

import epochstream as es

PINNED = {
    "SELECT a.id, b.price FROM auction a JOIN bid b ON a.id = b.auction": "sql-join-66a99e8dde5f59b9",
    "SELECT bidder, COUNT(*) AS n, MAX(price) AS m FROM bid GROUP BY bidder": (
        "sql-group-aggregate-d1712c6bb3ef8e8d"
    ),
    "SELECT auction, window_start, COUNT(*) FROM TABLE(TUMBLE(TABLE bid, "
    "DESCRIPTOR(`dateTime`), INTERVAL '10' SECOND)) GROUP BY auction, window_start, "
    "window_end": "sql-window-aggregate-b5cad6a1a193b910",
    "SELECT auction, price FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY auction "
    "ORDER BY price DESC) AS rn FROM bid) WHERE rn <= 3": "sql-top-n-64d483b4cfa287fd",
}


@pytest.mark.parametrize("query", list(PINNED))
def test_stateful_operator_uids_stay_what_savepoints_were_taken_with(query: str) -> None:
    env = es.Environment(parallelism=1, runner="local")
    env.execute_sql(nexmark_ddl(events=1_000))
    assert PINNED[query] in re.findall(r"\[(sql-[^\]]+)\]", env.explain_sql(query))
