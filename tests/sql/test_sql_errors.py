"""Every unsupported construct and every type error: a one-line SqlError that starts
with the statement position (line, column) and says what is wrong."""

from __future__ import annotations

import re

import pytest

import epochstream as es

DDL = """
CREATE TABLE bid (
  auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING,
  `dateTime` TIMESTAMP(3), extra STRING,
  WATERMARK FOR `dateTime` AS `dateTime` - INTERVAL '4' SECOND
) WITH ('connector' = 'nexmark', 'kind' = 'bid', 'events.num' = '1000');
CREATE TABLE auction (
  id BIGINT, seller BIGINT, category BIGINT, `dateTime` TIMESTAMP(3),
  WATERMARK FOR `dateTime` AS `dateTime` - INTERVAL '4' SECOND
) WITH ('connector' = 'nexmark', 'kind' = 'auction', 'events.num' = '1000');
CREATE VIEW pbid AS SELECT *, PROCTIME() AS p FROM bid;
"""

TUMBLE = "TABLE(TUMBLE(TABLE bid, DESCRIPTOR(`dateTime`), INTERVAL '10' SECOND))"

CASES = [
    # updating results
    (
        "SELECT auction, COUNT(*) FROM bid GROUP BY auction UNION ALL SELECT id, 1 FROM auction",
        "UNION ALL over an updating input",
    ),
    (
        "SELECT auction FROM (SELECT auction, COUNT(*) AS n FROM bid GROUP BY auction) "
        "UNION SELECT id FROM auction",
        "UNION over an updating input",
    ),
    ("SELECT b.auction FROM bid b CROSS JOIN auction a", "CROSS JOIN is not supported"),
    (
        "SELECT b.auction FROM bid b LEFT JOIN auction a ON b.price > a.reserve",
        "a join needs an equality",
    ),
    (
        "SELECT auction, ROW_NUMBER() OVER (PARTITION BY auction ORDER BY price) FROM bid",
        "ROW_NUMBER",
    ),
    # not on streams / not yet
    ("SELECT auction FROM bid ORDER BY price", "ORDER BY is not supported"),
    ("SELECT auction FROM bid LIMIT 3", "LIMIT is not supported"),
    ("SELECT auction FROM bid INTERSECT SELECT id FROM auction", "INTERSECT"),
    ("SELECT auction FROM bid EXCEPT SELECT id FROM auction", "EXCEPT"),
    ("SELECT b.auction FROM bid b JOIN auction a ON b.price > a.id", "needs an equality"),
    (
        "SELECT bidder, COUNT(*) FROM TABLE(CUMULATE(TABLE pbid, DESCRIPTOR(p), "
        "INTERVAL '1' SECOND, INTERVAL '4' SECOND)) GROUP BY bidder, window_start, window_end",
        "CUMULATE over a processing-time attribute",
    ),
    (
        "SELECT * FROM TABLE(SESSION(TABLE bid PARTITION BY bidder, DESCRIPTOR(`dateTime`), "
        "INTERVAL '1' SECOND))",
        "SESSION window TVF without GROUP BY",
    ),
    # names
    ("SELECT nosuch FROM bid", "unknown column 'nosuch'"),
    ("SELECT x.auction FROM bid b", "unknown table alias 'x'"),
    ("SELECT auction FROM nosuch", "unknown table 'nosuch'"),
    ("SELECT `dateTime` FROM bid b JOIN auction a ON b.auction = a.id", "ambiguous"),
    ("SELECT nosuchfn(price) FROM bid", "unsupported function NOSUCHFN"),
    # types
    ("SELECT price + 'a' FROM bid", ""),
    ("SELECT auction FROM bid WHERE price", ""),
    ("SELECT CAST(channel AS BOOLEAN) AND TRUE FROM bid WHERE price LIKE 5", ""),
    ("SELECT SUM(channel) FROM " + TUMBLE + " GROUP BY window_start, window_end", ""),
    # windows
    (
        "SELECT window_start, COUNT(*) FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(price), "
        "INTERVAL '1' SECOND)) GROUP BY window_start, window_end",
        "time attribute",
    ),
    (
        "SELECT COUNT(*) FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(`dateTime`), "
        "INTERVAL '1' MONTH)) GROUP BY window_start, window_end",
        "interval unit",
    ),
    ("SELECT price FROM " + TUMBLE + " GROUP BY window_start, window_end", "neither grouped"),
    ("SELECT COUNT(*) FROM " + TUMBLE + " GROUP BY auction", "window_start and window_end"),
    ("SELECT auction, 'abc FROM bid", "line 1, column 17: ' is not closed"),
    ("SELECT auction,\n  `price FROM bid", "line 2, column 3: ` is not closed"),
    # subqueries: refused before their columns are bound in the outer query
    ("SELECT auction FROM bid WHERE auction IN (SELECT id FROM auction)", "IN with a subquery"),
    ("SELECT auction FROM bid WHERE price > (SELECT MAX(id) FROM auction)", "subquery"),
    # parse errors
    ("SELECT FROM bid WHERE", "syntax error: incomplete WHERE"),
    ("SELECT auction FROM bid WHERE", "line 1, column 25: syntax error: incomplete WHERE"),
    ("SELECT auction FROM bid WHERE\n price >", "line 2, column 8: syntax error: incomplete >"),
    (
        "SELECT * FROM TABLE(TUMBLE(TABLE (SELECT * FROM bid), DESCRIPTOR(`dateTime`), "
        "INTERVAL '1' SECOND))",
        "line 1, column 28: TUMBLE's first argument is TABLE <name>",
    ),
    ("SELECT * FROM TABLE(TUMBEL(TABLE bid, DESCRIPTOR(x), INTERVAL '1' SECOND))", "TUMBEL"),
]


@pytest.fixture(scope="module")
def env() -> es.Environment:
    env = es.Environment(parallelism=1, runner="local")
    env.execute_sql(DDL)
    return env


@pytest.mark.parametrize(("sql", "words"), CASES, ids=[c[0][:40] for c in CASES])
def test_one_line_error_with_position(env: es.Environment, sql: str, words: str) -> None:
    with pytest.raises(es.SqlError) as info:
        env.explain_sql(sql)
    message = str(info.value)
    assert re.match(r"line \d+, column \d+: ", message), message
    assert "\n" not in message, message
    assert words in message, message
    assert "<" not in message.replace("<name>", ""), message  # no class or Token reprs
    assert info.value.line >= 1 and info.value.column >= 1
