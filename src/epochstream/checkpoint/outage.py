"""Whether checkpoint storage is reachable, as the job master last saw it.

One :class:`StorageOutage` per job. It turns UNAVAILABLE when a checkpoint fails, or an
attempt fails to restore, because storage could not be reached
(:func:`~epochstream.core.storage_faults.is_unavailable`), and AVAILABLE again when a
checkpoint completes or a restore succeeds. While unavailable it logs "storage
unavailable, retrying (since T, last error E)" when the outage starts and then at most
once every ``log_every`` seconds (not once per retry), and :meth:`StorageOutage.status`
gives the same for ``GET /v1/job`` and the dashboard.

Written on the job master's event thread, read from the endpoint's threads (one lock,
held only to copy).

Example::

    outage = StorageOutage("job-1")
    outage.failed("connection refused", now=time.time())
    outage.status()["storage_state"] == "UNAVAILABLE"
    outage.recovered(now=time.time())
"""

from __future__ import annotations

import logging
import threading
import time
from enum import Enum
from typing import Any

__all__ = ["StorageOutage", "StorageState"]

log = logging.getLogger(__name__)


class StorageState(Enum):
    """Checkpoint storage as last seen."""

    AVAILABLE = "AVAILABLE"
    UNAVAILABLE = "UNAVAILABLE"


class StorageOutage:
    """The current storage outage of one job, if any (see module doc)."""

    def __init__(self, job_id: str, *, log_every: float = 30.0) -> None:
        self._job = job_id[:8]
        self._log_every = log_every
        self._lock = threading.Lock()
        self._state = StorageState.AVAILABLE
        self._since: float | None = None
        self._last_error: str | None = None
        self._failures = 0
        self._logged_at: float | None = None

    @property
    def state(self) -> StorageState:
        """AVAILABLE or UNAVAILABLE."""
        return self._state

    @property
    def unavailable(self) -> bool:
        """True during an outage."""
        return self._state is StorageState.UNAVAILABLE

    def failed(self, error: str, *, now: float) -> None:
        """A storage operation failed because storage cannot be reached (``now``: wall time)."""
        first_line = error.splitlines()[0] if error else "unknown error"
        with self._lock:
            if self._state is StorageState.AVAILABLE:
                self._state = StorageState.UNAVAILABLE
                self._since = now
                self._failures = 0
                self._logged_at = None
            self._last_error = first_line
            self._failures += 1
            due = self._logged_at is None or now - self._logged_at >= self._log_every
            if due:
                self._logged_at = now
            message = self._message()
        if due:
            log.warning("job %s: %s", self._job, message)

    def recovered(self, *, now: float) -> None:
        """Storage answered again (a checkpoint completed, a restore succeeded)."""
        with self._lock:
            if self._state is StorageState.AVAILABLE:
                return
            since, failures = self._since, self._failures
            self._state = StorageState.AVAILABLE
            self._since = self._last_error = self._logged_at = None
            self._failures = 0
        log.warning(
            "job %s: checkpoint storage is available again after %.1f s (%d failed operations)",
            self._job,
            now - (since or now),
            failures,
        )

    def status(self) -> dict[str, Any]:
        """Fields for ``GET /v1/job``: ``storage_state``, ``storage_unavailable_since``
        (wall time), ``storage_last_error``, ``storage_failures`` and ``storage_message``
        (the status line the dashboard shows; ``None`` while available)."""
        with self._lock:
            unavailable = self._state is StorageState.UNAVAILABLE
            return {
                "storage_state": self._state.value,
                "storage_unavailable_since": self._since,
                "storage_last_error": self._last_error,
                "storage_failures": self._failures,
                "storage_message": self._message() if unavailable else None,
            }

    def _message(self) -> str:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(self._since or 0))
        return (
            f"checkpoint storage unavailable, retrying (since {since} UTC, "
            f"{self._failures} failed operations, last error: {self._last_error})"
        )
