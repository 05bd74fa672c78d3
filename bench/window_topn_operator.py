"""The columnar window Top-N operator alone: rows per second it ranks, on one core, with
no job around it, next to a floor: one pyarrow ``sort_indices`` of all the rows by
(window, partition, order key) in the same run (what a batch engine's sort would cost,
with no state, pruning or emitting).

Input like a window aggregation's output over Nexmark bids: ``--partitions`` categories
(the Top-N's partitions), items with a float ``volume``, 10 s tumbling windows in
order, the rows of a window spread over its batches; the key groups come with the rows
(``_kg``, as the hash edge adds them); a watermark at each window's end. Top 3 by
volume descending.

``--backend rocksdb`` keeps the open windows' rows in RocksDB instead of memory.

Example::

    PYTHONPATH=src .venv/bin/python bench/window_topn_operator.py --rows 2000000
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
from epochstream.graph.specs import WindowTopNSpec
from epochstream.graph.transformations import ColumnKey
from epochstream.runtime.operator_outputs import Output
from epochstream.runtime.operators import OperatorContext, create_operator
from epochstream.state.backends.base import KeyedBackendContext, KeyedStateBackend
from epochstream.state.backends.heap.backend import HeapStateBackend
from epochstream.state.backends.rocksdb.backend import RocksDBStateBackend
from epochstream.state.column_keygroups import key_groups_of_column
from epochstream.state.operator import OperatorStateStore

_WINDOW = 10_000


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


def windowed_rows(rows: int, partitions: int, windows: int, seed: int = 1) -> pa.Table:
    """``rows`` rows over ``windows`` consecutive windows: category, item, volume,
    window_start, window_end, _kg."""
    rng = np.random.default_rng(seed)
    category = rng.integers(0, partitions, rows)
    ends = (np.arange(rows) * windows // rows + 1) * _WINDOW
    return pa.table(
        {
            "category": category,
            "item": rng.integers(0, 1_000_000, rows),
            "volume": rng.random(rows) * 1_000,
            "window_start": pa.array(ends - _WINDOW).cast(pa.timestamp("ms")),
            "window_end": pa.array(ends).cast(pa.timestamp("ms")),
            "_kg": pa.array(key_groups_of_column(pa.array(category), 128), pa.int32()),
        }
    )


def keyed_backend(kind: str, local_dir: str) -> KeyedStateBackend:
    """A keyed-state backend of ``kind`` (``heap`` or ``rocksdb``) for the one subtask."""
    config = RocksDBStateBackend() if kind == "rocksdb" else HeapStateBackend()
    return config.create(
        KeyedBackendContext(
            operator_uid="topn",
            subtask=0,
            max_parallelism=128,
            key_group_range=range(0, 128),
            clock=SystemClock(),
            local_dir=local_dir,
        )
    )


def run(table: pa.Table, batch_size: int, keyed: KeyedStateBackend) -> tuple[float, int]:
    """Rows/s through the operator and the number of rows it emitted."""
    spec = OperatorSpec(
        uid="topn",
        name="topn",
        kind="columnar_window_top_n",
        payload=WindowTopNSpec(("category",), (("volume", "desc"),), 3, rank_column="rownum"),
        key_selector=ColumnKey("category"),
    )
    ctx = OperatorContext(
        subtask_index=0,
        parallelism=1,
        max_parallelism=128,
        attempt=0,
        job_id="bench",
        task_name="topn",
        operator_state=OperatorStateStore(),
        keyed_backend=keyed,
    )
    op = create_operator(spec, ctx)
    emitted = op.output = _RowCount()
    op.open()
    batches = table.to_batches(max_chunksize=batch_size)
    ends = [int(b["window_end"][0].value) for b in batches]
    start = time.perf_counter()
    for batch, end in zip(batches, ends, strict=True):
        op.process_batch(batch, None)
        op.process_watermark(end - _WINDOW - 1)  # the windows before this one are due
    op.process_watermark(MAX_WATERMARK)
    return table.num_rows / (time.perf_counter() - start), emitted.rows


def sort_floor(table: pa.Table) -> float:
    """Rows/s of one pyarrow sort of every row by (window, partition, volume desc)."""
    start = time.perf_counter()
    pc.sort_indices(
        table,
        sort_keys=[
            ("window_end", "ascending"),
            ("category", "ascending"),
            ("volume", "descending"),
        ],
    )
    return table.num_rows / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--partitions", type=int, default=10_000)
    parser.add_argument("--windows", type=int, default=20)
    parser.add_argument("--batch-sizes", default="4096,65536")
    parser.add_argument("--backend", choices=("heap", "rocksdb"), default="heap")
    args = parser.parse_args()
    table = windowed_rows(args.rows, args.partitions, args.windows)
    print(f"pyarrow sort floor: {sort_floor(table) / 1e6:.2f} M rows/s")
    for size in (int(s) for s in args.batch_sizes.split(",")):
        with tempfile.TemporaryDirectory() as scratch:
            keyed = keyed_backend(args.backend, f"{scratch}/db")
            rate, out = run(table, size, keyed)
            keyed.dispose()
        print(f"batches of {size:>6} rows: {rate / 1e6:.2f} M rows/s ({out} rows out)")


if __name__ == "__main__":
    main()
