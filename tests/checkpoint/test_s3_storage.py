"""Checkpoint storage on a real S3 object store (SeaweedFS on loopback, see tests/conftest.py).

The :class:`StorageFS` contract on ``s3://`` locations, :class:`CheckpointStorage` on a
bucket, credentials (wrong ones, and ones from the ``AWS_*`` environment), and the heap
and RocksDB keyed-state backends checkpointing to S3, restoring from it and writing a
savepoint that still restores after being copied to another prefix.

SeaweedFS keeps listing a deleted prefix as a directory for a few minutes, so these
tests decide what exists from files (``exists``), never from prefixes.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from epochstream.checkpoint.filesystems import StorageFS, normalize_location, storage_fs
from epochstream.checkpoint.metadata import KIND_SAVEPOINT, CheckpointMetadata, CheckpointStats
from epochstream.checkpoint.storage import (
    CheckpointStorage,
    find_completed_checkpoints,
    load_metadata,
    scan_checkpoints,
    write_metadata_file,
)
from epochstream.exceptions import CheckpointError, ConfigurationError, CorruptStateError
from epochstream.runtime.clock import ManualClock
from epochstream.state.backends.base import KeyedBackendContext, SnapshotTarget, StateBackend
from epochstream.state.backends.heap import HeapStateBackend
from epochstream.state.backends.rocksdb import RocksDBStateBackend
from epochstream.state.descriptors import (
    ListStateDescriptor,
    MapStateDescriptor,
    ValueStateDescriptor,
)
from epochstream.state.handles import (
    CanonicalSnapshotHandle,
    KeyedStateHandle,
    OperatorSubtaskState,
)
from epochstream.state.keygroups import key_group_range_for_operator

Options = dict[str, str]


def _md(job_id: str, n: int, operators: dict[str, Any] | None = None, **extra: Any) -> Any:
    ops = operators or {"src": {0: OperatorSubtaskState(operator_lists={"offsets": [n * 10]})}}
    return CheckpointMetadata(
        job_id=job_id,
        checkpoint_id=n,
        trigger_time=float(n),
        completion_time=n + 0.5,
        parallelism=1,
        max_parallelism=MAX_P,
        operators=ops,
        operator_parallelism={uid: len(subtasks) for uid, subtasks in ops.items()},
        stats=CheckpointStats(
            checkpoint_id=n,
            trigger_time=float(n),
            duration=0.5,
            state_size=0,
            kind=extra.get("kind", "checkpoint"),
        ),
        **extra,
    )


def _files_under(fs: StorageFS, directory: str) -> Iterator[str]:
    """Every file under ``directory`` (prefixes are walked, lingering empty ones yield nothing)."""
    for name in fs.listdir(directory):
        path = fs.join(directory, name)
        if fs.exists(path):
            yield path
        else:
            yield from _files_under(fs, path)


def _copy_tree(fs: StorageFS, source: str, target: str) -> list[str]:
    """Copy every object under ``source`` to the same relative key under ``target``."""
    copied = []
    for path in _files_under(fs, source):
        destination = fs.join(target, fs.relative(source, path))
        fs.write_bytes(destination, fs.read_bytes(path))
        copied.append(destination)
    return sorted(copied)


# ---------------------------------------------------------------- the StorageFS contract


def test_bytes_ranges_and_seeks(s3_bucket: str, s3_options: Options) -> None:
    fs = storage_fs(s3_bucket, s3_options)
    path = fs.join(s3_bucket, "job", "chk-1", "state.bin")
    payload = bytes(range(256)) * 40 + b"tail"
    fs.write_bytes(path, payload)
    assert fs.read_bytes(path) == payload
    assert fs.read_range(path, 1000, 16) == payload[1000:1016]
    assert fs.read_range(path, len(payload) - 2, 100) == b"il"  # short read at the end
    with fs.open_read(path) as f:
        f.seek(5000)
        assert f.read(4) == payload[5000:5004]
        f.seek(3)
        assert f.read(2) == payload[3:5]
        assert f.tell() == 5
        assert f.read() == payload[5:]
    empty = fs.join(s3_bucket, "job", "empty")
    fs.write_bytes(empty, b"")
    assert fs.exists(empty) and fs.read_bytes(empty) == b""
    with fs.open_write(fs.join(s3_bucket, "job", "streamed")) as out:
        out.write(b"abc")
        out.write(b"def")
    assert fs.read_bytes(fs.join(s3_bucket, "job", "streamed")) == b"abcdef"
    with pytest.raises(FileNotFoundError):
        fs.read_bytes(fs.join(s3_bucket, "job", "missing"))


def test_write_atomic_replaces_the_whole_object(s3_bucket: str, s3_options: Options) -> None:
    fs = storage_fs(s3_bucket, s3_options)
    directory = fs.join(s3_bucket, "ck", "chk-3")
    path = fs.join(directory, "_metadata")
    fs.write_atomic(path, b'{"first": 1}')
    fs.write_atomic(path, b'{"second": 2}')
    assert fs.read_bytes(path) == b'{"second": 2}'
    # One PUT: no temporary objects beside it.
    assert fs.listdir(directory) == ["_metadata"]


def test_exists_is_true_for_files_only(s3_bucket: str, s3_options: Options) -> None:
    fs = storage_fs(s3_bucket, s3_options)
    fs.write_bytes(f"{s3_bucket}/a/b/file", b"x")
    assert fs.exists(f"{s3_bucket}/a/b/file")
    assert not fs.exists(f"{s3_bucket}/a/b")  # a prefix is not a file
    assert not fs.exists(f"{s3_bucket}/a/b/")
    assert not fs.exists(f"{s3_bucket}/a/b/nothing")
    assert not fs.exists(f"{s3_bucket}-no-such-bucket/a")
    assert fs.isdir(f"{s3_bucket}/a") and fs.isdir(f"{s3_bucket}/a/b")
    assert not fs.isdir(f"{s3_bucket}/a/b/file") and not fs.isdir(f"{s3_bucket}/zzz")
    fs.delete_file(f"{s3_bucket}/a/b/file")
    assert not fs.exists(f"{s3_bucket}/a/b/file")


def test_listdir_files_and_prefixes(s3_bucket: str, s3_options: Options) -> None:
    fs = storage_fs(s3_bucket, s3_options)
    job = f"{s3_bucket}/root/job"
    for key in ("chk-1/_metadata", "chk-1/op-0.kst", "chk-2/op-0.kst", "shared/x.sst", "note"):
        fs.write_bytes(f"{job}/{key}", key.encode())
    assert fs.listdir(job) == ["chk-1", "chk-2", "note", "shared"]
    assert fs.listdir(job, dirs_only=True) == ["chk-1", "chk-2", "shared"]
    assert fs.listdir(f"{job}/") == fs.listdir(job)
    assert fs.listdir(f"{job}/chk-1") == ["_metadata", "op-0.kst"]
    assert fs.listdir(f"{job}/chk-1", dirs_only=True) == []
    assert fs.listdir(f"{s3_bucket}/root") == ["job"]
    assert fs.listdir(s3_bucket) == ["root"]
    assert fs.listdir(f"{job}/missing") == []
    assert fs.listdir(f"{job}/missing", dirs_only=True) == []


def test_deleting_missing_paths_is_fine(s3_bucket: str, s3_options: Options) -> None:
    fs = storage_fs(s3_bucket, s3_options)
    fs.delete_file(f"{s3_bucket}/never/written")
    fs.delete_dir(f"{s3_bucket}/never")
    files = [f"{s3_bucket}/d/chk-1/{name}" for name in ("_metadata", "a", "b")]
    files.append(f"{s3_bucket}/d/chk-1/sub/c")
    for path in files:
        fs.write_bytes(path, b"x")
    keep = f"{s3_bucket}/d/chk-10/a"  # shares the name prefix "chk-1", not the directory
    fs.write_bytes(keep, b"keep")
    fs.delete_dir(f"{s3_bucket}/d/chk-1")
    assert [p for p in files if fs.exists(p)] == []
    assert list(_files_under(fs, f"{s3_bucket}/d/chk-1")) == []
    assert fs.read_bytes(keep) == b"keep"
    fs.delete_dir(f"{s3_bucket}/d/chk-1")  # again: gone already
    fs.delete_file(files[0])


def test_upload_and_download(s3_bucket: str, s3_options: Options, tmp_path: Path) -> None:
    fs = storage_fs(s3_bucket, s3_options)
    local = tmp_path / "000012.sst"
    data = os.urandom(6 * 1024 * 1024 + 123)  # more than one multipart part
    local.write_bytes(data)
    remote = f"{s3_bucket}/job/shared/1-op-0-000012.sst"
    fs.upload(str(local), remote)
    back = tmp_path / "back.sst"
    fs.download(remote, str(back))
    assert back.read_bytes() == data
    assert fs.read_range(remote, 5_000_000, 10) == data[5_000_000:5_000_010]


def test_join_and_relative(s3_options: Options) -> None:
    fs = storage_fs("s3://bkt/ck", s3_options)
    chk = fs.join("s3://bkt/ck", "job", "chk-4")
    assert chk == "s3://bkt/ck/job/chk-4"
    assert fs.join(chk, "..", "shared", "f.sst") == "s3://bkt/ck/job/shared/f.sst"
    assert fs.join(chk + "/", "./op-0.kst") == "s3://bkt/ck/job/chk-4/op-0.kst"
    assert fs.join("s3://bkt", "a") == "s3://bkt/a"
    assert fs.relative(chk, "s3://bkt/ck/job/shared/f.sst") == "../shared/f.sst"
    assert fs.relative(chk, "s3://bkt/ck/job/chk-4/op-0.kst") == "op-0.kst"
    moved = "s3://other/sp/copy"
    assert fs.join(moved, fs.relative(chk, f"{chk}/op-0.arrow")) == f"{moved}/op-0.arrow"
    assert normalize_location("s3://bkt/a/../b/") == "s3://bkt/b"
    assert normalize_location("s3://bkt/") == "s3://bkt"


# ---------------------------------------------------------------- CheckpointStorage on S3


def test_checkpoint_storage_on_s3(s3_bucket: str, s3_options: Options) -> None:
    root = f"{s3_bucket}/checkpoints"
    storage = CheckpointStorage(root + "/", "job-a", s3_options)
    assert storage.root == root and storage.job_dir == f"{root}/job-a"
    assert storage.shared_dir == f"{root}/job-a/shared"
    storage.check_writable()
    fs = storage.fs
    assert [n for n in fs.listdir(storage.job_dir) if fs.exists(f"{storage.job_dir}/{n}")] == []
    assert storage.completed_ids() == [] and storage.max_checkpoint_id() == 0

    d2 = storage.checkpoint_dir(2)
    assert d2 == f"{root}/job-a/chk-2"
    fs.write_bytes(f"{d2}/op-0.kst", b"state")  # a task's file: pending until _metadata
    assert storage.checkpoint_ids() == [2] and storage.completed_ids() == []
    assert storage.write_metadata(2, _md("job-a", 2)) == f"{d2}/_metadata"
    storage.write_metadata(5, _md("job-a", 5))
    assert storage.completed_ids() == [2, 5] and storage.latest_completed_id() == 5
    assert storage.max_checkpoint_id() == 5
    assert storage.load(2) == _md("job-a", 2)
    with pytest.raises(CheckpointError, match="metadata of checkpoint 3 cannot be written as"):
        storage.write_metadata(2, _md("job-a", 3))
    fs.write_bytes(f"{storage.shared_dir}/2-op-0-aa.kst", b"s")
    assert storage.shared_files() == [f"{storage.shared_dir}/2-op-0-aa.kst"]

    storage.discard(2)
    storage.discard(2)
    storage.discard(99)
    assert not fs.exists(f"{d2}/op-0.kst") and not fs.exists(f"{d2}/_metadata")
    assert storage.completed_ids() == [5]  # a lingering empty prefix is not a checkpoint
    with pytest.raises(CheckpointError, match="chk-2: not a completed checkpoint"):
        load_metadata(d2, s3_options)
    d5 = storage.checkpoint_path(5)
    assert load_metadata(d5, s3_options) == (d5, _md("job-a", 5))
    assert load_metadata(f"{d5}/_metadata", s3_options) == (d5, _md("job-a", 5))


def test_scan_checkpoints_reports_corrupt_metadata(s3_bucket: str, s3_options: Options) -> None:
    root = f"{s3_bucket}/ck"
    a = CheckpointStorage(root, "job-a", s3_options)
    b = CheckpointStorage(root, "job-b", s3_options)
    a.write_metadata(1, _md("job-a", 1))
    a.write_metadata(3, _md("job-a", 3))
    b.write_metadata(2, _md("job-b", 2))
    a.fs.write_bytes(f"{a.checkpoint_path(4)}/op-0.kst", b"pending")  # no _metadata
    corrupt = f"{a.checkpoint_path(7)}/_metadata"
    a.fs.write_bytes(corrupt, b'{"format": "epochstream-checkpoint", "ver')

    entries = scan_checkpoints(root, s3_options)
    assert [(e.job, e.checkpoint_id, e.ok) for e in entries] == [
        ("job-a", 1, True),
        ("job-a", 3, True),
        ("job-a", 7, False),
        ("job-b", 2, True),
    ]
    bad = entries[2]
    assert bad.directory == a.checkpoint_path(7)
    assert bad.error is not None and corrupt in bad.error and "not valid" in bad.error
    found = find_completed_checkpoints(a.job_dir, s3_options)
    assert [(d, m.checkpoint_id) for d, m in found] == [
        (a.checkpoint_path(1), 1),
        (a.checkpoint_path(3), 3),
    ]
    with pytest.raises(CheckpointError, match=r"chk-7/_metadata: not valid checkpoint metadata"):
        a.load(7)
    with pytest.raises(CheckpointError, match="no such checkpoint directory"):
        scan_checkpoints(f"{root}/missing", s3_options)


def test_wrong_credentials_fail_check_writable(s3_bucket: str, s3_options: Options) -> None:
    root = f"{s3_bucket}/ck"
    wrong = {**s3_options, "secret_key": s3_options["secret_key"] + "-wrong"}
    storage = CheckpointStorage(root, "job", wrong)
    with pytest.raises(CheckpointError, match=f"checkpoint storage {root} is not usable"):
        storage.check_writable()
    unknown = {**s3_options, "access_key": "AKNOBODY", "secret_key": "nothing"}
    with pytest.raises(CheckpointError, match=f"checkpoint storage {root} is not usable"):
        CheckpointStorage(root, "job", unknown).check_writable()
    missing_bucket = f"{s3_bucket}-missing/ck"
    with pytest.raises(CheckpointError, match=f"checkpoint storage {missing_bucket} is not"):
        CheckpointStorage(missing_bucket, "job", s3_options).check_writable()
    CheckpointStorage(root, "job", s3_options).check_writable()  # the right ones work


def test_credentials_from_aws_environment(
    s3_bucket: str, s3_options: Options, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = f"{s3_bucket}/env"
    # An S3 filesystem made before the variables were set must not be reused after.
    for name in (
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT_URL_S3",
        "AWS_ACCESS_KEY_ID",
        "AWS_SESSION_TOKEN",
    ):
        monkeypatch.delenv(name, raising=False)
    storage_fs(root)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_options["endpoint_url"])
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_options["access_key"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_options["secret_key"])
    monkeypatch.setenv("AWS_REGION", s3_options["region"])

    storage = CheckpointStorage(root, "job")
    storage.check_writable()
    storage.write_metadata(1, _md("job", 1))
    assert storage.completed_ids() == [1]
    assert load_metadata(storage.checkpoint_path(1))[1] == _md("job", 1)
    # Written with the environment's credentials, readable with explicit ones.
    assert storage_fs(root, s3_options).exists(storage.metadata_path(1))

    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    with pytest.raises(CheckpointError, match=f"checkpoint storage {root} is not usable"):
        CheckpointStorage(root, "job").check_writable()
    # Explicit storage_options win over the environment.
    CheckpointStorage(root, "job", s3_options).check_writable()


def test_given_credentials_are_one_set(
    s3_bucket: str, s3_options: Options, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = f"{s3_bucket}/ck"
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    # The environment's keys and session token belong together, not with given keys.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKOTHERROLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "other-secret")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "token-of-another-role")
    CheckpointStorage(root, "job", s3_options).check_writable()
    # Only the endpoint given: the credentials come from the environment, as a set.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_options["access_key"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_options["secret_key"])
    monkeypatch.delenv("AWS_SESSION_TOKEN")
    endpoint_only = {"endpoint_url": s3_options["endpoint_url"]}
    CheckpointStorage(root, "job", endpoint_only).check_writable()
    with pytest.raises(ConfigurationError, match="access_key and secret_key together"):
        storage_fs(root, {**endpoint_only, "access_key": s3_options["access_key"]})
    with pytest.raises(ConfigurationError, match=r"unknown storage option\(s\) \['endpoint'\]"):
        storage_fs(root, {"endpoint": s3_options["endpoint_url"]})


# ---------------------------------------------------------------- keyed state backends on S3

MAX_P = 128
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
        storage.write_metadata(n, _md("job", n, {"op": {0: OperatorSubtaskState(keyed=handle)}}))
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
    metadata = _md("job", 2, {"op": handles}, kind=KIND_SAVEPOINT)
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

    def fail_job(self, reason: str) -> None:
        raise AssertionError(f"job failed: {reason}")


@pytest.mark.parametrize("savepoint_on", ["s3", "local"])
def test_savepoint_to_other_storage_than_checkpoints(
    savepoint_on: str,
    s3_bucket: str,
    s3_options: Options,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from epochstream.checkpoint.config import CheckpointConfig
    from epochstream.checkpoint.coordinator import CheckpointCoordinator
    from epochstream.runtime.messages import AcknowledgeCheckpoint, TaskCheckpointStats

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
    coordinator.start_attempt({task}, {task})
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
