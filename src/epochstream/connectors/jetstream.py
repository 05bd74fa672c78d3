"""NATS JetStream source and sink (client: ``nats-py``).

:class:`JetStreamSource` reads one stream (optionally only ``subject``) from
``start_sequence``. The stream sequence is the offset: the split state is the next
sequence to read, so a restore resumes exactly there (exactly-once). Messages come
through an ephemeral pull consumer with ``AckPolicy.ALL``; the reader acknowledges the
last message a checkpoint covers only when that checkpoint completes (so a work-queue
or interest stream keeps what a restore may need). Redeliveries and anything below the
split's position are skipped by sequence. A stream is one split: one subtask reads it.
Records are the message payloads (``bytes``); with ``json_schema`` they are Arrow
batches of that schema instead, each payload one JSON object decoded as
:class:`~epochstream.connectors.kafka.source.KafkaSource` decodes JSON
(:mod:`epochstream.connectors.jsoncolumns`). A payload that does not decode fails the
job with a :class:`~epochstream.SourceDecodeError` naming the stream and the sequence
(the payloads before it go out first; a restore reads it again). There is no bounded
mode: a stream is read until the job is cancelled.

:class:`JetStreamSink` is exactly-once by write-ahead: a checkpoint interval's records
are kept in the sink's checkpointed state and published only after that checkpoint
completes, each with a deterministic ``Nats-Msg-Id``
``<job>/<sink>/<subtask>/<checkpoint>/<index>``. A re-publish after a recovery (the
checkpoint completed, the publish did not finish) is dropped by the server's duplicate
detection. **Limit**: duplicates are detected only within the stream's
``duplicate_window`` (default 2 minutes, set when the stream is created): a recovery
that re-publishes later than that after the first attempt publishes them again. Keep
the window above the restart delay plus the time to redeploy. Output appears one
checkpoint interval late. Records must be ``bytes`` or ``str`` (UTF-8).

The sink also takes Arrow record batches (a columnar stream, no ``to_rows()``): one
message per row, kept and published exactly as row records are. A batch whose only
column (besides the runtime's ``_ts`` and ``_kg``) is binary or string sends its
values as the payloads (strings as UTF-8; a null fails the job); any other batch sends
each row as a compact JSON object (timestamps, dates and times as ISO-8601 strings,
decimals as strings, binaries as base64: :mod:`epochstream.connectors.batchform`).

Example::

    stream = env.from_source(JetStreamSource("nats://127.0.0.1:4222", "ORDERS", "orders.new"))
    stream.map(process).sink_to(JetStreamSink("nats://127.0.0.1:4222", "orders.done"))
"""

from __future__ import annotations

import threading
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from epochstream.connectors.base import (
    Sink,
    SinkContext,
    SinkWriter,
    Source,
    SourceContext,
    SourceReader,
)
from epochstream.connectors.batchform import is_batch, json_rows, user_columns
from epochstream.connectors.jsoncolumns import JsonColumns, excerpt
from epochstream.exceptions import ConfigurationError, SinkError, SourceDecodeError, short_repr

__all__ = ["JetStreamSink", "JetStreamSource", "JetStreamSplit", "WriteAheadEntry"]

T = TypeVar("T")

_TIMEOUT = 30.0
_FETCH_WAIT = 0.05
_PUBLISH_WINDOW = 512


class _EventLoop:
    """A private asyncio loop on a daemon thread: nats-py is async, readers are not."""

    def __init__(self, name: str) -> None:
        # Imported here: asyncio costs every process ~35 ms, and only JetStream needs it.
        import asyncio

        self._asyncio = asyncio
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = _TIMEOUT) -> T:
        return self._asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(_TIMEOUT)
        self.loop.close()


def _servers(servers: str | list[str]) -> list[str]:
    found = [servers] if isinstance(servers, str) else list(servers)
    if not found or not all(isinstance(s, str) and s for s in found):
        raise ConfigurationError(f"JetStream servers must be URLs, got {servers!r}")
    return found


@dataclass(frozen=True)
class JetStreamSplit:
    """Stream ``stream`` (messages on ``subject``), read on from sequence ``next_sequence``.

    Example::

        JetStreamSplit(split_id="ORDERS", stream="ORDERS", subject="orders.new", next_sequence=1)
    """

    split_id: str
    stream: str
    subject: str | None
    next_sequence: int


class JetStreamSource(Source):
    """A JetStream stream from a sequence on (module docstring).

    Guarantee: exactly-once (the stream sequence in every checkpoint; acks after completion).

    ``json_schema`` (a ``pyarrow.Schema``): read each payload as one JSON object into
    Arrow batches of that schema (a columnar stream) instead of ``bytes`` records.

    Example::

        env.from_source(JetStreamSource("nats://127.0.0.1:4222", "IN", start_sequence=1))
        env.from_source(JetStreamSource(url, "IN", json_schema=pa.schema([("k", pa.string())])))
    """

    bounded = False

    def __init__(
        self,
        servers: str | list[str],
        stream: str,
        subject: str | None = None,
        start_sequence: int = 1,
        *,
        fetch_batch: int = 1000,
        json_schema: Any = None,
    ) -> None:
        if not stream:
            raise ConfigurationError("JetStreamSource needs a stream name")
        if start_sequence < 1:
            raise ConfigurationError(
                f"JetStreamSource start_sequence must be >= 1, got {start_sequence}"
            )
        if fetch_batch < 1:
            raise ConfigurationError(f"JetStreamSource fetch_batch must be >= 1, got {fetch_batch}")
        self.servers = _servers(servers)
        self.stream = stream
        self.subject = subject
        self.start_sequence = start_sequence
        self.fetch_batch = fetch_batch
        self.json_schema = json_schema
        # Read by the environment: Arrow batches, not rows, leave this source.
        self.columnar = json_schema is not None

    def create_splits(self, parallelism: int) -> list[JetStreamSplit]:
        """One split: a stream is one ordered log."""
        return [JetStreamSplit(self.stream, self.stream, self.subject, self.start_sequence)]

    def create_reader(self, ctx: SourceContext) -> JetStreamReader:
        return JetStreamReader(self)


class JetStreamReader(SourceReader):
    """Pulls a split's messages; acks what a completed checkpoint covers.

    Example::

        reader = JetStreamSource(url, "IN").create_reader(ctx)
        reader.add_splits([JetStreamSplit("IN", "IN", None, 1)])
        reader.poll(100)   # [b"...", ...]
    """

    def __init__(self, source: JetStreamSource) -> None:
        self._source = source
        self._split: JetStreamSplit | None = None
        self._loop: _EventLoop | None = None
        self._nc: Any = None
        self._sub: Any = None
        self._last_msg: Any = None  # the last message read, acked once a checkpoint covers it
        self._to_ack: dict[int, Any] = {}  # checkpoint id -> its last message
        self._json = None if source.json_schema is None else JsonColumns(source.json_schema)
        self._error: SourceDecodeError | None = None  # raised on the poll after its records

    def add_splits(self, splits: list[Any]) -> None:
        for split in splits:
            if not isinstance(split, JetStreamSplit):
                raise ConfigurationError(
                    f"JetStreamReader got a {type(split).__qualname__} split, not a JetStreamSplit"
                )
            if self._split is not None:
                raise ConfigurationError("JetStreamReader reads one stream per subtask")
            self._split = split

    def _connect(self, split: JetStreamSplit) -> None:
        import nats
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        self._loop = _EventLoop(f"jetstream-{split.stream}")

        async def connect() -> tuple[Any, Any]:
            nc = await nats.connect(servers=self._source.servers, max_reconnect_attempts=3)
            js = nc.jetstream()
            config = ConsumerConfig(
                deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                opt_start_seq=split.next_sequence,
                ack_policy=AckPolicy.ALL,
                # Acks wait for checkpoints: no redelivery or flow stop meanwhile.
                ack_wait=3600.0,
                max_ack_pending=-1,
                inactive_threshold=60.0,
            )
            if split.subject:
                config.filter_subject = split.subject
            sub = await js.pull_subscribe(split.subject or ">", stream=split.stream, config=config)
            return nc, sub

        self._nc, self._sub = self._loop.run(connect())

    def poll(self, max_records: int) -> Any:
        if self._error is not None:
            raise self._error
        split = self._split
        if split is None:
            return []
        if self._sub is None:
            self._connect(split)
        assert self._loop is not None

        async def fetch() -> list[Any]:
            try:
                return list(
                    await self._sub.fetch(
                        min(max_records, self._source.fetch_batch), timeout=_FETCH_WAIT
                    )
                )
            except TimeoutError:  # nothing new within the wait (nats-py raises either kind)
                return []

        msgs = self._loop.run(fetch())
        if not msgs:
            return []
        nxt = split.next_sequence
        # A redelivery, or before the restored position: skipped.
        fresh = [m for m in msgs if m.metadata.sequence.stream >= nxt]
        if not fresh:
            return []
        out: Any = [m.data for m in fresh]
        if self._json is not None:
            out, fresh = self._decode(split, fresh)
        if fresh:
            self._last_msg = fresh[-1]
            nxt = fresh[-1].metadata.sequence.stream + 1
        if self._error is not None:
            nxt = self._error.offset  # the bad message is read again after a restore
        self._split = JetStreamSplit(split.split_id, split.stream, split.subject, nxt)
        return out

    def _decode(self, split: JetStreamSplit, msgs: list[Any]) -> tuple[Any, list[Any]]:
        """The Arrow batch of the payloads up to the first that is not a JSON object of
        the schema, and their messages; that one becomes ``self._error``."""
        import pyarrow as pa

        assert self._json is not None
        payloads = [m.data for m in msgs]
        columns, _, bad = self._json.decode(payloads, keep_going=False)
        if bad:
            index, reason = bad[0]
            seq = msgs[index].metadata.sequence.stream
            self._error = SourceDecodeError(
                f"cannot decode JetStream message {split.stream} at sequence {seq} as json: "
                f"{reason}: {excerpt(payloads[index])}",
                path=split.stream,
                offset=seq,
            )
            msgs = msgs[:index]  # decoding stopped at the bad one: the rest is not read
        batch = pa.RecordBatch.from_arrays(columns, schema=self._json.schema)
        return (batch if batch.num_rows else []), msgs

    @property
    def exhausted(self) -> bool:
        """A stream never ends."""
        return False

    @property
    def needs_splits(self) -> bool:
        """Only a subtask without the stream asks (its enumerator discovers nothing, so
        the request stays unanswered): a reader reads one stream."""
        return self._split is None

    def snapshot(self, checkpoint_id: int) -> list[Any]:
        if self._last_msg is not None:  # acked once this checkpoint completes
            self._to_ack[checkpoint_id] = self._last_msg
            self._last_msg = None
        return [] if self._split is None else [self._split]

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Ack (AckPolicy.ALL) the last message this checkpoint covers."""
        done = [cid for cid in self._to_ack if cid <= checkpoint_id]
        if not done or self._loop is None:
            return
        last = self._to_ack[max(done)]
        for cid in done:
            del self._to_ack[cid]
        self._loop.run(last.ack())

    def close(self) -> None:
        if self._loop is None:
            return
        try:
            if self._nc is not None:
                self._loop.run(self._nc.close())
        finally:
            self._loop.stop()
            self._loop = None


@dataclass(frozen=True)
class WriteAheadEntry:
    """One checkpoint interval's records of one sink subtask, kept until published.

    ``origin`` is the job and sink that wrote them; with ``subtask`` and
    ``checkpoint_id`` it makes the messages' ids, the same on every re-publish.

    Example::

        WriteAheadEntry(origin="3f2a9c1e/out", subtask=0, checkpoint_id=4, records=(b"a",))
    """

    origin: str
    subtask: int
    checkpoint_id: int
    records: tuple[bytes, ...]

    def message_id(self, index: int) -> str:
        """``<job>/<sink>/<subtask>/<checkpoint>/<index>``."""
        return f"{self.origin}/{self.subtask}/{self.checkpoint_id}/{index}"


class JetStreamSink(Sink):
    """Publishes records to ``subject`` after the checkpoint covering them completes.

    Guarantee: exactly-once within the stream's duplicate window (write-ahead with
    deterministic ``Nats-Msg-Id``; module docstring for the window's limit). Takes rows
    (bytes or str) or Arrow record batches (one message per row; module docstring).

    ``sink_id`` names the sink in message ids (default: the subject).

    Example::

        stream.sink_to(JetStreamSink("nats://127.0.0.1:4222", "results"))
    """

    transactional = True
    accepts_batches = True

    def __init__(
        self, servers: str | list[str], subject: str, *, sink_id: str | None = None
    ) -> None:
        if not subject:
            raise ConfigurationError("JetStreamSink needs a subject")
        self.servers = _servers(servers)
        self.subject = subject
        self.sink_id = sink_id or subject

    def create_writer(self, ctx: SinkContext) -> JetStreamWriter:
        return JetStreamWriter(self, ctx)


class JetStreamWriter(SinkWriter):
    """Write-ahead writer: buffers, checkpoints the buffer, publishes on completion.

    Example::

        w = JetStreamSink(url, "out").create_writer(ctx); w.restore([])
        w.write_batch([b"x"]); entries = w.snapshot(1); w.notify_checkpoint_complete(1)
    """

    def __init__(self, sink: JetStreamSink, ctx: SinkContext) -> None:
        self._sink = sink
        self._ctx = ctx
        self._origin = f"{ctx.job_id[:8]}/{sink.sink_id}"
        self._buffer: list[bytes] = []
        self._pending: dict[int, WriteAheadEntry] = {}
        self._loop: _EventLoop | None = None
        self._js: Any = None
        self._nc: Any = None

    def restore(self, entries: list[Any]) -> None:
        """Subtask 0 publishes every recovered entry; the server drops what it has."""
        if self._ctx.subtask_index != 0:
            return
        for entry in entries:
            if not isinstance(entry, WriteAheadEntry):
                raise SinkError(
                    f"JetStreamSink {self._sink.subject!r}: cannot recover a "
                    f"{type(entry).__qualname__} entry",
                    retryable=False,
                )
        self._publish(sorted(entries, key=lambda e: (e.checkpoint_id, e.subtask)))

    def write_batch(self, records: Any) -> None:
        buffer = self._buffer
        if is_batch(records):
            buffer.extend(self._batch_payloads(records))
            return
        try:
            buffer.extend([r if isinstance(r, bytes) else r.encode("utf-8") for r in records])
        except AttributeError:
            bad = next(r for r in records if not isinstance(r, bytes | str))
            raise SinkError(
                f"JetStreamSink {self._sink.subject!r}: record {short_repr(bad)} of type "
                f"{type(bad).__qualname__} is neither bytes nor str",
                retryable=False,
            ) from None

    def _batch_payloads(self, batch: Any) -> list[bytes]:
        import pyarrow as pa

        batch = user_columns(batch)
        lone = batch.schema.field(0).type if batch.num_columns == 1 else None
        if lone is not None and any(
            test(lone)
            for test in (
                pa.types.is_binary,
                pa.types.is_large_binary,
                pa.types.is_string,
                pa.types.is_large_string,
            )
        ):
            column = batch.column(0)
            if column.null_count:
                raise SinkError(
                    f"JetStreamSink {self._sink.subject!r}: column {batch.schema.names[0]!r} "
                    "of a batch holds nulls; a message needs a payload",
                    retryable=False,
                )
            # A string column's UTF-8 buffers are its payloads: cast, not encoded per value.
            payloads: list[bytes] = column.cast(pa.large_binary()).to_pylist()
            return payloads
        try:
            return [line.encode("utf-8") for line in json_rows(batch, separators=(",", ":"))]
        except (TypeError, ValueError) as exc:
            raise SinkError(
                f"JetStreamSink {self._sink.subject!r}: cannot encode a batch of "
                f"{batch.schema.names} as JSON: {exc}",
                retryable=False,
            ) from exc

    def snapshot(self, checkpoint_id: int) -> list[Any]:
        if self._buffer:
            self._pending[checkpoint_id] = WriteAheadEntry(
                self._origin, self._ctx.subtask_index, checkpoint_id, tuple(self._buffer)
            )
            self._buffer = []
        return list(self._pending.values())

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        done = [cid for cid in self._pending if cid <= checkpoint_id]
        if done:
            self._publish([self._pending[cid] for cid in done])
            for cid in done:
                del self._pending[cid]

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        """Its records stay pending: the next completed checkpoint covers them too."""

    def end_input(self) -> None:
        """With checkpointing off, publish now (at-least-once); else the final checkpoint does."""
        if not self._ctx.checkpointing and self._buffer:
            entry = WriteAheadEntry(self._origin, self._ctx.subtask_index, 0, tuple(self._buffer))
            self._buffer = []
            self._publish([entry])

    def close(self) -> None:
        if self._loop is None:
            return
        try:
            self._loop.run(self._nc.close())
        finally:
            self._loop.stop()
            self._loop = None

    def _publish(self, entries: list[WriteAheadEntry]) -> None:
        if not entries:
            return
        if self._loop is None:
            import nats

            self._loop = _EventLoop(f"jetstream-sink-{self._sink.subject}")

            async def connect() -> tuple[Any, Any]:
                nc = await nats.connect(servers=self._sink.servers, max_reconnect_attempts=3)
                return nc, nc.jetstream()

            self._nc, self._js = self._loop.run(connect())
        js, subject = self._js, self._sink.subject

        messages = [
            (data, entry.message_id(i)) for entry in entries for i, data in enumerate(entry.records)
        ]

        import asyncio

        async def publish() -> None:
            # Pipelined in windows: a window's publishes are all sent before its first ack
            # is awaited, and a bounded number waits at once (each has its own timeout).
            for start in range(0, len(messages), _PUBLISH_WINDOW):
                window = messages[start : start + _PUBLISH_WINDOW]
                await asyncio.gather(
                    *(
                        js.publish(subject, data, timeout=_TIMEOUT, headers={"Nats-Msg-Id": mid})
                        for data, mid in window
                    )
                )

        try:
            self._loop.run(publish(), timeout=_TIMEOUT * (1 + len(messages) // _PUBLISH_WINDOW))
        except Exception as exc:
            raise SinkError(
                f"JetStreamSink {subject!r}: publishing checkpoint(s) "
                f"{sorted({e.checkpoint_id for e in entries})} failed: {type(exc).__name__}: {exc}"
            ) from exc
