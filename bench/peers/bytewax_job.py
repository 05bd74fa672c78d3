"""Bytewax peer: workloads A and B as a Bytewax dataflow with one worker.

Runs inside the Bytewax virtualenv (``/tmp/bench-venvs/bytewax``), started by
``bench/run.py``. Bytewax keys are strings, so workload B's integer key is turned
into ``str`` (part of the cost a Bytewax user pays). With ``--checkpoint S`` the run
uses a SQLite recovery partition and an epoch (snapshot) interval of ``S`` seconds;
without it, the default 10 s epochs and no recovery. Prints one JSON line.

B with ``--rate R``: W1's end-to-end latency, for ``--seconds``. The source
(``_ScheduledSource``, a fixed-partitioned source with one partition, its position in
the snapshots like ``TestingSource``'s) releases event ``i`` at its due time
``start + i / R`` (``latency_samples.Schedule``; asking Bytewax to wake it then, up
to ``--batch-size`` due events a batch) and carries that time as the event's creation
time through the map and the running sum. The sink takes one wall-clock reading per
batch Bytewax hands it; an event's latency is that reading minus its creation time,
for every event. Batches emitted in the first second are left out (warm-up).

B with ``--probe DIR`` (recovery, driven by ``bench/recovery.py``'s
``kill_and_restart``): the throughput run over ``--n`` events with its recovery
partition in ``--recovery-dir`` (created by attempt 0, resumed from by a restarted
process), the sink writing ``(wall time, records)`` per batch to the probe
(``rate_probe.RateProbe``). A restarted process writes ``restore-<attempt>.json``:
the source position its snapshot resumed it at.

Example::

    /tmp/bench-venvs/bytewax/bin/python bench/peers/bytewax_job.py B --n 1000000 --checkpoint 1
    /tmp/bench-venvs/bytewax/bin/python bench/peers/bytewax_job.py B --rate 30000 --seconds 20 \\
        --checkpoint 1
    /tmp/bench-venvs/bytewax/bin/python bench/peers/bytewax_job.py B --n 100000000 \
        --checkpoint 1 --probe /tmp/probe --recovery-dir /tmp/bytewax-db --attempt 0
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import bytewax.operators as op
from bytewax.dataflow import Dataflow
from bytewax.inputs import FixedPartitionedSource, StatefulSourcePartition
from bytewax.outputs import DynamicSink, StatelessSinkPartition
from bytewax.recovery import RecoveryConfig, init_db_dir
from bytewax.testing import TestingSource, run_main

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# bench/, for report.latency_summary; last, so that it shadows nothing installed.
sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from latency_samples import Schedule
from rate_probe import RateProbe, write_restore
from report import WARMUP_S, latency_summary, steady
from workloads import B_KEYS, peer_arguments


def _running_sum(state: int | None, value: int) -> tuple[int, int]:
    total = (state or 0) + value
    return total, total


def _stamped_running_sum(
    state: int | None, value: tuple[int, float]
) -> tuple[int, tuple[int, float]]:
    """The running sum, its output carrying the creation time of the event that made it."""
    total = (state or 0) + value[0]
    return total, (total, value[1])


class _Counter(StatelessSinkPartition[Any]):
    def __init__(self, totals: list[int]) -> None:
        self.totals = totals

    def write_batch(self, items: list[Any]) -> None:
        self.totals[0] += len(items)


class _DiscardSink(DynamicSink[Any]):
    """Counts the records, then drops them."""

    def __init__(self) -> None:
        self.totals = [0]

    def build(self, step_id: str, worker_index: int, worker_count: int) -> _Counter:
        return _Counter(self.totals)


class _LatencyPartition(StatelessSinkPartition[Any]):
    def __init__(self, emitted: list[tuple[float, list[float]]]) -> None:
        self.emitted = emitted

    def write_batch(self, items: list[Any]) -> None:
        now = time.time()
        self.emitted.append((now, [now - created for _, (_, created) in items]))


class _LatencySink(DynamicSink[Any]):
    """``(wall time, latency of each record)`` per batch of ``(key, (sum, created))``."""

    def __init__(self) -> None:
        self.emitted: list[tuple[float, list[float]]] = []

    def build(self, step_id: str, worker_index: int, worker_count: int) -> _LatencyPartition:
        return _LatencyPartition(self.emitted)


class _ProbePartition(StatelessSinkPartition[Any]):
    def __init__(self, probe: RateProbe) -> None:
        self.probe = probe

    def write_batch(self, items: list[Any]) -> None:
        self.probe.add(time.time(), len(items))


class _ProbeSink(DynamicSink[Any]):
    """``(wall time, records)`` per batch into a :class:`RateProbe`, then drops them."""

    def __init__(self, probe: RateProbe) -> None:
        self.probe = probe

    def build(self, step_id: str, worker_index: int, worker_count: int) -> _ProbePartition:
        return _ProbePartition(self.probe)


class _ResumeRecordingSource(TestingSource):
    """``TestingSource`` that records where a restarted run's snapshot resumed it."""

    def __init__(self, n: int, batch_size: int, probe: str, attempt: int) -> None:
        super().__init__(range(n), batch_size=batch_size)
        self.probe = probe
        self.attempt = attempt

    def build_part(self, step_id: str, for_part: str, resume_state: int | None) -> Any:
        if self.attempt:
            write_restore(self.probe, self.attempt, {"source_position": resume_state})
        return super().build_part(step_id, for_part, resume_state)


class _SchedulePartition(StatefulSourcePartition[tuple[int, float], int]):
    def __init__(self, rate: float, n: int, first: int, batch_size: int) -> None:
        # A resumed partition goes on from ``first``, due now.
        self.schedule = Schedule(rate, time.time() - first / rate, n)
        self.position = first
        self.batch_size = batch_size

    def next_batch(self) -> list[tuple[int, float]]:
        if self.position >= self.schedule.n:
            raise StopIteration
        upto = min(self.schedule.released(time.time()), self.position + self.batch_size)
        batch = [(i, self.schedule.due(i)) for i in range(self.position, upto)]
        # max: a step back of the wall clock must not release events twice.
        self.position = max(self.position, upto)
        return batch

    def next_awake(self) -> datetime | None:
        if self.position >= self.schedule.n or self.schedule.released(time.time()) > self.position:
            return None
        return datetime.fromtimestamp(self.schedule.due(self.position), tz=UTC)

    def snapshot(self) -> int:
        return self.position


class _ScheduledSource(FixedPartitionedSource[tuple[int, float], int]):
    """``(i, due time of i)`` for ``i < n``, each released at its due time at ``rate``/s."""

    def __init__(self, rate: float, n: int, batch_size: int) -> None:
        self.rate = rate
        self.n = n
        self.batch_size = batch_size

    def list_parts(self) -> list[str]:
        return ["schedule"]

    def build_part(
        self, step_id: str, for_part: str, resume_state: int | None
    ) -> _SchedulePartition:
        return _SchedulePartition(self.rate, self.n, resume_state or 0, self.batch_size)


def main() -> None:
    parser = peer_arguments("bytewax_job peer")
    parser.add_argument("--checkpoint", type=float, default=0.0)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--rate", type=float, default=0.0, help="B: latency run at R events/s")
    parser.add_argument("--seconds", type=float, default=20.0, help="B: latency run's length")
    parser.add_argument("--probe", default="", help="B: recovery run's probe directory")
    parser.add_argument("--attempt", type=int, default=0, help="recovery: 0, then 1 restarted")
    parser.add_argument("--recovery-dir", default="", help="recovery: kept recovery partition")
    args = parser.parse_args()
    if args.probe and (args.workload != "B" or args.rate or not args.recovery_dir):
        raise SystemExit("--probe runs workload B's throughput job and needs --recovery-dir")

    flow = Dataflow(f"bytewax-{args.workload}")
    sink: _DiscardSink | _LatencySink | _ProbeSink
    probe: RateProbe | None = None
    if args.probe:
        probe = RateProbe(args.probe, attempt=args.attempt)
        source = _ResumeRecordingSource(args.n, args.batch_size, args.probe, args.attempt)
        nums = op.input("seq", flow, source)
        keyed = op.map("record", nums, lambda i: (str(i * 7919 % B_KEYS), i % 1000))
        sums = op.stateful_map("sum", keyed, _running_sum)
        sink = _ProbeSink(probe)
    elif args.workload == "B" and args.rate:
        args.n = round(args.rate * args.seconds)
        stamped = op.input("seq", flow, _ScheduledSource(args.rate, args.n, args.batch_size))
        pairs = op.map(
            "record", stamped, lambda e: (str(e[0] * 7919 % B_KEYS), (e[0] % 1000, e[1]))
        )
        sums = op.stateful_map("sum", pairs, _stamped_running_sum)
        sink = _LatencySink()
    else:
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
        if args.recovery_dir:
            db_dir = args.recovery_dir
            if not args.attempt:
                os.makedirs(db_dir, exist_ok=True)
                init_db_dir(Path(db_dir), 1)
        else:
            db_dir = tempfile.mkdtemp(prefix="bytewax-recovery-")
            init_db_dir(Path(db_dir), 1)
        kwargs["epoch_interval"] = timedelta(seconds=args.checkpoint)
        kwargs["recovery_config"] = RecoveryConfig(Path(db_dir))
    start = time.perf_counter()
    run_main(flow, **kwargs)
    wall = time.perf_counter() - start
    out: dict[str, Any] = {"events": args.n, "seconds": wall, "recovery_dir": db_dir}
    if probe is not None:
        probe.close()
    elif isinstance(sink, _LatencySink):
        emitted = sum(len(lats) for _, lats in sink.emitted)
        if emitted != args.n:
            raise SystemExit(f"bytewax emitted {emitted} records, expected {args.n}")
        out.update(latency_rate=args.rate, **latency_summary(steady(sink.emitted, WARMUP_S)))
    elif sink.totals[0] != args.n:
        raise SystemExit(f"bytewax emitted {sink.totals[0]} records, expected {args.n}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
