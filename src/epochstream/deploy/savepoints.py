"""Savepoint requests from clients (``JobClient``, the job endpoint) to the job master.

A request is made on any thread and answered on the job master's event thread; the
caller blocks in :meth:`SavepointRequest.wait`. Savepoints land in
``<directory>/savepoint-<job id prefix>-<random>`` (Flink's naming), so several
savepoints of several jobs can share a directory.

Example::

    request = master.request_savepoint("/data/savepoints", terminate=False)
    path = request.wait(timeout=300)
"""

from __future__ import annotations

import threading
import uuid

from epochstream.exceptions import CheckpointError

__all__ = ["SavepointRequest", "savepoint_name"]


def savepoint_name(job_id: str) -> str:
    """A fresh savepoint directory name for ``job_id``.

    Example::

        savepoint_name("3f2a9c1e...")   # "savepoint-3f2a9c-1b2c3d4e5f60"
    """
    return f"savepoint-{job_id[:6]}-{uuid.uuid4().hex[:12]}"


class SavepointRequest:
    """One savepoint asked for: where, whether it stops the job, and its outcome."""

    def __init__(self, directory: str | None, *, terminate: bool) -> None:
        self.directory = directory
        self.terminate = terminate
        self.checkpoint_id: int | None = None
        self.path: str | None = None
        self.error: str | None = None
        self._done = threading.Event()

    def succeed(self, path: str) -> None:
        """The savepoint completed at ``path``."""
        self.path = path
        self._done.set()

    def fail(self, reason: str) -> None:
        """The savepoint could not be taken."""
        self.error = reason
        self._done.set()

    @property
    def done(self) -> bool:
        """Whether it completed or failed."""
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> str:
        """Block until done; the savepoint's path, or :class:`CheckpointError`."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"savepoint not done after {timeout} s")
        if self.error is not None:
            raise CheckpointError(f"savepoint failed: {self.error}")
        assert self.path is not None
        return self.path
