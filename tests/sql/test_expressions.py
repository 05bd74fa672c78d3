"""The expression compiler and CalcProgram: operators against DuckDB over the same Arrow
batch where DuckDB's semantics are Flink's, hand-written expectations (citing Flink)
where they differ, NULL propagation, a property test of random arithmetic/comparison/
boolean trees, common subexpressions, pickling, the clock, and one-line errors."""

from __future__ import annotations

import datetime as dt
import math
from decimal import Decimal
from typing import Any

import cloudpickle
import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import sqlglot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlglot import exp

from epochstream.exceptions import DataError, SqlError
from epochstream.sql.dialect import Flink
from epochstream.sql.expressions import CalcProgram, Field, compile_expression, interval_ms
from epochstream.sql.functions import FunctionCatalog, ScalarFunction
from epochstream.sql.types import SqlType

BATCH = pa.record_batch(
    {
        "a": pa.array([1, -7, 7, None, 0, 12], pa.int32()),
        "b": pa.array([2, 2, -3, 4, None, 5], pa.int32()),
        "big": pa.array([10, None, -3, 2**40, 5, 6], pa.int64()),
        "x": pa.array([1.5, -2.25, None, 0.5, 3.0, -0.75], pa.float64()),
        "y": pa.array([2.0, 0.5, 1.0, None, -4.0, 0.25], pa.float64()),
        "s": pa.array(["apple", "Banana", None, "a_b%c", "", "  pad  "]),
        "t": pa.array(["APPLE", "banana", "x", None, "", "pad"]),
        "flag": pa.array([True, False, None, True, None, False]),
        "flag2": pa.array([None, True, False, False, None, True]),
        "ts": pa.array(
            [0, 3_600_000 * 9 + 61_500, None, 1_600_000_000_123, 86_399_999, 1_000],
            pa.timestamp("ms"),
        ),
    }
)
FIELDS = [Field(f.name, SqlType.from_arrow(f.type)) for f in BATCH.schema]


def parse(text: str) -> exp.Expression:
    return sqlglot.parse_one(f"SELECT {text} FROM t", dialect=Flink).expressions[0]


def ours(
    text: str, batch: pa.RecordBatch = BATCH, catalog: FunctionCatalog | None = None
) -> list[Any]:
    fields = [Field(f.name, SqlType.from_arrow(f.type)) for f in batch.schema]
    compiled = compile_expression(parse(text), fields, catalog or FunctionCatalog())
    out = compiled.evaluate(batch)
    assert len(out) == batch.num_rows
    assert out.type == compiled.type.to_arrow()
    return out.to_pylist()


def duck(text: str, batch: pa.RecordBatch = BATCH) -> list[Any]:
    con = duckdb.connect()
    con.register("tbl", pa.Table.from_batches([batch]))
    return [row[0] for row in con.execute(f"SELECT {text} FROM tbl").fetchall()]


def same(left: list[Any], right: list[Any]) -> bool:
    if len(left) != len(right):
        return False
    for a, b in zip(left, right, strict=True):
        if a is None or b is None:
            if a is not b:
                return False
        elif isinstance(a, float) or isinstance(b, float):
            if not math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-12):
                return False
        elif a != b:
            return False
    return True


# Same semantics in DuckDB and Flink: (Flink expression, DuckDB spelling or None if equal).
AGREE = [
    ("a + b", None),
    ("a - b", None),
    ("a * b", None),
    ("-a", None),
    ("a % b", None),  # both: the dividend's sign (Java's %)
    ("MOD(a, b)", None),
    ("big + a", None),
    ("big * 2", None),
    ("x + y", None),
    ("x * a", None),
    ("x / y", None),
    ("x - a * 2", None),
    ("a = b", None),
    ("a <> b", None),
    ("a != b", "a <> b"),
    ("a < b", None),
    ("a <= b", None),
    ("a > x", None),
    ("a >= x", None),
    ("big = a", None),
    ("s = t", None),
    ("s < t", None),
    ("flag AND flag2", None),
    ("flag OR flag2", None),
    ("NOT flag", None),
    ("flag AND a > 0", None),
    ("a IS NULL", None),
    ("a IS NOT NULL", None),
    ("flag IS TRUE", None),
    ("flag IS NOT TRUE", None),
    ("flag IS FALSE", None),
    ("flag IS NOT FALSE", None),
    ("a BETWEEN 0 AND 7", None),
    ("a NOT BETWEEN 0 AND 7", None),
    ("x BETWEEN a AND b", None),
    ("a IN (1, 7, 12)", None),
    ("a NOT IN (1, 7, 12)", None),
    ("a IN (1, NULL)", None),
    ("a NOT IN (1, NULL)", None),
    ("s IN ('apple', 'x')", None),
    ("a IN (b, 7)", None),
    ("s LIKE 'a%'", None),
    ("s LIKE '%an%'", None),
    ("s LIKE '_pple'", None),
    ("s NOT LIKE 'a%'", None),
    ("s LIKE 'a!_b!%c' ESCAPE '!'", None),
    ("CASE WHEN a > 0 THEN 'pos' WHEN a < 0 THEN 'neg' ELSE 'zero' END", None),
    ("CASE WHEN a > 0 THEN x END", None),
    ("CASE a WHEN 1 THEN 'one' WHEN 7 THEN 'seven' END", None),
    ("CASE WHEN flag THEN a ELSE big END", None),
    ("CAST(a AS DOUBLE)", None),
    ("CAST(a AS BIGINT) * 3", None),
    ("CAST(a AS STRING)", "CAST(a AS VARCHAR)"),
    ("CAST('42' AS INT) + a", None),
    ("CAST(a AS DECIMAL(10, 2))", None),
    ("CAST(1.25 AS DOUBLE) * a", None),
    ("COALESCE(a, b, 0)", None),
    ("COALESCE(x, a)", None),
    ("NULLIF(a, 7)", None),
    ("NULLIF(s, 'apple')", None),
    ("IF(a > 0, 'p', 'n')", "CASE WHEN a > 0 THEN 'p' ELSE 'n' END"),
    ("0.5 * a", None),
    ("a + 1.25", None),
    ("1e3 * a", None),
    ("ts + INTERVAL '10' SECOND", None),
    ("ts - INTERVAL '2' HOUR", None),
    ("ts + INTERVAL '1' DAY", None),
    ("ts > TIMESTAMP '1970-01-01 01:00:00'", None),
    ("ts = ts", None),
    ("s || t", None),
    ("NULL + a", "CAST(NULL AS INTEGER) + a"),
    ("a = NULL", None),
]


@pytest.mark.parametrize(("expr", "duck_expr"), AGREE, ids=[e for e, _ in AGREE])
def test_agrees_with_duckdb(expr: str, duck_expr: str | None) -> None:
    got, want = ours(expr), duck(duck_expr or expr)
    assert same(got, want), (got, want)


# --------------------------------------------------------------------------- Flink != DuckDB


def test_integer_division_is_integer_division() -> None:
    # Flink (Calcite) divides two integers as integers, truncating toward zero:
    # CAST(1 AS BIGINT) / 1000 is 0 (CALCITE-4749); DuckDB's / gives a DOUBLE.
    assert ours("a / b") == [0, -3, -2, None, None, 2]
    assert ours("big / 4") == [2, None, 0, 2**38, 1, 1]
    assert ours("x / 2") == [0.75, -1.125, None, 0.25, 1.5, -0.375]


def test_division_by_zero_fails_for_integers_and_is_infinite_for_doubles() -> None:
    with pytest.raises(DataError, match=r"^line 1, column 8: a / 0: divide by zero"):
        ours("a / 0")
    with pytest.raises(DataError, match="divide by zero"):
        ours("a % 0")
    # Java's double division: Infinity, -Infinity, NaN.
    inf = ours("x / 0e0")
    assert inf[0] == math.inf and inf[1] == -math.inf and inf[2] is None


def test_decimal_arithmetic_is_exact_with_flinks_types() -> None:
    compiled = compile_expression(parse("0.908 * big"), FIELDS, FunctionCatalog())
    assert compiled.type.sql() == "DECIMAL(24, 3)"
    assert compiled.evaluate(BATCH).to_pylist()[:3] == [Decimal("9.080"), None, Decimal("-2.724")]
    assert ours("1.5 + 0.25") == [Decimal("1.75")] * 6
    # DECIMAL / DECIMAL: scale max(6, s1 + p2 + 1), rounded half up.
    compiled = compile_expression(
        parse("CAST(a AS DECIMAL(5, 2)) / 3.0"), FIELDS, FunctionCatalog()
    )
    assert compiled.type.sql() == "DECIMAL(10, 6)"
    assert compiled.evaluate(BATCH).to_pylist()[:2] == [Decimal("0.333333"), Decimal("-2.333333")]


def test_literal_types_follow_calcite() -> None:
    catalog = FunctionCatalog()
    assert compile_expression(parse("0.908"), [], catalog).type.sql() == "DECIMAL(4, 3) NOT NULL"
    assert compile_expression(parse("1e3"), [], catalog).type.sql() == "DOUBLE NOT NULL"
    assert compile_expression(parse("7"), [], catalog).type.sql() == "INT NOT NULL"
    assert compile_expression(parse("9999999999"), [], catalog).type.sql() == "BIGINT NOT NULL"
    assert compile_expression(parse("'ab'"), [], catalog).type.sql() == "CHAR(2) NOT NULL"
    assert compile_expression(parse("NULL"), [], catalog).type.sql() == "NULL"
    ts = compile_expression(parse("TIMESTAMP '2020-01-01 10:00:00.5'"), [], catalog)
    assert ts.type.sql() == "TIMESTAMP(1) NOT NULL"


def test_cast_double_to_int_truncates() -> None:
    # Flink casts DOUBLE to INT toward zero (Java's (int) cast); DuckDB rounds.
    assert ours("CAST(x AS INT)") == [1, -2, None, 0, 3, 0]
    assert ours("CAST(x AS DECIMAL(5, 1))") == [
        Decimal("1.5"),
        Decimal("-2.3"),
        None,
        Decimal("0.5"),
        Decimal("3.0"),
        Decimal("-0.8"),
    ]  # DECIMAL rounds half up, away from zero, as Java's RoundingMode.HALF_UP


def test_cast_boolean_and_strings() -> None:
    # Flink prints booleans as TRUE/FALSE and reads them case-insensitively.
    assert ours("CAST(flag AS STRING)") == ["TRUE", "FALSE", None, "TRUE", None, "FALSE"]
    assert ours("CAST(' TRUE ' AS BOOLEAN)") == [True] * 6
    assert ours("CAST(' 12 ' AS INT)") == [12] * 6  # blanks trimmed first


def test_failing_cast_is_a_data_error_and_try_cast_is_null() -> None:
    with pytest.raises(DataError, match=r"^line 1, column 13: CAST\(s AS INT\): Failed to parse"):
        ours("CAST(s AS INT)")
    assert ours("TRY_CAST(s AS INT)") == [None] * 6
    batch = pa.record_batch({"v": ["1", "x", None, " 3"]})
    assert ours("TRY_CAST(v AS BIGINT)", batch) == [1, None, None, 3]


def test_integer_overflow_is_a_data_error_naming_the_expression() -> None:
    with pytest.raises(DataError) as err:
        ours("big * 9223372036854775807")
    assert str(err.value) == "line 1, column 8: big * 9223372036854775807: overflow"
    with pytest.raises(DataError, match="overflow"):
        ours("a * 2147483647")


def test_case_without_else_and_null_conditions() -> None:
    # A NULL condition is not taken (only TRUE selects a branch).
    assert ours("CASE WHEN flag THEN 1 WHEN flag2 THEN 2 END") == [1, 2, None, 1, None, 2]


def test_branches_that_can_fail_run_on_their_rows_only() -> None:
    # Flink's generated code evaluates a CASE branch, IF's arms and the right side of
    # AND/OR only where they decide the result: guarded divisions do not fail.
    assert ours("CASE WHEN b <> 0 THEN a / b ELSE -1 END") == [0, -3, -2, None, -1, 2]
    assert ours("IF(b = 0, NULL, a / b)") == [0, -3, -2, None, None, 2]
    assert ours("CASE WHEN a > 100 THEN 1 / 0 ELSE 1 END") == [1] * 6
    zero = pa.record_batch({"p": pa.array([0, 2, None, 4], pa.int32())})
    assert ours("p <> 0 AND 8 / p > 2", zero) == [False, True, None, False]
    assert ours("p = 0 OR 8 / p > 2", zero) == [True, True, None, False]
    assert ours("p IS NULL OR CAST(CAST(p AS STRING) AS INT) = 2", zero) == [
        False,
        True,
        True,
        False,
    ]
    with pytest.raises(DataError, match="divide by zero"):
        ours("CASE WHEN a > 0 THEN a / 0 END")  # a selected row still fails


def test_udf_in_a_case_branch_sees_its_rows_only() -> None:
    lengths: list[int] = []

    def plus_one(v: pa.Array) -> pa.Array:
        lengths.append(len(v))
        return pc.add(v, 1)

    catalog = FunctionCatalog()
    catalog.register("plus_one", ScalarFunction(plus_one, "BIGINT"))
    got = ours("CASE WHEN a > 0 THEN plus_one(big) ELSE 0 END", catalog=catalog)
    assert got == [11, 0, -2, 0, 0, 7]
    assert lengths == [3]


def test_like_without_escape_takes_backslash_literally() -> None:
    # In Flink SQL a backslash in a string literal is an ordinary character.
    batch = pa.record_batch({"v": ["a\\b", "ab", None, "a_b"]})
    assert ours(r"v LIKE 'a\b'", batch) == [True, False, None, False]
    assert ours(r"v LIKE '%\_%' ESCAPE '\'", batch) == [False, False, None, True]
    assert ours(r"'\'", batch) == ["\\"] * 4


def test_null_propagates_through_every_operator() -> None:
    batch = pa.record_batch(
        {
            "n": pa.array([None], pa.int32()),
            "f": pa.array([None], pa.float64()),
            "v": pa.array([None], pa.string()),
            "t": pa.array([None], pa.timestamp("ms")),
            "p": pa.array([None], pa.bool_()),
        }
    )
    for text in [
        "n + 1",
        "n - 1",
        "n * 2",
        "n / 2",
        "n % 2",
        "-n",
        "f * 2",
        "n = 1",
        "n < 1",
        "v = 'a'",
        "v LIKE 'a%'",
        "n IN (1, 2)",
        "n BETWEEN 1 AND 2",
        "p AND TRUE",
        "p OR FALSE",
        "NOT p",
        "CAST(n AS STRING)",
        "CAST(v AS INT)",
        "v || 'a'",
        "t + INTERVAL '1' SECOND",
        "CASE WHEN p THEN 1 END",
        "NULLIF(n, 1)",
        "COALESCE(n, n)",
    ]:
        assert ours(text, batch) == [None], text
    assert ours("p AND FALSE", batch) == [False]  # three-valued logic
    assert ours("p OR TRUE", batch) == [True]
    assert ours("n IS NULL", batch) == [True]
    assert ours("p IS NOT TRUE", batch) == [True]


# --------------------------------------------------------------------------- property test

COLUMNS = {"i": pa.int64(), "j": pa.int64(), "f": pa.float64()}


def _numeric() -> st.SearchStrategy[str]:
    leaves = st.sampled_from(["i", "j", "f"]) | st.integers(-9, 9).map(str)
    return st.recursive(
        leaves,
        lambda inner: (
            st.tuples(inner, st.sampled_from(["+", "-", "*"]), inner).map(
                lambda t: f"({t[0]} {t[1]} {t[2]})"
            )
            | inner.map(lambda e: f"(- {e})")
        ),
        max_leaves=6,
    )


def _boolean() -> st.SearchStrategy[str]:
    comparison = st.tuples(
        _numeric(), st.sampled_from(["=", "<>", "<", "<=", ">", ">="]), _numeric()
    ).map(lambda t: f"({t[0]} {t[1]} {t[2]})")
    leaves = comparison | _numeric().map(lambda e: f"({e} IS NULL)")
    return st.recursive(
        leaves,
        lambda inner: (
            st.tuples(inner, st.sampled_from(["AND", "OR"]), inner).map(
                lambda t: f"({t[0]} {t[1]} {t[2]})"
            )
            | inner.map(lambda e: f"(NOT {e})")
        ),
        max_leaves=5,
    )


_values = st.lists(
    st.tuples(
        st.none() | st.integers(-100, 100),
        st.none() | st.integers(-100, 100),
        st.none() | st.floats(-100, 100, allow_nan=False).map(lambda v: round(v, 2)),
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=_values, expr=_numeric() | _boolean())
def test_random_trees_agree_with_duckdb(rows: list[tuple[Any, Any, Any]], expr: str) -> None:
    batch = pa.record_batch(
        [pa.array([r[k] for r in rows], t) for k, t in enumerate(COLUMNS.values())],
        names=list(COLUMNS),
    )
    got, want = ours(expr, batch), duck(expr, batch)
    assert same(got, want), (expr, got, want)


# --------------------------------------------------------------------------- CalcProgram


def test_calc_program_filters_then_projects_and_keeps_columns() -> None:
    batch = BATCH.append_column("_ts", pa.array(range(6), pa.int64()))
    program = CalcProgram.compile(
        [("double_a", parse("a * 2")), ("name", parse("UPPER(s)"))],
        parse("a > 0 OR flag"),  # NULL rows dropped with FALSE ones
        FIELDS,
        FunctionCatalog(),
        keep=["_ts"],
    )
    assert [(f.name, f.type.sql()) for f in program.output_fields] == [
        ("double_a", "INT"),
        ("name", "STRING"),
    ]
    out = program(batch)
    assert out.schema.names == ["double_a", "name", "_ts"]
    assert sorted(program.input_columns) == ["a", "flag", "s"]
    assert program.explain() == "double_a: INT\nname: STRING"
    assert out.to_pydict() == {
        "double_a": [2, 14, None, 24],
        "name": ["APPLE", None, "A_B%C", "  PAD  "],
        "_ts": [0, 2, 3, 5],
    }


def test_calc_program_without_filter_and_empty_batch() -> None:
    program = CalcProgram.compile([("a", parse("a"))], None, FIELDS, FunctionCatalog())
    assert program(BATCH).column(0).to_pylist() == BATCH.column("a").to_pylist()
    assert program(BATCH.slice(0, 0)).num_rows == 0
    filtered = CalcProgram.compile(
        [("a", parse("a + 1"))], parse("a > 100"), FIELDS, FunctionCatalog()
    )
    assert filtered(BATCH).num_rows == 0


def test_calc_program_projects_constants_as_columns() -> None:
    program = CalcProgram.compile(
        [("one", parse("1")), ("n", parse("NULL"))], None, FIELDS, FunctionCatalog()
    )
    out = program(BATCH)
    assert out.column(0).to_pylist() == [1] * 6
    assert out.column(1).type == pa.string() and out.column(1).null_count == 6


def test_unknown_column_and_table_qualifier() -> None:
    assert ours("B.a + 1")[:1] == [2]  # a qualifier is ignored: the planner resolved it
    with pytest.raises(SqlError) as err:
        compile_expression(parse("a +\n   nosuch"), FIELDS, FunctionCatalog())
    assert str(err.value) == "line 2, column 4: unknown column 'nosuch'"


def test_column_names_are_case_sensitive() -> None:
    batch = pa.record_batch({"dateTime": [1], "datetime": [2]})
    assert ours("`dateTime` * 10 + datetime", batch) == [12]


def _counter() -> tuple[ScalarFunction, list[int]]:
    calls: list[int] = []

    def plus_one(v: pa.Array) -> pa.Array:
        calls.append(len(v))
        return pc.add(v, 1)

    return ScalarFunction(plus_one, "BIGINT", name="plus_one"), calls


def test_common_subexpressions_are_computed_once_per_batch() -> None:
    function, calls = _counter()
    catalog = FunctionCatalog()
    catalog.register("plus_one", function)
    program = CalcProgram.compile(
        [("p", parse("plus_one(big) * 2")), ("q", parse("plus_one(big) + plus_one(big)"))],
        parse("plus_one(big) > 0"),
        FIELDS,
        catalog,
    )
    out = program(BATCH)
    assert calls == [6]  # once, on the whole batch (for the filter), reused by projections
    assert out.column("q").to_pylist() == [22, 2 * (2**40 + 1), 12, 14]


def test_volatile_udfs_are_called_at_every_place() -> None:
    calls: list[int] = []

    def noise(v: pa.Array) -> pa.Array:
        calls.append(1)
        return v

    catalog = FunctionCatalog()
    catalog.register("noise", ScalarFunction(noise, "BIGINT", deterministic=False))
    compile_expression(parse("noise(big) + noise(big)"), FIELDS, catalog).evaluate(BATCH)
    assert len(calls) == 2


def test_compiled_program_with_a_udf_survives_cloudpickle() -> None:
    function, _ = _counter()
    catalog = FunctionCatalog()
    catalog.register("plus_one", function)
    program = CalcProgram.compile(
        [("v", parse("plus_one(big) * 0.908")), ("c", parse("REGEXP_EXTRACT(s, '(a)(p+)', 2)"))],
        parse("big IS NOT NULL"),
        FIELDS,
        catalog,
        keep=["a"],
    )
    data = cloudpickle.dumps(program)
    restored = cloudpickle.loads(data)
    assert restored(BATCH).to_pydict() == program(BATCH).to_pydict()
    assert len(data) < 20_000  # plain steps naming kernels, not closures


def test_clock_is_injected_and_read_once_per_batch() -> None:
    readings: list[int] = []

    def clock() -> int:
        readings.append(1)
        return 1_700_000_000_000 + len(readings)

    program = CalcProgram.compile(
        [
            ("now", parse("CURRENT_TIMESTAMP")),
            ("p", parse("PROCTIME()")),
            ("n", parse("NOW()")),
            ("l", parse("LOCALTIMESTAMP")),
            ("u", parse("UNIX_TIMESTAMP()")),
        ],
        None,
        FIELDS,
        FunctionCatalog(),
        clock_ms=clock,
    )
    assert [f.type.sql() for f in program.output_fields] == [
        "TIMESTAMP_LTZ(3) NOT NULL",
        "TIMESTAMP_LTZ(3) NOT NULL",
        "TIMESTAMP_LTZ(3) NOT NULL",
        "TIMESTAMP(3) NOT NULL",
        "BIGINT NOT NULL",
    ]
    out = program(BATCH)
    assert len(readings) == 1
    when = dt.datetime(2023, 11, 14, 22, 13, 20, 1000, tzinfo=dt.UTC)
    assert out.column("now").to_pylist() == [when] * 6
    assert out.column("p").to_pylist() == [when] * 6
    assert out.column("l").to_pylist() == [when.replace(tzinfo=None)] * 6
    assert out.column("u").to_pylist() == [1_700_000_000] * 6
    # the runtime may pass its operator's clock per call instead
    assert program(BATCH, clock_ms=lambda: 0).column("u").to_pylist() == [0] * 6


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("nosuch(a)", "line 1, column 8: unsupported function NOSUCH"),
        ("s + 1", "line 1, column 8: cannot apply + to STRING and INT NOT NULL"),
        ("a = 'x'", "line 1, column 8: cannot compare INT with CHAR(1) NOT NULL"),
        ("a AND flag", "line 1, column 8: expected a BOOLEAN, not INT: a"),
        (
            "CASE WHEN flag THEN 1 ELSE 'x' END",
            "line 1, column 18: CASE: no common type for INT NOT NULL, CHAR(1) NOT NULL",
        ),
        ("s LIKE t", "line 1, column 8: LIKE: the pattern must be a string literal"),
        ("ts - ts", "line 1, column 8: cannot apply - to TIMESTAMP(3) and TIMESTAMP(3)"),
        (
            "INTERVAL '1' MONTH",
            "line 1, column 17: unsupported interval unit MONTH (MILLISECOND, SECOND, MINUTE, HOUR, DAY)",
        ),
        ("CAST(ts AS DOUBLE)", "line 1, column 13: cannot cast TIMESTAMP(3) to DOUBLE"),
        (
            "a IN (SELECT 1)",
            "line 1, column 8: unsupported IN with a subquery; IN takes a list of values",
        ),
        (
            "s LIKE 'a!x' ESCAPE '!'",
            "line 1, column 8: invalid escape sequence in LIKE pattern 'a!x'",
        ),
    ],
)
def test_errors_are_one_line_with_the_position(expr: str, message: str) -> None:
    with pytest.raises(SqlError) as err:
        compile_expression(parse(expr), FIELDS, FunctionCatalog())
    assert str(err.value) == message


def test_program_does_not_modify_the_planners_tree() -> None:
    node = parse("a BETWEEN 1 AND 2")
    before = node.sql()
    compile_expression(node, FIELDS, FunctionCatalog())
    assert node.sql() == before and node.this.parent is node


def test_modulo_of_a_wide_dividend_by_a_narrow_divisor() -> None:
    # BIGINT % INT is an INT (the divisor's type), computed without narrowing the dividend.
    compiled = compile_expression(parse("big % b"), FIELDS, FunctionCatalog())
    assert compiled.type.sql() == "INT"
    assert compiled.evaluate(BATCH).to_pylist() == [0, None, 0, 0, None, 1]


def test_decimal_products_past_38_digits_keep_flinks_scale() -> None:
    batch = pa.record_batch(
        {"m": pa.array([Decimal("12345.6789012345"), None], pa.decimal128(30, 10))}
    )
    compiled = compile_expression(
        parse("m * m"), [Field("m", SqlType("DECIMAL", 30, 10))], FunctionCatalog()
    )
    assert compiled.type.sql() == "DECIMAL(38, 6)"
    exact = Decimal("12345.6789012345") ** 2
    rounded = exact.quantize(Decimal("0.000001"), rounding="ROUND_HALF_UP")
    assert compiled.evaluate(batch).to_pylist() == [rounded, None]


def test_zero_argument_udf_gets_the_batch_length() -> None:
    catalog = FunctionCatalog()
    catalog.register("seven", lambda: pa.array([7] * 6), result_type="INT")
    assert ours("seven()", catalog=catalog) == [7] * 6


def test_cast_decimal_to_integer_truncates_toward_zero() -> None:
    # Flink (DecimalData.castToIntegral): Nexmark q1's CAST(0.908 * price AS BIGINT).
    batch = pa.record_batch({"b": pa.array([-543, 543, None, 1], pa.int64())})
    assert ours("CAST(0.908 * b AS BIGINT)", batch) == [-493, 493, None, 0]
    assert ours("CAST(CAST(-2.5 AS DECIMAL(3, 1)) AS INT)", batch) == [-2] * 4
    with pytest.raises(DataError, match=r"CAST\(b \* 1.5 AS TINYINT\): Integer value out of"):
        ours("CAST(b * 1.5 AS TINYINT)", batch)


def test_cast_string_with_a_fraction_to_integer_drops_the_fraction() -> None:
    # Flink's BinaryStringDataUtil.toLong stops at the point: '-3.7' is -3, '.5' is 0.
    batch = pa.record_batch({"v": [" -3.7 ", "3.", ".5", "1.2.3", None]})
    assert ours("TRY_CAST(v AS INT)", batch) == [-3, 3, 0, None, None]
    assert ours("CAST(v AS BIGINT)", batch.slice(0, 3)) == [-3, 3, 0]
    assert ours("TRY_CAST(v AS DECIMAL(3, 1))", batch)[0] == Decimal("-3.7")


def test_cast_to_char_or_varchar_fits_the_length() -> None:
    # Flink cuts to n characters, and pads CHAR(n) with blanks.
    batch = pa.record_batch({"b": pa.array([-543, 7, None], pa.int64()), "s": ["héllo", "", None]})
    assert ours("CAST(b AS CHAR(2))", batch) == ["-5", "7 ", None]
    assert ours("CAST(b AS VARCHAR(2))", batch) == ["-5", "7", None]
    assert ours("CAST(s AS VARCHAR(2))", batch) == ["hé", "", None]
    assert ours("CAST(s AS CHAR(3))", batch) == ["hél", "   ", None]
    assert ours("CAST(s AS STRING)", batch) == ["héllo", "", None]


def test_an_interval_may_have_a_fraction_of_whole_milliseconds() -> None:
    # Flink takes INTERVAL '0.8' SECOND (800 ms) in expressions, window TVFs and joins.
    def millis(text: str) -> int:
        return interval_ms(parse(text))

    assert millis("INTERVAL '0.8' SECOND") == 800
    assert millis("INTERVAL '1.5' MINUTE") == 90_000
    assert millis("INTERVAL '4' SECOND") == 4000
    assert ours("ts - INTERVAL '1.5' SECOND")[1] == dt.datetime(1970, 1, 1, 9, 1, 0)
    with pytest.raises(
        SqlError, match=r"line 1, column 17: INTERVAL '0\.0005' SECOND is not a whole"
    ):
        millis("INTERVAL '0.0005' SECOND")
    with pytest.raises(SqlError, match="INTERVAL takes a number in quotes, got 'x'"):
        millis("INTERVAL 'x' SECOND")
