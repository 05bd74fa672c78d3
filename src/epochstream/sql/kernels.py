"""The kernels a compiled SQL expression runs: module-level functions over Arrow values, so
a program (a list of steps naming them) pickles by reference, not as closures.

Every kernel takes ``(args, options, ctx)``: the argument values (``pa.Array`` or
``pa.Scalar``), the step's options (plain data fixed at compile time) and the
:class:`EvalContext` of the batch. A kernel that meets bad data raises
:class:`KernelError` (or lets Arrow's ``ArrowInvalid`` through); the program turns either
into a ``DataError`` naming the expression and its position.

Example::

    call([pa.array([1, 2])], ("add_checked", ()), ctx)     # via pyarrow.compute
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

Value = Any  # pa.Array | pa.Scalar; pyarrow ships no usable stubs for the union


class KernelError(Exception):
    """Bad data met by a kernel (a failed cast, a division by zero); the program reports it
    as a DataError with the expression's position."""


class EvalContext:
    """What one evaluation knows besides its arguments: the batch length and the clock
    (read once per batch: every row of a batch sees the same CURRENT_TIMESTAMP).

    Example: ``EvalContext(3, lambda: 0).now_ms()``
    """

    __slots__ = ("_clock", "_now", "length")  # length changes when a filter drops rows

    def __init__(self, length: int, clock_ms: Callable[[], int] | None) -> None:
        self.length = length
        self._clock = clock_ms
        self._now: int | None = None

    def now_ms(self) -> int:
        """Milliseconds since the epoch, the same for the whole batch."""
        if self._now is None:
            self._now = int(self._clock()) if self._clock else time.time_ns() // 1_000_000
        return self._now


def as_array(value: Value, length: int) -> pa.Array:
    """``value`` as an array of ``length`` rows (a scalar repeated)."""
    if isinstance(value, pa.ChunkedArray):
        return value.combine_chunks()
    if isinstance(value, pa.Scalar):
        return pa.repeat(value, length)
    return value


# --------------------------------------------------------------------------- generic


def const(args: Sequence[Value], options: tuple, ctx: EvalContext) -> Value:
    """A literal: ``options = (scalar,)``."""
    return options[0]


def call(args: Sequence[Value], options: tuple, ctx: EvalContext) -> Value:
    """A ``pyarrow.compute`` function: ``options = (name, ((keyword, value), ...))``."""
    name, kwargs = options
    return getattr(pc, name)(*args, **dict(kwargs))


def cast(args: Sequence[Value], options: tuple, ctx: EvalContext) -> Value:
    """CAST to ``options[0]`` (an Arrow type); ``options[1]`` is how: ``plain``,
    ``trim`` (strings to numbers: Flink trims blanks; to an integer, a fraction is
    dropped as in Flink's BinaryStringDataUtil.toLong), ``trunc`` (DOUBLE or DECIMAL to
    integer: toward zero), ``round`` (to a DECIMAL: half up), ``bool_text`` (TRUE/FALSE),
    ``text_bool``; ``options[2]`` true for TRY_CAST (NULL where a value does not convert).
    """
    target, how, try_ = options
    value = args[0]
    try:
        return _cast(value, target, how)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
        if not try_:
            raise KernelError(first_line(err)) from None
    # TRY_CAST of a batch with bad values: convert row by row, NULL where one fails.
    array = as_array(value, ctx.length)
    out = []
    for i in range(len(array)):
        try:
            out.append(_cast(array.slice(i, 1), target, how)[0])
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            out.append(pa.scalar(None, target))
    return pa.array([s.as_py() for s in out], target)


_INTEGER_DIGITS = {8: 3, 16: 5, 32: 10, 64: 19}  # of the signed types' extremes


def _cast(value: Value, target: pa.DataType, how: str) -> Value:
    if how == "trim":
        value = pc.utf8_trim_whitespace(value)
        if pa.types.is_integer(target):
            # '-3.7' is -3 and '.5' is 0: the digits before the point, with a 0 in front.
            value = pc.replace_substring_regex(
                value, pattern=r"^([+-]?)([0-9]*)\.[0-9]*$", replacement=r"\10\2"
            )
    elif how == "trunc":
        value = pc.trunc(value)
    elif how == "round":
        value = pc.round(value, ndigits=target.scale, round_mode="half_towards_infinity")
    elif how == "bool_text":
        return pc.if_else(value, "TRUE", "FALSE")
    elif how == "text_bool":
        value = pc.utf8_lower(pc.utf8_trim_whitespace(value))
    if pa.types.is_decimal(target) and pa.types.is_integer(value.type):
        # Arrow checks an integer type's widest value against the precision; when that
        # does not fit, go through the widest DECIMAL so only the values must fit.
        digits = _INTEGER_DIGITS[value.type.bit_width] + pa.types.is_unsigned_integer(value.type)
        if digits + target.scale > target.precision:
            value = pc.cast(value, pa.decimal128(38, target.scale))
    return pc.cast(value, target)


def first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


# --------------------------------------------------------------------------- arithmetic


def divide_integer(args: Sequence[Value], options: tuple, ctx: EvalContext) -> Value:
    """Integer division, truncated toward zero as in Java; dividing by zero fails."""
    try:
        return pc.divide_checked(args[0], args[1])
    except pa.ArrowInvalid as err:
        raise KernelError(first_line(err)) from None


def divide_decimal(args: Sequence[Value], options: tuple, ctx: EvalContext) -> Value:
    """DECIMAL division at Flink's result scale: both sides as DECIMAL256 with the dividend
    scaled up far enough, the quotient rounded half up and cast to ``options[0]``."""
    target, extra = options
    left, right = args
    ltype = left.type
    wide_left = pc.cast(left, pa.decimal256(min(76, ltype.precision + extra), ltype.scale + extra))
    wide_right = pc.cast(right, pa.decimal256(right.type.precision, right.type.scale))
    try:
        quotient = pc.divide_checked(wide_left, wide_right)
    except pa.ArrowInvalid as err:
        raise KernelError(first_line(err)) from None
    rounded = pc.round(quotient, ndigits=target.scale, round_mode="half_towards_infinity")
    return pc.cast(rounded, target)


def modulo(args: Sequence[Value], options: tuple, ctx: EvalContext) -> Value:
    """``%``/MOD: the remainder with the dividend's sign (Java's ``%``); by zero fails for
    integers and is NaN for FLOAT/DOUBLE."""
    try:
        return pc.remainder_checked(args[0], args[1]) if options[0] else pc.remainder(*args)
    except pa.ArrowInvalid as err:
        raise KernelError(first_line(err)) from None


# --------------------------------------------------------------------------- logic


def is_true(args: Sequence[Value], options: tuple, ctx: EvalContext) -> Value:
    """``x IS TRUE`` (``options[0]``: IS FALSE instead); never NULL."""
    value = pc.invert(args[0]) if options[0] else args[0]
    return pc.fill_null(value, False)


def in_list(args: Sequence[Value], options: tuple, ctx: EvalContext) -> Value:
    """``x IN (literals)``: NULL when x is NULL, or when x matches none and the list holds
    NULL (three-valued logic)."""
    value_set, has_null = options
    value = args[0]
    found = pc.is_in(value, value_set=value_set)
    if has_null:
        found = pc.if_else(found, True, pa.scalar(None, pa.bool_()))
    return pc.if_else(pc.is_null(value), pa.scalar(None, pa.bool_()), found)


def case(args: Sequence[Value], options: tuple, ctx: EvalContext) -> Value:
    """Searched CASE: ``args = conditions + values + [else]``; a NULL condition is not
    taken. ``options = (number of WHEN branches, result Arrow type)``."""
    n, result_type = options
    conditions = [as_array(pc.fill_null(c, False), ctx.length) for c in args[:n]]
    values = [as_array(v, ctx.length) for v in args[n:]]
    names = [str(i) for i in range(n)]
    return pc.case_when(pc.make_struct(*conditions, field_names=names), *values).cast(result_type)


def nullif(args: Sequence[Value], options: tuple, ctx: EvalContext) -> Value:
    """NULLIF(a, b): NULL where a = b (both converted to their common type), else a;
    ``args = (a converted, b converted, a)``."""
    equal = pc.fill_null(pc.equal(args[0], args[1]), False)
    return pc.if_else(equal, pa.scalar(None, options[0]), pc.cast(args[2], options[0]))


def truncate_float(args: Sequence[Value], options: tuple, ctx: EvalContext) -> Value:
    """TRUNCATE(x, n) of a DOUBLE or FLOAT, toward zero to n decimals of x's shortest
    decimal form, as Flink's BigDecimal.valueOf(x): TRUNCATE(0.29, 2) is 0.29, though
    0.29 * 100 is 28.999999999999996. ``options = (n,)``.

    Of the two candidates t = trunc(x * 10^n) / 10^n and the next one away from zero,
    the next one is right when it is not beyond x (as doubles: rounding is monotonic).
    """
    x, digits = args[0], options[0]
    scale = 10.0 ** abs(digits)
    up, down = (pc.multiply, pc.divide) if digits >= 0 else (pc.divide, pc.multiply)
    whole = pc.trunc(up(x, scale))
    near, next_out = down(whole, scale), down(pc.add(whole, pc.sign(x)), scale)
    result = pc.if_else(pc.less_equal(pc.abs(next_out), pc.abs(x)), next_out, near)
    result = pc.add(result, 0.0)  # -0.0 is 0.0: a BigDecimal has no sign of zero
    # NaN, the infinities and values too large for a fraction stay as they are.
    return pc.if_else(pc.less(pc.abs(x), 2.0**52), result, x)


# --------------------------------------------------------------------------- strings


def concat(args: Sequence[Value], options: tuple, ctx: EvalContext) -> Value:
    """CONCAT(a, b, ...) and ``||``: NULL when any argument is NULL."""
    return pc.binary_join_element_wise(*args, "", null_handling="emit_null")


def concat_ws(args: Sequence[Value], options: tuple, ctx: EvalContext) -> Value:
    """CONCAT_WS(sep, s1, s2, ...): the strings joined by sep, NULL ones skipped; NULL
    when sep is NULL (Flink)."""
    return pc.binary_join_element_wise(*args[1:], args[0], null_handling="skip")


def fit_length(args: Sequence[Value], options: tuple, ctx: EvalContext) -> Value:
    """CAST to CHAR(n) or VARCHAR(n): cut to n characters; ``options = (n, pad)``, pad
    true for CHAR(n), which fills a shorter string with blanks."""
    length, pad = options
    cut = pc.utf8_slice_codeunits(args[0], 0, length)
    return pc.utf8_rpad(cut, width=length, padding=" ") if pad else cut


def like(args: Sequence[Value], options: tuple, ctx: EvalContext) -> Value:
    """LIKE with a literal pattern already translated to Arrow's ``match_like`` syntax."""
    return pc.match_like(args[0], pattern=options[0])


def split(args: Sequence[Value], options: tuple, ctx: EvalContext) -> Value:
    """The pieces of a string split at the literal ``options[0]`` (a list array, NULL for a
    NULL string): SPLIT_INDEX's first half, one step shared by every SPLIT_INDEX of the
    same string and separator."""
    text = as_array(args[0], ctx.length)
    text = pc.if_else(pc.equal(text, ""), pa.scalar(None, text.type), text)  # '' has no pieces
    parts = pc.split_pattern(text, pattern=options[0])
    return parts.combine_chunks() if isinstance(parts, pa.ChunkedArray) else parts


def split_index(args: Sequence[Value], options: tuple, ctx: EvalContext) -> Value:
    """SPLIT_INDEX(s, sep, i) from ``args = (pieces of s (see split), i)``: the i-th (from
    0) piece, NULL when i is out of range (Flink's SqlFunctionUtils.splitIndex)."""
    parts = as_array(args[0], ctx.length)
    index = as_array(pc.cast(args[1], pa.int64()), ctx.length)
    lengths = pc.list_value_length(parts)
    offsets = np.asarray(parts.offsets)[:-1]
    in_range = pc.and_(pc.greater_equal(index, 0), pc.less(index, lengths))
    where = pc.add(pa.array(offsets - offsets[0] if len(offsets) else offsets, pa.int64()), index)
    where = pc.if_else(in_range, where, pa.scalar(None, pa.int64()))
    return pc.take(parts.flatten(), where)


def regexp_extract(args: Sequence[Value], options: tuple, ctx: EvalContext) -> Value:
    """REGEXP_EXTRACT: the group of the first match of ``options[0]``, a pattern whose only
    capture group is the wanted one, named; NULL without a match."""
    return pc.struct_field(pc.extract_regex(args[0], pattern=options[0]), [0])


def regexp(args: Sequence[Value], options: tuple, ctx: EvalContext) -> Value:
    """REGEXP(s, re): whether re matches anywhere in s."""
    return pc.match_substring_regex(args[0], pattern=options[0])


def position(args: Sequence[Value], options: tuple, ctx: EvalContext) -> Value:
    """POSITION(sub IN s): 1-based character index of the first sub in s, 0 when absent
    (Arrow finds a byte offset: the characters before it are counted)."""
    text, needle = args[0], options[0]
    found = pc.find_substring(text, pattern=needle)
    if not needle:
        return pc.cast(pc.add(found, 1), pa.int32())
    before = pc.list_element(pc.split_pattern(text, pattern=needle, max_splits=1), 0)
    chars = pc.add(pc.utf8_length(before), 1)
    return pc.cast(pc.if_else(pc.less(found, 0), 0, chars), pa.int32())


def substring(args: Sequence[Value], options: tuple, ctx: EvalContext) -> Value:
    """SUBSTRING(s, start[, length]) with Flink's positions (SqlFunctionUtils.subString):
    start 0 is 1, a negative start counts from the end and gives '' when it reaches
    before the start, a negative length gives NULL; ``options = (start, length or None)``.
    """
    start, length = options
    text = args[0]
    if length is not None and length < 0:
        return pa.nulls(ctx.length, pa.string())
    begin = start - 1 if start > 0 else start  # 0-based; negative counts from the end
    stop = None if length is None else begin + length
    if begin < 0 and stop is not None and stop >= 0:
        stop = None  # runs to the end
    piece = pc.utf8_slice_codeunits(text, start=begin, stop=stop)
    if begin >= 0:
        return piece
    too_far = pc.less(pc.add(pc.utf8_length(text), begin), 0)
    return pc.if_else(too_far, "", piece)


def trim(args: Sequence[Value], options: tuple, ctx: EvalContext) -> Value:
    """TRIM([BOTH|LEADING|TRAILING] chars FROM s): ``options = (side, chars)``."""
    side, chars = options
    name = {"BOTH": "utf8_trim", "LEADING": "utf8_ltrim", "TRAILING": "utf8_rtrim"}[side]
    return getattr(pc, name)(args[0], characters=chars)


def initcap(args: Sequence[Value], options: tuple, ctx: EvalContext) -> Value:
    """INITCAP: each word's first letter upper case, the rest lower case."""
    return pc.utf8_title(args[0])


# --------------------------------------------------------------------------- time


def now(args: Sequence[Value], options: tuple, ctx: EvalContext) -> Value:
    """CURRENT_TIMESTAMP & co: the batch's clock reading as a scalar of ``options[0]``."""
    return pa.scalar(ctx.now_ms(), pa.int64()).cast(options[0])


def unix_timestamp_now(args: Sequence[Value], options: tuple, ctx: EvalContext) -> Value:
    """UNIX_TIMESTAMP(): seconds since the epoch."""
    return pa.scalar(ctx.now_ms() // 1000, pa.int64())


def date_format(args: Sequence[Value], options: tuple, ctx: EvalContext) -> Value:
    """DATE_FORMAT(ts, pattern) with the Java pattern split at compile time into strftime
    pieces, ``number`` pieces (one strftime field without its leading zeros) and
    ``millis`` pieces (strftime's %S would print the fraction)."""
    value = args[0]
    if pa.types.is_string(value.type):
        value = pc.cast(value, pa.timestamp("ms"))
    seconds = pc.cast(value, pa.timestamp("s", tz=value.type.tz), safe=False)
    pieces = []
    for kind, text in options[0]:
        if kind == "strftime":
            pieces.append(pc.strftime(seconds, format=text))
        elif kind == "number":
            field = pc.cast(pc.strftime(seconds, format=text), pa.int64())
            pieces.append(pc.cast(field, pa.string()))
        else:
            millis = pc.cast(pc.millisecond(value), pa.string())
            pieces.append(pc.utf8_lpad(millis, width=3, padding="0"))
    if len(pieces) == 1:
        return pieces[0]
    return pc.binary_join_element_wise(*pieces, "")


def to_timestamp(args: Sequence[Value], options: tuple, ctx: EvalContext) -> Value:
    """TO_TIMESTAMP(s[, format]): NULL where s does not parse (Flink returns NULL)."""
    strptime_format, target = options
    if strptime_format is None:
        try:
            return pc.cast(args[0], target)
        except pa.ArrowInvalid:
            array = as_array(args[0], ctx.length)
            return pa.array([_parse_iso(v) for v in array.to_pylist()], pa.timestamp("ms")).cast(
                target
            )
    parsed = pc.strptime(args[0], format=strptime_format, unit="ms", error_is_null=True)
    return pc.cast(parsed, target)


def _parse_iso(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return pc.cast(pa.scalar(text.strip()), pa.timestamp("ms")).as_py()
    except pa.ArrowInvalid:
        return None


def epoch_to_timestamp(args: Sequence[Value], options: tuple, ctx: EvalContext) -> Value:
    """TO_TIMESTAMP_LTZ(n, precision): n seconds (precision 0) or milliseconds (3)."""
    factor, target = options
    millis = pc.multiply_checked(pc.cast(args[0], pa.int64()), factor)
    return pc.cast(millis, pa.int64()).cast(target)


def timestamp_to_epoch(args: Sequence[Value], options: tuple, ctx: EvalContext) -> Value:
    """UNIX_TIMESTAMP(ts or string[, format]) as seconds; ``options = (strptime format)``."""
    value = args[0]
    if pa.types.is_string(value.type):
        value = pc.strptime(value, format=options[0], unit="s", error_is_null=True)
    seconds = pc.cast(value, pa.timestamp("s", tz=value.type.tz), safe=False)
    return pc.cast(seconds, pa.int64())


def add_millis(args: Sequence[Value], options: tuple, ctx: EvalContext) -> Value:
    """TIMESTAMPADD(unit, n, ts): ts plus n units of ``options[0]`` milliseconds."""
    count, ts = args
    millis = pc.multiply_checked(pc.cast(count, pa.int64()), options[0])
    return pc.add_checked(ts, pc.cast(millis, pa.duration("ms")))


def diff_units(args: Sequence[Value], options: tuple, ctx: EvalContext) -> Value:
    """TIMESTAMPDIFF(unit, a, b): whole units from a to b, toward zero, as INT."""
    a, b = (pc.cast(pc.cast(x, pa.timestamp("ms", tz=x.type.tz)), pa.int64()) for x in args)
    return pc.cast(pc.divide(pc.subtract(b, a), options[0]), pa.int32())


def extract(args: Sequence[Value], options: tuple, ctx: EvalContext) -> Value:
    """EXTRACT(unit FROM ts), HOUR(ts) ...: ``options[0]`` names the pyarrow.compute
    component function; the result is BIGINT."""
    return pc.cast(getattr(pc, options[0])(args[0]), pa.int64())


# --------------------------------------------------------------------------- helpers


def java_pattern_pieces(pattern: str) -> tuple[tuple[str, str], ...] | None:
    """A Java date pattern as (``strftime``, text), (``number``, strftime field) and
    (``millis``, "") pieces, or ``None`` when it uses a letter without a translation. As
    in Java, the count of a numeric letter is the minimum number of digits: ``d`` is a
    ``number`` piece (``5``), ``dd`` is ``%d`` (``05``).

    Example: ``java_pattern_pieces("yyyy-MM-dd")`` is ``(("strftime", "%Y-%m-%d"),)``
    """
    numbers = {"M": "%m", "d": "%d", "D": "%j", "H": "%H", "h": "%I", "m": "%M", "s": "%S"}
    letters = {
        "y": "%Y",
        "yyyy": "%Y",
        "yy": "%y",
        "MM": "%m",
        "dd": "%d",
        "HH": "%H",
        "hh": "%I",
        "mm": "%M",
        "ss": "%S",
        "a": "%p",
        "EEE": "%a",
        "MMM": "%b",
        "DDD": "%j",
    }
    pieces: list[tuple[str, str]] = []
    text = ""
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "'":
            # Quoted text; '' is a quote, inside quoted text or outside.
            end = i + 1
            quoted = ""
            while True:
                close = pattern.find("'", end)
                if close < 0:
                    return None
                quoted += pattern[end:close]
                if pattern.startswith("''", close):
                    quoted += "'"
                    end = close + 2
                    continue
                break
            text += (quoted if close > i + 1 else "'").replace("%", "%%")
            i = close + 1
            continue
        if not ch.isalpha():
            text += "%%" if ch == "%" else ch
            i += 1
            continue
        run = re.match(rf"{re.escape(ch)}+", pattern[i:])
        assert run is not None
        token = run.group(0)
        if token == "SSS" or token in numbers:
            if text:
                pieces.append(("strftime", text))
            pieces.append(("millis", "") if token == "SSS" else ("number", numbers[token]))
            text = ""
        elif token in letters:
            text += letters[token]
        else:
            return None
        i += len(token)
    if text:
        pieces.append(("strftime", text))
    return tuple(pieces)
