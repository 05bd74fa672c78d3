"""The benchmark harness's pure logic (bench/report.py, bench/measure.py) and the peer runner's log directory.

No Spark and no peer installs: the dict-loop peer runs on this interpreter in a real
subprocess over a few thousand events.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH / "peers"))
sys.path.insert(0, str(BENCH))
try:
    import measure
    import report
    import run as bench_run
finally:
    del sys.path[:2]


def _brute_force_w1(n: int) -> dict[int, int]:
    sums: dict[int, int] = {}
    for i in range(n):
        k = i * 7919 % 100_000
        sums[k] = sums.get(k, 0) + i % 1000
    return sums


@pytest.mark.parametrize("n", [0, 1, 999, 1000, 100_001, 250_123])
def test_w1_closed_form_matches_a_running_sum(n: int) -> None:
    expected = _brute_force_w1(n)
    assert report.w1_expected_sums(n) == expected
    assert report.w1_expected_total(n) == sum(expected.values())
    assert report.check_w1(n, expected) == {"keys": len(expected), "total": sum(expected.values())}


def test_w1_check_names_missing_extra_and_wrong_keys() -> None:
    good = _brute_force_w1(300_000)
    wrong = dict(good)
    k = next(iter(k for k, v in good.items() if v))
    wrong[k] += 1
    with pytest.raises(report.W1ResultError, match=rf"wrong sums \(first: key {k} has"):
        report.check_w1(300_000, wrong)
    missing = dict(good)
    del missing[k]
    with pytest.raises(report.W1ResultError, match="1 keys missing"):
        report.check_w1(300_000, missing)
    with pytest.raises(report.W1ResultError, match="unexpected keys"):
        report.check_w1(3, {0: 0, 7919: 1, 15838: 2, 5: 0})


def test_percentiles_are_nearest_rank() -> None:
    values = [float(x) for x in range(100, 0, -1)]  # 100..1, unsorted
    assert report.percentile(values, 50) == 50.0
    assert report.percentile(values, 99) == 99.0
    assert report.percentile(values, 100) == 100.0
    assert report.percentile([7.0], 1) == 7.0
    summary = report.latency_summary([0.002] * 98 + [0.5, 1.0])
    assert summary == {"samples": 100, "p50_ms": 2.0, "p99_ms": 500.0, "max_ms": 1000.0}
    with pytest.raises(ValueError, match="no values"):
        report.percentile([], 50)


def test_rate_series_bins_batches_and_fills_gaps() -> None:
    samples = [(10.05, 100), (10.2, 100), (10.3, 50), (11.1, 25)]
    assert report.rate_series(samples, bin_s=0.25) == [
        (10.0, 800.0),
        (10.25, 200.0),
        (10.5, 0.0),
        (10.75, 0.0),
        (11.0, 100.0),
    ]
    assert report.rate_series([]) == []


def _synthetic(
    kill: float, down_s: float, ramp_s: float, rate: float = 1000.0
) -> list[tuple[float, int]]:
    """A sink's batches: ``rate`` until the kill, nothing for ``down_s``, a linear ramp."""
    samples = []
    t = 0.0
    while t < kill + down_s + ramp_s + 5:
        if t < kill:
            r = rate
        elif t < kill + down_s:
            r = 0.0
        elif t < kill + down_s + ramp_s:
            r = rate * (t - kill - down_s) / ramp_s
        else:
            r = rate
        samples.append((t, round(r * 0.05)))
        t = round(t + 0.05, 6)
    return samples


def test_recovery_time_from_a_synthetic_throughput_series() -> None:
    series = report.rate_series(_synthetic(kill=10.0, down_s=4.0, ramp_s=2.0), bin_s=0.25)
    out = report.recovery_time(series, kill_at=10.0)
    assert out["baseline_rate"] == pytest.approx(1000.0)
    assert out["dipped"] is True
    # Back at 90 %: the trailing 1 s mean reaches 900/s once the ramp (90 % at 15.8 s) has
    # been above that for most of a second: between 16 and 17 s after the start.
    assert 6.0 <= out["recovery_s"] <= 7.0
    # Output at half the baseline again once the ramp passes 500/s: at 15 s.
    assert out["resumed_s"] == pytest.approx(5.25)
    never = report.rate_series(_synthetic(kill=10.0, down_s=60.0, ramp_s=1.0)[:300], bin_s=0.25)
    assert report.recovery_time(never, kill_at=10.0)["recovery_s"] is None
    with pytest.raises(ValueError, match="before the kill"):
        report.recovery_time(series, kill_at=0.1)


def test_results_table_renders_rates_overhead_latency_recovery_and_ratios() -> None:
    doc = {
        "machine": {"date": "2026-11-23T05:00:00+00:00", "nproc": 2, "cpu": "EPYC"},
        "command": "bench/all.py --quick",
        "rows": [
            {
                "workload": "W1",
                "system": "epochstream row",
                "checkpoints": "1 s",
                "rate": 900.0,
                "ours": True,
            },
            {
                "workload": "W1",
                "system": "epochstream row",
                "checkpoints": "off",
                "rate": 1000.0,
                "ours": True,
            },
            {"workload": "W1", "system": "PyFlink SQL", "checkpoints": "1 s", "rate": 300.0},
            {
                "workload": "W1",
                "system": "Bytewax",
                "checkpoints": "1 s",
                "error": "exited 1 | see log",
            },
            {"workload": "q1", "system": "dict loop", "checkpoints": "off", "rate": 4000.0},
            {
                "workload": "q1",
                "system": "epochstream row",
                "checkpoints": "off",
                "rate": 2000.0,
                "ours": True,
            },
        ],
        "latency": [
            {
                "workload": "W1",
                "system": "epochstream row",
                "p50_ms": 12.5,
                "p99_ms": 80.0,
                "latency_rate": 450.0,
            }
        ],
        "recovery": [
            {"workload": "W1", "system": "epochstream row", "recovery_s": 3.25, "resumed_s": 1.5},
            {"workload": "W1", "system": "PyFlink SQL", "recovery_s": 13.0, "resumed_s": 9.0},
        ],
    }
    summary = report.summary_rows(doc)
    assert [(r["workload"], r["system"]) for r in summary] == [
        ("W1", "epochstream row"),
        ("W1", "PyFlink SQL"),
        ("W1", "Bytewax"),
        ("q1", "epochstream row"),
        ("q1", "dict loop"),
    ]
    rows = {(r["workload"], r["system"]): r for r in summary}
    assert rows[("W1", "epochstream row")]["overhead_pct"] == pytest.approx(10.0)
    assert rows[("W1", "PyFlink SQL")]["ratios"] == {"epochstream row": 3.0}
    assert rows[("W1", "PyFlink SQL")]["recovery_ratios"] == {"epochstream row": 0.25}
    assert rows[("q1", "dict loop")]["recovery_ratios"] == {}
    assert rows[("q1", "dict loop")]["ratios"] == {"epochstream row": 0.5}
    text = report.markdown(doc)
    assert "Command: `bench/all.py --quick`" in text
    assert (
        "| W1 | epochstream row | 900 | 1,000 | 10 % | 12.5 / 80.0 (at 450) | 3.2 (1.5) |" in text
    )
    assert (
        "| W1 | PyFlink SQL | 300 |  |  |  | 13.0 (9.0) "
        "| epochstream row: 3.00x (recovery time 0.25x) |" in text
    )
    assert "ckpt 1 s: exited 1 / see log" in text  # a '|' would break the table
    assert text.count("\n| ") == 2 + 4  # header, rule, four (workload, system) rows


def test_dict_loop_peer_runs_with_a_fresh_log_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fresh machine has no venv directory yet: the dict loop (no install) must not
    fail opening its log there (it used to: FileNotFoundError .../dictloop-B.log)."""
    root = tmp_path / "not-yet" / "bench-venvs"
    monkeypatch.setenv("EPOCHSTREAM_BENCH_VENVS", str(root))
    out = bench_run._run_peer("dictloop", "B", ["--n", "5000"])
    assert out["events"] == 5000 and out["keys"] == 5000
    assert (root / "dictloop-B.log").exists()
    json.dumps(out)


def test_probe_sinks_report_through_files_for_rows_and_batches(tmp_path: Path) -> None:
    """The measuring sinks' writers, driven directly: rows and Arrow batches, read back."""
    import pyarrow as pa

    sys.path.insert(0, str(BENCH))
    try:
        import probes
    finally:
        sys.path.pop(0)
    import epochstream as es

    def ctx(subtask: int) -> es.sinks.SinkContext:
        return es.sinks.SinkContext(
            subtask_index=subtask, parallelism=2, attempt=0, job_id="j", checkpointing=True
        )

    rows = probes.SumsSink(str(tmp_path)).create_writer(ctx(0))
    rows.write_batch([(1, 5), (2, 7), (1, 9)])
    rows.end_input()
    rows.close()
    columnar = probes.SumsSink(str(tmp_path), columnar=True).create_writer(ctx(1))
    columnar.write_batch(pa.record_batch([pa.array([3, 4]), pa.array([1, 2])], names=["k", "v"]))
    columnar.write_batch(pa.record_batch([pa.array([3]), pa.array([6])], names=["k", "v"]))
    columnar.end_input()
    columnar.close()
    sums = {
        (line["subtask"], k): v
        for line in probes.read_probe(str(tmp_path), "sums")
        for k, v in line["sums"]
    }
    assert sums == {(0, 1): 9, (0, 2): 7, (1, 3): 6, (1, 4): 2}

    rate = probes.RateSink(str(tmp_path), columnar=True).create_writer(ctx(0))
    rate.write_batch(pa.record_batch([pa.array([1, 2, 3])], names=["k"]))
    rate.end_input()
    rate.close()
    (line,) = probes.read_probe(str(tmp_path), "rate")
    assert [n for _, n in line["samples"]] == [3]

    latency = probes.LatencySink(str(tmp_path), ts_index=2, per_batch=2).create_writer(ctx(1))
    now = time.time()
    # Two samples of the batch: its first and its last record.
    latency.write_batch([(0, 0, now - 0.5), (0, 0, now), (0, 0, now - 0.25)])
    latency.end_input()
    latency.close()
    (line,) = probes.read_probe(str(tmp_path), "latency")
    lat = sorted(x for _, x in line["samples"])
    assert len(lat) == 2 and 0.25 <= lat[0] < 0.3 and 0.5 <= lat[1] < 0.55


def test_nexmark_streams_read_from_files_equal_the_generated_ones(tmp_path: Path) -> None:
    """epochstream's Nexmark jobs read the peers' <kind>.parquet files: each kind's
    stream, rows or batches, equals the generator's events of that kind in order."""
    import epochstream as es

    sys.path.insert(0, str(BENCH))
    try:
        from nexmark.streams import KINDS, NexmarkStreams
    finally:
        sys.path.pop(0)
    config = es.sources.nexmark.NexmarkConfig(events=3000)
    es.sources.nexmark.write_nexmark_files(tmp_path / "files", config)
    env = es.Environment(parallelism=1, runner="local")
    sources = {
        "files-rows": NexmarkStreams.from_files(env, str(tmp_path / "files"), name="a"),
        "files-batches": NexmarkStreams.from_files(
            env, str(tmp_path / "files"), columnar=True, name="b"
        ),
        "generated-rows": NexmarkStreams.generated(env, config, name="c"),
    }
    for name, streams in sources.items():
        for kind in KINDS:
            stream = streams.of(kind)
            if streams.columnar:
                stream = stream.to_rows()
            stream.sink_to(es.sinks.FileSink(str(tmp_path / f"{name}-{kind}"))).uid(
                f"{name}-{kind}"
            )
    env.execute("nexmark-streams")
    for kind in KINDS:
        generated = es.testing.read_committed(tmp_path / f"generated-rows-{kind}")
        assert len(generated) == {"person": 60, "auction": 180, "bid": 2760}[kind]
        for name in ("files-rows", "files-batches"):
            rows = es.testing.read_committed(tmp_path / f"{name}-{kind}")
            assert [{k: v for k, v in r.items() if k != "_ts"} for r in rows] == generated, (
                name,
                kind,
            )


def test_stamp_sinks_sample_every_nth_record_across_batches_or_the_largest(tmp_path: Path) -> None:
    import probes
    import pyarrow as pa

    import epochstream as es

    ctx = es.sinks.SinkContext(
        subtask_index=1, parallelism=2, attempt=0, job_id="j", checkpointing=True
    )
    every = probes.StampSink(str(tmp_path), "stamps", field=0, every=3).create_writer(ctx)
    for batch in ([(0,), (1,)], [(2,), (3,), (4,), (5,), (6,)], [], [(7,)], [(8,), (9,)]):
        every.write_batch(batch)
    every.end_input()
    largest = probes.StampSink(
        str(tmp_path), "clock", field="t", columnar=True, largest=True
    ).create_writer(ctx)
    largest.write_batch(pa.record_batch({"t": [5, 9, 2]}))
    largest.end_input()
    (stamps,) = probes.read_probe(str(tmp_path), "stamps")
    assert [v for _, v in stamps["samples"]] == [0, 3, 6, 9] and stamps["subtask"] == 1
    (clock,) = probes.read_probe(str(tmp_path), "clock")
    assert [v for _, v in clock["samples"]] == [9]


def test_nexmark_results_are_ready_when_their_input_was_read() -> None:
    """Element results: the subtask that read the event up to it (the other one jumped
    past it); watermark results: every subtask past the time plus the bound; processing
    time: the window's end."""
    import nexmark_jobs

    clock = {
        0: [(1.0, 100), (2.0, 200), (3.0, 300), (9.0, 10_000)],  # reads 0..300, then a later block
        1: [(1.0, 4_000), (2.0, 4_100), (3.0, 4_200)],  # reads a block of later times
    }
    assert nexmark_jobs.ready_times(clock, [150, 4_050, 290], "element", 1_000) == [2.0, 2.0, 3.0]
    # Watermark: t + 1 + bound reached by both subtasks; past the end: never.
    assert nexmark_jobs.ready_times(clock, [3_099, 3_199, 20_000], "watermark", 1_000) == [
        9.0,
        9.0,
        None,
    ]
    assert nexmark_jobs.ready_times({}, [1_999], "processing", 4_000) == [2.0]


def test_results_of_a_run_made_in_parts_merge_into_one_document(tmp_path: Path) -> None:
    parts = []
    for i, system in enumerate(("epochstream row (p=2)", "PyFlink 2.3 SQL (p=2)")):
        doc = {
            "command": f"bench/all.py --only part{i}",
            "machine": {"cpus": 2},
            "settings": {"repeat": i + 1},
            "rows": [
                {"workload": "W1", "system": system, "checkpoints": "1 s", "rate": 10.0 * (i + 1)}
            ],
            "latency": [],
            "recovery": [{"workload": "W1", "system": system}] if i == 0 else [],
        }
        path = tmp_path / f"part{i}.json"
        path.write_text(json.dumps(doc))
        parts.append(str(path))
    merged = report.merge_documents(parts)
    assert [r["system"] for r in merged["rows"]] == [
        "epochstream row (p=2)",
        "PyFlink 2.3 SQL (p=2)",
    ]
    assert len(merged["recovery"]) == 1
    assert merged["command"] == "bench/all.py --only part0 ; bench/all.py --only part1"
    assert [p["settings"]["repeat"] for p in merged["parts"]] == [1, 2]


def test_runs_with_and_without_checkpoints_alternate_and_give_medians() -> None:
    calls: list[float | None] = []
    rates = iter([5.0, 50.0, 1.0, 30.0, 3.0, 40.0])

    def throughput(ck: float | None) -> dict[str, object]:
        calls.append(ck)
        return {"rate": next(rates), "ck": ck}

    runs = measure.alternating(throughput, 3)
    assert calls == [1.0, None, 1.0, None, 1.0, None]
    on = measure.median_of(runs[1.0])
    assert (on["rate"], on["rates"], on["ck"]) == (3.0, [5.0, 1.0, 3.0], 1.0)
    assert measure.median_of(runs[None])["rate"] == 40.0


def test_a_failed_run_is_kept_and_becomes_the_rows_error() -> None:
    def throughput(ck: float | None) -> dict[str, object]:
        if ck is None:
            raise RuntimeError("slot lost")
        return {"rate": 1.0}

    runs = measure.alternating(throughput, 2)
    assert len(runs[None]) == 2  # the series went on after the failure
    assert measure.median_of(runs[1.0])["rate"] == 1.0
    with pytest.raises(RuntimeError, match="slot lost"):
        measure.median_of(runs[None])


def test_steady_leaves_out_the_first_second_of_output() -> None:
    emitted = [(5.0, [0.9, 0.8]), (5.2, []), (5.99, [0.5]), (6.0, [0.1]), (7.5, [0.2, 0.3])]
    assert report.steady(emitted, 1.0) == [0.1, 0.2, 0.3]
    assert report.steady(emitted, 0.0) == [0.9, 0.8, 0.5, 0.1, 0.2, 0.3]
    # Output shorter than the warm-up: all of it rather than nothing.
    assert report.steady([(5.0, [0.9]), (5.5, [0.4])], 1.0) == [0.9, 0.4]
    assert report.steady([(5.0, [])], 1.0) == []
