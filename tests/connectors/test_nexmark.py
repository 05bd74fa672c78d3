from __future__ import annotations

import collections
import dataclasses
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import epochstream as es
from epochstream.connectors.base import SourceContext, SourceReader
from epochstream.connectors.nexmark import NexmarkReader, NexmarkSplit, nexmark_events
from epochstream.connectors.nexmark_model import (
    AUCTION_FIELDS,
    BID_FIELDS,
    PERSON_FIELDS,
    event_numbers,
)
from epochstream.core.clock import ManualClock

CONFIG = es.sources.nexmark.NexmarkConfig(
    events=20_000, seed=11, events_per_second=1_000, out_of_order_group_size=500
)


def drain(reader: SourceReader, max_records: int) -> list[Any]:
    out: list[Any] = []
    for _ in range(1_000_000):
        if reader.exhausted:
            return out
        out.extend(reader.poll(max_records))
    raise AssertionError("reader never became exhausted")


def positions(split: NexmarkSplit) -> list[int]:
    """The stream positions of ``split``, in the order it reads them."""
    return [p for lo, hi in split.stream_ranges(split.next, split.stop) for p in range(lo, hi)]


def in_split_order(splits: list[NexmarkSplit], kind: str | None = None) -> list[Any]:
    """The stream's events as one reader of ``splits`` reads them (split after split);
    of one ``kind`` without ``"type"``."""
    events = nexmark_events(CONFIG, 0, CONFIG.events)
    ordered = [events[p] for split in splits for p in positions(split)]
    if kind is None:
        return ordered
    return [{k: v for k, v in e.items() if k != "type"} for e in ordered if e["type"] == kind]


def read_all(
    config: es.sources.nexmark.NexmarkConfig, parallelism: int, max_records: int = 777
) -> list[Any]:
    """Every event, read by ``parallelism`` readers, put back in stream order."""
    source = es.sources.NexmarkSource(config)
    out: list[Any] = [None] * config.events
    for split in source.create_splits(parallelism):
        reader = source.create_reader(SourceContext(0, parallelism, ManualClock()))
        reader.add_splits([split])
        for position, event in zip(positions(split), drain(reader, max_records), strict=True):
            out[position] = event
    return out


def test_parallel_splits_take_turns_by_blocks_of_positions() -> None:
    """Readers advance through event time together: split i reads blocks i, i+k, ..."""
    splits = es.sources.NexmarkSource(
        es.sources.nexmark.NexmarkConfig(events=40_000)
    ).create_splits(2)
    assert [(s.index, s.of, s.stop) for s in splits] == [
        (0, 2, 8_192 * 2 + 7_232),
        (1, 2, 8_192 * 2),
    ]
    assert splits[1].stream_ranges(8_000, 8_300) == [
        (8_192 + 8_000, 2 * 8_192),
        (3 * 8_192, 3 * 8_192 + 108),
    ]
    assert sorted(p for s in splits for p in positions(s)) == list(range(40_000))
    assert [
        s.of
        for s in es.sources.NexmarkSource(
            es.sources.nexmark.NexmarkConfig(events=100)
        ).create_splits(4)
    ] == [1]


def test_the_same_events_whatever_the_parallelism_split_and_poll_size() -> None:
    whole = nexmark_events(CONFIG, 0, CONFIG.events)
    assert len(whole) == CONFIG.events
    for parallelism, poll in [(1, 1_000), (3, 97), (7, 5_000), (16, 8_192)]:
        assert read_all(CONFIG, parallelism, poll) == whole
    assert nexmark_events(CONFIG, 8_000, 8_300) == whole[8_000:8_300]
    assert nexmark_events(CONFIG, 0, 3) == nexmark_events(dataclasses.replace(CONFIG), 0, 3)
    assert nexmark_events(dataclasses.replace(CONFIG, seed=12), 0, 3) != whole[:3]


def test_every_event_has_the_spec_fields_and_a_type() -> None:
    fields = {"person": PERSON_FIELDS, "auction": AUCTION_FIELDS, "bid": BID_FIELDS}
    for event in nexmark_events(CONFIG, 0, 2_000):
        assert tuple(event) == (*fields[event["type"]], "type")
        assert all(isinstance(v, int | str) for v in event.values())
    assert pickle.loads(pickle.dumps(nexmark_events(CONFIG, 0, 10))) == nexmark_events(
        CONFIG, 0, 10
    )


def test_kinds_come_in_proportion_1_3_46_with_sequential_ids() -> None:
    config = dataclasses.replace(CONFIG, events=50_000)
    events = nexmark_events(config, 0, config.events)
    kinds = collections.Counter(e["type"] for e in events)
    assert kinds == {"person": 1_000, "auction": 3_000, "bid": 46_000}
    persons = sorted(e["id"] for e in events if e["type"] == "person")
    auctions = sorted(e["id"] for e in events if e["type"] == "auction")
    assert persons == list(range(1000, 2000))
    assert auctions == list(range(1000, 4000))
    categories = collections.Counter(e["category"] for e in events if e["type"] == "auction")
    assert set(categories) == {10, 11, 12, 13, 14}


def _bids(config: es.sources.nexmark.NexmarkConfig) -> list[dict[str, Any]]:
    return [e for e in nexmark_events(config, 0, config.events) if e["type"] == "bid"]


def test_hot_bidders_auctions_and_sellers_are_the_reference_generators() -> None:
    """As in the reference generators, a hot auction is the first of the last block of
    100 auctions, a hot bidder the second of the last 100 persons (a hot seller the
    first); the config's ratios are only the odds of picking it (1 - 1/ratio). Rounding
    to the ratio itself (blocks of 2 or 4) made every hot key 25-50 times less hot."""
    events = nexmark_events(CONFIG, 0, CONFIG.events)
    bids = [e for e in events if e["type"] == "bid"]
    auctions = [e for e in events if e["type"] == "auction"]
    # 1/2 of the bids go to a hot auction, 3/4 to a hot bidder, 3/4 of the auctions to a
    # hot seller; the uniform rest lands on a block's first id once in a hundred.
    hot_auction = sum((b["auction"] - 1000) % 100 == 0 for b in bids) / len(bids)
    assert 0.48 < hot_auction < 0.53
    hot_bidder = sum((b["bidder"] - 1000) % 100 == 1 for b in bids) / len(bids)
    assert 0.73 < hot_bidder < 0.78
    hot_seller = sum((a["seller"] - 1000) % 100 == 0 for a in auctions) / len(auctions)
    assert 0.70 < hot_seller < 0.80
    # A hot auction gets about half the bids of its block's time: 100 auctions' worth.
    per_block = len(bids) * 100 // len(auctions)
    top_auction = collections.Counter(b["auction"] for b in bids).most_common(1)[0][1]
    assert 0.4 * per_block < top_auction < 0.6 * per_block
    channels = collections.Counter(b["channel"] for b in bids)
    assert sum(channels[c] for c in ("Google", "Facebook", "Baidu", "Apple")) / len(bids) > 0.45
    assert any(c.startswith("channel-") for c in channels)
    assert all(
        b["url"].endswith(f"channel_id={b['channel'][8:]}")
        for b in bids
        if b["channel"].startswith("channel-")
    )
    # Without hot ratios the same shares fall to chance.
    flat = _bids(dataclasses.replace(CONFIG, hot_bidder_ratio=1, hot_auction_ratio=1))
    assert sum((b["bidder"] - 1000) % 100 == 1 for b in flat) / len(flat) < 0.05
    assert sum((b["auction"] - 1000) % 100 == 0 for b in flat) / len(flat) < 0.05


@pytest.mark.parametrize(
    "events,group", [(20_000, 500), (2_500, 1_000), (3_000, 953), (1_906, 953), (10, 1)]
)
def test_positions_permute_event_numbers_within_groups(events: int, group: int) -> None:
    config = es.sources.nexmark.NexmarkConfig(events=events, out_of_order_group_size=group)
    numbers = event_numbers(config, 0, events)
    assert sorted(numbers.tolist()) == list(range(events))
    positions = np.arange(events)
    assert np.all(numbers // group == positions // group)
    if group > 1:
        assert np.any(numbers != positions)


def test_out_of_orderness_is_bounded_by_the_group_size() -> None:
    events = nexmark_events(CONFIG, 0, CONFIG.events)
    times = np.array([e["date_time"] for e in events])
    behind = np.maximum.accumulate(times) - times
    delay_ms = 1_000 / CONFIG.events_per_second
    assert behind.max() <= (CONFIG.out_of_order_group_size - 1) * delay_ms
    assert behind.max() >= CONFIG.out_of_order_group_size * delay_ms / 2  # really shuffled
    in_order = nexmark_events(
        dataclasses.replace(CONFIG, out_of_order_group_size=1), 0, CONFIG.events
    )
    ordered_times = [e["date_time"] for e in in_order]
    assert ordered_times == sorted(ordered_times)
    assert ordered_times[0] == CONFIG.base_time_ms
    assert ordered_times[-1] == CONFIG.base_time_ms + (CONFIG.events - 1)  # 1 ms per event


def test_auctions_expire_after_they_open_and_bids_name_recent_auctions() -> None:
    events = nexmark_events(CONFIG, 0, CONFIG.events)
    auctions = [e for e in events if e["type"] == "auction"]
    assert all(a["date_time"] < a["expires"] and a["initial_bid"] <= a["reserve"] for a in auctions)
    newest = max(a["id"] for a in auctions)
    assert all(b["auction"] <= newest + 10 for b in events if b["type"] == "bid")
    assert all(100 <= b["price"] <= 100_000_000 for b in events if b["type"] == "bid")


@pytest.mark.parametrize("cut", [0, 1, 4_095, 8_192, 8_193, 13_337, 20_000])
def test_a_reader_restored_from_its_snapshot_resumes_with_identical_events(cut: int) -> None:
    source = es.sources.NexmarkSource(CONFIG)
    splits = source.create_splits(2)
    reader = source.create_reader(SourceContext(0, 1, ManualClock()))
    reader.add_splits(splits)
    before: list[Any] = []
    while len(before) < cut:
        before.extend(reader.poll(min(1_000, cut - len(before))))
    states = pickle.loads(pickle.dumps(reader.snapshot(1)))
    reader.close()
    restored = source.create_reader(SourceContext(0, 1, ManualClock()))
    restored.add_splits(states)
    assert before + drain(restored, 600) == in_split_order(splits)


def test_the_rate_releases_events_by_the_injected_clock() -> None:
    clock = ManualClock()
    source = es.sources.NexmarkSource(CONFIG, rate=100.0)
    reader = source.create_reader(SourceContext(0, 1, clock))
    reader.add_splits(source.create_splits(1))
    assert len(reader.poll(1_000)) == 1
    clock.advance(0.5)
    assert len(reader.poll(1_000)) == 50


@pytest.mark.parametrize(
    "field,value",
    [
        ("events", -1),
        ("events", 1.5),
        ("seed", -3),
        ("seed", "7"),
        ("events_per_second", 0),
        ("events_per_second", float("nan")),
        ("events_per_second", 2_000_000),
        ("out_of_order_group_size", 0),
        ("base_time_ms", -1),
        ("num_active_people", 0),
        ("num_in_flight_auctions", 0),
        ("hot_auction_ratio", 0),
        ("hot_seller_ratio", True),
        ("hot_bidder_ratio", -4),
    ],
)
def test_bad_config_names_the_field(field: str, value: Any) -> None:
    with pytest.raises(es.ConfigurationError, match=f"NexmarkConfig.{field} "):
        es.sources.nexmark.NexmarkConfig(**{field: value})


def test_bad_sources_splits_and_ranges_are_refused() -> None:
    with pytest.raises(es.ConfigurationError, match="NexmarkConfig"):
        es.sources.NexmarkSource({"events": 10})  # type: ignore[arg-type]
    with pytest.raises(es.ConfigurationError, match="rate"):
        es.sources.NexmarkSource(CONFIG, rate=0)
    reader = NexmarkReader(CONFIG, ManualClock())
    with pytest.raises(es.ConfigurationError, match=r"nexmark-9 covers 0\.\.20001"):
        reader.add_splits([NexmarkSplit("nexmark-9", 0, 20_001)])
    with pytest.raises(es.ConfigurationError, match=r"nexmark-8 covers 0\.\.11809 of part 0 of 2"):
        reader.add_splits([NexmarkSplit("nexmark-8", 0, 11_809, 0, 2)])
    with pytest.raises(es.ConfigurationError, match="not a NexmarkSplit"):
        reader.add_splits([es.sources.SequenceSource(0, 3).create_splits(1)[0]])
    with pytest.raises(es.ConfigurationError, match=r"outside the configured 0\.\.20000"):
        nexmark_events(CONFIG, 19_000, 20_001)
    with pytest.raises(TypeError):
        es.sources.nexmark.NexmarkConfig(100)  # type: ignore[call-arg]  # keyword-only


def test_files_hold_the_same_events_as_the_source(tmp_path: Path) -> None:
    counts = es.sources.nexmark.write_nexmark_files(tmp_path, CONFIG)
    events = nexmark_events(CONFIG, 0, CONFIG.events)
    by_kind = collections.defaultdict(list)
    for e in events:
        by_kind[e["type"]].append({k: v for k, v in e.items() if k != "type"})
    assert counts == {**{k: len(v) for k, v in by_kind.items()}, "events": CONFIG.events}
    for kind, rows in by_kind.items():
        assert pq.read_table(tmp_path / f"{kind}.parquet").to_pylist() == rows
    union = pq.read_table(tmp_path / "events.parquet")
    assert union.column_names[:2] == ["event_type", "seq"]
    assert union.schema.field("date_time").type == union.schema.field("expires").type
    assert str(union.schema.field("expires").type) == "int64"
    rows = union.to_pylist()
    kinds = ("person", "auction", "bid")
    assert [kinds[r["event_type"]] for r in rows] == [e["type"] for e in events]
    assert [r["seq"] for r in rows] == event_numbers(CONFIG, 0, CONFIG.events).tolist()
    for row, event in zip(rows[:500], events, strict=False):
        assert {
            k: v for k, v in row.items() if v is not None and k not in ("event_type", "seq")
        } == {k: v for k, v in event.items() if k != "type"}


def test_files_of_no_events_have_schemas(tmp_path: Path) -> None:
    counts = es.sources.nexmark.write_nexmark_files(
        tmp_path, es.sources.nexmark.NexmarkConfig(events=0)
    )
    assert counts == {"person": 0, "auction": 0, "bid": 0, "events": 0}
    assert pq.read_table(tmp_path / "bid.parquet").column_names == list(BID_FIELDS)
    assert pq.read_table(tmp_path / "events.parquet").num_rows == 0


@pytest.mark.parametrize("kind", ["person", "auction", "bid"])
def test_the_columnar_source_reads_one_kind_as_record_batches(kind: str) -> None:
    source = es.sources.NexmarkSource(CONFIG, batch_size=3_000, kind=kind)
    assert source.columnar and not es.sources.NexmarkSource(CONFIG).columnar
    splits = source.create_splits(3)
    got: list[Any] = []
    for split in splits:
        reader = source.create_reader(SourceContext(0, 3, ManualClock()))
        reader.add_splits([split])
        while not reader.exhausted:
            batch = reader.poll(
                10
            )  # the hint is for rows: a columnar poll reads batch_size positions
            assert isinstance(batch, pa.RecordBatch) and batch.schema.names == list(
                {"person": PERSON_FIELDS, "auction": AUCTION_FIELDS, "bid": BID_FIELDS}[kind]
            )
            got.extend(batch.to_pylist())
    assert got == in_split_order(splits, kind)


@pytest.mark.parametrize("kind", ["person", "auction", "bid"])
def test_a_row_source_of_one_kind_reads_its_events_as_dicts(kind: str) -> None:
    source = es.sources.NexmarkSource(CONFIG, kind=kind)
    assert not source.columnar
    got: list[Any] = []
    splits = source.create_splits(2)
    for split in splits:
        reader = source.create_reader(SourceContext(0, 2, ManualClock()))
        reader.add_splits([split])
        while not reader.exhausted:
            got.extend(reader.poll(777))  # polls cross the generator's blocks
    assert got == in_split_order(splits, kind)


def test_a_row_reader_of_one_kind_resumes_from_its_snapshot() -> None:
    source = es.sources.NexmarkSource(CONFIG, kind="auction")
    reader = source.create_reader(SourceContext(0, 1, ManualClock()))
    splits = source.create_splits(2)
    reader.add_splits(splits)
    first = [r for _ in range(9) for r in reader.poll(1_000)]
    restored = source.create_reader(SourceContext(0, 1, ManualClock()))
    restored.add_splits(pickle.loads(pickle.dumps(reader.snapshot(1))))
    rest: list[Any] = []
    while not restored.exhausted:
        rest.extend(restored.poll(1_000))
    assert first + rest == in_split_order(splits, "auction")


def test_a_columnar_reader_resumes_from_its_snapshot() -> None:
    source = es.sources.NexmarkSource(CONFIG, batch_size=1_000, kind="bid")
    reader = source.create_reader(SourceContext(0, 1, ManualClock()))
    splits = source.create_splits(2)
    reader.add_splits(splits)
    first = [reader.poll(1) for _ in range(7)]
    groups = reader.poll_splits(1)
    assert [len(records) > 0 for _, records, _ in groups] == [True]
    restored = source.create_reader(SourceContext(0, 1, ManualClock()))
    restored.add_splits(pickle.loads(pickle.dumps(reader.snapshot(1))))
    rest = []
    while not restored.exhausted:
        rest.append(restored.poll(1))
    together = pa.Table.from_batches([*first, groups[0][1], *rest]).to_pylist()
    assert together == in_split_order(splits, "bid")


@pytest.mark.parametrize(
    "options,message",
    [
        ({"batch_size": 100}, "reads one kind"),
        ({"kind": "bids"}, "reads one kind"),
        ({"batch_size": 100, "kind": "bids"}, "reads one kind"),
        ({"batch_size": 0, "kind": "bid"}, "batch_size must be a positive int"),
    ],
)
def test_columnar_options_are_checked(options: dict[str, Any], message: str) -> None:
    with pytest.raises(es.ConfigurationError, match=message):
        es.sources.NexmarkSource(CONFIG, **options)
