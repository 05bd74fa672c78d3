"""The Spark JVM dies mid-run: a clear error that keeps the checkpoints and says how to
resume; running that command finishes the job exactly once."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from e2e_support import exactly_once_problems

import epochstream as es

DRIVER = Path(__file__).parent / "jobs" / "spark_lost_driver.py"
pytestmark = [pytest.mark.slow, pytest.mark.spark]


def test_lost_spark_context_is_reported_with_the_resume_command(tmp_path: Path) -> None:
    out, ckpt, marker = tmp_path / "out", tmp_path / "ckpt", tmp_path / "killed"
    report = tmp_path / "report.json"
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1")
    args = [str(DRIVER), str(out), str(ckpt), str(marker), str(report)]
    first = subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env
    )
    assert first.returncode == 3, first.stderr[-3000:]
    error = json.loads(report.read_text())["error"]
    assert "the Spark context was lost" in error, error
    assert "Traceback" not in error and "py4j" not in error.split("\n")[0].lower()
    command_line = error.rsplit("\n", 1)[-1].strip()
    command = shlex.split(command_line)
    assert command[:3] == ["epochstream", "run", "--restore-from"], command_line
    job_dir = Path(command[3])
    assert any((job_dir / d / "_metadata").exists() for d in os.listdir(job_dir)), (
        "checkpoints kept"
    )
    # Run exactly what the message says (the console script is this interpreter's module).
    resumed = subprocess.run(
        [sys.executable, "-m", "epochstream.cli", *command[1:]],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=env,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads(report.read_text())["restored_from"]
    rows = es.testing.read_committed(out)
    assert exactly_once_problems(rows, Counter(i % 5 for i in range(40_000))) == []
