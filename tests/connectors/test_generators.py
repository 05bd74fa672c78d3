from __future__ import annotations

import itertools
import pickle
from typing import Any

import pytest

from epochstream.connectors.base import SourceContext, SourceReader
from epochstream.connectors.generators import (
    RELEASE_STEP_S,
    CollectionSource,
    CollectionSplit,
    SequenceSource,
    SequenceSplit,
)
from epochstream.core.clock import ManualClock
from epochstream.exceptions import ConfigurationError


def ctx(clock: ManualClock | None = None, subtask: int = 0, parallelism: int = 1) -> SourceContext:
    return SourceContext(subtask, parallelism, clock or ManualClock())


def drain(reader: SourceReader, max_records: int = 1000) -> list[Any]:
    out: list[Any] = []
    for _ in range(100_000):
        if reader.exhausted:
            return out
        out.extend(reader.poll(max_records))
    raise AssertionError("reader never became exhausted")


@pytest.mark.parametrize("start,stop", [(0, 0), (0, 1), (5, 17), (-10, 3), (0, 1000), (7, 3)])
@pytest.mark.parametrize("parallelism", [1, 2, 3, 7, 16])
def test_sequence_splits_cover_range_contiguously(start: int, stop: int, parallelism: int) -> None:
    source = SequenceSource(start, stop)
    splits = source.create_splits(parallelism)
    n = max(0, stop - start)
    assert len(splits) == min(parallelism, n)
    assert len({s.split_id for s in splits}) == len(splits)
    sizes = [s.stop - s.next for s in splits]
    assert not sizes or max(sizes) - min(sizes) <= 1
    assert all(a.stop == b.next for a, b in itertools.pairwise(splits))
    got: list[int] = []
    for subtask in range(parallelism):
        reader = source.create_reader(ctx(subtask=subtask, parallelism=parallelism))
        reader.add_splits(splits[subtask::parallelism])
        got.extend(drain(reader, max_records=4))
    assert got == list(range(start, stop))


def test_sequence_snapshot_restore_at_every_position() -> None:
    source = SequenceSource(0, 23)
    splits = source.create_splits(3)
    for cut in range(24):
        reader = source.create_reader(ctx())
        reader.add_splits(splits)
        before: list[int] = []
        while len(before) < cut:
            before.extend(reader.poll(min(5, cut - len(before))))
        state = pickle.loads(pickle.dumps(reader.snapshot(1)))
        assert all(isinstance(s, SequenceSplit) for s in state)
        restored = source.create_reader(ctx())
        restored.add_splits(state)
        assert before + drain(restored, max_records=4) == list(range(23))


def test_zero_splits_reader_is_exhausted() -> None:
    reader = SequenceSource(0, 10).create_reader(ctx())
    assert reader.exhausted
    assert reader.poll(5) == []
    assert reader.next_available() is None


def test_rate_limit_releases_records_by_clock() -> None:
    clock = ManualClock(start=100.0)
    source = SequenceSource(0, 100, rate=10.0)
    reader = source.create_reader(ctx(clock))
    reader.add_splits(source.create_splits(1))
    assert reader.next_available() is None  # nothing polled yet: data is available now
    assert reader.poll(50) == [0]
    assert reader.next_available() == pytest.approx(100.1)
    assert reader.poll(50) == []  # no sleeping inside poll: nothing is due yet
    clock.advance(0.1)
    assert reader.poll(50) == [1]
    clock.advance(0.5)
    assert reader.poll(50) == [2, 3, 4, 5, 6]
    assert reader.next_available() == pytest.approx(100.7)
    clock.advance(10.0)
    assert reader.poll(50) == list(range(7, 57))  # max_records still caps the burst
    assert reader.poll(1000) == list(range(57, 100))
    assert reader.exhausted
    assert reader.next_available() is None


def test_a_fast_rate_releases_a_milliseconds_worth_at_a_time() -> None:
    """At 100,000 records/s a step is 100 records: a task polling as fast as it can
    gets batches of a step, not one record per poll, and no record before it is due."""
    assert RELEASE_STEP_S == 0.001
    clock = ManualClock(start=0.0)
    source = SequenceSource(0, 1_000, rate=100_000.0)
    reader = source.create_reader(ctx(clock))
    reader.add_splits(source.create_splits(1))
    assert reader.poll(1024) == []  # only record 0 is due: not a whole step yet
    assert reader.next_available() == pytest.approx(0.00099)  # when record 99 is due
    clock.advance(0.0005)
    assert reader.poll(1024) == []  # 51 due
    clock.advance(0.00049)
    assert reader.poll(1024) == list(range(100))
    clock.advance(0.0001)
    assert reader.poll(1024) == []  # 10 more due: not a step
    assert reader.next_available() == pytest.approx(0.00199)
    clock.advance(0.0052)
    assert reader.poll(1024) == list(range(100, 630))  # all that is due, beyond a step
    assert reader.poll(64) == []  # a smaller poll caps the step: 64 records
    clock.advance(0.00064)
    assert reader.poll(64) == list(range(630, 694))
    clock.advance(1.0)
    assert drain(reader) == list(range(694, 1_000))  # the last records, fewer than a step


def test_rate_is_total_and_divided_over_subtasks() -> None:
    clock = ManualClock()
    source = SequenceSource(0, 1000, rate=40.0)
    splits = source.create_splits(4)
    readers = []
    for subtask in range(4):
        reader = source.create_reader(ctx(clock, subtask, 4))
        reader.add_splits([splits[subtask]])
        readers.append(reader)
    released = sum(len(r.poll(1000)) for r in readers)
    for _ in range(20):
        clock.advance(0.1)
        released += sum(len(r.poll(1000)) for r in readers)
    # 2 s at 40 records/s, plus one record released at once per subtask.
    assert released == 80 + 4


def test_rate_limited_reader_shares_its_rate_over_its_splits() -> None:
    clock = ManualClock()
    source = SequenceSource(0, 100, rate=4.0)
    reader = source.create_reader(ctx(clock))
    reader.add_splits(source.create_splits(2))
    assert reader.poll(100) == [0]
    clock.advance(1.0)
    assert reader.poll(100) == [1, 2, 3, 4]
    assert reader.next_available() == pytest.approx(1.25)


def test_restored_positions_take_the_new_jobs_rate() -> None:
    """Split states are positions only: the rate comes from the source being run."""
    clock = ManualClock()
    throttled = SequenceSource(0, 100, rate=2.0)
    old = throttled.create_reader(ctx(clock))
    old.add_splits(throttled.create_splits(1))
    assert old.poll(100) == [0]
    state = old.snapshot(1)
    assert not any("rate" in vars(split) for split in state)
    unthrottled = SequenceSource(0, 100)
    new = unthrottled.create_reader(ctx(clock))
    new.add_splits(pickle.loads(pickle.dumps(state)))
    assert new.poll(1000) == list(range(1, 100))


def test_invalid_rate_is_rejected() -> None:
    for rate in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ConfigurationError, match="rate"):
            SequenceSource(0, 10, rate=rate)


def test_collection_splits_keep_data_in_source() -> None:
    items = [{"k": f"payload-{i}"} for i in range(10)]
    source = CollectionSource(iter(items))
    splits = source.create_splits(3)
    assert [(s.start, s.end, s.position) for s in splits] == [(0, 3, 0), (3, 6, 3), (6, 10, 6)]
    assert all(isinstance(s, CollectionSplit) for s in splits)
    assert b"payload" not in pickle.dumps(splits)
    got: list[Any] = []
    for subtask in range(3):
        reader = source.create_reader(ctx(subtask=subtask, parallelism=3))
        reader.add_splits([splits[subtask]])
        got.extend(drain(reader, max_records=2))
    assert got == items


@pytest.mark.parametrize("parallelism", [1, 4, 50])
def test_collection_snapshot_restore_and_redistribution(parallelism: int) -> None:
    items = [f"item-{i}" for i in range(31)]
    source = CollectionSource(items)
    splits = source.create_splits(parallelism)
    assert len(splits) == min(parallelism, 31)
    first = source.create_reader(ctx())
    first.add_splits(splits)
    before = first.poll(13)
    state = pickle.loads(pickle.dumps(first.snapshot(1)))
    after: list[Any] = []
    for k in range(2):
        reader = source.create_reader(ctx(subtask=k, parallelism=2))
        reader.add_splits(state[k::2])
        after.extend(drain(reader, max_records=3))
    assert len(before) == 13
    assert sorted(before + after) == sorted(items)


def test_collection_reader_rejects_foreign_or_out_of_range_splits() -> None:
    reader = CollectionSource([1, 2]).create_reader(ctx())
    with pytest.raises(ConfigurationError, match="CollectionSplit"):
        reader.add_splits([SequenceSplit("seq-0", 0, 2)])
    with pytest.raises(ConfigurationError, match="2 items"):
        reader.add_splits([CollectionSplit("col-0", 0, 5, 0)])


def test_empty_collection_has_no_splits() -> None:
    assert CollectionSource([]).create_splits(4) == []
