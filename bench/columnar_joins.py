"""The columnar regular join's cost per arriving batch as its state grows, and why the
arriving batch is the side Acero hashes.

1. ``acero``: one join of a batch of ``--batch`` rows against ``--state`` rows, both ways
   round: Acero builds its hash table on the right table of ``Table.join``, so with the
   state on the right every batch hashes the whole state; with the batch on the right
   (what ``ColumnarRegularJoinOperator`` does) the state is only probed.
2. ``operator``: ``ColumnarRegularJoinOperator`` driven directly (no Spark): batches of
   ``--batch`` rows alternate between the inputs until each side holds ``--state`` rows;
   the time per batch at each tenth of the way, so the growth with the state shows.

Keys are uniform over ``--keys`` integers. Record figures in docs/benchmarks.md.

Example::

    .venv/bin/python bench/columnar_joins.py --state 2000000 --batch 4096
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import numpy as np
import pyarrow as pa

from epochstream.graph.jobgraph import OperatorSpec
from epochstream.graph.specs import JoinSpec
from epochstream.graph.transformations import ColumnKey
from epochstream.runtime.operator_outputs import Output
from epochstream.runtime.operators import OperatorContext, create_operator
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


def _batch(rng: np.random.Generator, n: int, keys: int, key: str) -> pa.RecordBatch:
    return pa.record_batch(
        [pa.array(rng.integers(0, keys, n)), pa.array(rng.integers(0, 1_000, n))],
        names=[key, f"{key}_v"],
    )


def _best_ms(fn: object, rounds: int = 5) -> float:
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        fn()  # type: ignore[operator]
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def acero(state_rows: int, batch_rows: int, keys: int) -> dict[str, float]:
    rng = np.random.default_rng(1)
    state = pa.Table.from_batches([_batch(rng, state_rows, keys, "a")])
    batch = pa.Table.from_batches([_batch(rng, batch_rows, keys, "b")])

    def hash_state() -> None:
        batch.join(state, keys="b", right_keys="a", join_type="inner", use_threads=False)

    def hash_batch() -> None:
        state.join(batch, keys="a", right_keys="b", join_type="inner", use_threads=False)

    return {"hash_state_ms": _best_ms(hash_state), "hash_batch_ms": _best_ms(hash_batch)}


def operator(state_rows: int, batch_rows: int, keys: int) -> list[dict[str, float]]:
    spec = JoinSpec("a", "b")
    op_spec = OperatorSpec(
        uid="join",
        name="join",
        kind="columnar_join",
        payload=spec,
        key_selector=ColumnKey("a"),
        input_key_selectors=[ColumnKey("a"), ColumnKey("b")],
    )
    ctx = OperatorContext(
        subtask_index=0,
        parallelism=1,
        max_parallelism=128,
        attempt=0,
        job_id="bench",
        task_name="join (1/1)",
        operator_state=OperatorStateStore(),
    )
    op = create_operator(op_spec, ctx)
    pairs = op.output = _RowCount()
    op.open()
    rng = np.random.default_rng(2)
    steps = max(1, state_rows // batch_rows)
    inputs = [
        [_batch(rng, batch_rows, keys, "a") for _ in range(steps)],
        [_batch(rng, batch_rows, keys, "b") for _ in range(steps)],
    ]
    out = []
    mark = time.perf_counter()
    for step in range(steps):
        for side in (0, 1):
            op.process_input(side, inputs[side][step], None)
        if (step + 1) % max(1, steps // 10) == 0:
            now = time.perf_counter()
            out.append(
                {
                    "state_rows_per_side": (step + 1) * batch_rows,
                    "ms_per_batch": (now - mark) * 1e3 / (2 * max(1, steps // 10)),
                    "pairs": pairs.rows,
                }
            )
            mark = now
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--state", type=int, default=2_000_000)
    parser.add_argument("--batch", type=int, default=4_096)
    parser.add_argument("--keys", type=int, default=1_000_000_000)
    args = parser.parse_args()
    print(json.dumps({"acero": acero(args.state, args.batch, args.keys)}))
    for row in operator(args.state, args.batch, args.keys):
        print(json.dumps({"operator": row}))


if __name__ == "__main__":
    main()
