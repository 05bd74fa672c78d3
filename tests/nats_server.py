"""A throwaway NATS server with JetStream on loopback (Debian package ``nats-server``).

Example::

    server = NatsServer().start()
    await nats.connect(server.url)
    server.stop()
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time

__all__ = ["NatsServer", "nats_binary"]


def nats_binary() -> str | None:
    """The ``nats-server`` executable, or None."""
    found = shutil.which("nats-server")
    if found:
        return found
    return "/usr/sbin/nats-server" if os.access("/usr/sbin/nats-server", os.X_OK) else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class NatsServer:
    """One ``nats-server -js`` with its store in a temporary directory."""

    def __init__(self) -> None:
        binary = nats_binary()
        if binary is None:
            raise RuntimeError("nats-server not found (apt-get install nats-server)")
        self.binary = binary
        self.port = _free_port()
        self.root = tempfile.mkdtemp(prefix="es-nats-")
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> NatsServer:
        log = open(os.path.join(self.root, "server.log"), "wb")
        self._proc = subprocess.Popen(
            [self.binary, "-js", "-a", "127.0.0.1", "-p", str(self.port), "-sd", self.root],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return self
            except OSError:
                if self._proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"nats-server did not start: {open(os.path.join(self.root, 'server.log')).read()}"
                    ) from None
                time.sleep(0.05)

    def stop(self) -> None:
        try:
            if self._proc is not None:
                self._proc.terminate()
                self._proc.wait(10)
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
