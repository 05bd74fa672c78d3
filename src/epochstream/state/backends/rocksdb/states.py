"""The RocksDB backend's state objects: every access is a serialized read or write.

Layout (docs/architecture.md, State), one column family per state::

    key   = key group (2 bytes, big-endian) | len(key) (4) | key | len(ns) (4) | ns
    value = header (1 byte: 0 plain, 1 with TTL) [| timestamp (8, float)] | serialized value

``key``, ``ns`` and map user keys are their stored bytes (:mod:`epochstream.state.keyformat`).
Map state stores one entry per user key (``key | canonical user key``); list state one
entry per element (``key | sequence number (8)``) plus a counter entry at ``key``, so
``add`` never rewrites the list. A key group range is a contiguous key range, so a
rescale copies ranges, not records.

Example::

    prefix = encode_prefix(kg, encode_key("user-7"))
    value = encode_value(serializer.dumps(42), None)
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from epochstream.core.serializers import Serializer
from epochstream.core.state_descriptors import (
    AggregatingStateDescriptor,
    ReducingStateDescriptor,
    StateDescriptor,
    ValueStateDescriptor,
)
from epochstream.core.state_ttl import TtlConfig
from epochstream.exceptions import StateError
from epochstream.state.backends.base import base_kind, is_namespaced
from epochstream.state.keyformat import decode_key, encode_key
from epochstream.state.states import (
    AggregatingState,
    ListState,
    MapState,
    ReducingState,
    ValueState,
    copy_value,
)

__all__ = [
    "NO_KEY",
    "ROCKS_STATE_CLASSES",
    "KeyAccess",
    "RocksColumn",
    "decode_prefix",
    "encode_prefix",
    "encode_value",
    "key_group_bounds",
    "prefix_end",
    "split_value",
]

_U32 = struct.Struct(">I")
_U16 = struct.Struct(">H")
_SEQ = struct.Struct(">Q")
_TS = struct.Struct(">d")
_PLAIN = b"\x00"
_TIMED = b"\x01"
_MISSING: Any = object()
#: The current key before any is set.
NO_KEY: Any = object()


def encode_prefix(kg: int, key: bytes, namespace: bytes = b"") -> bytes:
    """The RocksDB key of (key group, canonical key, namespace)."""
    return _U16.pack(kg) + _U32.pack(len(key)) + key + _U32.pack(len(namespace)) + namespace


def decode_prefix(data: bytes) -> tuple[int, bytes, bytes, bytes]:
    """``(key group, key bytes, namespace bytes, rest)`` of a RocksDB key."""
    kg = _U16.unpack_from(data)[0]
    klen = _U32.unpack_from(data, 2)[0]
    key = data[6 : 6 + klen]
    pos = 6 + klen
    nlen = _U32.unpack_from(data, pos)[0]
    ns = data[pos + 4 : pos + 4 + nlen]
    return kg, key, ns, data[pos + 4 + nlen :]


def key_group_bounds(start: int, stop: int) -> tuple[bytes, bytes]:
    """``(from_key, upper_bound)``: the RocksDB keys of key groups ``start .. stop - 1``
    are exactly those with ``from_key <= key < upper_bound`` (the key group leads the
    key, big-endian, so each key group is one contiguous run in key order).

    Example: ``key_group_bounds(3, 5) == (b"\\x00\\x03", b"\\x00\\x05")``
    """
    upper = _U16.pack(stop) if stop <= 0xFFFF else b"\xff\xff\xff"
    return _U16.pack(start), upper


def prefix_end(prefix: bytes) -> bytes:
    """The smallest byte string greater than every string starting with ``prefix``."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return b"\xff" * (len(prefix) + 1)
    return stripped[:-1] + bytes([stripped[-1] + 1])


def encode_value(data: bytes, timestamp: float | None) -> bytes:
    """A stored value: header, optional TTL timestamp, serialized bytes."""
    if timestamp is None:
        return _PLAIN + data
    return _TIMED + _TS.pack(timestamp) + data


def split_value(stored: bytes) -> tuple[bytes, float | None]:
    """``(serialized bytes, timestamp or None)`` of a stored value."""
    if stored[:1] == _TIMED:
        return stored[9:], _TS.unpack_from(stored, 1)[0]
    return stored[1:], None


class RocksColumn:
    """One state's column family with its serializer and TTL settings."""

    __slots__ = ("cf", "kind", "name", "serializer", "ttl")

    def __init__(
        self, name: str, kind: str, cf: Any, serializer: Serializer, ttl: TtlConfig | None
    ):
        self.name = name
        self.kind = kind
        self.cf = cf
        self.serializer = serializer
        self.ttl = ttl

    def scan(self, lo: bytes, hi: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Entries with ``lo <= key < hi``, in key order."""
        from rocksdict import ReadOptions

        options = ReadOptions()
        options.set_iterate_upper_bound(hi)  # the lower bound comes from seeking (from_key)
        yield from self.cf.items(from_key=lo, read_opt=options)


class KeyAccess:
    """The current key's RocksDB prefix, computed once per key (shared by the states)."""

    __slots__ = ("key", "key_group", "prefix_cache")

    def __init__(self) -> None:
        self.key: Any = NO_KEY
        self.prefix_cache: bytes | None = None
        self.key_group: Callable[[Any], int] | None = None

    def prefix(self, name: str) -> bytes:
        """``key group | len | key | len 0``: the prefix of the key's entries without namespace."""
        if self.key is NO_KEY:
            raise StateError(
                f"state {name!r} accessed with no current key; keyed state is only "
                "available while processing a keyed record or timer"
            )
        cached = self.prefix_cache
        if cached is None:
            assert self.key_group is not None
            cached = self.prefix_cache = encode_prefix(
                self.key_group(self.key), encode_key(self.key)
            )
        return cached

    def namespaced_prefix(self, name: str, namespace: bytes) -> bytes:
        """The prefix of the key's entries in ``namespace`` (canonical bytes)."""
        return self.prefix(name)[:-4] + _U32.pack(len(namespace)) + namespace


class _RocksState:
    __slots__ = ("_access", "_clock", "_col", "_kind", "_ns", "namespaced")

    def __init__(self, column: RocksColumn, access: KeyAccess, clock: Any) -> None:
        self._col = column
        self._access = access
        self._clock = clock
        self._kind = base_kind(column.kind)
        self.namespaced = is_namespaced(column.kind)
        self._ns: bytes | None = None

    @property
    def descriptor(self) -> StateDescriptor | None:
        return getattr(self, "_descriptor", None)

    def set_namespace(self, namespace: Any) -> None:
        if not self.namespaced:
            raise StateError(f"state {self._col.name!r} is not namespaced")
        self._ns = encode_key(namespace)

    def _prefix(self) -> bytes:
        if self.namespaced:
            if self._ns is None:
                raise StateError(f"state {self._col.name!r} accessed with no namespace set")
            return self._access.namespaced_prefix(self._col.name, self._ns)
        return self._access.prefix(self._col.name)

    def _store(self, value: Any) -> bytes:
        ts = None if self._col.ttl is None else self._clock.wall()
        return encode_value(self._col.serializer.dumps(value), ts)

    def _load(self, db_key: bytes, stored: bytes | None) -> Any:
        """The live value of ``stored`` (``_MISSING`` if absent or expired, then deleted)."""
        if stored is None:
            return _MISSING
        data, ts = split_value(stored)
        ttl = self._col.ttl
        if ttl is not None and ts is not None:
            now = self._clock.wall()
            if now - ts >= ttl.seconds:
                self._col.cf.delete(db_key)
                return _MISSING
            value = self._col.serializer.loads(data)
            if ttl.update_on_read:
                self._col.cf.put(db_key, encode_value(data, now))
            return value
        return self._col.serializer.loads(data)

    def clear(self) -> None:
        prefix = self._prefix()
        if self._kind in ("list", "map"):
            self._col.cf.delete_range(prefix, prefix_end(prefix))
        else:
            self._col.cf.delete(prefix)


class RocksValueState(_RocksState, ValueState):
    """See :class:`~epochstream.state.states.ValueState`."""

    __slots__ = ("_default", "_descriptor")

    def __init__(self, column: RocksColumn, access: KeyAccess, clock: Any, descriptor: Any):
        super().__init__(column, access, clock)
        self._descriptor = descriptor
        self._default = descriptor.default if isinstance(descriptor, ValueStateDescriptor) else None

    def value(self) -> Any:
        prefix = self._prefix()
        found = self._load(prefix, self._col.cf.get(prefix))
        return copy_value(self._default) if found is _MISSING else found

    def update(self, value: Any) -> None:
        if value is None:
            self.clear()
            return
        self._col.cf.put(self._prefix(), self._store(value))


class RocksListState(_RocksState, ListState):
    """See :class:`~epochstream.state.states.ListState` (one entry per element)."""

    __slots__ = ("_descriptor",)

    def __init__(self, column: RocksColumn, access: KeyAccess, clock: Any, descriptor: Any):
        super().__init__(column, access, clock)
        self._descriptor = descriptor

    def _elements(self) -> list[Any]:
        prefix = self._prefix()
        out = []
        for db_key, stored in self._col.scan(prefix + b"\x00", prefix_end(prefix)):
            value = self._load(db_key, stored)
            if value is not _MISSING:
                out.append(value)
        return out

    def get(self) -> list[Any]:
        return self._elements()

    def _append(self, values: Iterable[Any]) -> None:
        prefix = self._prefix()
        cf = self._col.cf
        counter = cf.get(prefix)
        seq = 0 if counter is None else _SEQ.unpack(counter)[0]
        for value in values:
            cf.put(prefix + _SEQ.pack(seq), self._store(value))
            seq += 1
        cf.put(prefix, _SEQ.pack(seq))

    def add(self, value: Any) -> None:
        self._append((value,))

    def add_all(self, values: Iterable[Any]) -> None:
        items = list(values)
        if items:
            self._append(items)

    def update(self, values: Iterable[Any]) -> None:
        items = list(values)
        self.clear()
        if items:
            self._append(items)


class RocksMapState(_RocksState, MapState):
    """See :class:`~epochstream.state.states.MapState` (one entry per user key)."""

    __slots__ = ("_descriptor",)

    def __init__(self, column: RocksColumn, access: KeyAccess, clock: Any, descriptor: Any):
        super().__init__(column, access, clock)
        self._descriptor = descriptor

    def _entries(self) -> Iterator[tuple[Any, Any]]:
        prefix = self._prefix()
        n = len(prefix)
        for db_key, stored in self._col.scan(prefix, prefix_end(prefix)):
            value = self._load(db_key, stored)
            if value is not _MISSING:
                yield decode_key(db_key[n:]), value

    def get(self, user_key: Any, default: Any = None) -> Any:
        db_key = self._prefix() + encode_key(user_key)
        found = self._load(db_key, self._col.cf.get(db_key))
        return default if found is _MISSING else found

    def put(self, user_key: Any, value: Any) -> None:
        self._col.cf.put(self._prefix() + encode_key(user_key), self._store(value))

    def put_all(self, entries: Mapping[Any, Any]) -> None:
        for user_key, value in entries.items():
            self.put(user_key, value)

    def remove(self, user_key: Any) -> None:
        self._col.cf.delete(self._prefix() + encode_key(user_key))

    def contains(self, user_key: Any) -> bool:
        return self.get(user_key, _MISSING) is not _MISSING

    def keys(self) -> list[Any]:
        return [k for k, _ in self._entries()]

    def values(self) -> list[Any]:
        return [v for _, v in self._entries()]

    def items(self) -> list[tuple[Any, Any]]:
        return list(self._entries())


class RocksReducingState(_RocksState, ReducingState):
    """See :class:`~epochstream.state.states.ReducingState`."""

    __slots__ = ("_descriptor", "_reduce")

    def __init__(self, column: RocksColumn, access: KeyAccess, clock: Any, descriptor: Any):
        super().__init__(column, access, clock)
        assert isinstance(descriptor, ReducingStateDescriptor)
        self._descriptor = descriptor
        self._reduce: Any = descriptor.reduce_fn

    def get(self) -> Any:
        prefix = self._prefix()
        found = self._load(prefix, self._col.cf.get(prefix))
        return None if found is _MISSING else found

    def add(self, value: Any) -> None:
        prefix = self._prefix()
        found = self._load(prefix, self._col.cf.get(prefix))
        self._col.cf.put(
            prefix, self._store(value if found is _MISSING else self._reduce(found, value))
        )


class RocksAggregatingState(_RocksState, AggregatingState):
    """See :class:`~epochstream.state.states.AggregatingState`."""

    __slots__ = ("_descriptor", "_fn")

    def __init__(self, column: RocksColumn, access: KeyAccess, clock: Any, descriptor: Any):
        super().__init__(column, access, clock)
        assert isinstance(descriptor, AggregatingStateDescriptor)
        self._descriptor = descriptor
        self._fn: Any = descriptor.aggregate_function

    def get(self) -> Any:
        prefix = self._prefix()
        found = self._load(prefix, self._col.cf.get(prefix))
        return None if found is _MISSING else self._fn.get_result(found)

    def add(self, value: Any) -> None:
        prefix = self._prefix()
        found = self._load(prefix, self._col.cf.get(prefix))
        acc = self._fn.create_accumulator() if found is _MISSING else found
        self._col.cf.put(prefix, self._store(self._fn.add(value, acc)))


ROCKS_STATE_CLASSES: dict[str, type[_RocksState]] = {
    "value": RocksValueState,
    "list": RocksListState,
    "map": RocksMapState,
    "reducing": RocksReducingState,
    "aggregating": RocksAggregatingState,
    "ns-value": RocksValueState,
    "ns-list": RocksListState,
}
