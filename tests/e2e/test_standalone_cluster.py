"""Word count with a SIGKILLed slot on a real Spark standalone cluster (master + one worker).

The master and worker come from the PySpark install (``bin/spark-class``) on loopback
ports; the job runs in a subprocess (``jobs/standalone_wordcount.py``) because a process
holds one SparkContext and this session's ``local[2]`` one may exist already.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pytest

JOB_SCRIPT = Path(__file__).parent / "jobs" / "standalone_wordcount.py"
SUMMARY_PREFIX = "E2E_SUMMARY "
REGISTRATION_TIMEOUT = 90.0
JOB_TIMEOUT = 240.0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _spark_class() -> Path:
    import pyspark

    path = Path(pyspark.__file__).parent / "bin" / "spark-class"
    if not path.exists():
        pytest.fail(f"PySpark install has no {path}")
    return path


def _cluster_env() -> dict[str, str]:
    env = dict(os.environ)
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    env["PYSPARK_PYTHON"] = sys.executable
    # The master's REST submission server would take the fixed port 6066.
    env["SPARK_MASTER_OPTS"] = "-Dspark.master.rest.enabled=false"
    return env


@dataclass
class _Daemon:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    log_file: IO[bytes]

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        """Stop the whole process group (the worker's executors and Python workers too)."""
        group = self.proc.pid  # start_new_session: the group id is the leader's pid
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(group, sig)
            except ProcessLookupError:
                break
            if self._group_gone(group, timeout=10.0):
                break
        self.proc.wait(10.0)
        self.log_file.close()

    def _group_gone(self, group: int, timeout: float) -> bool:
        """Wait until no process of ``group`` is left; False on timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.proc.poll()  # reap the leader: a zombie would still count as a member
            try:
                os.killpg(group, 0)
            except ProcessLookupError:
                return True
            time.sleep(0.1)
        return False


def _start(name: str, args: list[str], tmp: Path) -> _Daemon:
    log = tmp / f"{name}.log"
    log_file = open(log, "wb")
    proc = subprocess.Popen(
        [str(_spark_class()), *args],
        stdout=log_file,
        stderr=subprocess.STDOUT,
        env=_cluster_env(),
        cwd=tmp,
        start_new_session=True,
    )
    return _Daemon(name, proc, log, log_file)


def _wait_for_log(daemon: _Daemon, needle: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if needle in daemon.text():
            return
        if daemon.proc.poll() is not None:
            pytest.fail(
                f"{daemon.name} exited with {daemon.proc.returncode}:\n{daemon.text()[-3000:]}"
            )
        time.sleep(0.25)
    pytest.fail(f"{daemon.name}: no {needle!r} within {timeout}s:\n{daemon.text()[-3000:]}")


@pytest.fixture
def standalone_master(tmp_path: Path) -> Iterator[str]:
    """A Spark standalone master with one registered 2-core worker; yields its URL."""
    port = _free_port()
    url = f"spark://127.0.0.1:{port}"
    daemons: list[_Daemon] = []
    try:
        master = _start(
            "master",
            [
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--webui-port",
                str(_free_port()),
            ],
            tmp_path,
        )
        daemons.append(master)
        _wait_for_log(master, "I have been elected leader", REGISTRATION_TIMEOUT)
        worker = _start(
            "worker",
            [
                "org.apache.spark.deploy.worker.Worker",
                url,
                "--host",
                "127.0.0.1",
                "--cores",
                "2",
                "--memory",
                "1g",
                "--webui-port",
                str(_free_port()),
                "--work-dir",
                str(tmp_path / "worker-work"),
            ],
            tmp_path,
        )
        daemons.append(worker)
        _wait_for_log(worker, "Successfully registered with master", REGISTRATION_TIMEOUT)
        _wait_for_log(master, "Registering worker", REGISTRATION_TIMEOUT)
        yield url
    finally:
        for daemon in reversed(daemons):
            daemon.stop()


def _run_job(url: str, workdir: Path) -> tuple[dict[str, Any], str]:
    env = _cluster_env()
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(Path(__file__).parents[2] / "src"), env.get("PYTHONPATH", "")) if p
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            str(JOB_SCRIPT),
            "--master",
            url,
            "--workdir",
            str(workdir),
            "--kill-slot",
            "0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=JOB_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        tail = stderr.decode(errors="replace")[-5000:]
        pytest.fail(f"job did not end within {JOB_TIMEOUT}s:\n{tail}")
    err_text = stderr.decode(errors="replace")
    lines = [ln for ln in stdout.decode().splitlines() if ln.startswith(SUMMARY_PREFIX)]
    assert proc.returncode == 0 and lines, f"job exited with {proc.returncode}:\n{err_text[-5000:]}"
    return json.loads(lines[-1][len(SUMMARY_PREFIX) :]), err_text


@pytest.mark.slow
@pytest.mark.spark
def test_wordcount_recovers_from_sigkill_on_standalone_cluster(
    standalone_master: str, tmp_path: Path
) -> None:
    summary, log = _run_job(standalone_master, tmp_path / "job")
    print("standalone job summary:", json.dumps(summary))

    assert summary["master"] == standalone_master
    assert summary["killed_is_python"], summary
    assert not summary["killed_is_driver"], summary
    assert not summary["done_before_kill"], "job finished before the kill"
    assert summary["committed_before_kill"] < summary["expected_updates"], summary
    assert summary["killed"], summary
    assert summary["restarts"] >= 1, log[-5000:]
    assert summary["killed_pid"] not in summary["pids_after"]
    assert summary["problems"] == [], summary["problems"]
    assert summary["committed_updates"] == summary["expected_updates"]
    assert summary["checkpoints"][-1] > summary["checkpoint_before_kill"]
