"""Command-line progress: the progress line, ``epochstream run`` on and off a terminal,
``--quiet``, ``epochstream status``, and slot logs reaching the driver."""

from __future__ import annotations

import os
import pty
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from epochstream.cli.progress import progress_line

JOB = """
import logging, sys
import epochstream as es

class Shout(es.MapFunction):
    def open(self, ctx):
        logging.getLogger("userjob").warning("hello from subtask %d", ctx.subtask_index)

    def map(self, x):
        return x

env = es.Environment(parallelism=2, runner="local")
env.enable_checkpointing(0.3, storage=sys.argv[1])
(env.from_sequence(0, int(sys.argv[2]), rate=3000).map(Shout())
    .key_by(lambda x: x % 3).reduce(lambda a, b: a + b).sink_to(es.sinks.DiscardSink()))
env.execute("cli-progress")
"""


def _job(tmp_path: Path, records: int) -> list[str]:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    return [
        sys.executable,
        "-m",
        "epochstream.cli",
        "run",
        str(script),
        str(tmp_path / "ckpt"),
        str(records),
    ]


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")}


def _vertex(name: str, *, source: bool, rate: float, pressure: float) -> dict[str, object]:
    return {
        "name": name,
        "is_source": source,
        "rate": rate,
        "backpressured": pressure >= 500,
        "backpressured_ms_per_s": pressure,
    }


def test_progress_line_names_rate_checkpoint_restarts_and_backpressure() -> None:
    job = {
        "job_id": "3f2a9c1b" + "0" * 24,
        "name": "wordcount",
        "state": "RUNNING",
        "last_checkpoint_id": 5,
        "last_checkpoint_time": 98.0,
        "last_checkpoint_duration_s": 0.014,
        "last_checkpoint_size": 3174,
        "restarts": 1,
    }
    vertices = [
        _vertex("source -> tokenize", source=True, rate=12_345.0, pressure=820.0),
        _vertex("count -> sink", source=False, rate=12_000.0, pressure=0.0),
    ]
    assert progress_line(job, vertices, now=100.0) == (
        "job 3f2a9c1b wordcount RUNNING | 12.3k records/s | checkpoint #5 2s ago (14 ms, 3.1 KiB)"
        " | restarts 1 | backpressured: source -> tokenize (82%)"
    )
    fresh = {**job, "last_checkpoint_id": None, "restarts": 0}
    assert progress_line(fresh, vertices[1:], now=0.0) == (
        "job 3f2a9c1b wordcount RUNNING | 0 records/s | no checkpoint yet | restarts 0"
    )


@pytest.mark.slow
def test_run_prints_plain_progress_lines_and_slot_logs_when_not_a_terminal(tmp_path: Path) -> None:
    proc = subprocess.run(
        _job(tmp_path, 9_000), capture_output=True, text=True, timeout=240, env=_env(tmp_path)
    )
    assert proc.returncode == 0, proc.stderr
    err = proc.stderr
    assert "/dashboard/ (sign in: epochstream status" in err
    assert "token=" not in err and "code=" not in err, "no secret goes to a log"
    lines = [line for line in err.splitlines() if line.startswith("job ") and "records/s" in line]
    assert lines and all(" | restarts 0" in line for line in lines), err
    assert any("RUNNING" in line for line in lines)
    assert "\r" not in err
    for slot in (0, 1):
        assert f"[slot {slot} attempt 1] userjob: hello from subtask {slot}" in err


@pytest.mark.slow
def test_quiet_turns_progress_off(tmp_path: Path) -> None:
    argv = _job(tmp_path, 3_000)
    argv.insert(argv.index("run") + 1, "--quiet")
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=240, env=_env(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "records/s" not in proc.stderr and "dashboard" not in proc.stderr


@pytest.mark.slow
def test_run_redraws_one_status_line_on_a_terminal(tmp_path: Path) -> None:
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        _job(tmp_path, 9_000), stdout=subprocess.DEVNULL, stderr=follower, env=_env(tmp_path)
    )
    os.close(follower)
    out = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal closed: the driver exited
            break
        if not chunk:
            break
        out += chunk
    assert proc.wait(timeout=240) == 0
    os.close(leader)
    text = out.decode(errors="replace")
    assert "/dashboard/ (sign in: epochstream status" in text
    assert "token=" not in text and "code=" not in text, "no secret in a terminal's scrollback"
    assert text.count("\r\x1b[2Kjob ") >= 2, text
    assert "records/s" in text


@pytest.mark.slow
def test_status_prints_the_progress_of_a_running_job_once(tmp_path: Path) -> None:
    argv = _job(tmp_path, 10**7)
    argv.insert(argv.index("run") + 1, "--quiet")
    env = _env(tmp_path)
    driver = subprocess.Popen(argv, env=env, start_new_session=True, stderr=subprocess.DEVNULL)
    try:
        registry = tmp_path / "state" / "epochstream" / "jobs"
        deadline = time.monotonic() + 120
        while not (registry.exists() and list(registry.glob("*.json"))):
            assert time.monotonic() < deadline and driver.poll() is None
            time.sleep(0.1)
        job_id = next(registry.glob("*.json")).stem
        cli = [sys.executable, "-m", "epochstream.cli", "status", job_id[:8]]
        while True:
            proc = subprocess.run(cli, capture_output=True, text=True, timeout=60, env=env)
            assert proc.returncode == 0, proc.stderr
            if "checkpoint #" in proc.stdout:
                break
            assert time.monotonic() < deadline, proc.stdout
            time.sleep(0.3)
        first, *vertices = proc.stdout.splitlines()
        assert first.startswith(f"job {job_id[:8]} cli-progress RUNNING | ")
        assert " | restarts 0" in first
        assert len(vertices) == 2 and all(v.startswith("  ") and "busy" in v for v in vertices)
        url = subprocess.run([*cli, "--dashboard"], capture_output=True, text=True, env=env)
        login = url.stdout.strip()
        assert "/dashboard/login?code=" in login and _token(registry, job_id) not in login
        signed_in = _sign_in(login)
        assert signed_in.startswith("epochstream-") and "HttpOnly" in signed_in
        # --open hands the browser a private file, never the URL on its command line.
        browser = tmp_path / "browser.sh"
        browser.write_text('#!/bin/sh\necho "$@" > "$0.args"\n')
        browser.chmod(0o700)
        opened = subprocess.run(
            [*cli, "--open"], capture_output=True, text=True, env={**env, "BROWSER": str(browser)}
        )
        assert opened.returncode == 0, opened.stderr
        args = _until_file(Path(str(browser) + ".args")).strip()
        assert args.startswith("file://") and "code=" not in args
        assert "/dashboard/login?code=" in Path(args.removeprefix("file://")).read_text()
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait(60)


def _sign_in(url: str) -> str:
    """The Set-Cookie of trading a one-time login URL (no redirect followed)."""
    import urllib.error
    import urllib.request

    class _Stay(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: object) -> None:
            return None

    try:
        urllib.request.build_opener(_Stay).open(url, timeout=30)
    except urllib.error.HTTPError as err:
        assert err.code == 303, err
        return str(err.headers["Set-Cookie"])
    raise AssertionError("the login did not redirect")


def _until_file(path: Path) -> str:
    deadline = time.monotonic() + 30
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)
    time.sleep(0.1)  # the shell finishes its one write
    return path.read_text()


def _token(registry: Path, job_id: str) -> str:
    import json

    return str(json.loads((registry / f"{job_id}.json").read_text())["token"])
