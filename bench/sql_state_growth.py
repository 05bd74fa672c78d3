"""State size and checkpoint duration of an updating Nexmark SQL query over a long run.

Runs Flink's ``tests/sql/nexmark/qN.sql`` (q4 by default; its ``blackhole`` result
table and INSERT unchanged) through epochstream's ``execute_sql`` over the ``nexmark``
connector's ``bid``/``auction``/``person`` tables with a wall-clock ``rate`` (positions/s
in total, the table's sources each reading every position and keeping their kind), so
the job runs for ``--minutes`` at a steady input rate and does not end by itself.
``--state-ttl`` sets ``table.exec.state.ttl`` first (the join and GROUP BY state then
expire that long after they were last written).
Parallelism 2, a checkpoint every ``--interval`` seconds on the chosen state backend
(``rocksdb``, incremental, or ``heap``). Every ``--sample`` seconds it reads the job's
checkpoint statistics (``client.checkpoint_stats()``, what the REST API and
``epochstream checkpoints`` show) and the source metrics, and prints one table row: the
latest completed checkpoint's state size (all tasks), the bytes it wrote, its duration
(trigger to completion) and the largest synchronous / asynchronous part of any task,
the largest task's state, the mean duration of the checkpoints since the previous row,
and the events the sources have emitted. At the end the job is cancelled; ``--json``
keeps every checkpoint's figures.

Example::

    PYTHONPATH=src .venv/bin/python bench/sql_state_growth.py --query q4 --minutes 10 \\
        --rate 10000 --interval 10 --backend rocksdb
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from nexmark_jobs import SCRATCH  # noqa: E402
from sql_nexmark import TABLES, flink_query  # noqa: E402

import epochstream as es  # noqa: E402

#: Spare input beyond the run's length, so that the source never ends inside it.
SPARE_S = 300


def nexmark_table_ddl(kind: str, events: int, rate: int) -> str:
    """``CREATE TABLE kind`` over the ``nexmark`` connector, Flink's column names and
    Nexmark's 4 s watermark, ``rate`` positions/s of wall time.

    Example: ``nexmark_table_ddl("bid", 1_000_000, 10_000)``
    """
    columns = ", ".join(f"`{name}` {sql_type}" for name, sql_type, _ in TABLES[kind])
    return (
        f"CREATE TABLE {kind} ({columns}, "
        "WATERMARK FOR `dateTime` AS `dateTime` - INTERVAL '4' SECOND) "
        f"WITH ('connector' = 'nexmark', 'kind' = '{kind}', 'events.num' = '{events}', "
        f"'rate' = '{rate}', 'first-event.rate' = '10000')"
    )


@dataclass(frozen=True)
class Sample:
    """One table row: the job's latest checkpoint when it was taken."""

    elapsed_s: float
    checkpoint_id: int
    state_bytes: int
    written_bytes: int
    duration_s: float
    max_sync_s: float
    max_async_s: float
    largest_task: str
    largest_task_bytes: int
    mean_duration_s: float
    source_events: int

    def line(self) -> str:
        """A markdown row."""
        return (
            f"| {self.elapsed_s / 60:.1f} | {self.source_events / 1e6:.2f} M | "
            f"{self.checkpoint_id} | {self.state_bytes / 2**20:.1f} | "
            f"{self.written_bytes / 2**20:.1f} | {self.duration_s:.2f} | "
            f"{self.mean_duration_s:.2f} | {self.max_sync_s:.2f} | {self.max_async_s:.2f} | "
            f"{self.largest_task} {self.largest_task_bytes / 2**20:.1f} |"
        )


HEADER = (
    "| min | events emitted | checkpoint | state MiB | written MiB | duration s | "
    "mean duration s since last row | max sync s | max async s | largest task (MiB) |\n"
    "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
)


def _source_events(client: Any) -> int:
    return sum(int(v["records_out"]) for v in client.metrics() if v.get("is_source"))


def _sample(client: Any, elapsed: float, previous_id: int) -> Sample | None:
    stats = client.checkpoint_stats()
    if not stats:
        return None
    last = stats[-1]
    recent = [s.duration for s in stats if s.checkpoint_id > previous_id] or [last.duration]
    largest = last.largest_task or "-"
    return Sample(
        elapsed_s=elapsed,
        checkpoint_id=last.checkpoint_id,
        state_bytes=last.state_size,
        written_bytes=sum(t.bytes_written for t in last.tasks.values()),
        duration_s=last.duration,
        max_sync_s=last.max_sync_s,
        max_async_s=last.max_async_s,
        largest_task=largest,
        largest_task_bytes=last.tasks[largest].state_size if largest in last.tasks else 0,
        mean_duration_s=sum(recent) / len(recent),
        source_events=_source_events(client),
    )


def run(args: argparse.Namespace, spark: Any) -> dict[str, Any]:
    """One run of ``args.query`` on ``args.backend``; its samples and checkpoints."""
    env = es.Environment(parallelism=args.parallelism, runner="spark", spark=spark)
    storage = os.path.join(SCRATCH, f"ck-state-growth-{args.query}-{args.backend}")
    shutil.rmtree(storage, ignore_errors=True)  # a leftover would be restored
    env.enable_checkpointing(args.interval, storage=storage)
    backend = (
        es.state.RocksDBStateBackend(incremental=True)
        if args.backend == "rocksdb"
        else es.state.HeapStateBackend()
    )
    env.set_state_backend(backend)
    events = args.rate * (int(args.minutes * 60) + SPARE_S)
    q = flink_query(args.query)
    tables = [nexmark_table_ddl(kind, events, args.rate) for kind in TABLES]
    env.execute_sql(";\n".join([*tables, q.sink_ddl, *q.views]))
    if args.state_ttl:
        env.execute_sql(f"SET 'table.exec.state.ttl' = '{args.state_ttl}'")
    sink = re.match(r"CREATE\s+TABLE\s+(\S+)", q.sink_ddl, flags=re.I)
    assert sink is not None
    client = env.execute_sql(f"INSERT INTO {sink.group(1)} {q.select}", wait=False)
    start = time.monotonic()
    samples: list[Sample] = []
    print(HEADER, flush=True)
    try:
        while (elapsed := time.monotonic() - start) < args.minutes * 60:
            time.sleep(min(args.sample, max(args.minutes * 60 - elapsed, 0.1)))
            if client.done:
                raise RuntimeError(f"the job ended early: {client.failures}")
            sample = _sample(
                client, time.monotonic() - start, samples[-1].checkpoint_id if samples else 0
            )
            if sample is not None:
                samples.append(sample)
                print(sample.line(), flush=True)
        checkpoints = [s.to_dict() for s in client.checkpoint_stats()]
        restarts = client.attempt - 1
    finally:
        client.cancel()  # its checkpoints stay in ``storage`` until the next run
    return {
        "query": args.query,
        "backend": args.backend,
        "rate": args.rate,
        "interval_s": args.interval,
        "state_ttl": args.state_ttl,
        "restarts": restarts,
        "samples": [s.__dict__ for s in samples],
        "checkpoints": checkpoints,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--query", default="q4")
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rate", type=int, default=10_000, help="positions/s (wall time)")
    parser.add_argument("--interval", type=float, default=10.0, help="checkpoint interval, s")
    parser.add_argument("--sample", type=float, default=60.0, help="seconds between rows")
    parser.add_argument("--backend", choices=["rocksdb", "heap"], default="rocksdb")
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument(
        "--state-ttl", default="", help="SET 'table.exec.state.ttl' to this (e.g. '60 s')"
    )
    parser.add_argument("--json", default="", help="write every checkpoint's figures here")
    args = parser.parse_args()

    from epochstream.deploy.spark import create_session

    spark = create_session(f"local[{args.parallelism}]", app_name="epochstream-state-growth")
    try:
        out = run(args, spark)
    finally:
        spark.stop()
    print(
        f"\n{args.query}, {args.backend}, {args.rate:,} positions/s, checkpoints every "
        f"{args.interval:g} s, p={args.parallelism}, state TTL {args.state_ttl or 'none'}, "
        f"restarts {out['restarts']}"
    )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
