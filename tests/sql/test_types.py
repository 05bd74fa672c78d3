"""Flink SQL types: Arrow mapping, DDL parsing, Flink's spelling, and Flink's type rules
for arithmetic, comparison and aggregates (LogicalTypeMerging, Calcite's integer rules)."""

from __future__ import annotations

import pyarrow as pa
import pytest
import sqlglot
from sqlglot import exp

from epochstream.exceptions import SqlError
from epochstream.sql.dialect import Flink
from epochstream.sql.types import (
    BIGINT,
    DOUBLE,
    INT,
    STRING,
    SqlType,
    aggregate_result_type,
    arithmetic_result_type,
    common_type,
    comparable,
)


@pytest.mark.parametrize(
    ("ddl", "arrow", "text"),
    [
        ("BOOLEAN", pa.bool_(), "BOOLEAN"),
        ("TINYINT", pa.int8(), "TINYINT"),
        ("SMALLINT", pa.int16(), "SMALLINT"),
        ("INT", pa.int32(), "INT"),
        ("INTEGER", pa.int32(), "INT"),
        ("BIGINT", pa.int64(), "BIGINT"),
        ("FLOAT", pa.float32(), "FLOAT"),
        ("DOUBLE", pa.float64(), "DOUBLE"),
        ("DECIMAL(23, 3)", pa.decimal128(23, 3), "DECIMAL(23, 3)"),
        ("DECIMAL", pa.decimal128(10, 0), "DECIMAL(10, 0)"),
        ("STRING", pa.string(), "STRING"),
        ("VARCHAR", pa.string(), "STRING"),
        ("VARCHAR(10)", pa.string(), "VARCHAR(10)"),
        ("CHAR(3)", pa.string(), "CHAR(3)"),
        ("BYTES", pa.binary(), "BYTES"),
        ("DATE", pa.date32(), "DATE"),
        ("TIMESTAMP(3)", pa.timestamp("ms"), "TIMESTAMP(3)"),
        ("TIMESTAMP", pa.timestamp("us"), "TIMESTAMP(6)"),
        ("TIMESTAMP(9)", pa.timestamp("ns"), "TIMESTAMP(9)"),
        ("TIMESTAMP_LTZ(3)", pa.timestamp("ms", tz="UTC"), "TIMESTAMP_LTZ(3)"),
        ("TIMESTAMP(3) WITH LOCAL TIME ZONE", pa.timestamp("ms", tz="UTC"), "TIMESTAMP_LTZ(3)"),
    ],
)
def test_ddl_arrow_and_spelling(ddl: str, arrow: pa.DataType, text: str) -> None:
    sql_type = SqlType.parse(ddl)
    assert sql_type.to_arrow() == arrow
    assert sql_type.sql() == text
    assert SqlType.from_arrow(arrow).to_arrow() == arrow


def test_from_arrow_names_the_types() -> None:
    assert SqlType.from_arrow(pa.large_string()) == STRING
    assert SqlType.from_arrow(pa.timestamp("ms")).sql() == "TIMESTAMP(3)"
    assert SqlType.from_arrow(pa.int64(), nullable=False).sql() == "BIGINT NOT NULL"
    assert SqlType.from_arrow(pa.duration("ms")).name == "INTERVAL"
    with pytest.raises(SqlError, match="no SQL type"):
        SqlType.from_arrow(pa.list_(pa.int32()))


def test_unsupported_ddl_type_is_an_error_at_its_position() -> None:
    create = sqlglot.parse_one("CREATE TABLE t (\n  a MAP<STRING, INT>)", dialect=Flink)
    node = create.find(exp.DataType)
    assert node is not None
    with pytest.raises(SqlError, match=r"^line 2, column \d+: unsupported type MAP") as err:
        SqlType.from_ddl(node)
    assert "\n" not in str(err.value)


def test_decimal_out_of_range() -> None:
    with pytest.raises(SqlError, match="DECIMAL"):
        SqlType.parse("DECIMAL(40, 2)")


def D(p: int, s: int) -> SqlType:
    return SqlType("DECIMAL", p, s)


@pytest.mark.parametrize(
    ("op", "left", "right", "expected"),
    [
        ("+", BIGINT, INT, "BIGINT"),
        ("*", INT, SqlType("SMALLINT"), "INT"),
        # Calcite (and so Flink) divides integers as integers in the wider type (CALCITE-4749).
        ("/", INT, INT, "INT"),
        ("/", BIGINT, INT, "BIGINT"),
        # % has the divisor's type (Calcite's ARG1_NULLABLE).
        ("%", BIGINT, INT, "INT"),
        ("+", INT, DOUBLE, "DOUBLE"),
        ("+", INT, SqlType("FLOAT"), "FLOAT"),
        ("*", D(4, 3), DOUBLE, "DOUBLE"),
        # Nexmark q1: 0.908 * price with price BIGINT (DECIMAL(19, 0)).
        ("*", D(4, 3), BIGINT, "DECIMAL(24, 3)"),
        ("+", D(4, 3), BIGINT, "DECIMAL(23, 3)"),
        ("-", D(10, 2), D(5, 4), "DECIMAL(13, 4)"),
        ("/", D(10, 2), D(5, 0), "DECIMAL(16, 8)"),
        ("/", D(38, 10), D(38, 10), "DECIMAL(38, 6)"),
        ("*", D(30, 10), D(30, 10), "DECIMAL(38, 6)"),
        ("%", D(10, 2), D(5, 1), "DECIMAL(6, 2)"),
    ],
)
def test_arithmetic_result_types(op: str, left: SqlType, right: SqlType, expected: str) -> None:
    result = arithmetic_result_type(op, left, right)
    assert result is not None and result.sql() == expected


def test_arithmetic_refuses_non_numbers() -> None:
    assert arithmetic_result_type("+", STRING, INT) is None


def test_nullability_propagates() -> None:
    result = arithmetic_result_type("+", INT.with_nullable(False), INT.with_nullable(False))
    assert result is not None and result.sql() == "INT NOT NULL"
    result = arithmetic_result_type("+", INT.with_nullable(False), INT)
    assert result is not None and result.nullable


def test_common_types() -> None:
    assert common_type([INT, BIGINT]) == BIGINT
    assert common_type([INT, D(5, 2)]) == D(12, 2)
    assert common_type([SqlType("CHAR", 3), SqlType("CHAR", 5)]) == SqlType("VARCHAR", 5)
    assert common_type([SqlType("TIMESTAMP", 0), SqlType("TIMESTAMP", 3)]) == SqlType(
        "TIMESTAMP", 3
    )
    assert comparable(INT, DOUBLE)
    assert not comparable(STRING, INT)  # Flink refuses a string compared with a number
    assert not comparable(SqlType("TIMESTAMP", 3), INT)


@pytest.mark.parametrize(
    ("kind", "arg", "expected"),
    [
        ("COUNT", None, "BIGINT NOT NULL"),
        ("COUNT", INT, "BIGINT NOT NULL"),
        # Flink's SUM keeps the integer type (IntSumAggFunction returns INT).
        ("SUM", INT, "INT"),
        ("SUM", BIGINT, "BIGINT"),
        ("SUM", DOUBLE, "DOUBLE"),
        ("SUM", D(10, 2), "DECIMAL(38, 2)"),
        # AVG keeps the input type: AVG(BIGINT) is a BIGINT (integer division of sum/count).
        ("AVG", BIGINT, "BIGINT"),
        ("AVG", INT, "INT"),
        ("AVG", DOUBLE, "DOUBLE"),
        # LogicalTypeMerging.findAvgAggType: DECIMAL(38, max(6, s)).
        ("AVG", D(10, 2), "DECIMAL(38, 6)"),
        ("AVG", D(20, 8), "DECIMAL(38, 8)"),
        ("MIN", STRING.with_nullable(False), "STRING"),
        ("MAX", SqlType("TIMESTAMP", 3), "TIMESTAMP(3)"),
    ],
)
def test_aggregate_result_types(kind: str, arg: SqlType | None, expected: str) -> None:
    assert aggregate_result_type(kind, arg).sql() == expected


def test_aggregate_refusals() -> None:
    with pytest.raises(SqlError, match="SUM takes a number"):
        aggregate_result_type("SUM", STRING)
    with pytest.raises(SqlError, match="unsupported aggregate"):
        aggregate_result_type("MEDIAN", INT)
