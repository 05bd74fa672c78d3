"""The input gate of a job with unaligned checkpoints: barriers overtake, in-flight
records are recorded.

Three things differ from :class:`~epochstream.runtime.channels.InputGate`:

- A barrier that overtakes (``barrier.overtakes``) never enters its channel's queue: it
  goes to a priority queue the task reads right after its mail, ahead of every record.
  The gate notes where it cut the channel (its *cut*: how many items had been appended
  to the channel before it), so the records queued before it are known.
- An aligned barrier with an aligned timeout is queued in line, with its deadline; when
  the deadline passes the task calls :meth:`OvertakingInputGate.promote`, which turns the
  copies still queued into overtaking ones (and every later copy of that checkpoint).
- :meth:`OvertakingInputGate.start_capture` begins the channel state of an unaligned
  checkpoint: the records queued before each channel's cut, and, on the channels whose
  barrier has not come yet, every record appended until it does (recorded as it is put:
  the recording completes when the barriers arrive, not when the task gets through its
  backlog). Only record batches are kept, as frames (the bytes a network channel carried,
  or their encoding for a channel inside the slot); watermarks are not: a restored task
  starts event time from its inputs again.

Producers never block here: a network channel sends only against credit the gate returns
as the task takes items (:meth:`attach_credit`), and a task in the same slot checks
:meth:`room` before producing more. So a barrier is never stuck behind a full queue.

Example::

    gate = OvertakingInputGate(2)
    gate.put(0, RowBatch([1]))
    gate.put(0, CheckpointBarrier(1, time.time(), CheckpointOptions(unaligned=True)))
    gate.take(0.1)              # (0, CheckpointBarrier(1, ...)): ahead of the record
    gate.start_capture(1)       # channel 0: the record before the cut; channel 1 recorded
"""

from __future__ import annotations

import functools
import itertools
from collections import deque
from collections.abc import Callable
from typing import Any

from pyarrow import RecordBatch

from epochstream.core.events import CheckpointBarrier, EndOfInput
from epochstream.runtime.batches import RowBatch
from epochstream.runtime.channels import Cancelled, InputGate, Polled
from epochstream.runtime.frames import FrameEncoder
from epochstream.runtime.metrics import WaitClock

__all__ = ["CREDIT_BATCH", "ChannelCapture", "OvertakingInputGate"]

#: Items a gate takes from a network channel before it returns their credit in one frame.
CREDIT_BATCH = 4

#: Stands in the queue for an aligned barrier that was promoted to overtake.
_OVERTAKEN = object()


class ChannelCapture:
    """The recorded input channel state of one unaligned checkpoint: frames per channel.

    Example::

        capture = ChannelCapture(7, num_channels=2)
        capture.add(1, b"...")
        capture.frames[1], capture.size      # [b"..."], 3
    """

    __slots__ = ("checkpoint_id", "frames", "size")

    def __init__(self, checkpoint_id: int, num_channels: int) -> None:
        self.checkpoint_id = checkpoint_id
        self.frames: list[list[bytes]] = [[] for _ in range(num_channels)]
        self.size = 0

    def add(self, channel: int, frame: bytes) -> None:
        self.frames[channel].append(frame)
        self.size += len(frame)


def _is_data(item: Any) -> bool:
    kind = type(item)
    return kind is RowBatch or kind is RecordBatch


class OvertakingInputGate(InputGate):
    """An :class:`InputGate` whose overtaking barriers jump the queue and which records
    the channel state of unaligned checkpoints (see the module docstring)."""

    def __init__(self, num_channels: int, *, capacity: int = 16) -> None:
        super().__init__(num_channels, capacity=capacity)
        n = num_channels
        self._priority: deque[tuple[int, CheckpointBarrier]] = deque()
        # Items ever appended to / taken from each channel's queue: the queue holds the
        # items numbered taken..appended-1, so a cut (an append count) locates a barrier.
        self._appended = [0] * n
        self._taken = [0] * n
        self._ended = [False] * n
        # Checkpoint id -> channel -> cut, for the barriers put and not yet settled.
        self._cuts: dict[int, dict[int, int]] = {}
        # Checkpoint id -> wall-clock deadline of its aligned barriers queued in line.
        self._deadlines: dict[int, float] = {}
        # Checkpoint id -> channels whose barrier of it was queued in line (the others
        # came overtaking: their cut is not a queue position of a barrier).
        self._in_line: dict[int, list[int]] = {}
        # Checkpoints whose alignment timed out: every later copy of their barrier overtakes.
        self._promoted: set[int] = set()
        self._captures: dict[int, ChannelCapture] = {}
        # Per channel, the captures still recording what is appended to it.
        self._recording: list[list[ChannelCapture]] = [[] for _ in range(n)]
        self._credit: list[Callable[[int], None] | None] = [None] * n
        self._owed = [0] * n
        # Per channel, the wake-up of a producing task in the same slot (room again).
        self._producers: list[Callable[[], None] | None] = [None] * n
        # Set by wake(): one of this gate's task's outputs has room again.
        self._room = False
        self._encoder = FrameEncoder("channel state")

    # ------------------------------------------------------------------ producers

    def attach_credit(self, channel: int, send_credit: Callable[[int], None]) -> None:
        """A network channel's sender: ``send_credit(k)`` lets it send ``k`` more items.
        It gets the gate's capacity now and credit back as the task takes items."""
        with self._cond:
            self._credit[channel] = send_credit
        send_credit(self.capacity)

    def attach_producer(self, channel: int, wake: Callable[[], None]) -> None:
        """A task in the same slot produces into ``channel``: ``wake()`` is called when
        the channel's queue, once full, is down to half (that task waits for it)."""
        self._producers[channel] = wake

    def wake(self) -> None:
        """An output of this gate's task has room again: a ``take(data=False)`` returns."""
        with self._cond:
            self._room = True
            self._cond.notify_all()

    def room(self, channel: int) -> bool:
        """True while ``channel``'s queue has room (a producer in the same slot may put)."""
        return len(self._queues[channel]) < self.capacity

    def put(
        self,
        channel: int,
        item: Any,
        pressure: WaitClock | None = None,
        frame: bytes | None = None,
    ) -> None:
        """Append ``item`` to ``channel`` (never blocks, so ``pressure`` never runs; see
        the module docstring), or route a barrier: overtaking ones to the priority queue,
        others in line."""
        if frame is None and self._recording[channel] and _is_data(item):
            frame = self._encoder.encode(item)  # outside the lock; rechecked below
        cond = self._cond
        with cond:
            if self._cancelled:
                raise Cancelled()
            kind = type(item)
            if kind is CheckpointBarrier:
                self._put_barrier(channel, item)
            else:
                recording = self._recording[channel]
                if kind is EndOfInput:
                    self._ended[channel] = True
                    recording.clear()
                elif recording and (kind is RowBatch or kind is RecordBatch):
                    if frame is None:  # a capture began since the check above
                        frame = self._encoder.encode(item)
                    for capture in recording:
                        capture.add(channel, frame)
                self._queues[channel].append(item)
                self._appended[channel] += 1
            cond.notify_all()

    def _put_barrier(self, channel: int, barrier: CheckpointBarrier) -> None:
        n = barrier.checkpoint_id
        recording = self._recording[channel]
        if recording:
            # Records after this barrier belong to no capture up to its id (an older id
            # that never came on this channel is aborted by the barrier handler).
            recording[:] = [c for c in recording if c.checkpoint_id > n]
        self._cuts.setdefault(n, {})[channel] = self._appended[channel]
        if barrier.overtakes:
            self._priority.append((channel, barrier))
        elif n in self._promoted:
            self._priority.append((channel, barrier.unaligned_now()))
        else:
            self._queues[channel].append(barrier)
            self._appended[channel] += 1
            deadline = barrier.alignment_deadline
            if deadline is not None:
                self._deadlines.setdefault(n, deadline)
                self._in_line.setdefault(n, []).append(channel)

    # ------------------------------------------------------------------ the task

    def _poll(self, data: bool) -> Polled | None:
        """Overtaking barriers first; then (when ``data``) an input item, whose credit
        and producer wake-up run after the lock; with ``data=False`` (the task's outputs
        are full) ``None`` at once when an output woke the task with room."""
        if self._priority:
            return self._priority.popleft(), None
        if not data:
            if self._room:
                self._room = False
                return None, None  # an output has room: the task looks again
            return None
        n = self.num_channels
        blocked = self.blocked
        start = self._next
        for i in range(n):
            ch = (start + i) % n
            queue = self._queues[ch]
            while queue and not blocked[ch]:
                item = queue.popleft()
                self._taken[ch] += 1
                if item is _OVERTAKEN:
                    continue  # its barrier already went ahead
                self._next = ch + 1
                self._cond.notify_all()
                return (ch, item), self._after_take(ch, queue, item)
        return None

    def _after_take(self, ch: int, queue: Any, item: Any) -> Callable[[], None] | None:
        """What taking ``item`` from channel ``ch`` owes: credit back to its network
        sender (every CREDIT_BATCH items), a wake-up to its producer in the same slot
        (when its queue is down to half)."""
        credit: Callable[[], None] | None = None
        send = self._credit[ch]
        if send is not None and type(item) is not CheckpointBarrier:
            owed = self._owed[ch] + 1
            if owed >= CREDIT_BATCH:
                credit, owed = functools.partial(send, owed), 0
            self._owed[ch] = owed
        wake = self._producers[ch] if len(queue) == self.capacity // 2 else None
        if credit is None or wake is None:
            return credit or wake
        give, wake_up = credit, wake

        def both() -> None:
            give()
            wake_up()

        return both

    def has_input(self) -> bool:
        """True if an overtaking barrier or a non-blocked channel's item is waiting."""
        with self._cond:
            if self._priority:
                return True
            return any(
                not self.blocked[ch] and any(item is not _OVERTAKEN for item in queue)
                for ch, queue in enumerate(self._queues)
            )

    # ------------------------------------------------------------------ aligned timeout

    def next_deadline(self) -> float | None:
        """The earliest deadline of an aligned barrier queued with a timeout, or ``None``."""
        deadlines = self._deadlines
        return min(deadlines.values()) if deadlines else None

    def due(self, now: float) -> list[int]:
        """Checkpoints whose aligned barriers passed their deadline at wall-clock ``now``."""
        with self._cond:
            return sorted(n for n, d in self._deadlines.items() if d <= now)

    def promote(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` turns unaligned: its barriers still queued in line
        go ahead (their place is marked), and later ones will overtake on arrival."""
        with self._cond:
            self._promoted.add(checkpoint_id)
            self._deadlines.pop(checkpoint_id, None)
            for channel in self._in_line.pop(checkpoint_id, ()):
                position = self._cuts[checkpoint_id][channel] - self._taken[channel]
                if position < 0:
                    continue  # the task has read that barrier already
                queue = self._queues[channel]
                barrier = queue[position]
                queue[position] = _OVERTAKEN
                self._priority.append((channel, barrier.unaligned_now()))
            self._cond.notify_all()

    # ------------------------------------------------------------------ channel state

    def start_capture(self, checkpoint_id: int) -> None:
        """Begin the input channel state of unaligned ``checkpoint_id`` (call at its
        snapshot): what each channel queued before its cut now, and what is put on the
        channels without a cut yet until their barrier comes."""
        capture = ChannelCapture(checkpoint_id, self.num_channels)
        queued: list[list[Any]] = []
        with self._cond:
            cuts = self._cuts.get(checkpoint_id, {})
            for channel, queue in enumerate(self._queues):
                cut = cuts.get(channel)
                if cut is None:
                    if not self._ended[channel]:
                        self._recording[channel].append(capture)
                    count = len(queue)
                else:
                    count = max(0, cut - self._taken[channel])
                queued.append([item for item in itertools.islice(queue, count) if _is_data(item)])
            self._captures[checkpoint_id] = capture
        # Only the task thread takes and processes these items, and it is here: encoding
        # them outside the lock sees them unchanged. They go before what was recorded since.
        encode = self._encoder.encode
        encoded = [[encode(item) for item in items] for items in queued]
        with self._cond:
            for channel, frames in enumerate(encoded):
                if frames:
                    capture.frames[channel][:0] = frames
                    capture.size += sum(len(f) for f in frames)

    def finish_capture(self, checkpoint_id: int) -> ChannelCapture:
        """The complete channel state of ``checkpoint_id`` (every channel's barrier came)."""
        with self._cond:
            capture = self._drop(checkpoint_id)
        if capture is None:
            raise KeyError(f"no channel state is being recorded for checkpoint {checkpoint_id}")
        return capture

    def drop_capture(self, checkpoint_id: int) -> None:
        """Forget checkpoint ``checkpoint_id`` (aborted): stop recording for it."""
        with self._cond:
            self._drop(checkpoint_id)

    def settle(self, checkpoint_id: int) -> None:
        """Checkpoints up to ``checkpoint_id`` need no cut or deadline any more, apart
        from those still recording (called when an aligned one triggers or aborts)."""
        with self._cond:
            self._forget_up_to(checkpoint_id)

    def _drop(self, checkpoint_id: int) -> ChannelCapture | None:
        capture = self._captures.pop(checkpoint_id, None)
        if capture is not None:
            for recording in self._recording:
                if capture in recording:
                    recording.remove(capture)
        self._promoted.discard(checkpoint_id)
        self._forget_up_to(checkpoint_id)
        return capture

    def _forget_up_to(self, checkpoint_id: int) -> None:
        keep = self._captures
        for table in (self._cuts, self._deadlines, self._in_line):
            for n in [n for n in table if n <= checkpoint_id and n not in keep]:
                del table[n]
        self._promoted = {n for n in self._promoted if n > checkpoint_id or n in keep}
