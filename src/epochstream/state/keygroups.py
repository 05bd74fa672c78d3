"""Key groups: which subtask owns a key, stable across processes and restarts.

Flink's scheme (docs/architecture.md, State): a key is hashed into one of
``max_parallelism`` key groups, and each of the ``parallelism`` subtasks owns a
contiguous range of key groups. Keyed state is snapshotted per key group, so a
restore at a new parallelism hands each subtask the key groups of its new range.

The hash input is the key's stored bytes (:func:`epochstream.state.keyformat.encode_key`),
which do not depend on the process (Python's built-in hash is salted per process, so it
must never be used). Keys that compare equal in Python encode identically (``1``,
``1.0`` and ``True`` share one key group), because state is kept in dicts keyed by the
key itself.

Example::

    assigner = KeyGroupAssigner(max_parallelism=128)
    kg = assigner.key_group("user-7")                 # 0 <= kg < 128
    assigner.channel("user-7", parallelism=4) == operator_index_for_key_group(128, 4, kg)
    kg in key_group_range_for_operator(128, 4, assigner.channel("user-7", 4))
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

import mmh3

from epochstream.exceptions import ConfigurationError, KeyEncodingError
from epochstream.state.keyformat import encode_key

__all__ = [
    "MAX_MAX_PARALLELISM",
    "KeyGroupAssigner",
    "default_max_parallelism",
    "key_group_for_key",
    "key_group_of_bytes",
    "key_group_range_for_operator",
    "murmur3_32",
    "operator_index_for_key_group",
    "validate_max_parallelism",
    "validate_parallelism",
]

#: Upper bound for ``max_parallelism`` (Flink's ``1 << 15``).
MAX_MAX_PARALLELISM = 32768


def murmur3_32(data: bytes, seed: int = 0) -> int:
    """MurmurHash3 x86 32-bit of ``data`` as an unsigned int.

    Example::

        murmur3_32(b"") == 0
        0 <= murmur3_32(b"hello") < 2**32
    """
    return int(mmh3.hash(data, seed, signed=False))


def key_group_for_key(key: object, max_parallelism: int) -> int:
    """``murmur3_32(encode_key(key)) % max_parallelism``: the hash of the stored key bytes.

    Example::

        0 <= key_group_for_key("user-7", 128) < 128
    """
    return key_group_of_bytes(encode_key(key), max_parallelism)


def key_group_of_bytes(key_bytes: bytes, max_parallelism: int) -> int:
    """The key group of a key stored as ``key_bytes`` (its ``encode_key``): what
    :func:`key_group_for_key` gives for the key.

    Example: ``key_group_of_bytes(encode_key("u7"), 128) == key_group_for_key("u7", 128)``
    """
    return murmur3_32(key_bytes) % max_parallelism


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
