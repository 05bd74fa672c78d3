"""A regular JOIN + GROUP BY over rate-limited Nexmark tables upserted into PostgreSQL,
driven through ``epochstream run --supervise`` by tests/e2e/test_sql_changelog_driver_kill.py.

``epochstream run ... sql_join_upsert_job.py DSN EVENTS RATE``: per seller, the count,
sum and maximum of the prices of the bids on its auctions, into the ``jdbc`` table
``per_seller`` (PRIMARY KEY seller), at parallelism 2 and max parallelism 128 (the test
computes which sink subtask owns a seller), checkpointing every 0.3 s. The operators'
uids follow the statement, so a resumed run continues this one.
"""

from __future__ import annotations

import sys
from pathlib import Path

import epochstream as es

sys.path.insert(0, str(Path(__file__).parents[2] / "sql"))

from nexmark_tables import nexmark_ddl

QUERY = (
    "SELECT A.seller, COUNT(*) AS bids, SUM(B.price) AS total, MAX(B.price) AS top "
    "FROM auction A JOIN bid B ON A.id = B.auction GROUP BY A.seller"
)
MAX_PARALLELISM = 128


def script(dsn: str, events: int, rate: int) -> str:
    """The DDL of the rate-limited Nexmark tables and of ``per_seller``, and the INSERT."""
    fields = dict(part.split("=", 1) for part in dsn.split())
    url = f"jdbc:postgresql://{fields['host']}:{fields['port']}/{fields['dbname']}"
    ddl = nexmark_ddl(events=events).replace(
        "'first-event.rate'", f"'rate' = '{rate}', 'first-event.rate'"
    )
    return f"""{ddl}
CREATE TABLE per_seller (seller BIGINT, bids BIGINT, total BIGINT, top BIGINT,
  PRIMARY KEY (seller) NOT ENFORCED) WITH ('connector' = 'jdbc', 'url' = '{url}',
  'username' = '{fields["user"]}', 'table-name' = 'per_seller');
INSERT INTO per_seller {QUERY};
"""


def main() -> None:
    dsn, events, rate = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    env = es.Environment(parallelism=2, max_parallelism=MAX_PARALLELISM)
    env.enable_checkpointing(0.3)
    env.set_restart_strategy(es.restart.fixed_delay(attempts=3, delay=0.2))
    env.execute_sql(script(dsn, events, rate))


if __name__ == "__main__":
    main()
