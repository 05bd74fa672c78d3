"""The heap and RocksDB keyed-state backends on the real S3 store (see ``test_s3_storage``):
checkpointing to S3 and restoring from it, a missing state object, a savepoint that
still restores after being copied to another prefix, and savepoints on other storage
than the checkpoints."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from s3_storage_support import MAX_P, Options, checkpoint_metadata, files_under

from epochstream.checkpoint.storage import CheckpointStorage, load_metadata, write_metadata_file
from epochstream.core.checkpoint_stats import KIND_SAVEPOINT
from epochstream.core.clock import ManualClock
from epochstream.core.filesystems import StorageFS, storage_fs
from epochstream.core.state_descriptors import (
    ListStateDescriptor,
    MapStateDescriptor,
    ValueStateDescriptor,
)
from epochstream.exceptions import CorruptStateError
from epochstream.state.backends.base import KeyedBackendContext, SnapshotTarget, StateBackend
from epochstream.state.backends.heap.backend import HeapStateBackend
from epochstream.state.backends.rocksdb.backend import RocksDBStateBackend
from epochstream.state.handles import (
    CanonicalSnapshotHandle,
    KeyedStateHandle,
    OperatorSubtaskState,
)
from epochstream.state.keygroups import key_group_range_for_operator


def _copy_tree(fs: StorageFS, source: str, target: str) -> list[str]:
    """Copy every object under ``source`` to the same relative key under ``target``."""
    copied = []
    for path in files_under(fs, source):
        destination = fs.join(target, fs.relative(source, path))
        fs.write_bytes(destination, fs.read_bytes(path))
        copied.append(destination)
    return sorted(copied)


# ---------------------------------------------------------------- keyed state backends on S3

BACKENDS: dict[str, Callable[[], StateBackend]] = {
    "heap": HeapStateBackend,
    "heap-full": lambda: HeapStateBackend(incremental=False),
    "rocksdb": lambda: RocksDBStateBackend(block_cache_mb=8, write_buffer_mb=4),
    "rocksdb-full": lambda: RocksDBStateBackend(incremental=False, block_cache_mb=8),
}
COUNT = ValueStateDescriptor("count", default=0)
SEEN = ListStateDescriptor("seen")
PAGES = MapStateDescriptor("pages")


class S3Harness:
    """Backends of one kind whose snapshots go to ``<bucket>/job`` (as tests/state/backends)."""

    def __init__(self, kind: str, bucket: str, options: Options, local: Path) -> None:
        self.kind = kind
        self.config = BACKENDS[kind]()
        self.bucket = bucket
        self.options = options
        self.local = local
        self.clock = ManualClock(start=1_000.0)
        self.fs = storage_fs(f"{bucket}/x", options)
        self.job_dir = f"{bucket}/job"
        self._made = 0

    def backend(self, parallelism: int = 1, subtask: int = 0, kind: str | None = None) -> Any:
        self._made += 1
        ctx = KeyedBackendContext(
            operator_uid="op",
            subtask=subtask,
            max_parallelism=MAX_P,
            key_group_range=key_group_range_for_operator(MAX_P, parallelism, subtask),
            clock=self.clock,
            local_dir=str(self.local / f"op-{subtask}-{self._made}"),
            storage_options=dict(self.options),
        )
        config = BACKENDS[kind]() if kind is not None else self.config
        return config.create(ctx)

    def target(
        self, n: int, *, subtask: int = 0, base: int | None = None, savepoint: str | None = None
    ) -> SnapshotTarget:
        if savepoint is not None:
            return SnapshotTarget(
                fs=self.fs,
                checkpoint_id=n,
                directory=savepoint,
                shared_dir=None,
                name=f"op-{subtask}",
                savepoint=True,
                base_checkpoint_id=base,
            )
        return SnapshotTarget(
            fs=self.fs,
            checkpoint_id=n,
            directory=f"{self.job_dir}/chk-{n}",
            shared_dir=f"{self.job_dir}/shared",
            name=f"op-{subtask}",
            base_checkpoint_id=base,
        )


@pytest.fixture(params=sorted(BACKENDS))
def s3_harness(
    request: pytest.FixtureRequest, s3_bucket: str, s3_options: Options, tmp_path: Path
) -> S3Harness:
    """A harness for each backend kind, snapshotting into this test's bucket."""
    return S3Harness(request.param, s3_bucket, s3_options, tmp_path)


def _fill(backend: Any, keys: range, *, scale: int = 1) -> None:
    count, seen, pages = (backend.get_state(d) for d in (COUNT, SEEN, PAGES))
    for k in keys:
        backend.set_current_key(f"k{k}")
        count.update(k * scale)
        seen.add_all([k, k + scale])
        pages.put("/home", k)
        pages.put(("nested", k), [k, scale])


def _dump(backend: Any, keys: range | list[int]) -> dict[str, Any]:
    count, seen, pages = (backend.get_state(d) for d in (COUNT, SEEN, PAGES))
    out = {}
    for k in keys:
        backend.set_current_key(f"k{k}")
        out[f"k{k}"] = (count.value(), seen.get(), sorted(pages.items(), key=repr))
    return out


def _checkpoint(h: S3Harness, backend: Any, n: int, base: int | None) -> KeyedStateHandle:
    handle = backend.snapshot(h.target(n, base=base)).run()
    backend.notify_checkpoint_complete(n)
    assert handle is not None
    return handle


def test_backend_checkpoints_to_s3_and_restores(s3_harness: S3Harness) -> None:
    h = s3_harness
    backend = h.backend()
    storage = CheckpointStorage(h.job_dir.rsplit("/", 1)[0], "job", h.options)
    handle: KeyedStateHandle | None = None
    for n in (1, 2, 3):
        _fill(backend, range(n * 10), scale=n)  # new keys and changed ones
        backend.set_current_key(f"k{n}")
        backend.get_state(COUNT).clear()
        handle = _checkpoint(h, backend, n, base=n - 1 if n > 1 else None)
        storage.write_metadata(
            n, checkpoint_metadata("job", n, {"op": {0: OperatorSubtaskState(keyed=handle)}})
        )
    assert handle is not None
    expected = _dump(backend, range(30))
    assert all(path.startswith(f"{h.job_dir}/") for path in handle.files())
    assert all(h.fs.exists(path) for path in handle.files())
    if h.kind in ("heap", "rocksdb"):  # incremental: later checkpoints reference shared files
        assert handle.shared_files()
        assert all(p.startswith(f"{h.job_dir}/shared/") for p in handle.shared_files())

    # Through _metadata on S3: relative paths (../shared/...) resolve back to the objects.
    loaded = storage.load(3).operators["op"][0].keyed
    assert loaded is not None and sorted(loaded.files()) == sorted(handle.files())
    restored = h.backend()
    restored.restore([loaded], checkpoint_id=3, owned=True)
    assert _dump(restored, range(30)) == expected

    # The restored backend keeps checkpointing onto S3 on top of what it restored.
    restored.set_current_key("k5")
    restored.get_state(COUNT).update(555)
    h4 = _checkpoint(h, restored, 4, base=3)
    final = h.backend()
    final.restore([h4], checkpoint_id=4, owned=True)
    dump = _dump(final, range(30))
    assert dump["k5"][0] == 555 and dump["k6"] == expected["k6"]
    for b in (backend, restored, final):
        b.dispose()


def test_missing_state_object_is_corrupt_state(s3_harness: S3Harness) -> None:
    h = s3_harness
    backend = h.backend()
    _fill(backend, range(20))
    handle = _checkpoint(h, backend, 1, base=None)
    victim = handle.files()[0]
    h.fs.delete_file(victim)
    with pytest.raises(CorruptStateError) as info:
        h.backend().restore([handle], checkpoint_id=1, owned=True)
    assert info.value.path == victim
    backend.dispose()


def test_savepoint_copied_to_another_prefix_restores(s3_harness: S3Harness) -> None:
    """A canonical savepoint on S3 is self-contained: copy its objects elsewhere, delete
    the original, and ``load_metadata`` of the copy resolves every handle inside the copy."""
    h = s3_harness
    keys = range(60)
    handles: dict[int, OperatorSubtaskState] = {}
    expected: dict[str, Any] = {}
    backends = []
    for subtask in (0, 1):
        backend = h.backend(parallelism=2, subtask=subtask)
        backends.append(backend)
        kgr = key_group_range_for_operator(MAX_P, 2, subtask)
        mine = [k for k in keys if backend.assigner.key_group(f"k{k}") in kgr]
        for k in mine:
            _fill(backend, range(k, k + 1), scale=2)
        _checkpoint(h, backend, 1, base=None)  # a savepoint may build on a checkpoint
        for k in mine[:5]:
            _fill(backend, range(k, k + 1), scale=7)  # changed after that checkpoint
        expected.update(_dump(backend, mine))
        sp_dir = f"{h.bucket}/savepoints/sp-1"
        handle = backend.snapshot(h.target(2, subtask=subtask, base=1, savepoint=sp_dir)).run()
        assert isinstance(handle, CanonicalSnapshotHandle)
        assert handle.path == f"{sp_dir}/op-{subtask}.arrow"
        handles[subtask] = OperatorSubtaskState(keyed=handle, operator_lists={"o": [subtask]})
    source = f"{h.bucket}/savepoints/sp-1"
    metadata = checkpoint_metadata("job", 2, {"op": handles}, kind=KIND_SAVEPOINT)
    write_metadata_file(h.fs, source, metadata)

    copy = f"{h.bucket}/moved/elsewhere/sp-copy"
    copied = _copy_tree(h.fs, source, copy)
    assert copied == sorted([f"{copy}/_metadata", f"{copy}/op-0.arrow", f"{copy}/op-1.arrow"])
    h.fs.delete_dir(source)
    assert not h.fs.exists(f"{source}/_metadata")

    directory, loaded = load_metadata(copy, h.options)
    assert directory == copy and loaded.kind == KIND_SAVEPOINT
    for subtask, state in loaded.operators["op"].items():
        assert state.keyed is not None
        assert state.keyed.files() == [f"{copy}/op-{subtask}.arrow"]
        assert state.operator_lists == {"o": [subtask]}

    # Restore at parallelism 1, with this backend and with the other one (canonical format).
    other = "rocksdb" if h.kind.startswith("heap") else "heap"
    for kind in (h.kind, other):
        restored = h.backend(kind=kind)
        keyed = [s.keyed for s in loaded.operators["op"].values() if s.keyed is not None]
        restored.restore(keyed, checkpoint_id=2, owned=False)
        assert _dump(restored, keys) == expected, kind
        restored.dispose()
    for backend in backends:
        backend.dispose()


# ---------------------------------------------------------------- savepoints beside the checkpoints


class _Callbacks:
    """The coordinator's callbacks, storage work run at once (as tests/checkpoint do)."""

    def __init__(self) -> None:
        self.savepoints: list[tuple[int, str | None, str | None]] = []

    def trigger_sources(
        self, checkpoint_id: int, timestamp: float, final: bool, options: Any
    ) -> None:
        pass

    def run_io(
        self, work: Callable[[], None], done: Callable[[BaseException | None], None] | None
    ) -> None:
        error = None
        try:
            work()
        except Exception as exc:
            error = exc
        if done is not None:
            done(error)

    def savepoint_done(self, checkpoint_id: int, path: str | None, error: str | None) -> None:
        self.savepoints.append((checkpoint_id, path, error))

    def notify_complete(self, checkpoint_id: int, metadata: object) -> None:
        pass

    def notify_aborted(self, checkpoint_id: int, reason: str) -> None:
        pass

    def fail_job(self, reason: str, error: BaseException | None = None) -> None:
        raise AssertionError(f"job failed: {reason}")


@pytest.mark.parametrize("savepoint_on", ["s3", "local"])
def test_savepoint_to_other_storage_than_checkpoints(
    savepoint_on: str,
    s3_bucket: str,
    s3_options: Options,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from epochstream.checkpoint.coordinator import CheckpointCoordinator
    from epochstream.core.checkpoint_config import CheckpointConfig
    from epochstream.core.checkpoint_stats import TaskCheckpointStats
    from epochstream.state.acknowledgements import AcknowledgeCheckpoint

    monkeypatch.chdir(tmp_path)  # where a misdirected relative write would land
    if savepoint_on == "s3":
        root, savepoint = str(tmp_path / "ckpt"), f"{s3_bucket}/sp/savepoint-1"
    else:
        root, savepoint = f"{s3_bucket}/ckpt", str(tmp_path / "sp" / "savepoint-1")
    calls = _Callbacks()
    coordinator = CheckpointCoordinator(
        config=CheckpointConfig(interval=60.0, storage=root, storage_options=s3_options),
        storage=CheckpointStorage(root, "job", s3_options),
        clock=ManualClock(start=1_000.0),
        job_id="job",
        parallelism=1,
        max_parallelism=MAX_P,
        operator_parallelism={"src": 1},
        callbacks=calls,
    )
    task = ("src", 0)
    coordinator.start_attempt({task})
    n = coordinator.trigger_savepoint(savepoint)
    state = OperatorSubtaskState(operator_lists={"offsets": [42]})
    stats = TaskCheckpointStats(alignment_s=0.0, state_size=0)
    coordinator.receive_ack(AcknowledgeCheckpoint(n, task, {"src": state}, stats))
    assert calls.savepoints == [(n, savepoint, None)]
    directory, metadata = load_metadata(savepoint, s3_options)
    assert directory == savepoint and metadata.kind == KIND_SAVEPOINT
    assert metadata.operators["src"][0].operator_lists == {"offsets": [42]}


@pytest.mark.parametrize("kind", ["heap", "rocksdb"])
def test_savepoint_to_s3_on_top_of_local_checkpoints(
    kind: str, s3_bucket: str, s3_options: Options, tmp_path: Path
) -> None:
    h = S3Harness(kind, s3_bucket, s3_options, tmp_path / "scratch")
    backend = h.backend()
    _fill(backend, range(40))
    local_fs = storage_fs(str(tmp_path))
    local_job = str(tmp_path / "ckpt" / "job")
    os.makedirs(local_job)  # as the job master makes it
    checkpoint = SnapshotTarget(
        fs=local_fs,
        checkpoint_id=1,
        directory=f"{local_job}/chk-1",
        shared_dir=f"{local_job}/shared",
        name="op-0",
    )
    assert backend.snapshot(checkpoint).run() is not None
    backend.notify_checkpoint_complete(1)
    _fill(backend, range(5), scale=9)
    expected = _dump(backend, range(40))
    savepoint = h.target(2, base=1, savepoint=f"{s3_bucket}/sp/savepoint-2")
    handle = backend.snapshot(savepoint).run()
    assert isinstance(handle, CanonicalSnapshotHandle)
    assert handle.path == f"{s3_bucket}/sp/savepoint-2/op-0.arrow"
    restored = h.backend()
    restored.restore([handle], checkpoint_id=2, owned=False)
    assert _dump(restored, range(40)) == expected
    backend.dispose()
    restored.dispose()
