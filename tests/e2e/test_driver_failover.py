"""The driver itself dies: ``epochstream run --resume`` and ``--supervise`` carry the job
on from its latest checkpoint; ``list``, ``savepoint`` and ``cancel`` reach running jobs.

The driver runs as ``epochstream run`` in its own process group (its Spark JVM or local
slot processes included), and is killed with SIGKILL of the whole group.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from e2e_support import exactly_once_problems

import epochstream as es

pytestmark = pytest.mark.slow

JOB = Path(__file__).parent / "jobs" / "counting_job.py"
EVENTS = 60_000


def _expected() -> Counter[int]:
    return Counter(i % 13 for i in range(EVENTS))


def _env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", XDG_STATE_HOME=str(tmp_path / "state"))
    return env


def _start(tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "epochstream.cli", "run", *args],
        env=_env(tmp_path),
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "epochstream.cli", *args],
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )


def _completed_checkpoints(ckpt: Path) -> int:
    """The highest completed checkpoint id under ``ckpt`` (retention keeps only the last)."""
    return max((int(p.parent.name[4:]) for p in ckpt.glob("*/chk-*/_metadata")), default=0)


def _wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout} s")
        time.sleep(0.1)


def test_driver_killed_then_resumed_at_another_parallelism(tmp_path: Path) -> None:
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    driver = _start(tmp_path, "--checkpoint-dir", str(ckpt), str(JOB), str(out))
    try:
        _wait(lambda: _completed_checkpoints(ckpt) >= 2, 180, "two checkpoints")
        assert driver.poll() is None, "the driver must still be running"
    finally:
        os.killpg(driver.pid, signal.SIGKILL)  # the driver, its Spark JVM, its Python workers
        driver.wait(30)
    committed = len(es.testing.read_committed(out))
    assert committed < sum(_expected().values()), "the job must die mid-run"
    resumed = _cli(
        tmp_path, "run", "--resume", "-p", "3", "--checkpoint-dir", str(ckpt), str(JOB), str(out)
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resume: job 'counting' continues from checkpoint" in resumed.stderr
    rows = es.testing.read_committed(out)
    assert exactly_once_problems(rows, _expected()) == []


def test_supervised_driver_is_restarted_after_sigkill(tmp_path: Path) -> None:
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    supervisor = _start(
        tmp_path,
        "--supervise",
        "--runner",
        "local",
        "--checkpoint-dir",
        str(ckpt),
        str(JOB),
        str(out),
    )
    assert supervisor.stderr is not None
    line = supervisor.stderr.readline()
    match = re.search(r"supervising driver pid (\d+)", line)
    assert match, line
    driver_pid = int(match.group(1))
    _wait(lambda: _completed_checkpoints(ckpt) >= 2, 120, "two checkpoints")
    os.killpg(driver_pid, signal.SIGKILL)
    _out, err = supervisor.communicate(timeout=300)
    assert supervisor.returncode == 0, (line + err)[-3000:]
    assert "driver killed by SIGKILL; restarting it with --resume" in err
    rows = es.testing.read_committed(out)
    assert exactly_once_problems(rows, _expected()) == []


def test_list_savepoint_and_cancel_reach_a_running_job(tmp_path: Path) -> None:
    ckpt, out, sp = tmp_path / "ckpt", tmp_path / "out", tmp_path / "sp"
    driver = _start(
        tmp_path, "--runner", "local", "--checkpoint-dir", str(ckpt), str(JOB), str(out)
    )
    try:
        _wait(lambda: _completed_checkpoints(ckpt) >= 1, 120, "a checkpoint")
        listing = _cli(tmp_path, "list")
        assert (
            listing.returncode == 0 and "counting" in listing.stdout and "RUNNING" in listing.stdout
        )
        job_id = listing.stdout.splitlines()[1].split()[0]
        # Only inside the savepoint root (<checkpoint dir>/savepoints); relative to it.
        outside = _cli(tmp_path, "savepoint", job_id[:6], str(sp))
        assert outside.returncode != 0 and "outside the savepoint root" in outside.stderr
        taken = _cli(tmp_path, "savepoint", job_id[:6], "manual")
        assert taken.returncode == 0, taken.stderr
        path = taken.stdout.strip()
        assert path.startswith(str(ckpt / "savepoints" / "manual" / "savepoint-")), path
        assert json.loads(Path(path, "_metadata").read_text())["kind"] == "savepoint"
        inspected = _cli(tmp_path, "inspect", path)
        assert inspected.returncode == 0 and "counts" in inspected.stdout
        assert "0..127 complete" in inspected.stdout
        stopped = _cli(tmp_path, "cancel", job_id[:6], "--savepoint", "final")
        assert stopped.returncode == 0, stopped.stderr
        final = stopped.stdout.strip()
        assert driver.wait(60) == 0
        assert "stopped with a savepoint" in (driver.stderr.read() if driver.stderr else "")
        assert _cli(tmp_path, "list").stdout.strip() == "no running jobs"
        unknown = _cli(tmp_path, "savepoint", "nosuchjob")
        assert unknown.returncode == 2 and "no running job" in unknown.stderr
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
    resumed = _cli(
        tmp_path, "run", "--runner", "local", "--from-savepoint", final, str(JOB), str(out)
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert exactly_once_problems(es.testing.read_committed(out), _expected()) == []
