"""The Kafka client behind the sink: kafka-python's producer, behind a small interface
(:class:`Producer`) so the writers can be tested with fakes.

Why kafka-python and not confluent-kafka (which the source uses): exactly-once needs
the producer id and epoch of a pre-committed transaction in the checkpoint, and a way
to commit that transaction from another process after a crash (Flink's
``FlinkKafkaInternalProducer.resumeTransaction``). librdkafka exposes neither;
kafka-python's transaction manager holds both and can be set to them
(:meth:`KafkaPythonProducer.resume`), after which ``commit_transaction`` sends
EndTxn(commit) for that transactional id, producer id and epoch.

Delivery errors are collected by an errback per record (the client's futures) and
raised by the next :meth:`Producer.flush` or :meth:`Producer.check` as a
:class:`~epochstream.exceptions.SinkError` naming topic and record; errors a retry
cannot fix (record too large, authorization) are ``retryable=False``.

Example::

    p = KafkaPythonProducer({"bootstrap_servers": "127.0.0.1:9092"}, "job-out-0-3")
    p.init_transactions(); p.begin()
    p.send("out", b"k", b"{}", record={"k": 1})
    p.flush(); pid, epoch = p.producer_id_and_epoch()
    p.commit()
"""

from __future__ import annotations

from typing import Any, Protocol

from epochstream.exceptions import SinkError, short_repr

__all__ = ["KafkaPythonProducer", "Producer", "ProducerFactory", "delivery_error"]

#: Seconds a flush, init, commit, abort or close may take before the task fails (also
#: the client's ``max_block_ms`` and ``bootstrap_timeout_ms`` unless set): below the
#: checkpoint timeout (60 s by default), so a broker that went away fails the task
#: naming the sink, not "checkpoint expired", and the restart strategy decides.
TIMEOUT = 15.0


class Producer(Protocol):
    """One producer; transactional when made with a transactional id.

    Example: ``p.send("out", None, b"1", record=1); p.flush()``
    """

    def send(self, topic: str, key: bytes | None, value: bytes | None, record: Any) -> None:
        """Queue one record (a None ``value`` is a tombstone); ``record`` names it in a
        delivery error."""
        ...

    def flush(self) -> None:
        """Block until every queued record is acknowledged; raise the first delivery error."""
        ...

    def check(self) -> None:
        """Raise the first delivery error seen so far, without waiting."""
        ...

    def init_transactions(self) -> None:
        """Fence older producers of this transactional id (aborting their open
        transaction) and get a producer id and epoch."""
        ...

    def resume(self, producer_id: int, epoch: int) -> None:
        """Take over the pre-committed transaction of ``producer_id``/``epoch``, so
        :meth:`commit` ends it (instead of :meth:`init_transactions`)."""
        ...

    def producer_id_and_epoch(self) -> tuple[int, int]: ...
    def begin(self) -> None: ...
    def commit(self) -> None: ...
    def abort(self) -> None: ...
    def close(self) -> None: ...


class ProducerFactory(Protocol):
    """Makes producers; ``transactional_id`` None makes a plain one.

    Example: ``factory("job-out-0-3")``
    """

    def __call__(self, transactional_id: str | None) -> Producer: ...


def delivery_error(topic: str, record: Any, exc: BaseException) -> SinkError:
    """The task's error for a record Kafka did not take; ``retryable=False`` for errors
    a restart cannot fix (kafka-python marks the others ``retriable``).

    Example: ``delivery_error("out", rec, MessageSizeTooLargeError())``
    """
    retryable = bool(getattr(exc, "retriable", False)) or isinstance(exc, (TimeoutError, OSError))
    return SinkError(
        f"KafkaSink: delivery of record {short_repr(record)} to topic {topic!r} failed: "
        f"{type(exc).__name__}: {exc}",
        retryable=retryable,
    )


class KafkaPythonProducer:
    """:class:`Producer` over ``kafka.KafkaProducer``.

    ``config`` holds kafka-python settings (``bootstrap_servers`` and the user's
    properties, with dots turned into underscores by :class:`KafkaSink`).

    Example: ``KafkaPythonProducer({"bootstrap_servers": "127.0.0.1:9092"}, None)``
    """

    def __init__(self, config: dict[str, Any], transactional_id: str | None) -> None:
        from kafka import KafkaProducer

        self.transactional_id = transactional_id
        self._bootstrap = config.get("bootstrap_servers")
        extra = {"transactional_id": transactional_id} if transactional_id is not None else {}
        # kafka-python blocks 60 s (metadata, buffer, init) and bootstraps for 30 s by
        # default: bounded by TIMEOUT unless the user's properties say otherwise.
        limits = {"max_block_ms": int(TIMEOUT * 1000), "bootstrap_timeout_ms": int(TIMEOUT * 1000)}
        try:
            self._producer = KafkaProducer(**{**limits, **config}, **extra)
        except Exception as exc:
            raise SinkError(
                f"KafkaSink: cannot create a producer ({transactional_id}): {exc}"
            ) from exc
        self._error: SinkError | None = None

    def send(self, topic: str, key: bytes | None, value: bytes | None, record: Any) -> None:
        if self._error is not None:
            raise self._error
        try:
            future = self._producer.send(topic, value=value, key=key)
        except Exception as exc:  # client-side checks: size, unknown topic, closed
            raise delivery_error(topic, record, exc) from exc
        future.add_errback(self._failed, topic, record)

    def _failed(self, topic: str, record: Any, exc: BaseException) -> None:
        # Runs in the client's sender thread: keep the first error for the task's thread.
        if self._error is None:
            self._error = delivery_error(topic, record, exc)
            self._error.__cause__ = exc

    def check(self) -> None:
        if self._error is not None:
            raise self._error

    def flush(self) -> None:
        try:
            self._producer.flush(timeout=TIMEOUT)
        except Exception as exc:
            raise SinkError(
                f"KafkaSink: flush ({self.transactional_id}) failed: {type(exc).__name__}: {exc} "
                f"(broker unreachable? no answer from {self._bootstrap} within {TIMEOUT:.0f} s)"
            ) from exc
        self.check()

    def init_transactions(self) -> None:
        self._call("init_transactions", self._producer.init_transactions)

    def resume(self, producer_id: int, epoch: int) -> None:
        from kafka.producer.transaction_manager import ProducerIdAndEpoch, TransactionState

        # The state walk init_transactions + begin_transaction would make, with the
        # recorded producer id and epoch instead of new ones (no InitProducerId: that
        # would abort the transaction we are to commit).
        tm = self._producer._transaction_manager
        tm._transition_to(TransactionState.INITIALIZING)
        tm.set_producer_id_and_epoch(ProducerIdAndEpoch(producer_id, epoch))
        tm._transition_to(TransactionState.READY)
        tm._transition_to(TransactionState.IN_TRANSACTION)
        tm._transaction_started = True

    def producer_id_and_epoch(self) -> tuple[int, int]:
        pe = self._producer._transaction_manager.producer_id_and_epoch
        return int(pe.producer_id), int(pe.epoch)

    def begin(self) -> None:
        self._call("begin_transaction", self._producer.begin_transaction)

    def commit(self) -> None:
        self._call("commit_transaction", lambda: self._end_transaction(commit=True))

    def abort(self) -> None:
        self._call("abort_transaction", lambda: self._end_transaction(commit=False))

    def _end_transaction(self, *, commit: bool) -> None:
        from kafka.errors import KafkaTimeoutError

        # KafkaProducer.commit_transaction/abort_transaction wait for EndTxn without a
        # timeout: a broker that went away would hold the task thread forever. The same
        # steps, with a bounded wait.
        tm = self._producer._transaction_manager
        result = tm.begin_commit() if commit else tm.begin_abort()
        self._producer._sender.wakeup()
        if not result.wait(timeout_ms=TIMEOUT * 1000):
            raise KafkaTimeoutError("EndTxn got no answer")

    def close(self) -> None:
        self._producer.close(timeout=TIMEOUT)

    def _call(self, what: str, fn: Any) -> None:
        from kafka.errors import AuthorizationError, KafkaError, KafkaTimeoutError

        try:
            fn()
        except KafkaError as exc:
            # A failed commit is retryable too: the restore commits the transaction
            # again from the checkpoint. Only a missing permission needs a person.
            retryable = not isinstance(exc, AuthorizationError)
            hint = (
                f" (broker unreachable? no answer from {self._bootstrap} within {TIMEOUT:.0f} s)"
                if isinstance(exc, KafkaTimeoutError)
                else ""
            )
            raise SinkError(
                f"KafkaSink: {what} of transactional id {self.transactional_id!r} failed: "
                f"{type(exc).__name__}: {exc}{hint}",
                retryable=retryable,
            ) from exc
