"""What a slot gives each of its tasks (:class:`TaskEnvironment`).

Example::

    env = TaskEnvironment(job_id="j1", attempt=0, checkpoint_dir="/ck/j1", checkpointing=True,
                          exactly_once=True, send=control.send, snapshots=executor)
    env.fs("/ck/j1").exists("/ck/j1")
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from epochstream.core.clock import SystemClock
from epochstream.core.filesystems import StorageFS, storage_fs
from epochstream.runtime.snapshots import SnapshotExecutor
from epochstream.state.backends.base import StateBackend
from epochstream.state.backends.heap.backend import HeapStateBackend

__all__ = ["TaskEnvironment"]


class TaskEnvironment:
    """What a slot gives its tasks: job identity, checkpoint settings, the control sender."""

    def __init__(
        self,
        *,
        job_id: str,
        attempt: int,
        checkpoint_dir: str | None,
        checkpointing: bool,
        exactly_once: bool,
        unaligned: bool = False,
        send: Callable[[Any], None],
        snapshots: SnapshotExecutor,
        console: Callable[[str], None] | None = None,
        state_backend: StateBackend | None = None,
        storage_options: dict[str, Any] | None = None,
        local_dir: str = "",
        clock: Any = None,
    ) -> None:
        self.console = console
        self.job_id = job_id
        self.attempt = attempt
        self.checkpoint_dir = checkpoint_dir
        self.checkpointing = checkpointing
        self.exactly_once = exactly_once
        #: Unaligned checkpoints (the gate and channels that let barriers overtake).
        self.unaligned = unaligned
        self.send = send
        self.snapshots = snapshots
        self.state_backend: StateBackend = state_backend or HeapStateBackend()
        self.storage_options = storage_options
        self.local_dir = local_dir
        self.clock = clock or SystemClock()

    def fs(self, location: str) -> StorageFS:
        """The filesystem of a checkpoint or savepoint location."""
        return storage_fs(location, self.storage_options)
