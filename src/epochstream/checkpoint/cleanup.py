"""Checkpoint storage cleanup, run on the job master's storage thread.

The coordinator decides what goes (a dropped checkpoint's directory, shared files no
retained checkpoint references, directories straggling tasks wrote into late, orphans
of tasks that died before acknowledging); a :class:`StorageCleaner` does it off the
event thread through ``run_io``. Deleting something already gone is fine; a failure is
logged and retried by a later cleanup (nothing without ``_metadata`` is ever restored).

Example::

    cleaner = StorageCleaner(storage, master.run_io)
    cleaner.discard(4)
    cleaner.delete_files(["s3://b/j/shared/4-op-0-ab.sst"])
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable

from epochstream.checkpoint.storage import CheckpointStorage
from epochstream.core.filesystems import storage_fs
from epochstream.exceptions import CheckpointError

__all__ = ["StorageCleaner"]

log = logging.getLogger(__name__)

#: Shared files are named ``<checkpoint id>-...`` after the checkpoint that wrote them.
_SHARED_NAME = re.compile(r"^(\d+)-")


class StorageCleaner:
    """Deletes checkpoint files of one job, off the event thread."""

    def __init__(self, storage: CheckpointStorage, run_io: Callable[..., None]) -> None:
        self._storage = storage
        self._run_io = run_io

    def _submit(self, work: Callable[[], None]) -> None:
        self._run_io(work, None)

    def make_checkpoint_dir(self, checkpoint_id: int) -> None:
        """Create ``chk-<id>`` (it also records that the id was used)."""
        storage = self._storage

        def make() -> None:
            storage.checkpoint_dir(checkpoint_id)

        self._submit(make)

    def discard(self, checkpoint_id: int) -> None:
        """Delete the directory of checkpoint ``checkpoint_id``."""
        storage = self._storage

        def discard() -> None:
            try:
                storage.discard(checkpoint_id)
            except CheckpointError as err:
                log.warning("job %s: %s (retried by a later cleanup)", storage.job_id, err)

        self._submit(discard)

    def delete_dir(self, location: str) -> None:
        """Delete ``location`` and everything under it (a savepoint, a job directory)."""
        fs = storage_fs(location, self._storage.options)
        self._submit(lambda: fs.delete_dir(location))

    def delete_files(self, files: list[str]) -> None:
        """Delete shared files no retained checkpoint references."""
        if not files:
            return
        fs = self._storage.fs

        def delete() -> None:
            for path in files:
                fs.delete_file(path)

        self._submit(delete)

    def discard_leftovers(self, *, below: int, keep: set[int]) -> None:
        """Delete ``chk-<n>`` directories with ``n < below`` not in ``keep`` (a task of a
        dropped checkpoint may write into its directory after it was discarded)."""
        storage = self._storage

        def leftovers() -> None:
            for n in storage.checkpoint_ids():
                if n < below and n not in keep:
                    storage.discard(n)

        self._submit(leftovers)

    def sweep_orphans(self, *, below: int, keep: set[str]) -> None:
        """Delete shared files named for a checkpoint before ``below`` that are not in
        ``keep``: left by tasks that died before acknowledging."""
        storage = self._storage

        def sweep() -> None:
            for path in storage.shared_files():
                match = _SHARED_NAME.match(path.rsplit("/", 1)[-1])
                if match and int(match.group(1)) < below and path not in keep:
                    storage.fs.delete_file(path)

        self._submit(sweep)
