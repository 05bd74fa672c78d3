"""``CheckpointStorage`` on a bucket of the real S3 store (see ``test_s3_storage``):
checkpoints, corrupt metadata, and credentials (wrong ones, ones from the ``AWS_*``
environment, given ones as one set)."""

from __future__ import annotations

import pytest
from s3_storage_support import Options, checkpoint_metadata

from epochstream.checkpoint.storage import (
    CheckpointStorage,
    find_completed_checkpoints,
    load_metadata,
    scan_checkpoints,
)
from epochstream.core.filesystems import storage_fs
from epochstream.exceptions import CheckpointError, ConfigurationError

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
    assert storage.write_metadata(2, checkpoint_metadata("job-a", 2)) == f"{d2}/_metadata"
    storage.write_metadata(5, checkpoint_metadata("job-a", 5))
    assert storage.completed_ids() == [2, 5] and storage.latest_completed_id() == 5
    assert storage.max_checkpoint_id() == 5
    assert storage.load(2) == checkpoint_metadata("job-a", 2)
    with pytest.raises(CheckpointError, match="metadata of checkpoint 3 cannot be written as"):
        storage.write_metadata(2, checkpoint_metadata("job-a", 3))
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
    assert load_metadata(d5, s3_options) == (d5, checkpoint_metadata("job-a", 5))
    assert load_metadata(f"{d5}/_metadata", s3_options) == (d5, checkpoint_metadata("job-a", 5))


def test_scan_checkpoints_reports_corrupt_metadata(s3_bucket: str, s3_options: Options) -> None:
    root = f"{s3_bucket}/ck"
    a = CheckpointStorage(root, "job-a", s3_options)
    b = CheckpointStorage(root, "job-b", s3_options)
    a.write_metadata(1, checkpoint_metadata("job-a", 1))
    a.write_metadata(3, checkpoint_metadata("job-a", 3))
    b.write_metadata(2, checkpoint_metadata("job-b", 2))
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
    storage.write_metadata(1, checkpoint_metadata("job", 1))
    assert storage.completed_ids() == [1]
    assert load_metadata(storage.checkpoint_path(1))[1] == checkpoint_metadata("job", 1)
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
