"""KafkaSource's client against a real Kafka-protocol broker (Tansu, tests/kafka_server.py),
without a job: end offsets (where Tansu's ListOffsets is short), starting offsets,
a reader restored from its snapshot, group offset commits, and the test broker's
kill/restart (with S3 storage, topics and offsets survive it)."""

from __future__ import annotations

import pickle
import time
from pathlib import Path
from typing import Any

import pytest

import epochstream as es
from epochstream.connectors.base import SourceContext
from epochstream.connectors.kafka import KafkaSource
from epochstream.connectors.kafka.client import ConfluentMetadata, client_config
from epochstream.core.clock import ManualClock
from kafka_server import start_on_s3, unique_topic

confluent_kafka = pytest.importorskip("confluent_kafka")


def _produce(broker: Any, topic: str, partition: int, values: list[bytes]) -> None:
    # linger: the values go out as one batch of several records (what Tansu's
    # ListOffsets gets wrong).
    broker.produce(topic, [(partition, v) for v in values], linger_ms=50)


def _read_all(source: KafkaSource, splits: list[Any]) -> list[Any]:
    reader = source.create_reader(SourceContext(0, 1, ManualClock()))
    try:
        reader.add_splits(splits)
        out: list[Any] = []
        deadline = time.monotonic() + 30
        while not reader.exhausted:
            assert time.monotonic() < deadline, f"not exhausted after 30 s ({len(out)} records)"
            out += reader.poll(1000)
        return out
    finally:
        reader.close()


def test_end_offsets_come_from_a_fetch_and_are_exact(kafka_server: Any) -> None:
    topic = kafka_server.new_topic(partitions=3)
    _produce(kafka_server, topic, 0, [b"%d" % i for i in range(25)])
    _produce(kafka_server, topic, 1, [b"x"])
    meta = ConfluentMetadata(client_config(kafka_server.bootstrap, {}))
    try:
        assert meta.partitions([topic, "no-such-topic"]) == {topic: 3}
        ends = meta.end_offsets([(topic, 0), (topic, 1), (topic, 2)])
        assert ends == {(topic, 0): 25, (topic, 1): 1, (topic, 2): 0}
        assert meta.start_offsets([(topic, 0)]) == {(topic, 0): 0}
    finally:
        meta.close()


def test_bounded_latest_reads_exactly_what_was_there_at_the_start(kafka_server: Any) -> None:
    topic = kafka_server.new_topic(partitions=2)
    for p in (0, 1):
        _produce(kafka_server, topic, p, [f"{p}-{i}".encode() for i in range(30)])
    source = KafkaSource(kafka_server.bootstrap, [topic], bounded="latest", value_format="text")
    splits = source.create_splits(1)
    _produce(kafka_server, topic, 0, [b"after the start"])
    assert sorted(_read_all(source, splits)) == sorted(
        f"{p}-{i}" for p in (0, 1) for i in range(30)
    )


def test_starting_offsets_latest_and_explicit(kafka_server: Any) -> None:
    topic = kafka_server.new_topic(partitions=1)
    _produce(kafka_server, topic, 0, [b"old-%d" % i for i in range(5)])
    latest = KafkaSource(
        kafka_server.bootstrap, [topic], starting_offsets="latest", value_format="text"
    )
    splits = latest.create_splits(1)
    assert [s.next_offset for s in splits] == [5]
    explicit = KafkaSource(
        kafka_server.bootstrap,
        [topic],
        starting_offsets={(topic, 0): 3},
        bounded="latest",
        value_format="text",
    )
    assert _read_all(explicit, explicit.create_splits(1)) == ["old-3", "old-4"]


def test_a_restored_reader_resumes_at_its_snapshot_and_commits_to_the_group(
    kafka_server: Any,
) -> None:
    topic, group = kafka_server.new_topic(partitions=2), unique_topic("g")
    for p in (0, 1):
        _produce(kafka_server, topic, p, [b"%d" % (p * 100 + i) for i in range(50)])
    source = KafkaSource(kafka_server.bootstrap, [topic], group_id=group, value_format="json")
    reader = source.create_reader(SourceContext(0, 1, ManualClock()))
    reader.add_splits(source.create_splits(1))
    seen: list[int] = []
    deadline = time.monotonic() + 30
    while len(seen) < 30:
        assert time.monotonic() < deadline
        seen += reader.poll(7)
    state = pickle.loads(pickle.dumps(reader.snapshot(1)))
    reader.notify_checkpoint_complete(1)
    reader.close()

    committed = kafka_server.committed_offsets(group, topic, 2)
    # A partition not read yet (still at EARLIEST) has nothing to commit (-1001: none).
    assert committed == [s.next_offset if s.next_offset >= 0 else -1001 for s in state]
    assert any(s.next_offset > 0 for s in state)

    resumed = source.create_reader(SourceContext(0, 1, ManualClock()))
    resumed.add_splits(state)
    try:
        while len(seen) < 100:
            assert time.monotonic() < deadline + 30
            seen += resumed.poll(1000)
    finally:
        resumed.close()
    assert sorted(seen) == [p * 100 + i for p in (0, 1) for i in range(50)], (
        "nothing twice, nothing lost"
    )


def test_the_test_broker_restarts_on_its_port_and_s3_storage_keeps_topics(
    tmp_path: Path, s3_server: Any
) -> None:
    broker = start_on_s3(s3_server)
    try:
        topic = broker.new_topic(partitions=1)
        _produce(broker, topic, 0, [b"1", b"2", b"3"])
        port = broker.port
        broker.restart()
        assert broker.port == port
        source = KafkaSource(broker.bootstrap, [topic], bounded="latest", value_format="json")
        assert _read_all(source, source.create_splits(1)) == [1, 2, 3]
    finally:
        broker.stop()


def test_a_bounded_read_of_a_transactional_topic_ends_past_its_commit_marker(
    kafka_server: Any,
) -> None:
    topic = kafka_server.new_topic(partitions=1)
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": kafka_server.bootstrap, "transactional.id": f"tx-{topic}"}
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(5):
        producer.produce(topic, value=b"%d" % i, partition=0)
    producer.commit_transaction(30)
    source = KafkaSource(kafka_server.bootstrap, [topic], bounded="latest", value_format="json")
    splits = source.create_splits(1)
    assert [s.stop_offset for s in splits] == [6], "the end counts the commit marker"
    assert _read_all(source, splits) == [0, 1, 2, 3, 4]


def test_a_job_reading_a_topic_that_does_not_exist_fails_at_once_naming_it(
    kafka_server: Any,
) -> None:
    missing = unique_topic("typo")
    env = es.Environment(parallelism=1, runner="local")
    env.set_restart_strategy(es.restart.fixed_delay(attempts=3, delay=0.1))
    source = KafkaSource(kafka_server.bootstrap, [missing], bounded="latest")
    env.from_source(source).sink_to(es.sinks.DiscardSink())
    with pytest.raises(es.ConfigurationError, match=rf"\['{missing}'\] do not exist"):
        env.execute("kafka-missing-topic")
