"""The columnar interval join (``columnar_equi_join`` with ``IntervalBounds``) alone:
rows per second on one core, no job around it, against a floor in the same run: one
pyarrow (Acero) hash join of all rows of both sides at once, then the interval filter
(no state, no watermark, no batches).

Bids and auctions, half the rows each: event time at 10,000 rows/s per side, out of
order by up to 500 ms; keys ``(auction, channel)`` (2 channels), ``--per-key`` rows
of an auction per side, close in time; ``bid._ts BETWEEN auction._ts - 2 s AND auction._ts + 2
s``; a watermark 1 s behind the latest row after every batch of each side. The
batches carry their key groups (``_kg``), as a hash edge delivers them.

Example::

    PYTHONPATH=src .venv/bin/python bench/interval_join_operator.py --rows 1000000
    PYTHONPATH=src .venv/bin/python bench/interval_join_operator.py --backend rocksdb
"""

from __future__ import annotations

import argparse
import tempfile
import time
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from epochstream.core.clock import SystemClock
from epochstream.core.events import MAX_WATERMARK
from epochstream.graph.jobgraph import OperatorSpec
from epochstream.graph.specs import EquiJoinSpec, IntervalBounds
from epochstream.graph.transformations import ColumnKeys
from epochstream.runtime.columnar_routing import with_key_groups
from epochstream.runtime.operator_outputs import Output
from epochstream.runtime.operators import OperatorContext, create_operator
from epochstream.state.backends.base import KeyedBackendContext, KeyedStateBackend
from epochstream.state.backends.heap.backend import HeapStateBackend
from epochstream.state.backends.rocksdb.backend import RocksDBStateBackend
from epochstream.state.operator import OperatorStateStore

LOWER, UPPER = -2_000, 2_000


class _RowCount(Output):
    """The operator's output: counts the rows of what comes out."""

    def __init__(self) -> None:
        self.rows = 0

    def collect(self, batch: Any, timestamps: Any = None) -> None:
        self.rows += batch.num_rows

    def emit_watermark(self, watermark: int) -> None:
        """Not measured."""

    def emit_status(self, idle: bool) -> None:
        """Not measured."""


def side(rows: int, seed: int, per_key: int) -> pa.Table:
    """``rows`` rows ``(auction, channel, price, _ts)`` in arrival order, about
    ``per_key`` rows per auction, close in time."""
    rng = np.random.default_rng(seed)
    pos = np.arange(rows)
    times = pos // 10 + rng.integers(0, 500, rows)  # 10 rows per ms, 500 ms out of order
    auctions = pos // per_key + rng.integers(0, per_key, rows)
    return pa.table(
        {
            "auction": pa.array(auctions, pa.int64()),
            "channel": pa.array(rng.integers(0, 2, rows), pa.int64()),
            "price": pa.array(rng.integers(1, 10_000, rows), pa.int64()),
            "_ts": pa.array(times, pa.int64()),
        }
    )


def keyed_backend(kind: str, local_dir: str) -> KeyedStateBackend:
    config = RocksDBStateBackend() if kind == "rocksdb" else HeapStateBackend()
    return config.create(
        KeyedBackendContext(
            operator_uid="join",
            subtask=0,
            max_parallelism=128,
            key_group_range=range(0, 128),
            clock=SystemClock(),
            local_dir=local_dir,
        )
    )


def run(
    left: pa.Table, right: pa.Table, batch_size: int, keyed: KeyedStateBackend
) -> tuple[float, int]:
    """Rows/s through the operator and the pairs it emitted."""
    keys = ("auction", "channel")
    payload = EquiJoinSpec(
        keys,
        keys,
        (("auction", "auction"), ("channel", "channel"), ("price", "bid_price")),
        (("price", "reserve"),),
        retention=IntervalBounds(LOWER, UPPER),
    )
    spec = OperatorSpec(
        uid="join",
        name="join",
        kind="columnar_equi_join",
        payload=payload,
        key_selector=ColumnKeys(keys),
        input_key_selectors=[ColumnKeys(keys), ColumnKeys(keys)],
    )
    ctx = OperatorContext(
        subtask_index=0,
        parallelism=1,
        max_parallelism=128,
        attempt=0,
        job_id="bench",
        task_name="join",
        operator_state=OperatorStateStore(),
        keyed_backend=keyed,
    )
    op = create_operator(spec, ctx)
    emitted = op.output = _RowCount()
    op.open()
    # Key groups as the hash edge in front of the join adds them (paid upstream in a job).
    sides = [
        [with_key_groups(b, ColumnKeys(keys), 128) for b in t.to_batches(batch_size)]
        for t in (left, right)
    ]
    latest = 0
    start = time.perf_counter()
    for pair in zip(*sides, strict=False):
        for index, batch in enumerate(pair):
            op.process_input(index, batch, None)
            latest = max(latest, int(pc.max(batch.column("_ts")).as_py()))
        op.process_watermark(latest - 1_000)
    op.process_watermark(MAX_WATERMARK)
    return (left.num_rows + right.num_rows) / (time.perf_counter() - start), emitted.rows


def floor(left: pa.Table, right: pa.Table) -> tuple[float, int]:
    """Rows/s of one Acero hash join of both whole sides, then the interval filter."""
    start = time.perf_counter()
    joined = left.join(
        right, keys=["auction", "channel"], join_type="inner", right_suffix="_r", use_threads=False
    )
    gap = pc.subtract(joined["_ts"], joined["_ts_r"])
    pairs = joined.filter(pc.and_(pc.greater_equal(gap, LOWER), pc.less_equal(gap, UPPER)))
    return (left.num_rows + right.num_rows) / (time.perf_counter() - start), pairs.num_rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="both sides together")
    parser.add_argument("--batch-sizes", default="4096,16384,65536")
    parser.add_argument("--backend", choices=("heap", "rocksdb"), default="heap")
    parser.add_argument("--per-key", type=int, default=4)
    args = parser.parse_args()
    left, right = side(args.rows // 2, 1, args.per_key), side(args.rows // 2, 2, args.per_key)
    rate, pairs = floor(left, right)
    print(f"floor (one Acero join + filter): {rate / 1e6:.2f} M rows/s ({pairs} pairs)")
    for size in (int(s) for s in args.batch_sizes.split(",")):
        with tempfile.TemporaryDirectory() as scratch:
            keyed = keyed_backend(args.backend, f"{scratch}/db")
            rate, emitted = run(left, right, size, keyed)
            keyed.dispose()
        print(f"batches of {size:>6} rows: {rate / 1e6:.2f} M rows/s ({emitted} pairs)")


if __name__ == "__main__":
    main()
