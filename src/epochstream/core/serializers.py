"""Value serializers of keyed state (per state descriptor).

A serializer turns a state value into bytes and back. Heap state keeps live objects
and serializes only when a snapshot is written; RocksDB state serializes on every
access. The default, :class:`PickleSerializer`, is pickle protocol 5 with a
by-value fallback (cloudpickle) for instances of classes defined in the job script.

Keys are not serialized by a descriptor: they are stored as their canonical bytes
(:mod:`epochstream.state.keyformat`), which both route them and identify them.

Example::

    es.state.ValueStateDescriptor("profile", serializer=es.state.JsonSerializer())
"""

from __future__ import annotations

import json
import pickle
from typing import Any, Protocol, runtime_checkable

import cloudpickle

from epochstream.exceptions import StateError, short_repr

__all__ = ["DEFAULT_SERIALIZER", "JsonSerializer", "PickleSerializer", "Serializer", "pickle_dumps"]


def pickle_dumps(value: Any) -> bytes:
    """Pickle protocol 5, or by value (cloudpickle) when plain pickle refuses: instances
    of classes a process knows only by value (defined in the job script) pickle too.
    ``pickle.loads`` reads both. Raises what cloudpickle raises when neither can.

    Example: ``pickle.loads(pickle_dumps(split_state))``
    """
    try:
        return pickle.dumps(value, protocol=5)
    except Exception:  # e.g. a class known only by value in this process
        return cloudpickle.dumps(value, protocol=5)


@runtime_checkable
class Serializer(Protocol):
    """Anything with ``dumps(value) -> bytes`` and ``loads(bytes) -> value``.

    Example::

        class Utf8:
            def dumps(self, value): return value.encode()
            def loads(self, data): return bytes(data).decode()
    """

    def dumps(self, value: Any) -> bytes: ...

    def loads(self, data: bytes) -> Any: ...


class PickleSerializer:
    """Pickle protocol 5; by-value pickling (cloudpickle) when plain pickle refuses.

    Example::

        s = PickleSerializer()
        s.loads(s.dumps({"a": 1})) == {"a": 1}
    """

    def dumps(self, value: Any) -> bytes:
        try:
            return pickle_dumps(value)
        except Exception as exc:
            raise StateError(
                f"state value {short_repr(value, 120)} of type {type(value).__qualname__} cannot "
                f"be pickled: {type(exc).__name__}: {exc}"
            ) from exc

    def loads(self, data: bytes) -> Any:
        return pickle.loads(data)

    def __eq__(self, other: object) -> bool:
        return type(other) is PickleSerializer

    def __hash__(self) -> int:
        return 0


class JsonSerializer:
    """JSON text in UTF-8: readable by any tool, for JSON-compatible values.

    Example::

        s = JsonSerializer()
        s.loads(s.dumps([1, "a"])) == [1, "a"]
    """

    def dumps(self, value: Any) -> bytes:
        try:
            return json.dumps(value, separators=(",", ":")).encode("utf-8")
        except (TypeError, ValueError) as exc:
            raise StateError(f"state value {short_repr(value, 120)} is not JSON: {exc}") from exc

    def loads(self, data: bytes) -> Any:
        return json.loads(bytes(data).decode("utf-8"))

    def __eq__(self, other: object) -> bool:
        return type(other) is JsonSerializer

    def __hash__(self) -> int:
        return 1


#: The serializer of descriptors that do not name one.
DEFAULT_SERIALIZER = PickleSerializer()
