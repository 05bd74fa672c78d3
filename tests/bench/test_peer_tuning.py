"""Peers at their best: bench/all.py runs a peer untuned and with its published tuning
(``bench/peer_profiles.py``), the report quotes the better of the two and prints each
peer's handicap.

No peer runs: ``_run_peer`` is replaced by a fake that answers from a table of rates,
so this checks which runs are asked for, with which arguments, and what reaches the
results table.
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
    _spec = importlib.util.spec_from_file_location("bench_all_tuning", BENCH / "all.py")
    assert _spec is not None and _spec.loader is not None
    bench_all = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(bench_all)
    import measure
    import peer_profiles
    import pyflink_sql_job
    import report
finally:
    sys.path[:] = _saved_path

FLINK_NEXMARK_SETTINGS = [
    "--set",
    "table.exec.mini-batch.enabled=true",
    "--set",
    "table.exec.mini-batch.allow-latency=2s",
    "--set",
    "table.exec.mini-batch.size=50000",
    "--set",
    "table.optimizer.distinct-agg.split.enabled=true",
]
TUNED = "tuned: Flink's Nexmark settings"


def _args(**overrides: Any) -> argparse.Namespace:
    args = {
        "w1_events": 1000,
        "parallelism": 2,
        "ss_rows_per_batch": 100,
        "peer_checkpoints": ("1", "0"),
        "no_latency": True,
        "no_recovery": True,
        "queries": ["q4"],
    }
    return argparse.Namespace(**{**args, **overrides})


def _fake_peer(
    monkeypatch: pytest.MonkeyPatch, rates: dict[tuple[str, bool], float]
) -> list[tuple[str, str, list[str]]]:
    """Replace the peer runner: the rate of a run is ``rates[(checkpoint, tuned)]``
    (Spark's micro-batch runs: ``("micro-batch", False)``); every call is recorded."""
    calls: list[tuple[str, str, list[str]]] = []

    def run_peer(system: str, script: str, argv: list[str], log_name: str) -> dict[str, Any]:
        calls.append((system, script, argv))
        ck = argv[argv.index("--checkpoint") + 1] if "--checkpoint" in argv else "micro-batch"
        return {"events": 1000, "seconds": 1.0, "rate": rates[(ck, "--set" in argv)]}

    monkeypatch.setattr(bench_all, "_run_peer", run_peer)
    return calls


def _results(tmp_path: Path) -> Any:
    return measure.Results(str(tmp_path), "t", {"rows": [], "latency": [], "recovery": []})


def test_pyflink_runs_untuned_and_with_flinks_nexmark_settings_alternating(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _fake_peer(
        monkeypatch, {("1", False): 1.0, ("1", True): 2.0, ("0", False): 3.0, ("0", True): 4.0}
    )
    results = _results(tmp_path)
    bench_all._peer_nexmark(results, _args(), "pyflink", "/files", "")
    argvs = [argv for _, _, argv in calls]
    base = ["nexmark", "--path", "/files", "--query", "q4", "--parallelism", "2"]
    assert argvs == [
        [*base, "--checkpoint", "1"],
        [*base, "--checkpoint", "1", *FLINK_NEXMARK_SETTINGS],
        [*base, "--checkpoint", "0"],
        [*base, "--checkpoint", "0", *FLINK_NEXMARK_SETTINGS],
    ]
    rows = results.doc["rows"]
    assert [(r["checkpoints"], r["tuning"], r["rate"]) for r in rows] == [
        ("1 s", "untuned", 1.0),
        ("1 s", TUNED, 2.0),
        ("off", "untuned", 3.0),
        ("off", TUNED, 4.0),
    ]
    assert all(r["handicap"].startswith("reads CSV") for r in rows)


def test_the_settings_reach_the_flink_job_as_key_value_pairs() -> None:
    """What the harness passes is what the job's ``--set`` parses (and ``conf.set``s)."""
    pairs = FLINK_NEXMARK_SETTINGS[1::2]
    assert [pyflink_sql_job._setting(p) for p in pairs] == list(
        peer_profiles.FLINK_NEXMARK.settings
    )
    assert pyflink_sql_job._setting("a=b=c") == ("a", "b=c")
    with pytest.raises(argparse.ArgumentTypeError):
        pyflink_sql_job._setting("no-value")


def test_a_peer_without_a_published_tuning_runs_once_with_its_handicap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _fake_peer(
        monkeypatch, {("micro-batch", False): 5.0, ("1", False): 6.0, ("0", False): 7.0}
    )
    results = _results(tmp_path)
    bench_all._peer_w1(results, _args(), "spark-ss")
    bench_all._peer_w1(results, _args(), "bytewax")
    assert [system for system, _, _ in calls] == ["spark-ss", "bytewax", "bytewax"]
    assert not any("--set" in argv for _, _, argv in calls)
    spark, *bytewax = results.doc["rows"]
    assert "tuning" not in spark and spark["handicap"].startswith("micro-batches")
    assert spark["settings"] == "spark.sql.shuffle.partitions = parallelism"
    assert all(r["handicap"].startswith("1 worker") for r in bytewax)


def test_every_peer_has_a_handicap_and_the_dict_loop_none() -> None:
    for system in bench_all.SYSTEMS:
        if system in ("epochstream", "dictloop"):
            assert system not in peer_profiles.PROFILES
        else:
            assert peer_profiles.PROFILES[system].handicap


@pytest.mark.parametrize(
    ("tunings", "better"),
    [
        ({"untuned": {"rate_on": 2.0}, "tuned": {"rate_on": 3.0}}, "tuned"),
        (
            {
                "untuned": {"rate_on": 3.0, "rate_off": 1.0},
                "tuned": {"rate_on": 2.0, "rate_off": 9.0},
            },
            "untuned",
        ),
        ({"untuned": {"rate_on": 2.0}, "tuned": {"rate_on": 2.0}}, "untuned"),  # tie: first
        ({"untuned": {"rate_off": 1.0}, "tuned": {"rate_off": 4.0}}, "tuned"),  # none on
        ({"untuned": {"rate_off": 9.0}, "tuned": {"rate_on": 1.0}}, "tuned"),  # on compares
        ({"untuned": {}, "tuned": {}}, None),
    ],
)
def test_better_tuning(tunings: dict[str, dict[str, float]], better: str | None) -> None:
    assert report.better_tuning(tunings) == better


def test_the_table_quotes_the_better_tuning_in_the_ratio_and_shows_both(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Tuned is better with checkpoints, untuned without: the ratio takes the tuned run.
    _fake_peer(
        monkeypatch,
        {("1", False): 100.0, ("1", True): 200.0, ("0", False): 400.0, ("0", True): 300.0},
    )
    results = _results(tmp_path)
    results.doc["rows"] += [
        {
            "workload": "nexmark q4",
            "system": "ours",
            "ours": True,
            "checkpoints": "1 s",
            "rate": 1000.0,
        },
        {
            "workload": "nexmark q4",
            "system": "ours",
            "ours": True,
            "checkpoints": "off",
            "rate": 1000.0,
        },
    ]
    bench_all._peer_nexmark(results, _args(), "pyflink", "/files", "")
    (flink,) = [e for e in report.summary_rows(results.doc) if not e["ours"]]
    assert flink["tuning"] == TUNED
    assert (flink["rate_on"], flink["rate_off"]) == (200.0, 300.0)
    assert flink["ratios"] == {"ours": 5.0}
    assert flink["tunings"] == {
        "untuned": {"rate_on": 100.0, "events_on": 1000, "rate_off": 400.0, "events_off": 1000},
        TUNED: {"rate_on": 200.0, "events_on": 1000, "rate_off": 300.0, "events_off": 1000},
    }
    table = report.markdown(results.doc)
    (line,) = [ln for ln in table.splitlines() if "PyFlink" in ln]
    assert f"better: {TUNED}" in line
    assert "untuned: 100 / 400" in line and f"{TUNED}: 200 / 300" in line
    assert "ours: 5.00x" in line
    assert "reads CSV (the PyFlink wheel has no Parquet format)" in line


def test_a_failed_tuned_run_leaves_the_untuned_figure_and_names_the_tuning(
    tmp_path: Path,
) -> None:
    doc = {
        "rows": [
            {
                "workload": "W1",
                "system": "f",
                "checkpoints": "1 s",
                "tuning": "untuned",
                "rate": 5.0,
            },
            {
                "workload": "W1",
                "system": "f",
                "checkpoints": "1 s",
                "tuning": "tuned",
                "error": "boom",
            },
        ]
    }
    (e,) = report.summary_rows(doc)
    assert (e["tuning"], e["rate_on"]) == ("untuned", 5.0)
    assert e["errors"] == ["ckpt 1 s, tuned: boom"]
