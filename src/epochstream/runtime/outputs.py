"""Record writers: how an operator's output reaches the next task's channels.

A :class:`RecordWriter` belongs to one network edge of one upstream subtask. It
partitions each batch over the downstream subtasks (forward, rebalance, key-group
hash or broadcast), accumulates per-channel buffers and ships a buffer as one
batch when it reaches ``batch_size``, when the buffer timeout fires, or before an
in-band event (barrier, end-of-input) so that order is kept. A hash edge ships
:class:`~epochstream.runtime.batches.KeyedBatch` es: the keys it computed to route the
records travel with them, so the keyed operator downstream does not compute them again.

A channel is either :class:`LocalChannel` (same slot: the batch object is handed
over, no serialization) or :class:`NetworkChannel` (one frame over an authenticated
TCP connection: a pickle for a row batch, Arrow IPC for a columnar batch).

Columnar batches (``pyarrow.RecordBatch``) take the :class:`ColumnarRouter`: whole
batches routed at once, key groups computed per column on hash edges.

Example::

    writer = RecordWriter([LocalChannel(gate, 0)], partitioning=Partitioning(), ...)
    writer.write([1, 2, 3]); writer.flush()
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

import cloudpickle
from pyarrow import RecordBatch

from epochstream.core.arrow import encode_ipc
from epochstream.exceptions import (
    KeyEncodingError,
    SerializationError,
    UserFunctionError,
    short_repr,
)
from epochstream.graph.transformations import Partitioning
from epochstream.runtime.auth import FramedConnection
from epochstream.runtime.batches import KeyedBatch, TimedBatch
from epochstream.runtime.channels import InputGate
from epochstream.runtime.columnar_routing import ColumnarRouter
from epochstream.runtime.metrics import WaitClock
from epochstream.state.keyformat import canonical_nan, encode_key
from epochstream.state.keygroups import KeyGroupAssigner

__all__ = ["Channel", "LocalChannel", "NetworkChannel", "RecordWriter"]

_KEY_CACHE_LIMIT = 1 << 20


class Channel:
    """One FIFO channel to one downstream subtask."""

    def send(self, item: Any) -> None:
        raise NotImplementedError

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
    """A channel over TCP; each item is one pickled frame.

    Frames are plain pickle (protocol 5). A batch plain pickle refuses (an instance of
    a class defined in the job script, which slots know only by value) is pickled with
    cloudpickle instead, and the channel keeps using cloudpickle from then on. A record
    neither can pickle fails the task with :class:`SerializationError` naming the
    record and the edge.

    ``pressure``: the sending task's backpressure clock. Time in the socket write counts
    as backpressure: it blocks only while the peer's buffers are full (the peer's input
    queue is full and its reader stopped reading).
    """

    __slots__ = ("_dumps", "conn", "edge", "pressure")

    def __init__(
        self, conn: FramedConnection, edge: str = "", pressure: WaitClock | None = None
    ) -> None:
        self.conn = conn
        self.edge = edge
        self.pressure = pressure or WaitClock()
        self._dumps: Callable[..., bytes] = pickle.dumps

    def send(self, item: Any) -> None:
        if type(item) is RecordBatch:
            data = encode_ipc(item)
        else:
            try:
                data = self._dumps(item, protocol=5)
            except Exception:  # plain pickle refused: try by-value pickling, then name the record
                data = self._by_value(item)
        pressure = self.pressure
        pressure.begin()
        try:
            self.conn.send_bytes(data)
        finally:
            pressure.end()

    def _by_value(self, item: Any) -> bytes:
        try:
            data: bytes = cloudpickle.dumps(item, protocol=5)
        except Exception as exc:
            raise _serialization_error(item, self.edge, exc) from exc
        self._dumps = cloudpickle.dumps
        return data

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

    def write(self, batch: list[Any], timestamps: list[Any] | None = None) -> None:
        """Partition ``batch`` (with its timestamps, if any) into the per-channel
        buffers, shipping full ones."""
        n = self._n
        self.records_out += len(batch)
        if type(batch) is RecordBatch:
            self._ship_rows_before_columns()
            self._router().write(batch)
            return
        if timestamps is not None:
            self._write_timed(batch, timestamps)
        elif self.kind == "hash":
            self._write_hashed(batch)
        elif self.kind == "forward":
            # An unchained forward edge (a union input): subtask i feeds subtask i only;
            # in-band events still go to every channel (broadcast_event).
            self._buffers[self._subtask].extend(batch)
            self._pad(self._subtask, len(batch))
        elif self.kind == "broadcast":
            for ch, buf in enumerate(self._buffers):
                buf.extend(batch)
                self._pad(ch, len(batch))
        else:  # rebalance: round-robin slices, continuing where the last batch stopped
            start = self._next
            for i in range(n):
                part = batch[i::n]
                if part:
                    ch = (start + i) % n
                    self._buffers[ch].extend(part)
                    self._pad(ch, len(part))
            self._next = (start + len(batch)) % n
        size = self.batch_size
        for ch, buf in enumerate(self._buffers):
            if len(buf) >= size:
                self._ship(ch)

    def _pad(self, ch: int, count: int) -> None:
        """Records without timestamps joined a buffer that has timestamps: ``None`` each."""
        ts = self._ts[ch]
        if ts is not None:
            ts.extend([None] * count)

    def _timestamps_of(self, ch: int) -> list[Any]:
        ts = self._ts[ch]
        if ts is None:
            ts = self._ts[ch] = [None] * len(self._buffers[ch])
        return ts

    def _write_timed(self, batch: list[Any], timestamps: list[Any]) -> None:
        buffers = self._buffers
        if self.kind == "hash":
            key_of = self._key_selector
            assert key_of is not None
            cache = self._channel_of_key
            ts_lists = [self._timestamps_of(ch) for ch in range(self._n)]
            assert self._keys is not None
            key_lists = self._keys
            record = None
            try:
                for record, ts in zip(batch, timestamps, strict=True):
                    key = key_of(record)
                    ch = cache.get(key)
                    if ch is None:
                        key = canonical_nan(key)
                        ch = self._channel_for(key)
                    buffers[ch].append(record)
                    key_lists[ch].append(key)
                    ts_lists[ch].append(ts)
            except Exception as exc:
                raise self._routing_error(record, exc) from exc
        # The timestamps list of a buffer is made (padded to the buffer) before the
        # records join it.
        elif self.kind == "forward":
            self._timestamps_of(self._subtask).extend(timestamps)
            buffers[self._subtask].extend(batch)
        elif self.kind == "broadcast":
            for ch, buf in enumerate(buffers):
                self._timestamps_of(ch).extend(timestamps)
                buf.extend(batch)
        else:
            n, start = self._n, self._next
            for i in range(n):
                part = batch[i::n]
                if part:
                    ch = (start + i) % n
                    self._timestamps_of(ch).extend(timestamps[i::n])
                    buffers[ch].extend(part)
            self._next = (start + len(batch)) % n

    def _write_hashed(self, batch: list[Any]) -> None:
        key_of = self._key_selector
        assert key_of is not None
        cache = self._channel_of_key
        # Bound appends per channel: the buffers are not swapped before the loop ends.
        add = [buf.append for buf in self._buffers]
        assert self._keys is not None
        add_key = [keys.append for keys in self._keys]
        record = None
        try:
            for record in batch:
                key = key_of(record)
                ch = cache.get(key)
                if ch is None:
                    # A NaN key misses every time (it equals no cached key): the one NaN
                    # object it becomes finds its state, where every NaN is one key.
                    key = canonical_nan(key)
                    ch = self._channel_for(key)
                add[ch](record)
                add_key[ch](key)
        except Exception as exc:
            raise self._routing_error(record, exc) from exc
        if any(ts is not None for ts in self._ts):
            self._pad_hashed()

    def _pad_hashed(self) -> None:
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
            if keys is not None:
                shipped, keys[ch] = keys[ch], []
                self.channels[ch].send(KeyedBatch(buf, shipped, ts))
            elif ts is None:
                self.channels[ch].send(buf)
            else:
                self.channels[ch].send(TimedBatch(buf, ts))

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

    def close(self) -> None:
        for channel in self.channels:
            channel.close()


def _serialization_error(item: Any, edge: str, exc: Exception) -> Exception:
    """Find the record of a batch that does not pickle and name it with the edge."""
    if isinstance(item, (TimedBatch, KeyedBatch)):
        item = item.records
    if not isinstance(item, list):
        return exc
    for index, record in enumerate(item):
        try:
            cloudpickle.dumps(record, protocol=5)
        except Exception as record_exc:
            return SerializationError(
                f"record {short_repr(record)} (type {type(record).__qualname__}, position "
                f"{index} of its batch) cannot cross edge {edge} to another slot: "
                f"{type(record_exc).__name__}: {record_exc}. Records moving between slots are "
                "pickled; keep them to picklable values (no open files, sockets, locks, "
                "generators)"
            )
    return exc
