"""The completed checkpoints of a job: the latest, the fallbacks, and which stay on storage.

The :class:`~epochstream.checkpoint.coordinator.CheckpointCoordinator` hands every
completed checkpoint (never a savepoint) to a :class:`CompletedCheckpointStore`, as
Flink's coordinator does to its ``CompletedCheckpointStore``. The store keeps:

- the *candidates*: restorable checkpoints, newest first; the first is the one a
  failover restores, the others are the fallbacks when it proves corrupt
  (:meth:`~CompletedCheckpointStore.discard_corrupt`). Checkpoints of an earlier job
  that this job resumed (:meth:`~CompletedCheckpointStore.restore_from`) are
  candidates too; pruning drops only candidates this job owns;
- the *retained* ids: this job's completed checkpoints still on storage, oldest first;
  :meth:`~CompletedCheckpointStore.prune` keeps the newest ``retained`` of them, releases
  the others' shared files in the registry and deletes their directories.

It runs on the job master's event thread like the coordinator; deletion goes through
the :class:`~epochstream.checkpoint.cleanup.StorageCleaner`, off that thread.

Example::

    store = CompletedCheckpointStore(retained=2, registry=registry, cleaner=cleaner,
                                     job_id="j")
    store.add(CompletedCheckpoint(7, "/ck/j/chk-7", metadata), shared_files={...})
    freed = store.prune(pending={8})       # shared files now deletable
    store.latest.checkpoint_id == 7
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from epochstream.checkpoint.cleanup import StorageCleaner
from epochstream.checkpoint.pending import CompletedCheckpoint
from epochstream.checkpoint.shared_registry import SharedStateRegistry

__all__ = ["CompletedCheckpointStore"]

log = logging.getLogger(__name__)


class CompletedCheckpointStore:
    """The latest completed checkpoint, its fallbacks and the retained ones (see module doc)."""

    def __init__(
        self,
        *,
        retained: int,
        registry: SharedStateRegistry,
        cleaner: StorageCleaner,
        job_id: str,
    ) -> None:
        self._max_retained = retained
        self._registry = registry
        self._cleaner = cleaner
        self._job_id = job_id
        self._latest: CompletedCheckpoint | None = None
        # Restorable checkpoints, newest first: the latest and the older ones to fall
        # back to when it proves corrupt.
        self._candidates: list[CompletedCheckpoint] = []
        self._retained: list[int] = []  # completed checkpoints of this job, oldest first

    @property
    def latest(self) -> CompletedCheckpoint | None:
        """The newest completed (or restored-from) checkpoint, ``None`` before any."""
        return self._latest

    @property
    def retained_ids(self) -> list[int]:
        """Completed checkpoints of this job still on storage, oldest first."""
        return list(self._retained)

    def restore_from(self, candidates: list[CompletedCheckpoint]) -> None:
        """Start from ``candidates[0]`` (of an earlier job), the later ones as fallbacks."""
        self._candidates = list(candidates)
        self._latest = candidates[0]

    def add(self, checkpoint: CompletedCheckpoint, shared_files: Iterable[str]) -> None:
        """``checkpoint`` completed referencing ``shared_files``: it is the latest now."""
        self._latest = checkpoint
        self._candidates = [checkpoint, *self._candidates]
        self._registry.register(checkpoint.checkpoint_id, shared_files)
        self._retained.append(checkpoint.checkpoint_id)

    def prune(self, *, pending: set[int]) -> list[str]:
        """Keep the newest ``retained`` completed checkpoints; the rest leave storage.

        ``pending``: the checkpoints in flight (their files stay). Returns the shared
        files that became deletable.
        """
        freed: list[str] = []
        while len(self._retained) > self._max_retained:
            old = self._retained.pop(0)
            freed += self._registry.release(old, pending=pending)
            self._cleaner.discard(old)
        kept = set(self._retained)
        self._candidates = [c for c in self._candidates if c.checkpoint_id in kept or not c.owned]
        latest = self._retained[-1] if self._retained else 0
        self._cleaner.discard_leftovers(below=latest, keep=kept | pending)
        return freed

    def discard_corrupt(
        self, checkpoint_id: int, reason: str, *, pending: set[int]
    ) -> CompletedCheckpoint | None:
        """Checkpoint ``checkpoint_id`` could not be restored: fall back to the previous
        restorable one (returned; ``None`` when there is none left)."""
        self._candidates = [c for c in self._candidates if c.checkpoint_id != checkpoint_id]
        if checkpoint_id in self._retained:
            self._retained.remove(checkpoint_id)
            self._cleaner.delete_files(self._registry.release(checkpoint_id, pending=pending))
            # Its _metadata goes too (first): a checkpoint left listed as complete with
            # its files gone would make `checkpoints` and `inspect` disagree.
            self._cleaner.discard(checkpoint_id)
        fallback = self._candidates[0] if self._candidates else None
        log.warning(
            "job %s: checkpoint %d cannot be restored (%s); %s",
            self._job_id,
            checkpoint_id,
            reason,
            f"falling back to checkpoint {fallback.checkpoint_id} at {fallback.directory}"
            if fallback
            else "no older checkpoint is left",
        )
        self._latest = fallback
        return fallback

    def forget(self) -> None:
        """This job's checkpoints were deleted (cancelled without ``retain_on_cancel``)."""
        self._latest = None
        self._retained = []
