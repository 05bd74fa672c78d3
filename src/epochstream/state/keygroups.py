"""Key groups: which subtask owns a key, stable across processes and restarts.

Flink's scheme (docs/architecture.md, State): a key is hashed into one of
``max_parallelism`` key groups, and each of the ``parallelism`` subtasks owns a
contiguous range of key groups. Keyed state is snapshotted per key group, so a
restore at a new parallelism hands each subtask the key groups of its new range.

The hash input is :func:`canonical_key_bytes`, a byte encoding that does not depend
on the process (Python's built-in hash is salted per process, so it must never be used).
Keys that compare equal in Python encode identically (``1``, ``1.0`` and ``True``
share one key group), because state is kept in dicts keyed by the key itself.

Example::

    assigner = KeyGroupAssigner(max_parallelism=128)
    kg = assigner.key_group("user-7")                 # 0 <= kg < 128
    assigner.channel("user-7", parallelism=4) == operator_index_for_key_group(128, 4, kg)
    kg in key_group_range_for_operator(128, 4, assigner.channel("user-7", 4))
"""

from __future__ import annotations

import datetime as _dt
import enum
import numbers
import reprlib
import struct
import threading
import uuid
from collections.abc import Callable, Iterable
from decimal import Decimal
from fractions import Fraction
from typing import Any

import mmh3

from epochstream.exceptions import ConfigurationError, KeyEncodingError

__all__ = [
    "MAX_MAX_PARALLELISM",
    "KeyGroupAssigner",
    "canonical_key_bytes",
    "canonical_nan",
    "default_max_parallelism",
    "key_group_for_key",
    "key_group_range_for_operator",
    "murmur3_32",
    "operator_index_for_key_group",
    "validate_max_parallelism",
    "validate_parallelism",
]

#: Upper bound for ``max_parallelism`` (Flink's ``1 << 15``).
MAX_MAX_PARALLELISM = 32768

_U32 = struct.Struct(">I")
_DOUBLE = struct.Struct(">d")
_DATE = struct.Struct(">HBB")
_NAIVE_DATETIME = struct.Struct(">HBBBBBI")
_NAIVE_TIME = struct.Struct(">BBBI")
_EPOCH_UTC = _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC)
_MICROSECOND = _dt.timedelta(microseconds=1)

# One tag byte per kind of value; numeric kinds that can compare equal share the
# int / float / rational tags so that equal numbers encode identically.
_T_NONE = b"N"
_T_INT_POS = b"I+"
_T_INT_NEG = b"I-"
_T_FLOAT = b"F"
_T_NAN = b"F" + _DOUBLE.pack(float("nan"))
_T_RATIONAL = b"Q"
_T_COMPLEX = b"C"
_T_STR = b"S"
_T_BYTES = b"B"
_T_SEQ = b"L"
_T_FROZENSET = b"R"
_T_DATE = b"d"
_T_NAIVE_DATETIME = b"n"
_T_AWARE_DATETIME = b"z"
_T_NAIVE_TIME = b"t"
_T_AWARE_TIME = b"T"
_T_TIMEDELTA = b"D"
_T_UUID = b"U"
_T_ENUM = b"E"

_key_repr = reprlib.Repr()
_key_repr.maxstring = 60
_key_repr.maxother = 60


class _Unencodable(Exception):
    """Internal: carries the offending (possibly nested) value up to the public entry."""

    def __init__(self, value: object) -> None:
        super().__init__(type(value).__qualname__)
        self.value = value


def _encode_int(value: int) -> bytes:
    if value < 0:
        tag, magnitude = _T_INT_NEG, -value
    else:
        tag, magnitude = _T_INT_POS, value
    size = (magnitude.bit_length() + 7) // 8
    return tag + _U32.pack(size) + magnitude.to_bytes(size, "big")


def _encode_float(value: float) -> bytes:
    if value.is_integer():  # also maps -0.0 to int 0
        return _encode_int(int(value))
    if value != value:  # every NaN payload becomes one canonical NaN
        return _T_NAN
    return _T_FLOAT + _DOUBLE.pack(value)


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
    return _T_RATIONAL + _length_prefixed(_encode_int(numerator)) + _encode_int(denominator)


def _encode_decimal(value: Decimal) -> bytes:
    if value.is_nan():
        return _T_NAN
    if value.is_infinite():
        return _encode_float(float(value))
    return _encode_ratio(*value.as_integer_ratio())


def _encode_complex(value: complex) -> bytes:
    if value.imag == 0:
        return _encode_float(value.real)
    return _T_COMPLEX + _DOUBLE.pack(value.real + 0.0) + _DOUBLE.pack(value.imag + 0.0)


def _encode_str(value: str) -> bytes:
    return _T_STR + value.encode("utf-8", "surrogatepass")


def _encode_bytes(value: bytes | bytearray | memoryview) -> bytes:
    return _T_BYTES + bytes(value)


def _length_prefixed(encoded: bytes) -> bytes:
    return _U32.pack(len(encoded)) + encoded


def _encode_sequence(value: tuple[object, ...] | list[object]) -> bytes:
    parts = [_T_SEQ, _U32.pack(len(value))]
    for item in value:
        encoded = _encode(item)
        parts.append(_U32.pack(len(encoded)))
        parts.append(encoded)
    return b"".join(parts)


def _encode_frozenset(value: frozenset[object] | set[object]) -> bytes:
    # Iteration order of a set depends on hash(); sorting the encodings removes it.
    items = sorted(_length_prefixed(_encode(item)) for item in value)
    return _T_FROZENSET + _U32.pack(len(items)) + b"".join(items)


def _encode_date(value: _dt.date) -> bytes:
    return _T_DATE + _DATE.pack(value.year, value.month, value.day)


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


def _encode_time(value: _dt.time) -> bytes:
    offset = value.utcoffset()
    if offset is None:
        return _T_NAIVE_TIME + _NAIVE_TIME.pack(
            value.hour, value.minute, value.second, value.microsecond
        )
    micros = ((value.hour * 60 + value.minute) * 60 + value.second) * 1_000_000
    return _T_AWARE_TIME + _encode_int(micros + value.microsecond - offset // _MICROSECOND)


def _encode_timedelta(value: _dt.timedelta) -> bytes:
    return _T_TIMEDELTA + _encode_int(value // _MICROSECOND)


def _encode_uuid(value: uuid.UUID) -> bytes:
    return _T_UUID + value.bytes


def _encode_enum(value: enum.Enum) -> bytes:
    cls = type(value)
    qualified = f"{cls.__module__}.{cls.__qualname__}"
    return _T_ENUM + _length_prefixed(_encode_str(qualified)) + _encode_str(value.name)


def _encode_none(_value: None) -> bytes:
    return _T_NONE


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


def canonical_key_bytes(key: object) -> bytes:
    """The stable, process-independent byte encoding of ``key`` used for hashing.

    Equal keys encode identically (``1``, ``1.0``, ``True``, ``Decimal(1)``);
    tuples and lists share one encoding. Supported: None, bool, int, float,
    complex, Decimal, Fraction, str, bytes-likes, tuple/list, frozenset/set,
    date, datetime, time, timedelta, UUID and Enum members (and their subclasses).
    Anything else raises :class:`KeyEncodingError`.

    Example::

        canonical_key_bytes(1) == canonical_key_bytes(1.0) == canonical_key_bytes(True)
        canonical_key_bytes(("a", 2)) == canonical_key_bytes(["a", 2])
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


def murmur3_32(data: bytes, seed: int = 0) -> int:
    """MurmurHash3 x86 32-bit of ``data`` as an unsigned int.

    Example::

        murmur3_32(b"") == 0
        0 <= murmur3_32(b"hello") < 2**32
    """
    return int(mmh3.hash(data, seed, signed=False))


# The one NaN object every float NaN key becomes: a dict finds a key by identity
# first, and NaN equals nothing, not even another NaN (canonical_key_bytes encodes
# every NaN alike, so they share a key group: they must share the state too).
_NAN_KEY = float("nan")


def canonical_nan(key: Any) -> Any:
    """``key``, or for a float NaN the one NaN object that stands for every NaN key.

    Called where a key is first seen (a routing cache miss, a columnar key index), not
    per record.

    Example: ``canonical_nan(float("nan")) is canonical_nan(-float("nan"))``
    """
    return _NAN_KEY if type(key) is float and key != key else key


def key_group_for_key(key: object, max_parallelism: int) -> int:
    """``murmur3_32(canonical_key_bytes(key)) % max_parallelism``.

    Example::

        0 <= key_group_for_key("user-7", 128) < 128
    """
    return murmur3_32(canonical_key_bytes(key)) % max_parallelism


def operator_index_for_key_group(max_parallelism: int, parallelism: int, key_group: int) -> int:
    """The subtask owning ``key_group``: ``key_group * parallelism // max_parallelism``.

    Example::

        operator_index_for_key_group(128, 3, 42) == 0
        operator_index_for_key_group(128, 3, 43) == 1
    """
    return key_group * parallelism // max_parallelism


def key_group_range_for_operator(
    max_parallelism: int, parallelism: int, operator_index: int
) -> range:
    """Key groups owned by subtask ``operator_index`` as a ``range`` (end exclusive).

    ``ceil(i * maxP / p) .. floor(((i + 1) * maxP - 1) / p)`` inclusive.

    Example::

        key_group_range_for_operator(128, 3, 0) == range(0, 43)
        key_group_range_for_operator(128, 3, 2) == range(86, 128)
    """
    validate_parallelism(parallelism, max_parallelism)
    if not 0 <= operator_index < parallelism:
        raise ConfigurationError(
            f"operator index {operator_index} out of range for parallelism {parallelism}"
        )
    start = (operator_index * max_parallelism + parallelism - 1) // parallelism
    end = ((operator_index + 1) * max_parallelism - 1) // parallelism
    return range(start, end + 1)


def _round_up_pow2(value: int) -> int:
    return 1 if value <= 1 else 1 << (value - 1).bit_length()


def default_max_parallelism(parallelism: int) -> int:
    """Flink's default: ``min(max(round_up_pow2(p + p // 2), 128), 32768)``.

    Example::

        default_max_parallelism(4) == 128
        default_max_parallelism(100) == 256
    """
    if parallelism < 1:
        raise ConfigurationError(f"parallelism must be >= 1, got {parallelism}")
    return min(max(_round_up_pow2(parallelism + parallelism // 2), 128), MAX_MAX_PARALLELISM)


def validate_max_parallelism(max_parallelism: int) -> int:
    """Return ``max_parallelism`` if it is an int in ``1..32768``, else raise ConfigurationError.

    Example::

        validate_max_parallelism(128) == 128
    """
    if (
        not isinstance(max_parallelism, int)
        or isinstance(max_parallelism, bool)
        or not 1 <= max_parallelism <= MAX_MAX_PARALLELISM
    ):
        raise ConfigurationError(
            f"max_parallelism must be an int in 1..{MAX_MAX_PARALLELISM}, got {max_parallelism!r}"
        )
    return max_parallelism


def validate_parallelism(parallelism: int, max_parallelism: int) -> int:
    """Return ``parallelism`` if ``1 <= parallelism <= max_parallelism``, else raise.

    Example::

        validate_parallelism(4, 128) == 4
    """
    validate_max_parallelism(max_parallelism)
    if (
        not isinstance(parallelism, int)
        or isinstance(parallelism, bool)
        or not 1 <= parallelism <= max_parallelism
    ):
        raise ConfigurationError(
            f"parallelism must be an int in 1..max_parallelism ({max_parallelism}), "
            f"got {parallelism!r}"
        )
    return parallelism


class KeyGroupAssigner:
    """Maps keys to key groups and channels, memoising per key (the per-record hot path).

    The cache is a plain dict keyed by the key itself (equal keys encode equally, so
    sharing an entry is correct); it is cleared when it outgrows ``cache_limit``.
    Unhashable keys (lists) are encoded on every call.

    Example::

        assigner = KeyGroupAssigner(128)
        assigner.key_group(("fr", 3)) == key_group_for_key(("fr", 3), 128)
        assigner.channels_for_batch(["a", "b"], parallelism=2)   # e.g. [1, 0]
    """

    __slots__ = ("_cache", "cache_limit", "max_parallelism")

    def __init__(self, max_parallelism: int, *, cache_limit: int = 1_000_000) -> None:
        self.max_parallelism = validate_max_parallelism(max_parallelism)
        self.cache_limit = cache_limit
        self._cache: dict[object, int] = {}

    @classmethod
    def shared(cls, max_parallelism: int) -> KeyGroupAssigner:
        """The process's assigner for ``max_parallelism``, shared by every user in it.

        A hash writer memoises the key group of every key it routes; the keyed backends
        of the same slot process need the key groups of the same keys at every
        snapshot (and the reduce of a job sees only keys a writer routed). One cache
        per process hashes each key once, not once per writer and once per backend:
        without it the first snapshot of a 50,000-key subtask hashed every key again
        (about 50 ms of the snapshot thread). Entries are only added or the cache
        cleared, each one dict operation, so threads may share it.

        Example: ``KeyGroupAssigner.shared(128) is KeyGroupAssigner.shared(128)``
        """
        assigner = _SHARED.get(max_parallelism)
        if assigner is None:
            with _SHARED_LOCK:
                assigner = _SHARED.setdefault(max_parallelism, cls(max_parallelism))
        return assigner

    def key_group(self, key: object) -> int:
        """The key group of ``key`` (see :func:`key_group_for_key`)."""
        try:
            kg = self._cache.get(key)
        except TypeError:  # unhashable: cannot be memoised, still has a key group
            return key_group_for_key(key, self.max_parallelism)
        if kg is None:
            kg = key_group_for_key(key, self.max_parallelism)
            if len(self._cache) >= self.cache_limit:
                self._cache.clear()
            self._cache[key] = kg
        return kg

    def channel(self, key: object, parallelism: int) -> int:
        """The downstream subtask (of ``parallelism``) that owns ``key``."""
        return self.key_group(key) * parallelism // self.max_parallelism

    def channels_for_batch(self, keys: list[object], parallelism: int) -> list[int]:
        """:meth:`channel` for every key of a batch, in order."""
        max_p = self.max_parallelism
        get = self._cache.get
        key_group = self.key_group
        out: list[int] = []
        append = out.append
        try:
            for key in keys:
                kg = get(key)
                if kg is None:
                    kg = key_group(key)
                append(kg * parallelism // max_p)
        except KeyEncodingError:  # a TypeError too, but retrying cannot help
            raise
        except TypeError:  # an unhashable key: redo the batch on the uncached path
            return [key_group(key) * parallelism // max_p for key in keys]
        return out

    def key_groups(self, keys: Iterable[object]) -> list[int]:
        """:meth:`key_group` of every key, in order (cached keys at C speed)."""
        keys = keys if isinstance(keys, (list, tuple, dict)) else list(keys)
        try:
            out: list[int | None] = list(map(self._cache.get, keys))
        except TypeError:  # an unhashable key: the uncached path handles it
            return [self.key_group(key) for key in keys]
        if None in out:
            key_group = self.key_group
            out = [key_group(key) if kg is None else kg for key, kg in zip(keys, out, strict=True)]
        return out  # type: ignore[return-value]

    def key_group_set(self, keys: list[object]) -> set[int]:
        """The distinct key groups of ``keys`` (cached keys at C speed, with no list of
        one key group per key: checking where a subtask's keys belong needs only these).

        Example: ``KeyGroupAssigner(128).key_group_set(["a", "a"]) == {key_group_for_key("a", 128)}``
        """
        get = self._cache.get
        try:
            groups: set[int | None] = set(map(get, keys))
        except TypeError:  # an unhashable key: the uncached path handles it
            return {self.key_group(key) for key in keys}
        if None in groups:
            groups.discard(None)
            key_group = self.key_group
            groups.update(key_group(key) for key in keys if get(key) is None)
        return groups  # type: ignore[return-value]

    def cache_size(self) -> int:
        """How many keys are memoised (for metrics and tests)."""
        return len(self._cache)


_SHARED: dict[int, KeyGroupAssigner] = {}
_SHARED_LOCK = threading.Lock()
