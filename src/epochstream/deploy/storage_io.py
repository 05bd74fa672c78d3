"""The job master's storage thread: checkpoint I/O off the event thread.

Writing ``_metadata``, deleting discarded checkpoints and unreferenced shared files can
take long on an object store. The coordinator hands such work to a
:class:`StorageWorker`; it runs the work in order on its own thread and, when asked,
puts ``("io-done", callback, error)`` on the job master's event queue so the callback
runs back on the event thread.

Example::

    worker = StorageWorker(events); worker.start()
    worker.submit(lambda: fs.write_atomic(path, data), done=lambda err: print("written", err))
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["StorageWorker"]

log = logging.getLogger(__name__)
_STOP = object()
Done = Callable[[BaseException | None], None]


class StorageWorker:
    """One thread running storage work in submission order."""

    def __init__(self, events: queue.Queue[Any], name: str = "checkpoint-io") -> None:
        self._events = events
        self._queue: queue.Queue[Any] = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def start(self) -> None:
        """Start the thread."""
        self._thread.start()

    def submit(self, work: Callable[[], None], done: Done | None = None) -> None:
        """Run ``work``; then ``done(error)`` on the event thread (when given)."""
        self._queue.put((work, done))

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            work, done = item
            error: BaseException | None = None
            try:
                work()
            except Exception as exc:  # reported through done, or logged when nobody waits
                error = exc
                if done is None:
                    log.warning("checkpoint storage work failed: %r", exc)
            if done is not None:
                self._events.put(("io-done", done, error))

    def stop(self, timeout: float = 60.0) -> None:
        """Finish the queued work (deletions included), then end the thread."""
        self._queue.put(_STOP)
        if self._thread.is_alive():
            self._thread.join(timeout)
