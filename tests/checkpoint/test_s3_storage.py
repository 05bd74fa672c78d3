"""Checkpoint storage on a real S3 object store (SeaweedFS on loopback, see tests/conftest.py).

SeaweedFS keeps listing a deleted prefix as a directory for a few minutes, so these
tests decide what exists from files (``exists``), never from prefixes. Their shared
helpers are in ``s3_storage_support``.

This module: the :class:`StorageFS` contract on ``s3://`` locations.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from s3_storage_support import Options, files_under

from epochstream.core.filesystems import normalize_location, storage_fs

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
    assert list(files_under(fs, f"{s3_bucket}/d/chk-1")) == []
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
