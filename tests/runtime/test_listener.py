"""The accept loop survives floods, slow handshakes and descriptor exhaustion."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from epochstream.runtime.auth import connect, new_secret
from epochstream.runtime.listener import AuthenticatedListener, RateLimitedLog
from epochstream.runtime.network import ChannelHello, open_channel

HELPER = Path(__file__).parent / "helpers" / "flood_target.py"


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_rate_limited_log_counts_what_it_does_not_show(caplog: pytest.LogCaptureFixture) -> None:
    clock = _Clock()
    logger = logging.getLogger("test.ratelimit")
    limited = RateLimitedLog(logger, interval=10.0, clock=clock)
    with caplog.at_level(logging.WARNING, logger="test.ratelimit"):
        for i in range(500):
            limited.warning("refused %s", i)
            clock.t += 0.01
        clock.t += 10.0
        limited.warning("refused %s", "late")
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == "refused 0"
    assert lines[-1] == "refused late (and 499 more like it in the last 10 s)"
    assert len(lines) == 2 and limited.total == 501


def _echo_listener(**kwargs: float) -> tuple[AuthenticatedListener, list[object], bytes]:
    secret = new_secret()
    got: list[object] = []
    listener = AuthenticatedListener(
        "127.0.0.1", secret, "control", lambda conn: got.append(conn.recv()), **kwargs
    )
    listener.start()
    return listener, got, secret


def test_whole_handshake_has_one_deadline() -> None:
    """One byte every 0.3 s never trips a per-read timeout of 1 s; the deadline does."""
    listener, _got, _secret = _echo_listener(handshake_timeout=1.0)
    try:
        sock = socket.create_connection(listener.address, timeout=10)
        sock.recv(40)  # the server's hello
        started = time.monotonic()
        closed_after = None
        try:
            for _ in range(30):
                sock.sendall(b"x")
                sock.settimeout(0.3)
                try:
                    if sock.recv(64) == b"":
                        closed_after = time.monotonic() - started
                        break
                except TimeoutError:
                    continue
        except (ConnectionResetError, BrokenPipeError):
            closed_after = time.monotonic() - started
        assert closed_after is not None, "the trickling peer was never cut off"
        assert closed_after < 5.0
        sock.close()
    finally:
        listener.close()


def test_cap_on_unauthenticated_connections_evicts_the_oldest() -> None:
    listener, got, secret = _echo_listener(max_unauthenticated=4)
    silent = [socket.create_connection(listener.address) for _ in range(40)]
    try:
        deadline = time.monotonic() + 5
        while listener.pending_handshakes > 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert listener.pending_handshakes <= 4
        conn = connect(listener.address, secret, plane="control", timeout=10)
        conn.send("hello")
        deadline = time.monotonic() + 5
        while not got and time.monotonic() < deadline:
            time.sleep(0.01)
        assert got == ["hello"]
        conn.close()
    finally:
        for sock in silent:
            sock.close()
        listener.close()


def _flood(address: tuple[str, int], count: int) -> list[socket.socket]:
    """Open ``count`` connections that never authenticate (kept open by the caller)."""
    socks = []
    for _ in range(count):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(address)
        socks.append(s)
    return socks


@pytest.mark.parametrize("plane", ["control", "data"])
def test_plane_survives_flood_past_the_file_limit_and_emfile(plane: str) -> None:
    """A server limited to 64 descriptors: 800 silent connections, then accept() failing
    with EMFILE; afterwards an authenticated peer is still served."""
    secret = new_secret()
    proc = subprocess.Popen(
        [sys.executable, str(HELPER), plane, "64"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    flood: list[socket.socket] = []
    try:
        proc.stdin.write(secret.hex() + "\n")
        proc.stdin.flush()
        _tag, host, port = proc.stdout.readline().split()
        address = (host, int(port))
        flood = _flood(address, 800)
        time.sleep(1.0)
        proc.stdin.write("exhaust\n")
        proc.stdin.flush()
        assert proc.stdout.readline().startswith("EXHAUSTED")
        flood += _flood(address, 50)  # accept() now fails with EMFILE
        time.sleep(1.0)

        def release_soon() -> None:
            time.sleep(1.0)
            assert proc.stdin is not None
            proc.stdin.write("release\n")
            proc.stdin.flush()

        threading.Thread(target=release_soon, daemon=True).start()
        if plane == "control":
            conn = connect(address, secret, plane="control", timeout=30)
            conn.send("still serving")
        else:
            conn = open_channel(address, secret, ChannelHello(0, 1, 0))
            conn.send(["still serving"])
        assert proc.stdout.readline().strip() == "RELEASED"
        time.sleep(0.5)
        proc.stdin.write("check\n")
        proc.stdin.flush()
        report = proc.stdout.readline().split(maxsplit=3)
        assert report[:2] == ["CHECK", "alive"]
        assert int(report[2]) <= 64
        assert "still serving" in report[3]
        conn.close()
    finally:
        for s in flood:
            s.close()
        proc.kill()
        proc.wait(10)
