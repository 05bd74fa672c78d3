"""Storage errors classified, and reads retried with bounded back-off (fake clock, no sleeping)."""

from __future__ import annotations

import errno

import pytest

from epochstream.core.storage_faults import (
    Backoff,
    StorageFault,
    StorageRetry,
    classify,
    is_unavailable,
    read_error,
    unavailable_or,
)
from epochstream.exceptions import (
    CheckpointError,
    CorruptStateError,
    StateError,
    StorageUnavailableError,
)

# How pyarrow's S3 client reports a server that is down (seen against SeaweedFS).
S3_DOWN = OSError(
    "When reading information for key 'x/y' in bucket 'b': AWS Error NETWORK_CONNECTION "
    "during HeadObject operation: curlCode: 7, Could not connect to server"
)


@pytest.mark.parametrize(
    "error",
    [
        ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"),
        TimeoutError("timed out"),
        S3_DOWN,
        OSError("AWS Error SLOW_DOWN during PutObject operation: Please reduce your request rate"),
        OSError("AWS Error UNKNOWN (HTTP status 503) during GetObject operation"),
        OSError("AWS Error SERVICE_UNAVAILABLE during ListObjectsV2 operation"),
        PermissionError(errno.EACCES, "Permission denied"),
        OSError(errno.EROFS, "Read-only file system"),
        OSError(errno.ENOSPC, "No space left on device"),
        NotADirectoryError(errno.ENOTDIR, "Not a directory"),
        StorageUnavailableError("down", path="s3://b/k"),
    ],
)
def test_outages_are_transient(error: BaseException) -> None:
    assert classify(error) is StorageFault.TRANSIENT
    assert is_unavailable(error)


@pytest.mark.parametrize(
    "error",
    [
        FileNotFoundError(2, "Path does not exist 'b/x/nope'"),
        CorruptStateError("checksum mismatch", path="/ck/a"),
    ],
)
def test_missing_files_and_bad_checksums_are_corrupt(error: BaseException) -> None:
    assert classify(error) is StorageFault.CORRUPT


def test_other_errors_are_neither() -> None:
    assert classify(ValueError("bug")) is StorageFault.OTHER
    assert (
        classify(OSError("AWS Error ACCESS_DENIED during GetObject operation"))
        is StorageFault.OTHER
    )


def test_the_cause_chain_decides_for_wrappers() -> None:
    try:
        try:
            raise ConnectionResetError(errno.ECONNRESET, "reset")
        except OSError as inner:
            raise StateError("cannot write keyed state file") from inner
    except StateError as outer:
        assert classify(outer) is StorageFault.TRANSIENT


def test_backoff_grows_to_its_cap() -> None:
    delays = Backoff(initial=0.5, multiplier=2, max_delay=2, deadline=None).delays()
    assert [next(delays) for _ in range(5)] == [0.5, 1.0, 2.0, 2.0, 2.0]
    with pytest.raises(ValueError):
        Backoff(initial=0)


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    def clock(self) -> float:
        return self.now


def _retry(deadline: float) -> tuple[StorageRetry, FakeTime]:
    fake = FakeTime()
    backoff = Backoff(initial=1, multiplier=2, max_delay=4, deadline=deadline)
    return StorageRetry(backoff, sleep=fake.sleep, clock=fake.clock), fake


def test_a_transient_failure_is_retried_until_the_read_succeeds() -> None:
    retry, fake = _retry(deadline=30)
    answers: list[BaseException | bytes] = [S3_DOWN, S3_DOWN, b"data"]

    def read() -> bytes:
        answer = answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    assert retry.run(read, what="read", path="s3://b/k") == b"data"
    assert fake.sleeps == [1, 2]


def test_the_deadline_ends_retrying_with_storage_unavailable() -> None:
    retry, fake = _retry(deadline=10)

    def read() -> bytes:
        raise S3_DOWN

    with pytest.raises(StorageUnavailableError, match="storage unavailable") as info:
        retry.run(read, what="read keyed state file", path="s3://b/k")
    assert info.value.path == "s3://b/k"
    assert info.value.__cause__ is S3_DOWN
    assert isinstance(info.value, CheckpointError)
    assert fake.sleeps == [1, 2, 4]  # the next 4 s would pass the 10 s deadline
    assert sum(fake.sleeps) <= 10


def test_errors_that_are_not_outages_are_not_retried() -> None:
    retry, fake = _retry(deadline=10)
    missing = FileNotFoundError(2, "gone")

    def read() -> bytes:
        raise missing

    with pytest.raises(FileNotFoundError):
        retry.run(read, what="read", path="/ck/a")
    assert fake.sleeps == []


def test_read_error_maps_each_fault_to_its_exception() -> None:
    assert isinstance(read_error(S3_DOWN, what="read", path="p"), StorageUnavailableError)
    corrupt = read_error(FileNotFoundError(2, "gone"), what="read", path="p")
    assert isinstance(corrupt, CorruptStateError) and corrupt.path == "p"
    other = read_error(OSError("AWS Error ACCESS_DENIED"), what="read", path="p")
    assert type(other) is StateError


def test_unavailable_or_keeps_the_callers_error_for_other_faults() -> None:
    assert isinstance(
        unavailable_or(S3_DOWN, what="write", path="p", other=StateError), StorageUnavailableError
    )
    err = unavailable_or(ValueError("bad"), what="write", path="p", other=StateError)
    assert type(err) is StateError and "cannot write p" in str(err)


def test_storage_unavailable_pickles_with_its_path() -> None:
    import pickle

    err = pickle.loads(pickle.dumps(StorageUnavailableError("down", path="s3://b/k")))
    assert isinstance(err, StorageUnavailableError) and err.path == "s3://b/k"


def _missing(path: object) -> FileNotFoundError:
    return FileNotFoundError(errno.ENOENT, "No such file or directory", str(path))


def test_a_file_missing_from_a_local_directory_that_is_there_is_corruption(tmp_path) -> None:
    shared = tmp_path / "root" / "job" / "shared"
    shared.mkdir(parents=True)
    assert classify(_missing(shared / "1-op-0.kst")) is StorageFault.CORRUPT
    # A deleted chk-<n> in a job directory that holds other files: corruption too.
    (tmp_path / "root" / "job" / "chk-1").mkdir()
    assert (
        classify(_missing(tmp_path / "root" / "job" / "chk-2" / "_metadata"))
        is StorageFault.CORRUPT
    )


def test_a_local_store_whose_file_system_went_away_is_an_outage(tmp_path) -> None:
    """An unmounted file system leaves its empty mount point: the job directory is gone
    and what is left above it is empty. Falling back would write committed output again."""
    mount_point = tmp_path / "ckpt"
    mount_point.mkdir()
    for path in (
        mount_point / "job" / "shared" / "1-op-0.kst",
        mount_point / "job" / "chk-2" / "_metadata",
        mount_point / "job" / "chk-2" / "op-0-db" / "000001.sst",
    ):
        error = _missing(path)
        assert classify(error) is StorageFault.TRANSIENT, path
        assert isinstance(read_error(error, what="read", path=str(path)), StorageUnavailableError)
    # Object-store keys are answers of the store: a 404 stays corruption.
    assert classify(_missing("bucket/job/shared/x")) is StorageFault.CORRUPT
