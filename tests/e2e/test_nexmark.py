"""Nexmark end to end on Spark: every query (bench/nexmark/queries.py) over generated
events, and the columnar ones (bench/nexmark/columnar.py) over columnar sources, equal their DuckDB oracle
(bench/nexmark/oracle.py) over the Parquet files of the same events; and stateful
queries, row and columnar (sessions, processing-time windows), survive a crash or a
SIGKILL with exactly-once output.
"""

from __future__ import annotations

import collections
import sys
from pathlib import Path
from typing import Any

import cloudpickle
import numpy as np
import pyarrow.parquet as pq
import pytest
from e2e_support import run_with_slot_killed

import epochstream as es

pytestmark = [pytest.mark.slow, pytest.mark.spark]

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import nexmark  # noqa: E402
from nexmark import columnar, oracle, queries, streams  # noqa: E402

# Slots cannot import the bench folder: its functions travel by value, like a user's script.
cloudpickle.register_pickle_by_value(nexmark)

# 40 s of event time (4 tumbling windows, sessions that close), out of order by up to
# 2 s: below the 4 s watermark bound, so no record is late and the oracle needs no lateness.
CONFIG = es.sources.nexmark.NexmarkConfig(
    events=20_000, seed=5, events_per_second=500, out_of_order_group_size=1_000
)


COLUMNS = {
    "q0": ["auction", "bidder", "price", "date_time", "extra"],
    "q1": ["auction", "bidder", "price", "date_time", "extra"],
    "q2": ["auction", "price"],
    "q3": ["name", "city", "state", "auction"],
    "q5": ["window_start", "auction", "count"],
    "q8": ["id", "name", "window_start"],
    "q11": ["bidder", "count", "window_start", "window_end"],
    "q12": ["bidder", "count", "window_start", "window_end"],
}


@pytest.fixture(scope="module")
def nexmark_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("nexmark")
    es.sources.nexmark.write_nexmark_files(path, CONFIG)
    return path


def test_the_events_stay_within_the_watermark_bound(nexmark_files: Path) -> None:
    """The oracle ignores lateness: no event may come later than the watermark bound."""
    times = (
        pq.read_table(nexmark_files / "events.parquet", columns=["date_time"]).column(0).to_numpy()
    )
    behind = np.maximum.accumulate(times) - times
    assert 0 < behind.max() < streams.WATERMARK_BOUND_MS


def test_every_query_equals_the_duckdb_oracle(
    spark: Any, tmp_path: Path, nexmark_files: Path
) -> None:
    env = es.Environment(parallelism=2, spark=spark)
    rows = streams.NexmarkStreams.generated(env, CONFIG)
    for name, query in queries.QUERIES.items():
        query(rows).sink_to(es.sinks.FileSink(str(tmp_path / name))).uid(f"sink-{name}")
    batches = streams.NexmarkStreams.generated(env, CONFIG, columnar=True, batch_size=4_096)
    for name, query in columnar.COLUMNAR_QUERIES.items():
        columns = COLUMNS[name]
        (
            query(batches)
            .to_rows()
            .map(lambda row, columns=columns: [row[c] for c in columns])
            .sink_to(es.sinks.FileSink(str(tmp_path / f"{name}-columnar")))
            .uid(f"sink-{name}-columnar")
        )
    env.execute("nexmark-all")
    for name in queries.QUERIES:
        got = oracle.canonical(name, es.testing.read_committed(tmp_path / name))
        expected = oracle.expected(name, nexmark_files)
        assert got == expected, name
        assert expected, f"{name} has no result rows over these events"
    for name in columnar.COLUMNAR_QUERIES:
        got = oracle.canonical(name, es.testing.read_committed(tmp_path / f"{name}-columnar"))
        assert got == oracle.expected(name, nexmark_files), f"{name} columnar"


def test_stateful_queries_after_a_crash_write_each_result_once(
    spark: Any, tmp_path: Path, nexmark_files: Path, failure_markers: str
) -> None:
    env = es.Environment(parallelism=2, spark=spark)
    env.enable_checkpointing(0.3, storage=str(tmp_path / "ckpt"))
    env.set_restart_strategy(es.restart.fixed_delay(attempts=3, delay=0.2))
    crash = es.testing.FailOnce(
        after_records=4_000, after_checkpoints=2, subtask=1, crash=True, marker_dir=failure_markers
    )

    def make(kind: str, strategy: es.WatermarkStrategy) -> es.DataStream:
        source = es.sources.NexmarkSource(CONFIG, kind=kind, rate=8_000)
        events = env.from_source(source, name=f"nexmark-{kind}", watermark_strategy=strategy)
        return events.map(crash) if kind == "bid" else events

    rows = streams.NexmarkStreams(make)
    for name in ("q4", "q5", "q11"):
        queries.QUERIES[name](rows).sink_to(es.sinks.FileSink(str(tmp_path / name))).uid(
            f"sink-{name}"
        )
    result = env.execute("nexmark-crash")
    assert result.restarts == 1
    for name in ("q5", "q11"):
        assert oracle.canonical(
            name, es.testing.read_committed(tmp_path / name)
        ) == oracle.expected(name, nexmark_files), name
    q4 = es.testing.read_committed(tmp_path / "q4")
    assert oracle.canonical("q4", q4) == oracle.expected("q4", nexmark_files)
    # Every update of a category's average once: its running counts are exactly 1..n.
    counts = collections.defaultdict(list)
    for category, _, count in q4:
        counts[category].append(count)
    assert all(sorted(c) == list(range(1, len(c) + 1)) for c in counts.values())


def test_columnar_sessions_and_processing_time_windows_after_a_sigkill(
    spark: Any, tmp_path: Path, nexmark_files: Path
) -> None:
    """Columnar q11 (sessions) and q12 (processing-time windows) with checkpoints and a
    slot SIGKILLed: the sessions are the oracle's, each written once, and the processing-
    time windows restored from the checkpoint lose and repeat no bid."""
    env = es.Environment(parallelism=2, spark=spark)
    env.enable_checkpointing(0.3, storage=str(tmp_path / "ckpt"))
    env.set_restart_strategy(es.restart.fixed_delay(attempts=3, delay=0.2))

    def make(kind: str, strategy: es.WatermarkStrategy) -> es.DataStream:
        source = es.sources.NexmarkSource(CONFIG, batch_size=512, kind=kind, rate=6_000)
        return env.from_source(source, name=f"nexmark-{kind}", watermark_strategy=strategy)

    batches = streams.NexmarkStreams(make, columnar=True)  # one bid source feeds both queries
    for name in ("q11", "q12"):
        columns = COLUMNS[name]
        (
            columnar.COLUMNAR_QUERIES[name](batches)
            .to_rows()
            .map(lambda row, columns=columns: [row[c] for c in columns])
            .sink_to(es.sinks.FileSink(str(tmp_path / name)))
            .uid(f"sink-{name}")
        )
    result = run_with_slot_killed(env, "nexmark-columnar-sigkill")
    assert result.restarts >= 1
    for name in ("q11", "q12"):
        got = oracle.canonical(name, es.testing.read_committed(tmp_path / name))
        assert got == oracle.expected(name, nexmark_files), name
