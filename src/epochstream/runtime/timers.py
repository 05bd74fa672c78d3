"""Processing-time timers of keyed process functions, kept in keyed state.

A timer is (key, timestamp): the registered timestamps of each key live in an
internal keyed value state (``__timers``) of the operator's keyed-state backend, so
they are snapshotted with the key's other state at the barrier and follow its key
group on rescale. An in-memory heap
orders them for firing; it is rebuilt from the table after a restore, and entries
whose timer was deleted are skipped lazily. Timers fire on the task thread between
batches, so ``on_timer`` sees state exactly as ``process_element`` does.

Timestamps are wall-clock seconds (``time.time()``), as Flink's processing time is
wall-clock milliseconds. Timers still pending when the input ends are not fired.

Example::

    service = TimerService(backend)
    backend.set_current_key("user-7")
    service.register_processing_time_timer(service.current_processing_time() + 30)
"""

from __future__ import annotations

import heapq
import itertools
import time
from typing import Any

from epochstream.state.backends.base import KeyedStateBackend
from epochstream.state.descriptors import ValueStateDescriptor

__all__ = ["TIMERS_STATE", "TimerService"]

#: Internal keyed-state table holding each key's registered timer timestamps.
TIMERS_STATE = "__timers"


class TimerService:
    """Register and delete processing-time timers for the current key."""

    def __init__(self, backend: KeyedStateBackend) -> None:
        self._backend = backend
        self._table = backend.value_table(ValueStateDescriptor(TIMERS_STATE))
        self._seq = itertools.count()
        self._heap: list[tuple[float, int, Any]] = [
            (ts, next(self._seq), key) for key, stamps in self._table.items() for ts in stamps
        ]
        heapq.heapify(self._heap)

    def _set(self, key: Any, stamps: tuple[float, ...]) -> None:
        if stamps:
            self._table[key] = stamps
        else:
            self._table.delete(key)
        self._table.touched((key,))

    def current_processing_time(self) -> float:
        """Wall-clock time in seconds since the epoch."""
        return time.time()

    def register_processing_time_timer(self, timestamp: float) -> None:
        """Call ``on_timer(timestamp, ...)`` for the current key once time passes ``timestamp``.

        Registering the same timestamp twice for a key keeps one timer.
        """
        key = self._backend.current_key
        stamps = self._table.get(key, ())
        if timestamp in stamps:
            return
        self._set(key, (*stamps, timestamp))
        heapq.heappush(self._heap, (timestamp, next(self._seq), key))

    def delete_processing_time_timer(self, timestamp: float) -> None:
        """Forget the current key's timer at ``timestamp`` (no-op if there is none)."""
        key = self._backend.current_key
        stamps = self._table.get(key, ())
        if timestamp in stamps:
            self._set(key, tuple(t for t in stamps if t != timestamp))

    def next_deadline(self) -> float | None:
        """The earliest registered timestamp, or None."""
        heap = self._heap
        while heap:
            ts, _, key = heap[0]
            if ts in self._table.get(key, ()):
                return ts
            heapq.heappop(heap)  # deleted timer: drop its stale heap entry
        return None

    def pop_due(self, now: float) -> list[tuple[float, Any]]:
        """Remove and return every (timestamp, key) with timestamp <= now, in time order."""
        due: list[tuple[float, Any]] = []
        heap = self._heap
        table = self._table
        while heap and heap[0][0] <= now:
            ts, _, key = heapq.heappop(heap)
            stamps = table.get(key, ())
            if ts not in stamps:
                continue
            self._set(key, tuple(t for t in stamps if t != ts))
            due.append((ts, key))
        return due
