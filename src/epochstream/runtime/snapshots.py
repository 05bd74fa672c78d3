"""The slot's asynchronous snapshot thread.

The synchronous part of a checkpoint (copying state, pre-committing sinks) runs on
the task thread at the barrier; writing keyed state to durable storage and
acknowledging runs here, so the task goes back to records at once.

Example::

    ex = SnapshotExecutor(); ex.start()
    ex.submit(lambda: print("uploaded"))
    ex.stop()
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

__all__ = ["SnapshotExecutor"]

log = logging.getLogger(__name__)
_STOP = object()


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
