"""The slot's asynchronous snapshot thread.

The synchronous part of a checkpoint (copying state, pre-committing sinks) runs on
the task thread at the barrier; writing keyed state to durable storage and
acknowledging runs here, so the task goes back to records at once.

The thread still shares the GIL with the task threads. Its work comes in C calls of
bounded length (a heap snapshot is pickled in chunks, see
:mod:`epochstream.state.backends.heap.files`), and while a job runs the process's GIL
switch interval is :data:`SNAPSHOT_SWITCH_INTERVAL_S` instead of CPython's 5 ms, so a
task thread that wants the GIL waits about 1 ms, not 5, each time the snapshot thread
holds it. Only while a job runs: a 1 ms interval at all times cost W1's row path 15 %
of its throughput (task threads of a slot hand the GIL to each other more often).

Example::

    ex = SnapshotExecutor(); ex.start()
    ex.submit(lambda: print("uploaded"))
    ex.stop()
"""

from __future__ import annotations

import logging
import queue
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = ["SNAPSHOT_SWITCH_INTERVAL_S", "SnapshotExecutor", "switch_interval"]

log = logging.getLogger(__name__)
_STOP = object()

#: The GIL switch interval while a snapshot job runs (see the module docstring).
SNAPSHOT_SWITCH_INTERVAL_S = 0.001

_switch_lock = threading.Lock()
_switch_users = 0
_switch_saved = 0.0


@contextmanager
def switch_interval(seconds: float) -> Iterator[None]:
    """The process's GIL switch interval is ``seconds`` (at most) inside the block, and
    what it was before once the last of the overlapping blocks has ended (several slots
    may share a process when tests run them as threads).

    Example::

        with switch_interval(0.001):
            write_snapshot()
    """
    global _switch_users, _switch_saved
    with _switch_lock:
        if _switch_users == 0:
            _switch_saved = sys.getswitchinterval()
        _switch_users += 1
        sys.setswitchinterval(min(seconds, _switch_saved))
    try:
        yield
    finally:
        with _switch_lock:
            _switch_users -= 1
            if _switch_users == 0:
                sys.setswitchinterval(_switch_saved)


class SnapshotExecutor:
    """One background thread running snapshot jobs in submission order."""

    def __init__(self, name: str = "snapshots") -> None:
        self._queue: queue.Queue[object] = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def submit(self, job: Callable[[], None]) -> None:
        """Run ``job`` on the snapshot thread."""
        self._queue.put(job)

    def _loop(self) -> None:
        while True:
            job = self._queue.get()
            if job is _STOP:
                return
            try:
                with switch_interval(SNAPSHOT_SWITCH_INTERVAL_S):
                    job()  # type: ignore[operator]
            except Exception:  # a job reports its own failure; keep serving the others
                log.exception("asynchronous snapshot job failed")

    def stop(self, timeout: float = 10.0) -> None:
        """Finish queued jobs, then end the thread."""
        self._queue.put(_STOP)
        if self._thread.is_alive():
            self._thread.join(timeout)

    def cancel(self, timeout: float = 5.0) -> None:
        """Drop queued jobs, let the running one end (up to ``timeout``), end the thread.

        A cancelled slot's snapshots will never be acknowledged; waiting for the one in
        flight keeps it from reading files the slot is about to delete.
        """
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        self.stop(timeout)
