"""Reading keys back from their canonical bytes (the inverse of ``canonical_key_bytes``).

Keys are stored by their canonical encoding (section 5 of the architecture): the bytes
that route a key are the bytes that identify it in RocksDB, in savepoints and in the
state reader. Decoding returns the *canonical representative* of the key, which
compares equal to the original:

- numbers: an integral float or ``True`` comes back as ``int`` (``1.0 -> 1``), an exact
  fraction that is not a float as ``Fraction``, a ``Decimal`` as the number it equals;
- sequences: lists and tuples both come back as ``tuple``; sets as ``frozenset``;
- an ``Enum`` member comes back as the member if its class can be imported, else as the
  tuple ``(qualified class name, member name)``;
- ``str``, ``bytes``, ``None``, dates, times, datetimes, timedeltas and UUIDs exactly.

Example::

    decode_key(canonical_key_bytes(("user", 7))) == ("user", 7)
    decode_key(canonical_key_bytes(2.0)) == 2
"""

from __future__ import annotations

import datetime as _dt
import importlib
import struct
import uuid
from collections.abc import Callable
from fractions import Fraction
from typing import Any

from epochstream.exceptions import StateError
from epochstream.state.keygroups import canonical_key_bytes

__all__ = ["decode_key", "encode_key"]

_U32 = struct.Struct(">I")
_DOUBLE = struct.Struct(">d")
_DATE = struct.Struct(">HBB")
_NAIVE_DATETIME = struct.Struct(">HBBBBBI")
_NAIVE_TIME = struct.Struct(">BBBI")
_EPOCH_UTC = _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC)


#: The canonical bytes of a key: :func:`~epochstream.state.keygroups.canonical_key_bytes`
#: itself (one encoding routes a key and identifies it in state).
encode_key: Callable[[object], bytes] = canonical_key_bytes


def _int(data: bytes) -> int:
    # I+ / I- , 4-byte length, big-endian magnitude
    size = _U32.unpack_from(data, 2)[0]
    magnitude = int.from_bytes(data[6 : 6 + size], "big")
    return -magnitude if data[1:2] == b"-" else magnitude


def _prefixed(data: bytes, pos: int) -> tuple[bytes, int]:
    size = _U32.unpack_from(data, pos)[0]
    start = pos + 4
    return data[start : start + size], start + size


def _enum(qualified: str, name: str) -> object:
    module, _, cls_name = qualified.rpartition(".")
    try:
        cls: Any = importlib.import_module(module)
        for part in cls_name.split("."):
            cls = getattr(cls, part)
        return cls[name]
    except (ImportError, AttributeError, KeyError):
        return (qualified, name)


def decode_key(data: bytes) -> object:
    """The canonical representative of the key whose canonical bytes are ``data``."""
    try:
        return _decode(bytes(data))
    except (struct.error, IndexError, ValueError, UnicodeDecodeError) as exc:
        raise StateError(f"cannot decode key bytes {bytes(data)[:40]!r}: {exc}") from exc


def _decode(data: bytes) -> object:
    tag = data[:1]
    if tag == b"N":
        return None
    if tag == b"I":
        return _int(data)
    if tag == b"F":
        return _DOUBLE.unpack_from(data, 1)[0]
    if tag == b"S":
        return data[1:].decode("utf-8", "surrogatepass")
    if tag == b"B":
        return data[1:]
    if tag == b"L":
        count = _U32.unpack_from(data, 1)[0]
        pos, items = 5, []
        for _ in range(count):
            item, pos = _prefixed(data, pos)
            items.append(_decode(item))
        return tuple(items)
    if tag == b"R":
        count = _U32.unpack_from(data, 1)[0]
        pos, members = 5, []
        for _ in range(count):
            item, pos = _prefixed(data, pos)
            members.append(_decode(item))
        return frozenset(members)
    if tag == b"Q":
        numerator, pos = _prefixed(data, 1)
        return Fraction(_int(numerator), _int(data[pos:]))
    if tag == b"C":
        real, imag = _DOUBLE.unpack_from(data, 1)[0], _DOUBLE.unpack_from(data, 9)[0]
        return complex(real, imag)
    if tag == b"d":
        return _dt.date(*_DATE.unpack_from(data, 1))
    if tag == b"n":
        return _dt.datetime(*_NAIVE_DATETIME.unpack_from(data, 1))
    if tag == b"z":
        return _EPOCH_UTC + _dt.timedelta(microseconds=_int(data[1:]))
    if tag == b"t":
        return _dt.time(*_NAIVE_TIME.unpack_from(data, 1))
    if tag == b"T":
        micros = _int(data[1:])
        return (_dt.datetime.min.replace(tzinfo=_dt.UTC) + _dt.timedelta(microseconds=micros)).timetz()
    if tag == b"D":
        return _dt.timedelta(microseconds=_int(data[1:]))
    if tag == b"U":
        return uuid.UUID(bytes=data[1:17])
    if tag == b"E":
        qualified, pos = _prefixed(data, 1)
        return _enum(str(_decode(qualified)), str(_decode(data[pos:])))
    raise ValueError(f"unknown key tag {tag!r}")
