from __future__ import annotations

import os

import pytest

from epochstream.checkpoint.metadata import CheckpointMetadata
from epochstream.checkpoint.storage import (
    CheckpointStorage,
    find_completed_checkpoints,
    load_metadata,
)
from epochstream.core.checkpoint_stats import CheckpointStats
from epochstream.exceptions import CheckpointError, ConfigurationError
from epochstream.state.handles import OperatorSubtaskState


def md(job_id: str, n: int) -> CheckpointMetadata:
    return CheckpointMetadata(
        job_id=job_id,
        checkpoint_id=n,
        trigger_time=float(n),
        completion_time=n + 0.5,
        parallelism=1,
        max_parallelism=128,
        operators={"src": {0: OperatorSubtaskState(operator_lists={"offsets": [n * 10]})}},
        operator_parallelism={"src": 1},
        stats=CheckpointStats(checkpoint_id=n, trigger_time=float(n), duration=0.5, state_size=0),
    )


def test_layout_and_completion_marker(tmp_path) -> None:
    storage = CheckpointStorage(str(tmp_path), "job-a")
    assert storage.job_dir == str(tmp_path / "job-a")
    assert storage.max_checkpoint_id() == 0 and storage.completed_ids() == []
    d1 = storage.checkpoint_dir(1)
    d2 = storage.checkpoint_dir(2)
    assert d1 == str(tmp_path / "job-a" / "chk-1") and os.path.isdir(d1)
    with open(os.path.join(d2, "state.kst"), "wb") as f:
        f.write(b"x")
    # Directories exist but nothing is complete until _metadata is written.
    assert storage.completed_ids() == []
    assert storage.max_checkpoint_id() == 2
    path = storage.write_metadata(2, md("job-a", 2))
    assert path == os.path.join(d2, "_metadata")
    assert storage.completed_ids() == [2]
    assert storage.load(2) == md("job-a", 2)
    # Only _metadata and the task file: the temporary file was renamed away.
    assert sorted(os.listdir(d2)) == ["_metadata", "state.kst"]


def test_write_metadata_replaces_atomically_and_checks_id(tmp_path) -> None:
    storage = CheckpointStorage(str(tmp_path), "j")
    storage.write_metadata(3, md("j", 3))
    with pytest.raises(CheckpointError, match="metadata of checkpoint 4 cannot be written as"):
        storage.write_metadata(3, md("j", 4))
    assert storage.load(3).checkpoint_id == 3


def test_write_metadata_failure_leaves_no_metadata(tmp_path) -> None:
    storage = CheckpointStorage(str(tmp_path), "j")
    directory = storage.checkpoint_dir(1)
    os.mkdir(os.path.join(directory, "_metadata"))  # os.replace onto a directory fails
    with pytest.raises(CheckpointError, match=r"chk-1/_metadata: cannot write"):
        storage.write_metadata(1, md("j", 1))
    assert [n for n in os.listdir(directory) if n.startswith("._metadata")] == []


def test_discard_and_ignore_missing(tmp_path) -> None:
    storage = CheckpointStorage(str(tmp_path), "j")
    storage.checkpoint_dir(1)
    storage.write_metadata(1, md("j", 1))
    storage.discard(1)
    storage.discard(1)
    storage.discard(99)
    assert storage.completed_ids() == [] and storage.max_checkpoint_id() == 0


def test_ids_ignore_foreign_entries(tmp_path) -> None:
    storage = CheckpointStorage(str(tmp_path), "j")
    for n in (2, 10):
        storage.checkpoint_dir(n)
    os.makedirs(os.path.join(storage.job_dir, "chk-x"))
    os.makedirs(os.path.join(storage.job_dir, "chk-007"))
    with open(os.path.join(storage.job_dir, "chk-50"), "w") as f:
        f.write("a file, not a checkpoint")
    assert storage.checkpoint_ids() == [2, 10]
    assert storage.max_checkpoint_id() == 10


def test_bad_job_id_and_ids(tmp_path) -> None:
    for bad in ("", "..", "a/b"):
        with pytest.raises(ConfigurationError, match="job id"):
            CheckpointStorage(str(tmp_path), bad)
    storage = CheckpointStorage(str(tmp_path), "j")
    with pytest.raises(ValueError, match="start at 1"):
        storage.checkpoint_dir(0)


def test_file_url_root(tmp_path) -> None:
    storage = CheckpointStorage(f"file://{tmp_path}", "j")
    assert storage.checkpoint_dir(1) == str(tmp_path / "j" / "chk-1")


def test_load_metadata_from_dir_or_file(tmp_path) -> None:
    storage = CheckpointStorage(str(tmp_path), "j")
    storage.write_metadata(4, md("j", 4))
    d = storage.checkpoint_path(4)
    assert load_metadata(d) == (d, md("j", 4))
    assert load_metadata(os.path.join(d, "_metadata")) == (d, md("j", 4))
    storage.checkpoint_dir(5)
    with pytest.raises(CheckpointError, match="chk-5: not a completed checkpoint"):
        load_metadata(storage.checkpoint_path(5))


def test_corrupt_metadata_names_file(tmp_path) -> None:
    storage = CheckpointStorage(str(tmp_path), "j")
    with open(os.path.join(storage.checkpoint_dir(1), "_metadata"), "wb") as f:
        f.write(b'{"format": "epochstream-checkpoint", "version": 1')
    with pytest.raises(CheckpointError, match=r"chk-1/_metadata: not valid checkpoint metadata"):
        storage.load(1)


def test_find_completed_checkpoints_at_every_level(tmp_path) -> None:
    a = CheckpointStorage(str(tmp_path), "job-b")
    b = CheckpointStorage(str(tmp_path), "job-a")
    for n in (10, 2):
        a.write_metadata(n, md("job-b", n))
    a.checkpoint_dir(11)  # pending: not listed
    b.write_metadata(5, md("job-a", 5))
    os.makedirs(tmp_path / "unrelated")

    found = find_completed_checkpoints(str(tmp_path))
    assert [(m.job_id, m.checkpoint_id) for _, m in found] == [
        ("job-a", 5),
        ("job-b", 2),
        ("job-b", 10),
    ]
    assert found[0][0] == b.checkpoint_path(5)
    in_job = find_completed_checkpoints(a.job_dir)
    assert [m.checkpoint_id for _, m in in_job] == [2, 10]
    single = find_completed_checkpoints(a.checkpoint_path(10))
    assert [(d, m.checkpoint_id) for d, m in single] == [(a.checkpoint_path(10), 10)]
    assert find_completed_checkpoints(str(tmp_path / "unrelated")) == []
    with pytest.raises(CheckpointError, match="no such checkpoint directory"):
        find_completed_checkpoints(str(tmp_path / "missing"))


# ---------------------------------------------------------------- unusable and private storage

import stat  # noqa: E402

from epochstream.checkpoint.storage import scan_checkpoints  # noqa: E402
from epochstream.core.checkpoint_config import CheckpointConfig  # noqa: E402


def test_storage_under_a_regular_file_is_a_checkpoint_error(tmp_path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    storage = CheckpointStorage(str(blocker / "ckpt"), "job-1")
    with pytest.raises(CheckpointError) as info:
        storage.check_writable()
    assert str(blocker) in str(info.value)
    storage = CheckpointStorage(str(blocker), "job-1")
    with pytest.raises(CheckpointError) as info:
        storage.max_checkpoint_id()
    assert str(blocker) in str(info.value)


def test_storage_that_cannot_be_created_is_reported_with_its_path() -> None:
    storage = CheckpointStorage("/proc/self/epochstream-ckpt", "job-1")  # even root cannot
    with pytest.raises(CheckpointError, match="/proc/self/epochstream-ckpt"):
        storage.check_writable()


def test_default_storage_is_private_to_the_user(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    config = CheckpointConfig()
    assert config.storage == str(tmp_path / "cache" / "epochstream" / "checkpoints")
    for directory in (
        tmp_path / "cache" / "epochstream",
        tmp_path / "cache" / "epochstream" / "checkpoints",
    ):
        assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700


def test_checkpoint_files_and_directories_are_private(tmp_path) -> None:
    storage = CheckpointStorage(str(tmp_path / "root"), "job-1")
    storage.check_writable()
    storage.write_metadata(1, md("job-1", 1))
    assert stat.S_IMODE(os.stat(storage.job_dir).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(storage.checkpoint_path(1)).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(storage.metadata_path(1)).st_mode) == 0o600
    assert os.listdir(storage.job_dir) == ["chk-1"], "the probe file must be gone"


def test_scan_reports_corrupt_metadata_instead_of_raising(tmp_path) -> None:
    storage = CheckpointStorage(str(tmp_path), "job-1")
    storage.write_metadata(1, md("job-1", 1))
    storage.write_metadata(2, md("job-1", 2))
    with open(storage.metadata_path(1), "wb") as f:
        f.write(b"{not json")
    entries = scan_checkpoints(str(tmp_path))
    assert [(e.checkpoint_id, e.ok) for e in entries] == [(1, False), (2, True)]
    assert "not valid checkpoint metadata JSON" in (entries[0].error or "")
    assert [m.checkpoint_id for _, m in find_completed_checkpoints(str(tmp_path))] == [2]


def test_discard_deletes_metadata_before_the_state_files(tmp_path, monkeypatch) -> None:
    from epochstream.core.filesystems import LocalFS

    storage = CheckpointStorage(str(tmp_path), "j")
    directory = storage.checkpoint_dir(1)
    with open(os.path.join(directory, "_metadata"), "wb") as f:
        f.write(b"{}")
    calls: list[tuple[str, str]] = []
    real_delete_file, real_delete_dir = LocalFS.delete_file, LocalFS.delete_dir

    def delete_file(self, path: str) -> None:
        calls.append(("file", os.path.basename(path)))
        real_delete_file(self, path)

    def delete_dir(self, path: str) -> None:
        calls.append(("dir", os.path.basename(path)))
        real_delete_dir(self, path)

    monkeypatch.setattr(LocalFS, "delete_file", delete_file)
    monkeypatch.setattr(LocalFS, "delete_dir", delete_dir)
    storage.discard(1)
    # A deletion cut short must not leave a "complete" checkpoint without its files.
    assert calls == [("file", "_metadata"), ("dir", "chk-1")]
    assert storage.completed_ids() == []


def test_probe_and_metadata_reads_on_unreachable_storage(tmp_path, monkeypatch) -> None:
    from epochstream.checkpoint import storage as storage_module
    from epochstream.core import storage_faults
    from epochstream.exceptions import StorageUnavailableError

    storage = CheckpointStorage(str(tmp_path / "ck"), "j")
    storage.check_writable()
    storage.probe(None)
    monkeypatch.setattr(
        storage_module,
        "READ_RETRY",
        storage_faults.StorageRetry(
            storage_faults.Backoff(deadline=1.0), sleep=lambda s: None, clock=lambda: 0.0
        ),
    )
    # The checkpoint location replaced by a regular file (its mount went away).
    os.rename(tmp_path / "ck", tmp_path / "away")
    (tmp_path / "ck").write_text("not a directory")
    with pytest.raises(NotADirectoryError):
        storage.probe(1)
    with pytest.raises(StorageUnavailableError, match="storage unavailable"):
        storage.load(1)
    with pytest.raises(StorageUnavailableError):
        storage.checkpoint_ids()


def test_a_job_directory_whose_file_system_went_away_is_not_created_again(tmp_path) -> None:
    """Writing into a bare mount point would hide the checkpoint's earlier files once
    the file system is back: the write fails as an outage instead."""
    from epochstream.core.filesystems import LocalFS
    from epochstream.core.storage_faults import is_unavailable

    storage = CheckpointStorage(str(tmp_path / "ckpt"), "j")
    storage.write_metadata(1, md("j", 1))  # makes the job directory, once
    (tmp_path / "ckpt").rename(tmp_path / "away")  # umount: the empty mount point stays
    (tmp_path / "ckpt").mkdir()
    fs = LocalFS()
    for write in (
        lambda: storage.checkpoint_dir(2),
        lambda: storage.write_metadata(2, md("j", 2)),
        lambda: fs.write_bytes(os.path.join(storage.job_dir, "shared", "2-op-0.kst"), b"x"),
        lambda: fs.write_bytes(os.path.join(storage.job_dir, "chk-2", "op-0-db", "1.sst"), b"x"),
    ):
        with pytest.raises((OSError, CheckpointError)) as caught:
            write()
        assert is_unavailable(caught.value)
    assert os.listdir(tmp_path / "ckpt") == []
    # A job directory made afresh in a root that holds other jobs is fine.
    (tmp_path / "ckpt").rmdir()
    (tmp_path / "away").rename(tmp_path / "ckpt")
    other = CheckpointStorage(str(tmp_path / "ckpt"), "k")
    assert os.path.isdir(other.checkpoint_dir(1))


def test_probe_fails_while_storage_reads_but_takes_no_writes(tmp_path, monkeypatch) -> None:
    """A full disk or a read-only mount still reads: the job master's probe writes too,
    so it does not restart into the same failing checkpoint."""
    import errno

    from epochstream.core.filesystems import LocalFS
    from epochstream.core.storage_faults import is_unavailable

    storage = CheckpointStorage(str(tmp_path), "j")
    storage.write_metadata(1, md("j", 1))
    storage.probe(1)
    assert [
        n for n in os.listdir(os.path.join(storage.job_dir, "shared")) if n.startswith(".probe")
    ] == []

    def full(self, path, data):
        with open(path, "wb"):
            pass  # created, then the disk is full
        raise OSError(errno.ENOSPC, "No space left on device", path)

    monkeypatch.setattr(LocalFS, "write_bytes", full)
    with pytest.raises(OSError) as caught:
        storage.probe(1)
    assert is_unavailable(caught.value)
    assert [
        n for n in os.listdir(os.path.join(storage.job_dir, "shared")) if n.startswith(".probe")
    ] == []


def test_probe_does_not_make_a_vanished_job_directory_again(tmp_path) -> None:
    from epochstream.core.storage_faults import is_unavailable

    storage = CheckpointStorage(str(tmp_path / "ckpt"), "j")
    storage.write_metadata(1, md("j", 1))
    (tmp_path / "ckpt").rename(tmp_path / "away")  # umount
    (tmp_path / "ckpt").mkdir()
    with pytest.raises(OSError) as caught:
        storage.probe(None)
    assert is_unavailable(caught.value) and os.listdir(tmp_path / "ckpt") == []
