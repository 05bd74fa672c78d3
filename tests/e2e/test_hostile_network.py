"""A job under attack on its control port: a connection flood past the driver's file
limit and a peer trickling its handshake. The job still finishes, exactly once."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections import Counter, deque
from pathlib import Path

import pytest
from e2e_support import exactly_once_problems

import epochstream as es

DRIVER = Path(__file__).parent / "jobs" / "hostile_driver.py"


def _wait_for(path: Path, proc: subprocess.Popen[bytes], timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"driver exited early with code {proc.returncode}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} did not appear within {timeout} s")
        time.sleep(0.05)
    return json.loads(path.read_text())


def _flood(address: tuple[str, int], stop: threading.Event, opened: list[int]) -> None:
    """Keep up to 1500 unauthenticated connections open, opening new ones all the time."""
    held: deque[socket.socket] = deque()
    while not stop.is_set():
        for _ in range(100):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(address)
            held.append(s)
            opened[0] += 1
        while len(held) > 1500:
            held.popleft().close()
        time.sleep(0.02)
    for s in held:
        s.close()


def _trickle(address: tuple[str, int], result: dict) -> None:
    """Send one byte every 7 s, as a slowloris would; record when the server hangs up."""
    sock = socket.create_connection(address, timeout=30)
    started = time.monotonic()
    try:
        while time.monotonic() - started < 60:
            sock.sendall(b"E")
            sock.settimeout(7.0)
            try:
                if sock.recv(4096) == b"":  # the first reply is the server's hello
                    break
            except TimeoutError:
                continue
        result["closed_after"] = time.monotonic() - started
    except OSError:
        result["closed_after"] = time.monotonic() - started
    finally:
        sock.close()


@pytest.mark.slow
def test_job_survives_flood_and_slow_handshake(tmp_path: Path) -> None:
    out, ckpt, markers = tmp_path / "out", tmp_path / "ckpt", tmp_path / "markers"
    markers.mkdir()
    addr_file, report = tmp_path / "addr.json", tmp_path / "report.json"
    proc = subprocess.Popen(
        [
            sys.executable,
            str(DRIVER),
            str(out),
            str(ckpt),
            str(addr_file),
            str(report),
            str(markers),
            "control",
        ],
        stderr=subprocess.PIPE,
    )
    stop = threading.Event()
    opened = [0]
    trickle: dict = {}
    try:
        info = _wait_for(addr_file, proc, timeout=120)
        address = (info["host"], info["port"])
        flooder = threading.Thread(target=_flood, args=(address, stop, opened), daemon=True)
        flooder.start()
        slow = threading.Thread(target=_trickle, args=(address, trickle), daemon=True)
        slow.start()
        slow.join(70)
        _stdout, stderr = proc.communicate(timeout=240)
    finally:
        stop.set()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = stderr.decode(errors="replace")
    assert proc.returncode == 0, log[-3000:]
    result = json.loads(report.read_text())
    assert result["restarts"] == 1, result  # the crash happened during the flood
    assert opened[0] > 2_000, "the flood did not run"
    # The slow peer is cut off by the handshake deadline (10 s), not kept forever.
    assert "closed_after" in trickle and trickle["closed_after"] < 20, trickle
    # Refusals are rate-limited: a handful of lines, not one per connection.
    refusal_lines = [line for line in log.splitlines() if "plane:" in line]
    assert len(refusal_lines) < 40, refusal_lines[:50]
    rows = es.testing.read_committed(out)
    expected = Counter(i % 7 for i in range(60_000))
    assert exactly_once_problems(rows, expected) == []
