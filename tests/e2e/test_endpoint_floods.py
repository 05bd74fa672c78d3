"""The job endpoint under hostile local users, against a job whose driver may hold only
256 file descriptors: thousands of idle connections, stalled big-header heads, a
slowloris, malformed and oversized requests with the token. Checkpoints keep
completing, a slot crash still restarts, the output is exactly right, and the driver's
log stays short (no traceback per bad connection)."""

from __future__ import annotations

import json
import resource
import socket
import subprocess
import sys
import threading
import time
from collections import Counter, deque
from pathlib import Path
from typing import Any

import pytest
from e2e_support import exactly_once_problems

import epochstream as es

DRIVER = Path(__file__).parent / "jobs" / "hostile_driver.py"
N, KEYS = 60_000, 7


def _wait_for(path: Path, proc: subprocess.Popen[bytes], timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"driver exited early with code {proc.returncode}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} did not appear within {timeout} s")
        time.sleep(0.05)
    return dict(json.loads(path.read_text()))


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


class _Flood:
    """The attackers and one honest poller, each a thread that stops with ``stop``."""

    def __init__(self, address: tuple[str, int], token: str) -> None:
        self.address = address
        self.token = token
        self.stop = threading.Event()
        self.opened = 0
        self.idle_connected = 0
        self.answers: dict[str, Counter[str]] = {}
        self.checkpoints: list[int] = []
        self.slowloris_closed_after: float | None = None
        self.threads = [
            threading.Thread(target=f, daemon=True)
            for f in (
                self._idle,
                self._churn,
                self._big_heads,
                self._slowloris,
                self._bad_requests,
                self._poll,
            )
        ]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def join(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(30)

    def _idle(self) -> None:
        """Hold up to 1,500 silent connections, each connected in full, as in the report
        (an endpoint that keeps them all runs the driver out of descriptors)."""
        held: deque[socket.socket] = deque()
        while not self.stop.is_set():
            try:
                held.append(socket.create_connection(self.address, timeout=2))
                self.idle_connected += 1
            except OSError:
                time.sleep(0.01)  # the backlog is full: the server is refusing, go on
            while len(held) > 1_500:
                held.popleft().close()
        for sock in held:
            sock.close()

    def _churn(self) -> None:
        """Open 100 connections every 20 ms without waiting for them, keeping 1,500."""
        held: deque[socket.socket] = deque()
        while not self.stop.is_set():
            for _ in range(100):
                sock = socket.socket()
                sock.setblocking(False)
                sock.connect_ex(self.address)
                held.append(sock)
                self.opened += 1
            while len(held) > 1_500:
                held.popleft().close()
            time.sleep(0.02)
        for sock in held:
            sock.close()

    def _big_heads(self) -> None:
        """50 connections at a time, each offering 100 headers of 64 KiB, then stalling."""
        header = b"X-Big: " + b"a" * 65_536 + b"\r\n"
        while not self.stop.is_set():
            socks = []
            for _ in range(50):
                sock = socket.socket()
                sock.settimeout(0.05)
                try:
                    sock.connect(self.address)
                    sock.sendall(b"GET /v1/job HTTP/1.1\r\nHost: x\r\n")
                    for _ in range(100):
                        sock.sendall(header)
                except OSError:
                    pass  # the kernel buffer is full or the server answered: now stall
                socks.append(sock)
            time.sleep(1.0)
            for sock in socks:
                self._record("big head", self._status(sock))
                sock.close()

    def _slowloris(self) -> None:
        """One header byte every 0.5 s; record when the server hangs up."""
        sock = socket.create_connection(self.address, timeout=30)
        started = time.monotonic()
        try:
            sock.sendall(b"GET /v1/job HTTP/1.1\r\nHost: x\r\n")
            sock.settimeout(0.5)
            while time.monotonic() - started < 30:
                sock.sendall(b"X")
                try:
                    if sock.recv(4096) is not None:
                        break
                except TimeoutError:
                    continue
        except OSError:
            pass  # reset by the server: that is the hang-up being measured
        finally:
            self.slowloris_closed_after = time.monotonic() - started
            sock.close()

    def _bad_requests(self) -> None:
        auth = f"Authorization: Bearer {self.token}\r\n"
        escape = json.dumps({"directory": "../../x"})
        requests = {
            "malformed JSON": f"POST /v1/savepoints HTTP/1.1\r\nHost: x\r\n{auth}"
            "Content-Length: 5\r\n\r\n{bad}",
            "Content-Length -1": f"POST /v1/savepoints HTTP/1.1\r\nHost: x\r\n{auth}Content-Length: -1\r\n\r\n",
            "oversize body": f"POST /v1/savepoints HTTP/1.1\r\nHost: x\r\n{auth}"
            "Content-Length: 1000000\r\n\r\n" + "a" * 1000,
            "no token": "GET /v1/job HTTP/1.1\r\nHost: x\r\n\r\n",
            "escaping savepoint": f"POST /v1/savepoints HTTP/1.1\r\nHost: x\r\n{auth}"
            f"Content-Length: {len(escape)}\r\n\r\n{escape}",
        }
        while not self.stop.is_set():
            for kind, request in requests.items():
                try:
                    with socket.create_connection(self.address, timeout=10) as sock:
                        sock.sendall(request.encode())
                        self._record(kind, self._status(sock))
                except OSError as exc:
                    self._record(kind, type(exc).__name__)
            time.sleep(0.05)

    def _poll(self) -> None:
        """The honest user: GET /v1/job with the token twice a second."""
        request = f"GET /v1/job HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {self.token}\r\n"
        request += "Connection: close\r\n\r\n"
        while not self.stop.is_set():
            try:
                with socket.create_connection(self.address, timeout=10) as sock:
                    sock.sendall(request.encode())
                    reply = b""
                    while chunk := sock.recv(65_536):
                        reply += chunk
                status = reply.split(b" ", 2)[1].decode() if reply else "no answer"
                self._record("honest", status)
                if status == "200":
                    body = json.loads(reply.split(b"\r\n\r\n", 1)[1])
                    self.checkpoints.append(body["checkpoints_completed"])
            except OSError as exc:
                self._record("honest", type(exc).__name__)
            time.sleep(0.5)

    @staticmethod
    def _status(sock: socket.socket) -> str:
        sock.settimeout(10)
        try:
            reply = sock.recv(65_536)
        except OSError as exc:
            return type(exc).__name__
        return reply.split(b" ", 2)[1].decode() if reply else "closed"

    def _record(self, kind: str, status: str) -> None:
        self.answers.setdefault(kind, Counter())[status] += 1


@pytest.mark.slow
def test_job_survives_endpoint_floods_with_256_descriptors(tmp_path: Path) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 4_096:  # the attackers' own sockets
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(4_096, hard), hard))
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
            "endpoint",
        ],
        stderr=subprocess.PIPE,
    )
    flood: _Flood | None = None
    try:
        info = _wait_for(addr_file, proc, timeout=120)
        host, port = info["url"].removeprefix("http://").rsplit(":", 1)
        flood = _Flood((host, int(port)), info["token"])
        rss_before = _rss_kib(proc.pid)
        flood.start()
        time.sleep(8)
        rss_flooded = _rss_kib(proc.pid)
        _stdout, stderr = proc.communicate(timeout=240)
    finally:
        if flood is not None:
            flood.join()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = stderr.decode(errors="replace")
    assert proc.returncode == 0, log[-3000:]
    result = json.loads(report.read_text())
    # The crash happened during the flood, and the job recovered from it (only from it).
    assert result["restarts"] == 1, json.dumps(result, indent=1) + log[-4000:]
    assert flood.opened > 2_000 and flood.idle_connected > 1_500, "the flood did not run"
    assert info["cap"] == 32  # 256 descriptors / 8

    answers = flood.answers
    # Every bad request got its own answer (or was cut off by the flood), never a hang.
    # (refused: the driver exited while the flood was still running)
    allowed = {"503", "ConnectionResetError", "ConnectionRefusedError", "closed", "BrokenPipeError"}
    for kind, status in (
        ("malformed JSON", "400"),
        ("Content-Length -1", "400"),
        ("oversize body", "413"),
        ("no token", "401"),
        ("escaping savepoint", "403"),
    ):
        assert answers[kind][status] >= 3 and set(answers[kind]) <= allowed | {status}, (
            kind,
            answers[kind],
        )
    assert answers["big head"]["431"] >= 10, answers["big head"]
    assert set(answers["big head"]) <= allowed | {"431"}, answers["big head"]
    # The honest user was served through the flood, and saw checkpoints complete.
    assert answers["honest"]["200"] >= 10, answers["honest"]
    assert flood.checkpoints and flood.checkpoints[-1] > flood.checkpoints[0] + 3, flood.checkpoints
    assert result["checkpoints"] > flood.checkpoints[-1] - 1
    # The slowloris is cut off by the 5 s head deadline.
    assert flood.slowloris_closed_after is not None and flood.slowloris_closed_after < 8
    # Stalled big heads cost at most max_head each: no 6 MiB per connection.
    assert rss_flooded - rss_before < 64 * 1024, (rss_before, rss_flooded)
    # Bad connections are logged rate-limited, without tracebacks.
    endpoint_lines = [line for line in log.splitlines() if "job endpoint" in line]
    assert 0 < len(endpoint_lines) < 40, endpoint_lines[:50]
    assert "Traceback" not in log, log[-3000:]
    rows = es.testing.read_committed(out)
    assert exactly_once_problems(rows, Counter(i % KEYS for i in range(N))) == []
