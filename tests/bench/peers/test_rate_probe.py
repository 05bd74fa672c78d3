"""The peers' throughput probe (bench/peers/rate_probe.py): spreading a micro-batch over
its duration, and files the driver's ``probes.read_probe`` reads back.

Standard library only on the peer side; no peer is installed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[3] / "bench"
sys.path[:0] = [str(BENCH / "peers"), str(BENCH)]
try:
    import probes
    import rate_probe
finally:
    del sys.path[:2]


def test_spread_keeps_every_record_and_covers_the_batch() -> None:
    samples = rate_probe.spread(100.0, 100.8, 1_000_001)
    assert sum(n for _, n in samples) == 1_000_001
    assert len(samples) == 16
    assert samples[0][0] == pytest.approx(100.05) and samples[-1][0] == pytest.approx(100.8)
    assert max(n for _, n in samples) - min(n for _, n in samples) <= 1
    # A batch shorter than a step is one sample at its end.
    assert rate_probe.spread(5.0, 5.01, 7) == [(5.01, 7)]


def test_probe_files_read_back_with_the_drivers_reader(tmp_path: Path) -> None:
    first = rate_probe.RateProbe(str(tmp_path), attempt=0)
    first.add(10.0, 5)
    first.add(10.1, 6)
    first.close()
    restarted = rate_probe.RateProbe(str(tmp_path), attempt=1)
    restarted.add(20.0, 7)
    restarted.close()
    lines = probes.read_probe(str(tmp_path), "rate")
    assert [(ln["attempt"], ln["samples"]) for ln in lines] == [
        (0, [[10.0, 5], [10.1, 6]]),
        (1, [[20.0, 7]]),
    ]


def test_a_line_cut_short_by_a_kill_is_skipped(tmp_path: Path) -> None:
    probe = rate_probe.RateProbe(str(tmp_path), attempt=0)
    probe.add(1.0, 3)
    probe.flush()
    (path,) = tmp_path.glob("rate-0-0-*.jsonl")
    with open(path, "a", encoding="utf-8") as f:
        f.write('{"samples": [[2.0, ')  # the process died here
    assert [ln["samples"] for ln in probes.read_probe(str(tmp_path), "rate")] == [[[1.0, 3]]]


def test_restore_records_round_trip_and_are_absent_until_written(tmp_path: Path) -> None:
    assert rate_probe.read_restore(str(tmp_path), 1) is None
    rate_probe.write_restore(str(tmp_path), 1, {"checkpoint": "/ck/job/chk-7"})
    assert rate_probe.read_restore(str(tmp_path), 1) == {"checkpoint": "/ck/job/chk-7"}
    assert json.loads((tmp_path / "restore-1.json").read_text()) == {"checkpoint": "/ck/job/chk-7"}
