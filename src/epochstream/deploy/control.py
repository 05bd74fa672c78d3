"""The job master's control-plane server.

Slots connect, pass the HMAC handshake, and register. From then on a reader
thread per slot turns every frame into an event on the job master's queue, so all
job-master logic runs on one thread. A connection that fails the handshake is
refused and logged before anything is unpickled.

Example::

    events = queue.Queue()
    server = ControlServer("127.0.0.1", secret, events); server.start()
    kind, conn, msg = events.get()     # ("message", conn, RegisterSlot(...))
"""

from __future__ import annotations

import logging
import queue
import socket
import threading
from typing import Any

from epochstream.exceptions import AuthenticationError
from epochstream.runtime.auth import FramedConnection, accept_handshake, listen

__all__ = ["ControlServer", "SlotConnection"]

log = logging.getLogger(__name__)


class SlotConnection:
    """One registered (or registering) slot's control connection."""

    def __init__(self, conn: FramedConnection) -> None:
        self.conn = conn
        self.slot: int | None = None
        self.attempt: int | None = None
        self.pid: int | None = None
        self.closed = False

    def send(self, msg: Any) -> bool:
        """Send ``msg``; False if the connection is gone (the reader reports why)."""
        if self.closed:
            return False
        try:
            self.conn.send(msg)
            return True
        except OSError as exc:
            log.debug("send to slot %s failed: %r", self.slot, exc)
            return False

    def close(self) -> None:
        self.closed = True
        self.conn.close()


class ControlServer:
    """Accepts authenticated slot connections; events go to ``events`` as tuples.

    ``("message", SlotConnection, msg)`` for each frame and ``("closed",
    SlotConnection, error)`` when the connection ends.
    """

    def __init__(self, host: str, secret: bytes, events: queue.Queue[Any]) -> None:
        self._secret = secret
        self._events = events
        self._sock = listen(host)
        self.address: tuple[str, int] = self._sock.getsockname()[:2]
        self._closed = threading.Event()
        self._thread = threading.Thread(
            target=self._accept_loop, name="control-accept", daemon=True
        )

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
            threading.Thread(
                target=self._serve, args=(sock,), name="control-in", daemon=True
            ).start()

    def _serve(self, sock: socket.socket) -> None:
        try:
            accept_handshake(sock, self._secret, plane="control")
        except AuthenticationError:
            sock.close()
            return
        slot = SlotConnection(FramedConnection(sock))
        error: BaseException | None = None
        try:
            while True:
                self._events.put(("message", slot, slot.conn.recv()))
        except Exception as exc:  # reported to the job master as the end of this slot
            error = exc
        finally:
            slot.closed = True
            self._events.put(("closed", slot, error))

    def close(self) -> None:
        self._closed.set()
        self._sock.close()
