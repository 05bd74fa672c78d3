"""Savepoint requests from clients (``JobClient``, the job endpoint) to the job master.

A request is made on any thread and answered on the job master's event thread; the
caller blocks in :meth:`SavepointRequest.wait`. Savepoints land in
``<directory>/savepoint-<job id prefix>-<random>`` (Flink's naming), so several
savepoints of several jobs can share a directory. :class:`SavepointRequests` is the job
master's book of requests in flight, and of the stop-with-savepoint that ends the job.

Example::

    request = master.request_savepoint("/data/savepoints", terminate=False)
    path = request.wait(timeout=300)
"""

from __future__ import annotations

import os
import posixpath
import threading
import uuid
from typing import Any

from epochstream.core.filesystems import (
    ensure_private_location,
    normalize_location,
    storage_fs,
)
from epochstream.exceptions import CheckpointError, ConfigurationError

__all__ = ["SavepointRequest", "SavepointRequests", "SavepointTargets", "savepoint_name"]


def savepoint_name(job_id: str) -> str:
    """A fresh savepoint directory name for ``job_id``.

    Example::

        savepoint_name("3f2a9c1e...")   # "savepoint-3f2a9c-1b2c3d4e5f60"
    """
    return f"savepoint-{job_id[:6]}-{uuid.uuid4().hex[:12]}"


class SavepointTargets:
    """Where a savepoint asked for over the API may go, resolved as its caller means it.

    ``~`` is the home directory, a relative path is relative to the savepoint ``root``
    (``savepoint_dir``, else ``<storage>/savepoints``; never the driver's working
    directory), and no directory at all is ``root`` itself. Unless ``anywhere``
    (``Environment(endpoint_savepoints_anywhere=True)``), the result must lie inside
    ``root``: a ``..`` escape, a symlink out of it, another bucket or another scheme is
    refused with :class:`ConfigurationError`, so a caller of the endpoint cannot make
    the job write elsewhere with its own permissions and credentials.

    Example::

        targets = SavepointTargets("/data/sp", anywhere=False)
        targets.resolve("nightly")        # "/data/sp/nightly"
        targets.resolve("../etc")         # ConfigurationError
    """

    def __init__(self, root: str, *, anywhere: bool) -> None:
        self.root = normalize_location(root)
        self.anywhere = anywhere

    def resolve(self, requested: str | None) -> str:
        """The normalized directory for ``requested``, or :class:`ConfigurationError`."""
        if requested is None or not requested.strip():
            return self.root
        if "://" in requested:
            target = normalize_location(requested)
        else:
            path = os.path.expanduser(requested)
            if not posixpath.isabs(path):
                path = self._join(path)
            target = normalize_location(path)
        if not self.anywhere and not self._inside(target):
            raise ConfigurationError(
                f"savepoint directory {requested!r} ({target}) is outside the savepoint root "
                f"{self.root}; give a path inside it, or allow any directory with "
                "Environment(endpoint_savepoints_anywhere=True)"
            )
        return target

    def _join(self, relative: str) -> str:
        if "://" in self.root:
            return self.root.rstrip("/") + "/" + relative
        return os.path.join(self.root, relative)

    def _inside(self, target: str) -> bool:
        root, path = self.root, target
        if "://" not in root and "://" not in path:
            # Symlinks count where they point: a link inside the root to /etc is outside.
            root, path = os.path.realpath(root), os.path.realpath(path)
        return path == root or path.startswith(root.rstrip("/") + "/")


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


class SavepointRequests:
    """The savepoints a job master is taking, by checkpoint id (event thread only).

    Example::

        book.start(request, coordinator, config, running=True)
        stopping = book.done(checkpoint_id, path, None)   # the request, if it stops the job
    """

    def __init__(self, job_id: str) -> None:
        self._job_id = job_id
        self._pending: dict[int, SavepointRequest] = {}
        #: The completed stop-with-savepoint ending the job, once there is one.
        self.stopping: SavepointRequest | None = None

    def start(
        self, request: SavepointRequest, coordinator: Any, config: Any, *, running: bool
    ) -> None:
        """Trigger ``request`` on ``coordinator``, or fail it saying why not."""
        if coordinator is None or config is None:
            request.fail("savepoints need checkpointing: call env.enable_checkpointing(...)")
            return
        if not running:
            request.fail(f"job {self._job_id} is not running")
            return
        if self.stopping is not None:
            request.fail(f"job {self._job_id} is stopping with a savepoint")
            return
        try:
            base = normalize_location(request.directory or config.savepoint_location)
            # A savepoint is restored later and holds pickles: it goes only where no
            # other local user can swap it.
            ensure_private_location(
                base, what="savepoint directory", trust_shared=config.trust_shared_storage
            )
            target = storage_fs(base, config.storage_options).join(
                base, savepoint_name(self._job_id)
            )
            request.checkpoint_id = coordinator.trigger_savepoint(
                target, terminate=request.terminate
            )
        except (CheckpointError, ConfigurationError) as err:
            request.fail(str(err))
            return
        self._pending[request.checkpoint_id] = request

    def done(
        self, checkpoint_id: int, path: str | None, error: str | None
    ) -> SavepointRequest | None:
        """Answer the request of ``checkpoint_id``; returns it when it now stops the job."""
        request = self._pending.pop(checkpoint_id, None)
        if request is None:
            return None
        if path is None:
            request.fail(error or "aborted")  # a failed stop leaves the job running
            return None
        request.succeed(path)
        if request.terminate:
            self.stopping = request
            return request
        return None

    def fail_all(self, reason: str) -> None:
        """The job ended: answer every request still waiting."""
        for request in self._pending.values():
            request.fail(reason)
        self._pending.clear()
