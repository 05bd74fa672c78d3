"""Record writers: how an operator's output reaches the next task's channels.

A :class:`RecordWriter` belongs to one network edge of one upstream subtask. It
partitions each batch over the downstream subtasks (forward, rebalance, key-group
hash or broadcast), accumulates per-channel buffers and ships a buffer as one
batch when it reaches ``batch_size``, when the buffer timeout fires, or before an
in-band event (barrier, end-of-input) so that order is kept. Every buffer ships as a
:class:`~epochstream.runtime.batches.RowBatch`: the records, their timestamps if any
and, on a hash edge, the keys the writer computed to route them (the keyed operator
downstream does not compute them again).

Routing is implemented once per partitioning: a slice of the batch per channel
(forward, broadcast, rebalance) or a channel per record by its key's group (hash); the
records' timestamps, when they have any, follow the records to the same channels.

A channel is either :class:`LocalChannel` (same slot: the batch object is handed
over, no serialization) or :class:`NetworkChannel` (one frame over an authenticated
TCP connection: a pickle for a row batch, Arrow IPC for a columnar batch).

Columnar batches (``pyarrow.RecordBatch``) take the :class:`ColumnarRouter`: whole
batches routed at once, key groups computed per column on hash edges.

Example::

    writer = RecordWriter([LocalChannel(gate, 0)], partitioning=Partitioning(), ...)
    writer.write([1, 2, 3]); writer.flush()   # the gate gets RowBatch([1, 2, 3])
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pyarrow import RecordBatch

from epochstream.exceptions import KeyEncodingError, UserFunctionError, short_repr
from epochstream.graph.transformations import Partitioning
from epochstream.runtime.auth import FramedConnection
from epochstream.runtime.batches import RowBatch
from epochstream.runtime.channels import InputGate
from epochstream.runtime.columnar_routing import ColumnarRouter
from epochstream.runtime.frames import FrameEncoder
from epochstream.runtime.metrics import WaitClock
from epochstream.state.keyformat import canonical_nan, encode_key
from epochstream.state.keygroups import KeyGroupAssigner

__all__ = ["Channel", "LocalChannel", "NetworkChannel", "RecordWriter"]

_KEY_CACHE_LIMIT = 1 << 20


class Channel:
    """One FIFO channel to one downstream subtask."""

    def send(self, item: Any) -> None:
        raise NotImplementedError

    def send_barrier(self, barrier: Any) -> list[bytes]:
        """Send a checkpoint barrier; returns the data frames it overtook (the output
        channel state of an unaligned checkpoint; none for a channel that cannot queue)."""
        self.send(barrier)
        return []

    def available(self) -> bool:
        """True while the channel takes more output without its sender waiting (always,
        for channels whose ``send`` blocks instead)."""
        return True

    def barrier_pending(self, checkpoint_id: int) -> bool:
        """True while an aligned barrier with a timeout is queued in this channel."""
        return False

    def promote_barrier(self, checkpoint_id: int) -> list[bytes]:
        """Let a queued barrier overtake now; the data frames it passed."""
        return []

    def close(self) -> None:
        """Release the channel's resources (network channels close their socket)."""


class LocalChannel(Channel):
    """A channel to a task in the same slot: the gate's queue, no serialization.

    ``pressure``: the sending task's backpressure clock (time blocked on a full queue).
    """

    __slots__ = ("channel", "gate", "pressure")

    def __init__(self, gate: InputGate, channel: int, pressure: WaitClock | None = None) -> None:
        self.gate = gate
        self.channel = channel
        self.pressure = pressure

    def send(self, item: Any) -> None:
        self.gate.put(self.channel, item, self.pressure)


class NetworkChannel(Channel):
    """A channel over TCP; each item is one frame (:class:`~epochstream.runtime.frames.FrameEncoder`).

    ``pressure``: the sending task's backpressure clock. Time in the socket write counts
    as backpressure: it blocks only while the peer's buffers are full (the peer's input
    queue is full and its reader stopped reading).
    """

    __slots__ = ("conn", "encoder", "pressure")

    def __init__(
        self, conn: FramedConnection, edge: str = "", pressure: WaitClock | None = None
    ) -> None:
        self.conn = conn
        self.encoder = FrameEncoder(edge)
        self.pressure = pressure or WaitClock()

    def send(self, item: Any) -> None:
        data = self.encoder.encode(item)
        pressure = self.pressure
        pressure.begin()
        try:
            self.conn.send_bytes(data)
        finally:
            pressure.end()

    def close(self) -> None:
        self.conn.close()


class RecordWriter:
    """Partitions batches over ``channels`` (index = downstream subtask)."""

    def __init__(
        self,
        channels: list[Channel],
        *,
        partitioning: Partitioning,
        max_parallelism: int,
        batch_size: int,
        subtask_index: int = 0,
        edge: str = "",
    ) -> None:
        self.channels = channels
        self.kind = partitioning.kind
        self.batch_size = batch_size
        self._buffers: list[list[Any]] = [[] for _ in channels]
        # Timestamps parallel to each buffer, or None while its records carry none.
        self._ts: list[list[Any] | None] = [None for _ in channels]
        # Keys parallel to each buffer (hash edges only): they ship with the records.
        self._keys: list[list[Any]] | None = (
            [[] for _ in channels] if partitioning.kind == "hash" else None
        )
        self._n = len(channels)
        self._next = subtask_index % max(self._n, 1)
        self._subtask = subtask_index
        self._key_selector: Callable[[Any], Any] | None = partitioning.key_selector
        self._assigner = KeyGroupAssigner.shared(max_parallelism)
        self._max_parallelism = max_parallelism
        self._channel_of_key: dict[Any, int] = {}
        self.records_out = 0
        #: Names the edge in errors: "upstream-uid -> downstream chain (hash)".
        self.edge = edge
        self._columnar: ColumnarRouter | None = None
        self._partitioning = partitioning

    def _router(self) -> ColumnarRouter:
        """The columnar half, made on the first columnar batch (row edges never need it)."""
        if self._columnar is None:
            self._columnar = ColumnarRouter(
                self._n,
                kind=self.kind,
                key=self._partitioning.key_selector,
                max_parallelism=self._max_parallelism,
                batch_size=self.batch_size,
                subtask_index=self._subtask,
                ship=lambda ch, batch: self.channels[ch].send(batch),
                edge=self.edge,
            )
        return self._columnar

    def write(self, records: Any, timestamps: list[Any] | None = None) -> None:
        """Partition ``records`` (with their timestamps, if any) into the per-channel
        buffers, shipping full ones; a ``pyarrow.RecordBatch`` takes the columnar router.

        Routing is decided once per batch (which slice goes to which channel) or, on a
        hash edge, once per record (its key's channel); the timestamps then follow the
        records they belong to (``_carry_timestamps``, ``_route_by_key_timed``).
        """
        self.records_out += len(records)
        if type(records) is RecordBatch:
            self._ship_rows_before_columns()
            self._router().write(records)
            return
        if self._keys is not None:
            self._write_hashed(records, timestamps)
        else:
            buffers = self._buffers
            for ch, part in self._parts(len(records)):
                chunk = records if part is None else records[part]
                if chunk:
                    ts = timestamps if part is None or timestamps is None else timestamps[part]
                    self._carry_timestamps(ch, ts, len(chunk))
                    buffers[ch].extend(chunk)
        size = self.batch_size
        for ch, buf in enumerate(self._buffers):
            if len(buf) >= size:
                self._ship(ch)

    def _parts(self, count: int) -> list[tuple[int, slice | None]]:
        """Where a batch of ``count`` records goes on an edge that does not hash: (channel,
        slice of the batch, ``None`` for all of it) pairs."""
        kind = self.kind
        if kind == "forward":
            # An unchained forward edge (a union input): subtask i feeds subtask i only;
            # in-band events still go to every channel (broadcast_event).
            return [(self._subtask, None)]
        if kind == "broadcast":
            return [(ch, None) for ch in range(self._n)]
        # rebalance: round-robin slices, continuing where the last batch stopped
        n, start = self._n, self._next
        self._next = (start + count) % n
        return [((start + i) % n, slice(i, None, n)) for i in range(n)]

    def _carry_timestamps(self, ch: int, timestamps: list[Any] | None, count: int) -> None:
        """Keep channel ``ch``'s timestamps parallel to its buffer as ``count`` records
        join it: theirs, or ``None`` each when they have none but the buffer's earlier
        records had some. Call before the records join the buffer."""
        if timestamps is not None:
            self._timestamps_of(ch).extend(timestamps)
        else:
            ts = self._ts[ch]
            if ts is not None:
                ts.extend([None] * count)

    def _timestamps_of(self, ch: int) -> list[Any]:
        """Channel ``ch``'s timestamps, made (``None`` for each record already in its
        buffer) when its first timestamped record comes."""
        ts = self._ts[ch]
        if ts is None:
            ts = self._ts[ch] = [None] * len(self._buffers[ch])
        return ts

    def _write_hashed(self, records: list[Any], timestamps: list[Any] | None) -> None:
        assert self._key_selector is not None and self._keys is not None
        key_of, cache, channel_for = self._key_selector, self._channel_of_key, self._channel_for
        # The lists are not swapped (shipped) before the loop ends.
        if timestamps is None:
            record, exc = _route_by_key(
                records, key_of, cache, channel_for, self._buffers, self._keys
            )
        else:
            # Made before the records join the buffers: padded to the records before them.
            stamps = [self._timestamps_of(ch) for ch in range(self._n)]
            record, exc = _route_by_key_timed(
                records, timestamps, key_of, cache, channel_for, self._buffers, self._keys, stamps
            )
        if exc is not None:
            raise self._routing_error(record, exc) from exc
        if timestamps is None and any(ts is not None for ts in self._ts):
            # Rare: a batch without timestamps after one with them, on a hash edge.
            for ch, ts in enumerate(self._ts):
                if ts is not None:
                    ts.extend([None] * (len(self._buffers[ch]) - len(ts)))

    def _routing_error(self, record: Any, exc: Exception) -> Exception:
        """Say which key selector, edge and record failed, and why (off the hot path)."""
        key_of = self._key_selector
        selector = f"key selector {self._partitioning.selector_label} on edge {self.edge}"
        shown = short_repr(record)
        try:
            key = key_of(record)  # type: ignore[misc]
        except Exception as user_exc:  # the selector itself raised: a user function error
            return UserFunctionError(selector, record, user_exc)
        try:
            hash(key)
        except TypeError as hash_exc:
            return KeyEncodingError(
                f"{selector} returned an unhashable key {short_repr(key)} of type "
                f"{type(key).__qualname__} for record {shown}: keyed state is kept per key, "
                f"so keys must be hashable; return a tuple instead of a list ({hash_exc})"
            )
        try:
            encode_key(key)
        except KeyEncodingError as enc_exc:
            return KeyEncodingError(f"{selector}, record {shown}: {enc_exc}")
        return exc

    def _channel_for(self, key: Any) -> int:
        kg = self._assigner.key_group(key)
        ch = kg * self._n // self._max_parallelism
        if len(self._channel_of_key) >= _KEY_CACHE_LIMIT:
            self._channel_of_key.clear()
        self._channel_of_key[key] = ch
        return ch

    def _ship(self, ch: int) -> None:
        buf = self._buffers[ch]
        if buf:
            self._buffers[ch] = []
            ts = self._ts[ch]
            if ts is not None:
                self._ts[ch] = None
            keys = self._keys
            if keys is None:
                self.channels[ch].send(RowBatch(buf, ts))
            else:
                shipped, keys[ch] = keys[ch], []
                self.channels[ch].send(RowBatch(buf, ts, shipped))

    def _ship_rows_before_columns(self) -> None:
        # A stream switching forms keeps its order: buffered rows leave first.
        if any(self._buffers):
            for ch in range(self._n):
                self._ship(ch)

    def flush(self) -> None:
        """Ship every non-empty buffer."""
        columnar = self._columnar
        for ch in range(self._n):
            if columnar is not None:
                columnar.flush_channel(ch)
            self._ship(ch)

    def broadcast_event(self, event: Any) -> None:
        """Flush, then send ``event`` on every channel (keeps its order after the records)."""
        self.flush()
        for channel in self.channels:
            channel.send(event)

    def broadcast_barrier(self, barrier: Any) -> dict[int, list[bytes]]:
        """Flush, then send ``barrier`` on every channel; per channel (index), the data
        frames an overtaking barrier overtook (only channels that had some)."""
        self.flush()
        return self._frames_per_channel(lambda channel: channel.send_barrier(barrier))

    def available(self) -> bool:
        """True while every channel takes more output without waiting."""
        return all(channel.available() for channel in self.channels)

    def barrier_pending(self, checkpoint_id: int) -> bool:
        """True while a channel still queues the aligned barrier of ``checkpoint_id``."""
        return any(channel.barrier_pending(checkpoint_id) for channel in self.channels)

    def promote_barrier(self, checkpoint_id: int) -> dict[int, list[bytes]]:
        """The barrier of ``checkpoint_id`` overtakes where it is still queued; per
        channel (index), the data frames it passed."""
        return self._frames_per_channel(lambda channel: channel.promote_barrier(checkpoint_id))

    def _frames_per_channel(
        self, frames_of: Callable[[Channel], list[bytes]]
    ) -> dict[int, list[bytes]]:
        """``frames_of`` on every channel; the non-empty results by channel index."""
        found = {}
        for index, channel in enumerate(self.channels):
            frames = frames_of(channel)
            if frames:
                found[index] = frames
        return found

    def close(self) -> None:
        for channel in self.channels:
            channel.close()


# The per-record loops of a hash edge: each record's key, its channel (cached per key),
# then the record, its key and (the timed loop) its timestamp appended to that channel's
# lists. Two loops, one line apart, rather than one with a test or a call per record to
# tell them apart: that would cost the untimed path, the common one, a few percent of
# its routing. ``lists[ch].append(x)`` rather than pre-bound appends: CPython 3.11
# specializes the method call of a list. A NaN key misses the cache every time (it
# equals no cached key): the one NaN object it becomes finds its state, where every NaN
# is one key. Each returns the record that failed and its error, or ``(None, None)``.


def _route_by_key(
    records: list[Any],
    key_of: Callable[[Any], Any],
    cache: dict[Any, int],
    channel_for: Callable[[Any], int],
    buffers: list[list[Any]],
    keys: list[list[Any]],
) -> tuple[Any, Exception | None]:
    record = None
    try:
        for record in records:
            key = key_of(record)
            ch = cache.get(key)
            if ch is None:
                key = canonical_nan(key)
                ch = channel_for(key)
            buffers[ch].append(record)
            keys[ch].append(key)
    except Exception as exc:
        return record, exc
    return None, None


def _route_by_key_timed(
    records: list[Any],
    timestamps: list[Any],
    key_of: Callable[[Any], Any],
    cache: dict[Any, int],
    channel_for: Callable[[Any], int],
    buffers: list[list[Any]],
    keys: list[list[Any]],
    stamps: list[list[Any]],
) -> tuple[Any, Exception | None]:
    record = None
    try:
        for record, ts in zip(records, timestamps, strict=True):
            key = key_of(record)
            ch = cache.get(key)
            if ch is None:
                key = canonical_nan(key)
                ch = channel_for(key)
            buffers[ch].append(record)
            keys[ch].append(key)
            stamps[ch].append(ts)
    except Exception as exc:
        return record, exc
    return None, None
