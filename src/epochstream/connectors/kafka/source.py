"""``KafkaSource``: Kafka topics as a split-based, re-settable source.

Each topic partition is a split (:mod:`.splits`); the job master's enumerator
(:mod:`.enumerator`) lists and discovers partitions; readers (:mod:`.reader`) fetch
their partitions through confluent-kafka (:mod:`.client`) and decode per fetch
(:mod:`.decoding`).

Guarantee: exactly-once: each partition's next offset is its position in every
checkpoint, and the enumerator's known partitions are checkpointed with it. The
consumer group (``group_id``) only receives the offsets of completed checkpoints, for
monitoring (lag); it never decides where the job reads.

Example::

    src = es.sources.KafkaSource(bootstrap_servers="127.0.0.1:9092", topics=["bids"],
                                 group_id="my-job", value_format="json")
    stream = env.from_source(src, watermark_strategy=es.WatermarkStrategy
                             .bounded_out_of_orderness(2000).with_idleness(10_000))
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from typing import Any

from epochstream.connectors.base import Source, SourceContext, SourceReader
from epochstream.connectors.enumerators import SplitEnumerator
from epochstream.connectors.kafka.client import (
    ConfluentFetcher,
    ConfluentMetadata,
    Fetcher,
    Metadata,
    client_config,
)
from epochstream.connectors.kafka.decoding import ColumnarDecoder, RowDecoder, value_decoder
from epochstream.connectors.kafka.enumerator import KafkaPartitionEnumerator
from epochstream.connectors.kafka.reader import KafkaPartitionReader
from epochstream.connectors.kafka.splits import StartAtTimestamp
from epochstream.exceptions import ConfigurationError

__all__ = ["KafkaSource", "StartAtTimestamp", "timestamp"]

#: Seconds a discovery's metadata request may block the job master's event loop.
_DISCOVERY_TIMEOUT = 5.0


def timestamp(ms: int) -> StartAtTimestamp:
    """Start each partition at its first record with a timestamp >= ``ms`` (epoch ms).

    Example: ``KafkaSource(..., starting_offsets=es.sources.kafka.timestamp(1_700_000_000_000))``
    """
    if not isinstance(ms, int) or isinstance(ms, bool) or ms < 0:
        raise ConfigurationError(f"kafka.timestamp needs int epoch milliseconds >= 0, got {ms!r}")
    return StartAtTimestamp(ms)


StartingOffsets = str | dict[tuple[str, int], int] | StartAtTimestamp


class KafkaSource(Source):
    """Records of Kafka topics (module docstring for the guarantee).

    ``topics`` or ``topic_pattern`` (a regular expression a whole topic name matches;
    matching topics that appear later are read too). ``starting_offsets``:
    ``"earliest"``, ``"latest"``, ``{(topic, partition): offset}`` (other partitions
    from their start) or :func:`timestamp`. ``bounded="latest"``: stop at the end
    offsets seen when the job starts. ``value_format``: ``"bytes"``, ``"text"``,
    ``"json"`` or a function of the value bytes; a record is the decoded value.
    ``columnar=True``: Arrow batches (``schema`` declares the JSON columns; see
    :class:`~epochstream.connectors.kafka.decoding.ColumnarDecoder`). Event time is the
    record timestamp unless the watermark strategy has an assigner (it gets the record
    and the Kafka timestamp); columnar jobs name the column
    (``.with_timestamp_column("timestamp")``). ``properties`` go to librdkafka.
    ``discovery_interval``: seconds between looks for new partitions and topics.

    Example::

        KafkaSource(bootstrap_servers="127.0.0.1:9092", topic_pattern=r"bids-.*",
                    group_id="bids-job", starting_offsets="earliest", value_format="json")
    """

    replayable = True

    def __init__(
        self,
        bootstrap_servers: str,
        topics: list[str] | None = None,
        *,
        topic_pattern: str | None = None,
        group_id: str | None = None,
        starting_offsets: StartingOffsets = "earliest",
        bounded: str | None = None,
        value_format: str | Callable[[bytes | None], Any] = "bytes",
        columnar: bool = False,
        schema: Any = None,
        properties: dict[str, Any] | None = None,
        discovery_interval: float = 5.0,
    ) -> None:
        if not bootstrap_servers or not isinstance(bootstrap_servers, str):
            raise ConfigurationError(
                f"KafkaSource bootstrap_servers must be 'host:port,...', got {bootstrap_servers!r}"
            )
        if (topics is None) == (topic_pattern is None):
            raise ConfigurationError(
                "KafkaSource needs exactly one of topics=[...] or topic_pattern=..."
            )
        if topics is not None and (isinstance(topics, str) or not topics or not all(topics)):
            raise ConfigurationError(
                f"KafkaSource topics must be a non-empty list of names, got {topics!r}"
            )
        if topic_pattern is not None:
            try:
                re.compile(topic_pattern)
            except re.error as exc:
                raise ConfigurationError(
                    f"KafkaSource topic_pattern {topic_pattern!r}: {exc}"
                ) from exc
        if bounded not in (None, "latest"):
            raise ConfigurationError(
                f"KafkaSource bounded must be None or 'latest', got {bounded!r}"
            )
        _check_starting_offsets(starting_offsets)
        if isinstance(starting_offsets, dict) and topics is not None:
            strangers = sorted({t for t, _ in starting_offsets} - set(topics))
            if strangers:
                raise ConfigurationError(
                    f"KafkaSource starting_offsets names topic(s) {strangers} that are not in "
                    f"topics={topics!r}"
                )
        if discovery_interval <= 0:
            raise ConfigurationError(
                f"KafkaSource discovery_interval must be > 0, got {discovery_interval}"
            )
        self.bootstrap_servers = bootstrap_servers
        self.topics = list(topics) if topics is not None else []
        self.topic_pattern = topic_pattern
        self.group_id = group_id
        self.starting_offsets = starting_offsets
        self.bounded = bounded is not None
        self.value_format = value_format
        self.columnar = columnar
        self.properties = dict(properties or {})
        client_config(bootstrap_servers, self.properties)  # refuses settings the source owns
        if schema is not None and not columnar:
            raise ConfigurationError(
                "KafkaSource schema= declares the columns of columnar=True batches; row mode "
                "decodes each value with value_format (a callable can build typed records)"
            )
        self.discovery_interval = float(discovery_interval)
        # Fail at build time, in the driver, not in every slot.
        if columnar:
            if not isinstance(value_format, str):
                raise ConfigurationError(
                    "KafkaSource(columnar=True) needs value_format 'bytes', 'text' or 'json'"
                )
            self.schema = ColumnarDecoder(value_format, schema).schema
            self._value_schema = schema
        else:
            value_decoder(value_format)
            self.schema = None
            self._value_schema = None

    def _config(self) -> dict[str, Any]:
        return client_config(self.bootstrap_servers, self.properties)

    def metadata(self, timeout: float = 30.0) -> Metadata:
        """A client for topics and offsets (the enumerator's); requests fail after ``timeout`` s."""
        return ConfluentMetadata(self._config(), timeout)

    def fetcher(self, subtask_index: int) -> Fetcher:
        """A reader's consumer; it commits to ``group_id`` (without one, it commits nothing:
        librdkafka still wants a group id, so it gets an unused random one)."""
        group = self.group_id or f"epochstream-unused-{uuid.uuid4().hex}"
        return ConfluentFetcher(self._config(), group)

    def create_splits(self, parallelism: int) -> list[Any]:
        """The splits at a fresh start (what the enumerator's ``initial_splits`` gives)."""
        return self.create_enumerator(parallelism, None).initial_splits()

    def create_enumerator(self, parallelism: int, restored: Any) -> SplitEnumerator:
        return KafkaPartitionEnumerator(
            self, parallelism, restored, self.metadata, lambda: self.metadata(_DISCOVERY_TIMEOUT)
        )

    def create_reader(self, ctx: SourceContext) -> SourceReader:
        """A reader of pushed partitions; undecodable values go to ``ctx.dead_letter`` if set."""
        decoder: Any
        if self.columnar:
            assert isinstance(self.value_format, str)
            decoder = ColumnarDecoder(self.value_format, self._value_schema)
        else:
            decoder = RowDecoder(self.value_format)
        return KafkaPartitionReader(
            decoder,
            lambda: self.fetcher(ctx.subtask_index),
            ctx.dead_letter,
            bounded=self.bounded,
            columnar=self.columnar,
            commit_offsets=self.group_id is not None,
        )


def _check_starting_offsets(spec: Any) -> None:
    if spec in ("earliest", "latest") or isinstance(spec, StartAtTimestamp):
        return
    if isinstance(spec, dict) and all(
        isinstance(k, tuple)
        and len(k) == 2
        and isinstance(k[0], str)
        and isinstance(k[1], int)
        and k[1] >= 0
        and isinstance(v, int)
        and v >= 0
        for k, v in spec.items()
    ):
        return
    raise ConfigurationError(
        "KafkaSource starting_offsets must be 'earliest', 'latest', {(topic, partition): offset} "
        f"or kafka.timestamp(ms), got {spec!r}"
    )
