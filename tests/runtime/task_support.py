"""What the Task tests share: fakes standing in for the job master and the channels, and
helpers that build a task of one chain and script its input.

``Control`` is the fake job master (it records what the task sends and may answer with
mail), ``ListChannel`` keeps what the task writes downstream, ``LogSink`` logs the records
and the checkpoint events its writers see, and ``InlineSnapshots`` runs snapshot jobs on
the task thread. ``make_task`` builds the task; ``feed`` queues its input.

Example::

    graph = map_graph()
    control = Control()
    task, outputs = make_task(graph, chain_with(graph, "map"), tmp_path, control)
    feed(task, 0, [1, 2], END_OF_INPUT)
    feed(task, 1, END_OF_INPUT)
    finish_when_done(control, task)
    task.run()
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import epochstream as es
from epochstream.connectors.base import AtLeastOnceSinkWriter, Sink, SinkContext
from epochstream.core.events import (
    MAX_WATERMARK,
    CheckpointBarrier,
    CheckpointOptions,
    Watermark,
)
from epochstream.graph.jobgraph import ChainSpec, JobGraph
from epochstream.runtime.batches import RowBatch
from epochstream.runtime.messages import FinishSlot, TaskDeployment, TaskFinished
from epochstream.runtime.outputs import Channel, RecordWriter
from epochstream.runtime.snapshots import SnapshotExecutor
from epochstream.runtime.task import Task, TaskEnvironment
from epochstream.state.backends.heap.backend import HeapStateBackend
from epochstream.state.channel_state import ChannelRestore
from epochstream.state.handles import OperatorRestore

T = TypeVar("T")
MAX_P = 128

#: The watermark a task sends when its input ends: event time is complete.
END_OF_TIME = Watermark(MAX_WATERMARK)


# ---------------------------------------------------------------- fakes


class InlineSnapshots(SnapshotExecutor):
    """Synchronous snapshot executor: runs each job at once on the submitting thread."""

    def submit(self, job: Callable[[], None]) -> None:
        job()


class Control:
    """Fake ``TaskEnvironment.send``: records messages; ``react`` may answer with mail."""

    def __init__(self) -> None:
        self.sent: list[Any] = []
        self.react: Callable[[Any], None] | None = None

    def __call__(self, msg: Any) -> None:
        self.sent.append(msg)
        if self.react is not None:
            self.react(msg)

    def of(self, kind: type[T]) -> list[T]:
        return [m for m in self.sent if isinstance(m, kind)]

    def kinds(self) -> list[str]:
        return [type(m).__name__ for m in self.sent]


class ListChannel(Channel):
    """An output channel that keeps every batch and event it is sent."""

    def __init__(self) -> None:
        self.items: list[Any] = []

    def send(self, item: Any) -> None:
        self.items.append(item)

    @property
    def records(self) -> list[Any]:
        return [r for item in self.items if _is_batch(item) for r in item.records]

    @property
    def events(self) -> list[Any]:
        return [item for item in self.items if not _is_batch(item)]

    def records_between(self, after: int | None, before: int | None) -> list[Any]:
        """Records after barrier ``after`` (None: from the start) and before barrier ``before``."""
        out: list[Any] = []
        inside = after is None
        for item in self.items:
            if isinstance(item, CheckpointBarrier):
                if item.checkpoint_id == after:
                    inside = True
                elif item.checkpoint_id == before:
                    return out
            elif _is_batch(item) and inside:
                out.extend(item.records)
        return out


def _is_batch(item: Any) -> bool:
    return type(item) is RowBatch


@dataclass(frozen=True)
class Mark:
    """A sink-writer event in the log, between the records it wrote."""

    what: str
    checkpoint_id: int = 0


class LogSink(Sink):
    """Every writer appends its records and ``Mark``s (snapshot, complete, end) to ``log``."""

    def __init__(self, *, fail_snapshot: bool = False) -> None:
        self.log: list[Any] = []
        self.fail_snapshot = fail_snapshot

    def create_writer(self, ctx: SinkContext) -> LogWriter:
        return LogWriter(self)

    def records_before(self, what: str, checkpoint_id: int) -> list[Any]:
        return self.log[: self.log.index(Mark(what, checkpoint_id))]

    @property
    def records(self) -> list[Any]:
        return [r for r in self.log if not isinstance(r, Mark)]


class LogWriter(AtLeastOnceSinkWriter):
    """The writer of a ``LogSink``: appends to its sink's log."""

    def __init__(self, sink: LogSink) -> None:
        self.sink = sink

    def write_batch(self, records: list[Any]) -> None:
        self.sink.log.extend(records)

    def snapshot(self, checkpoint_id: int) -> list[Any]:
        if self.sink.fail_snapshot:
            raise RuntimeError("sink cannot pre-commit")
        self.sink.log.append(Mark("snapshot", checkpoint_id))
        return []

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self.sink.log.append(Mark("complete", checkpoint_id))

    def end_input(self) -> None:
        self.sink.log.append(Mark("end"))

    def abandon_checkpoints_above(self, checkpoint_id: int) -> None:
        self.sink.log.append(Mark("abandon", checkpoint_id))


# ---------------------------------------------------------------- building tasks


def chain_with(graph: JobGraph, kind: str) -> ChainSpec:
    """The chain whose head operator is of ``kind``."""
    return next(c for c in graph.chains if c.head.kind == kind)


def make_task(
    graph: JobGraph,
    chain: ChainSpec,
    tmp_path: Path,
    control: Control,
    *,
    subtask: int = 0,
    snapshots: SnapshotExecutor | None = None,
    exactly_once: bool = True,
    checkpointing: bool = True,
    restore: dict[str, OperatorRestore] | None = None,
    splits: list[Any] | None = None,
    restored_checkpoint: int | None = None,
    checkpoint_dir: str | None = None,
    unaligned: bool = False,
    channel_state: list[ChannelRestore] | None = None,
) -> tuple[Task, dict[int, list[ListChannel]]]:
    """A task of ``chain`` with list channels on every outgoing edge (by edge id);
    ``unaligned`` gives it an overtaking gate, ``channel_state`` what it replays."""
    if checkpoint_dir is None:
        checkpoint_dir = str(tmp_path / "ckpt" / "job")
        os.makedirs(checkpoint_dir, exist_ok=True)  # as the job master makes it
    env = TaskEnvironment(
        job_id="job",
        attempt=0,
        checkpoint_dir=checkpoint_dir,
        checkpointing=checkpointing,
        exactly_once=exactly_once,
        unaligned=unaligned,
        send=control,
        snapshots=snapshots or InlineSnapshots(),
        state_backend=HeapStateBackend(),
        local_dir=str(tmp_path / "local"),
    )
    deployment = TaskDeployment(
        chain_id=chain.chain_id,
        subtask=subtask,
        restore=restore or {},
        splits=splits,
        restored_checkpoint=restored_checkpoint,
        channel_state=channel_state or [],
    )
    task = Task(env, graph, chain, deployment)
    task.gate.capacity = 1_000  # a test queues all input up front
    outputs: dict[int, list[ListChannel]] = {}
    for edge in graph.outgoing(chain.chain_id):
        channels = [ListChannel() for _ in range(graph.parallelism)]
        task.writers[edge.edge_id] = RecordWriter(
            list(channels),
            partitioning=edge.partitioning,
            max_parallelism=graph.max_parallelism,
            batch_size=graph.batch_size,
            subtask_index=subtask,
        )
        outputs[edge.edge_id] = channels
    return task, outputs


def feed(task: Task, upstream: int, *items: Any) -> None:
    """Queue ``items`` on the channel from upstream subtask ``upstream`` of the first input;
    a plain list is a batch of records without timestamps (``RowBatch(list)``)."""
    edge = task.chain.inputs[0]
    channel = task.channel_index(edge.edge_id, upstream)
    for item in items:
        task.gate.put(channel, RowBatch(item) if type(item) is list else item)


def finish_when_done(control: Control, task: Task) -> None:
    """The fake job master's answer to ``TaskFinished``: ``FinishSlot``."""

    def react(msg: Any) -> None:
        if isinstance(msg, TaskFinished):
            task.gate.put_mail(FinishSlot())

    control.react = react


def barrier(n: int, **options: Any) -> CheckpointBarrier:
    """Checkpoint barrier ``n`` (timestamp ``1000 + n``) with the given options."""
    return CheckpointBarrier(n, 1_000.0 + n, CheckpointOptions(**options))


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    """Poll ``condition`` until it holds; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.001)


def times_ten(i: int) -> int:
    """The map of the source and map graphs."""
    return i * 10


def mod2(i: int) -> int:
    """Key selector of integer records: two keys."""
    return i % 2


def first_field(t: tuple[Any, ...]) -> Any:
    """Key selector of tuple records: the first field."""
    return t[0]


def add(a: Any, b: Any) -> Any:
    """Reduce function of integer records: the running sum."""
    return a + b


def add_pairs(a: tuple[str, int], b: tuple[str, int]) -> tuple[str, int]:
    """Reduce function of ``(key, count)`` pairs: the key and the running sum."""
    return (a[0], a[1] + b[1])


# ---------------------------------------------------------------- job graphs to take chains from


def map_graph(fn: Callable[[int], Any] = times_ten) -> JobGraph:
    """source -(rebalance)-> map -(hash)-> reduce -> sink, at parallelism 2."""
    env = es.Environment(parallelism=2, runner="local", batch_size=100)
    env.from_collection([]).rebalance().map(fn).key_by(mod2).reduce(add).sink_to(LogSink())
    return env.job_graph("map-test")


def reduce_graph(sink: LogSink, parallelism: int = 1) -> JobGraph:
    """source -(hash)-> reduce -> sink."""
    env = es.Environment(parallelism=parallelism, runner="local", batch_size=100)
    env.from_collection([]).key_by(first_field).reduce(add_pairs).sink_to(sink)
    return env.job_graph("reduce-test")
