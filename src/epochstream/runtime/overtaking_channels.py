"""Output channels of a job with unaligned checkpoints: the task never blocks on them.

A task of such a job must be able to take an overtaking barrier at any moment, so it may
not sit in a socket write. Its output goes instead into a short queue per channel:

- :class:`CreditedNetworkChannel`: frames wait in the queue; a sender thread writes them
  as the receiving gate hands out credit (one credit per item it has room for), so the
  socket never holds more than the receiver can queue and its reader never blocks. An
  overtaking barrier goes to the head of the queue and needs no credit; the data frames
  it overtook are returned to the task as output channel state (they are still sent).
- :class:`OvertakingLocalChannel`: a task in the same slot; its gate's queue is the queue.

Both say :meth:`available` while their queue has room; the task reads input only while
every output is available (Flink's mailbox model), and reads mail and overtaking barriers
always. Backpressure is then the time the task spends with an output unavailable.

Example::

    channel = CreditedNetworkChannel(conn, "map -> sum (hash)")
    channel.send(RowBatch([1, 2]))           # queued; sent against credit
    channel.send_barrier(barrier)            # [b"..."]: the frames it overtook
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from typing import Any

from pyarrow import RecordBatch

from epochstream.core.events import CheckpointBarrier
from epochstream.runtime.auth import FramedConnection
from epochstream.runtime.batches import RowBatch
from epochstream.runtime.frames import FrameEncoder
from epochstream.runtime.outputs import Channel
from epochstream.runtime.overtaking_gate import OvertakingInputGate

__all__ = ["OUTPUT_QUEUE_LIMIT", "CreditedNetworkChannel", "OvertakingLocalChannel"]

log = logging.getLogger(__name__)

#: Items a network output queue holds before its channel stops being available.
OUTPUT_QUEUE_LIMIT = 2

_DATA, _EVENT, _BARRIER = 0, 1, 2


class CreditedNetworkChannel(Channel):
    """A network channel with an output queue, a sender thread and credit flow control
    (see the module docstring)."""

    def __init__(self, conn: FramedConnection, edge: str = "") -> None:
        self.conn = conn
        self.encoder = FrameEncoder(edge)
        self.edge = edge
        self._cond = threading.Condition()
        self._queue: deque[tuple[int, bytes]] = deque()
        self._credit = 0
        self._closed = False
        self._error: BaseException | None = None
        self._sender = threading.Thread(target=self._send_loop, name=f"send {edge}", daemon=True)
        self._credits = threading.Thread(
            target=self._credit_loop, name=f"credit {edge}", daemon=True
        )
        self._sender.start()
        self._credits.start()

    def available(self) -> bool:
        return len(self._queue) < OUTPUT_QUEUE_LIMIT

    def send(self, item: Any) -> None:
        kind = _DATA if type(item) is RowBatch or type(item) is RecordBatch else _EVENT
        self._enqueue(kind, self.encoder.encode(item))

    def send_barrier(self, barrier: CheckpointBarrier) -> list[bytes]:
        frame = self.encoder.encode(barrier)
        if not barrier.overtakes:
            self._enqueue(_BARRIER, frame)
            return []
        with self._cond:
            self._check()
            queue = self._queue
            overtaken = [f for kind, f in queue if kind == _DATA]
            # Behind the barriers already at the head: barriers keep their order.
            ahead = 0
            while ahead < len(queue) and queue[ahead][0] == _BARRIER:
                ahead += 1
            queue.insert(ahead, (_BARRIER, frame))
            self._cond.notify_all()
        return overtaken

    def _enqueue(self, kind: int, frame: bytes) -> None:
        with self._cond:
            self._check()
            self._queue.append((kind, frame))
            self._cond.notify_all()

    def _check(self) -> None:
        if self._error is not None:
            raise ConnectionError(
                f"channel {self.edge} to {self.conn.name} broke: {self._error!r}"
            ) from self._error
        if self._closed:
            raise ConnectionError(f"channel {self.edge} to {self.conn.name} is closed")

    def _send_loop(self) -> None:
        cond = self._cond
        queue = self._queue
        try:
            while True:
                with cond:
                    while not self._closed and not (
                        queue and (queue[0][0] == _BARRIER or self._credit > 0)
                    ):
                        cond.wait()
                    if self._closed:
                        return
                    kind, frame = queue.popleft()
                    if kind != _BARRIER:
                        self._credit -= 1
                self.conn.send_bytes(frame)
        except OSError as exc:  # the task sees it on its next send; the peer reports it too
            self._fail(exc)

    def _credit_loop(self) -> None:
        try:
            while True:
                credit = int.from_bytes(self.conn.recv_bytes(), "big")
                with self._cond:
                    self._credit += credit
                    self._cond.notify_all()
        except (OSError, ConnectionError) as exc:
            self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        with self._cond:
            if not self._closed and self._error is None:
                self._error = exc
                log.debug("channel %s: %r", self.edge, exc)
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self.conn.close()


class OvertakingLocalChannel(Channel):
    """A channel to a task in the same slot whose gate records channel state."""

    __slots__ = ("channel", "gate")

    def __init__(self, gate: OvertakingInputGate, channel: int) -> None:
        self.gate = gate
        self.channel = channel

    def available(self) -> bool:
        return self.gate.room(self.channel)

    def send(self, item: Any) -> None:
        self.gate.put(self.channel, item)
