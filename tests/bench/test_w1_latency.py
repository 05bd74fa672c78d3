"""bench/w1_latency.py's placing of the latency tail against checkpoint triggers."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
try:
    import w1_latency
finally:
    del sys.path[0]


def test_the_slowest_percent_is_binned_by_time_after_the_latest_trigger() -> None:
    fast = [(10.0 + i / 1000, 0.001) for i in range(990)]
    slow = [(10.12, 0.2), (10.13, 0.3), (11.07, 0.25), (11.96, 0.4)] + [(11.5, 0.1)] * 6
    bins = w1_latency.tail_after_triggers(fast + slow, [11.0, 10.0, 12.0])
    # The ten slowest: two 0.12-0.13 s after the trigger at 10, one 0.07 s after 11,
    # one 0.96 s after 11, six 0.5 s after 11.
    assert bins == {0.05: 1, 0.1: 2, 0.5: 6, 0.95: 1}


def test_samples_before_the_first_trigger_and_no_samples_count_nothing() -> None:
    samples = [(5.0, 1.0)] + [(5.5, 0.001)] * 99
    assert w1_latency.tail_after_triggers(samples, [6.0]) == {}
    assert w1_latency.tail_after_triggers([], [1.0]) == {}
