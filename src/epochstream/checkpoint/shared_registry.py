"""The shared-state registry: reference counts of files that several checkpoints share.

Incremental snapshots (RocksDB SST files, heap deltas) write files once into the job's
``shared/`` directory and let later checkpoints reference them. The registry counts,
per shared file, the retained completed checkpoints referencing it:

- :meth:`SharedStateRegistry.register` when a checkpoint completes;
- :meth:`SharedStateRegistry.release` when retention drops a checkpoint: files no
  retained checkpoint references become deletable;
- :meth:`SharedStateRegistry.abandon` when a checkpoint aborts: the files its tasks
  wrote that no completed checkpoint references are deletable.

A deletable file is kept while a checkpoint that was already pending when the file
lost its last reference may still complete referencing it (the pending checkpoint's
tasks built on an older completed one); :meth:`SharedStateRegistry.checkpoint_ended`
lifts that hold. The registry never deletes anything itself: it returns the files to
delete, and the job master deletes them off its event thread. Savepoints never
reference shared files (they are self-contained) and do not enter the registry.

Example::

    registry = SharedStateRegistry()
    registry.register(5, {"s3://b/j/shared/a.sst", "s3://b/j/shared/b.sst"})
    registry.register(6, {"s3://b/j/shared/b.sst", "s3://b/j/shared/c.sst"})
    registry.release(5, pending=set())     # ["s3://b/j/shared/a.sst"]
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["SharedStateRegistry"]


class SharedStateRegistry:
    """Reference counts of shared files over the retained checkpoints (see module doc)."""

    def __init__(self) -> None:
        self._refs: dict[str, int] = {}
        self._by_checkpoint: dict[int, frozenset[str]] = {}
        # Unreferenced files held back by these pending checkpoint ids.
        self._held: dict[str, set[int]] = {}

    def __contains__(self, path: str) -> bool:
        return path in self._refs

    def references(self, path: str) -> int:
        """How many retained checkpoints reference ``path``."""
        return self._refs.get(path, 0)

    @property
    def files(self) -> set[str]:
        """Every file a retained checkpoint references."""
        return set(self._refs)

    def protected(self) -> set[str]:
        """Files that must not be deleted: referenced, or held for a pending checkpoint."""
        return set(self._refs) | set(self._held)

    def register(self, checkpoint_id: int, files: Iterable[str]) -> None:
        """A checkpoint completed referencing ``files`` (its shared files)."""
        shared = frozenset(files)
        if checkpoint_id in self._by_checkpoint:
            raise ValueError(f"checkpoint {checkpoint_id} is registered already")
        self._by_checkpoint[checkpoint_id] = shared
        for path in shared:
            self._refs[path] = self._refs.get(path, 0) + 1
            self._held.pop(path, None)

    def release(self, checkpoint_id: int, *, pending: set[int]) -> list[str]:
        """Retention dropped ``checkpoint_id``: the files now deletable, sorted.

        ``pending`` are the checkpoints in flight: files losing their last reference
        wait until those end (:meth:`checkpoint_ended`).
        """
        files = self._by_checkpoint.pop(checkpoint_id, frozenset())
        deletable: list[str] = []
        for path in files:
            count = self._refs[path] - 1
            if count:
                self._refs[path] = count
                continue
            del self._refs[path]
            if pending:
                self._held[path] = set(pending)
            else:
                deletable.append(path)
        return sorted(deletable)

    def abandon(self, files: Iterable[str]) -> list[str]:
        """Files written for an aborted checkpoint: those no retained checkpoint uses."""
        return sorted({f for f in files if f not in self._refs and f not in self._held})

    def checkpoint_ended(self, checkpoint_id: int) -> list[str]:
        """A pending checkpoint completed or aborted: held files now deletable, sorted."""
        freed: list[str] = []
        for path, holders in list(self._held.items()):
            holders.discard(checkpoint_id)
            if not holders:
                del self._held[path]
                freed.append(path)
        return sorted(freed)
