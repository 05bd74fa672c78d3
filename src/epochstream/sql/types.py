"""Flink SQL's data types, their Arrow types, and Flink's type rules for arithmetic,
comparison, CASE/COALESCE and aggregates.

Flink types numbers the way Calcite does: integer arithmetic keeps the wider integer type
(``BIGINT + INT`` is ``BIGINT``, ``7 / 2`` is ``3``), DECIMAL arithmetic follows SQL
Server's precision/scale rules capped at 38 digits (``LogicalTypeMerging`` in Flink), and
any approximate operand makes the result ``DOUBLE`` (or ``FLOAT`` when both are at most
``FLOAT``).

Example::

    t = SqlType.parse("DECIMAL(4, 3)")
    arithmetic_result_type("*", t, BIGINT).sql()     # 'DECIMAL(24, 3)'
    SqlType.parse("TIMESTAMP(3)").to_arrow()         # timestamp[ms]
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pyarrow as pa
import sqlglot
from sqlglot import exp

from epochstream.exceptions import SqlError
from epochstream.sql.dialect import Flink, sql_error

__all__ = [
    "BIGINT",
    "BOOLEAN",
    "DOUBLE",
    "INT",
    "INTERVAL",
    "MAX_PRECISION",
    "NULL",
    "STRING",
    "SqlType",
    "aggregate_result_type",
    "arithmetic_result_type",
    "common_type",
    "comparable",
]

MAX_PRECISION = 38
MAX_LENGTH = 2147483647  # VARCHAR(MAX_LENGTH) is STRING
_INTEGERS = ("TINYINT", "SMALLINT", "INT", "BIGINT")
_INTEGER_DIGITS = {"TINYINT": 3, "SMALLINT": 5, "INT": 10, "BIGINT": 19}
_APPROX = ("FLOAT", "DOUBLE")
_STRINGS = ("CHAR", "VARCHAR")
_TIMESTAMPS = ("TIMESTAMP", "TIMESTAMP_LTZ")


_ARROW_SIMPLE = {
    "BOOLEAN": pa.bool_(),
    "TINYINT": pa.int8(),
    "SMALLINT": pa.int16(),
    "INT": pa.int32(),
    "BIGINT": pa.int64(),
    "FLOAT": pa.float32(),
    "DOUBLE": pa.float64(),
    "BYTES": pa.binary(),
    "DATE": pa.date32(),
    "TIME": pa.time32("ms"),
    "INTERVAL": pa.duration("ms"),
    "NULL": pa.null(),
}
_FROM_ARROW_SIMPLE = {str(v): k for k, v in _ARROW_SIMPLE.items()}
_UNIT_PRECISION = {"s": 0, "ms": 3, "us": 6, "ns": 9}


@dataclass(frozen=True)
class SqlType:
    """One Flink SQL type: ``name`` (``INT``, ``DECIMAL``, ``VARCHAR``, ``TIMESTAMP`` ...),
    ``precision``/``scale`` where the type has them (a VARCHAR's length is its precision),
    and whether NULL is allowed.

    Example: ``SqlType("DECIMAL", 23, 3).sql() == "DECIMAL(23, 3)"``
    """

    name: str
    precision: int | None = None
    scale: int | None = None
    nullable: bool = True

    @classmethod
    def parse(cls, text: str) -> SqlType:
        """The type spelled in Flink DDL. Example: ``SqlType.parse("STRING") == STRING``."""
        try:
            node = sqlglot.parse_one(f"CAST(NULL AS {text})", dialect=Flink)
        except sqlglot.errors.ParseError as err:
            raise SqlError(f"not a SQL type: {text!r} ({str(err).splitlines()[0]})") from None
        assert isinstance(node, exp.Cast)
        return cls.from_ddl(node.to)

    @classmethod
    def from_ddl(cls, node: exp.DataType) -> SqlType:
        """The type a DDL column or CAST names; unsupported types are a :class:`SqlError`
        at the type's position.

        Example: ``SqlType.from_ddl(create.find(exp.DataType))``
        """
        kind = node.this
        params = [int(p.this.name) for p in node.expressions if isinstance(p, exp.DataTypeParam)]
        T = exp.DataType.Type
        simple = {
            T.BOOLEAN: "BOOLEAN",
            T.TINYINT: "TINYINT",
            T.SMALLINT: "SMALLINT",
            T.INT: "INT",
            T.BIGINT: "BIGINT",
            T.FLOAT: "FLOAT",
            T.DOUBLE: "DOUBLE",
            T.VARBINARY: "BYTES",
            T.BINARY: "BYTES",
            T.DATE: "DATE",
            T.TIME: "TIME",
        }
        if kind in simple:
            return cls(simple[kind])
        if kind == T.DECIMAL:
            precision, scale = (params + [10, 0][len(params) :])[:2]  # Flink: DECIMAL(10, 0)
            if not 1 <= precision <= MAX_PRECISION or not 0 <= scale <= precision:
                raise sql_error(node, f"DECIMAL({precision}, {scale}) is out of range")
            return cls("DECIMAL", precision, scale)
        if kind == T.TEXT:
            return STRING
        if kind == T.VARCHAR:
            # A VARCHAR without a length holds any string here, as the Nexmark DDL expects.
            return cls("VARCHAR", params[0] if params else MAX_LENGTH)
        if kind == T.CHAR:
            return cls("CHAR", params[0] if params else 1)
        if kind in (T.TIMESTAMP, T.TIMESTAMPLTZ):
            precision = params[0] if params else 6  # Flink's default precision
            name = "TIMESTAMP" if kind == T.TIMESTAMP else "TIMESTAMP_LTZ"
            return cls(name, precision)
        raise sql_error(node, f"unsupported type {node.sql(dialect=Flink)}")

    @classmethod
    def from_arrow(cls, dtype: pa.DataType, nullable: bool = True) -> SqlType:
        """The SQL type of an Arrow column.

        Example: ``SqlType.from_arrow(pa.timestamp("ms")).sql() == "TIMESTAMP(3)"``
        """
        if pa.types.is_string(dtype) or pa.types.is_large_string(dtype):
            return replace(STRING, nullable=nullable)
        if pa.types.is_decimal(dtype):
            return cls("DECIMAL", dtype.precision, dtype.scale, nullable)
        if pa.types.is_timestamp(dtype):
            name = "TIMESTAMP_LTZ" if dtype.tz else "TIMESTAMP"
            return cls(name, _UNIT_PRECISION[dtype.unit], None, nullable)
        if pa.types.is_duration(dtype):
            return cls("INTERVAL", None, None, nullable)
        if pa.types.is_large_binary(dtype):
            return cls("BYTES", None, None, nullable)
        simple = _FROM_ARROW_SIMPLE.get(str(dtype))
        if simple is None:
            raise SqlError(f"no SQL type for the Arrow type {dtype}")
        return cls(simple, None, None, nullable)

    def to_arrow(self) -> pa.DataType:
        """The Arrow type holding this type's values. TIMESTAMP(p) keeps milliseconds up
        to p = 3, then micro- and nanoseconds; TIMESTAMP_LTZ is UTC.

        Example: ``SqlType("TIMESTAMP_LTZ", 3).to_arrow() == pa.timestamp("ms", tz="UTC")``
        """
        if self.name in _STRINGS:
            return pa.string()
        if self.name == "DECIMAL":
            return pa.decimal128(self.precision or 10, self.scale or 0)
        if self.name in _TIMESTAMPS:
            p = 6 if self.precision is None else self.precision
            unit = "ms" if p <= 3 else "us" if p <= 6 else "ns"
            return pa.timestamp(unit, tz="UTC" if self.name == "TIMESTAMP_LTZ" else None)
        return _ARROW_SIMPLE[self.name]

    def sql(self) -> str:
        """Flink's spelling, as explain output and errors show it.

        Example: ``SqlType("BIGINT", nullable=False).sql() == "BIGINT NOT NULL"``
        """
        if self.name == "VARCHAR" and self.precision == MAX_LENGTH:
            text = "STRING"
        elif self.name == "DECIMAL":
            text = f"DECIMAL({self.precision}, {self.scale})"
        elif self.name == "INTERVAL":
            text = "INTERVAL SECOND(3)"
        elif self.precision is not None:
            text = f"{self.name}({self.precision})"
        else:
            text = self.name
        return text if self.nullable else text + " NOT NULL"

    def with_nullable(self, nullable: bool) -> SqlType:
        """This type, NULL allowed or not. Example: ``INT.with_nullable(False).sql() == "INT NOT NULL"``"""
        return replace(self, nullable=nullable)

    # ---- families ---------------------------------------------------------------------

    @property
    def is_integer(self) -> bool:
        """TINYINT, SMALLINT, INT or BIGINT. Example: ``BIGINT.is_integer``"""
        return self.name in _INTEGERS

    @property
    def is_numeric(self) -> bool:
        """An integer, DECIMAL, FLOAT or DOUBLE. Example: ``DOUBLE.is_numeric``"""
        return self.name in _INTEGERS or self.name in _APPROX or self.name == "DECIMAL"

    @property
    def is_approximate(self) -> bool:
        """FLOAT or DOUBLE. Example: ``DOUBLE.is_approximate``"""
        return self.name in _APPROX

    @property
    def is_string(self) -> bool:
        """CHAR or VARCHAR (STRING). Example: ``STRING.is_string``"""
        return self.name in _STRINGS

    @property
    def is_timestamp(self) -> bool:
        """TIMESTAMP or TIMESTAMP_LTZ. Example: ``SqlType("TIMESTAMP", 3).is_timestamp``"""
        return self.name in _TIMESTAMPS

    def as_decimal(self) -> SqlType:
        """An exact numeric type as the DECIMAL that holds it (INT is DECIMAL(10, 0)).

        Example: ``BIGINT.as_decimal().sql() == "DECIMAL(19, 0)"``
        """
        if self.name == "DECIMAL":
            return self
        return SqlType("DECIMAL", _INTEGER_DIGITS[self.name], 0, self.nullable)


BOOLEAN = SqlType("BOOLEAN")
INT = SqlType("INT")
BIGINT = SqlType("BIGINT")
DOUBLE = SqlType("DOUBLE")
STRING = SqlType("VARCHAR", MAX_LENGTH)
INTERVAL = SqlType("INTERVAL")
NULL = SqlType("NULL")


def _decimal(precision: int, scale: int, nullable: bool) -> SqlType:
    """Flink's ``adjustPrecisionScale``: past 38 digits the integer part is kept and the
    scale shrinks, but not below min(scale, 6)."""
    if precision <= MAX_PRECISION:
        return SqlType("DECIMAL", precision, scale, nullable)
    digits = precision - scale
    scale = max(MAX_PRECISION - digits, min(scale, 6))
    return SqlType("DECIMAL", MAX_PRECISION, scale, nullable)


def _wider_integer(a: SqlType, b: SqlType) -> SqlType:
    return a if _INTEGERS.index(a.name) >= _INTEGERS.index(b.name) else b


def arithmetic_result_type(op: str, left: SqlType, right: SqlType) -> SqlType | None:
    """The type of ``left op right`` for ``op`` in ``+ - * / %`` on numbers, or ``None``
    when Flink refuses the operands (the caller names them in its error).

    Integers keep the wider integer type, ``/`` included (Calcite's least restrictive
    type: ``CAST(1 AS BIGINT) / 1000`` is ``0``, CALCITE-4749); ``%`` takes the divisor's
    type. DECIMAL follows Flink's LogicalTypeMerging; FLOAT/DOUBLE win over exact types.

    Example: ``arithmetic_result_type("/", INT, INT) == INT``
    """
    nullable = left.nullable or right.nullable
    if left.name == "NULL" and right.name == "NULL":
        return None
    if left.name == "NULL":
        left = right
    if right.name == "NULL":
        right = left
    if not (left.is_numeric and right.is_numeric):
        return None
    if left.is_approximate or right.is_approximate:
        name = "FLOAT" if {left.name, right.name} <= {"FLOAT", *_INTEGERS} else "DOUBLE"
        return SqlType(name, nullable=nullable)
    if left.is_integer and right.is_integer:
        if op == "%":
            return right.with_nullable(nullable)
        return _wider_integer(left, right).with_nullable(nullable)
    a, b = left.as_decimal(), right.as_decimal()
    p1, s1, p2, s2 = a.precision or 0, a.scale or 0, b.precision or 0, b.scale or 0
    if op in "+-":
        scale = max(s1, s2)
        return _decimal(max(p1 - s1, p2 - s2) + scale + 1, scale, nullable)
    if op == "*":
        return _decimal(p1 + p2 + 1, s1 + s2, nullable)
    if op == "/":
        scale = max(6, s1 + p2 + 1)
        return _decimal(p1 - s1 + s2 + scale, scale, nullable)
    scale = max(s1, s2)  # %
    return _decimal(min(p1 - s1, p2 - s2) + scale, scale, nullable)


def common_type(types: list[SqlType]) -> SqlType | None:
    """The type all of ``types`` convert to (CASE branches, COALESCE, IN lists,
    comparisons), or ``None`` when there is none (a string and a number).

    Example: ``common_type([INT, BIGINT]) == BIGINT``;
    ``common_type([SqlType("CHAR", 3), SqlType("CHAR", 5)]).sql() == "VARCHAR(5)"``
    """
    known = [t for t in types if t.name != "NULL"]
    nullable = any(t.nullable for t in types)
    if not known:
        return NULL
    first = known[0]
    if all(t == first.with_nullable(t.nullable) for t in known):
        return first.with_nullable(nullable)
    if all(t.is_numeric for t in known):
        out = known[0]
        for t in known[1:]:
            if out.is_approximate or t.is_approximate:
                both_float = {out.name, t.name} <= {"FLOAT", *_INTEGERS}
                out = SqlType("FLOAT" if both_float else "DOUBLE")
            elif out.is_integer and t.is_integer:
                out = _wider_integer(out, t)
            else:
                a, b = out.as_decimal(), t.as_decimal()
                scale = max(a.scale or 0, b.scale or 0)
                digits = max(
                    (a.precision or 0) - (a.scale or 0), (b.precision or 0) - (b.scale or 0)
                )
                out = _decimal(digits + scale, scale, True)
        return out.with_nullable(nullable)
    if all(t.is_string for t in known):
        length = max(t.precision or 0 for t in known)
        return SqlType("VARCHAR", length, None, nullable)
    if all(t.is_timestamp for t in known) and len({t.name for t in known}) == 1:
        return SqlType(first.name, max(t.precision or 0 for t in known), None, nullable)
    return None


def comparable(left: SqlType, right: SqlType) -> bool:
    """Whether Flink compares the two types (numbers with numbers, strings with strings,
    timestamps with timestamps ...; never a string with a number).

    Example: ``not comparable(STRING, INT)``
    """
    return common_type([left, right]) is not None


def aggregate_result_type(kind: str, input_type: SqlType | None) -> SqlType:
    """The result type of an aggregate call as Flink infers it.

    COUNT is ``BIGINT NOT NULL``; SUM keeps integer types (``SUM(INT)`` is ``INT``) and
    makes a DECIMAL ``DECIMAL(38, s)``; AVG keeps the input type too (``AVG(BIGINT)`` is
    ``BIGINT``, an integer division of the sum by the count; ``AVG(DECIMAL(p, s))`` is
    ``DECIMAL(38, max(6, s))``); MIN/MAX keep the input type. All but COUNT are nullable
    (no input rows give NULL).

    Example: ``aggregate_result_type("COUNT", None).sql() == "BIGINT NOT NULL"``
    """
    kind = kind.upper()
    if kind == "COUNT":
        return BIGINT.with_nullable(False)
    if input_type is None:
        raise SqlError(f"{kind} needs an argument")
    if kind in ("MIN", "MAX"):
        return input_type.with_nullable(True)
    if not input_type.is_numeric:
        raise SqlError(f"{kind} takes a number, not {input_type.sql()}")
    if kind == "SUM":
        if input_type.name == "DECIMAL":
            return SqlType("DECIMAL", MAX_PRECISION, input_type.scale)
        return input_type.with_nullable(True)
    if kind == "AVG":
        if input_type.name == "DECIMAL":
            return (
                arithmetic_result_type(
                    "/",
                    SqlType("DECIMAL", MAX_PRECISION, input_type.scale),
                    SqlType("DECIMAL", 20, 0),
                )
                or DOUBLE
            )
        return input_type.with_nullable(True)
    raise SqlError(f"unsupported aggregate function {kind}")
