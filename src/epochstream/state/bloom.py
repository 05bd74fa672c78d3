"""Bloom filters over canonical key bytes, and a two-generation filter that forgets.

:class:`BloomFilter` answers "certainly never added" or "maybe added"; positions come
from MurmurHash3 (x64, 128 bit) of the key's canonical bytes by double hashing, so a
filter means the same in every process and after a restore (never Python's ``hash()``).

:class:`AgingBloomFilter` keeps two generations, rotated every ``ttl`` seconds of the
injected clock: an id added at time ``t`` is remembered at least until ``t + ttl``, and
forgotten after at most ``2 * ttl``. Filters of several subtasks merge by OR (a rescale
hands every subtask the union), which keeps "never added" answers correct.

Example::

    f = AgingBloomFilter(capacity=10_000, fp_rate=0.01, ttl=3600.0, now=clock.wall())
    f.might_contain(b"id-1")     # False
    f.add(b"id-1", clock.wall())
    f.might_contain(b"id-1")     # True
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import mmh3

from epochstream.exceptions import ConfigurationError

__all__ = ["AgingBloomFilter", "BloomFilter", "BloomState"]

_MASK64 = (1 << 64) - 1


class BloomFilter:
    """``bits`` bits and ``hashes`` probes per key.

    Example::

        f = BloomFilter.sized(capacity=1000, fp_rate=0.01)
        f.add(b"k"); f.might_contain(b"k")   # True
    """

    __slots__ = ("bits", "data", "hashes")

    def __init__(self, bits: int, hashes: int, data: bytearray | None = None) -> None:
        self.bits = bits
        self.hashes = hashes
        self.data = data if data is not None else bytearray((bits + 7) // 8)

    @staticmethod
    def sized(capacity: int, fp_rate: float) -> BloomFilter:
        """The optimal filter for ``capacity`` keys at false-positive rate ``fp_rate``."""
        if capacity < 1:
            raise ConfigurationError(f"Bloom filter capacity must be >= 1, got {capacity}")
        if not 0.0 < fp_rate < 1.0:
            raise ConfigurationError(f"Bloom filter fp_rate must be in (0, 1), got {fp_rate}")
        bits = max(8, math.ceil(-capacity * math.log(fp_rate) / (math.log(2) ** 2)))
        hashes = max(1, round(bits / capacity * math.log(2)))
        return BloomFilter(bits, hashes)

    def positions(self, key: bytes) -> list[int]:
        """The bits of ``key`` (the same in every filter of this size and hash count)."""
        h1, h2 = mmh3.hash64(key, signed=False)
        bits = self.bits
        return [((h1 + i * h2) & _MASK64) % bits for i in range(self.hashes)]

    def add(self, key: bytes) -> None:
        self.add_positions(self.positions(key))

    def add_positions(self, positions: list[int]) -> None:
        data = self.data
        for p in positions:
            data[p >> 3] |= 1 << (p & 7)

    def might_contain(self, key: bytes) -> bool:
        return self.has_positions(self.positions(key))

    def has_positions(self, positions: list[int]) -> bool:
        data = self.data
        for p in positions:
            if not data[p >> 3] & (1 << (p & 7)):
                return False
        return True

    def merge(self, other: BloomFilter) -> None:
        """OR ``other`` (same size and hashes) into this filter."""
        if (other.bits, other.hashes) != (self.bits, self.hashes):
            raise ConfigurationError(
                f"cannot merge Bloom filters of {other.bits}/{other.hashes} and "
                f"{self.bits}/{self.hashes} bits/hashes (the dedup settings changed)"
            )
        merged = int.from_bytes(self.data, "little") | int.from_bytes(other.data, "little")
        self.data = bytearray(merged.to_bytes(len(self.data), "little"))


@dataclass(frozen=True)
class BloomState:
    """A picklable :class:`AgingBloomFilter` (what a checkpoint stores).

    Example::

        state = aging.snapshot()           # stored in the checkpoint
        restored = AgingBloomFilter(capacity, fp_rate, ttl, now)
        restored.restore([state])
    """

    bits: int
    hashes: int
    current: bytes
    previous: bytes
    started: float


class AgingBloomFilter:
    """Two Bloom generations rotated every ``ttl`` seconds (module docstring)."""

    def __init__(self, capacity: int, fp_rate: float, ttl: float, now: float) -> None:
        if not ttl > 0:
            raise ConfigurationError(f"AgingBloomFilter ttl must be > 0, got {ttl}")
        self.current = BloomFilter.sized(capacity, fp_rate)
        self.previous = BloomFilter(self.current.bits, self.current.hashes)
        self.ttl = ttl
        self.started = now

    def might_contain(self, key: bytes) -> bool:
        return self.might_contain_positions(self.current.positions(key))

    def might_contain_positions(self, positions: list[int]) -> bool:
        """:meth:`might_contain` for ``positions = filter.current.positions(key)``."""
        return self.current.has_positions(positions) or self.previous.has_positions(positions)

    def add(self, key: bytes, now: float) -> None:
        self.rotate(now)
        self.current.add(key)

    def rotate(self, now: float) -> None:
        """Start a new generation once the current one is ``ttl`` old."""
        if now - self.started >= self.ttl:
            gone = now - self.started >= 2 * self.ttl  # both generations are past ttl
            self.previous = (
                BloomFilter(self.current.bits, self.current.hashes) if gone else self.current
            )
            self.current = BloomFilter(self.current.bits, self.current.hashes)
            self.started = now

    def snapshot(self) -> BloomState:
        return BloomState(
            self.current.bits,
            self.current.hashes,
            bytes(self.current.data),
            bytes(self.previous.data),
            self.started,
        )

    def restore(self, states: list[BloomState]) -> None:
        """Merge every subtask's checkpointed filter into this one (rescale-safe)."""
        for i, state in enumerate(states):
            current = BloomFilter(state.bits, state.hashes, bytearray(state.current))
            previous = BloomFilter(state.bits, state.hashes, bytearray(state.previous))
            if i == 0:
                self.current, self.previous = current, previous
                self.started = state.started
                continue
            self.current.merge(current)
            self.previous.merge(previous)
            # The newest generation start rotates last: every merged id stays >= ttl.
            self.started = max(self.started, state.started)
