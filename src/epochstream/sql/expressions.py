"""The expression compiler: a sqlglot expression over a relation's fields becomes a flat
program of steps (kernel, argument slots, options) evaluated per ``pyarrow.RecordBatch``
with ``pyarrow.compute``; :class:`CalcProgram` fuses a projection and a filter.

A program is plain data naming module-level kernels (:mod:`epochstream.sql.kernels`), so
it pickles small and by reference; a UDF inside travels with cloudpickle. Identical
sub-trees compile to one step (common subexpressions are computed once per batch), except
calls of non-deterministic UDFs. Types and their conversions follow Flink
(:mod:`epochstream.sql.types`); bad data (an overflow, a failing CAST, a division by
zero) is a :class:`~epochstream.exceptions.DataError` naming the expression and its
position.

Example::

    node = sqlglot.parse_one("SELECT 0.908 * price FROM bid", dialect=Flink).expressions[0]
    expr = compile_expression(node, [Field("price", BIGINT)], FunctionCatalog())
    expr.type.sql()                                 # 'DECIMAL(24, 3)'
    expr.evaluate(pa.record_batch({"price": [100]}))   # [90.800]
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from sqlglot import exp

from epochstream.exceptions import DataError, SqlError
from epochstream.sql import kernels
from epochstream.sql.dialect import Flink, node_position, sql_error
from epochstream.sql.functions import (
    NOT_LITERAL,
    FunctionCatalog,
    Operand,
    ScalarFunction,
    call_udf,
    extract_component,
)
from epochstream.sql.types import (
    BIGINT,
    BOOLEAN,
    DOUBLE,
    INT,
    INTERVAL,
    MAX_LENGTH,
    MAX_PRECISION,
    NULL,
    STRING,
    SqlType,
    arithmetic_result_type,
    common_type,
)

__all__ = [
    "CalcProgram",
    "CompiledExpression",
    "Field",
    "compile_expression",
    "interval_ms",
    "refuse_subqueries",
]

Clock = Callable[[], int]


@dataclass(frozen=True)
class Field:
    """A column of a relation as the planner sees it.

    Example: ``Field("price", SqlType("BIGINT"))``
    """

    name: str
    type: SqlType


@dataclass(frozen=True)
class Step:
    """One kernel call: ``kernel(values[args], options, ctx)`` appended to the values;
    ``where`` is the position and text of the expression, for errors."""

    kernel: Callable[..., Any]
    args: tuple[int, ...]
    options: tuple
    where: str


class _Program:
    """Steps over input columns: slot i < len(columns) is the batch column named
    ``columns[i]``; step j writes slot len(columns) + j."""

    def __init__(self, columns: tuple[str, ...], steps: tuple[Step, ...]) -> None:
        self.columns = columns
        self.steps = steps

    def start(self, batch: pa.RecordBatch) -> list[Any]:
        """The values list of one evaluation: the input columns, steps to come."""
        return [batch.column(name) for name in self.columns]

    def execute(self, values: list[Any], ctx: kernels.EvalContext, stop: int | None = None) -> None:
        """Run the steps after those already in ``values`` up to slot ``stop`` (all by
        default), appending their results."""
        end = len(self.steps) if stop is None else stop - len(self.columns) + 1
        for step in self.steps[len(values) - len(self.columns) : end]:
            try:
                values.append(step.kernel([values[i] for i in step.args], step.options, ctx))
            except kernels.KernelError as err:
                raise DataError(f"{step.where}: {err}") from None
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as err:
                raise DataError(f"{step.where}: {kernels.first_line(err)}") from None


def _where(node: exp.Expr) -> str:
    line, col = node_position(node)
    text = " ".join(node.sql(dialect=Flink, normalize_functions=False).split())
    if len(text) > 80:
        text = text[:77] + "..."
    return f"line {line}, column {col}: {text}"


_LITERAL_CONSTANTS = {"LOCALTIMESTAMP", "CURRENT_TIMESTAMP", "CURRENT_DATE", "CURRENT_TIME"}
_COMPARISONS: dict[type, str] = {
    exp.EQ: "equal",
    exp.NEQ: "not_equal",
    exp.LT: "less",
    exp.LTE: "less_equal",
    exp.GT: "greater",
    exp.GTE: "greater_equal",
}
_ARITHMETIC: dict[type, str] = {
    exp.Add: "+",
    exp.Sub: "-",
    exp.Mul: "*",
    exp.Div: "/",
    exp.Mod: "%",
}
_INTERVAL_MS = {
    "MILLISECOND": 1,
    "SECOND": 1000,
    "MINUTE": 60_000,
    "HOUR": 3_600_000,
    "DAY": 86_400_000,
}


_IN_SUBQUERY = "unsupported IN with a subquery; IN takes a list of values"


def refuse_subqueries(node: exp.Expr) -> None:
    """Raise a :class:`SqlError` at a subquery inside the expression ``node`` (``IN
    (SELECT ...)``, ``EXISTS``, a scalar subquery: not supported). Checked before a
    query's columns are bound: a subquery's column names are its own, not the query's.

    Example: ``refuse_subqueries(where)`` before ``bind(where, scope)``
    """
    for query in node.find_all(exp.Query):  # breadth first: a Subquery before its SELECT
        if query is not node:
            if isinstance(query.parent, exp.In):
                raise sql_error(query.parent, _IN_SUBQUERY)
            raise sql_error(query, "unsupported subquery in an expression")


def interval_ms(node: exp.Expression) -> int:
    """Milliseconds of an ``INTERVAL 'n' UNIT`` literal (units up to DAY); n may have a
    fraction when the result is a whole number of milliseconds, as in Flink.

    Example: ``interval_ms(parse_one("INTERVAL '0.8' SECOND", dialect=Flink)) == 800``
    """
    if not isinstance(node, exp.Interval):
        raise sql_error(node, f"expected an INTERVAL literal, got {node.sql()}")
    unit_node = node.args.get("unit")
    unit = (unit_node.name if unit_node is not None else "").upper().rstrip("S")
    if unit not in _INTERVAL_MS:
        raise sql_error(
            node,
            f"unsupported interval unit {unit or '(none)'} ({', '.join(_INTERVAL_MS)})",
        )
    value = node.this
    try:
        millis = Decimal(value.name if isinstance(value, exp.Literal) else "") * _INTERVAL_MS[unit]
    except ArithmeticError:
        raise sql_error(node, f"INTERVAL takes a number in quotes, got {value.sql()}") from None
    if not millis.is_finite() or millis != millis.to_integral_value():
        raise sql_error(
            node, f"INTERVAL {value.sql()} {unit} is not a whole number of milliseconds"
        )
    return int(millis)


class _Site:
    """The compiler's :class:`~epochstream.sql.functions.CallSite` for one call node."""

    def __init__(self, compiler: _Compiler, node: exp.Expr, name: str) -> None:
        self.compiler = compiler
        self.node = node
        self.name = name

    def emit(
        self,
        kernel: Callable[..., Any],
        args: Sequence[Operand],
        options: tuple,
        result: SqlType,
        *,
        key: object = None,
    ) -> Operand:
        return self.compiler.emit(kernel, args, options, result, self.node, key=key)

    def convert(self, operand: Operand, target: SqlType) -> Operand:
        return self.compiler.convert(operand, target, self.node)

    def error(self, message: str) -> SqlError:
        return sql_error(self.node, message)


class _Compiler:
    """Compiles sqlglot nodes into steps of one program, sharing identical steps."""

    def __init__(self, inputs: Sequence[Field], functions: FunctionCatalog) -> None:
        self.fields = {f.name: f for f in inputs}
        self.functions = functions
        self.columns: list[str] = []
        self.steps: list[Step] = []
        self.memo: dict[object, int] = {}
        self.unique = itertools.count()

    def program(self) -> _Program:
        return _Program(tuple(self.columns), tuple(self.steps))

    # ---- emitting --------------------------------------------------------------------

    def emit(
        self,
        kernel: Callable[..., Any],
        args: Sequence[Operand],
        options: tuple,
        result: SqlType,
        node: exp.Expr,
        *,
        key: object = None,
        literal: Any = NOT_LITERAL,
    ) -> Operand:
        slots = tuple(a.slot for a in args)
        memo_key = (kernel, slots, options if key is None else key)
        if memo_key not in self.memo:
            self.steps.append(Step(kernel, slots, options, _where(node)))
            self.memo[memo_key] = len(self.columns) + len(self.steps) - 1
        return Operand(self.memo[memo_key], result, literal)

    def constant(self, value: Any, sql_type: SqlType, node: exp.Expr) -> Operand:
        arrow = sql_type.to_arrow()
        scalar = pa.scalar(value, arrow)
        key = ("const", str(arrow), repr(value))
        return self.emit(kernels.const, [], (scalar,), sql_type, node, key=key, literal=value)

    def convert(
        self, operand: Operand, target: SqlType, node: exp.Expr, *, try_: bool = False
    ) -> Operand:
        """``operand`` as ``target`` (an implicit conversion or a CAST)."""
        source = operand.type
        same_arrow = source.to_arrow() == target.to_arrow()
        if same_arrow and not try_:
            return Operand(
                operand.slot,
                target.with_nullable(source.nullable or target.nullable),
                operand.literal,
            )
        how = "plain"
        if source.is_string and (target.is_numeric):
            how = "trim"
        elif (source.is_approximate or source.name == "DECIMAL") and target.is_integer:
            how = "trunc"
        elif target.name == "DECIMAL" and (source.is_approximate or source.name == "DECIMAL"):
            if (source.scale or 0) > (target.scale or 0) or source.is_approximate:
                how = "round"
        elif source.name == "BOOLEAN" and target.is_string:
            how = "bool_text"
        elif source.is_string and target.name == "BOOLEAN":
            how = "text_bool"
        elif source.name != "NULL" and not _castable(source, target):
            raise sql_error(node, f"cannot cast {source.sql()} to {target.sql()}")
        result = target.with_nullable(source.nullable or target.nullable or try_)
        return self.emit(kernels.cast, [operand], (target.to_arrow(), how, try_), result, node)

    def call(self, name: str, args: list[Operand], node: exp.Expr) -> Operand:
        found = self.functions.lookup(name)
        if found is None:
            raise sql_error(node, f"unsupported function {name.upper()}")
        if isinstance(found, ScalarFunction):
            # Calls of one deterministic UDF on the same arguments share a step, wherever
            # they are written; a non-deterministic one is called at each place.
            key = (found,) if found.deterministic else ("volatile", next(self.unique))
            options = (found, _where(node))
            return self.emit(call_udf, args, options, found.result_type, node, key=key)
        return found(_Site(self, node, name.upper()), args)

    # ---- nodes -----------------------------------------------------------------------

    def compile(self, node: exp.Expr) -> Operand:
        handler = getattr(self, f"_{type(node).__name__.lower()}", None)
        if handler is not None:
            return handler(node)
        if isinstance(node, exp.Binary) and type(node) in _COMPARISONS:
            return self._comparison(node, _COMPARISONS[type(node)])
        if isinstance(node, exp.Binary) and type(node) in _ARITHMETIC:
            return self._arithmetic(node, _ARITHMETIC[type(node)])
        if isinstance(node, exp.Func):
            return self._function(node)
        raise sql_error(
            node, f"unsupported expression {type(node).__name__.upper()}: {node.sql(dialect=Flink)}"
        )

    def _column(self, node: exp.Column) -> Operand:
        name = node.name
        field = self.fields.get(name)
        if field is None:
            if not node.table and name.upper() in _LITERAL_CONSTANTS:
                return self.call(name.upper(), [], node)
            raise sql_error(node, f"unknown column '{name}'")
        if name not in self.columns:
            if self.steps:  # columns take the first slots: shift the steps' slots
                raise AssertionError("columns are collected before any step")
            self.columns.append(name)
        return Operand(self.columns.index(name), field.type)

    def _paren(self, node: exp.Paren) -> Operand:
        return self.compile(node.this)

    def _alias(self, node: exp.Alias) -> Operand:
        return self.compile(node.this)

    # literals

    def _literal(self, node: exp.Literal) -> Operand:
        if node.is_string:
            text = node.this
            return self.constant(text, SqlType("CHAR", max(1, len(text)), nullable=False), node)
        return self._number(node.this, node)

    def _number(self, text: str, node: exp.Expr) -> Operand:
        digits = text.lstrip("-")
        if "e" in text.lower():
            return self.constant(float(text), DOUBLE.with_nullable(False), node)
        if "." in text:
            # Calcite's exact literal: precision counts every digit written, scale the
            # digits after the point ("0.908" is DECIMAL(4, 3)).
            scale = len(digits) - digits.index(".") - 1
            precision = max(len(digits) - 1, scale, 1)
            return self.constant(Decimal(text), SqlType("DECIMAL", precision, scale, False), node)
        value = int(text)
        if -(2**31) <= value < 2**31:
            return self.constant(value, INT.with_nullable(False), node)
        if -(2**63) <= value < 2**63:
            return self.constant(value, BIGINT.with_nullable(False), node)
        return self.constant(Decimal(text), SqlType("DECIMAL", len(digits), 0, False), node)

    def _boolean(self, node: exp.Boolean) -> Operand:
        return self.constant(bool(node.this), BOOLEAN.with_nullable(False), node)

    def _null(self, node: exp.Null) -> Operand:
        return self.constant(None, NULL, node)

    def _interval(self, node: exp.Interval) -> Operand:
        return self.constant(interval_ms(node), INTERVAL.with_nullable(False), node)

    def _neg(self, node: exp.Neg) -> Operand:
        inner = node.this
        if isinstance(inner, exp.Literal) and not inner.is_string:
            return self._number("-" + inner.this, node)
        value = self.compile(inner)
        if not (value.type.is_numeric or value.type.name == "INTERVAL"):
            raise sql_error(node, f"cannot negate {value.type.sql()}")
        return self.emit(kernels.call, [value], ("negate_checked", ()), value.type, node)

    # arithmetic and comparison

    def _arithmetic(self, node: exp.Binary, op: str) -> Operand:
        left, right = self.compile(node.left), self.compile(node.right)
        if left.type.is_timestamp or right.type.is_timestamp:
            return self._timestamp_arithmetic(node, op, left, right)
        result = arithmetic_result_type(op, left.type, right.type)
        if result is None:
            raise sql_error(node, f"cannot apply {op} to {left.type.sql()} and {right.type.sql()}")
        if result.name == "DECIMAL":
            return self._decimal_arithmetic(node, op, left, right, result)
        if op == "%" and result.is_integer:
            # Computed in the wider operand type, then narrowed to the divisor's type,
            # which always holds the remainder.
            wide = common_type([left.type, right.type]) or result
            left, right = self.convert(left, wide, node), self.convert(right, wide, node)
            remainder = self.emit(kernels.modulo, [left, right], (True,), wide, node)
            return self.convert(remainder, result, node)
        left, right = self.convert(left, result, node), self.convert(right, result, node)
        if op == "/":
            if result.is_integer:
                return self.emit(kernels.divide_integer, [left, right], (), result, node)
            return self.emit(kernels.call, [left, right], ("divide", ()), result, node)
        if op == "%":
            return self.emit(kernels.modulo, [left, right], (False,), result, node)
        name = {"+": "add", "-": "subtract", "*": "multiply"}[op]
        function = name if result.is_approximate else name + "_checked"
        return self.emit(kernels.call, [left, right], (function, ()), result, node)

    def _decimal_arithmetic(
        self, node: exp.Binary, op: str, left: Operand, right: Operand, result: SqlType
    ) -> Operand:
        if op == "%":
            raise sql_error(node, "MOD of DECIMAL values is not supported")
        # Each side as the DECIMAL holding it (INT is DECIMAL(10, 0)); a NULL literal
        # takes the result's type.
        left, right = (
            self.convert(o, o.type.as_decimal() if o.type.name != "NULL" else result, node)
            for o in (left, right)
        )
        if op == "/":
            lscale, rscale = left.type.scale or 0, right.type.scale or 0
            extra = max(0, (result.scale or 0) + rscale - lscale + 1)  # one digit to round
            options = (result.to_arrow(), extra)
            return self.emit(kernels.divide_decimal, [left, right], options, result, node)
        name = {"+": "add_checked", "-": "subtract_checked", "*": "multiply_checked"}[op]
        if result.precision != MAX_PRECISION:
            # Below the cap Arrow's result type is Flink's (the same SQL Server rules).
            return self.emit(kernels.call, [left, right], (name, ()), result, node)
        # At the cap Flink keeps fewer fraction digits than the exact result has: compute
        # it as DECIMAL256 (76 digits), then round half up to Flink's type.
        wide = [
            self.emit(kernels.cast, [o], (_decimal256(o.type), "plain", False), o.type, node)
            for o in (left, right)
        ]
        exact = self.emit(kernels.call, wide, (name, ()), result, node)
        return self.emit(kernels.cast, [exact], (result.to_arrow(), "round", False), result, node)

    def _timestamp_arithmetic(
        self, node: exp.Binary, op: str, left: Operand, right: Operand
    ) -> Operand:
        if op == "+" and left.type.name == "INTERVAL":
            left, right = right, left
        if op not in "+-" or not left.type.is_timestamp or right.type.name != "INTERVAL":
            raise sql_error(node, f"cannot apply {op} to {left.type.sql()} and {right.type.sql()}")
        name = "add_checked" if op == "+" else "subtract_checked"
        result = left.type.with_nullable(left.type.nullable or right.type.nullable)
        return self.emit(kernels.call, [left, right], (name, ()), result, node)

    def _common(self, node: exp.Expr, operands: list[Operand], what: str) -> SqlType:
        target = common_type([o.type for o in operands])
        if target is None:
            types = ", ".join(o.type.sql() for o in operands)
            raise sql_error(node, f"{what}: no common type for {types}")
        return target

    def _comparison(self, node: exp.Binary, function: str) -> Operand:
        left, right = self.compile(node.left), self.compile(node.right)
        target = common_type([left.type, right.type])
        if target is None:
            raise sql_error(node, f"cannot compare {left.type.sql()} with {right.type.sql()}")
        result = BOOLEAN.with_nullable(left.type.nullable or right.type.nullable)
        if target.name == "NULL":
            return self.constant(None, BOOLEAN, node)
        left, right = self.convert(left, target, node), self.convert(right, target, node)
        return self.emit(kernels.call, [left, right], (function, ()), result, node)

    # logic

    def _boolean_operand(self, node: exp.Expr) -> Operand:
        value = self.compile(node)
        if value.type.name == "NULL":
            return self.convert(value, BOOLEAN, node)
        if value.type.name != "BOOLEAN":
            raise sql_error(
                node, f"expected a BOOLEAN, not {value.type.sql()}: {node.sql(dialect=Flink)}"
            )
        return value

    def _and(self, node: exp.And) -> Operand:
        left = self._boolean_operand(node.left)
        # Short-circuit a right side that can fail: it runs where the left is not FALSE.
        right = self._short_circuit(node.right, left, when_left_is=False)
        result = BOOLEAN.with_nullable(left.type.nullable or right.type.nullable)
        return self.emit(kernels.call, [left, right], ("and_kleene", ()), result, node)

    def _or(self, node: exp.Or) -> Operand:
        left = self._boolean_operand(node.left)
        right = self._short_circuit(node.right, left, when_left_is=True)
        result = BOOLEAN.with_nullable(left.type.nullable or right.type.nullable)
        return self.emit(kernels.call, [left, right], ("or_kleene", ()), result, node)

    def _short_circuit(self, right: exp.Expr, left: Operand, *, when_left_is: bool) -> Operand:
        if not _fallible(right):
            return self._boolean_operand(right)
        flag = BOOLEAN.with_nullable(False)
        decided = self.emit(kernels.is_true, [left], (not when_left_is,), flag, right)
        needed = self.emit(kernels.call, [decided], ("invert", ()), flag, right)
        deferred = _Deferred(self, right)
        if deferred.type.name not in ("BOOLEAN", "NULL"):
            raise sql_error(
                right, f"expected a BOOLEAN, not {deferred.type.sql()}: {right.sql(dialect=Flink)}"
            )
        return deferred.guarded(needed, BOOLEAN, right)

    def _not(self, node: exp.Not) -> Operand:
        value = self._boolean_operand(node.this)
        return self.emit(kernels.call, [value], ("invert", ()), value.type, node)

    def _is(self, node: exp.Is) -> Operand:
        target = node.expression
        if isinstance(target, exp.Null):
            value = self.compile(node.this)
            return self.emit(
                kernels.call, [value], ("is_null", ()), BOOLEAN.with_nullable(False), node
            )
        if isinstance(target, exp.Boolean):
            value = self._boolean_operand(node.this)
            return self.emit(
                kernels.is_true, [value], (not target.this,), BOOLEAN.with_nullable(False), node
            )
        raise sql_error(node, f"unsupported IS {target.sql(dialect=Flink)}")

    def _between(self, node: exp.Between) -> Operand:
        # Copies: building the new nodes must not re-parent the planner's tree.
        low = exp.GTE(this=node.this.copy(), expression=node.args["low"].copy())
        high = exp.LTE(this=node.this.copy(), expression=node.args["high"].copy())
        return self._and(exp.And(this=low, expression=high))

    def _in(self, node: exp.In) -> Operand:
        if node.args.get("query") or node.args.get("unnest") or node.args.get("field"):
            raise sql_error(node, _IN_SUBQUERY)
        value = self.compile(node.this)
        items = [self.compile(e) for e in node.expressions]
        target = self._common(node, [value, *items], "IN")
        literals = all(i.is_literal for i in items)
        result = BOOLEAN.with_nullable(value.type.nullable or any(i.type.nullable for i in items))
        if literals:
            value = self.convert(value, target, node)
            values = [i.literal for i in items if i.literal is not None]
            has_null = len(values) < len(items)
            value_set = (
                pa.array(values, target.to_arrow()) if values else pa.array([], target.to_arrow())
            )
            key = ("in", str(target.to_arrow()), tuple(repr(v) for v in values), has_null)
            return self.emit(kernels.in_list, [value], (value_set, has_null), result, node, key=key)
        found: Operand | None = None
        for item in items:
            equal = self.emit(
                kernels.call,
                [self.convert(value, target, node), self.convert(item, target, node)],
                ("equal", ()),
                result,
                node,
            )
            found = (
                equal
                if found is None
                else self.emit(kernels.call, [found, equal], ("or_kleene", ()), result, node)
            )
        assert found is not None
        return found

    def _like(self, node: exp.Like, escape: str | None = None) -> Operand:
        value = self.compile(node.this)
        pattern = self.compile(node.expression)
        if value.type.name != "NULL" and not value.type.is_string:
            raise sql_error(node, f"LIKE takes a string, not {value.type.sql()}")
        if not isinstance(pattern.literal, str):
            raise sql_error(node, "LIKE: the pattern must be a string literal")
        value = self.convert(value, STRING, node)
        arrow_pattern = _like_pattern(pattern.literal, escape, node)
        result = self.emit(
            kernels.like,
            [value],
            (arrow_pattern,),
            BOOLEAN.with_nullable(value.type.nullable),
            node,
        )
        if node.args.get("negate"):
            result = self.emit(kernels.call, [result], ("invert", ()), result.type, node)
        return result

    def _escape(self, node: exp.Escape) -> Operand:
        like = node.this
        escape = node.expression
        if not isinstance(like, exp.Like) or not (
            isinstance(escape, exp.Literal) and escape.is_string
        ):
            raise sql_error(node, "ESCAPE follows LIKE 'pattern' and is a one-character string")
        if len(escape.this) != 1:
            raise sql_error(
                node, f"the ESCAPE character must be one character, not {escape.this!r}"
            )
        return self._like(like, escape.this)

    def _case(self, node: exp.Case) -> Operand:
        subject = node.this
        conditions: list[Operand] = []
        value_nodes: list[exp.Expr | None] = []
        for branch in node.args.get("ifs") or []:
            when = branch.this
            if subject is not None:
                when = exp.EQ(this=subject.copy(), expression=when.copy())
            conditions.append(self._boolean_operand(when))
            value_nodes.append(branch.args["true"])
        value_nodes.append(node.args.get("default"))
        # A branch that can fail (1 / x, a CAST, a UDF) runs on the rows it selects only,
        # as Flink's generated code evaluates it; the others run on the whole batch.
        values: list[Operand | _Deferred] = [
            self.constant(None, NULL, node)
            if v is None
            else _Deferred(self, v)
            if _fallible(v)
            else self.compile(v)
            for v in value_nodes
        ]
        target = common_type([v.type for v in values])
        if target is None:
            types = ", ".join(v.type.sql() for v in values)
            raise sql_error(node, f"CASE: no common type for {types}")
        if target.name == "NULL":
            target = STRING
        if target.name == "CHAR":
            target = SqlType("VARCHAR", target.precision, None, target.nullable)
        selections = (
            self._selections(conditions, node)
            if any(isinstance(v, _Deferred) for v in values)
            else []
        )
        converted = [
            v.guarded(selections[i], target, node)
            if isinstance(v, _Deferred)
            else self.convert(v, target, node)
            for i, v in enumerate(values)
        ]
        target = target.with_nullable(any(v.type.nullable for v in converted))
        return self.emit(
            kernels.case,
            [*conditions, *converted],
            (len(conditions), target.to_arrow()),
            target,
            node,
        )

    def _selections(self, conditions: list[Operand], node: exp.Expr) -> list[Operand]:
        """For each CASE branch (ELSE last), the rows it selects: its condition is TRUE
        and no earlier one is."""
        selections: list[Operand] = []
        taken: Operand | None = None
        flag = BOOLEAN.with_nullable(False)
        for condition in conditions:
            true = self.emit(kernels.is_true, [condition], (False,), flag, node)
            if taken is None:
                selections.append(true)
                taken = true
            else:
                selections.append(
                    self.emit(kernels.call, [true, taken], ("and_not", ()), flag, node)
                )
                taken = self.emit(kernels.call, [taken, true], ("or_", ()), flag, node)
        if taken is None:
            selections.append(self.constant(True, flag, node))
        else:
            selections.append(self.emit(kernels.call, [taken], ("invert", ()), flag, node))
        return selections

    def _if(self, node: exp.If) -> Operand:
        false = node.args.get("false")
        case = exp.Case(
            ifs=[exp.If(this=node.this.copy(), true=node.args["true"].copy())],
            default=false.copy() if false is not None else None,
        )
        if self._boolean_operand(case.args["ifs"][0].this).type.name != "BOOLEAN":
            raise sql_error(node, "IF takes a BOOLEAN condition")
        return self._case(case)

    def _cast(self, node: exp.Cast, try_: bool = False) -> Operand:
        target = SqlType.from_ddl(node.to)
        value = self.compile(node.this)
        if isinstance(node.this, exp.Literal) and node.this.is_string and target.is_timestamp:
            # TIMESTAMP '...' literal: Flink types it by the digits of its fraction.
            text = node.this.this
            fraction = len(text.split(".")[1]) if "." in text else 0
            if not node.to.expressions:
                target = SqlType(target.name, fraction, nullable=False)
        converted = self.convert(value, target, node, try_=try_)
        if target.is_string and target.precision != MAX_LENGTH:
            # Flink's CAST fits the value to the declared length (CharVarCharTrimPadCastRule).
            options = (target.precision, target.name == "CHAR")
            return self.emit(kernels.fit_length, [converted], options, converted.type, node)
        return converted

    def _trycast(self, node: exp.TryCast) -> Operand:
        return self._cast(node, try_=True)

    def _dpipe(self, node: exp.DPipe) -> Operand:
        return self.call("CONCAT", [self.compile(node.left), self.compile(node.right)], node)

    def _extract(self, node: exp.Extract) -> Operand:
        unit = node.this.name.upper()
        value = self.compile(node.expression)
        return extract_component(_Site(self, node, "EXTRACT"), unit, value)

    def _trim(self, node: exp.Trim) -> Operand:
        value = self.compile(node.this)
        chars = node.expression
        text = " "
        if chars is not None:
            operand = self.compile(chars)
            if not isinstance(operand.literal, str):
                raise sql_error(node, "TRIM: the characters to remove must be a string literal")
            text = operand.literal
        side = str(node.args.get("position") or "BOTH").upper()
        site = _Site(self, node, "TRIM")
        if value.type.name != "NULL" and not value.type.is_string:
            raise site.error(f"TRIM takes a string, not {value.type.sql()}")
        return self.emit(
            kernels.trim,
            [self.convert(value, STRING, node)],
            (side, text),
            STRING.with_nullable(value.type.nullable),
            node,
        )

    def _initcap(self, node: exp.Initcap) -> Operand:
        return self.call("INITCAP", [self.compile(node.this)], node)

    def _anonymous(self, node: exp.Anonymous) -> Operand:
        name = str(node.this)
        upper = name.upper()
        raw = list(node.expressions)
        if upper in ("TIMESTAMPADD", "TIMESTAMPDIFF") and raw and isinstance(raw[0], exp.Var):
            unit = self.constant(raw[0].name, STRING.with_nullable(False), raw[0])
            return self.call(name, [unit, *(self.compile(a) for a in raw[1:])], node)
        return self.call(name, [self.compile(a) for a in raw], node)

    def _function(self, node: exp.Func) -> Operand:
        name = node.sql_name()
        args: list[Operand] = []
        for key in node.arg_types:
            value = node.args.get(key)
            for item in value if isinstance(value, list) else [value]:
                if isinstance(item, exp.Expr):
                    args.append(self.compile(item))
        if isinstance(node, exp.Log) and node.args.get("expression") is None:
            name = "LN"
        elif isinstance(node, exp.Trunc):
            name = "TRUNCATE"  # sqlglot's node for Flink's TRUNCATE
        return self.call(name, args, node)


class _Deferred:
    """A sub-expression compiled as its own program, to run on selected rows only (a CASE
    branch, the right side of AND/OR) because it can fail on rows it does not select."""

    def __init__(self, compiler: _Compiler, node: exp.Expr) -> None:
        self.parent = compiler
        self.compiler = _Compiler(list(compiler.fields.values()), compiler.functions)
        _collect_columns(self.compiler, [node])
        self.value = self.compiler.compile(node)
        self.type = self.value.type

    def guarded(self, selection: Operand, target: SqlType, node: exp.Expr) -> Operand:
        """The step computing the value where ``selection`` is TRUE (NULL elsewhere)."""
        value = self.compiler.convert(self.value, target, node)
        expression = CompiledExpression(self.compiler.program(), value.slot, value.type, False)
        columns = [
            Operand(self.parent.columns.index(n), self.parent.fields[n].type)
            for n in self.compiler.columns
        ]
        options = (expression, tuple(self.compiler.columns))
        return self.parent.emit(
            run_selected,
            [selection, *columns],
            options,
            value.type,
            node,
            key=("deferred", next(self.parent.unique)),
        )


def run_selected(args: Sequence[Any], options: tuple, ctx: kernels.EvalContext) -> Any:
    """The kernel of a deferred sub-expression: ``args = (selection, *columns)``,
    ``options = (CompiledExpression, column names)``; the value where selected, NULL
    elsewhere."""
    expression, names = options
    mask = kernels.as_array(args[0], ctx.length)
    columns = [kernels.as_array(c, ctx.length) for c in args[1:]]
    if not columns:  # a constant expression still needs the row count
        columns, names = [pa.nulls(ctx.length)], ("_rows",)
    batch = pa.RecordBatch.from_arrays(columns, names=list(names))
    selected = pc.sum(mask).as_py() or 0
    if selected == 0:  # nothing to compute (constants would be computed regardless)
        return pa.nulls(ctx.length, expression.type.to_arrow())
    if selected == ctx.length:
        return expression.evaluate(batch, ctx.now_ms)
    values = expression.evaluate(batch.filter(mask), ctx.now_ms)
    return pc.replace_with_mask(pa.nulls(ctx.length, values.type), mask, values)


def _fallible(node: exp.Expr) -> bool:
    """Whether evaluating ``node`` can raise on some rows: a division, a CAST, a call of
    a function that is not built in as a typed node (a UDF, SPLIT_INDEX ...)."""
    return any(
        isinstance(n, (exp.Div, exp.Mod, exp.Anonymous)) or type(n) is exp.Cast for n in node.walk()
    )


def _decimal256(decimal: SqlType) -> pa.DataType:
    return pa.decimal256(decimal.precision or 10, decimal.scale or 0)


def _castable(source: SqlType, target: SqlType) -> bool:
    """Whether Flink's CAST converts ``source`` to ``target`` (every type prints as a
    string; numbers, booleans, strings and times convert within their families)."""
    if source.name == target.name or target.is_string:
        return True
    if source.is_string:
        return target.name != "INTERVAL"
    if source.is_numeric:
        return target.is_numeric or target.name == "BOOLEAN"
    if source.name == "BOOLEAN":
        return target.is_numeric
    if source.is_timestamp or source.name in ("DATE", "TIME"):
        return target.is_timestamp or target.name in ("DATE", "TIME")
    return False


def _like_pattern(pattern: str, escape: str | None, node: exp.Expr) -> str:
    """A SQL LIKE pattern in Arrow's ``match_like`` syntax (backslash escapes)."""
    out, i = [], 0
    while i < len(pattern):
        ch = pattern[i]
        if escape is not None and ch == escape:
            if i + 1 >= len(pattern) or pattern[i + 1] not in ("%", "_", escape):
                raise sql_error(node, f"invalid escape sequence in LIKE pattern {pattern!r}")
            nxt = pattern[i + 1]
            out.append("\\" + nxt if nxt in "%_\\" else nxt)
            i += 2
            continue
        out.append("\\\\" if ch == "\\" else ch)
        i += 1
    return "".join(out)


class CompiledExpression:
    """One compiled expression: its SQL type and ``evaluate(batch)`` giving an array of
    the batch's length.

    Example: ``compile_expression(node, fields, catalog).evaluate(batch)``
    """

    def __init__(self, program: _Program, slot: int, sql_type: SqlType, uses_clock: bool) -> None:
        self.program = program
        self.slot = slot
        self.type = sql_type
        self.uses_clock = uses_clock

    def evaluate(self, batch: pa.RecordBatch, clock_ms: Clock | None = None) -> pa.Array:
        """The expression's value for every row of ``batch``."""
        ctx = kernels.EvalContext(batch.num_rows, clock_ms)
        values = self.program.start(batch)
        self.program.execute(values, ctx)
        return _column(values[self.slot], self.type, batch.num_rows)


def _filtered(value: Any, mask: pa.Array) -> Any:
    if isinstance(value, (pa.Array, pa.ChunkedArray)):
        return value.filter(mask, null_selection_behavior="drop")
    return value


def _column(value: Any, sql_type: SqlType, length: int) -> pa.Array:
    array = kernels.as_array(value, length)
    target = sql_type.to_arrow()
    return array if array.type == target else array.cast(target)


def compile_expression(
    node: exp.Expr, inputs: Sequence[Field], functions: FunctionCatalog
) -> CompiledExpression:
    """Compile ``node`` over the relation ``inputs``; a :class:`SqlError` with the
    position for unknown columns, unsupported functions and type errors.

    Example: ``compile_expression(parse("price * 2"), [Field("price", BIGINT)], catalog)``
    """
    compiler = _Compiler(inputs, functions)
    _collect_columns(compiler, [node])
    result = compiler.compile(node)
    return CompiledExpression(compiler.program(), result.slot, result.type, _uses_clock(compiler))


def _collect_columns(compiler: _Compiler, nodes: Sequence[exp.Expr | None]) -> None:
    # Input columns take the first slots, so they are resolved before any step is emitted.
    for node in nodes:
        if node is None:
            continue
        for column in node.find_all(exp.Column):
            if column.name in compiler.fields and column.name not in compiler.columns:
                compiler.columns.append(column.name)


def _uses_clock(compiler: _Compiler) -> bool:
    return any(s.kernel in (kernels.now, kernels.unix_timestamp_now) for s in compiler.steps)


class CalcProgram:
    """A fused projection and filter over one input relation: the filter first (WHERE
    keeps the rows where it is TRUE; NULL drops the row), then the projections, then the
    columns named in ``keep`` (``_ts``, ``_op``) passed through unchanged where the batch
    has them.

    ``clock_ms`` (construction or call) is the clock CURRENT_TIMESTAMP, NOW(),
    LOCALTIMESTAMP and PROCTIME() read, once per batch; the runtime passes its operator's
    processing-time clock, tests a fake one. Without one, the system clock.

    Example::

        program = CalcProgram.compile([("euro", parse("0.908 * price"))],
                                      parse("price > 100"), fields, FunctionCatalog())
        out = program(batch)            # columns: euro
    """

    def __init__(
        self,
        program: _Program,
        outputs: tuple[tuple[str, int, SqlType], ...],
        condition: int | None,
        keep: tuple[str, ...],
        clock_ms: Clock | None = None,
    ) -> None:
        self._program = program
        self._outputs = outputs
        self._condition = condition
        self.keep = keep
        self.clock_ms = clock_ms
        self.output_fields = tuple(Field(name, sql_type) for name, _, sql_type in outputs)

    @classmethod
    def compile(
        cls,
        projections: Sequence[tuple[str, exp.Expr]],
        condition: exp.Expr | None,
        inputs: Sequence[Field],
        functions: FunctionCatalog,
        *,
        keep: Sequence[str] = (),
        clock_ms: Clock | None = None,
    ) -> CalcProgram:
        """Compile the projections (output name, expression) and the optional WHERE
        condition (a BOOLEAN) into one program.

        Example: ``CalcProgram.compile([("a", parse("a"))], None, fields, catalog, keep=["_ts"])``
        """
        compiler = _Compiler(inputs, functions)
        _collect_columns(compiler, [condition, *(e for _, e in projections)])
        where: int | None = None
        if condition is not None:
            where = compiler._boolean_operand(condition).slot
        outputs = []
        for name, node in projections:
            value = compiler.compile(node)
            sql_type = value.type if value.type.name != "NULL" else STRING
            outputs.append((name, value.slot, sql_type))
        return cls(compiler.program(), tuple(outputs), where, tuple(keep), clock_ms)

    def __call__(self, batch: pa.RecordBatch, clock_ms: Clock | None = None) -> pa.RecordBatch:
        """The projected (and filtered) batch."""
        ctx = kernels.EvalContext(batch.num_rows, clock_ms or self.clock_ms)
        values = self._program.start(batch)
        keep = [name for name in self.keep if name in batch.schema.names]  # e.g. no _ts
        kept = [batch.column(name) for name in keep]
        if self._condition is not None:
            # The condition's steps run on the whole batch; the values computed so far
            # (input columns included) and the kept columns are filtered with it, so the
            # projections reuse them on the kept rows only. Unused columns are not copied.
            self._program.execute(values, ctx, stop=self._condition)
            mask = kernels.as_array(values[self._condition], batch.num_rows)
            if mask.null_count or not pc.all(mask).as_py():
                values = [_filtered(v, mask) for v in values]
                kept = [_filtered(v, mask) for v in kept]
                ctx.length = pc.sum(mask).as_py() or 0
        self._program.execute(values, ctx)
        arrays = [
            _column(values[slot], sql_type, ctx.length) for _, slot, sql_type in self._outputs
        ]
        names = [name for name, _, _ in self._outputs]
        return pa.RecordBatch.from_arrays([*arrays, *kept], names=[*names, *keep])

    @property
    def input_columns(self) -> tuple[str, ...]:
        """The input columns the program reads (``keep`` aside), in slot order.

        Example: ``program.input_columns == ("price",)``
        """
        return self._program.columns

    def explain(self) -> str:
        """One line per output: ``name: TYPE``. Example: ``'euro: DECIMAL(24, 3)'``"""
        return "\n".join(f"{f.name}: {f.type.sql()}" for f in self.output_fields)
