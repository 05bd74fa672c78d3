"""Workload B's row path in one process, this tree against a base commit.

End-to-end rates on a shared 2-core machine move by ±30 % between identical runs, too
much to see a 5 % change. This runs the work of the job without its threads and
sockets: the source chain of subtask 0 (map, hash ``RecordWriter`` over 2 channels,
built by the real ``Task`` code) turns ``--events`` numbers into batches; the batches
for subtask 1 are pickled as ``NetworkChannel`` pickles them (``pickle.dumps``,
protocol 5) and unpickled as the data plane does; then each reduce task (heap keyed
state, DiscardSink) runs its real mailbox loop (``Task.run``) over its queued input
until end of input. The figure is CPU nanoseconds per event of the whole path
(``time.process_time``), best of ``--rounds`` (the least disturbed), with the median.

``--base COMMIT`` exports that commit's ``src`` (``git archive``) and measures both
trees, alternating, each round in a fresh process.

``--instructions`` counts instead of timing: each tree's run is executed under
valgrind's callgrind twice, with ``--events`` and twice as many events, and the
difference of the instruction counts (Ir) divided by the extra events is the
instructions per event, start-up and imports cancelled out. Slow (about a minute per
tree at 100,000 events) but the same on a loaded machine, where the timings are not
(needs ``valgrind``: ``apt-get install valgrind``).

``--fusion`` measures operator fusion instead, in this tree and one process: two
source chains (workload A's ``flat_map(str.split).map(lambda w: (w.lower(), 1))``, and
``map.map.filter`` over numbers), each ending in a hash writer that drops its batches,
built fused and unfused, alternating per round.

Example::

    .venv/bin/python bench/rowpath_hotpath.py --base 2787308 --events 1000000 --rounds 5
    .venv/bin/python bench/rowpath_hotpath.py --base 2787308 --events 100000 --instructions
    .venv/bin/python bench/rowpath_hotpath.py --fusion --rounds 9
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
B_KEYS = 100_000
BATCH = 1024


def _measure(events: int) -> dict[str, float]:
    """One run in this process: ns per event, split by stage."""
    import epochstream as es
    from epochstream.core.events import END_OF_INPUT
    from epochstream.runtime.messages import FinishSlot, TaskDeployment, TaskFinished
    from epochstream.runtime.outputs import Channel, RecordWriter
    from epochstream.runtime.snapshots import SnapshotExecutor
    from epochstream.runtime.task import Task, TaskEnvironment
    from epochstream.state.backends.heap.backend import HeapStateBackend

    class Collect(Channel):
        def __init__(self, network: bool) -> None:
            self.items: list[Any] = []
            self.network = network

        def send(self, item: Any) -> None:
            self.items.append(pickle.dumps(item, protocol=5) if self.network else item)

    env = es.Environment(parallelism=2, runner="local")
    (
        env.from_sequence(0, 10)
        .uid("numbers")
        .map(lambda i: (i * 7919 % B_KEYS, i % 1000))
        .key_by(lambda t: t[0])
        .reduce(lambda a, b: (a[0], a[1] + b[1]))
        .uid("sums")
        .sink_to(es.sinks.DiscardSink())
    )
    graph = env.job_graph("bench-keyed-sum")
    source_chain, reduce_chain = graph.chains
    local = tempfile.mkdtemp(prefix="rowpath-")

    def task(chain: Any, subtask: int, send: Any = lambda msg: None) -> Task:
        tenv = TaskEnvironment(
            job_id="bench",
            attempt=1,
            checkpoint_dir=None,
            checkpointing=False,
            exactly_once=True,
            send=send,
            snapshots=SnapshotExecutor(),
            state_backend=HeapStateBackend(),
            local_dir=local,
        )
        return Task(tenv, graph, chain, TaskDeployment(chain_id=chain.chain_id, subtask=subtask))

    source = task(source_chain, 0)
    channels = [Collect(network=False), Collect(network=True)]
    (edge,) = graph.outgoing(source_chain.chain_id)
    source.writers[edge.edge_id] = RecordWriter(
        list(channels),
        partitioning=edge.partitioning,
        max_parallelism=graph.max_parallelism,
        batch_size=graph.batch_size,
    )
    source._build()
    numbers = [list(range(i, min(i + BATCH, events))) for i in range(0, events, BATCH)]
    emit = source.operators[0].output.collect
    start = time.process_time()
    for batch in numbers:
        emit(batch, None)
    source._flush()
    produce = time.process_time() - start

    start = time.process_time()
    frames = [pickle.loads(frame) for frame in channels[1].items]
    unpickle = time.process_time() - start

    consume = 0.0
    for subtask, items in enumerate((channels[0].items, frames)):
        tasks: list[Task] = []

        def finish(msg: Any, tasks: list[Task] = tasks) -> None:
            if isinstance(msg, TaskFinished):
                tasks[0].gate.put_mail(FinishSlot(stopped=True))

        reduce = task(reduce_chain, subtask, finish)
        tasks.append(reduce)
        reduce.gate.capacity = len(items) + 2
        (in_edge,) = reduce_chain.inputs
        for item in items:
            reduce.gate.put(reduce.channel_index(in_edge.edge_id, 0), item)
        for upstream in (0, 1):
            reduce.gate.put(reduce.channel_index(in_edge.edge_id, upstream), END_OF_INPUT)
        start = time.process_time()
        reduce.run()
        consume += time.process_time() - start
    per = 1e9 / events
    return {
        "produce": produce * per,
        "unpickle": unpickle * per,
        "consume": consume * per,
        "total": (produce + unpickle + consume) * per,
    }


def _fusion(rounds: int) -> int:
    """Two chains, fused and unfused: CPU ns per input record, best of ``rounds``."""
    import random

    import epochstream as es

    rng = random.Random(7)
    vocab = [f"Word{i}" if i % 3 == 0 else f"word{i}" for i in range(20_000)]
    lines = [" ".join(rng.choices(vocab, k=12)) for _ in range(100_000)]

    def text(stream: Any) -> Any:
        return stream.flat_map(str.split).map(lambda w: (w.lower(), 1))

    def numbers(stream: Any) -> Any:
        return (
            stream.map(lambda i: i * 7919 % 100_000)
            .map(lambda k: (k, k % 1000))
            .filter(lambda t: t[1] < 900)
        )

    shapes = [
        ("flat_map(str.split).map(lower, 1), 100k lines", text, lines),
        ("map.map.filter, 1M numbers", numbers, list(range(1_000_000))),
    ]
    print(f"load {os.getloadavg()[0]:.1f}; CPU ns per input record, best of {rounds} (median):")
    for label, build, inputs in shapes:
        env = es.Environment(parallelism=1, runner="local")
        build(env.from_collection([])).key_by(lambda t: t[0]).reduce(
            lambda a, b: (a[0], a[1] + b[1])
        ).sink_to(es.sinks.DiscardSink())
        graph = env.job_graph("bench-fusion")
        batches = [inputs[i : i + 1024] for i in range(0, len(inputs), 1024)]
        times: dict[bool, list[float]] = {True: [], False: []}
        for round_no in range(rounds):
            for fuse in (True, False) if round_no % 2 == 0 else (False, True):
                emit = _built_chain(graph, fuse)
                start = time.process_time()
                for batch in batches:
                    emit(batch, None)
                times[fuse].append((time.process_time() - start) * 1e9 / len(inputs))
        unfused, fused = min(times[False]), min(times[True])
        print(
            f"  {label}: unfused {unfused:.0f} ({statistics.median(times[False]):.0f}), "
            f"fused {fused:.0f} ({statistics.median(times[True]):.0f}), "
            f"change {(fused - unfused) / unfused * 100:+.1f} %"
        )
    return 0


def _built_chain(graph: Any, fuse: bool) -> Any:
    """The source chain of ``graph`` built by ``Task``, wired fused or not, its hash
    writer dropping what it ships; the source's output (where records enter)."""
    import epochstream.runtime.task as task_module
    from epochstream.runtime.messages import TaskDeployment
    from epochstream.runtime.outputs import Channel, RecordWriter
    from epochstream.runtime.snapshots import SnapshotExecutor
    from epochstream.runtime.task import Task, TaskEnvironment

    class Drop(Channel):
        def send(self, item: Any) -> None:
            """Only the chain is measured."""

    chain = graph.chains[0]
    tenv = TaskEnvironment(
        job_id="bench",
        attempt=1,
        checkpoint_dir=None,
        checkpointing=False,
        exactly_once=True,
        send=lambda msg: None,
        snapshots=SnapshotExecutor(),
    )
    task = Task(tenv, graph, chain, TaskDeployment(chain_id=chain.chain_id, subtask=0))
    (edge,) = graph.outgoing(chain.chain_id)
    task.writers[edge.edge_id] = RecordWriter(
        [Drop()],
        partitioning=edge.partitioning,
        max_parallelism=graph.max_parallelism,
        batch_size=graph.batch_size,
    )
    # Task._build wires the chain with the module's wire_chain: swap in the variant.
    wire = task_module.wire_chain
    task_module.wire_chain = functools.partial(wire, fuse=fuse)  # type: ignore[assignment]
    try:
        task._build()
    finally:
        task_module.wire_chain = wire
    return task.operators[0].output.collect


def _export(commit: str, into: str) -> str:
    archive = subprocess.run(
        ["git", "-C", ROOT, "archive", commit, "src"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", into], input=archive, check=True)
    return os.path.join(into, "src")


def _run(src: str, events: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": src}
    out = subprocess.run(
        [sys.executable, __file__, "--child", "--events", str(events)],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


def _instructions(src: str, events: int) -> float:
    """Instructions per event of one tree (callgrind, difference of two sizes)."""
    counts = []
    for n in (events, 2 * events):
        err = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                "--callgrind-out-file=/dev/null",
                sys.executable,
                __file__,
                "--child",
                "--events",
                str(n),
            ],
            env={**os.environ, "PYTHONPATH": src},
            check=True,
            capture_output=True,
            text=True,
        ).stderr
        (line,) = [ln for ln in err.splitlines() if "Collected :" in ln]
        counts.append(int(line.split()[-1]))
    return (counts[1] - counts[0]) / events


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base", help="commit to compare with (default: this tree only)")
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--fusion", action="store_true", help="measure operator fusion")
    parser.add_argument(
        "--instructions", action="store_true", help="count instructions under valgrind"
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.fusion:
        return _fusion(args.rounds)
    if args.child:
        print(json.dumps(_measure(args.events)))
        return 0
    with tempfile.TemporaryDirectory(prefix="epochstream-base-") as tmp:
        trees = {"now": os.path.join(ROOT, "src")}
        if args.base:
            trees = {"base": _export(args.base, tmp), **trees}
        if args.instructions:
            per_event = {name: _instructions(src, args.events) for name, src in trees.items()}
            for name, ir in per_event.items():
                print(f"  {name:5s} {ir:8.0f} instructions per event")
            if args.base:
                base_ir, now_ir = per_event["base"], per_event["now"]
                print(f"  change {(now_ir - base_ir) / base_ir * 100:+.2f} %")
            return 0
        rows: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
        for round_no in range(args.rounds):
            order = list(trees) if round_no % 2 == 0 else list(reversed(trees))
            for name in order:
                rows[name].append(_run(trees[name], args.events))
            shown = ", ".join(f"{n} {rows[n][-1]['total']:.0f} ns/event" for n in trees)
            print(f"round {round_no + 1}: {shown}", flush=True)
    print(f"load {os.getloadavg()[0]:.1f}; CPU ns per event, best of {args.rounds} (median):")
    for name, runs in rows.items():
        best = min(runs, key=lambda r: r["total"])
        parts = ", ".join(f"{k} {best[k]:.0f}" for k in ("produce", "unpickle", "consume"))
        median = statistics.median(r["total"] for r in runs)
        print(f"  {name:5s} {best['total']:6.0f} ({median:.0f})   {parts}")
    if args.base:
        base, now = (min(r["total"] for r in rows[n]) for n in ("base", "now"))
        print(f"  change {(now - base) / base * 100:+.1f} % (negative: less CPU per event)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
