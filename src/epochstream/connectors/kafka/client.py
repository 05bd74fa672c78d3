"""The Kafka client behind the source: confluent-kafka (librdkafka), behind two small
interfaces so the enumerator and reader can be tested with fakes.

* :class:`Metadata` (job master): topics and their partition counts, the offsets a
  job starts from and the end offsets a bounded job stops at.
* :class:`Fetcher` (one per reader): assigned partitions, batches of messages, offset
  commits to the consumer group.

End offsets come from a fetch, not from ListOffsets: the probe assigns each partition
at (ListOffsets LATEST - 1) and reads until librdkafka reports partition EOF, whose
offset is the high watermark of the last fetch response. On Kafka both agree; on Tansu
0.6 ListOffsets LATEST answers the last batch's base offset + 1 (short of the end when
that batch holds several records), while the fetch response's high watermark is right.

Example::

    meta = ConfluentMetadata({"bootstrap.servers": "127.0.0.1:9092"})
    meta.partitions(["bids"])                 # {"bids": 4}
    meta.end_offsets([("bids", 0)])           # {("bids", 0): 1250}
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any, Protocol

from epochstream.exceptions import ConfigurationError, EpochstreamError

__all__ = [
    "SOURCE_OWNED",
    "BrokerWatch",
    "ConfluentFetcher",
    "ConfluentMetadata",
    "Fetcher",
    "KafkaClientError",
    "Message",
    "Metadata",
    "client_config",
]

#: Seconds a metadata or offset request may take before the job fails.
TIMEOUT = 30.0
#: Seconds a reader may go without reaching any broker before its task fails. Below
#: the checkpoint timeout (60 s by default), so the job fails naming Kafka, not
#: "checkpoint expired"; the restart strategy then decides.
UNREACHABLE_AFTER = 15.0
#: Seconds the check that a broker answers again may take (a metadata request).
_PROBE_TIMEOUT = 2.0
_PARTITION_EOF = -191  # confluent_kafka.KafkaError._PARTITION_EOF
_UNKNOWN_TOPIC = 3  # confluent_kafka.KafkaError.UNKNOWN_TOPIC_OR_PART
_TRANSPORT = -195  # confluent_kafka.KafkaError._TRANSPORT: a connection failed or broke
_ALL_BROKERS_DOWN = -187  # confluent_kafka.KafkaError._ALL_BROKERS_DOWN


class KafkaClientError(EpochstreamError):
    """The Kafka client failed (broker unreachable, unknown topic, a timeout).

    Example: ``raise KafkaClientError("end offsets of bids/0: timed out after 30 s")``
    """


class Message(Protocol):
    """What the reader uses of a consumed message (confluent_kafka.Message's methods).

    Example: ``msg.topic(), msg.partition(), msg.offset(), msg.value()``
    """

    def error(self) -> Any: ...
    def topic(self) -> str | None: ...
    def partition(self) -> int | None: ...
    def offset(self) -> int | None: ...
    def key(self) -> bytes | None: ...
    def value(self) -> bytes | None: ...
    def timestamp(self) -> tuple[int, int]: ...


class Metadata(Protocol):
    """The job master's view of the cluster.

    Example: ``meta.partitions(None)`` lists every topic's partition count.
    """

    def partitions(self, topics: list[str] | None) -> dict[str, int]:
        """Partition counts of ``topics`` (all topics when None); missing topics are left out."""
        ...

    def end_offsets(self, partitions: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """Each partition's end offset (the offset the next record will get)."""
        ...

    def start_offsets(self, partitions: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """Each partition's log start offset."""
        ...

    def offsets_for_time(
        self, partitions: list[tuple[str, int]], ms: int
    ) -> dict[tuple[str, int], int]:
        """Each partition's first offset with a timestamp >= ``ms`` (its end if none)."""
        ...

    def close(self) -> None: ...


class Fetcher(Protocol):
    """One reader's consumer.

    Example::

        fetcher.assign([("bids", 0, 42)])
        msgs = fetcher.fetch(1000, 0.05)
        fetcher.commit([("bids", 0, 43)])
    """

    def assign(self, positions: list[tuple[str, int, int]]) -> None:
        """Start fetching these partitions at these offsets (added to what is assigned)."""
        ...

    def unassign(self, partitions: list[tuple[str, int]]) -> None:
        """Stop fetching these partitions."""
        ...

    def fetch(self, max_messages: int, timeout: float) -> list[Any]:
        """Up to ``max_messages`` messages (``Message``), waiting at most ``timeout`` s."""
        ...

    def positions(self, partitions: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """Each partition's consume position: past the last message returned *and* past
        control records (transaction markers) the client skipped; -1001 if unknown."""
        ...

    def commit(self, offsets: list[tuple[str, int, int]]) -> None:
        """Store these next offsets as the consumer group's committed offsets."""
        ...

    def close(self) -> None: ...


#: librdkafka settings the source sets itself, and why a user's value cannot apply.
SOURCE_OWNED = {
    "bootstrap.servers": "pass bootstrap_servers=",
    "group.id": "pass group_id=",
    "enable.auto.commit": "offsets go to the group only when a checkpoint completes",
    "enable.auto.offset.store": "offsets go to the group only when a checkpoint completes",
    "auto.offset.reset": "where a partition starts comes from starting_offsets and checkpoints",
    "enable.partition.eof": "bounded reading relies on it",
}


def client_config(bootstrap_servers: str, properties: dict[str, Any]) -> dict[str, Any]:
    """librdkafka settings: the user's ``properties`` and ``bootstrap.servers``; a
    setting the source owns (:data:`SOURCE_OWNED`) is refused, never silently replaced.

    Example: ``client_config("h:9092", {"fetch.min.bytes": 1024})``
    """
    for name, why in SOURCE_OWNED.items():
        if name in properties:
            raise ConfigurationError(
                f"KafkaSource sets {name!r} itself ({why}); remove it from properties"
            )
    return {**properties, "bootstrap.servers": bootstrap_servers}


def _check(message: Any) -> None:
    error = message.error()
    if error is not None and error.code() != _PARTITION_EOF:
        raise KafkaClientError(
            f"Kafka {message.topic()}/{message.partition()}: {error.name()}: {error.str()}"
        )


class ConfluentMetadata:
    """:class:`Metadata` over confluent-kafka (a consumer that never joins its group).

    Example: ``ConfluentMetadata({"bootstrap.servers": "127.0.0.1:9092"}).partitions(["a"])``
    """

    def __init__(self, config: dict[str, Any], timeout: float = TIMEOUT) -> None:
        from confluent_kafka import Consumer

        self._config = config
        self._timeout = timeout
        # A throwaway group: this consumer only asks for metadata and offsets.
        self._consumer = Consumer(
            {
                **config,
                "group.id": f"epochstream-meta-{uuid.uuid4().hex}",
                "enable.auto.commit": False,
            }
        )

    def partitions(self, topics: list[str] | None) -> dict[str, int]:
        from confluent_kafka import KafkaException

        try:
            found = self._consumer.list_topics(timeout=self._timeout).topics
        except KafkaException as exc:
            raise KafkaClientError(f"Kafka metadata request failed: {exc}") from exc
        wanted = found.keys() if topics is None else [t for t in topics if t in found]
        counts = {}
        for t in wanted:
            error = found[t].error
            if error is not None and topics is not None and error.code() != _UNKNOWN_TOPIC:
                # A topic that exists but has no leader yet (just created, a broker
                # restarting): asking again later helps, so it is not "missing".
                raise KafkaClientError(f"Kafka metadata of topic {t!r}: {error.str()}")
            # Internal topics (__consumer_offsets, __transaction_state) only when named.
            if error is None and (topics is not None or not t.startswith("__")):
                counts[t] = len(found[t].partitions)
        return counts

    def start_offsets(self, partitions: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        from confluent_kafka import KafkaException, TopicPartition

        out = {}
        for topic, partition in partitions:
            try:
                low, _ = self._consumer.get_watermark_offsets(
                    TopicPartition(topic, partition), timeout=self._timeout
                )
            except KafkaException as exc:
                raise KafkaClientError(f"start offset of {topic}/{partition}: {exc}") from exc
            out[(topic, partition)] = low
        return out

    def end_offsets(self, partitions: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """The high watermarks of fetch responses (module docstring: not ListOffsets)."""
        from confluent_kafka import Consumer, KafkaException, TopicPartition

        if not partitions:
            return {}
        try:
            # A lower bound from ListOffsets (exact on Kafka); the fetch finds the end.
            listed = {
                tp: self._consumer.get_watermark_offsets(TopicPartition(*tp), timeout=self._timeout)
                for tp in partitions
            }
        except KafkaException as exc:
            raise KafkaClientError(f"Kafka ListOffsets failed: {exc}") from exc
        probe = Consumer(
            {
                **self._config,
                "group.id": f"epochstream-probe-{uuid.uuid4().hex}",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
            }
        )
        try:
            probe.assign(
                [TopicPartition(t, p, max(low, high - 1)) for (t, p), (low, high) in listed.items()]
            )
            ends: dict[tuple[str, int], int] = {}
            deadline = time.monotonic() + self._timeout
            while len(ends) < len(listed):
                if time.monotonic() > deadline:
                    missing = sorted(set(listed) - set(ends))
                    raise KafkaClientError(
                        f"end offsets of {missing}: no partition EOF within {self._timeout:.0f} s"
                    )
                for msg in probe.consume(10_000, 0.1):
                    _check(msg)
                    if msg.error() is not None:  # partition EOF: offset is the high watermark
                        ends[(str(msg.topic()), int(msg.partition() or 0))] = int(msg.offset() or 0)
            return ends
        except KafkaException as exc:
            raise KafkaClientError(f"end offsets: {exc}") from exc
        finally:
            probe.close()

    def offsets_for_time(
        self, partitions: list[tuple[str, int]], ms: int
    ) -> dict[tuple[str, int], int]:
        from confluent_kafka import KafkaException, TopicPartition

        if not partitions:
            return {}
        try:
            found = self._consumer.offsets_for_times(
                [TopicPartition(t, p, ms) for t, p in partitions], timeout=self._timeout
            )
        except KafkaException as exc:
            raise KafkaClientError(f"offsets for time {ms}: {exc}") from exc
        out = {}
        ends: dict[tuple[str, int], int] | None = None
        for tp in found:
            if tp.offset >= 0:
                out[(tp.topic, tp.partition)] = tp.offset
                continue
            if ends is None:  # no record that late: start at the end
                ends = self.end_offsets(partitions)
            out[(tp.topic, tp.partition)] = ends[(tp.topic, tp.partition)]
        return out

    def close(self) -> None:
        self._consumer.close()


class BrokerWatch:
    """Tells a reader when its brokers have been unreachable for ``limit`` seconds.

    librdkafka never fails a fetch because brokers are gone: it reconnects forever and
    reports the failed connections to ``error_cb`` only, so a reader would poll nothing
    until a checkpoint timed out. The watch starts its clock at the first connection
    error after messages last arrived; at ``limit`` the reader asks for metadata once
    (a connection error alone is not proof: idle connections are closed and reopened),
    and fails if that gets no answer either.

    Example::

        watch = BrokerWatch(15.0, clock=time.monotonic)
        watch.on_error(-187, "1/1 brokers are down")   # error_cb
        watch.overdue()      # True 15 s later, unless watch.reached() came first
    """

    def __init__(self, limit: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = limit
        self._clock = clock
        self._down_since: float | None = None
        self.last_error = ""

    def on_error(self, code: int, text: str) -> None:
        """A client error (``error_cb``); only connection failures start the clock."""
        if code not in (_TRANSPORT, _ALL_BROKERS_DOWN):
            return
        self.last_error = text
        if self._down_since is None:
            self._down_since = self._clock()

    def reached(self) -> None:
        """A broker answered (messages arrived, or metadata came back)."""
        self._down_since = None

    def overdue(self) -> bool:
        """Whether connections have failed, with no answer since, for ``limit`` seconds."""
        return self._down_since is not None and self._clock() - self._down_since >= self.limit

    def down_for(self) -> float:
        return 0.0 if self._down_since is None else self._clock() - self._down_since


class ConfluentFetcher:
    """:class:`Fetcher` over a confluent-kafka consumer with manual assignment.

    The group never decides what is read (no ``subscribe``): offsets are committed to
    it for monitoring only.

    Example: ``ConfluentFetcher(client_config("127.0.0.1:9092", {}), "my-job")``
    """

    def __init__(
        self, config: dict[str, Any], group_id: str, unreachable_after: float = UNREACHABLE_AFTER
    ) -> None:
        from confluent_kafka import Consumer

        self._bootstrap = config.get("bootstrap.servers")
        self._assigned: set[tuple[str, int]] = set()
        self._watch = BrokerWatch(unreachable_after)
        user_error_cb = config.get("error_cb")

        def on_error(error: Any) -> None:
            # Served inside consume() on the reader's thread (librdkafka's callbacks).
            self._watch.on_error(error.code(), error.str())
            if user_error_cb is not None:
                user_error_cb(error)

        self._consumer = Consumer(
            {
                **config,
                "error_cb": on_error,
                "group.id": group_id,
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "enable.partition.eof": False,
                # A position that is gone (retention deleted it) fails the job instead
                # of silently jumping to the log's start or end.
                "auto.offset.reset": "error",
            }
        )

    def assign(self, positions: list[tuple[str, int, int]]) -> None:
        from confluent_kafka import TopicPartition

        if positions:
            self._consumer.incremental_assign([TopicPartition(t, p, o) for t, p, o in positions])
            self._assigned.update((t, p) for t, p, _ in positions)

    def unassign(self, partitions: list[tuple[str, int]]) -> None:
        from confluent_kafka import TopicPartition

        if partitions:
            self._consumer.incremental_unassign([TopicPartition(t, p) for t, p in partitions])
            self._assigned.difference_update(partitions)

    def fetch(self, max_messages: int, timeout: float) -> list[Any]:
        # consume() waits for max_messages or the timeout: take what librdkafka has
        # prefetched at once, and wait only when it has nothing.
        messages = self._consumer.consume(max_messages, 0) or self._consumer.consume(
            max_messages, timeout
        )
        if messages:
            self._watch.reached()
        elif self._watch.overdue():
            self._check_reachable()
        for msg in messages:
            if msg.error() is not None:
                _check(msg)
                # Not an error (an EOF event): leave it out of the records.
                return [m for m in messages if m.error() is None]
        return messages

    def _check_reachable(self) -> None:
        """The brokers failed for the watch's limit: fail unless one answers now."""
        from confluent_kafka import KafkaException

        try:
            self._consumer.list_topics(timeout=_PROBE_TIMEOUT)
        except KafkaException as exc:
            raise KafkaClientError(
                f"Kafka broker unreachable: {self._bootstrap} did not answer for "
                f"{self._watch.down_for():.0f} s while reading "
                f"{', '.join(f'{t}/{p}' for t, p in sorted(self._assigned))} "
                f"(last error: {self._watch.last_error or exc})"
            ) from exc
        self._watch.reached()  # an idle topic on a broker that is there

    def positions(self, partitions: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        from confluent_kafka import KafkaException, TopicPartition

        try:
            found = self._consumer.position([TopicPartition(t, p) for t, p in partitions])
        except KafkaException as exc:
            raise KafkaClientError(f"consumer positions: {exc}") from exc
        return {(tp.topic, tp.partition): tp.offset for tp in found}

    def commit(self, offsets: list[tuple[str, int, int]]) -> None:
        from confluent_kafka import KafkaException, TopicPartition

        if not offsets:
            return
        if self._watch.down_for() > 0:
            # A synchronous commit waits ~45 s for a coordinator that is not there,
            # holding the task thread; the offsets are for monitoring only, and the
            # next checkpoint's commit carries them.
            raise KafkaClientError(
                "committing offsets to the consumer group: skipped while the broker is "
                f"unreachable ({self._watch.last_error})"
            )
        try:
            self._consumer.commit(
                offsets=[TopicPartition(t, p, o) for t, p, o in offsets], asynchronous=False
            )
        except KafkaException as exc:
            raise KafkaClientError(f"committing offsets to the consumer group: {exc}") from exc

    def close(self) -> None:
        self._consumer.close()
