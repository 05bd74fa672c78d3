"""A text socket source: lines from a TCP server. **At-most-once.**

A socket cannot be rewound: after a failure the job restores its state from the last
checkpoint, but the lines received since then are gone, and so are lines the server
sent while no reader was connected. Use it for demos and tests; for anything that must
not lose data, read from a replayable system (files, JetStream).

One split: subtask 0 connects to ``host:port`` and reads ``\\n``-terminated UTF-8
lines (a trailing ``\\r`` is dropped). The stream ends when the server closes the
connection; a restored reader connects again.

Example::

    env.from_source(SocketTextSource("127.0.0.1", 9999)).flat_map(str.split).print()
"""

from __future__ import annotations

import select
import socket
from dataclasses import dataclass
from typing import Any

from epochstream.connectors.base import Source, SourceContext, SourceReader
from epochstream.exceptions import ConfigurationError, SourceDecodeError

__all__ = ["SocketSplit", "SocketTextSource"]

_WAIT = 0.05
_CHUNK = 1 << 16


@dataclass(frozen=True)
class SocketSplit:
    """The server to read; it has no position (nothing can be replayed).

    Example::

        SocketSplit(split_id="127.0.0.1:9999", host="127.0.0.1", port=9999)
    """

    split_id: str
    host: str
    port: int


class SocketTextSource(Source):
    """Lines from ``host:port`` (module docstring).

    Guarantee: at-most-once (a socket cannot be replayed).

    Example::

        env.from_source(SocketTextSource("127.0.0.1", 9999))
    """

    bounded = False
    replayable = False

    def __init__(self, host: str, port: int, *, connect_timeout: float = 10.0) -> None:
        if not host:
            raise ConfigurationError("SocketTextSource needs a host")
        if not 0 < port < 65536:
            raise ConfigurationError(f"SocketTextSource port must be 1..65535, got {port}")
        self.host = host
        self.port = port
        self.connect_timeout = connect_timeout

    def create_splits(self, parallelism: int) -> list[SocketSplit]:
        return [SocketSplit(f"{self.host}:{self.port}", self.host, self.port)]

    def create_reader(self, ctx: SourceContext) -> SocketTextReader:
        return SocketTextReader(self.connect_timeout)


class SocketTextReader(SourceReader):
    """Reads lines from its split's server until the server closes the connection.

    Example::

        reader = SocketTextSource("127.0.0.1", 9999).create_reader(ctx)
        reader.add_splits([SocketSplit("127.0.0.1:9999", "127.0.0.1", 9999)])
        reader.poll(100)
    """

    def __init__(self, connect_timeout: float) -> None:
        self._connect_timeout = connect_timeout
        self._split: SocketSplit | None = None
        self._sock: socket.socket | None = None
        self._tail = b""
        self._received = 0
        self._eof = False

    def add_splits(self, splits: list[Any]) -> None:
        for split in splits:
            if not isinstance(split, SocketSplit):
                raise ConfigurationError(
                    f"SocketTextReader got a {type(split).__qualname__} split, not a SocketSplit"
                )
            self._split = split

    def poll(self, max_records: int) -> list[Any]:
        split = self._split
        if split is None or self._eof:
            return []
        if self._sock is None:
            self._sock = socket.create_connection((split.host, split.port), self._connect_timeout)
            self._sock.setblocking(False)
        ready, _, _ = select.select([self._sock], [], [], _WAIT)
        if not ready:
            return []
        data = self._sock.recv(_CHUNK)
        if not data:
            self._eof = True
            data, self._tail = self._tail, b""
            return self._decode(data.split(b"\n")) if data else []
        self._received += len(data)
        lines = (self._tail + data).split(b"\n")
        self._tail = lines.pop()
        return self._decode(lines)

    def _decode(self, lines: list[bytes]) -> list[str]:
        if not lines:
            return []
        try:
            text = b"\n".join(lines).decode("utf-8")
        except UnicodeDecodeError as exc:
            assert self._split is not None
            raise SourceDecodeError(
                f"SocketTextSource {self._split.split_id}: received bytes that are not UTF-8 "
                f"around byte {self._received}: {exc.reason}",
                path=self._split.split_id,
                offset=self._received,
            ) from exc
        return [line[:-1] if line.endswith("\r") else line for line in text.split("\n")]

    @property
    def exhausted(self) -> bool:
        """True once the server closed the connection."""
        return self._split is None or self._eof

    def snapshot(self, checkpoint_id: int) -> list[Any]:
        return [] if self._split is None else [self._split]

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
