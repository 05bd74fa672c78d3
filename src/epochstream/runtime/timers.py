"""Event-time and processing-time timers of a keyed operator, kept in keyed state.

A timer is (key, namespace, timestamp) in one of two domains. Every registered timer is
an entry of the operator's namespaced value table ``__timers`` (namespace ``(domain,
timestamp, namespace)``), so timers are snapshotted with the key's other state at the
barrier, are in savepoints, and follow their key group on rescale. In memory a heap
per domain orders them for firing and a set answers "registered already?" without a
state lookup; both are rebuilt from the state after a restore.

Event-time timers fire when the operator's watermark reaches them (before the
watermark goes downstream); processing-time timers when the injected clock does.
Registrations reach the backend's change tracking in bulk: whoever snapshots the
backend calls ``flush()`` first (the operator's ``snapshot`` does). A
timer fires with its key set as the backend's current key; timers registered while
firing fire too if already due. Times are int milliseconds since the epoch.

Example::

    service = InternalTimerService(backend, clock_ms, fire=on_timer)
    backend.set_current_key("user-7")
    service.register_event_time_timer(None, 10_000)
    service.advance_watermark(10_000)      # calls on_timer(EVENT_TIME, 10_000, "user-7", None)
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import Any

from epochstream.core.events import MIN_WATERMARK
from epochstream.core.state_descriptors import ValueStateDescriptor
from epochstream.core.time import TimeDomain
from epochstream.exceptions import ConfigurationError
from epochstream.state.backends.base import KeyedStateBackend

__all__ = ["TIMERS_STATE", "InternalTimerService", "TimerService"]

#: Internal namespaced keyed state holding every registered timer.
TIMERS_STATE = "__timers"

_EVENT, _PROC = 0, 1
_DOMAINS = (TimeDomain.EVENT_TIME, TimeDomain.PROCESSING_TIME)

#: ``fire(domain, timestamp, key, namespace)``; the key is current when it is called.
FireTimer = Callable[[TimeDomain, int, Any, Any], None]


class InternalTimerService:
    """The timers of one keyed operator subtask (see the module docstring)."""

    def __init__(
        self,
        backend: KeyedStateBackend,
        clock_ms: Callable[[], int],
        fire: FireTimer,
        *,
        namespace_of: Callable[[Any], Any] | None = None,
    ) -> None:
        self._backend = backend
        self._clock_ms = clock_ms
        self._fire = fire
        self._table = backend.value_table(ValueStateDescriptor(TIMERS_STATE), namespaced=True)
        self._seq = itertools.count()
        self._queues: tuple[list[tuple[int, int, Any, Any]], ...] = ([], [])
        self._registered: set[tuple[int, int, Any, Any]] = set()
        self._written: list[Any] = []
        #: The operator's watermark (the last one it processed).
        self.current_watermark = MIN_WATERMARK
        # Namespaces come back from a snapshot in their canonical form (a window as a
        # plain tuple): the operator turns them back into its own type.
        restore_ns = namespace_of or (lambda ns: ns)
        for (key, (domain, ts, ns)), _ in list(self._table.items()):
            ns = restore_ns(ns)
            self._registered.add((domain, ts, key, ns))
            heapq.heappush(self._queues[domain], (ts, next(self._seq), key, ns))

    # ------------------------------------------------------------------ registration

    def _register(self, domain: int, key: Any, namespace: Any, timestamp: int) -> None:
        if type(timestamp) is not int:
            raise ConfigurationError(
                f"timer time must be int milliseconds since the epoch, got "
                f"{type(timestamp).__name__} {timestamp!r}"
            )
        entry = (domain, timestamp, key, namespace)
        if entry in self._registered:
            return
        self._registered.add(entry)
        stored = (key, (domain, timestamp, namespace))
        self._table[stored] = True
        self._written.append(stored)
        heapq.heappush(self._queues[domain], (timestamp, next(self._seq), key, namespace))

    def flush(self) -> None:
        """Declare the timers registered since the last call written (to the backend's
        change tracking, once per batch rather than per timer). The operator calls it
        before every snapshot."""
        if self._written:
            self._table.touched(self._written)
            self._written = []

    def _delete(self, domain: int, namespace: Any, timestamp: int) -> None:
        key = self._backend.current_key
        entry = (domain, timestamp, key, namespace)
        if entry not in self._registered:
            return
        self._registered.discard(entry)  # its heap entry is skipped when it comes up
        self._table.delete((key, (domain, timestamp, namespace)))

    def register_event_time_timer(self, namespace: Any, timestamp: int) -> None:
        """Fire for the current key and ``namespace`` once the watermark reaches ``timestamp``."""
        self._register(_EVENT, self._backend.current_key, namespace, timestamp)

    def register_event_time_timer_for(self, key: Any, namespace: Any, timestamp: int) -> None:
        """``register_event_time_timer`` for ``key`` (an operator that knows the key
        need not make it the backend's current key first)."""
        self._register(_EVENT, key, namespace, timestamp)

    def register_processing_time_timer(self, namespace: Any, timestamp: int) -> None:
        """Fire for the current key and ``namespace`` once processing time reaches ``timestamp``."""
        self._register(_PROC, self._backend.current_key, namespace, timestamp)

    def delete_event_time_timer(self, namespace: Any, timestamp: int) -> None:
        """Forget that event-time timer of the current key (no-op if there is none)."""
        self._delete(_EVENT, namespace, timestamp)

    def delete_processing_time_timer(self, namespace: Any, timestamp: int) -> None:
        """Forget that processing-time timer of the current key (no-op if there is none)."""
        self._delete(_PROC, namespace, timestamp)

    # ------------------------------------------------------------------ firing

    def _fire_due(self, domain: int, until: int) -> None:
        queue = self._queues[domain]
        registered = self._registered
        set_key = self._backend.set_current_key
        delete = self._table.delete
        fire = self._fire
        time_domain = _DOMAINS[domain]
        while queue and queue[0][0] <= until:
            ts, _, key, ns = heapq.heappop(queue)
            entry = (domain, ts, key, ns)
            if entry not in registered:
                continue  # deleted
            registered.discard(entry)
            delete((key, (domain, ts, ns)))
            set_key(key)
            fire(time_domain, ts, key, ns)

    def advance_watermark(self, watermark: int) -> None:
        """Fire every event-time timer at or below ``watermark``, in time order."""
        self.current_watermark = watermark
        self._fire_due(_EVENT, watermark)

    def on_processing_time(self, now_ms: int) -> None:
        """Fire every processing-time timer at or below ``now_ms``, in time order."""
        self._fire_due(_PROC, now_ms)

    def next_processing_time(self) -> int | None:
        """The earliest pending processing-time timer, or None."""
        queue = self._queues[_PROC]
        while queue:
            ts, _, key, ns = queue[0]
            if (_PROC, ts, key, ns) in self._registered:
                return ts
            heapq.heappop(queue)
        return None

    def current_processing_time(self) -> int:
        """Processing time (int ms) from the injected clock."""
        return self._clock_ms()

    def pending(self) -> int:
        """Registered timers, both domains (for tests and metrics)."""
        return len(self._registered)


class TimerService:
    """What ``ctx.timer_service()`` gives a process function: timers of the current key.

    Example::

        def process_element(self, value, ctx, out):
            ts = ctx.timer_service()
            ts.register_event_time_timer(ctx.timestamp() + 60_000)

        def on_timer(self, timestamp, ctx, out):
            out.collect((ctx.current_key, "no event for a minute"))
    """

    __slots__ = ("_internal",)

    def __init__(self, internal: InternalTimerService) -> None:
        self._internal = internal

    def current_processing_time(self) -> int:
        """Processing time, int ms since the epoch (the job's clock)."""
        return self._internal.current_processing_time()

    def current_watermark(self) -> int:
        """The operator's watermark (``es.WatermarkGenerator.MIN_WATERMARK`` before the first)."""
        return self._internal.current_watermark

    def register_event_time_timer(self, timestamp: int) -> None:
        """Call ``on_timer(timestamp, ...)`` once the watermark reaches ``timestamp``.

        Registering the same time twice for a key keeps one timer.
        """
        self._internal.register_event_time_timer(None, timestamp)

    def register_processing_time_timer(self, timestamp: int) -> None:
        """Call ``on_timer(timestamp, ...)`` once processing time reaches ``timestamp``."""
        self._internal.register_processing_time_timer(None, timestamp)

    def delete_event_time_timer(self, timestamp: int) -> None:
        """Forget the current key's event-time timer at ``timestamp`` (no-op if none)."""
        self._internal.delete_event_time_timer(None, timestamp)

    def delete_processing_time_timer(self, timestamp: int) -> None:
        """Forget the current key's processing-time timer at ``timestamp`` (no-op if none)."""
        self._internal.delete_processing_time_timer(None, timestamp)
