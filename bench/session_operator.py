"""The columnar session operator alone: rows per second it merges and counts, on one
core, with no job around it (no source, shuffle or start).

Nexmark-like bids: positions at 10,000 events/s of event time, out of order by up to
100 ms; three bids in four from a hot bidder (one per 100 people), the others from one
of the 1,000 most recent people; a 10 s gap; a watermark 4 s behind the latest row
every ``--watermark-every`` rows (in a job a source sends one every 200 ms: about
100,000 rows at the rates of bench/nexmark_windows.py; here 16,384 by default).

``--backend rocksdb`` keeps the open sessions in RocksDB (64 MB block cache) instead
of the heap backend's memory. ``--operator`` picks the operator: ``single`` the
single-aggregate session operator counting (``.count()``), ``sql`` the SQL session
window aggregation counting (``COUNT(*)``), ``sql-many`` the SQL one with ``COUNT(*)``,
``SUM``, ``MAX`` and ``AVG`` of a price column, ``sql-distinct`` with ``COUNT(*)`` and
``COUNT(DISTINCT price)``.

Example::

    PYTHONPATH=src .venv/bin/python bench/session_operator.py --rows 2000000 --batch-sizes 1024,4096,65536
    PYTHONPATH=src .venv/bin/python bench/session_operator.py --backend rocksdb --batch-sizes 4096
    PYTHONPATH=src .venv/bin/python bench/session_operator.py --operator sql-many
"""

from __future__ import annotations

import argparse
import tempfile
import time
from typing import Any

import numpy as np
import pyarrow as pa

from epochstream import agg
from epochstream.core.clock import SystemClock
from epochstream.core.events import MAX_WATERMARK
from epochstream.graph.jobgraph import OperatorSpec
from epochstream.graph.specs import AggCall, SessionAggregateSpec, SessionWindowSpec
from epochstream.graph.transformations import ColumnKey
from epochstream.runtime.operator_outputs import Output
from epochstream.runtime.operators import OperatorContext, create_operator
from epochstream.state.backends.base import KeyedBackendContext, KeyedStateBackend
from epochstream.state.backends.heap.backend import HeapStateBackend
from epochstream.state.backends.rocksdb.backend import RocksDBStateBackend
from epochstream.state.operator import OperatorStateStore


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


def bids(rows: int, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Bidder ids and event times (ms) of ``rows`` Nexmark-like bids."""
    rng = np.random.default_rng(seed)
    pos = np.arange(rows)
    people = 1000 + pos // 50
    hot = 1000 + people // 100 * 100 - 1000 // 100 * 100
    bidders = np.where(rng.random(rows) < 0.75, hot, people - rng.integers(0, 1000, rows))
    return bidders, pos // 10 + rng.integers(0, 100, rows)


def keyed_backend(kind: str, local_dir: str) -> KeyedStateBackend:
    """A keyed-state backend of ``kind`` (``heap`` or ``rocksdb``) for the one subtask."""
    config = RocksDBStateBackend() if kind == "rocksdb" else HeapStateBackend()
    return config.create(
        KeyedBackendContext(
            operator_uid="sessions",
            subtask=0,
            max_parallelism=128,
            key_group_range=range(0, 128),
            clock=SystemClock(),
            local_dir=local_dir,
        )
    )


#: The SQL operator's aggregates per ``--operator``.
_SQL_AGGREGATES: dict[str, tuple[AggCall, ...]] = {
    "sql": (agg.count_star("n"),),
    "sql-many": (
        agg.count_star("n"),
        agg.sum("price", "total"),
        agg.max("price", "top"),
        agg.avg("price", "mean"),
    ),
    "sql-distinct": (agg.count_star("n"), agg.count("price", "prices", distinct=True)),
}


def run(
    bidders: np.ndarray,
    times: np.ndarray,
    batch_size: int,
    watermark_every: int,
    keyed: KeyedStateBackend,
    operator: str = "single",
) -> tuple[float, int]:
    """Rows/s through the operator and the number of sessions it emitted."""
    payload: Any
    if operator == "single":
        kind, payload = (
            "columnar_session_window",
            SessionWindowSpec("count", "bidder", None, 10_000),
        )
    else:
        kind = "columnar_session_aggregate"
        payload = SessionAggregateSpec(keys=("bidder",), gap=10_000, aggs=_SQL_AGGREGATES[operator])
    spec = OperatorSpec(
        uid="sessions",
        name="sessions",
        kind=kind,
        payload=payload,
        key_selector=ColumnKey("bidder"),
    )
    ctx = OperatorContext(
        subtask_index=0,
        parallelism=1,
        max_parallelism=128,
        attempt=0,
        job_id="bench",
        task_name="sessions",
        operator_state=OperatorStateStore(),
        keyed_backend=keyed,
    )
    op = create_operator(spec, ctx)
    emitted = op.output = _RowCount()
    op.open()
    prices = (bidders * 7919 + times) % 1000  # deterministic, about 1,000 distinct
    batches = [
        pa.record_batch(
            [
                pa.array(bidders[i : i + batch_size]),
                pa.array(prices[i : i + batch_size]),
                pa.array(times[i : i + batch_size]),
            ],
            names=["bidder", "price", "_ts"],
        )
        for i in range(0, len(times), batch_size)
    ]
    latest = np.maximum.accumulate(times)
    start = time.perf_counter()
    for index, batch in enumerate(batches):
        op.process_batch(batch, None)
        end = (index + 1) * batch_size
        if end // watermark_every != index * batch_size // watermark_every:
            op.process_watermark(int(latest[min(end, len(times)) - 1]) - 4_000)
    op.process_watermark(MAX_WATERMARK)
    return len(times) / (time.perf_counter() - start), emitted.rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--batch-sizes", default="1024,4096,65536")
    parser.add_argument("--watermark-every", type=int, default=16_384)
    parser.add_argument("--backend", choices=("heap", "rocksdb"), default="heap")
    parser.add_argument("--operator", choices=("single", *_SQL_AGGREGATES), default="single")
    args = parser.parse_args()
    bidders, times = bids(args.rows)
    for size in (int(s) for s in args.batch_sizes.split(",")):
        with tempfile.TemporaryDirectory() as scratch:
            keyed = keyed_backend(args.backend, f"{scratch}/db")
            rate, sessions = run(bidders, times, size, args.watermark_every, keyed, args.operator)
            keyed.dispose()
        print(f"batches of {size:>6} rows: {rate / 1e6:.2f} M rows/s ({sessions} sessions)")


if __name__ == "__main__":
    main()
