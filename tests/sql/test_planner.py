"""The planner: what it plans (explain), what it refuses (one-line errors with the
position), and uids that follow the query."""

from __future__ import annotations

from pathlib import Path

import pytest

import epochstream as es

DDL = """
CREATE TABLE bid (
  auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING,
  `dateTime` TIMESTAMP(3), extra STRING,
  WATERMARK FOR `dateTime` AS `dateTime` - INTERVAL '4' SECOND
) WITH ('connector' = 'nexmark', 'kind' = 'bid', 'events.num' = '1000');
CREATE TABLE out2 (auction BIGINT, price BIGINT) WITH ('connector' = 'blackhole');
"""

HOP = (
    "SELECT auction, COUNT(*) AS num, window_start AS starttime, window_end AS endtime "
    "FROM TABLE(HOP(TABLE bid, DESCRIPTOR(`dateTime`), INTERVAL '2' SECOND, INTERVAL '10' SECOND)) "
    "GROUP BY auction, window_start, window_end"
)


@pytest.fixture
def env() -> es.Environment:
    env = es.Environment(parallelism=2, runner="local")
    env.execute_sql(DDL)
    return env


def test_explain_shows_operators_keys_state_and_watermarks(env: es.Environment) -> None:
    text = env.explain_sql(HOP)
    assert "window-aggregate [sql-window-aggregate-" in text
    assert "window: HOP size 10000 ms, slide 2000 ms" in text
    assert "keys: auction" in text
    assert "state: per key and slice" in text
    assert "watermark: dateTime - 4000 ms (per split)" in text
    assert "connector: nexmark" in text
    assert "starttime TIMESTAMP(3)" in text and "num BIGINT" in text


def test_explain_of_an_insert_names_the_sink(env: es.Environment) -> None:
    text = env.explain_sql("INSERT INTO out2 SELECT auction, price FROM bid WHERE price > 10")
    assert text.splitlines()[1].startswith("sink [sql-sink-")
    assert "connector: blackhole (DiscardSink, Arrow batches)" in text
    assert "price > 10" in text


def test_uids_follow_the_query(env: es.Environment) -> None:
    def uids(sql: str) -> list[str]:
        return [
            line.split("[")[1].split("]")[0]
            for line in env.explain_sql(sql).splitlines()
            if "[sql-" in line
        ]

    first = uids(HOP)
    assert first == uids(HOP)  # the same statement: the same uids, so its savepoint fits
    changed = uids(HOP.replace("INTERVAL '10' SECOND", "INTERVAL '20' SECOND"))
    assert changed[-1] == first[-1]  # the source is the same
    assert changed[0] != first[0]  # the aggregation is not: its state must not be reused


@pytest.mark.parametrize(
    ("sql", "position", "words"),
    [
        ("SELECT nosuch FROM bid", "line 1, column 8", "unknown column 'nosuch'"),
        ("SELECT auction FROM nosuch", "line 1, column 21", "unknown table 'nosuch'"),
        ("SELECT auction FROM bid ORDER BY price", "line 1", "ORDER BY is not supported"),
        (
            "SELECT b.auction FROM bid b CROSS JOIN bid c",
            "line 1",
            "CROSS JOIN is not supported",
        ),
        (
            "SELECT b.auction FROM bid b JOIN bid c ON b.price > c.price",
            "line 1",
            "a join needs an equality between the two sides",
        ),
        (
            "SELECT b.auction FROM bid b JOIN bid c ON b.auction = c.auction WHERE nosuch.x = 1",
            "line 1, column 71",
            "unknown table alias 'nosuch'",
        ),
        (
            "SELECT window_start, COUNT(*) FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(price), "
            "INTERVAL '1' SECOND)) GROUP BY window_start, window_end",
            "line 1, column 71",
            "must name the input's time attribute",
        ),
        (
            "SELECT auction, COUNT(*) FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(`dateTime`), "
            "INTERVAL '1' SECOND)) GROUP BY auction",
            "line 1",
            "groups by window_start and window_end",
        ),
        (
            "SELECT price, window_start, COUNT(*) FROM TABLE(TUMBLE(TABLE bid, "
            "DESCRIPTOR(`dateTime`), INTERVAL '1' SECOND)) GROUP BY auction, window_start, "
            "window_end",
            "line 1, column 8",
            "column 'price' is neither grouped nor aggregated",
        ),
        (
            "SELECT auction, COUNT(*), SUM(price) FROM TABLE(SESSION(TABLE bid PARTITION BY "
            "bidder, DESCRIPTOR(`dateTime`), INTERVAL '1' SECOND)) "
            "GROUP BY auction, window_start, window_end",
            "line 1, column 43",
            "groups by the TVF's PARTITION BY columns",
        ),
    ],
)
def test_unsupported_and_wrong_queries_name_the_position(
    env: es.Environment, sql: str, position: str, words: str
) -> None:
    with pytest.raises(es.SqlError) as info:
        env.explain_sql(sql)
    message = str(info.value)
    assert message.startswith(position), message
    assert words in message
    assert "\n" not in message


def test_insert_checks_columns_and_connector_options(env: es.Environment) -> None:
    with pytest.raises(es.SqlError, match="the query gives 1 columns, the table takes 2"):
        env.explain_sql("INSERT INTO out2 SELECT auction FROM bid")
    env.execute_sql(
        "CREATE TABLE typo (a BIGINT) WITH ('connector' = 'filesystem', 'path' = '/tmp/x',\n"
        " 'format' = 'parquet', 'sink.rolling-polcy' = '1')"
    )
    with pytest.raises(es.SqlError) as info:
        env.explain_sql("INSERT INTO typo SELECT auction FROM bid")
    assert str(info.value).startswith("line 2, column")
    assert "'sink.rolling-polcy': is not an option of the filesystem connector" in str(info.value)


def test_ddl_errors(env: es.Environment) -> None:
    with pytest.raises(es.SqlError, match="needs a 'connector' option"):
        env.execute_sql("CREATE TABLE t (a BIGINT) WITH ('path' = 'x')")
    with pytest.raises(es.SqlError, match="must be declared NOT ENFORCED"):
        env.execute_sql("CREATE TABLE t (a BIGINT PRIMARY KEY) WITH ('connector' = 'print')")
    with pytest.raises(es.SqlError, match="exists already"):
        env.execute_sql("CREATE TABLE bid (a BIGINT) WITH ('connector' = 'print')")
    with pytest.raises(es.SqlError, match=r"WATERMARK FOR ts supports"):
        env.execute_sql(
            "CREATE TABLE w (ts TIMESTAMP(3), WATERMARK FOR ts AS ts + INTERVAL '1' SECOND) "
            "WITH ('connector' = 'print')"
        )
    with pytest.raises(es.SqlError, match="a rowtime attribute must be TIMESTAMP"):
        env.execute_sql(
            "CREATE TABLE w (ts BIGINT, WATERMARK FOR ts AS ts) WITH ('connector' = 'print')"
        )
    env.execute_sql("CREATE TABLE IF NOT EXISTS bid (a BIGINT) WITH ('connector' = 'print')")
    assert env.catalog.table("bid").field("auction") is not None
    with pytest.raises(es.SqlError, match="for a query use sql_query"):
        env.execute_sql("SELECT auction FROM bid")


def test_source_options_reach_the_source(env: es.Environment) -> None:
    env.execute_sql(
        "CREATE TABLE k (a BIGINT, ts TIMESTAMP(3), WATERMARK FOR ts AS ts) WITH ("
        "'connector' = 'kafka', 'topic' = 't', 'properties.bootstrap.servers' = 'localhost:1',"
        "'scan.bounded.mode' = 'latest-offset', 'scan.watermark.idle-timeout' = '5 s')"
    )
    from epochstream.sql.connectors import source_binding

    binding = source_binding(env.catalog.table("k"), ["a", "ts"])
    assert binding.source.bounded
    assert binding.watermark_strategy.idle_timeout_ms == 5000
    env.execute_sql(
        "CREATE TABLE k2 (a BIGINT) WITH ('connector' = 'kafka', 'topic' = 't', "
        "'properties.bootstrap.servers' = 'localhost:1', 'scan.bounded.mode' = 'forever')"
    )
    with pytest.raises(es.SqlError, match=r"'scan.bounded.mode': must be 'unbounded' or"):
        source_binding(env.catalog.table("k2"), ["a"])


def test_a_changed_column_type_changes_the_uids_of_what_reads_it() -> None:
    def uids(price_type: str) -> list[str]:
        env = es.Environment(parallelism=1, runner="local")
        env.execute_sql(DDL.replace("price BIGINT", f"price {price_type}"))
        return [
            line.split("[")[1].split("]")[0]
            for line in env.explain_sql(HOP.replace("COUNT(*)", "SUM(price)")).splitlines()
            if "[sql-" in line
        ]

    assert uids("BIGINT") == uids("BIGINT")
    assert not set(uids("BIGINT")) & set(uids("DOUBLE"))  # summed as int64 vs float64


def test_explain_checks_source_options(env: es.Environment, tmp_path: Path) -> None:
    # An existing path: the path is checked before the options.
    env.execute_sql(
        f"CREATE TABLE src (a BIGINT) WITH ('connector' = 'filesystem', 'path' = '{tmp_path}',\n"
        "  'format' = 'parquet', 'scan.typo' = '1')"
    )
    with pytest.raises(es.SqlError, match=r"^line 2, column .*'scan.typo': is not an option"):
        env.explain_sql("SELECT a FROM src")


def test_a_time_unit_is_a_keyword_not_a_column(env: es.Environment) -> None:
    # TIMESTAMPADD(SECOND, ...): binding the query's columns must not look for 'SECOND'.
    text = env.explain_sql(
        "SELECT auction, TIMESTAMPADD(SECOND, 1, `dateTime`) AS later, "
        "TIMESTAMPDIFF(DAY, `dateTime`, TIMESTAMP '2030-01-01 00:00:00') AS days FROM bid "
        "WHERE TIMESTAMPADD(MINUTE, 1, `dateTime`) > `dateTime`"
    )
    assert "TIMESTAMPADD(SECOND, 1, `dateTime`)" in text
    with pytest.raises(
        es.SqlError, match=r"line 1, column 8: TIMESTAMPADD: unsupported unit MONTH"
    ):
        env.explain_sql("SELECT TIMESTAMPADD(MONTH, 1, `dateTime`) FROM bid")


def test_window_and_join_intervals_take_fractional_seconds(env: es.Environment) -> None:
    # Flink: INTERVAL '0.8' SECOND is 800 ms wherever an interval literal goes.
    text = env.explain_sql(
        "SELECT auction, window_start, COUNT(*) AS n FROM TABLE(TUMBLE(TABLE bid, "
        "DESCRIPTOR(`dateTime`), INTERVAL '0.8' SECOND)) GROUP BY auction, window_start, window_end"
    )
    assert "800" in text
    env.explain_sql(
        "SELECT a.auction FROM bid a JOIN bid b ON a.auction = b.auction AND "
        "a.`dateTime` BETWEEN b.`dateTime` - INTERVAL '0.5' SECOND AND b.`dateTime`"
    )
    with pytest.raises(es.SqlError, match=r"line 1, column 107: INTERVAL '0\.0001' SECOND is not"):
        env.explain_sql(
            "SELECT auction, window_start, COUNT(*) AS n FROM TABLE(TUMBLE(TABLE bid, "
            "DESCRIPTOR(`dateTime`), INTERVAL '0.0001' SECOND)) "
            "GROUP BY auction, window_start, window_end"
        )


def test_join_inputs_keep_only_the_columns_the_query_names() -> None:
    # The join's state and its input scans hold the columns some expression of the
    # SELECT can name (a qualified name on its own side only); a * keeps them all.
    from nexmark_tables import nexmark_ddl

    env = es.Environment(parallelism=2, runner="local")
    env.execute_sql(nexmark_ddl(events=1000))
    text = env.explain_sql(
        "SELECT P.name, P.extra, A.id FROM auction AS A JOIN person AS P ON A.seller = P.id "
        "WHERE A.category = 10"
    )
    join = next(i for i, line in enumerate(text.splitlines()) if "regular join" in line)
    columns = text.splitlines()[join + 1].strip()
    assert columns == (
        "columns: id BIGINT, seller BIGINT, category BIGINT, id0 BIGINT, name STRING, "
        "extra0 STRING"  # renamed against every auction column, A.extra dropped or not
    )
    assert "columns: id, seller, category\n" in text + "\n"  # the auction scan's
    every = env.explain_sql("SELECT * FROM auction AS A JOIN person AS P ON A.seller = P.id")
    assert "itemName STRING" in every and "creditCard STRING" in every
