"""The columnar SQL window aggregation operator alone (no job around it): rows per
second on one core, next to the floor of the same partials with pyarrow alone (one hash
``group_by`` per batch by key columns and slice, no state, no firing).

Nexmark-like bids: 1,000 auctions x 200 bidders, event time 10,000 rows/s of event
time, in order; HOP(10 s, 2 s) by (auction, bidder) with COUNT(*), SUM(price),
MAX(price), AVG(price) and COUNT(DISTINCT channel); a watermark after every batch.
``--backend rocksdb`` keeps the slices in RocksDB (64 MB block cache) instead of the
heap backend's memory.

Example::

    PYTHONPATH=src .venv/bin/python bench/window_aggregate_operator.py --rows 1000000
    PYTHONPATH=src .venv/bin/python bench/window_aggregate_operator.py --backend rocksdb
"""

from __future__ import annotations

import argparse
import tempfile
import time
from typing import Any

import numpy as np
import pyarrow as pa

from epochstream.core.clock import SystemClock
from epochstream.core.events import MAX_WATERMARK
from epochstream.graph.jobgraph import OperatorSpec
from epochstream.graph.specs import AggCall, SliceWindowAggregateSpec, WindowTvf
from epochstream.graph.transformations import ColumnKeys
from epochstream.runtime.operator_outputs import Output
from epochstream.runtime.operators import OperatorContext, create_operator
from epochstream.state.backends.base import KeyedBackendContext, KeyedStateBackend
from epochstream.state.backends.heap.backend import HeapStateBackend
from epochstream.state.backends.rocksdb.backend import RocksDBStateBackend
from epochstream.state.operator import OperatorStateStore

SPEC = SliceWindowAggregateSpec(
    keys=("auction", "bidder"),
    window=WindowTvf.hop(10_000, 2_000),
    aggs=(
        AggCall("count_star", None, "bids"),
        AggCall("sum", "price", "total"),
        AggCall("max", "price", "top"),
        AggCall("avg", "price", "mean"),
        AggCall("count", "channel", "channels", distinct=True),
    ),
)


class _RowCount(Output):
    """The operator's output: counts the rows of what comes out."""

    def __init__(self) -> None:
        self.rows = 0

    def collect(self, batch: Any, timestamps: Any = None) -> None:
        self.rows += batch.num_rows

    def emit_watermark(self, watermark: int) -> None:
        pass

    def emit_status(self, idle: bool) -> None:
        pass


def _batches(rows: int, batch_size: int) -> list[pa.RecordBatch]:
    rng = np.random.default_rng(7)
    out = []
    for start in range(0, rows, batch_size):
        n = min(batch_size, rows - start)
        out.append(
            pa.record_batch(
                {
                    "auction": rng.integers(0, 1_000, n),
                    "bidder": rng.integers(0, 200, n),
                    "price": rng.integers(1, 10_000, n),
                    "channel": rng.integers(0, 20, n),
                    "_ts": (np.arange(start, start + n) // 10).astype(np.int64),
                }
            )
        )
    return out


def keyed_backend(kind: str, local_dir: str) -> KeyedStateBackend:
    """A keyed-state backend of ``kind`` (``heap`` or ``rocksdb``) for the one subtask."""
    config = RocksDBStateBackend() if kind == "rocksdb" else HeapStateBackend()
    return config.create(
        KeyedBackendContext(
            operator_uid="wa",
            subtask=0,
            max_parallelism=128,
            key_group_range=range(0, 128),
            clock=SystemClock(),
            local_dir=local_dir,
        )
    )


def operator_rate(
    batches: list[pa.RecordBatch], keyed: KeyedStateBackend
) -> tuple[float, float, int]:
    """Rows per second through the operator on ``keyed``, the share of it spent firing
    windows, and the rows it emitted."""
    spec = OperatorSpec(
        uid="wa",
        name="wa",
        kind="columnar_window_aggregate",
        payload=SPEC,
        key_selector=ColumnKeys(SPEC.keys),
    )
    ctx = OperatorContext(
        subtask_index=0,
        parallelism=1,
        max_parallelism=128,
        attempt=0,
        job_id="bench",
        task_name="wa",
        operator_state=OperatorStateStore(),
        keyed_backend=keyed,
    )
    op = create_operator(spec, ctx)
    out = op.output = _RowCount()
    op.open()
    began = time.perf_counter()
    firing = 0.0
    for batch in batches:
        op.process_batch(batch, None)
        fired = time.perf_counter()
        op.process_watermark(int(batch.column("_ts")[-1].as_py()) - 1)
        firing += time.perf_counter() - fired
    fired = time.perf_counter()
    op.process_watermark(MAX_WATERMARK)
    ended = time.perf_counter()
    firing += ended - fired
    rows = sum(b.num_rows for b in batches)
    return rows / (ended - began), firing / (ended - began), out.rows


def floor_rate(batches: list[pa.RecordBatch]) -> float:
    """Rows per second of the batch partials alone: one group_by by keys and slice."""
    began = time.perf_counter()
    for batch in batches:
        table = pa.table(
            {
                "auction": batch["auction"],
                "bidder": batch["bidder"],
                "slice": pa.array(batch["_ts"].to_numpy() // 2_000),
                "price": batch["price"],
            }
        )
        table.group_by(["auction", "bidder", "slice"], use_threads=False).aggregate(
            [([], "count_all"), ("price", "sum"), ("price", "max"), ("price", "count")]
        )
    return sum(b.num_rows for b in batches) / (time.perf_counter() - began)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--batch-size", type=int, default=65_536)
    parser.add_argument("--backend", choices=("heap", "rocksdb"), default="heap")
    args = parser.parse_args()
    batches = _batches(args.rows, args.batch_size)
    floor = floor_rate(batches)
    with tempfile.TemporaryDirectory() as scratch:
        keyed = keyed_backend(args.backend, f"{scratch}/db")
        try:
            rate, firing, emitted = operator_rate(batches, keyed)
        finally:
            keyed.dispose()
    print(
        f"{args.backend} operator: {rate:,.0f} rows/s ({emitted:,} window rows out, {firing:.0%} of the "
        "time firing windows)"
    )
    print(f"pyarrow group_by floor: {floor:,.0f} rows/s (operator at {rate / floor:.0%})")


if __name__ == "__main__":
    main()
