"""Bytewax peer: workloads A and B as a Bytewax dataflow with one worker.

Runs inside the Bytewax virtualenv (``/tmp/bench-venvs/bytewax``), started by
``bench/run.py``. Bytewax keys are strings, so workload B's integer key is turned
into ``str`` (part of the cost a Bytewax user pays). With ``--checkpoint S`` the run
uses a SQLite recovery partition and an epoch (snapshot) interval of ``S`` seconds;
without it, the default 10 s epochs and no recovery. Prints one JSON line.

Example::

    /tmp/bench-venvs/bytewax/bin/python bench/peers/bytewax_job.py B --n 1000000 --checkpoint 1
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from workloads import B_KEYS, peer_arguments


def _running_sum(state: int | None, value: int) -> tuple[int, int]:
    total = (state or 0) + value
    return total, total


def main() -> None:
    parser = peer_arguments("bytewax_job peer")
    parser.add_argument("--checkpoint", type=float, default=0.0)
    parser.add_argument("--batch-size", type=int, default=1024)
    args = parser.parse_args()

    import bytewax.operators as op
    from bytewax.dataflow import Dataflow
    from bytewax.outputs import DynamicSink, StatelessSinkPartition
    from bytewax.recovery import RecoveryConfig, init_db_dir
    from bytewax.testing import TestingSource, run_main

    class _Counter(StatelessSinkPartition[Any]):
        def __init__(self, totals: list[int]) -> None:
            self.totals = totals

        def write_batch(self, items: list[Any]) -> None:
            self.totals[0] += len(items)

    class _DiscardSink(DynamicSink[Any]):
        def __init__(self) -> None:
            self.totals = [0]

        def build(self, step_id: str, worker_index: int, worker_count: int) -> _Counter:
            return _Counter(self.totals)

    flow = Dataflow(f"bytewax-{args.workload}")
    if args.workload == "B":
        nums = op.input("seq", flow, TestingSource(range(args.n), batch_size=args.batch_size))
        keyed = op.map("record", nums, lambda i: (str(i * 7919 % B_KEYS), i % 1000))
    else:
        from bytewax.connectors.files import FileSource

        lines = op.input("text", flow, FileSource(args.path, batch_size=args.batch_size))
        words = op.flat_map("split", lines, str.split)
        keyed = op.map("pair", words, lambda w: (w.lower(), 1))
    sums = op.stateful_map("sum", keyed, _running_sum)
    sink = _DiscardSink()
    op.output("out", sums, sink)

    kwargs: dict[str, Any] = {}
    db_dir = ""
    if args.checkpoint > 0:
        db_dir = tempfile.mkdtemp(prefix="bytewax-recovery-")
        init_db_dir(Path(db_dir), 1)
        kwargs["epoch_interval"] = timedelta(seconds=args.checkpoint)
        kwargs["recovery_config"] = RecoveryConfig(Path(db_dir))
    start = time.perf_counter()
    run_main(flow, **kwargs)
    wall = time.perf_counter() - start
    if sink.totals[0] != args.n:
        raise SystemExit(f"bytewax emitted {sink.totals[0]} records, expected {args.n}")
    print(json.dumps({"events": args.n, "seconds": wall, "recovery_dir": db_dir}))


if __name__ == "__main__":
    main()
