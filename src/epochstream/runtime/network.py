"""The data plane of a slot: an authenticated listener that routes incoming
channels to the right task's input gate.

An upstream subtask opens one TCP connection per channel, proves the job secret,
and sends a :class:`ChannelHello` naming (edge, upstream subtask, downstream
subtask). A reader thread per connection then moves frames into the gate: it
blocks when the gate's channel is full, so the sender's socket fills up and the
upstream task blocks too (backpressure).

Example::

    server = DataPlaneServer("127.0.0.1", secret, route)
    server.start(); server.address  # ('127.0.0.1', 40123)
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass

from epochstream.exceptions import AuthenticationError
from epochstream.runtime.auth import FramedConnection, accept_handshake, connect, listen
from epochstream.runtime.channels import Cancelled, InputGate
from epochstream.runtime.events import EndOfInput

__all__ = ["ChannelHello", "DataPlaneServer", "open_channel"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ChannelHello:
    """First frame on a data connection: which channel this connection carries."""

    edge_id: int
    upstream_subtask: int
    downstream_subtask: int


#: Maps a hello to (gate, channel index), or raises KeyError.
Route = Callable[[ChannelHello], tuple[InputGate, int]]


class DataPlaneServer:
    """Accepts authenticated channel connections and feeds input gates."""

    def __init__(
        self,
        host: str,
        secret: bytes,
        route: Route,
        on_broken: Callable[[ChannelHello, BaseException], None],
    ) -> None:
        self._secret = secret
        self._route = route
        self._on_broken = on_broken
        self._sock = listen(host)
        self.address: tuple[str, int] = self._sock.getsockname()[:2]
        self._closed = threading.Event()
        self._conns: list[FramedConnection] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept_loop, name="data-accept", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                sock, _ = self._sock.accept()
            except OSError:
                if self._closed.is_set():
                    return
                raise
            threading.Thread(target=self._serve, args=(sock,), name="data-in", daemon=True).start()

    def _serve(self, sock: socket.socket) -> None:
        try:
            accept_handshake(sock, self._secret, plane="data")
        except AuthenticationError:
            sock.close()  # already logged by the handshake
            return
        conn = FramedConnection(sock)
        with self._lock:
            if self._closed.is_set():
                conn.close()
                return
            self._conns.append(conn)
        hello: ChannelHello | None = None
        try:
            hello = conn.recv()
            if not isinstance(hello, ChannelHello):
                raise ConnectionError(
                    f"data connection {conn.name} began with {type(hello).__name__}"
                )
            gate, channel = self._route(hello)
            while True:
                item = conn.recv()
                gate.put(channel, item)
                if isinstance(item, EndOfInput):
                    return
        except Cancelled:
            return
        except (ConnectionError, OSError, KeyError) as exc:
            if not self._closed.is_set() and hello is not None:
                self._on_broken(hello, exc)
            elif not self._closed.is_set():
                log.warning("data connection %s failed before its hello: %r", conn.name, exc)
        finally:
            conn.close()

    def close(self) -> None:
        """Stop accepting and close every connection (unblocks the reader threads)."""
        self._closed.set()
        self._sock.close()
        with self._lock:
            conns, self._conns = self._conns, []
        for conn in conns:
            conn.close()


def open_channel(address: tuple[str, int], secret: bytes, hello: ChannelHello) -> FramedConnection:
    """Connect to a peer slot's data plane and announce the channel."""
    conn = connect(address, secret, plane="data")
    conn.send(hello)
    return conn
