"""Deduplication: Bloom filter false-positive rates, operator throughput, a Spark job.

1. False-positive rate of ``BloomFilter.sized(capacity, fp_rate)`` filled to its
   capacity (and to twice it), probed with 200,000 ids never added.
2. ``DeduplicateOperator`` driven directly (one subtask, heap and RocksDB backends):
   500,000 records of which 10 % redeliver an earlier id, in batches of 1,000.
3. On Spark (``local[2]``, parallelism 2, 1 s checkpoints): 1,000,000 events, 10 %
   redelivered, ``map -> deduplicate -> DiscardSink`` against the same job with a
   plain ``key_by().map`` in place of ``deduplicate`` (the keyed shuffle alone).

Example::

    .venv/bin/python bench/connectors/dedup_bench.py              # about 90 s
    .venv/bin/python bench/connectors/dedup_bench.py --no-spark   # parts 1 and 2
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from machine import machine_facts, machine_line  # noqa: E402

import epochstream as es  # noqa: E402
from epochstream.core.clock import SystemClock  # noqa: E402
from epochstream.graph.jobgraph import OperatorSpec  # noqa: E402
from epochstream.runtime.operator_outputs import Output  # noqa: E402
from epochstream.runtime.operators import OperatorContext, create_operator  # noqa: E402
from epochstream.runtime.operators.dedup import DedupSpec  # noqa: E402
from epochstream.state.backends.base import KeyedBackendContext  # noqa: E402
from epochstream.state.backends.heap.backend import HeapStateBackend  # noqa: E402
from epochstream.state.backends.rocksdb.backend import RocksDBStateBackend  # noqa: E402
from epochstream.state.bloom import BloomFilter  # noqa: E402
from epochstream.state.keyformat import encode_key  # noqa: E402
from epochstream.state.operator import OperatorStateStore  # noqa: E402


def event(position: int) -> dict[str, Any]:
    """Every 11th event redelivers an id of its block of 10 (10 % duplicates)."""
    block, slot = divmod(position, 11)
    return {"id": block * 10 + (3 if slot == 10 else slot), "position": position}


def false_positive_rates() -> list[dict[str, Any]]:
    rows = []
    probes = [encode_key(f"never-{i}") for i in range(200_000)]
    for capacity in (10_000, 100_000):
        for target in (0.01, 0.001):
            f = BloomFilter.sized(capacity, target)
            for fill in (1, 2):
                for i in range(capacity * (fill - 1), capacity * fill):
                    f.add(encode_key(f"id-{i}"))
                rate = sum(map(f.might_contain, probes)) / len(probes)
                rows.append(
                    {
                        "capacity": capacity,
                        "target": target,
                        "filled": capacity * fill,
                        "bits": f.bits,
                        "hashes": f.hashes,
                        "measured": rate,
                    }
                )
    return rows


class _Counter(Output):
    """The operator's output: counts what comes out (watermarks and idleness dropped)."""

    def __init__(self) -> None:
        self.count = 0

    def collect(self, batch: Any, timestamps: list[Any] | None = None) -> None:
        self.count += len(batch)

    def emit_watermark(self, watermark: int) -> None:
        """Not measured."""

    def emit_status(self, idle: bool) -> None:
        """Not measured."""


def operator_throughput(kind: str, records: int = 500_000, repeat: int = 3) -> dict[str, Any]:
    runs = []
    events = [event(i) for i in range(records)]
    for _ in range(repeat):
        with tempfile.TemporaryDirectory() as tmp:
            config = HeapStateBackend() if kind == "heap" else RocksDBStateBackend()
            backend = config.create(
                KeyedBackendContext(
                    operator_uid="dedup",
                    subtask=0,
                    max_parallelism=128,
                    key_group_range=range(128),
                    clock=SystemClock(),
                    local_dir=tmp,
                )
            )
            spec = OperatorSpec(
                uid="dedup",
                name="dedup",
                kind="deduplicate",
                payload=DedupSpec(dt.timedelta(hours=1), 1_000_000, 0.01),
                key_selector=lambda e: e["id"],
            )
            ctx = OperatorContext(
                subtask_index=0,
                parallelism=1,
                max_parallelism=128,
                attempt=0,
                job_id="bench",
                task_name="dedup",
                operator_state=OperatorStateStore(),
                keyed_backend=backend,
                checkpointing=True,
            )
            op = create_operator(spec, ctx)
            counter = _Counter()
            op.output = counter
            op.open()
            start = time.perf_counter()
            for i in range(0, records, 1000):
                op.process_batch(events[i : i + 1000], None)
            elapsed = time.perf_counter() - start
            op.close()
            assert counter.count == records // 11 * 10 + min(records % 11, 10), counter.count
            runs.append(records / elapsed)
    return {
        "backend": kind,
        "records": records,
        "records_per_s": statistics.median(runs),
        "runs": runs,
    }


def spark_jobs(events: int = 1_000_000, repeat: int = 3) -> list[dict[str, Any]]:
    from epochstream.deploy.spark import create_session

    spark = create_session("local[2]", app_name="dedup-bench")
    out: list[dict[str, Any]] = []
    try:
        for mode in ["warm-up", *(["deduplicate", "key_by only"] * repeat)]:
            with tempfile.TemporaryDirectory() as ckpt:
                env = es.Environment(parallelism=2, spark=spark)
                env.enable_checkpointing(1.0, storage=ckpt)
                stream = env.from_sequence(0, events).map(event)
                if mode == "key_by only":
                    stream = stream.key_by(lambda e: e["id"]).map(lambda e: e)
                else:
                    stream = stream.deduplicate(lambda e: e["id"], ttl=dt.timedelta(hours=1))
                stream.sink_to(es.sinks.DiscardSink())
                start = time.perf_counter()
                result = env.execute(f"dedup-bench-{mode}")
                elapsed = time.perf_counter() - start
            if mode != "warm-up":
                out.append(
                    {
                        "mode": mode,
                        "events": events,
                        "seconds": elapsed,
                        "events_per_s": events / elapsed,
                        "checkpoints": len(result.checkpoints),
                    }
                )
    finally:
        spark.stop()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-spark", action="store_true")
    parser.add_argument("--out", default=os.path.join(HERE, "dedup.json"))
    args = parser.parse_args()
    results: dict[str, Any] = {"machine": machine_facts(spark=not args.no_spark)}
    results["bloom"] = false_positive_rates()
    results["operator"] = [operator_throughput("heap"), operator_throughput("rocksdb")]
    if not args.no_spark:
        results["spark"] = spark_jobs()
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=2)
    print(machine_line(results["machine"]))
    print("| capacity | target | filled | bits | hashes | measured fp rate |")
    for r in results["bloom"]:
        print(
            f"| {r['capacity']:,} | {r['target']} | {r['filled']:,} | {r['bits']:,} | "
            f"{r['hashes']} | {r['measured']:.4f} |"
        )
    for r in results["operator"]:
        runs = ", ".join(f"{x:,.0f}" for x in r["runs"])
        print(f"operator {r['backend']}: {r['records_per_s']:,.0f} records/s ({runs})")
    for mode in ("deduplicate", "key_by only"):
        runs = [r for r in results.get("spark", []) if r["mode"] == mode]
        if runs:
            rates = [r["events_per_s"] for r in runs]
            print(
                f"spark {mode}: {statistics.median(rates):,.0f} events/s "
                f"({', '.join(f'{x:,.0f}' for x in rates)})"
            )


if __name__ == "__main__":
    main()
