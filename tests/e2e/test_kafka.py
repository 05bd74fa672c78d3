"""KafkaSource end to end on Spark against a real Kafka-protocol broker (Tansu,
tests/kafka_server.py): event-time windows through a SIGKILL against a batch oracle
over the topic's records, offsets committed to the consumer group, bad JSON failing
with its place or dead-lettered, a savepoint rescale 2 -> 3, a topic appearing under
a pattern while the job runs, and a columnar keyed sum through a SIGKILL.

Every test uses its own topics, so the session's broker needs no cleanup between tests.
"""

from __future__ import annotations

import collections
import json
import time
from pathlib import Path
from typing import Any

import pytest
from e2e_support import Throttle, exactly_once_problems, run_with_slot_killed

import epochstream as es
from kafka_server import unique_topic

pytest.importorskip("confluent_kafka")

pytestmark = [pytest.mark.slow, pytest.mark.spark]

BASE = 1_700_000_000_000
WORDS = ["alpha", "beta", "gamma", "delta", "epsilon"]
WINDOW = 5_000
BOUND = 2_000
WAIT = 50.0  # seconds any wait for output may take


def _read_topic(bootstrap: str, topic: str, partitions: int, count: int) -> list[tuple[bytes, int]]:
    """Every message of ``topic`` (``count`` of them) as ``(value, timestamp)``: the oracle's input."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": unique_topic("oracle"),
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        out: list[tuple[bytes, int]] = []
        deadline = time.monotonic() + WAIT
        while len(out) < count:
            assert time.monotonic() < deadline, f"read {len(out)} of {count} messages back"
            for msg in consumer.consume(10_000, 0.2):
                assert msg.error() is None, msg.error()
                out.append((msg.value(), msg.timestamp()[1]))
        return out
    finally:
        consumer.close()


def _env(spark: Any, parallelism: int, ckpt: Path) -> es.Environment:
    env = es.Environment(parallelism=parallelism, spark=spark)
    env.enable_checkpointing(0.3, storage=str(ckpt))
    env.set_restart_strategy(es.restart.fixed_delay(attempts=3, delay=0.2))
    return env


class Count(es.AggregateFunction):
    def create_accumulator(self) -> int:
        return 0

    def add(self, value: Any, accumulator: int) -> int:
        return accumulator + 1

    def get_result(self, accumulator: int) -> int:
        return accumulator

    def merge(self, a: int, b: int) -> int:
        return a + b


class WindowCount(es.ProcessWindowFunction):
    """(window start, word, count) per window."""

    def process(self, key: Any, ctx: Any, elements: Any, out: Any) -> None:
        for count in elements:
            out.collect([ctx.window.start, key, count])


def _timestamped_events(n: int, partitions: int) -> list[tuple[int, bytes, int]]:
    """Event ``i`` on partition ``i % partitions``, its Kafka timestamp up to 1.9 s out
    of order (within the 2 s bound)."""
    events = []
    for i in range(n):
        ts = BASE + i * 10 - (i * 7_919) % 1_900
        word = WORDS[(i * 31 + i // 7) % len(WORDS)]
        events.append((i % partitions, json.dumps({"w": word, "i": i}).encode(), ts))
    return events


def test_event_time_windows_over_four_partitions_survive_a_sigkill(
    spark: Any, tmp_path: Path, kafka_server: Any
) -> None:
    topic, group, n = kafka_server.new_topic("events", 4), unique_topic("group"), 20_000
    kafka_server.produce(topic, _timestamped_events(n, 4))
    out = tmp_path / "out"
    env = _env(spark, 2, tmp_path / "ckpt")
    source = es.sources.KafkaSource(
        bootstrap_servers=kafka_server.bootstrap,
        topics=[topic],
        group_id=group,
        bounded="latest",
        value_format="json",
    )
    # No timestamp assigner: event time is each message's Kafka timestamp.
    strategy = es.WatermarkStrategy.bounded_out_of_orderness(BOUND)
    (
        env.from_source(source, watermark_strategy=strategy)
        .uid("kafka")
        .map(Throttle(2_500))  # ~4 s per subtask: the kill lands mid-run
        .uid("throttle")
        .key_by(lambda e: e["w"])
        .window(es.TumblingEventTimeWindows.of(WINDOW))
        .aggregate(Count(), WindowCount())
        .uid("window-counts")
        .sink_to(es.sinks.FileSink(str(out)))
        .uid("files")
    )
    result = run_with_slot_killed(env, "kafka-windows-crash")
    assert result.restarts >= 1

    oracle: collections.Counter[tuple[int, str]] = collections.Counter()
    for value, ts in _read_topic(kafka_server.bootstrap, topic, 4, n):
        oracle[(ts - ts % WINDOW, json.loads(value)["w"])] += 1
    got = collections.Counter(tuple(r) for r in es.testing.read_committed(out))
    assert got == collections.Counter((start, w, c) for (start, w), c in oracle.items())
    # The final checkpoint's offsets reached the consumer group (monitoring sees no lag).
    assert kafka_server.committed_offsets(group, topic, 4) == [n // 4] * 4


def test_bad_json_fails_the_job_naming_topic_partition_and_offset(
    spark: Any, tmp_path: Path, kafka_server: Any
) -> None:
    topic = kafka_server.new_topic("bad", partitions=2)
    good = [(p, json.dumps({"i": i}).encode(), BASE + i) for i in range(10) for p in (0, 1)]
    kafka_server.produce(topic, [*good, (1, b'{"i": oops', BASE)])
    env = _env(spark, 2, tmp_path / "ckpt")
    source = es.sources.KafkaSource(
        kafka_server.bootstrap, [topic], bounded="latest", value_format="json"
    )
    env.from_source(source).sink_to(es.sinks.FileSink(str(tmp_path / "out")))
    with pytest.raises(es.JobExecutionError) as err:
        env.execute("kafka-bad-json")
    assert err.value.restarts == 0, f"a decode error was retried: {err.value.history}"
    assert "SourceDecodeError" in err.value.cause, err.value.cause
    assert f"{topic}/1 at offset 10 as json" in err.value.cause, err.value.cause


def test_bad_json_goes_to_the_dead_letter_output(
    spark: Any, tmp_path: Path, kafka_server: Any
) -> None:
    topic = kafka_server.new_topic("dlq", partitions=2)
    good = [(i % 2, json.dumps({"i": i}).encode(), BASE + i) for i in range(40)]
    kafka_server.produce(topic, [*good, (0, b"not json", BASE), (1, b"\xff", BASE)])
    env = _env(spark, 2, tmp_path / "ckpt")
    source = es.sources.KafkaSource(
        kafka_server.bootstrap, [topic], bounded="latest", value_format="json"
    )
    records = env.from_source(source)
    records.map(lambda r: r["i"]).sink_to(es.sinks.FileSink(str(tmp_path / "out")))
    records.get_side_output(es.DEAD_LETTERS).map(
        lambda d: [d["topic"], d["partition"], d["offset"], d["value"].decode("latin-1")]
    ).sink_to(es.sinks.FileSink(str(tmp_path / "dead")))
    env.execute("kafka-dead-letter")
    assert sorted(es.testing.read_committed(tmp_path / "out")) == list(range(40))
    assert sorted(es.testing.read_committed(tmp_path / "dead")) == [
        [topic, 0, 20, "not json"],
        [topic, 1, 20, "\xff"],
    ]


def _counts_job(env: es.Environment, source: es.sources.KafkaSource, out: Path) -> None:
    (
        env.from_source(source)
        .uid("kafka")
        .map(lambda r: (r["k"], 1))
        .uid("ones")
        .key_by(lambda t: t[0])
        .reduce(lambda a, b: (a[0], a[1] + b[1]))
        .uid("counts")
        .map(list)
        .uid("rows")
        .sink_to(es.sinks.FileSink(str(out)))
        .uid("files")
    )


def _keyed(
    start: int, count: int, partitions: int, expected: collections.Counter[str]
) -> list[tuple[int, bytes, int]]:
    messages = []
    for i in range(start, start + count):
        key = f"k{i * 7 % 9}"
        expected[key] += 1
        messages.append((i % partitions, json.dumps({"k": key, "i": i}).encode(), BASE + i))
    return messages


def _wait_for_counts(out: Path, expected: collections.Counter[str]) -> None:
    deadline = time.monotonic() + WAIT
    while True:
        rows = es.testing.read_committed(out) if out.exists() else []
        finals: dict[str, int] = {}
        for key, value in rows:
            finals[key] = max(finals.get(key, 0), value)
        if finals == dict(expected):
            return
        assert time.monotonic() < deadline, f"final counts {finals}, expected {dict(expected)}"
        time.sleep(0.2)


def test_savepoint_at_parallelism_2_resumes_at_3_with_partitions_redistributed(
    spark: Any, tmp_path: Path, kafka_server: Any
) -> None:
    topic, out, sp = kafka_server.new_topic("rescale", 5), tmp_path / "out", tmp_path / "sp"
    expected: collections.Counter[str] = collections.Counter()
    kafka_server.produce(topic, _keyed(0, 3_000, 5, expected))
    source = es.sources.KafkaSource(kafka_server.bootstrap, [topic], value_format="json")

    first = _env(spark, 2, tmp_path / "ckpt")
    _counts_job(first, source, out)
    client = first.execute_async("kafka-p2")
    try:
        _wait_for_counts(out, expected)
        savepoint = client.cancel(savepoint=str(sp))
    finally:
        if not client.done:
            client.cancel()

    kafka_server.produce(topic, _keyed(3_000, 2_000, 5, expected))
    second = _env(spark, 3, tmp_path / "ckpt")
    _counts_job(second, source, out)
    client = second.execute_async("kafka-p3", from_savepoint=savepoint)
    try:
        _wait_for_counts(out, expected)
        kafka_server.produce(topic, _keyed(5_000, 500, 5, expected))
        _wait_for_counts(out, expected)
        client.cancel(savepoint=str(sp))
    finally:
        if not client.done:
            client.cancel()
    assert exactly_once_problems(es.testing.read_committed(out), expected) == []


def test_a_topic_matching_the_pattern_is_discovered_while_the_job_runs(
    spark: Any, tmp_path: Path, kafka_server: Any
) -> None:
    prefix = unique_topic("pat")
    first_topic, later_topic, out = f"{prefix}-a", f"{prefix}-b", tmp_path / "out"
    kafka_server.create_topic(first_topic, partitions=2)
    kafka_server.create_topic(f"x{prefix}-c", partitions=1)  # a whole-name match only
    expected: collections.Counter[str] = collections.Counter()
    kafka_server.produce(first_topic, _keyed(0, 500, 2, expected))
    kafka_server.produce(f"x{prefix}-c", _keyed(0, 50, 1, collections.Counter()))
    source = es.sources.KafkaSource(
        kafka_server.bootstrap,
        topic_pattern=rf"{prefix}-.*",
        value_format="json",
        discovery_interval=0.3,
    )
    env = _env(spark, 2, tmp_path / "ckpt")
    _counts_job(env, source, out)
    client = env.execute_async("kafka-pattern")
    try:
        _wait_for_counts(out, expected)
        kafka_server.create_topic(later_topic, partitions=3)
        kafka_server.produce(later_topic, _keyed(500, 600, 3, expected))
        _wait_for_counts(out, expected)
    finally:
        client.cancel()
    assert exactly_once_problems(es.testing.read_committed(out), expected) == []


def _slow_batches(batch: Any) -> Any:
    # 10k rows/s per subtask whatever the batch sizes (~3 s each): the job runs past two
    # checkpoints, so the kill lands mid-run.
    time.sleep(batch.num_rows / 10_000)
    return batch


def test_columnar_json_keyed_sum_survives_a_sigkill(
    spark: Any, tmp_path: Path, kafka_server: Any
) -> None:
    import pyarrow as pa

    topic, out, n, keys = kafka_server.new_topic("columnar", 4), tmp_path / "out", 60_000, 50
    kafka_server.produce(
        topic,
        [
            (i % 4, json.dumps({"user": f"u{i % keys}", "amount": i % 97 + 1}).encode(), BASE + i)
            for i in range(n)
        ],
    )
    source = es.sources.KafkaSource(
        kafka_server.bootstrap,
        [topic],
        bounded="latest",
        value_format="json",
        columnar=True,
        schema=pa.schema([("user", pa.string()), ("amount", pa.int64())]),
    )
    env = _env(spark, 2, tmp_path / "ckpt")
    (
        env.from_source(source)
        .uid("kafka")
        .map_batches(_slow_batches)
        .uid("slow")
        .key_by("user")
        .sum("amount")
        .uid("sums")
        .to_rows()
        .sink_to(es.sinks.FileSink(str(out)))
        .uid("files")
    )
    result = run_with_slot_killed(env, "kafka-columnar-crash")
    assert result.restarts >= 1
    expected: dict[str, int] = collections.defaultdict(int)
    for i in range(n):
        expected[f"u{i % keys}"] += i % 97 + 1
    sums: dict[str, list[int]] = collections.defaultdict(list)
    for row in es.testing.read_committed(out):
        sums[row["user"]].append(row["amount"])
    assert {u: len(set(s)) == len(s) for u, s in sums.items()} == dict.fromkeys(expected, True), (
        "a running sum was committed twice"
    )
    assert {u: max(s) for u, s in sums.items()} == expected


def test_an_idle_partition_does_not_hold_back_event_time(
    spark: Any, tmp_path: Path, kafka_server: Any
) -> None:
    topic, out = kafka_server.new_topic("idle", partitions=3), tmp_path / "out"
    # Partitions 0 and 1 have events over three windows; partition 2 stays empty.
    events = [(i % 2, json.dumps({"w": "a"}).encode(), BASE + i * 100) for i in range(150)]
    kafka_server.produce(topic, events)
    source = es.sources.KafkaSource(kafka_server.bootstrap, [topic], value_format="json")
    # Idleness well above the time to the first fetch of every partition: a partition
    # idle before its first records would let the watermark pass them (they would be late).
    strategy = es.WatermarkStrategy.bounded_out_of_orderness(0).with_idleness(5_000)
    env = _env(spark, 1, tmp_path / "ckpt")
    (
        env.from_source(source, watermark_strategy=strategy)
        .key_by(lambda e: e["w"])
        .window(es.TumblingEventTimeWindows.of(WINDOW))
        .aggregate(Count(), WindowCount())
        .sink_to(es.sinks.FileSink(str(out)))
    )
    client = env.execute_async("kafka-idle-partition")
    try:
        # The unbounded job never ends: the first two windows fire only if the empty
        # partition stops holding the watermark back (the last window stays open).
        sizes = _window_sizes(events)[:2]
        expected = [[BASE - BASE % WINDOW + k * WINDOW, "a", n] for k, n in enumerate(sizes)]
        deadline = time.monotonic() + WAIT
        while sorted(es.testing.read_committed(out) if out.exists() else []) != expected:
            assert time.monotonic() < deadline, "the empty partition held the watermark back"
            time.sleep(0.2)
    finally:
        client.cancel()


def _window_sizes(events: list[tuple[int, bytes, int]]) -> list[int]:
    counts = collections.Counter(ts - ts % WINDOW for _, _, ts in events)
    return [counts[start] for start in sorted(counts)]
