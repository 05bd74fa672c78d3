"""The arithmetic of the peers' W1 latency runs (bench/peers/latency_samples.py).

Pure functions: no Spark, no Bytewax.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench" / "peers"))
try:
    import latency_samples as ls
finally:
    del sys.path[0]


def test_schedule_releases_each_event_at_its_due_time_and_stops_at_n() -> None:
    s = ls.Schedule(rate=4.0, start=10.0, n=6)
    assert [s.due(i) for i in range(3)] == [10.0, 10.25, 10.5]
    assert s.released(9.99) == 0
    assert s.released(10.0) == 1  # event 0 is due at the start
    assert s.released(10.24) == 1
    assert s.released(10.25) == 2
    assert s.released(100.0) == 6


def test_polling_a_schedule_releases_every_event_once_and_never_early() -> None:
    """A source polled at uneven times, up to a batch size each poll (as the Bytewax
    source does), emits 0..n-1 in order, each at or after its due time."""
    s = ls.Schedule(rate=1000.0, start=50.0, n=2000)
    position, seen = 0, []
    for k in range(400):
        now = 50.0 + k * 0.0071
        upto = min(s.released(now), position + 16)
        for i in range(position, upto):
            assert s.due(i) <= now
            seen.append(i)
        position = max(position, upto)
    assert seen == list(range(len(seen))) and len(seen) > 1000


def test_pick_draws_one_sample_per_share_of_rows_from_the_quantiles() -> None:
    quantiles = [float(q) for q in range(10)]
    # As many rows as quantiles stand for: every quantile once.
    assert ls.pick(quantiles, rows=1000, rows_per_sample=100) == quantiles
    # A batch twice as large: every quantile twice, so it weighs twice in the percentiles.
    assert ls.pick(quantiles, rows=2000, rows_per_sample=100) == sorted(quantiles * 2)
    # Half as large: every other quantile, the later of each pair.
    assert ls.pick(quantiles, rows=500, rows_per_sample=100) == [1.0, 3.0, 5.0, 7.0, 9.0]
    # A handful of rows still gives a sample: the median.
    assert ls.pick(quantiles, rows=3, rows_per_sample=100) == [5.0]
    assert ls.pick(quantiles, rows=0, rows_per_sample=100) == []
    assert ls.pick([], rows=10, rows_per_sample=1) == []


def test_rate_source_offers_a_second_of_rows_once_it_has_passed() -> None:
    origin = 1_700_000_000_000
    assert ls.offered_ms(origin, origin) == origin + 1000
    assert ls.offered_ms(origin + 999, origin) == origin + 1000
    assert ls.offered_ms(origin + 1000, origin) == origin + 2000
    assert ls.offered_ms(origin + 5_432, origin) == origin + 6000


def test_batch_end_is_trigger_start_plus_its_execution_time() -> None:
    assert ls.batch_end("2026-11-23T16:30:00.250Z", 750) == pytest.approx(1_795_451_401.0)
    assert ls.batch_end("1970-01-01T00:00:10.250Z", 500) == 10.75


def test_micro_batch_latency_from_end_and_creation_quantiles() -> None:
    """The Spark peer's figure for one batch: its end minus the picked creation times."""
    end = ls.batch_end("1970-01-01T00:00:12.000Z", 200)  # 12.2 s
    created_ms = [11_000 + 10 * j for j in range(100)]  # rows created 11.0 .. 11.99 s
    picks = ls.pick(created_ms, rows=50, rows_per_sample=1)  # every other quantile
    latencies = [end - ms / 1000 for ms in picks]
    assert len(latencies) == 50
    assert max(latencies) == pytest.approx(12.2 - 11.01)
    assert min(latencies) == pytest.approx(12.2 - 11.99)
    since_offered = [end - ls.offered_ms(ms, 11_000) / 1000 for ms in picks]
    assert since_offered == [pytest.approx(0.2)] * 50  # all offered at 12.0 s
