"""Shared hosts end to end: a checkpoint root another local user squatted (``0777``,
owned by ``nobody``) is refused by ``execute()``, by ``epochstream run --resume`` (so by
every ``--supervise`` restart) and by ``checkpoints``/``inspect``, before the planted
``_metadata`` is unpickled; the opt-out uses it."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

import epochstream as es


def _support() -> ModuleType:
    # The planting helpers live with the unit tests (the suite imports by path).
    path = Path(__file__).parents[1] / "checkpoint" / "test_shared_storage.py"
    spec = importlib.util.spec_from_file_location("shared_storage_support", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


support = _support()

JOB = textwrap.dedent("""
    import epochstream as es
    env = es.Environment(parallelism=1, runner="local")
    env.enable_checkpointing(0.1)
    env.from_collection([1, 2, 3]).map(lambda i: i * 2).print()
    env.execute("victim")
""")


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "epochstream.cli", *args],
        capture_output=True,
        text=True,
        timeout=240,
    )


def _job(env: es.Environment, out: Path) -> None:
    env.from_collection(list(range(10))).map(lambda i: i + 1).sink_to(es.sinks.FileSink(str(out)))


def test_execute_refuses_a_squatted_root_and_the_opt_out_runs(tmp_path: Path) -> None:
    root = support.squat(tmp_path / "ckpt", mode=0o777, uid=support.NOBODY)
    env = es.Environment(parallelism=1, runner="local")
    env.enable_checkpointing(0.1, storage=str(root))
    _job(env, tmp_path / "out")
    with pytest.raises(es.UntrustedStorageError, match="uid 65534"):
        env.execute("squatted")
    trusting = es.Environment(parallelism=1, runner="local")
    trusting.enable_checkpointing(0.1, storage=str(root), trust_shared_storage=True)
    _job(trusting, tmp_path / "out2")
    trusting.execute("trusted")
    assert sorted(es.testing.read_committed(tmp_path / "out2")) == list(range(1, 11))


def test_resume_and_supervise_refuse_a_squatted_root(tmp_path: Path) -> None:
    root = support.squat(tmp_path / "ckpt", mode=0o777, uid=support.NOBODY)
    support.plant_checkpoint(root / "planted-run", tmp_path / "pwned")
    script = tmp_path / "job.py"
    script.write_text(JOB)
    for mode in ("--resume", "--supervise"):
        proc = _cli("run", mode, "-q", "--checkpoint-dir", str(root), str(script))
        assert proc.returncode == 1, proc.stderr
        assert f"checkpoint storage {root} is not private to you" in proc.stderr
        assert "--trust-shared-storage" in proc.stderr
        assert not (tmp_path / "pwned").exists(), f"{mode} ran the planted checkpoint"


def test_resume_with_the_opt_out_reads_the_shared_root(tmp_path: Path) -> None:
    root = support.squat(tmp_path / "ckpt", mode=0o777)
    support.plant_checkpoint(root / "run", tmp_path / "ran")
    script = tmp_path / "job.py"
    script.write_text(JOB)
    proc = _cli(
        "run",
        "--resume",
        "-q",
        "--trust-shared-storage",
        "--checkpoint-dir",
        str(root),
        str(script),
    )
    assert "not private" not in proc.stderr
    assert (tmp_path / "ran").is_dir(), "trusted: the checkpoint there was read"


def test_checkpoints_and_inspect_refuse_a_squatted_dir(tmp_path: Path) -> None:
    root = support.squat(tmp_path / "ckpt", mode=0o777, uid=support.NOBODY)
    support.plant_checkpoint(root / "planted-run", tmp_path / "pwned")
    for command in ("checkpoints", "inspect"):
        proc = _cli(command, str(root))
        assert proc.returncode == 2 and "not private to you" in proc.stderr, proc.stderr
    assert not (tmp_path / "pwned").exists()
    proc = _cli("checkpoints", "--trust-shared-storage", str(root))
    assert proc.returncode == 0 and "planted-run" in proc.stdout, proc.stderr


def test_savepoints_are_not_written_where_others_could_swap_them(tmp_path: Path) -> None:
    shared = support.squat(tmp_path / "sp", mode=0o777, uid=support.NOBODY)
    env = es.Environment(parallelism=1, runner="local")
    env.enable_checkpointing(0.1, storage=str(tmp_path / "ckpt"))
    env.from_sequence(0, 10**9, rate=1000).map(lambda i: i).uid("m").print()
    client = env.execute_async("sp")
    try:
        client.wait_for_checkpoint(1)
        with pytest.raises(
            es.CheckpointError, match=f"savepoint directory {shared} is not private"
        ):
            client.trigger_savepoint(str(shared))
        assert list(shared.iterdir()) == []
        mine = tmp_path / "mine" / "sp"
        path = client.trigger_savepoint(str(mine))
        assert path.startswith(str(mine)) and (mine.stat().st_mode & 0o777) == 0o700
    finally:
        client.cancel()
    with pytest.raises(es.JobCancelled):
        client.result(timeout=60)


def test_an_explicit_shared_savepoint_dir_is_refused_at_start(tmp_path: Path) -> None:
    shared = support.squat(tmp_path / "sp", mode=0o777)
    env = es.Environment(parallelism=1, runner="local")
    env.enable_checkpointing(0.1, storage=str(tmp_path / "ckpt"), savepoint_dir=str(shared))
    _job(env, tmp_path / "out")
    with pytest.raises(es.UntrustedStorageError, match="savepoint directory"):
        env.execute("sp-dir")


def test_supervise_passes_the_opt_out_to_its_driver() -> None:
    from epochstream.cli import _parser
    from epochstream.cli.run import _child_arguments

    ns = _parser().parse_args(["run", "--supervise", "--trust-shared-storage", "job.py"])
    assert "--trust-shared-storage" in _child_arguments(ns)
