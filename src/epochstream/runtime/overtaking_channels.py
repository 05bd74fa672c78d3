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
from collections.abc import Callable
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

#: Items a network output queue holds before its channel stops being available. Large
#: enough that a task rarely waits for its sender thread to get the GIL (at 2 it waited
#: so often that W1 ran at 0.61x; at 8, 0.99x: docs/benchmarks.md), small enough that
#: little output is in flight for a barrier to overtake.
OUTPUT_QUEUE_LIMIT = 8

_DATA, _EVENT, _BARRIER = 0, 1, 2


class CreditedNetworkChannel(Channel):
    """A network channel with an output queue, a sender thread and credit flow control
    (see the module docstring)."""

    def __init__(
        self,
        conn: FramedConnection,
        edge: str = "",
        on_room: Callable[[], None] | None = None,
    ) -> None:
        self.conn = conn
        # Wakes the sending task when its full queue gets room again.
        self._on_room = on_room
        self.encoder = FrameEncoder(edge)
        self.edge = edge
        self._cond = threading.Condition()
        # (kind, frame, checkpoint id of a barrier or -1)
        self._queue: deque[tuple[int, bytes, int]] = deque()
        # Aligned barriers with an aligned timeout still queued here, by checkpoint id.
        self._in_line: dict[int, CheckpointBarrier] = {}
        self._credit = 0
        # A frame is being written (by the sender thread or the task): frames keep order.
        self._sending = False
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
        frame = self.encoder.encode(item)
        with self._cond:
            self._check()
            # Nothing queued or being sent, and credit: the task sends it itself, saving
            # the hand-over to the sender thread (the receiver has room: it does not block).
            direct = not self._queue and not self._sending and self._credit > 0
            if direct:
                self._credit -= 1
                self._sending = True
            else:
                self._queue.append((kind, frame, -1))
                self._cond.notify_all()
        if direct:
            self._send_now(frame)

    def _send_now(self, frame: bytes) -> None:
        """Send one frame this thread took off the queue (or never queued)."""
        try:
            self.conn.send_bytes(frame)
        except OSError as exc:
            self._fail(exc)
            raise ConnectionError(
                f"channel {self.edge} to {self.conn.name} broke: {exc!r}"
            ) from exc
        finally:
            with self._cond:
                self._sending = False
                self._cond.notify_all()

    def send_barrier(self, barrier: CheckpointBarrier) -> list[bytes]:
        frame = self.encoder.encode(barrier)
        n = barrier.checkpoint_id
        with self._cond:
            self._check()
            if barrier.overtakes:
                overtaken = self._overtake(len(self._queue), (_BARRIER, frame, n))
            else:
                overtaken = []
                self._queue.append((_BARRIER, frame, n))
                if barrier.alignment_deadline is not None and len(self._queue) > 1:
                    self._in_line[n] = barrier
            self._cond.notify_all()
        return overtaken

    def barrier_pending(self, checkpoint_id: int) -> bool:
        """True while an aligned barrier with a timeout waits in this queue."""
        return checkpoint_id in self._in_line

    def promote_barrier(self, checkpoint_id: int) -> list[bytes]:
        """The aligned timeout of ``checkpoint_id`` passed with its barrier still queued
        here: it overtakes now; returns the data frames it passed (output channel state)."""
        with self._cond:
            barrier = self._in_line.pop(checkpoint_id, None)
            if barrier is None:
                return []  # sent meanwhile
            queue = self._queue
            position = next(
                i
                for i, (kind, _f, n) in enumerate(queue)
                if kind == _BARRIER and n == checkpoint_id
            )
            del queue[position]
            frame = self.encoder.encode(barrier.unaligned_now())
            overtaken = self._overtake(position, (_BARRIER, frame, checkpoint_id))
            self._cond.notify_all()
        return overtaken

    def _overtake(self, end: int, entry: tuple[int, bytes, int]) -> list[bytes]:
        """Put barrier ``entry`` ahead of the items before queue position ``end`` (behind
        the barriers at the head: barriers keep their order); returns the data frames it
        passed."""
        queue = self._queue
        ahead = 0
        while ahead < end and queue[ahead][0] == _BARRIER:
            ahead += 1
        overtaken = [queue[i][1] for i in range(ahead, end) if queue[i][0] == _DATA]
        queue.insert(ahead, entry)
        return overtaken

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
                    while not self._closed and (
                        self._sending
                        or not (queue and (queue[0][0] == _BARRIER or self._credit > 0))
                    ):
                        cond.wait()
                    if self._closed:
                        return
                    self._sending = True
                    kind, frame, checkpoint_id = queue.popleft()
                    if kind == _BARRIER:
                        self._in_line.pop(checkpoint_id, None)
                    else:
                        self._credit -= 1
                    # Woken at half, not at the first free place: the task then makes
                    # several frames per wake-up instead of trading the GIL per frame.
                    room = len(queue) == OUTPUT_QUEUE_LIMIT // 2
                if room and self._on_room is not None:
                    self._on_room()
                self._send_now(frame)
        except ConnectionError:  # the task sees it on its next send; the peer reports it too
            return

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

    def __init__(
        self, gate: OvertakingInputGate, channel: int, on_room: Callable[[], None] | None = None
    ) -> None:
        self.gate = gate
        self.channel = channel
        if on_room is not None:
            gate.attach_producer(channel, on_room)

    def available(self) -> bool:
        return self.gate.room(self.channel)

    def send(self, item: Any) -> None:
        self.gate.put(self.channel, item)
