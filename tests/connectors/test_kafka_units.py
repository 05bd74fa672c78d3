"""KafkaSource's parts with injected fakes (no broker): split state, enumerator,
reader, decoding, and event time per partition through the source operator's
watermark machinery."""

from __future__ import annotations

import json
import pickle
from typing import Any

import pytest

import epochstream as es
from epochstream.connectors.kafka import EARLIEST, KafkaPartitionSplit, KafkaSource, timestamp
from epochstream.connectors.kafka.decoding import ColumnarDecoder, RowDecoder
from epochstream.connectors.kafka.enumerator import KafkaPartitionEnumerator, at_once
from epochstream.connectors.kafka.reader import KafkaPartitionReader
from epochstream.exceptions import ConfigurationError, SourceDecodeError
from epochstream.runtime.watermarks import TimestampsAndWatermarks


class FakeMessage:
    """confluent_kafka.Message's accessors over plain values."""

    def __init__(
        self, topic: str, partition: int, offset: int, value: bytes | None, ts: int = 0
    ) -> None:
        self._t, self._p, self._o, self._v, self._ts = topic, partition, offset, value, ts

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return self._t

    def partition(self) -> int:
        return self._p

    def offset(self) -> int:
        return self._o

    def key(self) -> bytes | None:
        return None

    def value(self) -> bytes | None:
        return self._v

    def timestamp(self) -> tuple[int, int]:
        return (1, self._ts)


class FakeLog:
    """Topics as lists of (value, timestamp) per partition: metadata and fetches."""

    def __init__(self) -> None:
        self.topics: dict[str, list[list[tuple[bytes, int]]]] = {}

    def add(self, topic: str, partitions: int) -> None:
        self.topics.setdefault(topic, [])
        self.topics[topic].extend([] for _ in range(partitions - len(self.topics[topic])))

    def append(self, topic: str, partition: int, value: bytes, ts: int = 0) -> None:
        self.topics[topic][partition].append((value, ts))


class FakeMetadata:
    def __init__(self, log: FakeLog) -> None:
        self.log = log
        self.closed = False

    def partitions(self, topics: list[str] | None) -> dict[str, int]:
        names = self.log.topics if topics is None else [t for t in topics if t in self.log.topics]
        return {t: len(self.log.topics[t]) for t in names}

    def end_offsets(self, partitions: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        return {(t, p): len(self.log.topics[t][p]) for t, p in partitions}

    def start_offsets(self, partitions: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        return dict.fromkeys(partitions, 0)

    def offsets_for_time(
        self, partitions: list[tuple[str, int]], ms: int
    ) -> dict[tuple[str, int], int]:
        out = {}
        for t, p in partitions:
            records = self.log.topics[t][p]
            out[(t, p)] = next((i for i, (_, ts) in enumerate(records) if ts >= ms), len(records))
        return out

    def close(self) -> None:
        self.closed = True


class FakeFetcher:
    """Round-robin fetches of up to ``per_partition`` messages per assigned partition."""

    def __init__(self, log: FakeLog, per_partition: int = 3) -> None:
        self.log = log
        self.per_partition = per_partition
        self.at: dict[tuple[str, int], int] = {}
        self.commits: list[list[tuple[str, int, int]]] = []
        self.positions_past: dict[tuple[str, int], int] = {}
        self.closed = False

    def assign(self, positions: list[tuple[str, int, int]]) -> None:
        for t, p, o in positions:
            self.at[(t, p)] = 0 if o == EARLIEST else o

    def unassign(self, partitions: list[tuple[str, int]]) -> None:
        for tp in partitions:
            del self.at[tp]

    def fetch(self, max_messages: int, timeout: float) -> list[Any]:
        out: list[Any] = []
        for (t, p), pos in sorted(self.at.items()):
            records = self.log.topics[t][p][
                pos : pos + min(self.per_partition, max_messages - len(out))
            ]
            out.extend(FakeMessage(t, p, pos + i, v, ts) for i, (v, ts) in enumerate(records))
            self.at[(t, p)] = pos + len(records)
        return out

    def positions(self, partitions: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        # Past the log's end, as a consumer that skipped a trailing transaction marker.
        return {tp: self.positions_past.get(tp, self.at[tp]) for tp in partitions}

    def commit(self, offsets: list[tuple[str, int, int]]) -> None:
        self.commits.append(list(offsets))

    def close(self) -> None:
        self.closed = True


def _source(**kw: Any) -> KafkaSource:
    kw.setdefault("topics", ["bids"])
    return KafkaSource("127.0.0.1:1", **kw)


def _reader(
    log: FakeLog, source: KafkaSource, dead: list[Any] | None = None, **kw: Any
) -> tuple[Any, FakeFetcher]:
    fetcher = FakeFetcher(log, **kw)
    decoder: Any = (
        ColumnarDecoder(str(source.value_format), source._value_schema)
        if source.columnar
        else RowDecoder(source.value_format)
    )
    reader = KafkaPartitionReader(
        decoder,
        lambda: fetcher,
        dead.append if dead is not None else None,
        bounded=source.bounded,
        columnar=source.columnar,
    )
    return reader, fetcher


def _log(partitions: int = 2, per: int = 5, topic: str = "bids") -> FakeLog:
    log = FakeLog()
    log.add(topic, partitions)
    for p in range(partitions):
        for i in range(per):
            log.append(topic, p, json.dumps({"p": p, "i": i}).encode(), ts=1000 * p + i)
    return log


# --- split state ---------------------------------------------------------------


def test_split_id_position_and_finish() -> None:
    split = KafkaPartitionSplit.of("bids", 3, 5, stop_offset=7)
    assert split.split_id == "bids/3" and not split.finished
    assert split.at(7).finished and split.at(7).split_id == "bids/3"
    assert KafkaPartitionSplit.of("bids", 0, EARLIEST, stop_offset=0).finished
    assert not KafkaPartitionSplit.of("bids", 0, 100).finished  # unbounded: never
    assert pickle.loads(pickle.dumps(split)) == split


# --- enumerator ----------------------------------------------------------------


def test_enumerator_starts_every_partition_at_earliest_and_pushes() -> None:
    log = _log(3)
    enum = KafkaPartitionEnumerator(_source(), 2, None, lambda: FakeMetadata(log))
    assert enum.assign_on_demand is False
    splits = enum.initial_splits()
    assert [(s.split_id, s.next_offset, s.stop_offset) for s in splits] == [
        ("bids/0", EARLIEST, None),
        ("bids/1", EARLIEST, None),
        ("bids/2", EARLIEST, None),
    ]
    assert enum.snapshot() == [("bids", 0), ("bids", 1), ("bids", 2)]


def test_a_named_topic_that_does_not_exist_fails_at_once_naming_it() -> None:
    log = _log(2)
    src = es.sources.KafkaSource("127.0.0.1:9092", ["bids", "bds"])
    enum = KafkaPartitionEnumerator(src, 1, None, lambda: FakeMetadata(log))
    with pytest.raises(es.ConfigurationError, match=r"\['bds'\] do not exist on 127.0.0.1:9092"):
        enum.initial_splits()
    offsets = es.sources.KafkaSource("127.0.0.1:9092", ["bids"], starting_offsets={("bids", 9): 0})
    with pytest.raises(es.ConfigurationError, match=r"\[\('bids', 9\)\] that do not exist"):
        KafkaPartitionEnumerator(offsets, 1, None, lambda: FakeMetadata(log)).initial_splits()
    with pytest.raises(es.ConfigurationError, match=r"\['typo'\] that are not in topics"):
        es.sources.KafkaSource("127.0.0.1:9092", ["bids"], starting_offsets={("typo", 0): 1})
    with pytest.raises(es.ConfigurationError, match="starting_offsets"):
        es.sources.KafkaSource("127.0.0.1:9092", ["bids"], starting_offsets={("bids", -1): 1})
    # A pattern matching nothing yet is no error: its topics are discovered later.
    pattern = es.sources.KafkaSource("127.0.0.1:9092", topic_pattern=r"asks-.*")
    assert (
        KafkaPartitionEnumerator(pattern, 1, None, lambda: FakeMetadata(log)).initial_splits() == []
    )


def test_enumerator_resolves_latest_explicit_and_timestamp_offsets() -> None:
    log = _log(2, per=5)
    meta = FakeMetadata(log)

    def starts(spec: Any) -> list[int]:
        enum = KafkaPartitionEnumerator(_source(starting_offsets=spec), 1, None, lambda: meta)
        return [s.next_offset for s in enum.initial_splits()]

    assert starts("latest") == [5, 5]
    assert starts({("bids", 1): 3}) == [0, 3]  # unnamed partitions start at their log start
    assert starts(timestamp(1002)) == [5, 2]  # partition 0: 0..4, partition 1: 1000..1004


def test_bounded_enumerator_stops_at_the_end_seen_at_start_and_discovers_nothing() -> None:
    log = _log(2, per=4)
    meta = FakeMetadata(log)
    enum = KafkaPartitionEnumerator(_source(bounded="latest"), 1, None, lambda: meta)
    splits = enum.initial_splits()
    assert [(s.next_offset, s.stop_offset) for s in splits] == [(0, 4), (0, 4)]
    assert meta.closed, "the client is closed after use"
    assert enum.next_discovery() is None and enum.discover(1e9) == []


def test_enumerator_discovers_new_partitions_and_matching_topics_once() -> None:
    log = _log(1, topic="bids-a")
    log.add("asks", 1)
    src = _source(topics=None, topic_pattern=r"bids-.*", discovery_interval=5.0)
    enum = KafkaPartitionEnumerator(src, 2, None, lambda: FakeMetadata(log), start=at_once)
    assert [s.split_id for s in enum.initial_splits()] == ["bids-a/0"]
    assert enum.discover(0.0) == []
    log.add("bids-b", 2)
    log.add("bids-a", 2)  # a partition added to a known topic
    log.add("xbids-c", 1)  # the pattern matches whole names only
    assert enum.discover(1.0) == [], "not due before the interval"
    assert enum.next_discovery() == 5.0
    found = enum.discover(5.0)
    assert [(s.split_id, s.next_offset) for s in found] == [
        ("bids-a/1", EARLIEST),
        ("bids-b/0", EARLIEST),
        ("bids-b/1", EARLIEST),
    ]
    assert enum.discover(10.0) == []
    # A restored enumerator knows what was handed out already.
    restored = KafkaPartitionEnumerator(
        src, 3, enum.snapshot(), lambda: FakeMetadata(log), start=at_once
    )
    log.add("bids-c", 1)
    assert [s.split_id for s in restored.discover(0.0)] == ["bids-c/0"]


# --- reader --------------------------------------------------------------------


def test_reader_advances_each_partition_and_snapshots_next_offsets() -> None:
    log = _log(2, per=5)
    reader, fetcher = _reader(log, _source(value_format="json"))
    reader.add_splits([KafkaPartitionSplit.of("bids", 0), KafkaPartitionSplit.of("bids", 1, 2)])
    groups = reader.poll_splits(100)
    assert [(g[0], [r["i"] for r in g[1]], g[2], g[3]) for g in groups] == [
        ("bids/0", [0, 1, 2], False, [0, 1, 2]),
        ("bids/1", [2, 3, 4], False, [1002, 1003, 1004]),
    ]
    assert [s.next_offset for s in reader.snapshot(1)] == [3, 5]
    assert not reader.exhausted and not reader.needs_splits
    reader.close()
    assert fetcher.closed


def test_reader_restored_at_offsets_reads_on_exactly() -> None:
    log = _log(1, per=6)
    first, _ = _reader(log, _source(value_format="json"))
    first.add_splits([KafkaPartitionSplit.of("bids", 0)])
    seen = [r["i"] for r in first.poll(100)]
    state = first.snapshot(1)
    second, _ = _reader(log, _source(value_format="json"))
    second.add_splits(pickle.loads(pickle.dumps(state)))
    while batch := second.poll(100):
        seen += [r["i"] for r in batch]
    assert seen == list(range(6))


def test_reader_skips_messages_before_its_position() -> None:
    log = _log(1, per=6)
    reader, fetcher = _reader(log, _source(value_format="json"))
    reader.add_splits([KafkaPartitionSplit.of("bids", 0, 4)])
    fetcher.at[("bids", 0)] = 2  # a fetch from earlier in the log (a compressed batch)
    assert [r["i"] for r in reader.poll(100)] == [4]


def test_bounded_reader_stops_at_stop_offsets_and_is_exhausted() -> None:
    log = _log(2, per=5)
    reader, fetcher = _reader(log, _source(value_format="json", bounded="latest"))
    reader.add_splits(
        [
            KafkaPartitionSplit.of("bids", 0, 0, stop_offset=4),
            KafkaPartitionSplit.of("bids", 1, 0, stop_offset=0),  # empty at the start
        ]
    )
    assert ("bids", 1) not in fetcher.at
    out: list[Any] = []
    finished = []
    while not reader.exhausted:
        for split_id, records, done, _ in reader.poll_splits(100):
            out += records
            if done:
                finished.append(split_id)
    assert [r["i"] for r in out] == [0, 1, 2, 3] and finished == ["bids/0"]
    assert fetcher.at == {}, "a finished partition is unassigned"


def test_reader_commits_the_offsets_of_completed_checkpoints_only() -> None:
    log = _log(1, per=9)
    reader, fetcher = _reader(log, _source(value_format="json"))
    reader.add_splits([KafkaPartitionSplit.of("bids", 0)])
    reader.snapshot(1)  # nothing read yet: nothing to commit
    reader.poll(100)
    reader.snapshot(2)
    reader.poll(100)
    reader.snapshot(3)
    reader.notify_checkpoint_complete(1)
    assert fetcher.commits == [[]]
    reader.notify_checkpoint_complete(3)  # 2 is covered by 3
    assert fetcher.commits == [[], [("bids", 0, 6)]]
    reader.notify_checkpoint_complete(3)
    assert len(fetcher.commits) == 2


def test_bad_value_fails_naming_topic_partition_and_offset_after_the_good_ones() -> None:
    log = _log(1, per=2)
    log.append("bids", 0, b"{not json")
    reader, _ = _reader(log, _source(value_format="json"), per_partition=10)
    reader.add_splits([KafkaPartitionSplit.of("bids", 0)])
    assert [r["i"] for r in reader.poll(100)] == [0, 1]
    assert [s.next_offset for s in reader.snapshot(1)] == [2], "a restore reads the bad one again"
    with pytest.raises(SourceDecodeError, match=r"bids/0 at offset 2 as json") as err:
        reader.poll(100)
    assert (err.value.path, err.value.offset) == ("bids/0", 2)
    assert not reader.exhausted


def test_bad_value_goes_to_the_dead_letter_output_with_its_place() -> None:
    log = _log(1, per=1)
    log.append("bids", 0, b"\xff")
    log.append("bids", 0, b'{"i": 9}')
    dead: list[Any] = []
    reader, _ = _reader(log, _source(value_format="json"), dead, per_partition=10)
    reader.add_splits([KafkaPartitionSplit.of("bids", 0)])
    assert [r["i"] for r in reader.poll(100)] == [0, 9]
    assert [(d["topic"], d["partition"], d["offset"], d["value"]) for d in dead] == [
        ("bids", 0, 1, b"\xff")
    ]
    assert [s.next_offset for s in reader.snapshot(1)] == [3]


# --- decoding ------------------------------------------------------------------


def _msgs(values: list[bytes | None]) -> list[Any]:
    return [FakeMessage("t", 0, i, v, ts=10 + i) for i, v in enumerate(values)]


def test_row_formats() -> None:
    msgs = _msgs([b"a\xc3\xa9"])
    assert RowDecoder("bytes").decode("t", 0, msgs, None)[0] == [b"a\xc3\xa9"]
    assert RowDecoder("text").decode("t", 0, msgs, None)[0] == ["aé"]
    assert RowDecoder(lambda b: len(b)).decode("t", 0, msgs, None)[0] == [3]
    with pytest.raises(ConfigurationError, match="value_format"):
        _source(value_format="avro")


def test_a_tombstone_is_the_record_none_in_every_row_format() -> None:
    msgs = _msgs([b'{"a": 1}', None])
    assert RowDecoder("json").decode("t", 0, msgs, None) == ([{"a": 1}, None], msgs, None)
    assert RowDecoder("text").decode("t", 0, msgs, None)[0] == ['{"a": 1}', None]
    assert RowDecoder("bytes").decode("t", 0, msgs, None)[0] == [b'{"a": 1}', None]
    assert RowDecoder(lambda b: b is None).decode("t", 0, msgs, None)[0] == [False, True]


def test_a_callable_failing_on_a_tombstone_names_its_place() -> None:
    records, _, error = RowDecoder(lambda b: b.decode()).decode("t", 3, _msgs([b"a", None]), None)
    assert records == ["a"] and error is not None and error.offset == 1
    assert "t/3 at offset 1" in str(error) and "null value (a tombstone)" in str(error)


def test_columnar_json_decodes_a_fetch_into_declared_columns() -> None:
    import pyarrow as pa

    decoder = ColumnarDecoder("json", pa.schema([("user", pa.string()), ("n", pa.int64())]))
    values: list[bytes | None] = [b'{"user": "a", "n": 1, "x": 0}', b'{"user": "b", "n": 2}']
    batch, kept, error = decoder.decode("t", 0, _msgs(values), None)
    assert error is None and len(kept) == 2
    assert batch.schema.names == ["user", "n", "key", "topic", "partition", "offset", "timestamp"]
    assert batch.column("n").to_pylist() == [1, 2]
    assert batch.column("offset").to_pylist() == [0, 1] and batch.column(
        "timestamp"
    ).to_pylist() == [10, 11]


def test_columnar_bad_values_are_found_one_by_one() -> None:
    import pyarrow as pa

    decoder = ColumnarDecoder("json", pa.schema([("n", pa.int64())]))
    values: list[bytes | None] = [b'{"n": 1}', b'{"n": "x"}', b"[1]", None, b'{"n": 5}']
    dead: list[Any] = []
    batch, _, error = decoder.decode("t", 0, _msgs(values), dead.append)
    assert error is None and batch.column("n").to_pylist() == [1, 5]
    assert [d["offset"] for d in dead] == [1, 2, 3]
    batch, _, error = decoder.decode("t", 0, _msgs(values), None)
    assert batch.column("n").to_pylist() == [1]
    assert error is not None and error.offset == 1 and "t/0 at offset 1" in str(error)


@pytest.mark.parametrize(
    "bad",
    [
        b'{"n": 1.5}',
        b'{"n": "5"}',
        b'{"n": true}',
        b'{"n": 99999999999999999999}',
        b'{"n": 1}{"n": 2}',
    ],
)
def test_columnar_json_never_casts_a_value_to_fit(bad: bytes) -> None:
    import pyarrow as pa

    decoder = ColumnarDecoder("json", pa.schema([("n", pa.int64())]))
    values: list[bytes | None] = [b'{"n": 1}', bad, b'{"n": 3}']
    dead: list[Any] = []
    batch, _, error = decoder.decode("t", 0, _msgs(values), dead.append)
    assert error is None and batch.column("n").to_pylist() == [1, 3]
    assert [d["offset"] for d in dead] == [1] and dead[0]["value"] == bad
    batch, _, error = decoder.decode("t", 0, _msgs(values), None)
    assert batch.column("n").to_pylist() == [1]
    assert isinstance(error, SourceDecodeError) and error.offset == 1


def test_columnar_text_and_config_errors() -> None:
    decoder = ColumnarDecoder("text", None)
    batch, _, error = decoder.decode("t", 0, _msgs([b"a", b"\xff", b"c"]), None)
    assert batch.column("value").to_pylist() == ["a"] and error is not None and error.offset == 1
    with pytest.raises(ConfigurationError, match="schema"):
        _source(value_format="json", columnar=True)
    with pytest.raises(ConfigurationError, match="exactly one"):
        KafkaSource("127.0.0.1:1", ["a"], topic_pattern="b")
    with pytest.raises(ConfigurationError, match="starting_offsets"):
        _source(starting_offsets={("bids", 0): -5})


def test_columnar_reader_polls_one_batch_over_partitions() -> None:
    import pyarrow as pa

    log = _log(2, per=2)
    src = _source(value_format="json", columnar=True, schema=pa.schema([("i", pa.int64())]))
    reader, _ = _reader(log, src)
    reader.add_splits([KafkaPartitionSplit.of("bids", 0), KafkaPartitionSplit.of("bids", 1)])
    batch = reader.poll(100)
    assert batch.column("i").to_pylist() == [0, 1, 0, 1]
    assert batch.column("partition").to_pylist() == [0, 0, 1, 1]


# --- event time ----------------------------------------------------------------


def test_kafka_timestamps_give_per_partition_watermarks_and_idleness() -> None:
    log = FakeLog()
    log.add("bids", 2)
    for i in range(3):
        log.append("bids", 0, b"{}", ts=10_000 + i)
    log.append("bids", 1, b"{}", ts=2_000)
    reader, _ = _reader(log, _source(value_format="json"))
    reader.add_splits([KafkaPartitionSplit.of("bids", 0), KafkaPartitionSplit.of("bids", 1)])
    now = [0]
    marks: list[int] = []
    emitted: list[Any] = []
    strategy = es.WatermarkStrategy.monotonous_timestamps().with_idleness(1000)
    tw = TimestampsAndWatermarks(
        strategy,
        "test",
        lambda r, t: emitted.extend(t),
        marks.append,
        lambda idle: None,
        now_ms=lambda: now[0],
        interval_ms=0,
    )
    for split_id in ("bids/0", "bids/1"):
        tw.add_split(split_id)
    for split_id, records, _, timestamps in reader.poll_splits(100):
        tw.process(split_id, records, timestamps)
    assert emitted == [10_000, 10_001, 10_002, 2_000]
    assert marks[-1] == 1_999, "the slower partition holds the watermark back"
    now[0] = 1_000
    log.append("bids", 0, b"{}", ts=10_003)  # only partition 0 goes on: partition 1 idles
    for split_id, records, _, timestamps in reader.poll_splits(100):
        tw.process(split_id, records, timestamps)
    tw.on_processing_time(now[0])
    assert marks[-1] == 10_002, "an idle partition does not hold the watermark back"


def test_a_timestamp_assigner_gets_the_record_and_its_kafka_timestamp() -> None:
    log = FakeLog()
    log.add("bids", 1)
    log.append("bids", 0, b'{"delay": 5}', ts=1_000)
    reader, _ = _reader(log, _source(value_format="json"))
    reader.add_splits([KafkaPartitionSplit.of("bids", 0)])
    emitted: list[Any] = []
    strategy = es.WatermarkStrategy.monotonous_timestamps().with_timestamp_assigner(
        lambda record, kafka_ts: kafka_ts - record["delay"]
    )
    tw = TimestampsAndWatermarks(
        strategy,
        "test",
        lambda r, t: emitted.extend(t),
        lambda mark: None,
        lambda idle: None,
        now_ms=lambda: 0,
        interval_ms=0,
    )
    for split_id, records, _, timestamps in reader.poll_splits(100):
        tw.process(split_id, records, timestamps)
    assert emitted == [995]


def test_without_a_group_nothing_is_committed() -> None:
    log = _log(1, per=3)
    fetcher = FakeFetcher(log)
    reader = KafkaPartitionReader(
        RowDecoder("json"),
        lambda: fetcher,
        None,
        bounded=False,
        columnar=False,
        commit_offsets=False,
    )
    reader.add_splits([KafkaPartitionSplit.of("bids", 0)])
    assert [r["i"] for r in reader.poll(100)] == [0, 1, 2]
    reader.snapshot(1)
    reader.notify_checkpoint_complete(1)
    assert fetcher.commits == []


def test_a_failed_discovery_is_retried_at_the_next_interval() -> None:
    from epochstream.connectors.kafka.client import KafkaClientError

    log = _log(1)
    down = [True]

    class FlakyMetadata(FakeMetadata):
        def partitions(self, topics: list[str] | None) -> dict[str, int]:
            if down[0]:
                raise KafkaClientError("broker unreachable")
            return super().partitions(topics)

    enum = KafkaPartitionEnumerator(
        _source(discovery_interval=2.0),
        1,
        [("bids", 0)],
        lambda: FakeMetadata(log),
        lambda: FlakyMetadata(log),
        start=at_once,
    )
    log.add("bids", 2)
    assert enum.discover(0.0) == []
    assert enum.next_discovery() == 2.0
    down[0] = False
    assert [s.split_id for s in enum.discover(2.0)] == ["bids/1"]


def test_a_bounded_split_ends_when_the_consumer_passed_a_trailing_transaction_marker() -> None:
    log = _log(1, per=3)
    reader, fetcher = _reader(log, _source(value_format="json", bounded="latest"))
    reader.add_splits([KafkaPartitionSplit.of("bids", 0, 0, stop_offset=4)])  # offset 3: a marker
    assert [r["i"] for r in reader.poll(100)] == [0, 1, 2]
    assert reader.poll_splits(100) == [] and not reader.exhausted
    fetcher.positions_past[("bids", 0)] = 4
    assert reader.poll_splits(100) == [("bids/0", [], True, [])]
    assert reader.exhausted and [s.next_offset for s in reader.snapshot(1)] == [4]


@pytest.mark.parametrize(
    "owned", ["group.id", "enable.auto.commit", "auto.offset.reset", "bootstrap.servers"]
)
def test_settings_the_source_owns_are_refused_not_replaced(owned: str) -> None:
    with pytest.raises(ConfigurationError, match=f"sets '{owned}' itself"):
        _source(properties={owned: "x"})


def test_a_schema_without_columnar_is_refused() -> None:
    import pyarrow as pa

    with pytest.raises(ConfigurationError, match="schema= declares the columns"):
        _source(value_format="json", schema=pa.schema([("n", pa.int64())]))
