"""The completed-checkpoint store with a real registry and a recording cleaner.

The real cleaner on real storage runs in tests/checkpoint/test_coordinator.py
(``test_retained_pruning_on_disk``); here the cleaner records what it is asked to delete.
"""

from __future__ import annotations

from typing import Any, cast

from epochstream.checkpoint.cleanup import StorageCleaner
from epochstream.checkpoint.completed import CompletedCheckpointStore
from epochstream.checkpoint.metadata import CheckpointMetadata
from epochstream.checkpoint.pending import CompletedCheckpoint
from epochstream.checkpoint.shared_registry import SharedStateRegistry

# The store never reads a checkpoint's metadata.
NO_METADATA = cast(CheckpointMetadata, None)


class RecordingCleaner:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def discard(self, checkpoint_id: int) -> None:
        self.calls.append(("discard", checkpoint_id))

    def delete_files(self, paths: list[str]) -> None:
        self.calls.append(("delete_files", list(paths)))

    def discard_leftovers(self, *, below: int, keep: set[int]) -> None:
        self.calls.append(("leftovers", below, set(keep)))


def _checkpoint(n: int, *, owned: bool = True) -> CompletedCheckpoint:
    return CompletedCheckpoint(n, f"/ck/j/chk-{n}", NO_METADATA, owned=owned)


def _store(retained: int) -> tuple[CompletedCheckpointStore, SharedStateRegistry, RecordingCleaner]:
    registry = SharedStateRegistry()
    cleaner = RecordingCleaner()
    store = CompletedCheckpointStore(
        retained=retained, registry=registry, cleaner=cast(StorageCleaner, cleaner), job_id="j"
    )
    return store, registry, cleaner


def test_added_checkpoints_become_latest_and_register_their_shared_files() -> None:
    store, registry, _ = _store(retained=3)
    assert store.latest is None
    store.add(_checkpoint(1), {"s/a"})
    store.add(_checkpoint(2), {"s/a", "s/b"})
    assert store.latest == _checkpoint(2)
    assert store.retained_ids == [1, 2]
    assert registry.references("s/a") == 2 and registry.references("s/b") == 1


def test_prune_keeps_the_newest_and_frees_unreferenced_shared_files() -> None:
    store, registry, cleaner = _store(retained=1)
    store.add(_checkpoint(1), {"s/a", "s/b"})
    store.add(_checkpoint(2), {"s/b"})
    freed = store.prune(pending=set())
    assert freed == ["s/a"]
    assert store.retained_ids == [2]
    assert cleaner.calls == [("discard", 1), ("leftovers", 2, {2})]
    assert "s/a" not in registry and registry.references("s/b") == 1


def test_prune_holds_files_for_pending_checkpoints() -> None:
    store, registry, cleaner = _store(retained=1)
    store.add(_checkpoint(1), {"s/a"})
    store.add(_checkpoint(2), set())
    assert store.prune(pending={3}) == []
    assert cleaner.calls[-1] == ("leftovers", 2, {2, 3})
    assert registry.checkpoint_ended(3) == ["s/a"]


def test_corrupt_latest_falls_back_to_the_previous_one_and_deletes_it() -> None:
    store, _, cleaner = _store(retained=3)
    store.add(_checkpoint(1), {"s/a"})
    store.add(_checkpoint(2), {"s/b"})
    fallback = store.discard_corrupt(2, "bad file", pending=set())
    assert fallback == _checkpoint(1) and store.latest == fallback
    assert store.retained_ids == [1]
    # Its shared files and its directory (with _metadata) leave storage: listed as
    # complete with its files gone, `checkpoints` and `inspect` would disagree.
    assert cleaner.calls == [("delete_files", ["s/b"]), ("discard", 2)]
    assert store.discard_corrupt(1, "bad too", pending=set()) is None
    assert store.latest is None


def test_restored_checkpoints_of_an_earlier_job_stay_fallbacks_after_pruning() -> None:
    store, _, _ = _store(retained=1)
    store.restore_from([_checkpoint(5, owned=False), _checkpoint(4, owned=False)])
    assert store.latest == _checkpoint(5, owned=False)
    store.add(_checkpoint(6), set())
    store.add(_checkpoint(7), set())
    store.prune(pending=set())
    assert store.retained_ids == [7]
    # Checkpoint 6 (this job's, pruned) is no fallback any more; the restored ones are.
    assert store.discard_corrupt(7, "bad", pending=set()) == _checkpoint(5, owned=False)


def test_forget_drops_the_latest_and_the_retained() -> None:
    store, _, _ = _store(retained=2)
    store.add(_checkpoint(1), set())
    store.forget()
    assert store.latest is None and store.retained_ids == []
