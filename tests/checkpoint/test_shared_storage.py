"""Shared hosts: a local checkpoint or savepoint path another local user could change is
refused before anything in it is unpickled (ssh's StrictModes), unless trusted.

The suite runs as root, whose files count as "ours": another user's directories are
made with ``os.chown`` to ``nobody`` (65534). Each planted ``_metadata`` carries a pickle
that creates a marker directory when loaded, so a test sees whether it was executed.
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
from pathlib import Path

import pytest

from epochstream.checkpoint.metadata import CheckpointMetadata
from epochstream.checkpoint.storage import (
    CheckpointStorage,
    load_metadata,
    scan_checkpoints,
    write_metadata_file,
)
from epochstream.core.checkpoint_stats import CheckpointStats
from epochstream.core.filesystems import (
    check_trusted_location,
    ensure_private_location,
    storage_fs,
)
from epochstream.core.private_files import trust_problem
from epochstream.deploy.assignment import restore_candidates
from epochstream.exceptions import UntrustedStorageError
from epochstream.state.handles import OperatorSubtaskState

NOBODY = 65534


class _Payload:
    """Unpickling it runs ``os.mkdir(marker)``: what a planted checkpoint would do."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.mkdir, (self.marker,))


def plant_checkpoint(job_dir: Path, marker: Path, checkpoint_id: int = 1) -> Path:
    """A completed checkpoint ``job_dir/chk-<id>`` whose metadata runs a payload on load."""
    md = CheckpointMetadata(
        job_id=job_dir.name,
        job_name="victim",
        checkpoint_id=checkpoint_id,
        trigger_time=1.0,
        completion_time=2.0,
        parallelism=1,
        max_parallelism=128,
        operators={"src": {0: OperatorSubtaskState(operator_lists={"s": [_Payload(str(marker))]})}},
        operator_parallelism={"src": 1},
        stats=CheckpointStats(
            checkpoint_id=checkpoint_id, trigger_time=1.0, duration=1.0, state_size=0, tasks={}
        ),
    )
    directory = job_dir / f"chk-{checkpoint_id}"
    directory.mkdir(parents=True, mode=0o700)
    write_metadata_file(storage_fs(str(directory)), str(directory), md)
    return directory


def squat(path: Path, *, mode: int = 0o777, uid: int | None = None, gid: int = -1) -> Path:
    """``path`` as another local user leaves it: ``mode`` (exactly), owned by ``uid``
    (and group ``gid``)."""
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, mode)
    if uid is not None or gid != -1:
        if os.geteuid() != 0:
            pytest.skip("giving a directory to another user needs root")
        os.chown(path, -1 if uid is None else uid, gid)
    return path


def test_a_private_path_and_a_missing_one_under_it_have_no_problem(tmp_path: Path) -> None:
    root = squat(tmp_path / "ck", mode=0o700)
    assert trust_problem(str(root)) is None
    assert trust_problem(str(root / "not" / "yet")) is None


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o1777, 0o722])
def test_a_root_others_can_write_is_a_problem_even_sticky(tmp_path: Path, mode: int) -> None:
    # Group nogroup: nobody, _apt and sync are in it, so group-writable lets them in.
    root = squat(tmp_path / "ck", mode=mode, gid=NOBODY)
    problem = trust_problem(str(root))
    assert problem is not None and "writable by group or others" in problem
    assert f"mode {mode:04o}" in problem and str(root) in problem


def test_a_root_writable_by_its_owners_private_group_is_fine(tmp_path: Path) -> None:
    # umask 002 with a group per user (Debian, Fedora): group-writable lets nobody else in.
    owner = pwd.getpwuid(os.geteuid())
    others = set(grp.getgrgid(owner.pw_gid).gr_mem) | {
        u.pw_name for u in pwd.getpwall() if u.pw_gid == owner.pw_gid
    }
    if others != {owner.pw_name}:
        pytest.skip(f"{owner.pw_name}'s primary group has other members here")
    root = squat(tmp_path / "ck", mode=0o770, gid=owner.pw_gid)
    assert trust_problem(str(root)) is None
    assert trust_problem(str(root / "chk-1")) is None


def test_a_root_owned_by_another_user_is_a_problem(tmp_path: Path) -> None:
    root = squat(tmp_path / "ck", mode=0o755, uid=NOBODY)
    problem = trust_problem(str(root))
    assert problem is not None and "owned by another user" in problem and "65534" in problem


def test_a_sticky_world_writable_parent_is_fine_a_plain_one_is_not(tmp_path: Path) -> None:
    sticky = squat(tmp_path / "sticky", mode=0o1777)
    assert trust_problem(str(squat(sticky / "ck", mode=0o700))) is None
    plain = squat(tmp_path / "plain", mode=0o777)
    problem = trust_problem(str(squat(plain / "ck", mode=0o700)))
    assert problem is not None and f"its parent {plain}" in problem and "not sticky" in problem


def test_a_parent_owned_by_another_user_is_a_problem(tmp_path: Path) -> None:
    theirs = squat(tmp_path / "theirs", mode=0o755, uid=NOBODY)
    mine = squat(theirs / "ck", mode=0o700)
    problem = trust_problem(str(mine))
    assert problem is not None and f"its parent {theirs}" in problem


def test_a_symlink_owned_by_another_user_in_the_path_is_a_problem(tmp_path: Path) -> None:
    target = squat(tmp_path / "real", mode=0o700)
    sticky = squat(tmp_path / "sticky", mode=0o1777)
    link = sticky / "ck"
    link.symlink_to(target)
    if os.geteuid() != 0:
        pytest.skip("giving a symlink to another user needs root")
    os.lchown(link, NOBODY, -1)  # they own the link: they can point it elsewhere
    problem = trust_problem(str(link / "job"))
    assert problem is not None and "symlink owned by another user" in problem


def test_a_symlink_is_judged_by_what_it_points_to(tmp_path: Path) -> None:
    open_dir = squat(tmp_path / "open", mode=0o777)
    link = squat(tmp_path / "mine", mode=0o700) / "ck"
    link.symlink_to(open_dir)
    assert trust_problem(str(link)) is not None


def test_the_error_names_path_owner_mode_and_the_opt_out(tmp_path: Path) -> None:
    root = squat(tmp_path / "ck", mode=0o777, uid=NOBODY)
    with pytest.raises(UntrustedStorageError) as info:
        check_trusted_location(str(root), what="checkpoint storage")
    text = str(info.value)
    assert str(root) in text and "uid 65534" in text and "0777" in text
    assert "trust_shared_storage=True" in text and "--trust-shared-storage" in text
    check_trusted_location(str(root), what="checkpoint storage", trust_shared=True)
    check_trusted_location("s3://bucket/ck", what="checkpoint storage")  # not ours to judge


def test_missing_directories_are_created_private(tmp_path: Path) -> None:
    root = tmp_path / "a" / "b" / "ck"
    ensure_private_location(str(root), what="checkpoint storage")
    for path in (tmp_path / "a", tmp_path / "a" / "b", root):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700


def test_a_squatted_root_is_refused_before_its_metadata_is_unpickled(tmp_path: Path) -> None:
    root = squat(tmp_path / "ckpt", mode=0o777, uid=NOBODY)
    chk = plant_checkpoint(root / "evil-run", tmp_path / "pwned")
    with pytest.raises(UntrustedStorageError):
        scan_checkpoints(str(root))
    with pytest.raises(UntrustedStorageError):
        load_metadata(str(chk))
    with pytest.raises(UntrustedStorageError):
        restore_candidates(str(root))
    with pytest.raises(UntrustedStorageError):
        CheckpointStorage(str(root), "job-1").check_trusted()
    assert not (tmp_path / "pwned").exists()


def test_the_opt_out_reads_a_shared_root(tmp_path: Path) -> None:
    root = squat(tmp_path / "ckpt", mode=0o777)
    plant_checkpoint(root / "run", tmp_path / "ran")
    entries = scan_checkpoints(str(root), trust_shared=True)
    assert [e.ok for e in entries] == [True] and (tmp_path / "ran").is_dir()


def test_a_planted_run_inside_a_private_root_is_an_unreadable_entry(tmp_path: Path) -> None:
    root = squat(tmp_path / "ckpt", mode=0o700)
    plant_checkpoint(squat(root / "planted", mode=0o777, uid=NOBODY), tmp_path / "pwned")
    plant_checkpoint(root / "mine", tmp_path / "ours")
    entries = {e.job: e for e in scan_checkpoints(str(root))}
    assert entries["mine"].ok
    assert not entries["planted"].ok and "owned by another user" in (entries["planted"].error or "")
    assert not (tmp_path / "pwned").exists()


def test_a_metadata_file_others_can_write_is_refused(tmp_path: Path) -> None:
    chk = plant_checkpoint(squat(tmp_path / "ckpt", mode=0o700) / "run", tmp_path / "pwned")
    os.chmod(chk / "_metadata", 0o666)
    with pytest.raises(UntrustedStorageError, match="_metadata"):
        load_metadata(str(chk))
    assert not (tmp_path / "pwned").exists()


def test_a_symlink_of_ours_in_an_open_directory_is_a_problem(tmp_path: Path) -> None:
    """Anyone may replace a link in a non-sticky world-writable directory, whoever owns it."""
    target = squat(tmp_path / "real", mode=0o700)
    link = squat(tmp_path / "open", mode=0o777) / "ck"
    link.symlink_to(target)
    problem = trust_problem(str(link / "job"))
    assert problem is not None and "open" in problem and "not sticky" in problem


def test_the_storage_root_as_a_foreign_symlink_is_a_problem(tmp_path: Path) -> None:
    target = squat(tmp_path / "real", mode=0o700)
    link = squat(tmp_path / "sticky", mode=0o1777) / "ck"
    link.symlink_to(target)
    if os.geteuid() != 0:
        pytest.skip("giving a symlink to another user needs root")
    os.lchown(link, NOBODY, -1)
    problem = trust_problem(str(link))
    assert problem is not None and "symlink owned by another user" in problem


def test_resume_refuses_a_root_holding_a_refused_run_instead_of_starting_over(
    tmp_path: Path,
) -> None:
    """The refused run may be the job's newest: resuming an older run, or starting from
    the beginning, would write again what it committed. So ``--resume`` refuses."""
    import epochstream as es
    from epochstream.deploy.client import latest_run_checkpoints

    root = squat(tmp_path / "ckpt", mode=0o700)
    plant_checkpoint(root / "older", tmp_path / "older-ran")
    foreign = plant_checkpoint(root / "newest", tmp_path / "pwned").parent
    if os.geteuid() != 0:
        pytest.skip("giving a directory to another user needs root")
    for path in (foreign, foreign / "chk-1", foreign / "chk-1" / "_metadata"):
        os.chown(path, NOBODY, -1)
    env = es.Environment(parallelism=1, runner="local")
    env.enable_checkpointing(1.0, storage=str(root))
    env.from_sequence(0, 1).print()
    with pytest.raises(UntrustedStorageError, match="refused unread"):
        latest_run_checkpoints(env.job_description("victim"))
    assert not (tmp_path / "pwned").exists()
    env.enable_checkpointing(1.0, storage=str(root), trust_shared_storage=True)
    assert latest_run_checkpoints(env.job_description("victim"))
