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
from typing import Any

from epochstream.runtime.auth import FramedConnection
from epochstream.runtime.listener import AuthenticatedListener

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
        self._events = events
        self._listener = AuthenticatedListener(host, secret, "control", self._serve)
        self.address = self._listener.address

    def start(self) -> None:
        self._listener.start()

    def _serve(self, conn: FramedConnection) -> None:
        slot = SlotConnection(conn)
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
        self._listener.close()
