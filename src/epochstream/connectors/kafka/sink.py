"""KafkaSink: exactly-once through Kafka transactions, or at-least-once, or none.

``delivery="exactly_once"`` (Flink's two-phase commit with Kafka transactions): each
subtask writes each checkpoint's records into one Kafka transaction, flushes it at the
checkpoint's barrier (pre-commit: records are in the log but invisible to
``read_committed`` consumers), stores its transactional id, producer id and epoch in
the checkpoint, and commits it when the checkpoint completes. A restore commits the
transactions its checkpoint recorded (EndTxn(commit) for the recorded id, producer id
and epoch: :meth:`Producer.resume`; a repeat is harmless) and aborts the transactions
of the failed attempt (initialising a producer with their transactional id aborts
an open transaction and fences its producer).

Transactional ids: ``<prefix>-<job8>-<subtask>-<seq>``; ``seq`` counts the subtask's
transactions, so every id carries one transaction and is never reused (its
producer is closed once the transaction ends). The checkpoint keeps each subtask's
next ``seq`` (:class:`IdRange`): a restore probes the ids from there upwards, aborting
each, until one was never used (epoch 0 after initialising it), as Flink does.

``"at_least_once"``: every barrier blocks until all records sent are acknowledged.
``"none"``: fire and forget; records are flushed at the end of input only. Either way
a delivery error fails the task, naming topic and record.

The sink takes rows or Arrow record batches (a columnar stream, no ``to_rows()``): a
batch's rows are sent one record each, as the dicts ``to_rows()`` would give (without
``_ts`` and ``_kg``), in the same transactions as rows. ``key_fn``, ``topic_fn`` and a
callable ``value_format`` get those dicts; ``value_format="json"`` writes them as
compact JSON objects with timestamps, dates and times as ISO-8601 strings, decimals as
strings and binaries as base64 (:mod:`epochstream.connectors.batchform`).

``upsert_key=[...]`` writes a changelog as upsert records instead (Flink's
``upsert-kafka``): keyed by the JSON object of those columns, a ``-D`` a tombstone,
``-U`` dropped (:mod:`epochstream.connectors.kafka.upsert`), in the same transactions.

Example::

    ds.sink_to(es.sinks.KafkaSink(bootstrap_servers="127.0.0.1:9092", topic="out",
                                  transactional_id_prefix="sums-out"))
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from epochstream.connectors.base import Sink, SinkContext, SinkWriter
from epochstream.connectors.batchform import is_batch, json_rows, row_dicts
from epochstream.connectors.kafka.producer import KafkaPythonProducer, Producer, ProducerFactory
from epochstream.connectors.twophase import TwoPhaseCommitSinkWriter
from epochstream.exceptions import ConfigurationError, SinkError, short_repr

__all__ = [
    "DELIVERIES",
    "IdRange",
    "KafkaDeliveryWriter",
    "KafkaSink",
    "KafkaTransactionalWriter",
    "KafkaTxn",
    "PendingTxn",
    "RecordEncoder",
    "TransactionRecovery",
]

log = logging.getLogger(__name__)

DELIVERIES = ("exactly_once", "at_least_once", "none")
VALUE_FORMATS = ("json", "text", "bytes")
#: Kafka's default ``transaction.max.timeout.ms`` (15 min): the broker refuses a
#: producer asking for more, so the default stays within it.
DEFAULT_TRANSACTION_TIMEOUT_MS = 900_000
#: A restore probes at most this many ids of one subtask before giving up (each probe
#: is one InitProducerId): far more than the transactions one attempt leaves open.
MAX_PROBES = 10_000
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


class RecordEncoder:
    """Turns a record into ``(topic, key, value)`` bytes.

    ``value_format``: ``"json"`` (compact ``json.dumps``), ``"text"`` (``str``, UTF-8),
    ``"bytes"`` (bytes as they are), or a callable ``record -> bytes``. A key from
    ``key_fn`` is encoded the same way, except that ``str`` keys are UTF-8 text and
    ``bytes`` keys stay as they are, so a key's partition never depends on the process.

    Example::

        RecordEncoder("out", None, lambda r: r["k"], "json").encode({"k": "a", "n": 1})
        # ("out", b"a", b'{"k":"a","n":1}')
    """

    def __init__(
        self,
        topic: str | None,
        topic_fn: Callable[[Any], str] | None,
        key_fn: Callable[[Any], Any] | None,
        value_format: str | Callable[[Any], bytes],
    ) -> None:
        if (topic is None) == (topic_fn is None):
            raise ConfigurationError("KafkaSink needs exactly one of topic= and topic_fn=")
        if isinstance(value_format, str) and value_format not in VALUE_FORMATS:
            raise ConfigurationError(
                f"KafkaSink value_format must be one of {VALUE_FORMATS} or a callable, got {value_format!r}"
            )
        self.topic = topic
        self.topic_fn = topic_fn
        self.key_fn = key_fn
        self.value_format = value_format
        self._value = _encoder(value_format)

    def encode(self, record: Any) -> tuple[str, bytes | None, bytes | None]:
        """``(topic, key, value)``; SinkError(retryable=False) naming a record that does not fit."""
        topic, key = self._address(record)
        try:
            value = self._value(record)
        except Exception as exc:
            raise _unencodable(record, exc) from exc
        return topic, key, value

    def encode_batch(
        self, batch: Any
    ) -> list[tuple[str, bytes | None, bytes | None, dict[str, Any]]]:
        """``(topic, key, value, row)`` per row of a record batch: the row is the dict
        ``to_rows()`` gives; a JSON value is written from the batch's columns (module
        docstring), any other value format encodes the row as :meth:`encode` does.

        Example: ``encoder.encode_batch(pa.record_batch({"k": ["a"]}))[0][2] == b'{"k":"a"}'``
        """
        rows = row_dicts(batch)
        if self.value_format != "json":
            return [(*self.encode(row), row) for row in rows]
        try:
            # NaN and Infinity are not JSON: a consumer's parser would reject the record.
            values = json_rows(batch, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise SinkError(
                f"KafkaSink: cannot encode a batch of {batch.schema.names} as JSON: {exc}",
                retryable=False,
            ) from exc
        address = self._address
        return [
            (*address(row), value.encode(), row) for row, value in zip(rows, values, strict=True)
        ]

    def _address(self, record: Any) -> tuple[str, bytes | None]:
        """``(topic, key)`` of a record; SinkError(retryable=False) if they do not fit."""
        try:
            topic = self.topic if self.topic_fn is None else self.topic_fn(record)
            key = None if self.key_fn is None else _key_bytes(self.key_fn(record))
        except Exception as exc:
            raise _unencodable(record, exc) from exc
        if not isinstance(topic, str) or not topic:
            raise SinkError(
                f"KafkaSink: topic_fn gave {topic!r} for record {short_repr(record)}",
                retryable=False,
            )
        return topic, key


def _unencodable(record: Any, exc: Exception) -> SinkError:
    return SinkError(
        f"KafkaSink: cannot encode record {short_repr(record)}: {type(exc).__name__}: {exc}",
        retryable=False,
    )


def _encoder(value_format: str | Callable[[Any], bytes]) -> Callable[[Any], bytes]:
    if callable(value_format):
        return value_format
    if value_format == "json":
        # NaN and Infinity are not JSON: a consumer's parser would reject the record.
        return lambda r: json.dumps(r, separators=(",", ":"), allow_nan=False).encode()
    if value_format == "text":
        return lambda r: str(r).encode()
    return _as_bytes


def _as_bytes(record: Any) -> bytes:
    if not isinstance(record, bytes | bytearray):
        raise TypeError(f"value_format='bytes' needs bytes, got {type(record).__name__}")
    return bytes(record)


def _key_bytes(key: Any) -> bytes | None:
    if key is None or isinstance(key, bytes):
        return key
    if isinstance(key, str):
        return key.encode()
    # Sorted: equal dict keys built in another order must give the same bytes, hence
    # the same partition.
    return json.dumps(key, separators=(",", ":"), sort_keys=True).encode()


def producer_config(bootstrap_servers: str, properties: dict[str, Any]) -> dict[str, Any]:
    """kafka-python settings from the user's ``properties`` (Java-style dotted names or
    kafka-python's underscored ones) and ``bootstrap_servers``.

    Example: ``producer_config("h:9092", {"linger.ms": 5})`` -> ``{"linger_ms": 5, ...}``
    """
    config = {name.replace(".", "_"): value for name, value in properties.items()}
    if "transactional_id" in config:
        raise ConfigurationError(
            "KafkaSink sets transactional ids itself: use transactional_id_prefix="
        )
    return {**config, "bootstrap_servers": bootstrap_servers}


class KafkaSink(Sink):
    """Writes records to Kafka topics (module docstring).

    Guarantee: ``delivery="exactly_once"`` (needs checkpointing, and consumers reading
    with ``isolation.level=read_committed``), ``"at_least_once"`` or ``"none"``.
    Takes rows or Arrow record batches (one record per row; module docstring).

    Example::

        es.sinks.KafkaSink(bootstrap_servers="127.0.0.1:9092", topic="sums",
                           key_fn=lambda r: r["key"], transactional_id_prefix="sums-job-out")
        es.sinks.KafkaSink("127.0.0.1:9092", "counts", upsert_key=["word"],
                           transactional_id_prefix="counts-out")   # a changelog, compacted
    """

    accepts_batches = True

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str | None = None,
        *,
        topic_fn: Callable[[Any], str] | None = None,
        key_fn: Callable[[Any], Any] | None = None,
        value_format: str | Callable[[Any], bytes] = "json",
        delivery: str = "exactly_once",
        transactional_id_prefix: str | None = None,
        properties: dict[str, Any] | None = None,
        upsert_key: list[str] | None = None,
        value_except_key: bool = False,
    ) -> None:
        if not bootstrap_servers or not isinstance(bootstrap_servers, str):
            raise ConfigurationError(
                f"KafkaSink bootstrap_servers must be 'host:port,...', got {bootstrap_servers!r}"
            )
        if delivery not in DELIVERIES:
            raise ConfigurationError(
                f"KafkaSink delivery must be one of {DELIVERIES}, got {delivery!r}"
            )
        if transactional_id_prefix is not None and not isinstance(transactional_id_prefix, str):
            raise ConfigurationError(
                f"KafkaSink transactional_id_prefix must be a string, got {transactional_id_prefix!r}"
            )
        if delivery == "exactly_once" and not transactional_id_prefix:
            raise ConfigurationError(
                "KafkaSink delivery='exactly_once' needs transactional_id_prefix= naming the job "
                "and the sink (unique among all jobs writing to the cluster)"
            )
        self.encoder = RecordEncoder(topic, topic_fn, key_fn, value_format)
        if upsert_key is not None:
            if topic is None or key_fn is not None or value_format != "json":
                raise ConfigurationError(
                    "KafkaSink upsert_key= writes JSON keys and values to one topic: it takes "
                    "topic= and no key_fn=, topic_fn= or value_format="
                )
            # Imported here: the upsert encoder builds on this module's RecordEncoder.
            from epochstream.connectors.kafka.upsert import UpsertEncoder

            self.encoder = UpsertEncoder(topic, upsert_key, value_except_key=value_except_key)
        elif value_except_key:
            raise ConfigurationError("KafkaSink value_except_key= applies with upsert_key= only")
        self.bootstrap_servers = bootstrap_servers
        self.delivery = delivery
        self.transactional_id_prefix = _UNSAFE.sub("_", transactional_id_prefix or "")
        self.properties = dict(properties or {})
        self.config = producer_config(bootstrap_servers, self.properties)
        if delivery == "exactly_once":
            self.config.setdefault("transaction_timeout_ms", DEFAULT_TRANSACTION_TIMEOUT_MS)
        elif delivery == "at_least_once":
            self.config.setdefault("acks", "all")
            if str(self.config["acks"]) == "0":
                raise ConfigurationError(
                    "KafkaSink delivery='at_least_once' cannot use acks=0: the broker would "
                    "acknowledge nothing, so a flush could not know a record arrived"
                )
        self.transactional = delivery == "exactly_once"

    def exclusive_target(self) -> str | None:
        if self.delivery != "exactly_once":
            return None
        # Two sinks of one job with one prefix would abort each other's transactions.
        return f"Kafka transactional ids {self.transactional_id_prefix}-*"

    def producer_factory(self) -> ProducerFactory:
        """Makes this sink's producers (tests inject fakes into the writers instead)."""
        config = self.config
        return lambda transactional_id: KafkaPythonProducer(config, transactional_id)

    def create_writer(self, ctx: SinkContext) -> SinkWriter:
        if self.delivery == "exactly_once":
            return KafkaTransactionalWriter(self, ctx, self.producer_factory())
        return KafkaDeliveryWriter(self, self.producer_factory()(None))


class KafkaDeliveryWriter(SinkWriter):
    """``at_least_once`` (flush at every barrier) and ``none`` (flush at end of input).

    Nothing goes into checkpoints: records replayed after a restore are sent again.

    Example::

        w = KafkaDeliveryWriter(sink, producer); w.write_batch([{"n": 1}]); w.snapshot(1)
    """

    def __init__(self, sink: KafkaSink, producer: Producer) -> None:
        self._encoder = sink.encoder
        self._encode = sink.encoder.encode
        self._flush_at_barrier = sink.delivery == "at_least_once"
        self._producer = producer

    def restore(self, entries: list[Any]) -> None:
        """Nothing to recover: no entries are stored."""

    def write_batch(self, records: Any) -> None:
        send = self._producer.send
        if is_batch(records):
            for topic, key, value, row in self._encoder.encode_batch(records):
                send(topic, key, value, row)
            return
        encode = self._encode
        for record in records:
            topic, key, value = encode(record)
            send(topic, key, value, record)

    def snapshot(self, checkpoint_id: int) -> list[Any]:
        if self._flush_at_barrier:
            self._producer.flush()  # the checkpoint covers only acknowledged records
        else:
            self._producer.check()
        return []

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Nothing to commit: records were sent already."""

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        """Nothing to undo: sent records stay."""

    def end_input(self) -> None:
        self._producer.flush()

    def close(self) -> None:
        self._producer.close()


@dataclass(frozen=True)
class PendingTxn:
    """Checkpoint entry of a pre-committed transaction: enough to commit it anywhere.

    Example: ``PendingTxn("sums-out-3f2a9c1e-0-7", producer_id=12, epoch=0, subtask=0, seq=7)``
    """

    transactional_id: str
    producer_id: int
    epoch: int
    subtask: int
    seq: int


@dataclass(frozen=True)
class IdRange:
    """Checkpoint entry of a subtask's ids: ``<namespace>-<seq>`` for ``seq >=
    next_seq`` were not used when the checkpoint was taken.

    Example: ``IdRange(namespace="sums-out-3f2a9c1e-0", subtask=0, next_seq=8)``
    """

    namespace: str
    subtask: int
    next_seq: int


@dataclass
class KafkaTxn:
    """One transaction: its transactional id and producer; ids once pre-committed.

    Example: ``KafkaTxn("sums-out-3f2a9c1e-0-7", 7, producer)``
    """

    transactional_id: str
    seq: int
    producer: Producer
    producer_id: int = -1
    epoch: int = -1


class TransactionRecovery:
    """What a restore does with the restored checkpoint's entries, for one subtask.

    A subtask handles the entries of the old subtasks ``s`` with ``s % parallelism ==
    its index`` (after a rescale too, so every old subtask is handled by exactly one
    new one): it commits their :class:`PendingTxn` (oldest first), then probes each of
    their :class:`IdRange` and its own namespace, aborting lingering transactions.

    Example::

        next_seq = TransactionRecovery(factory, ctx, "sums-out-3f2a9c1e-0").run(entries)
    """

    def __init__(self, factory: ProducerFactory, ctx: SinkContext, own_namespace: str) -> None:
        self._factory = factory
        self._ctx = ctx
        self._own = own_namespace

    def _mine(self, subtask: int) -> bool:
        return subtask % self._ctx.parallelism == self._ctx.subtask_index

    def run(self, entries: list[Any]) -> int:
        """Commit, abort; return the ``seq`` the subtask's own transactions start at."""
        for entry in entries:
            if not isinstance(entry, PendingTxn | IdRange):
                raise SinkError(
                    f"KafkaSink: cannot recover checkpoint entry {entry!r}", retryable=False
                )
        pending = sorted(
            (e for e in entries if isinstance(e, PendingTxn) and self._mine(e.subtask)),
            key=lambda e: (e.subtask, e.seq),
        )
        for txn in pending:
            self.commit(txn)
        starts = {
            e.namespace: e.next_seq
            for e in entries
            if isinstance(e, IdRange) and self._mine(e.subtask)
        }
        starts.setdefault(self._own, 0)
        own_start = 0
        # Commits come first: probing aborts, and a recorded transaction must not be.
        for namespace, start in sorted(starts.items()):
            first_unused = self.abort_from(namespace, start)
            if namespace == self._own:
                own_start = first_unused
        return own_start

    def commit(self, txn: PendingTxn) -> None:
        """EndTxn(commit) for the recorded id, producer id and epoch (Flink's resumeTransaction)."""
        producer = self._factory(txn.transactional_id)
        try:
            producer.resume(txn.producer_id, txn.epoch)
            producer.commit()
        except SinkError as exc:
            raise SinkError(
                f"KafkaSink: cannot commit pre-committed transaction {txn.transactional_id} "
                f"(producer id {txn.producer_id}, epoch {txn.epoch}) of a completed checkpoint: "
                f"{exc}. If the broker aborted it (transaction.timeout.ms elapsed), its records are lost.",
                retryable=exc.suppress_restarts is False,
            ) from exc
        finally:
            producer.close()
        log.info("KafkaSink: committed %s from the restored checkpoint", txn.transactional_id)

    def abort_from(self, namespace: str, start: int) -> int:
        """Initialise ``<namespace>-<seq>`` for ``seq = start, start+1, ...`` (aborting
        what each holds open) until one was never used; return that ``seq``."""
        for seq in range(start, start + MAX_PROBES):
            producer = self._factory(f"{namespace}-{seq}")
            try:
                producer.init_transactions()
                _, epoch = producer.producer_id_and_epoch()
            finally:
                producer.close()
            if epoch == 0:  # a fresh id: no later one was used either (ids go in order)
                return seq
            log.info("KafkaSink: aborted lingering transactions of %s-%d", namespace, seq)
        raise SinkError(
            f"KafkaSink: {MAX_PROBES} transactional ids {namespace}-{start}... were all used before; "
            "use a new transactional_id_prefix",
            retryable=False,
        )


class KafkaTransactionalWriter(TwoPhaseCommitSinkWriter[KafkaTxn]):
    """A subtask's exactly-once writer: one Kafka transaction per checkpoint.

    Example::

        w = KafkaTransactionalWriter(sink, ctx, factory); w.restore([])
        w.write_batch(records); entries = w.snapshot(1)   # flushed: pre-committed
        w.notify_checkpoint_complete(1)                    # committed
    """

    def __init__(self, sink: KafkaSink, ctx: SinkContext, factory: ProducerFactory) -> None:
        super().__init__(ctx)
        self._encoder = sink.encoder
        self._encode = sink.encoder.encode
        self._factory = factory
        job8 = _UNSAFE.sub("_", ctx.job_id[:8])
        self._namespace = f"{sink.transactional_id_prefix}-{job8}-{ctx.subtask_index}"
        self._seq = 0

    @property
    def namespace(self) -> str:
        """``<prefix>-<job8>-<subtask>``: this subtask's transactional ids add ``-<seq>``."""
        return self._namespace

    def recover(self, entries: list[Any]) -> None:
        self._seq = TransactionRecovery(self._factory, self.ctx, self._namespace).run(entries)

    def snapshot(self, checkpoint_id: int) -> list[Any]:
        handles = super().snapshot(checkpoint_id)
        # Always recorded, even with nothing pending: a restore probes from here.
        return [*handles, IdRange(self._namespace, self.ctx.subtask_index, self._seq)]

    def begin_transaction(self) -> KafkaTxn:
        seq = self._seq
        transactional_id = f"{self._namespace}-{seq}"
        producer = self._factory(transactional_id)
        # Counted before it is used: a probe must abort it if anything below fails.
        self._seq = seq + 1
        try:
            producer.init_transactions()
            producer.begin()
        except BaseException:
            producer.close()
            raise
        return KafkaTxn(transactional_id, seq, producer)

    def write(self, txn: KafkaTxn, records: Any) -> None:
        send = txn.producer.send
        if is_batch(records):
            for topic, key, value, row in self._encoder.encode_batch(records):
                send(topic, key, value, row)
            return
        encode = self._encode
        for record in records:
            topic, key, value = encode(record)
            send(topic, key, value, record)

    def pre_commit(self, txn: KafkaTxn) -> None:
        txn.producer.flush()
        txn.producer_id, txn.epoch = txn.producer.producer_id_and_epoch()

    def commit(self, txn: KafkaTxn) -> None:
        try:
            txn.producer.commit()
        finally:
            txn.producer.close()

    def abort(self, txn: KafkaTxn) -> None:
        try:
            txn.producer.abort()
        finally:
            txn.producer.close()

    def txn_handle(self, txn: KafkaTxn) -> PendingTxn:
        return PendingTxn(
            txn.transactional_id, txn.producer_id, txn.epoch, self.ctx.subtask_index, txn.seq
        )

    def close(self) -> None:
        """Abort the open transaction; leave pre-committed ones for a restore to commit
        (closing their producers does not end them)."""
        pending = [t for ts in self._pending.values() for t in ts]
        try:
            super().close()
        finally:
            for t in pending:
                t.txn.producer.close()
