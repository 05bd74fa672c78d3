"""bench/all.py's peer W1 latency and recovery wiring, with the peers' scripts replaced
by a stub.

No peer runs: ``_run_peer`` (and for recovery ``_start_peer`` and
``kill_and_restart``) are monkeypatched, so this checks only which runs are asked for
(half of the checkpointed rate, the latency length, recovery on; the recovery runs'
kept state and attempts) and that their figures reach the results table.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
_saved_path = list(sys.path)
try:
    sys.path[:0] = [str(BENCH), str(BENCH / "peers")]
    _spec = importlib.util.spec_from_file_location("bench_all", BENCH / "all.py")
    assert _spec is not None and _spec.loader is not None
    bench_all = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(bench_all)
    import measure
    import report
finally:
    sys.path[:] = _saved_path


def _args(**overrides: Any) -> argparse.Namespace:
    args = {
        "w1_events": 1000,
        "parallelism": 2,
        "ss_rows_per_batch": 100,
        "peer_checkpoints": ("1", "0"),
        "no_latency": False,
        "no_recovery": True,
        "latency_seconds": 5.0,
        "kill_after": 3.0,
        "recovery_timeout": 30.0,
        "pyflink_recovery_events": 5000,
    }
    return argparse.Namespace(**{**args, **overrides})


def test_peer_latency_runs_at_half_the_checkpointed_rate_and_fills_the_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[str, str, list[str], bool]] = []
    rates = {"1": 60_000.0, "0": 150_000.0, "micro-batch": 500_000.0}

    def run_peer(
        system: str, script: str, argv: list[str], log_name: str, *, throughput: bool = True
    ) -> dict[str, Any]:
        calls.append((system, script, argv, throughput))
        if throughput:
            ck = argv[argv.index("--checkpoint") + 1] if "--checkpoint" in argv else "micro-batch"
            return {"events": 1, "seconds": 1.0, "rate": rates[ck]}
        rate = float(argv[argv.index("--rate") + 1])
        return {"latency_rate": rate, "samples": 10, "p50_ms": 500.0, "p99_ms": 990.0}

    monkeypatch.setattr(bench_all, "_run_peer", run_peer)
    doc: dict[str, Any] = {"rows": [], "latency": [], "recovery": []}
    results = measure.Results(str(tmp_path), "t", doc)
    for system in ("spark-ss", "bytewax"):
        bench_all._peer_w1(results, _args(), system)
    latency_calls = [(s, script, argv) for s, script, argv, tp in calls if not tp]
    assert latency_calls == [
        (
            "spark-ss",
            "spark_ss_job.py",
            [
                "B",
                "--parallelism",
                "2",
                "--rows-per-batch",
                "100",
                "--rate",
                "250000",
                "--seconds",
                "5.0",
            ],
        ),
        # Half of the rate with recovery on (1 s snapshots), not of the one without.
        (
            "bytewax",
            "bytewax_job.py",
            ["B", "--checkpoint", "1", "--rate", "30000", "--seconds", "5.0"],
        ),
    ]
    bench_all._peer_w1_latency(results, _args(), "pyflink", "PyFlink 2.3 SQL (p=2)", 200_000.0)
    text = report.markdown(doc)
    assert (
        "| W1 | Spark Structured Streaming (local[2]) | 500,000 |  |  | 500.0 / 990.0 (at 250,000) |"
        in text
    )
    assert (
        "| W1 | Bytewax 0.21 (1 worker) | 60,000 | 150,000 | 60 % | 500.0 / 990.0 (at 30,000) |"
        in text
    )
    assert "latency: not measured: of Flink SQL's built-in sinks" in text
    assert all(bench_all._expected_gap(r) for r in doc["latency"] if "error" in r)


def test_no_peer_latency_without_a_checkpointed_rate_or_with_no_latency(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing_peer(*_: Any, **__: Any) -> dict[str, Any]:
        raise RuntimeError("exited 1")

    monkeypatch.setattr(bench_all, "_run_peer", failing_peer)
    doc: dict[str, Any] = {"rows": [], "latency": [], "recovery": []}
    results = measure.Results(str(tmp_path), "t", doc)
    bench_all._peer_w1(results, _args(peer_checkpoints=("1",)), "bytewax")
    assert [r["error"] for r in doc["latency"]] == ["no checkpointed rate to take half of"]
    bench_all._peer_w1(results, _args(no_latency=True), "spark-ss")
    assert len(doc["latency"]) == 1


def _fake_restarts(
    monkeypatch: pytest.MonkeyPatch, figures: dict[str, Any]
) -> tuple[list[tuple[str, str, list[str], str]], list[tuple[str, float, float]]]:
    """Replace starting a peer and its kill-and-restart: each measurement starts
    attempts 0 and 1 and returns ``figures``. The starts and the measurements made."""
    started: list[tuple[str, str, list[str], str]] = []
    measured: list[tuple[str, float, float]] = []

    def start_peer(system: str, script: str, argv: list[str], log_name: str) -> Any:
        started.append((system, script, argv, log_name))
        return None

    def kill_and_restart(
        start: Any, probe: str, *, what: str, kill_after: float, timeout: float
    ) -> dict[str, Any]:
        start(0)
        start(1)
        measured.append((what, kill_after, timeout))
        return dict(figures)

    monkeypatch.setattr(bench_all, "_start_peer", start_peer)
    monkeypatch.setattr(bench_all, "kill_and_restart", kill_and_restart)
    return started, measured


def test_peer_recovery_restarts_each_peer_from_its_kept_state_and_fills_the_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    figures = {"recovery_s": 9.0, "resumed_s": 8.0, "restored": {"position": 1}}
    started, measured = _fake_restarts(monkeypatch, figures)
    monkeypatch.setattr(bench_all, "ensure_sequence_csv", lambda d, n, parts: f"{d}")
    doc: dict[str, Any] = {"rows": [], "latency": [], "recovery": []}
    results = measure.Results(str(tmp_path), "t", doc)
    for system, label in (
        ("pyflink", "PyFlink 2.3 SQL (p=2)"),
        ("spark-ss", "Spark Structured Streaming (local[2])"),
        ("bytewax", "Bytewax 0.21 (1 worker)"),
    ):
        bench_all._peer_w1_recovery(results, _args(no_recovery=False), system, label)
    assert [m[1:] for m in measured] == [(3.0, 30.0)] * 3
    by_system: dict[str, list[list[str]]] = {}
    for system, _script, argv, log_name in started:
        assert log_name == f"{system}-W1-recovery-{argv[argv.index('--attempt') + 1]}"
        by_system.setdefault(system, []).append(argv)
    for system, (first, restarted) in by_system.items():
        # The restarted process differs only in its attempt: the same probe, the same kept
        # checkpoints (a checkpoint directory, Spark's location, Bytewax's partition).
        at = first.index("--attempt") + 1
        assert (first[at], restarted[at]) == ("0", "1")
        assert first[:at] + first[at + 1 :] == restarted[:at] + restarted[at + 1 :]
        kept = "--recovery-dir" if system == "bytewax" else "--checkpoint-dir"
        assert kept in first and "--probe" in first
    pyflink = by_system["pyflink"][0]
    assert pyflink[pyflink.index("--n") + 1] == "5000"
    assert pyflink[pyflink.index("--checkpoint") + 1] == "1"
    text = report.markdown(doc)
    assert "| W1 | Bytewax 0.21 (1 worker) |  |  |  |  | 9.0 (8.0) |" in text
    assert all(r["restart"] == "process restarted at once" for r in doc["recovery"])


def test_peer_nexmark_runs_each_query_and_restarts_it_over_the_recovery_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every peer's throughput runs per query (a missing query is a row with its reason,
    no run) and, with recovery on, one kill-and-restart over the larger files."""
    runs: list[tuple[str, str, list[str]]] = []

    def run_peer(system: str, script: str, argv: list[str], log_name: str) -> dict[str, Any]:
        runs.append((system, script, argv))
        return {"events": 1, "seconds": 1.0, "rate": 100.0}

    monkeypatch.setattr(bench_all, "_run_peer", run_peer)
    started, _ = _fake_restarts(monkeypatch, {"recovery_s": 4.0, "resumed_s": 3.0})
    doc: dict[str, Any] = {"rows": [], "latency": [], "recovery": []}
    results = measure.Results(str(tmp_path), "t", doc)
    args = _args(no_recovery=False, queries=["q4", "q5"], nexmark_peer_recovery_events=2_000_000)
    for system in ("pyflink", "spark-ss", "bytewax"):
        bench_all._peer_nexmark(results, args, system, "/small", "/large")
    assert {(s, a[a.index("--query") + 1]) for s, _, a in runs} == {
        ("pyflink", "q4"),
        ("pyflink", "q5"),
        ("spark-ss", "q5"),
    }
    assert all("/small" in a for _, _, a in runs)
    pyflink_q5 = [a for s, _, a in runs if s == "pyflink" and "q5" in a]
    # Untuned and with Flink's Nexmark settings, alternating, per checkpoint setting.
    assert [(a[a.index("--checkpoint") + 1], "--set" in a) for a in pyflink_q5] == [
        ("1", False),
        ("1", True),
        ("0", False),
        ("0", True),
    ]
    errors = {(r["workload"], r["system"]): r["error"] for r in doc["rows"] if "error" in r}
    assert set(errors) == {
        ("nexmark q4", "Spark Structured Streaming (local[2])"),
        ("nexmark q4", "Bytewax 0.21 (1 worker)"),
        ("nexmark q5", "Bytewax 0.21 (1 worker)"),
    }
    restarted = {(s, a[a.index("--query") + 1]) for s, _, a, _ in started}
    assert restarted == {("pyflink", "q4"), ("pyflink", "q5"), ("spark-ss", "q5")}
    for system, _script, argv, log_name in started:
        assert "/large" in argv and "--probe" in argv and "--checkpoint-dir" in argv
        assert log_name.startswith(f"{system}-nexmark-q")
        if system == "spark-ss":
            assert argv[argv.index("--parts") + 1] == "16"  # 2 M events, parts of 125 k
        else:
            assert argv[argv.index("--checkpoint") + 1] == "1"
    assert [(r["workload"], r["recovery_s"]) for r in doc["recovery"]][:2] == [
        ("nexmark q4", 4.0),
        ("nexmark q5", 4.0),
    ]
