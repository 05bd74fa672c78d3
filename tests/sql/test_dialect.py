"""The Flink dialect: every statement of Flink's Nexmark benchmark parses and round-trips,
the constructs of the SQL issues parse, and errors carry positions."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import sqlglot
from sqlglot import exp

from epochstream.exceptions import SqlError
from epochstream.sql.dialect import (
    Flink,
    MetadataColumn,
    WindowTVF,
    WithOptions,
    node_position,
    parse_script,
    primary_key,
)

NEXMARK = Path(__file__).parent / "nexmark"


def _statements(path: Path) -> list[exp.Expression]:
    text = path.read_text()
    # The benchmark's DDL templates hold ${...} placeholders its runner fills in.
    text = re.sub(r"\$\{NEXMARK_TABLE\}", "datagen", text)
    text = re.sub(r"\$\{[A-Z_]+\}", "1", text)
    out: list[exp.Expression] = []
    for stmt in parse_script(text):
        out.extend(stmt if isinstance(stmt, list) else [stmt])
    return out


@pytest.mark.parametrize("path", sorted(NEXMARK.glob("*.sql")), ids=lambda p: p.stem)
def test_every_nexmark_statement_parses_and_round_trips(path: Path) -> None:
    statements = _statements(path)
    assert statements
    for stmt in statements:
        assert not isinstance(stmt, exp.Command), stmt.sql()
        again = sqlglot.parse_one(stmt.sql(dialect=Flink), dialect=Flink)
        assert again == stmt


def test_window_tvf_arguments_positional_and_named() -> None:
    [hop] = parse_script(
        "SELECT * FROM TABLE(HOP(TABLE bid, DESCRIPTOR(`dateTime`), "
        "INTERVAL '2' SECOND, INTERVAL '10' SECOND)) AS w"
    )
    tvf = hop.find(WindowTVF)
    assert tvf.kind == "HOP" and tvf.alias == "w"
    assert tvf.args["timecol"].name == "dateTime"
    assert tvf.args["slide"].this.name == "2" and tvf.args["size"].this.name == "10"
    [named] = parse_script(
        "SELECT * FROM TABLE(TUMBLE(DATA => TABLE bid, TIMECOL => DESCRIPTOR(t), "
        "SIZE => INTERVAL '1' MINUTE))"
    )
    assert named.find(WindowTVF).args["size"].text("unit").upper().startswith("MINUTE")
    [session] = parse_script(
        "SELECT * FROM TABLE(SESSION(TABLE bid PARTITION BY (bidder, auction), "
        "DESCRIPTOR(t), INTERVAL '5' SECOND))"
    )
    assert [c.name for c in session.find(WindowTVF).args["partition_by"]] == ["bidder", "auction"]


def test_create_table_with_watermark_metadata_key_and_options() -> None:
    [create] = parse_script(
        """CREATE TABLE bids (
             auction BIGINT, price BIGINT, date_time TIMESTAMP(3),
             ts TIMESTAMP_LTZ(3) METADATA FROM 'timestamp' VIRTUAL,
             WATERMARK FOR date_time AS date_time - INTERVAL '4' SECOND,
             PRIMARY KEY (auction) NOT ENFORCED
           ) WITH ('connector' = 'kafka', 'topic' = 'bids')"""
    )
    assert create.find(WithOptions).options() == {"connector": "kafka", "topic": "bids"}
    assert create.find(exp.WatermarkColumnConstraint).this.name == "date_time"
    assert create.find(MetadataColumn).this.name == "timestamp"
    assert primary_key(create) == (["auction"], True)
    [unenforced] = parse_script("CREATE TABLE o (id BIGINT PRIMARY KEY) WITH ('connector'='print')")
    assert primary_key(unenforced) == (["id"], False)


def test_statement_set_is_one_group() -> None:
    script = parse_script(
        "CREATE TABLE a (x INT) WITH ('connector'='print');\n"
        "EXECUTE STATEMENT SET BEGIN\n INSERT INTO a SELECT 1;\n INSERT INTO a SELECT 2;\nEND;"
    )
    assert isinstance(script[0], exp.Create)
    assert isinstance(script[1], list) and len(script[1]) == 2


@pytest.mark.parametrize(
    ("sql", "line", "column", "words"),
    [
        (
            "SELECT * FROM TABLE(\n  TUMBEL(TABLE bid, DESCRIPTOR(t), INTERVAL '1' SECOND))",
            2,
            3,
            "unsupported table function 'TUMBEL'",
        ),
        (
            "SELECT * FROM TABLE(TUMBLE(TABLE bid, t, INTERVAL '1' SECOND))",
            1,
            39,
            "DESCRIPTOR(<column>)",
        ),
        (
            "SELECT * FROM TABLE(HOP(TABLE bid, DESCRIPTOR(t), 10, INTERVAL '1' SECOND))",
            1,
            51,
            "INTERVAL literal",
        ),
        (
            "SELECT * FROM TABLE(TUMBLE(DATA => TABLE bid, TIMECOL => DESCRIPTOR(t), "
            "WIDTH => INTERVAL '1' SECOND))",
            1,
            73,
            "TUMBLE has no parameter WIDTH",
        ),
        ("EXECUTE STATEMENT SET BEGIN INSERT INTO a SELECT 1;", 1, 0, "without END"),
    ],
)
def test_errors_name_the_position(sql: str, line: int, column: int, words: str) -> None:
    with pytest.raises(SqlError) as info:
        parse_script(sql)
    err = info.value
    assert words in str(err)
    assert err.line == line
    if column:
        assert err.column == column
    assert str(err).startswith(f"line {line}, column ")
    assert "\n" not in str(err)


def test_node_position_is_the_first_column_of_the_token() -> None:
    [stmt] = parse_script("SELECT a,\n       nosuch FROM t")
    col = next(c for c in stmt.find_all(exp.Column) if c.name == "nosuch")
    assert node_position(col) == (2, 8)
    assert node_position(None) == (0, 0)


def test_a_backslash_in_a_string_literal_is_an_ordinary_character() -> None:
    # Flink SQL: only '' escapes a quote; '\' is a one-character string.
    (stmt,) = parse_script(r"SELECT s LIKE '%\_%' ESCAPE '\', '\', 'it''s' FROM t")
    assert isinstance(stmt, exp.Select)
    like, backslash, quote = stmt.expressions
    assert [backslash.name, quote.name] == ["\\", "it's"]
    assert like.find(exp.Escape) is not None
