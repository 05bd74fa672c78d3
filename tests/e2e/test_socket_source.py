"""SocketTextSource on Spark: the lines a server sends reach the sink; the job ends when
the server closes the connection (at-most-once: nothing here is replayed)."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import epochstream as es

pytestmark = [pytest.mark.slow, pytest.mark.spark]


def test_socket_lines_reach_the_sink(spark: Any, tmp_path: Path) -> None:
    lines = [f"line {i} of the socket" for i in range(500)]
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            for i in range(0, len(lines), 50):
                conn.sendall("".join(f"{line}\n" for line in lines[i : i + 50]).encode())
                time.sleep(0.02)
        listener.close()

    threading.Thread(target=serve, daemon=True).start()
    env = es.Environment(parallelism=2, spark=spark)
    env.enable_checkpointing(0.3, storage=str(tmp_path / "ckpt"))
    out = tmp_path / "out"
    (
        env.from_source(es.sources.SocketTextSource("127.0.0.1", port))
        .uid("socket")
        .map(str.upper)
        .uid("upper")
        .sink_to(es.sinks.FileSink(str(out)))
        .uid("out")
    )
    env.execute("socket-lines")
    assert sorted(es.testing.read_committed(out)) == sorted(line.upper() for line in lines)
