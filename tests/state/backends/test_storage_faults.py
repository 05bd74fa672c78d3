"""State files on storage that is down are unavailable, not corrupt; missing ones are corrupt.

One classification for the heap backend's files, canonical/columnar (Arrow IPC) files and
RocksDB downloads: a fake filesystem fails like an unreachable store, a fake clock and
sleep make the retries instant.
"""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import pytest

from epochstream.core import storage_faults
from epochstream.core.filesystems import LocalFS
from epochstream.exceptions import CorruptStateError, StateError, StorageUnavailableError
from epochstream.state import canonical
from epochstream.state.backends.heap import files as heap_files
from epochstream.state.backends.heap.files import encode_block, merge_chain, write_encoded
from epochstream.state.handles import HeapStateFile
from epochstream.state.keygroups import KeyGroupAssigner

GROUPS = range(0, 8)
ASSIGNER = KeyGroupAssigner.shared(128)
DOWN = OSError("AWS Error NETWORK_CONNECTION during GetObject operation: curlCode: 7")


class FlakyFS(LocalFS):
    """A local filesystem whose reads fail ``failures`` times with ``error`` first."""

    def __init__(self, error: BaseException, failures: int) -> None:
        self.error = error
        self.failures = failures
        self.reads = 0

    def open_read(self, path: str) -> Any:
        self.reads += 1
        if self.failures:
            self.failures -= 1
            raise self.error
        return super().open_read(path)

    def open_write(self, path: str) -> Any:
        raise self.error


@pytest.fixture(autouse=True)
def instant_retries(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    sleeps: list[float] = []
    now = [0.0]

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        now[0] += seconds

    retry = storage_faults.StorageRetry(
        storage_faults.Backoff(deadline=10.0), sleep=sleep, clock=lambda: now[0]
    )
    monkeypatch.setattr(heap_files, "READ_RETRY", retry)
    monkeypatch.setattr(canonical, "READ_RETRY", retry)
    return sleeps


def _file(tmp_path: Path) -> HeapStateFile:
    path = str(tmp_path / "a.kst")
    spans, size = write_encoded(LocalFS(), path, encode_block({"s": {"k": 1}}), GROUPS)
    return HeapStateFile(path, True, spans, size, shared=False)


def test_a_heap_file_read_outlives_a_short_outage(
    tmp_path: Path, instant_retries: list[float]
) -> None:
    file = _file(tmp_path)
    fs = FlakyFS(DOWN, failures=2)
    assert merge_chain(fs, [file], GROUPS, ASSIGNER) == {"s": {"k": 1}}
    assert instant_retries == [0.25, 0.5]


def test_a_heap_file_on_storage_that_stays_down_is_unavailable_not_corrupt(tmp_path: Path) -> None:
    file = _file(tmp_path)
    with pytest.raises(StorageUnavailableError, match=r"a\.kst: storage unavailable") as info:
        merge_chain(FlakyFS(DOWN, failures=1000), [file], GROUPS, ASSIGNER)
    assert not isinstance(info.value, CorruptStateError)


def test_a_missing_heap_file_is_corrupt(tmp_path: Path, instant_retries: list[float]) -> None:
    file = _file(tmp_path)
    Path(file.path).unlink()
    with pytest.raises(CorruptStateError, match="cannot read keyed state file"):
        merge_chain(LocalFS(), [file], GROUPS, ASSIGNER)
    assert instant_retries == []  # a store that answers "not there" is not retried


def test_writing_a_heap_file_to_storage_that_is_down_is_unavailable(tmp_path: Path) -> None:
    fs = FlakyFS(OSError(errno.EROFS, "Read-only file system"), failures=1)
    with pytest.raises(StorageUnavailableError, match="cannot write keyed state file"):
        write_encoded(fs, str(tmp_path / "b.kst"), encode_block({"s": {}}), GROUPS)
    with pytest.raises(StateError) as info:
        write_encoded(
            FlakyFS(FileExistsError(17, "exists"), 1), str(tmp_path / "c"), encode_block({}), GROUPS
        )
    assert not isinstance(info.value, StorageUnavailableError)


def test_an_arrow_state_file_on_storage_that_is_down_is_unavailable(tmp_path: Path) -> None:
    import pyarrow as pa

    path = str(tmp_path / "s.arrow")
    table = pa.table({"x": [1, 2]})
    _, _, crc = canonical.write_ipc_file(
        LocalFS(), path, table.schema, [(0, table.to_batches()[0])]
    )
    assert canonical._open(FlakyFS(DOWN, failures=2), path, crc).num_record_batches == 1
    with pytest.raises(StorageUnavailableError):
        canonical._open(FlakyFS(DOWN, failures=1000), path, crc)
    with pytest.raises(CorruptStateError, match="checksum mismatch"):
        canonical._open(LocalFS(), path, crc ^ 1)
    Path(path).unlink()
    with pytest.raises(CorruptStateError):
        canonical._open(LocalFS(), path, crc)
