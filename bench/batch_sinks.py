"""A columnar job into ``FileSink(format="parquet")``: the batches written as they are
against the same stream through ``to_rows()`` first (a dict per row, then an Arrow table
again), in one process on the local runner, forms alternating. Prints each run's
seconds, the best of each form and the ratio (rows / batches)::

    PYTHONPATH=src python bench/batch_sinks.py --n 2000000 --repeat 3

The stream has four columns (int64 key, string word, float64 value, ms timestamp) in
batches of 65 536 rows, parallelism 2, a checkpoint every second.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

import epochstream as es


def _widen(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Four columns from the sequence's ``value``: what a real job's batch looks like."""
    v = batch["value"]
    return pa.record_batch(
        {
            "key": pc.bit_wise_and(v, 1023),
            "word": pc.binary_join_element_wise(
                "w", pc.cast(pc.bit_wise_and(v, 255), pa.string()), ""
            ),
            "value": pc.multiply(pc.cast(v, pa.float64()), 0.5),
            "at": pc.cast(pc.add(v, 1_764_000_000_000), pa.timestamp("ms")),
        }
    )


def run(form: str, n: int, work: Path) -> float:
    """Seconds of one job of ``n`` rows into a fresh directory; ``form``: batches or rows."""
    out = work / f"out-{form}"
    shutil.rmtree(out, ignore_errors=True)
    env = es.Environment(parallelism=2, runner="local")
    env.enable_checkpointing(1.0, storage=str(work / f"ckpt-{form}-{time.monotonic_ns()}"))
    stream: Any = env.from_sequence(0, n, batch_size=65_536).uid("numbers").map_batches(_widen)
    if form == "rows":
        stream = stream.to_rows()
    stream.sink_to(es.sinks.FileSink(out, format="parquet")).uid("files")
    start = time.perf_counter()
    env.execute(f"batch-sinks-{form}")
    seconds = time.perf_counter() - start
    written = sum(pq.read_metadata(p).num_rows for p in out.iterdir() if not p.name.startswith("."))
    if written != n:
        raise SystemExit(f"{form}: {written} rows written, expected {n}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=2_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="batch-sinks-"))
    try:
        run("batches", 200_000, work)  # warm-up: imports, first job start
        times: dict[str, list[float]] = {"batches": [], "rows": []}
        for _ in range(args.repeat):
            for form in times:
                times[form].append(run(form, args.n, work))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    best = {form: min(t) for form, t in times.items()}
    print(
        json.dumps(
            {
                "n": args.n,
                "seconds": times,
                "best": best,
                "rows_per_s": {f: round(args.n / s) for f, s in best.items()},
                "ratio_rows_over_batches": round(best["rows"] / best["batches"], 2),
            }
        )
    )


if __name__ == "__main__":
    main()
