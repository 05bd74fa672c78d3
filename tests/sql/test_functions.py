"""Built-in functions against DuckDB where its semantics are Flink's, hand-written
expectations (citing Flink's documented behaviour) where they differ, the Nexmark
queries' expressions, the function catalog and scalar UDFs."""

from __future__ import annotations

import datetime as dt
import math
import re
from decimal import Decimal
from pathlib import Path
from typing import Any

import cloudpickle
import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import sqlglot
from sqlglot import exp

import epochstream as es
from epochstream.exceptions import DataError, SqlError, UserFunctionError
from epochstream.sql import ScalarFunction, udf
from epochstream.sql.dialect import Flink
from epochstream.sql.expressions import CalcProgram, Field, compile_expression
from epochstream.sql.functions import BUILTINS, FunctionCatalog
from epochstream.sql.types import SqlType

BATCH = pa.record_batch(
    {
        "s": pa.array(["Hello World", "  padded  ", None, "a,b,,c", "ÄÖü straße", ""]),
        "n": pa.array([4, -9, None, 0, 16, 2], pa.int64()),
        "x": pa.array([2.5, -2.5, None, 0.125, 16.0, 1.45], pa.float64()),
        "d": pa.array(
            [
                Decimal("1.25"),
                Decimal("-2.35"),
                None,
                Decimal("0"),
                Decimal("9.99"),
                Decimal("0.05"),
            ],
            pa.decimal128(5, 2),
        ),
        "ts": pa.array(
            [
                dt.datetime(2020, 9, 13, 12, 26, 45, 123000),
                dt.datetime(1999, 12, 31, 23, 59, 59, 999000),
                None,
                dt.datetime(2024, 2, 29, 0, 0, 0),
                dt.datetime(1970, 1, 1, 7, 5, 3, 4000),
                dt.datetime(2021, 6, 1, 18, 30, 0),
            ],
            pa.timestamp("ms"),
        ),
        "url": pa.array(
            [
                "https://www.nexmark.com/abc/def/item.htm?query=1&channel_id=1099",
                "channel_id=77&x=1",
                None,
                "https://www.nexmark.com/a",
                "https://www.nexmark.com/a/b/c/d",
                "",
            ]
        ),
    }
)
FIELDS = [Field(f.name, SqlType.from_arrow(f.type)) for f in BATCH.schema]


def parse(text: str) -> exp.Expression:
    return sqlglot.parse_one(f"SELECT {text} FROM t", dialect=Flink).expressions[0]


def ours(
    text: str, catalog: FunctionCatalog | None = None, batch: pa.RecordBatch = BATCH
) -> list[Any]:
    fields = [Field(f.name, SqlType.from_arrow(f.type)) for f in batch.schema]
    compiled = compile_expression(parse(text), fields, catalog or FunctionCatalog())
    out = compiled.evaluate(batch)
    assert len(out) == batch.num_rows and out.type == compiled.type.to_arrow()
    return out.to_pylist()


def duck(text: str) -> list[Any]:
    con = duckdb.connect()
    con.register("tbl", pa.Table.from_batches([BATCH]))
    return [row[0] for row in con.execute(f"SELECT {text} FROM tbl").fetchall()]


def close(left: list[Any], right: list[Any]) -> bool:
    for a, b in zip(left, right, strict=True):
        if a is None or b is None:
            if a is not b:
                return False
        elif isinstance(a, float) or isinstance(b, float):
            if not (
                math.isclose(float(a), float(b), rel_tol=1e-12) or (math.isnan(a) and math.isnan(b))
            ):
                return False
        elif a != b:
            return False
    return True


AGREE = [
    ("UPPER(s)", None),
    ("LOWER(s)", None),
    ("CHAR_LENGTH(s)", "length(s)"),
    ("CHARACTER_LENGTH(s)", "length(s)"),
    ("TRIM(s)", None),
    ("TRIM(BOTH 'a' FROM s)", None),
    ("TRIM(LEADING FROM s)", "ltrim(s, ' ')"),
    ("TRIM(TRAILING FROM s)", "rtrim(s, ' ')"),
    ("SUBSTRING(s, 2, 3)", None),
    ("SUBSTRING(s FROM 3)", "substring(s, 3)"),
    ("SUBSTR(s, 1, 5)", "substring(s, 1, 5)"),
    ("s || '!'", None),
    ("REPLACE(s, 'l', 'L')", None),
    ("POSITION('l' IN s)", "position('l' in s)"),
    ("REGEXP(s, '^[a-z]')", "regexp_matches(s, '^[a-z]')"),
    ("ABS(n)", None),
    ("ABS(x)", None),
    ("ABS(d)", None),
    ("CEIL(x)", None),
    ("FLOOR(x)", None),
    ("CEIL(n)", None),
    ("ROUND(x)", None),
    ("ROUND(d, 1)", None),
    ("POWER(n, 2)", None),
    ("SQRT(x * x)", None),
    ("EXP(x)", None),
    ("LN(x * x + 1)", None),
    ("LOG10(x * x + 1)", None),
    ("LOG(2, x * x + 1)", "log(2, x * x + 1)"),
    ("MOD(n, 3)", None),
    ("EXTRACT(HOUR FROM ts)", None),
    ("EXTRACT(YEAR FROM ts)", None),
    ("EXTRACT(MONTH FROM ts)", None),
    ("EXTRACT(DAY FROM ts)", None),
    ("HOUR(ts)", None),
    ("MINUTE(ts)", None),
    ("SECOND(ts)", None),
    ("YEAR(ts)", None),
    ("MONTH(ts)", None),
    ("DAYOFMONTH(ts)", None),
    ("COALESCE(s, 'none')", None),
    ("QUARTER(ts)", None),
    ("WEEK(ts)", None),  # ISO weeks in both
    ("DAYOFYEAR(ts)", None),
]


@pytest.mark.parametrize(("expr", "duck_expr"), AGREE, ids=[e for e, _ in AGREE])
def test_agrees_with_duckdb(expr: str, duck_expr: str | None) -> None:
    got, want = ours(expr), duck(duck_expr or expr)
    assert close(got, want), (got, want)


def test_split_index_is_null_out_of_range() -> None:
    # Flink: SPLIT_INDEX(s, sep, i) is the i-th piece (from 0), NULL when i is out of
    # range (DuckDB's split_part counts from 1 and gives '').
    assert ours("SPLIT_INDEX(s, ',', 2)") == [None, None, None, "", None, None]
    assert ours("SPLIT_INDEX(s, ',', 3)") == [None, None, None, "c", None, None]
    assert ours("SPLIT_INDEX(s, ',', 0)") == [
        "Hello World",
        "  padded  ",
        None,
        "a",
        "ÄÖü straße",
        None,
    ]
    assert ours("SPLIT_INDEX(s, ',', -1)") == [None] * 6
    # Flink splits '' into no pieces (SPLIT_INDEX('', ',', 0) is NULL) but ',' into two ''.
    empty = pa.record_batch({"s": ["", ",", "a"]})
    assert ours("SPLIT_INDEX(s, ',', 0)", batch=empty) == [None, "", "a"]
    assert ours("SPLIT_INDEX(s, ',', n)") == [None, None, None, "a", None, None]
    sliced = BATCH.slice(3, 2)  # offsets of a sliced batch
    assert ours("SPLIT_INDEX(s, ',', 1)", batch=sliced) == ["b", None]


def test_regexp_extract_defaults_to_the_whole_match() -> None:
    # Flink's REGEXP_EXTRACT(s, re) extracts group 0 (SqlFunctionUtils.regexpExtract);
    # NULL when nothing matches.
    assert ours("REGEXP_EXTRACT(s, 'l+o')") == ["llo", None, None, None, None, None]
    # \w is ASCII-only in Java's regular expressions and in RE2 alike.
    assert ours("REGEXP_EXTRACT(s, '(\\w+) (\\w+)', 2)") == ["World", None, None, None, None, None]
    assert ours("REGEXP_EXTRACT(url, '(&|^)channel_id=([^&]*)', 2)") == [
        "1099",
        "77",
        None,
        None,
        None,
        None,
    ]


def test_split_index_calls_on_one_string_split_it_once() -> None:
    # q22 takes three pieces of one URL: one split step, three index steps, and the
    # pieces still right after a WHERE drops rows (the split list is filtered too).
    program = CalcProgram.compile(
        [(f"p{i}", parse(f"SPLIT_INDEX(s, ',', {i})")) for i in range(3)],
        parse("n >= 0"),
        FIELDS,
        FunctionCatalog(),
    )
    kernels = [step.kernel.__name__ for step in program._program.steps]
    assert kernels.count("split") == 1 and kernels.count("split_index") == 3
    out = program(BATCH).to_pydict()
    assert out == {
        "p0": ["Hello World", "a", "ÄÖü straße", None],  # '' has no pieces (Flink's)
        "p1": [None, "b", None, None],
        "p2": [None, "", None, None],
    }


def test_regexp_extract_captures_only_the_wanted_group() -> None:
    # The pattern RE2 runs has one capture group, the asked one: the others (plain,
    # named, nested) become non-capturing without changing Java's group numbers.
    assert ours("REGEXP_EXTRACT(s, '(?P<first>\\w)(\\w+) (W(or)ld)', 3)") == [
        "World",
        None,
        None,
        None,
        None,
        None,
    ]
    assert ours("REGEXP_EXTRACT(s, '(\\w)((\\w)l)', 3)") == ["e", None, None, None, None, None]
    assert ours("REGEXP_EXTRACT(s, '[(]?(l+)(o)', 0)") == ["llo", None, None, None, None, None]
    assert ours("REGEXP_EXTRACT(url, '(?:&|^)channel_id=([^&]*)', 1)") == [
        "1099",
        "77",
        None,
        None,
        None,
        None,
    ]


def test_regexp_errors_at_compile_time() -> None:
    with pytest.raises(
        SqlError, match=r"^line 1, column 8: REGEXP_EXTRACT: invalid regular expression '\(x'"
    ):
        compile_expression(parse("REGEXP_EXTRACT(s, '(x', 1)"), FIELDS, FunctionCatalog())
    with pytest.raises(SqlError, match="has no group 3"):
        compile_expression(parse("REGEXP_EXTRACT(s, '(a)(b)', 3)"), FIELDS, FunctionCatalog())
    with pytest.raises(SqlError, match="unsupported regular expression"):
        compile_expression(parse("REGEXP_EXTRACT(s, '(a)\\1', 1)"), FIELDS, FunctionCatalog())


def test_concat_is_null_when_any_argument_is() -> None:
    # Flink's CONCAT returns NULL if any argument is NULL (DuckDB's skips NULLs).
    assert ours("CONCAT(s, '-', s)")[:3] == [
        "Hello World-Hello World",
        "  padded  -  padded  ",
        None,
    ]


def test_substring_positions_follow_flink() -> None:
    # Flink: start 0 counts as 1, a negative start counts from the end.
    assert ours("SUBSTRING(s, 0, 3)")[:2] == ["Hel", "  p"]
    assert ours("SUBSTRING(s, -3)")[:2] == ["rld", "d  "]
    assert ours("SUBSTRING(s, -3, 2)")[:2] == ["rl", "d "]
    # ... and gives '' when it reaches before the start; a negative length gives NULL.
    assert ours("SUBSTRING(s, -11)") == ["Hello World", "", None, "", "", ""]
    assert ours("SUBSTRING(s, 2, -1)") == [None] * 6


def test_initcap() -> None:
    # Flink: the first letter of each word upper case, the rest lower case.
    assert ours("INITCAP(LOWER(s))")[:2] == ["Hello World", "  Padded  "]


def test_date_format_takes_java_patterns() -> None:
    # Flink's DATE_FORMAT takes SimpleDateFormat patterns, not strftime's.
    assert ours("DATE_FORMAT(ts, 'yyyy-MM-dd')") == [
        "2020-09-13",
        "1999-12-31",
        None,
        "2024-02-29",
        "1970-01-01",
        "2021-06-01",
    ]
    assert ours("DATE_FORMAT(ts, 'HH:mm')")[:2] == ["12:26", "23:59"]
    assert ours("DATE_FORMAT(ts, 'yyyy-MM-dd HH:mm:ss.SSS')")[:2] == [
        "2020-09-13 12:26:45.123",
        "1999-12-31 23:59:59.999",
    ]
    assert ours("DATE_FORMAT(ts, '''at'' HH ''o''''clock'' 100%')")[0] == "at 12 o'clock 100%"
    # Java's rule: a numeric letter's count is its minimum number of digits.
    assert ours("DATE_FORMAT(ts, 'EEE MMM D')")[4] == "Thu Jan 1"
    assert ours("DATE_FORMAT(ts, 'y M d H h m s D DDD')")[4] == "1970 1 1 7 7 5 3 1 001"
    assert ours("DATE_FORMAT(ts, 'M/d H:m:s')")[0] == "9/13 12:26:45"
    assert ours("DATE_FORMAT(ts, 'h a')")[1] == "11 PM"
    with pytest.raises(SqlError, match="DATE_FORMAT: unsupported pattern 'QQ'"):
        compile_expression(parse("DATE_FORMAT(ts, 'QQ')"), FIELDS, FunctionCatalog())


def test_timestampadd_and_timestampdiff() -> None:
    assert ours("TIMESTAMPADD(HOUR, 2, ts)")[0] == dt.datetime(2020, 9, 13, 14, 26, 45, 123000)
    assert ours("TIMESTAMPADD(DAY, n, ts)")[:2] == [
        dt.datetime(2020, 9, 17, 12, 26, 45, 123000),
        dt.datetime(1999, 12, 22, 23, 59, 59, 999000),
    ]
    # Flink: whole units from the first to the second timestamp, toward zero, as INT.
    assert ours("TIMESTAMPDIFF(MINUTE, ts, ts + INTERVAL '90' SECOND)")[:3] == [1, 1, None]
    assert ours("TIMESTAMPDIFF(SECOND, ts + INTERVAL '1.5' SECOND, ts)")[0] == -1
    with pytest.raises(SqlError, match="TIMESTAMPADD: unsupported unit MONTH"):
        compile_expression(parse("TIMESTAMPADD(MONTH, 1, ts)"), FIELDS, FunctionCatalog())


def test_to_timestamp_and_epoch_functions() -> None:
    batch = pa.record_batch({"v": ["2020-01-02 03:04:05", "bad", None, "2020-01-02 03:04:05.250"]})
    # Flink: TO_TIMESTAMP gives NULL for a string that does not parse.
    assert ours("TO_TIMESTAMP(v)", batch=batch) == [
        dt.datetime(2020, 1, 2, 3, 4, 5),
        None,
        None,
        dt.datetime(2020, 1, 2, 3, 4, 5, 250000),
    ]
    assert ours("TO_TIMESTAMP(v, 'yyyy-MM-dd HH:mm:ss')", batch=batch)[:3] == [
        dt.datetime(2020, 1, 2, 3, 4, 5),
        None,
        None,
    ]
    assert ours("UNIX_TIMESTAMP(v)", batch=batch)[:3] == [1577934245, None, None]
    assert ours("UNIX_TIMESTAMP(ts)")[:1] == [1600000005]
    utc = dt.UTC
    assert ours("TO_TIMESTAMP_LTZ(n, 0)")[:2] == [
        dt.datetime(1970, 1, 1, 0, 0, 4, tzinfo=utc),
        dt.datetime(1969, 12, 31, 23, 59, 51, tzinfo=utc),
    ]
    assert ours("TO_TIMESTAMP_LTZ(n * 1000, 3)")[0] == dt.datetime(1970, 1, 1, 0, 0, 4, tzinfo=utc)


def test_math_functions_with_java_semantics() -> None:
    # ROUND is HALF_UP (away from zero); SQRT/LN of negatives are NaN as in Java's Math.
    assert ours("ROUND(x)")[:2] == [3.0, -3.0]
    # Flink rounds a DOUBLE through BigDecimal.valueOf (its shortest decimal text):
    # ROUND(1.45, 1) is 1.5, where DuckDB's binary rounding gives 1.4.
    assert ours("ROUND(x, 1)")[5] == 1.5
    assert ours("ROUND(n, -1)")[:2] == [0, -10]
    compiled = compile_expression(parse("ROUND(d, 1)"), FIELDS, FunctionCatalog())
    assert compiled.type.sql() == "DECIMAL(5, 1)"
    assert compiled.evaluate(BATCH).to_pylist()[:2] == [Decimal("1.3"), Decimal("-2.4")]
    assert (
        compile_expression(parse("CEIL(d)"), FIELDS, FunctionCatalog()).type.sql()
        == "DECIMAL(4, 0)"
    )
    assert math.isnan(ours("SQRT(x)")[1])
    assert math.isnan(ours("LN(x)")[1])
    assert ours("LN(n - n)")[0] == -math.inf


def test_null_propagates_through_every_builtin() -> None:
    batch = pa.record_batch(
        {
            "s": pa.array([None], pa.string()),
            "n": pa.array([None], pa.int64()),
            "x": pa.array([None], pa.float64()),
            "ts": pa.array([None], pa.timestamp("ms")),
        }
    )
    for text in [
        "UPPER(s)",
        "LOWER(s)",
        "CHAR_LENGTH(s)",
        "TRIM(s)",
        "SUBSTRING(s, 1, 2)",
        "CONCAT(s, 'a')",
        "REPLACE(s, 'a', 'b')",
        "POSITION('a' IN s)",
        "SPLIT_INDEX(s, '/', 0)",
        "REGEXP_EXTRACT(s, 'a')",
        "REGEXP(s, 'a')",
        "INITCAP(s)",
        "ABS(n)",
        "MOD(n, 2)",
        "CEIL(x)",
        "FLOOR(x)",
        "ROUND(x, 1)",
        "POWER(x, 2)",
        "SQRT(x)",
        "LN(x)",
        "LOG10(x)",
        "EXP(x)",
        "HOUR(ts)",
        "EXTRACT(YEAR FROM ts)",
        "DATE_FORMAT(ts, 'yyyy')",
        "TIMESTAMPADD(SECOND, 1, ts)",
        "TIMESTAMPDIFF(SECOND, ts, ts)",
        "TO_TIMESTAMP(s)",
        "TO_TIMESTAMP_LTZ(n, 3)",
        "UNIX_TIMESTAMP(ts)",
        "COALESCE(s, s)",
        "NULLIF(n, 1)",
        "IF(n > 0, 1, NULL)",
    ]:
        assert ours(text, batch=batch) == [None], text


def test_function_errors_are_one_line_with_the_position() -> None:
    cases = {
        "UPPER(n)": "line 1, column 8: UPPER takes a string argument, not BIGINT",
        "SPLIT_INDEX(s, url, 1)": "line 1, column 8: SPLIT_INDEX: the separator must be a literal",
        "ROUND(x, n)": "line 1, column 8: ROUND: the number of digits must be a literal",
        "CONCAT(s, n)": "line 1, column 8: CONCAT takes a string argument, not BIGINT",
        "HOUR(s)": "line 1, column 8: HOUR takes a TIMESTAMP or DATE, not STRING",
        "SQRT(s)": "line 1, column 8: SQRT takes a number, not STRING",
        "SPLIT_INDEX(s, ',')": "line 1, column 8: SPLIT_INDEX takes 3 arguments, not 2",
        "NOSUCH(n)": "line 1, column 8: unsupported function NOSUCH",
    }
    for text, message in cases.items():
        with pytest.raises(SqlError) as err:
            compile_expression(parse(text), FIELDS, FunctionCatalog())
        assert str(err.value) == message


# --------------------------------------------------------------------------- Nexmark

NEXMARK_BID = pa.record_batch(
    {
        "auction": pa.array([1000, 1230, 1107, 5], pa.int64()),
        "bidder": pa.array([1, 2, 3, 4], pa.int64()),
        "price": pa.array([2_000_000, 1_500, 60_000_000, None], pa.int64()),
        "channel": pa.array(["Apple", "Google", "channel-77", "Baidu"]),
        "url": pa.array(
            [
                "https://www.nexmark.com/xac/wzu/item.htm?query=1",
                "https://www.nexmark.com/a/b/item.htm?query=1&channel_id=55",
                "https://www.nexmark.com/k/l/item.htm?query=1&channel_id=77",
                "https://www.nexmark.com/m",
            ]
        ),
        "dateTime": pa.array(
            [
                dt.datetime(2015, 7, 15, 8, 0, 1),
                dt.datetime(2015, 7, 15, 19, 30),
                dt.datetime(2015, 7, 15, 5, 59, 59),
                dt.datetime(2015, 7, 15, 18, 0),
            ],
            pa.timestamp("ms"),
        ),
        "extra": pa.array(["accc", "", None, "c"]),
    }
)
NEXMARK_FIELDS = [Field(f.name, SqlType.from_arrow(f.type)) for f in NEXMARK_BID.schema]


def nexmark(
    projections: list[tuple[str, str]],
    where: str | None = None,
    catalog: FunctionCatalog | None = None,
) -> dict[str, list[Any]]:
    program = CalcProgram.compile(
        [(name, parse(text)) for name, text in projections],
        parse(where) if where else None,
        NEXMARK_FIELDS,
        catalog or FunctionCatalog(),
    )
    return program(NEXMARK_BID).to_pydict()


def test_nexmark_q1_converts_to_decimal_euros() -> None:
    out = nexmark([("auction", "auction"), ("price", "0.908 * price")])
    assert out["price"] == [
        Decimal("1816000.000"),
        Decimal("1362.000"),
        Decimal("54480000.000"),
        None,
    ]


def test_nexmark_q2_mod_filter() -> None:
    assert nexmark([("auction", "auction"), ("price", "price")], "MOD(auction, 123) = 0") == {
        "auction": [1230, 1107],
        "price": [1_500, 60_000_000],
    }


def test_nexmark_q10_date_format() -> None:
    out = nexmark(
        [
            ("dt", "DATE_FORMAT(`dateTime`, 'yyyy-MM-dd')"),
            ("hm", "DATE_FORMAT(`dateTime`, 'HH:mm')"),
        ]
    )
    assert out == {"dt": ["2015-07-15"] * 4, "hm": ["08:00", "19:30", "05:59", "18:00"]}


def test_nexmark_q14_case_hour_and_udf() -> None:
    catalog = FunctionCatalog()

    def count_char(text: pa.Array, char: pa.Array) -> pa.Array:
        return pc.count_substring(text, char[0].as_py()) if len(char) else pa.array([], pa.int64())

    catalog.register("count_char", count_char, result_type="BIGINT")
    out = nexmark(
        [
            ("price", "0.908 * price"),
            (
                "bidTimeType",
                """CASE
                    WHEN HOUR(`dateTime`) >= 8 AND HOUR(`dateTime`) <= 18 THEN 'dayTime'
                    WHEN HOUR(`dateTime`) <= 6 OR HOUR(`dateTime`) >= 20 THEN 'nightTime'
                    ELSE 'otherTime'
                END""",
            ),
            ("c_counts", "count_char(extra, 'c')"),
        ],
        "0.908 * price > 1000000 AND 0.908 * price < 50000000",
        catalog,
    )
    assert out == {"price": [Decimal("1816000.000")], "bidTimeType": ["dayTime"], "c_counts": [3]}


def test_nexmark_q21_channel_ids() -> None:
    case = """CASE
        WHEN lower(channel) = 'apple' THEN '0'
        WHEN lower(channel) = 'google' THEN '1'
        WHEN lower(channel) = 'facebook' THEN '2'
        WHEN lower(channel) = 'baidu' THEN '3'
        ELSE REGEXP_EXTRACT(url, '(&|^)channel_id=([^&]*)', 2)
        END"""
    where = """REGEXP_EXTRACT(url, '(&|^)channel_id=([^&]*)', 2) is not null or
          lower(channel) in ('apple', 'google', 'facebook', 'baidu')"""
    out = nexmark([("auction", "auction"), ("channel_id", case)], where)
    assert out == {"auction": [1000, 1230, 1107, 5], "channel_id": ["0", "1", "77", "3"]}


def test_nexmark_q22_split_index() -> None:
    out = nexmark(
        [
            ("dir1", "SPLIT_INDEX(url, '/', 3)"),
            ("dir2", "SPLIT_INDEX(url, '/', 4)"),
            ("dir3", "SPLIT_INDEX(url, '/', 5)"),
        ]
    )
    assert out == {
        "dir1": ["xac", "a", "k", "m"],
        "dir2": ["wzu", "b", "l", None],
        "dir3": [
            "item.htm?query=1",
            "item.htm?query=1&channel_id=55",
            "item.htm?query=1&channel_id=77",
            None,
        ],
    }


# --------------------------------------------------------------------------- catalog and UDFs


def test_builtins_are_found_in_any_case_and_udfs_by_their_name() -> None:
    catalog = FunctionCatalog()
    assert catalog.lookup("upper") is BUILTINS["UPPER"]
    assert catalog.lookup("Split_Index") is BUILTINS["SPLIT_INDEX"]
    assert catalog.lookup("nosuch") is None
    function = catalog.register("myFn", lambda v: v, result_type="BIGINT")
    assert catalog.lookup("myFn") is function
    assert catalog.lookup("myfn") is None
    assert "myFn" in catalog.names() and "UPPER" in catalog.names()


def test_udf_decorator_registers_for_the_process_and_stays_callable() -> None:
    @udf(result_type="DOUBLE", name="test_to_usd")
    def to_usd(price: pa.Array) -> pa.Array:
        return pc.multiply(pc.cast(price, pa.float64()), 1.25)

    assert isinstance(to_usd, ScalarFunction)
    assert to_usd.name == "test_to_usd" and to_usd.result_type.sql() == "DOUBLE"
    assert to_usd(pa.array([4])).to_pylist() == [5.0]  # still the function
    assert to_usd.__name__ == "to_usd"
    assert ours("test_to_usd(n)")[:2] == [5.0, -11.25]  # any new catalog sees it
    assert es.sql.udf is udf


def test_register_takes_a_scalar_function_under_another_name() -> None:
    catalog = FunctionCatalog()
    base = ScalarFunction(lambda v: pc.negate(v), "BIGINT", name="neg")
    registered = catalog.register("minus", base)
    assert registered.name == "minus" and registered.fn is base.fn
    assert ours("minus(n)", catalog)[:2] == [-4, 9]
    with pytest.raises(SqlError, match="needs result_type"):
        catalog.register("bare", lambda v: v)


def test_udf_results_are_checked_per_batch() -> None:
    catalog = FunctionCatalog()
    catalog.register("short", lambda v: pa.array([1]), result_type="BIGINT")
    catalog.register("texts", lambda v: pa.array(["x"] * len(v)), result_type="BIGINT")
    catalog.register(
        "wide", lambda v: pc.multiply(pc.cast(v, pa.float64()), 0.5), result_type="INT"
    )
    catalog.register("listy", lambda v: [7] * len(v), result_type="INT")
    with pytest.raises(DataError) as err:
        ours("short(n)", catalog)
    assert (
        str(err.value)
        == "line 1, column 8: short(n): SQL function short returned 1 values for 6 rows"
    )
    with pytest.raises(
        DataError,
        match=r"^line 1, column 8: texts\(n\): SQL function texts returned string, which does not convert to BIGINT",
    ):
        ours("texts(n)", catalog)
    with pytest.raises(
        DataError,
        match="SQL function wide returned double, which does not convert to INT without loss",
    ):
        ours("wide(n)", catalog)
    assert ours("listy(n)", catalog) == [7] * 6  # a sequence converts


def test_udf_exceptions_are_wrapped_naming_the_function() -> None:
    catalog = FunctionCatalog()

    def broken(v: pa.Array) -> pa.Array:
        raise ValueError("no good")

    catalog.register("broken", broken, result_type="BIGINT")
    with pytest.raises(UserFunctionError) as err:
        ours("broken(n)", catalog)
    assert str(err.value) == (
        "line 1, column 8: broken(n): SQL function broken failed on record "
        "'<batch of 6 rows>': ValueError: no good"
    )
    assert isinstance(err.value.__cause__, ValueError)


def test_udf_gets_literals_as_arrays_and_survives_cloudpickle() -> None:
    seen: list[tuple[int, int]] = []

    def both(a: pa.Array, b: pa.Array) -> pa.Array:
        seen.append((len(a), len(b)))
        return pc.binary_join_element_wise(a, b, "")

    function = ScalarFunction(both, "STRING")
    restored = cloudpickle.loads(cloudpickle.dumps(function))
    catalog = FunctionCatalog()
    catalog.register("both", restored)
    assert ours("both(s, '!')", catalog)[:3] == ["Hello World!", "  padded  !", None]
    assert (6, 6) in seen or seen == []  # the restored copy records in its own list


def test_every_builtin_is_called_in_these_tests() -> None:
    here = Path(__file__).parent
    text = (here / "test_functions.py").read_text() + (here / "test_expressions.py").read_text()
    # Called as NAME( in an expression string, or bare for the clock functions.
    missing = [name for name in BUILTINS if not re.search(rf"[\"'(, ]{name}(\(|\b)", text)]
    assert missing == []


def test_position_counts_characters() -> None:
    # Flink's POSITION is a character index, not a byte offset.
    batch = pa.record_batch({"s": ["héllo wörld", "日本語テキスト", None]})
    assert ours("POSITION('l' IN s)", batch=batch) == [3, 0, None]
    assert ours("POSITION('ö' IN s)", batch=batch) == [8, 0, None]
    assert ours("POSITION('テ' IN s)", batch=batch) == [0, 4, None]
    assert ours("POSITION('' IN s)", batch=batch) == [1, 1, None]


def test_truncate_cuts_toward_zero_with_rounds_types() -> None:
    # Flink's TRUNCATE(x[, n]) (SqlFunctionUtils.struncate): toward zero to n decimals of
    # x's decimal form (BigDecimal.valueOf), typed as ROUND.
    batch = pa.record_batch({"x": [0.29, 2.567, -2.567, None, math.inf, 1e300, -0.001]})
    assert ours("TRUNCATE(x, 2)", batch=batch) == [0.29, 2.56, -2.56, None, math.inf, 1e300, 0.0]
    assert ours("TRUNCATE(x)", batch=batch)[:3] == [0.0, 2.0, -2.0]
    assert ours("TRUNCATE(x, -1)", batch=batch)[:3] == [0.0, 0.0, 0.0]
    assert ours("TRUNCATE(d, 1)") == [
        Decimal("1.2"),
        Decimal("-2.3"),
        None,
        Decimal("0.0"),
        Decimal("9.9"),
        Decimal("0.0"),
    ]
    assert ours("TRUNCATE(n, -1)") == [0, 0, None, 0, 10, 0]
    assert ours("TRUNCATE(n)") == ours("n")
    fields, catalog = FIELDS, FunctionCatalog()
    assert compile_expression(parse("TRUNCATE(d, 1)"), fields, catalog).type.sql() == (
        "DECIMAL(5, 1)"
    )
    with pytest.raises(SqlError, match="TRUNCATE: the number of digits must be a literal"):
        compile_expression(parse("TRUNCATE(x, n)"), fields, catalog)


def test_concat_ws_skips_nulls_and_a_null_separator_is_null() -> None:
    # Flink: CONCAT_WS('-', 'a', NULL, 'b') is 'a-b'; '' is kept; a NULL separator is NULL.
    assert ours("CONCAT_WS('-', s, 'k', s)")[2:4] == ["k", "a,b,,c-k-a,b,,c"]
    assert ours("CONCAT_WS('-', '', s)")[:3] == ["-Hello World", "-  padded  ", ""]
    assert ours("CONCAT_WS(CAST(NULL AS STRING), 'a', 'b')") == [None] * 6
    with pytest.raises(SqlError, match="CONCAT_WS takes a separator and at least one string"):
        compile_expression(parse("CONCAT_WS('-')"), FIELDS, FunctionCatalog())
