"""The stored key format: the bytes that name a key wherever it is kept.

One encoding routes a key and identifies it in state (docs/architecture.md, State): a
key's key group is the MurmurHash3 of these bytes, every RocksDB key embeds them, the
savepoint format stores them in its ``key``, ``namespace`` and ``user_key`` columns,
and the state reader and the restore of the heap backend decode them back to keys.
Changing a byte moves keys to other key groups and orphans every stored checkpoint, so
``tests/state/test_keyformat.py`` pins the bytes of every layout.

This module holds the whole format: the table of tags (:class:`KeyTag`, each with its
layout), :func:`encode_key` and :func:`decode_key`. Each layout's encoder and decoder
sit side by side and share its :mod:`struct` formats, so a layout is written once.

The encoding must not depend on the process (Python's built-in ``hash`` is salted per
process, so it is never used) and keys that compare equal in Python must encode
identically (``1``, ``1.0``, ``True`` and ``Decimal(1)`` are one key), because state
is kept in dicts keyed by the key itself. Decoding returns the key's *canonical
representative*, which compares equal to the original:

- numbers: an integral float or ``True`` comes back as ``int`` (``1.0 -> 1``), an exact
  fraction that is not a float as ``Fraction``, a ``Decimal`` as the number it equals,
  every NaN as the one NaN object of :func:`canonical_nan`;
- sequences: lists and tuples both come back as ``tuple``; sets as ``frozenset``;
- an aware datetime or time comes back in UTC (or, for an instant UTC cannot show, at
  a fixed offset);
- an ``Enum`` member comes back as the member if its class can be imported, else as the
  tuple ``(qualified class name, member name)``;
- ``str``, ``bytes``, ``None``, dates, naive times and datetimes, timedeltas and UUIDs
  exactly.

Example::

    encode_key(1) == encode_key(1.0) == encode_key(True) == b"I+\\x00\\x00\\x00\\x01\\x01"
    decode_key(encode_key(("user", 7))) == ("user", 7)
    decode_key(encode_key(["a", 2.0])) == ("a", 2)
"""

from __future__ import annotations

import datetime as _dt
import enum
import importlib
import numbers
import reprlib
import struct
import uuid
from collections.abc import Callable
from decimal import Decimal
from fractions import Fraction
from typing import Any, Final

from epochstream.exceptions import KeyEncodingError, StateError

__all__ = ["KeyTag", "canonical_nan", "decode_key", "encode_key"]


class KeyTag(bytes, enum.Enum):
    """The first byte of every encoded key: which layout follows.

    ``u32`` is a 4-byte big-endian unsigned length or count; ``INT`` in a layout is a
    whole encoded int (tag included); ``[key]`` is ``u32 length | encoded key``.
    Numeric kinds that can compare equal share the INT / FLOAT / RATIONAL layouts, so
    equal numbers encode identically.

    Example: ``encode_key("a")[:1] == KeyTag.STR``
    """

    #: ``N``: None.
    NONE = b"N"
    #: ``I | sign (b"+" or b"-") | u32 n | n-byte big-endian magnitude`` (0 has n = 0):
    #: ints, bools, and every number equal to an int (``1.0``, ``Decimal(1)``, ``1+0j``).
    INT = b"I"
    #: ``F | 8-byte big-endian IEEE double``: a float that is not integral; every NaN
    #: is the one quiet NaN ``7ff8000000000000``.
    FLOAT = b"F"
    #: ``Q | u32 length | INT numerator | INT denominator``: an exact fraction in lowest
    #: terms (denominator > 1) that no float equals (``Fraction(1, 3)``, ``Decimal("0.1")``).
    RATIONAL = b"Q"
    #: ``C | double real | double imag``: a complex number with a non-zero imaginary part.
    COMPLEX = b"C"
    #: ``S | UTF-8 (surrogates passed through)`` to the end.
    STR = b"S"
    #: ``B | the bytes`` to the end: bytes, bytearray, memoryview.
    BYTES = b"B"
    #: ``L | u32 count | count * [key]``: tuples and lists, items in order.
    SEQUENCE = b"L"
    #: ``R | u32 count | count * [key]``: sets and frozensets, the ``[key]`` parts sorted
    #: as bytes (a set's iteration order depends on ``hash``).
    FROZENSET = b"R"
    #: ``d | u16 year | u8 month | u8 day``.
    DATE = b"d"
    #: ``n | u16 year | u8 month | u8 day | u8 hour | u8 minute | u8 second | u32 µs``:
    #: a naive datetime (``fold`` ignored, as ``==`` ignores it).
    NAIVE_DATETIME = b"n"
    #: ``z | INT``: an aware datetime as microseconds since 1970-01-01T00:00Z (equal
    #: instants are equal keys, whatever their time zones).
    AWARE_DATETIME = b"z"
    #: ``t | u8 hour | u8 minute | u8 second | u32 µs``: a naive time.
    NAIVE_TIME = b"t"
    #: ``T | INT``: an aware time as microseconds after midnight UTC, not wrapped (it
    #: may be negative or past a day: ``==`` does not wrap either).
    AWARE_TIME = b"T"
    #: ``D | INT``: a timedelta in microseconds.
    TIMEDELTA = b"D"
    #: ``U | 16 bytes``: a UUID.
    UUID = b"U"
    #: ``E | [STR "module.QualifiedClass"] | STR member name``: a member of a plain Enum
    #: (IntEnum and StrEnum members encode as the int or str they equal).
    ENUM = b"E"


# The encoders use the tags as plain module constants: an Enum attribute lookup costs
# about 60 ns, and snapshots encode every key.
_T_NONE: Final = KeyTag.NONE.value
_T_INT_POS: Final = KeyTag.INT.value + b"+"
_T_INT_NEG: Final = KeyTag.INT.value + b"-"
_INT_TAGS: Final = frozenset((_T_INT_POS, _T_INT_NEG))
_T_FLOAT: Final = KeyTag.FLOAT.value
_T_RATIONAL: Final = KeyTag.RATIONAL.value
_T_COMPLEX: Final = KeyTag.COMPLEX.value
_T_STR: Final = KeyTag.STR.value
_T_BYTES: Final = KeyTag.BYTES.value
_T_SEQ: Final = KeyTag.SEQUENCE.value
_T_FROZENSET: Final = KeyTag.FROZENSET.value
_T_DATE: Final = KeyTag.DATE.value
_T_NAIVE_DATETIME: Final = KeyTag.NAIVE_DATETIME.value
_T_AWARE_DATETIME: Final = KeyTag.AWARE_DATETIME.value
_T_NAIVE_TIME: Final = KeyTag.NAIVE_TIME.value
_T_AWARE_TIME: Final = KeyTag.AWARE_TIME.value
_T_TIMEDELTA: Final = KeyTag.TIMEDELTA.value
_T_UUID: Final = KeyTag.UUID.value
_T_ENUM: Final = KeyTag.ENUM.value

_U32 = struct.Struct(">I")
_DOUBLE = struct.Struct(">d")
_COMPLEX = struct.Struct(">dd")
_DATE = struct.Struct(">HBB")
_NAIVE_DATETIME = struct.Struct(">HBBBBBI")
_NAIVE_TIME = struct.Struct(">BBBI")
_UUID_SIZE = 16
_EPOCH_UTC = _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC)
_EPOCH_NAIVE = _dt.datetime(1970, 1, 1)
_MICROSECOND = _dt.timedelta(microseconds=1)
_DAY_SECONDS = 86_400
_NAN_BYTES: Final = _T_FLOAT + _DOUBLE.pack(float("nan"))

# The one NaN object every float NaN key becomes: a dict finds a key by identity
# first, and NaN equals nothing, not even another NaN (every NaN encodes alike, so
# they share a key group: they must share the state too).
_NAN_KEY = float("nan")

_key_repr = reprlib.Repr()
_key_repr.maxstring = 60
_key_repr.maxother = 60


def canonical_nan(key: Any) -> Any:
    """``key``, or for a float NaN the one NaN object that stands for every NaN key.

    Called where a key is first seen (a routing cache miss, a columnar key index), not
    per record; :func:`decode_key` returns that object for a NaN too.

    Example: ``canonical_nan(float("nan")) is canonical_nan(-float("nan"))``
    """
    return _NAN_KEY if type(key) is float and key != key else key


class _Unencodable(Exception):
    """Internal: carries the offending (possibly nested) value up to the public entry."""

    def __init__(self, value: object) -> None:
        super().__init__(type(value).__qualname__)
        self.value = value


def _prefixed(encoded: bytes) -> bytes:
    """``[key]``: an encoded key preceded by its length."""
    return _U32.pack(len(encoded)) + encoded


def _split_prefixed(data: bytes, pos: int) -> tuple[bytes, int]:
    """The ``[key]`` at ``pos``: its encoded key and the position after it."""
    size = _U32.unpack_from(data, pos)[0]
    start = pos + 4
    end = start + size
    if end > len(data):
        raise ValueError(f"item of {size} bytes at {start} runs past the end")
    return data[start:end], end


def _wrong_size(data: bytes, size: int) -> ValueError:
    return ValueError(f"{KeyTag(data[:1]).name} key of {len(data)} bytes, expected {size}")


# --- INT: ints, and every number equal to one --------------------------------------


def _encode_int(value: int) -> bytes:
    if value < 0:
        tag, magnitude = _T_INT_NEG, -value
    else:
        tag, magnitude = _T_INT_POS, value
    size = (magnitude.bit_length() + 7) // 8
    return tag + _U32.pack(size) + magnitude.to_bytes(size, "big")


def _decode_int(data: bytes) -> int:
    size = _U32.unpack_from(data, 2)[0]
    if len(data) != 6 + size or data[:2] not in _INT_TAGS:
        raise ValueError(f"not an encoded int of {size} bytes: {data[:6]!r}")
    magnitude = int.from_bytes(data[6:], "big")
    return -magnitude if data[:2] == _T_INT_NEG else magnitude


# --- FLOAT, RATIONAL, COMPLEX --------------------------------------------------------


def _encode_float(value: float) -> bytes:
    if value.is_integer():  # also maps -0.0 to int 0
        return _encode_int(int(value))
    if value != value:  # every NaN payload becomes one canonical NaN
        return _NAN_BYTES
    return _T_FLOAT + _DOUBLE.pack(value)


def _decode_float(data: bytes) -> float:
    if len(data) != 1 + _DOUBLE.size:
        raise _wrong_size(data, 1 + _DOUBLE.size)
    value: float = _DOUBLE.unpack_from(data, 1)[0]
    return _NAN_KEY if value != value else value


def _encode_ratio(numerator: int, denominator: int) -> bytes:
    """Encode an exact rational ``numerator / denominator`` (lowest terms, den > 0)."""
    if denominator == 1:
        return _encode_int(numerator)
    try:
        approx = numerator / denominator
    except OverflowError:
        approx = None
    if approx is not None and approx.as_integer_ratio() == (numerator, denominator):
        return _encode_float(approx)  # equal to that float, so it must encode like it
    return _T_RATIONAL + _prefixed(_encode_int(numerator)) + _encode_int(denominator)


def _decode_ratio(data: bytes) -> Fraction:
    numerator, pos = _split_prefixed(data, 1)
    return Fraction(_decode_int(numerator), _decode_int(data[pos:]))


def _encode_decimal(value: Decimal) -> bytes:
    if value.is_nan():
        return _NAN_BYTES
    if value.is_infinite():
        return _encode_float(float(value))
    return _encode_ratio(*value.as_integer_ratio())


def _encode_complex(value: complex) -> bytes:
    if value.imag == 0:
        return _encode_float(value.real)
    # + 0.0 turns -0.0 into 0.0: complex(1, -0.0) == complex(1, 0.0)
    return _T_COMPLEX + _COMPLEX.pack(value.real + 0.0, value.imag + 0.0)


def _decode_complex(data: bytes) -> complex:
    if len(data) != 1 + _COMPLEX.size:
        raise _wrong_size(data, 1 + _COMPLEX.size)
    return complex(*_COMPLEX.unpack_from(data, 1))


# --- STR, BYTES ----------------------------------------------------------------------


def _encode_str(value: str) -> bytes:
    return _T_STR + value.encode("utf-8", "surrogatepass")


def _decode_str(data: bytes) -> str:
    return data[1:].decode("utf-8", "surrogatepass")


def _encode_bytes(value: bytes | bytearray | memoryview) -> bytes:
    return _T_BYTES + bytes(value)


def _decode_bytes(data: bytes) -> bytes:
    return data[1:]


# --- SEQUENCE, FROZENSET -------------------------------------------------------------


def _encode_sequence(value: tuple[object, ...] | list[object]) -> bytes:
    parts = [_T_SEQ, _U32.pack(len(value))]
    for item in value:
        encoded = _encode(item)
        parts.append(_U32.pack(len(encoded)))
        parts.append(encoded)
    return b"".join(parts)


def _encode_frozenset(value: frozenset[object] | set[object]) -> bytes:
    # Iteration order of a set depends on hash(); sorting the encodings removes it.
    items = sorted(_prefixed(_encode(item)) for item in value)
    return _T_FROZENSET + _U32.pack(len(items)) + b"".join(items)


def _decode_items(data: bytes) -> list[object]:
    """The items of a SEQUENCE or FROZENSET layout, in stored order."""
    count = _U32.unpack_from(data, 1)[0]
    pos, items = 5, []
    for _ in range(count):
        item, pos = _split_prefixed(data, pos)
        items.append(_decode(item))
    if len(data) != pos:
        raise _wrong_size(data, pos)
    return items


def _decode_sequence(data: bytes) -> tuple[object, ...]:
    return tuple(_decode_items(data))


def _decode_frozenset(data: bytes) -> frozenset[object]:
    return frozenset(_decode_items(data))


# --- DATE, datetimes, times, TIMEDELTA -----------------------------------------------


def _encode_date(value: _dt.date) -> bytes:
    return _T_DATE + _DATE.pack(value.year, value.month, value.day)


def _decode_date(data: bytes) -> _dt.date:
    if len(data) != 1 + _DATE.size:
        raise _wrong_size(data, 1 + _DATE.size)
    return _dt.date(*_DATE.unpack_from(data, 1))


def _encode_datetime(value: _dt.datetime) -> bytes:
    if value.utcoffset() is None:  # naive: compares by its fields, ignoring fold
        return _T_NAIVE_DATETIME + _NAIVE_DATETIME.pack(
            value.year,
            value.month,
            value.day,
            value.hour,
            value.minute,
            value.second,
            value.microsecond,
        )
    # aware: equal when they denote the same instant, whatever the time zone
    return _T_AWARE_DATETIME + _encode_int((value - _EPOCH_UTC) // _MICROSECOND)


def _decode_naive_datetime(data: bytes) -> _dt.datetime:
    if len(data) != 1 + _NAIVE_DATETIME.size:
        raise _wrong_size(data, 1 + _NAIVE_DATETIME.size)
    return _dt.datetime(*_NAIVE_DATETIME.unpack_from(data, 1))


def _decode_aware_datetime(data: bytes) -> _dt.datetime:
    micros = _decode_int(data[1:])
    try:
        return _EPOCH_UTC + _dt.timedelta(microseconds=micros)
    except OverflowError:
        pass
    # An instant before 0001-01-01 or after 9999-12-31 in UTC (a datetime near either
    # end with an offset): shown at the largest offset that brings it into range.
    offset = _dt.timedelta(days=1) - _MICROSECOND
    if micros > 0:
        offset = -offset
    local = _EPOCH_NAIVE + (_dt.timedelta(microseconds=micros) + offset)
    return local.replace(tzinfo=_dt.timezone(offset))


def _encode_time(value: _dt.time) -> bytes:
    offset = value.utcoffset()
    if offset is None:
        return _T_NAIVE_TIME + _NAIVE_TIME.pack(
            value.hour, value.minute, value.second, value.microsecond
        )
    micros = ((value.hour * 60 + value.minute) * 60 + value.second) * 1_000_000
    return _T_AWARE_TIME + _encode_int(micros + value.microsecond - offset // _MICROSECOND)


def _decode_naive_time(data: bytes) -> _dt.time:
    if len(data) != 1 + _NAIVE_TIME.size:
        raise _wrong_size(data, 1 + _NAIVE_TIME.size)
    return _dt.time(*_NAIVE_TIME.unpack_from(data, 1))


def _decode_aware_time(data: bytes) -> _dt.time:
    seconds, micro = divmod(_decode_int(data[1:]), 1_000_000)
    # Times compare as (local seconds - offset seconds, microsecond), unwrapped, so a
    # value outside one UTC day needs an offset: the local time is pinned to the
    # nearest end of the day and the offset makes up the rest.
    local = min(max(seconds, 0), _DAY_SECONDS - 1)
    offset = local - seconds
    zone = _dt.UTC if offset == 0 else _dt.timezone(_dt.timedelta(seconds=offset))
    hours, rest = divmod(local, 3600)
    return _dt.time(hours, rest // 60, rest % 60, micro, tzinfo=zone)


def _encode_timedelta(value: _dt.timedelta) -> bytes:
    return _T_TIMEDELTA + _encode_int(value // _MICROSECOND)


def _decode_timedelta(data: bytes) -> _dt.timedelta:
    return _dt.timedelta(microseconds=_decode_int(data[1:]))


# --- UUID, ENUM, NONE ----------------------------------------------------------------


def _encode_uuid(value: uuid.UUID) -> bytes:
    return _T_UUID + value.bytes


def _decode_uuid(data: bytes) -> uuid.UUID:
    if len(data) != 1 + _UUID_SIZE:
        raise _wrong_size(data, 1 + _UUID_SIZE)
    return uuid.UUID(bytes=data[1:])


def _encode_enum(value: enum.Enum) -> bytes:
    cls = type(value)
    qualified = f"{cls.__module__}.{cls.__qualname__}"
    return _T_ENUM + _prefixed(_encode_str(qualified)) + _encode_str(value.name)


def _decode_enum(data: bytes) -> object:
    qualified_bytes, pos = _split_prefixed(data, 1)
    qualified, name = _decode(qualified_bytes), _decode(data[pos:])
    if type(qualified) is not str or type(name) is not str:
        raise ValueError("an enum member is named by two strings")
    module, _, cls_name = qualified.rpartition(".")
    try:
        cls: Any = importlib.import_module(module)
        for part in cls_name.split("."):
            cls = getattr(cls, part)
        return cls[name]
    except (ImportError, AttributeError, KeyError):
        return (qualified, name)


def _encode_none(_value: None) -> bytes:
    return _T_NONE


def _decode_none(data: bytes) -> None:
    if len(data) != 1:
        raise _wrong_size(data, 1)


# --- dispatch ------------------------------------------------------------------------

# Exact-type dispatch keeps the common case to one dict lookup.
_BY_TYPE: dict[type, Callable[..., bytes]] = {
    int: _encode_int,
    bool: _encode_int,
    str: _encode_str,
    bytes: _encode_bytes,
    bytearray: _encode_bytes,
    memoryview: _encode_bytes,
    float: _encode_float,
    tuple: _encode_sequence,
    list: _encode_sequence,
    type(None): _encode_none,
    frozenset: _encode_frozenset,
    set: _encode_frozenset,
    Decimal: _encode_decimal,
    Fraction: lambda value: _encode_ratio(value.numerator, value.denominator),
    complex: _encode_complex,
    _dt.date: _encode_date,
    _dt.datetime: _encode_datetime,
    _dt.time: _encode_time,
    _dt.timedelta: _encode_timedelta,
    uuid.UUID: _encode_uuid,
}


def _encode_subclass(value: object) -> bytes:
    """Subclasses and numeric ABCs (IntEnum, namedtuple, numpy scalars, ...)."""
    if isinstance(value, int):  # before Enum: IntEnum members equal their int
        return _encode_int(int(value))
    if isinstance(value, str):
        return _encode_str(str(value))
    if isinstance(value, float):
        return _encode_float(float(value))
    if isinstance(value, tuple | list):
        return _encode_sequence(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return _encode_bytes(value)
    if isinstance(value, frozenset | set):
        return _encode_frozenset(value)
    if isinstance(value, _dt.datetime):  # before date: datetime subclasses date
        return _encode_datetime(value)
    if isinstance(value, _dt.date):
        return _encode_date(value)
    if isinstance(value, _dt.time):
        return _encode_time(value)
    if isinstance(value, _dt.timedelta):
        return _encode_timedelta(value)
    if isinstance(value, Decimal):
        return _encode_decimal(value)
    if isinstance(value, uuid.UUID):
        return _encode_uuid(value)
    if isinstance(value, enum.Enum):
        return _encode_enum(value)
    if isinstance(value, numbers.Rational):
        return _encode_ratio(int(value.numerator), int(value.denominator))
    if isinstance(value, numbers.Real):  # e.g. numpy.float32: float() is exact
        return _encode_float(float(value))
    if isinstance(value, numbers.Complex):
        return _encode_complex(complex(value))
    raise _Unencodable(value)


def _encode(value: object) -> bytes:
    encoder = _BY_TYPE.get(type(value))
    if encoder is not None:
        return encoder(value)
    return _encode_subclass(value)


#: The decoder of each tag, by the tag's byte value.
_DECODERS: dict[int, Callable[[bytes], object]] = {
    tag.value[0]: decoder
    for tag, decoder in {
        KeyTag.NONE: _decode_none,
        KeyTag.INT: _decode_int,
        KeyTag.FLOAT: _decode_float,
        KeyTag.RATIONAL: _decode_ratio,
        KeyTag.COMPLEX: _decode_complex,
        KeyTag.STR: _decode_str,
        KeyTag.BYTES: _decode_bytes,
        KeyTag.SEQUENCE: _decode_sequence,
        KeyTag.FROZENSET: _decode_frozenset,
        KeyTag.DATE: _decode_date,
        KeyTag.NAIVE_DATETIME: _decode_naive_datetime,
        KeyTag.AWARE_DATETIME: _decode_aware_datetime,
        KeyTag.NAIVE_TIME: _decode_naive_time,
        KeyTag.AWARE_TIME: _decode_aware_time,
        KeyTag.TIMEDELTA: _decode_timedelta,
        KeyTag.UUID: _decode_uuid,
        KeyTag.ENUM: _decode_enum,
    }.items()
}


def _decode(data: bytes) -> object:
    if not data:
        raise ValueError("empty key")
    decoder = _DECODERS.get(data[0])
    if decoder is None:
        raise ValueError(f"unknown key tag {data[:1]!r}")
    return decoder(data)


def encode_key(key: object) -> bytes:
    """The stored bytes of ``key``: stable across processes, equal for equal keys.

    Equal keys encode identically (``1``, ``1.0``, ``True``, ``Decimal(1)``);
    tuples and lists share one encoding. Supported: None, bool, int, float,
    complex, Decimal, Fraction, str, bytes-likes, tuple/list, frozenset/set,
    date, datetime, time, timedelta, UUID and Enum members (and their subclasses).
    Anything else raises :class:`KeyEncodingError`.

    Example::

        encode_key(1) == encode_key(1.0) == encode_key(True)
        encode_key(("a", 2)) == encode_key(["a", 2])
        encode_key("ab") == b"Sab"
    """
    try:
        return _encode(key)
    except _Unencodable as err:
        bad = err.value
        where = "" if bad is key else f" (inside {_key_repr.repr(key)})"
        raise KeyEncodingError(
            f"key of type {type(bad).__module__}.{type(bad).__qualname__} has no stable "
            f"canonical encoding: {_key_repr.repr(bad)}{where}; use None, bool, int, float, "
            "str, bytes, tuples of these, or date/datetime/Decimal/UUID/Enum"
        ) from None


def decode_key(data: bytes) -> object:
    """The canonical representative of the key whose stored bytes are ``data``.

    It compares equal to the key that was encoded and encodes to ``data`` again (see
    the module docstring for the representative of each kind). Bytes that are not
    exactly one encoded key raise :class:`StateError`.

    Example::

        decode_key(encode_key(("user", 7))) == ("user", 7)
        decode_key(encode_key(2.0)) == 2
        decode_key(b"Sab") == "ab"
    """
    raw = bytes(data)
    try:
        return _decode(raw)
    except (struct.error, IndexError, ValueError, OverflowError, UnicodeDecodeError) as exc:
        raise StateError(f"cannot decode key bytes {raw[:40]!r}: {exc}") from exc
