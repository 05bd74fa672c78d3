"""The data plane of a slot: an authenticated listener that routes incoming
channels to the right task's input gate.

An upstream subtask opens one TCP connection per channel, proves the job secret,
and sends a :class:`ChannelHello` naming (edge, upstream subtask, downstream
subtask). Frames are pickles (row batches, in-band events) or Arrow IPC streams
(columnar batches), told apart by their first bytes. A reader thread per connection then moves frames into the gate: it
blocks when the gate's channel is full, so the sender's socket fills up and the
upstream task blocks too (backpressure).

Example::

    server = DataPlaneServer("127.0.0.1", secret, route)
    server.start(); server.address  # ('127.0.0.1', 40123)
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from epochstream.core.events import EndOfInput
from epochstream.runtime.auth import FramedConnection, connect
from epochstream.runtime.channels import Cancelled, InputGate
from epochstream.runtime.frames import decode_frame
from epochstream.runtime.listener import AuthenticatedListener
from epochstream.runtime.overtaking_gate import OvertakingInputGate

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
        self._route = route
        self._on_broken = on_broken
        self._listener = AuthenticatedListener(host, secret, "data", self._serve)
        self.address = self._listener.address
        self._closed = self._listener.closed
        self._conns: list[FramedConnection] = []
        self._lock = threading.Lock()

    def start(self) -> None:
        self._listener.start()

    def _serve(self, conn: FramedConnection) -> None:
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
            if isinstance(gate, OvertakingInputGate):
                gate.attach_credit(channel, _credit_sender(conn))
            while True:
                payload = conn.recv_bytes()
                item = decode_frame(payload, conn.unpickle)
                gate.put(channel, item, frame=payload)
                if isinstance(item, EndOfInput):
                    return
        except Cancelled:
            return
        except Exception as exc:  # reported as a failure of the target task (below)
            if not self._closed.is_set() and hello is not None:
                self._on_broken(hello, exc)
            elif not self._closed.is_set():
                log.warning("data connection %s failed before its hello: %r", conn.name, exc)
        finally:
            conn.close()

    def close(self) -> None:
        """Stop accepting and close every connection (unblocks the reader threads)."""
        self._listener.close()
        with self._lock:
            conns, self._conns = self._conns, []
        for conn in conns:
            conn.close()


def _credit_sender(conn: FramedConnection) -> Callable[[int], None]:
    """Sends credit back on a data connection (see :mod:`~epochstream.runtime.overtaking_gate`)."""

    def send(credit: int) -> None:
        try:
            conn.send_bytes(credit.to_bytes(4, "big"))
        except OSError as exc:
            # The connection broke: its reader thread reports that as the failure.
            log.debug("credit on %s not sent: %r", conn.name, exc)

    return send


def open_channel(address: tuple[str, int], secret: bytes, hello: ChannelHello) -> FramedConnection:
    """Connect to a peer slot's data plane and announce the channel."""
    conn = connect(address, secret, plane="data")
    conn.send(hello)
    return conn
