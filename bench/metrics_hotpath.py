"""What the metrics add to workload B's per-batch path, measured in one process.

End-to-end comparisons (``bench/metrics_overhead.py``) cannot resolve 1 % on a shared
2-core machine. This measures the work itself: the keyed running sum's two chains, built
by the real ``Task`` code (operators, keyed heap state, hash ``RecordWriter``), process
the same 1024-record batches twice per round, once wired as now (counting closures on
every output and chained input, the task's count of its head's input) and once wired
without them (plain calls, as before the metrics). The output channels only drop what
they get. It reports the per-batch time of each (minimum over rounds, the least
disturbed) and the difference, plus the cost of one reporter sample.

Example::

    .venv/bin/python bench/metrics_hotpath.py --batches 2000 --rounds 15
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from typing import Any

import epochstream as es
from epochstream.runtime.messages import TaskDeployment
from epochstream.runtime.metrics import TaskSampler
from epochstream.runtime.operator_outputs import Output
from epochstream.runtime.outputs import Channel, RecordWriter
from epochstream.runtime.snapshots import SnapshotExecutor
from epochstream.runtime.task import Task, TaskEnvironment
from epochstream.state.backends.heap.backend import HeapStateBackend

B_KEYS = 100_000
BATCH = 1024


class _Drop(Channel):
    def send(self, item: Any) -> None:
        """Drop the batch: only the producing side is measured."""


def _graph() -> Any:
    env = es.Environment(parallelism=1, runner="local")
    (
        env.from_sequence(0, 10)
        .uid("numbers")
        .map(lambda i: (i * 7919 % B_KEYS, i % 1000))
        .key_by(lambda t: t[0])
        .reduce(lambda a, b: (a[0], a[1] + b[1]))
        .uid("sums")
        .sink_to(es.sinks.DiscardSink())
    )
    return env.job_graph("bench-keyed-sum")


def _task(graph: Any, chain: Any, local: str) -> Task:
    env = TaskEnvironment(
        job_id="bench",
        attempt=1,
        checkpoint_dir=None,
        checkpointing=False,
        exactly_once=True,
        send=lambda msg: None,
        snapshots=SnapshotExecutor(),
        state_backend=HeapStateBackend(),
        local_dir=local,
    )
    task = Task(env, graph, chain, TaskDeployment(chain_id=chain.chain_id, subtask=0))
    for edge in graph.outgoing(chain.chain_id):
        task.writers[edge.edge_id] = RecordWriter(
            [_Drop()],
            partitioning=edge.partitioning,
            max_parallelism=graph.max_parallelism,
            batch_size=graph.batch_size,
        )
    task._build()
    return task


class _Plain(Output):
    """An output that is its target itself: ``collect`` is the consumer's
    ``process_batch`` or the writer's ``write``, no counting in between."""

    def __init__(self, target: Any) -> None:
        # An instance attribute in front of the method: the call lands on the target.
        self.collect = target  # type: ignore[method-assign]

    def collect(self, records: Any, timestamps: Any = None) -> None:
        raise AssertionError("replaced by the target in __init__")

    def emit_watermark(self, watermark: int) -> None:
        """Not measured."""

    def emit_status(self, idle: bool) -> None:
        """Not measured."""


def _plain_wiring(task: Task) -> None:
    """Rewire the chain's record outputs as plain calls (no counting)."""
    ops = {op.uid: op for op in task.operators}
    for spec in task.chain.operators:
        targets = [
            ops[out.chained_uid].process_batch
            if out.chained_uid is not None
            else task.writers[out.edge_id].write  # type: ignore[index]
            for out in spec.outputs
            if out.tag == "main"
        ]
        if targets:
            assert len(targets) == 1
            ops[spec.uid].output = _Plain(targets[0])


def _run(task: Task, batches: list[list[Any]], *, counted: bool) -> float:
    """Seconds per batch: from what the source emits (map, hash writer), or from the
    reduce task's input (reduce, sink)."""
    ops = task.operators
    # A source's output as the source hands it on; a reduce task's input as its loop does.
    entry = ops[0].output.collect if task.chain.is_source else ops[0].process_batch
    counters = task.metrics.head
    start = time.perf_counter()
    if counted and not task.chain.is_source:
        for batch in batches:
            counters.records_in += len(batch)  # what the task loop adds per batch
            entry(batch, None)
    else:
        for batch in batches:
            entry(batch, None)
    return (time.perf_counter() - start) / len(batches)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batches", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args(argv)
    graph = _graph()
    source_chain, reduce_chain = graph.chains
    numbers = [list(range(i * BATCH, (i + 1) * BATCH)) for i in range(args.batches)]
    pairs = [[(i * 7919 % B_KEYS, i % 1000) for i in batch] for batch in numbers]
    with tempfile.TemporaryDirectory() as local:
        variants = {}
        for counted in (True, False):
            tasks = (_task(graph, source_chain, local), _task(graph, reduce_chain, local))
            if not counted:
                for task in tasks:
                    _plain_wiring(task)
            variants[counted] = tasks
        times: dict[bool, list[float]] = {True: [], False: []}
        for round_no in range(args.rounds):
            for counted in (True, False) if round_no % 2 == 0 else (False, True):
                map_task, reduce_task = variants[counted]
                per_batch = _run(map_task, numbers, counted=counted)
                per_batch += _run(reduce_task, pairs, counted=counted)
                times[counted].append(per_batch)
        sampler = TaskSampler(variants[True][1].metrics, now=time.perf_counter())
        start = time.perf_counter()
        for _ in range(1000):
            sampler.sample(now=time.perf_counter(), wall_ms=0)
        sample_s = (time.perf_counter() - start) / 1000
    with_metrics, without = min(times[True]), min(times[False])
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cpus, load {os.getloadavg()[0]:.1f}")
    print(f"per 1024-record batch (map chain + reduce chain), min of {args.rounds} rounds:")
    print(
        f"  without counting {without * 1e6:8.1f} us   (median {statistics.median(times[False]) * 1e6:.1f})"
    )
    print(
        f"  with counting    {with_metrics * 1e6:8.1f} us   (median {statistics.median(times[True]) * 1e6:.1f})"
    )
    print(f"  difference       {(with_metrics - without) / without * 100:+.2f} %")
    print(f"one reporter sample of a task: {sample_s * 1e6:.1f} us (once a second per task)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
