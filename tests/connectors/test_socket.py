"""SocketTextSource against a real TCP server on loopback."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from epochstream.connectors.base import SourceContext
from epochstream.connectors.socket import SocketSplit, SocketTextSource
from epochstream.core.clock import ManualClock
from epochstream.exceptions import ConfigurationError, SourceDecodeError


class LineServer:
    """Accepts one connection and sends ``chunks`` with small pauses, then closes."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.chunks = chunks
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        with conn:
            for chunk in self.chunks:
                conn.sendall(chunk)
                time.sleep(0.01)
        self.listener.close()


def read_all(port: int) -> list[str]:
    source = SocketTextSource("127.0.0.1", port)
    reader = source.create_reader(SourceContext(0, 1, ManualClock()))
    reader.add_splits(source.create_splits(3))
    out: list[str] = []
    deadline = time.monotonic() + 10
    while not reader.exhausted:
        assert time.monotonic() < deadline
        out += reader.poll(100)
    reader.close()
    return out


@pytest.fixture
def server() -> Iterator[type[LineServer]]:
    yield LineServer


def test_lines_split_across_packets_crlf_and_a_last_line_without_newline(
    server: type[LineServer],
) -> None:
    srv = server([b"hello wo", b"rld\r\nsecond\n", "dritte Zeile é".encode(), b"\nlast"])
    assert read_all(srv.port) == ["hello world", "second", "dritte Zeile é", "last"]


def test_bytes_that_are_not_utf8_fail_naming_the_server(server: type[LineServer]) -> None:
    srv = server([b"ok\n\xff\xfe\n"])
    with pytest.raises(
        SourceDecodeError, match=rf"127\.0\.0\.1:{srv.port}: received bytes that are not UTF-8"
    ):
        read_all(srv.port)


def test_one_split_no_position_and_not_replayable() -> None:
    source = SocketTextSource("127.0.0.1", 9)
    assert source.replayable is False and source.bounded is False
    assert source.create_splits(4) == [SocketSplit("127.0.0.1:9", "127.0.0.1", 9)]
    with pytest.raises(ConfigurationError, match="port"):
        SocketTextSource("127.0.0.1", 0)
