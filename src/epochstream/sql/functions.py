"""The SQL function catalog: Flink's built-in scalar functions (each a type rule that
emits kernel steps) and user-defined scalar functions (:func:`udf`).

A built-in compiles its call against a :class:`CallSite`, which the expression compiler
provides: it checks and converts the arguments, then emits steps naming kernels from
:mod:`epochstream.sql.kernels`. A UDF is vectorized: it receives one Arrow array per
argument (a literal argument as an array of the batch's length) and returns one array.

Example::

    import pyarrow.compute as pc
    from epochstream.sql.functions import udf

    @udf(result_type="DOUBLE")
    def to_usd(price):
        return pc.multiply(pc.cast(price, "double"), 1.1)
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc

from epochstream.exceptions import SqlError, UserFunctionError
from epochstream.sql import kernels
from epochstream.sql.types import BIGINT, DOUBLE, INT, STRING, SqlType, common_type

__all__ = [
    "BUILTINS",
    "NOT_LITERAL",
    "CallSite",
    "FunctionCatalog",
    "Operand",
    "ScalarFunction",
    "default_catalog",
    "udf",
]

NOT_LITERAL = object()


@dataclass(frozen=True)
class Operand:
    """A compiled argument: the program slot holding its value, its SQL type, and its
    Python value when it is a literal (functions such as SPLIT_INDEX need literal
    separators).

    Example: ``Operand(slot=3, type=STRING, literal="/")``
    """

    slot: int
    type: SqlType
    literal: Any = field(default=NOT_LITERAL, compare=False)

    @property
    def is_literal(self) -> bool:
        """Whether the value was written as a literal (NULL included)."""
        return self.literal is not NOT_LITERAL


class CallSite(Protocol):
    """What a built-in needs from the compiler at one call: emit a step, convert an
    operand, raise an error at the call's position.

    Example: ``site.emit(kernels.call, [arg], ("utf8_upper", ()), STRING)``
    """

    name: str

    def emit(
        self,
        kernel: Callable[..., Any],
        args: Sequence[Operand],
        options: tuple,
        result: SqlType,
        *,
        key: object = None,
    ) -> Operand: ...

    def convert(self, operand: Operand, target: SqlType) -> Operand: ...

    def error(self, message: str) -> SqlError: ...


# --------------------------------------------------------------------------- UDFs


class ScalarFunction:
    """A user-defined scalar function: Arrow arrays in, one Arrow array out, checked per
    batch (same length as the input; converted to ``result_type`` without loss).

    Calling it calls the wrapped function. It pickles with cloudpickle (the function is
    pickled by value when it lives in ``__main__`` or a notebook), so it travels to the
    executors inside a compiled program.

    Example::

        count_char = ScalarFunction(lambda s, c: pc.count_substring(s, "c"), "BIGINT",
                                    name="count_char")
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        result_type: str | SqlType,
        *,
        name: str | None = None,
        deterministic: bool = True,
    ) -> None:
        self.fn = fn
        self.result_type = (
            result_type if isinstance(result_type, SqlType) else SqlType.parse(result_type)
        )
        self.name: str = name or getattr(fn, "__name__", None) or "udf"
        self.deterministic = deterministic
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"ScalarFunction({self.name}, result_type={self.result_type.sql()})"

    def renamed(self, name: str) -> ScalarFunction:
        """The same function under another SQL name. Example: ``f.renamed("to_eur")``"""
        return ScalarFunction(
            self.fn, self.result_type, name=name, deterministic=self.deterministic
        )

    def evaluate(self, args: Sequence[pa.Array], length: int, where: str) -> pa.Array:
        """Run on one batch's argument arrays (``length`` rows); ``where`` (position and
        call text) names the call in errors.

        Example: ``f.evaluate([pa.array(["abc"])], 1, "line 1, column 8: f(s)")``
        """
        try:
            out = self.fn(*args)
        except Exception as exc:
            raise UserFunctionError(
                f"{where}: SQL function {self.name}", _batch(length), exc
            ) from exc
        if isinstance(out, pa.ChunkedArray):
            out = out.combine_chunks()
        if not isinstance(out, pa.Array):
            try:
                out = pa.array(out)
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as err:
                raise kernels.KernelError(
                    f"SQL function {self.name} returned {type(out).__name__}, not an Arrow array "
                    f"({kernels.first_line(err)})"
                ) from None
        if len(out) != length:
            raise kernels.KernelError(
                f"SQL function {self.name} returned {len(out)} values for {length} rows"
            )
        target = self.result_type.to_arrow()
        if out.type != target:
            try:
                out = pc.cast(out, target)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
                raise kernels.KernelError(
                    f"SQL function {self.name} returned {out.type}, which does not convert to "
                    f"{self.result_type.sql()} without loss ({kernels.first_line(err)})"
                ) from None
        return out


def _batch(length: int) -> str:
    return f"<batch of {length} rows>"


def call_udf(args: Sequence[Any], options: tuple, ctx: kernels.EvalContext) -> Any:
    """The kernel of a UDF call: ``options = (ScalarFunction, where)``."""
    function, where = options
    return function.evaluate([kernels.as_array(a, ctx.length) for a in args], ctx.length, where)


_PROCESS_UDFS: dict[str, ScalarFunction] = {}


def udf(
    result_type: str, *, name: str | None = None, deterministic: bool = True
) -> Callable[[Callable[..., Any]], ScalarFunction]:
    """Declare a vectorized scalar UDF and register it by name for every SQL query of
    this process (:meth:`FunctionCatalog.register` registers one for one catalog).

    Example::

        @udf(result_type="BIGINT")
        def count_char(text, char):
            return pc.count_substring(text, "c")
    """

    def wrap(fn: Callable[..., Any]) -> ScalarFunction:
        function = ScalarFunction(fn, result_type, name=name, deterministic=deterministic)
        _PROCESS_UDFS[function.name] = function
        return function

    return wrap


# --------------------------------------------------------------------------- built-ins


Builtin = Callable[[CallSite, list[Operand]], Operand]


def _call(name: str, **kwargs: Any) -> tuple:
    return (name, tuple(sorted(kwargs.items())))


def _need(site: CallSite, args: list[Operand], low: int, high: int) -> None:
    if not low <= len(args) <= high:
        count = str(low) if low == high else f"{low} to {high}"
        raise site.error(f"{site.name} takes {count} arguments, not {len(args)}")


def _string(site: CallSite, arg: Operand, what: str = "argument") -> Operand:
    if arg.type.name == "NULL":
        return site.convert(arg, STRING)
    if not arg.type.is_string:
        raise site.error(f"{site.name} takes a string {what}, not {arg.type.sql()}")
    return arg


def _literal(site: CallSite, arg: Operand, kind: type, what: str) -> Any:
    if (
        not arg.is_literal
        or not isinstance(arg.literal, kind)
        or (isinstance(arg.literal, bool) and kind is int)
    ):
        raise site.error(f"{site.name}: the {what} must be a literal")
    return arg.literal


def _nullable(args: Sequence[Operand]) -> bool:
    return any(a.type.nullable for a in args)


def _unary_string(function: str, result: SqlType | None = None) -> Builtin:
    def build(site: CallSite, args: list[Operand]) -> Operand:
        _need(site, args, 1, 1)
        arg = _string(site, args[0])
        out = (result or STRING).with_nullable(arg.type.nullable)
        return site.emit(kernels.call, [arg], _call(function), out)

    return build


def _concat(site: CallSite, args: list[Operand]) -> Operand:
    if not args:
        raise site.error("CONCAT takes at least one argument")
    strings = [_string(site, a) for a in args]
    if len(strings) == 1:
        return strings[0]
    return site.emit(kernels.concat, strings, (), STRING.with_nullable(_nullable(args)))


def _concat_ws(site: CallSite, args: list[Operand]) -> Operand:
    if len(args) < 2:
        raise site.error("CONCAT_WS takes a separator and at least one string")
    strings = [_string(site, a) for a in args]
    return site.emit(kernels.concat_ws, strings, (), STRING.with_nullable(args[0].type.nullable))


def _replace(site: CallSite, args: list[Operand]) -> Operand:
    _need(site, args, 3, 3)
    text = _string(site, args[0])
    search = _literal(site, args[1], str, "search string")
    replacement = _literal(site, args[2], str, "replacement")
    options = _call("replace_substring", pattern=search, replacement=replacement)
    return site.emit(kernels.call, [text], options, STRING.with_nullable(text.type.nullable))


def _position(site: CallSite, args: list[Operand]) -> Operand:
    _need(site, args, 2, 2)
    text, sub = _string(site, args[0]), args[1]
    needle = _literal(site, sub, str, "substring")
    return site.emit(kernels.position, [text], (needle,), INT.with_nullable(text.type.nullable))


def _substring(site: CallSite, args: list[Operand]) -> Operand:
    _need(site, args, 2, 3)
    text = _string(site, args[0])
    start = _literal(site, args[1], int, "start position")
    length = _literal(site, args[2], int, "length") if len(args) == 3 else None
    return site.emit(
        kernels.substring, [text], (start, length), STRING.with_nullable(text.type.nullable)
    )


#: The type of kernels.split's list of pieces: an intermediate value only SPLIT_INDEX's
#: second step reads; no SQL expression sees it, so it never becomes an Arrow column.
_PIECES = SqlType("ARRAY<STRING>")


def _split_index(site: CallSite, args: list[Operand]) -> Operand:
    _need(site, args, 3, 3)
    text = _string(site, args[0])
    separator = _literal(site, args[1], str, "separator")
    if not separator:
        raise site.error("SPLIT_INDEX: the separator must not be empty")
    if not args[2].type.is_integer:
        raise site.error(f"SPLIT_INDEX takes an integer index, not {args[2].type.sql()}")
    # The split is its own step: the SPLIT_INDEX calls of one string and separator (q22
    # takes three pieces of one URL) split it once per batch.
    pieces = site.emit(kernels.split, [text], (separator,), _PIECES)
    return site.emit(kernels.split_index, [pieces, args[2]], (), STRING)


def _compile_regex(site: CallSite, arg: Operand) -> str:
    pattern = _literal(site, arg, str, "regular expression")
    try:
        re.compile(pattern)
    except re.error as err:
        raise site.error(f"{site.name}: invalid regular expression {pattern!r}: {err}") from None
    return pattern


def _name_groups(pattern: str, keep: int) -> tuple[str, int]:
    """``pattern`` with capture group ``keep`` (Java's numbering: 0 the whole match, then
    the groups in order) the only one, named g (Arrow's extract_regex returns named
    groups only), every other group non-capturing, and the count of groups. RE2 extracts
    one group faster than all of them, and a struct of one field is all the step needs.

    Example: ``_name_groups("(a)(b)", 2) == ("(?:a)(?P<g>b)", 2)``
    """
    out, count, i, in_class = [], 0, 0, False
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\":
            out.append(pattern[i : i + 2])
            i += 2
            continue
        if in_class:
            in_class = ch != "]"
        elif ch == "[":
            in_class = True
        elif ch == "(" and not pattern.startswith("(?", i):
            count += 1
            out.append("(?P<g>" if count == keep else "(?:")
            i += 1
            continue
        elif pattern.startswith("(?P<", i) or (
            pattern.startswith("(?<", i) and pattern[i + 3] not in "=!"
        ):
            count += 1  # an already named group: keep its place in the numbering
            out.append("(?P<g>" if count == keep else "(?:")
            i = pattern.index(">", i) + 1
            continue
        out.append(ch)
        i += 1
    body = "".join(out)
    return (f"(?P<g>{body})" if keep == 0 else body), count


def _regexp_extract(site: CallSite, args: list[Operand]) -> Operand:
    _need(site, args, 2, 3)
    text = _string(site, args[0])
    pattern = _compile_regex(site, args[1])
    # Flink's SqlFunctionUtils.regexpExtract(str, regex) extracts group 0, the whole match.
    group = _literal(site, args[2], int, "group index") if len(args) == 3 else 0
    named, count = _name_groups(pattern, group)
    if not 0 <= group <= count:
        raise site.error(f"REGEXP_EXTRACT: {pattern!r} has no group {group}")
    try:
        pc.extract_regex(pa.array([], pa.string()), pattern=named)
    except pa.ArrowInvalid as err:  # RE2 refuses what Java accepts: back references ...
        raise site.error(
            f"REGEXP_EXTRACT: unsupported regular expression {pattern!r}: {err}"
        ) from None
    return site.emit(kernels.regexp_extract, [text], (named,), STRING)


def _regexp(site: CallSite, args: list[Operand]) -> Operand:
    _need(site, args, 2, 2)
    text = _string(site, args[0])
    pattern = _compile_regex(site, args[1])
    return site.emit(
        kernels.regexp, [text], (pattern,), SqlType("BOOLEAN", nullable=text.type.nullable)
    )


def _number(site: CallSite, arg: Operand) -> Operand:
    if arg.type.name == "NULL":
        return site.convert(arg, DOUBLE)
    if not arg.type.is_numeric:
        raise site.error(f"{site.name} takes a number, not {arg.type.sql()}")
    return arg


def _abs(site: CallSite, args: list[Operand]) -> Operand:
    _need(site, args, 1, 1)
    arg = _number(site, args[0])
    return site.emit(kernels.call, [arg], _call("abs_checked"), arg.type)


def _ceil_floor(function: str) -> Builtin:
    def build(site: CallSite, args: list[Operand]) -> Operand:
        _need(site, args, 1, 1)
        arg = _number(site, args[0])
        if arg.type.is_integer:
            return arg
        result = arg.type
        if arg.type.name == "DECIMAL":
            p, s = arg.type.precision or 10, arg.type.scale or 0
            result = SqlType("DECIMAL", min(38, p - s + 1), 0, arg.type.nullable)
            rounded = site.emit(kernels.call, [arg], _call(function), arg.type)
            return site.convert(rounded, result)
        return site.emit(kernels.call, [arg], _call(function), result)

    return build


def _round(site: CallSite, args: list[Operand]) -> Operand:
    return _to_digits(site, args, "half_towards_infinity")


def _truncate(site: CallSite, args: list[Operand]) -> Operand:
    return _to_digits(site, args, "towards_zero")


def _to_digits(site: CallSite, args: list[Operand], mode: str) -> Operand:
    """ROUND or TRUNCATE (``mode``, Arrow's round_mode) of a number to n decimals."""
    _need(site, args, 1, 2)
    arg = _number(site, args[0])
    digits = _literal(site, args[1], int, "number of digits") if len(args) == 2 else 0
    options = _call("round", ndigits=digits, round_mode=mode)
    if arg.type.is_integer and digits >= 0:
        return arg
    if arg.type.is_approximate and mode == "towards_zero":
        return site.emit(kernels.truncate_float, [arg], (digits,), arg.type)
    if arg.type.name != "DECIMAL":
        return site.emit(kernels.call, [arg], options, arg.type)
    # Flink's LogicalTypeMerging.findRoundDecimalType: rounding may add a digit.
    p, s = arg.type.precision or 10, arg.type.scale or 0
    if digits >= s:
        return arg
    if digits < 0:
        result = SqlType("DECIMAL", min(38, 1 + p - s), 0, arg.type.nullable)
    else:
        result = SqlType("DECIMAL", min(38, 1 + p - s + digits), digits, arg.type.nullable)
    rounded = site.emit(kernels.call, [arg], options, arg.type)
    return site.convert(rounded, result)


def _double_function(function: str, arity: int = 1) -> Builtin:
    def build(site: CallSite, args: list[Operand]) -> Operand:
        _need(site, args, arity, arity)
        values = [
            site.convert(_number(site, a), DOUBLE.with_nullable(a.type.nullable)) for a in args
        ]
        return site.emit(
            kernels.call, values, _call(function), DOUBLE.with_nullable(_nullable(args))
        )

    return build


def _log(site: CallSite, args: list[Operand]) -> Operand:
    _need(site, args, 1, 2)
    if len(args) == 1:
        return _double_function("ln")(site, args)
    base, value = (site.convert(_number(site, a), DOUBLE) for a in args)
    ln_value = site.emit(kernels.call, [value], _call("ln"), DOUBLE)
    ln_base = site.emit(kernels.call, [base], _call("ln"), DOUBLE)
    return site.emit(kernels.call, [ln_value, ln_base], _call("divide"), DOUBLE)


def _timestamp(site: CallSite, arg: Operand) -> Operand:
    if not arg.type.is_timestamp:
        raise site.error(f"{site.name} takes a TIMESTAMP, not {arg.type.sql()}")
    return arg


_COMPONENTS = {
    "YEAR": "year",
    "QUARTER": "quarter",
    "MONTH": "month",
    "WEEK": "iso_week",
    "DAY": "day",
    "DAYOFMONTH": "day",
    "DAYOFYEAR": "day_of_year",
    "HOUR": "hour",
    "MINUTE": "minute",
    "SECOND": "second",
    "MILLISECOND": "millisecond",
}


def extract_component(site: CallSite, unit: str, arg: Operand) -> Operand:
    """EXTRACT(unit FROM ts) and HOUR(ts) & co as BIGINT.

    Example: ``extract_component(site, "HOUR", ts)``
    """
    if unit not in _COMPONENTS:
        raise site.error(f"unsupported time unit {unit} in {site.name}")
    if not (arg.type.is_timestamp or arg.type.name == "DATE"):
        raise site.error(f"{site.name} takes a TIMESTAMP or DATE, not {arg.type.sql()}")
    return site.emit(
        kernels.extract, [arg], (_COMPONENTS[unit],), BIGINT.with_nullable(arg.type.nullable)
    )


def _component(unit: str) -> Builtin:
    def build(site: CallSite, args: list[Operand]) -> Operand:
        _need(site, args, 1, 1)
        return extract_component(site, unit, args[0])

    return build


def _date_format(site: CallSite, args: list[Operand]) -> Operand:
    _need(site, args, 2, 2)
    value = args[0]
    if not (value.type.is_timestamp or value.type.is_string):
        raise site.error(f"DATE_FORMAT takes a TIMESTAMP or string, not {value.type.sql()}")
    pattern = _literal(site, args[1], str, "format")
    pieces = kernels.java_pattern_pieces(pattern)
    if pieces is None:
        raise site.error(
            f"DATE_FORMAT: unsupported pattern {pattern!r} (letters y yyyy yy M MM d dd "
            "H HH h hh m mm s ss SSS a EEE MMM D DDD and 'quoted text')"
        )
    return site.emit(
        kernels.date_format, [value], (pieces,), STRING.with_nullable(value.type.nullable)
    )


_UNIT_MS = {
    "MILLISECOND": 1,
    "SECOND": 1000,
    "MINUTE": 60_000,
    "HOUR": 3_600_000,
    "DAY": 86_400_000,
    "WEEK": 7 * 86_400_000,
}


def _unit(site: CallSite, arg: Operand) -> int:
    unit = arg.literal if isinstance(arg.literal, str) else ""
    if unit.upper() not in _UNIT_MS:
        raise site.error(
            f"{site.name}: unsupported unit {unit or '?'} (SECOND, MINUTE, HOUR, DAY, WEEK)"
        )
    return _UNIT_MS[unit.upper()]


def _timestampadd(site: CallSite, args: list[Operand]) -> Operand:
    _need(site, args, 3, 3)
    millis = _unit(site, args[0])
    if not args[1].type.is_integer:
        raise site.error(f"TIMESTAMPADD takes an integer count, not {args[1].type.sql()}")
    ts = _timestamp(site, args[2])
    return site.emit(
        kernels.add_millis, [args[1], ts], (millis,), ts.type.with_nullable(_nullable(args[1:]))
    )


def _timestampdiff(site: CallSite, args: list[Operand]) -> Operand:
    _need(site, args, 3, 3)
    millis = _unit(site, args[0])
    a, b = _timestamp(site, args[1]), _timestamp(site, args[2])
    return site.emit(kernels.diff_units, [a, b], (millis,), INT.with_nullable(_nullable(args[1:])))


_DEFAULT_FORMAT = "yyyy-MM-dd HH:mm:ss"


def _strptime_format(site: CallSite, pattern: str) -> str:
    pieces = kernels.java_pattern_pieces(pattern)
    if pieces is None or any(kind == "millis" for kind, _ in pieces):
        raise site.error(f"{site.name}: unsupported format {pattern!r}")
    return "".join(text for _, text in pieces)


def _to_timestamp(site: CallSite, args: list[Operand]) -> Operand:
    _need(site, args, 1, 2)
    text = _string(site, args[0])
    target = SqlType("TIMESTAMP", 3)
    fmt = _strptime_format(site, _literal(site, args[1], str, "format")) if len(args) == 2 else None
    return site.emit(kernels.to_timestamp, [text], (fmt, target.to_arrow()), target)


def _to_timestamp_ltz(site: CallSite, args: list[Operand]) -> Operand:
    _need(site, args, 1, 2)
    precision = _literal(site, args[1], int, "precision") if len(args) == 2 else 3
    if precision not in (0, 3):
        raise site.error("TO_TIMESTAMP_LTZ: the precision is 0 (seconds) or 3 (milliseconds)")
    if not args[0].type.is_integer:
        raise site.error(f"TO_TIMESTAMP_LTZ takes an integer epoch, not {args[0].type.sql()}")
    target = SqlType("TIMESTAMP_LTZ", 3, nullable=args[0].type.nullable)
    factor = 1000 if precision == 0 else 1
    return site.emit(kernels.epoch_to_timestamp, [args[0]], (factor, target.to_arrow()), target)


def _unix_timestamp(site: CallSite, args: list[Operand]) -> Operand:
    _need(site, args, 0, 2)
    if not args:
        return site.emit(kernels.unix_timestamp_now, [], (), BIGINT.with_nullable(False))
    value = args[0]
    if not (value.type.is_string or value.type.is_timestamp):
        raise site.error(f"UNIX_TIMESTAMP takes a string or TIMESTAMP, not {value.type.sql()}")
    pattern = _literal(site, args[1], str, "format") if len(args) == 2 else _DEFAULT_FORMAT
    return site.emit(
        kernels.timestamp_to_epoch, [value], (_strptime_format(site, pattern),), BIGINT
    )


def _clock(result: SqlType) -> Builtin:
    def build(site: CallSite, args: list[Operand]) -> Operand:
        _need(site, args, 0, 0)
        return site.emit(kernels.now, [], (result.to_arrow(),), result)

    return build


def _coalesce(site: CallSite, args: list[Operand]) -> Operand:
    if not args:
        raise site.error("COALESCE takes at least one argument")
    target = common_type([a.type for a in args])
    if target is None:
        raise site.error(
            "COALESCE arguments have no common type: " + ", ".join(a.type.sql() for a in args)
        )
    target = target.with_nullable(all(a.type.nullable for a in args))
    values = [site.convert(a, target) for a in args]
    return site.emit(kernels.call, values, _call("coalesce"), target)


def _nullif(site: CallSite, args: list[Operand]) -> Operand:
    _need(site, args, 2, 2)
    compared = common_type([args[0].type, args[1].type])
    if compared is None:
        raise site.error(f"NULLIF cannot compare {args[0].type.sql()} with {args[1].type.sql()}")
    a, b = site.convert(args[0], compared), site.convert(args[1], compared)
    result = args[0].type.with_nullable(True)
    return site.emit(kernels.nullif, [a, b, args[0]], (result.to_arrow(),), result)


BUILTINS: dict[str, Builtin] = {
    "UPPER": _unary_string("utf8_upper"),
    "LOWER": _unary_string("utf8_lower"),
    "CHAR_LENGTH": _unary_string("utf8_length", INT),
    "INITCAP": _unary_string("utf8_title"),
    "CONCAT": _concat,
    "CONCAT_WS": _concat_ws,
    "REPLACE": _replace,
    "POSITION": _position,
    "SUBSTRING": _substring,
    "SPLIT_INDEX": _split_index,
    "REGEXP_EXTRACT": _regexp_extract,
    "REGEXP": _regexp,
    "ABS": _abs,
    "CEIL": _ceil_floor("ceil"),
    "FLOOR": _ceil_floor("floor"),
    "ROUND": _round,
    "TRUNCATE": _truncate,
    "POWER": _double_function("power", 2),
    "SQRT": _double_function("sqrt"),
    "LN": _double_function("ln"),
    "LOG10": _double_function("log10"),
    "LOG": _log,
    "EXP": _double_function("exp"),
    "YEAR": _component("YEAR"),
    "QUARTER": _component("QUARTER"),
    "MONTH": _component("MONTH"),
    "WEEK": _component("WEEK"),
    "DAYOFMONTH": _component("DAY"),
    "DAYOFYEAR": _component("DAYOFYEAR"),
    "HOUR": _component("HOUR"),
    "MINUTE": _component("MINUTE"),
    "SECOND": _component("SECOND"),
    "DATE_FORMAT": _date_format,
    "TIMESTAMPADD": _timestampadd,
    "TIMESTAMPDIFF": _timestampdiff,
    "TO_TIMESTAMP": _to_timestamp,
    "TO_TIMESTAMP_LTZ": _to_timestamp_ltz,
    "UNIX_TIMESTAMP": _unix_timestamp,
    "CURRENT_TIMESTAMP": _clock(SqlType("TIMESTAMP_LTZ", 3, nullable=False)),
    "NOW": _clock(SqlType("TIMESTAMP_LTZ", 3, nullable=False)),
    "LOCALTIMESTAMP": _clock(SqlType("TIMESTAMP", 3, nullable=False)),
    "PROCTIME": _clock(SqlType("TIMESTAMP_LTZ", 3, nullable=False)),
    "COALESCE": _coalesce,
    "NULLIF": _nullif,
}
# Spellings sqlglot gives Flink's functions, and Flink's synonyms.
ALIASES = {
    "LENGTH": "CHAR_LENGTH",
    "CHARACTER_LENGTH": "CHAR_LENGTH",
    "SUBSTR": "SUBSTRING",
    "STR_POSITION": "POSITION",
    "CEILING": "CEIL",
    "POW": "POWER",
    "REGEXP_LIKE": "REGEXP",
    "DAY": "DAYOFMONTH",
    "DAY_OF_MONTH": "DAYOFMONTH",
    "DAY_OF_YEAR": "DAYOFYEAR",
    "NULL_IF": "NULLIF",
}


class FunctionCatalog:
    """The scalar functions a query can call: Flink's built-ins (any case), this
    catalog's registered UDFs, then the UDFs declared with :func:`udf` in this process
    (UDF names exactly as registered; a UDF shadows a built-in of the same name, as a
    Flink temporary system function does).

    Example::

        catalog = FunctionCatalog()
        catalog.register("to_usd", lambda p: pc.multiply(p, 1.1), result_type="DOUBLE")
        catalog.lookup("to_usd")
    """

    def __init__(self) -> None:
        self._udfs: dict[str, ScalarFunction] = {}

    def register(
        self,
        name: str,
        fn: Callable[..., Any] | ScalarFunction,
        result_type: str | SqlType | None = None,
    ) -> ScalarFunction:
        """Register ``fn`` as ``name`` (a plain function needs ``result_type``).

        Example: ``catalog.register("count_char", count_char)``
        """
        if isinstance(fn, ScalarFunction):
            function = (
                fn
                if result_type is None
                else ScalarFunction(fn.fn, result_type, name=name, deterministic=fn.deterministic)
            )
            function = function if function.name == name else function.renamed(name)
        else:
            if result_type is None:
                raise SqlError(f"function {name}: a plain Python function needs result_type")
            function = ScalarFunction(fn, result_type, name=name)
        self._udfs[name] = function
        return function

    def lookup(self, name: str) -> ScalarFunction | Builtin | None:
        """The UDF or built-in called ``name``, or ``None``.

        Example: ``catalog.lookup("upper") is BUILTINS["UPPER"]``
        """
        found = self._udfs.get(name) or _PROCESS_UDFS.get(name)
        if found is not None:
            return found
        upper = name.upper()
        return BUILTINS.get(ALIASES.get(upper, upper))

    def names(self) -> list[str]:
        """Every callable name, built-ins first. Example: ``"UPPER" in catalog.names()``"""
        return [*BUILTINS, *self._udfs, *(n for n in _PROCESS_UDFS if n not in self._udfs)]


def default_catalog() -> FunctionCatalog:
    """A catalog of the built-ins and the UDFs declared with :func:`udf`.

    Example: ``compile_expression(node, fields, default_catalog())``
    """
    return FunctionCatalog()
