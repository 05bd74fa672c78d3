"""Fused map / filter / flat_map runs: same records, timestamps, side outputs, counts and
errors as the operators one by one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import epochstream as es
from epochstream.connectors.base import AtLeastOnceSinkWriter, Sink, SinkContext
from epochstream.exceptions import UserFunctionError
from epochstream.graph.jobgraph import JobGraph
from epochstream.runtime import chain as chain_module
from epochstream.runtime.fusion import _loop_source, fusable_runs
from epochstream.runtime.messages import TaskDeployment
from epochstream.runtime.outputs import Channel, RecordWriter
from epochstream.runtime.snapshots import SnapshotExecutor
from epochstream.runtime.task import Task, TaskEnvironment
from epochstream.state.backends.heap.backend import HeapStateBackend

ODD = es.OutputTag("odd")


class Collect(Sink):
    """Keeps what its writer is given, with the timestamps the sink operator saw."""

    def __init__(self) -> None:
        self.records: list[Any] = []

    def create_writer(self, ctx: SinkContext) -> AtLeastOnceSinkWriter:
        return _CollectWriter(self.records)


class _CollectWriter(AtLeastOnceSinkWriter):
    def __init__(self, into: list[Any]) -> None:
        self.into = into

    def write_batch(self, records: list[Any]) -> None:
        self.into.extend(records)

    def snapshot(self, checkpoint_id: int) -> list[Any]:
        return []


class Drop(Channel):
    def send(self, item: Any) -> None:
        """Only the chain's own operators are looked at."""


class SplitOdd(es.ProcessFunction):
    """Even values on, odd ones to a side output; each with its timestamp."""

    def process_element(self, value: int, ctx: Any, out: Any) -> None:
        if value % 2:
            ctx.output(ODD, (value, ctx.timestamp()))
        else:
            out.collect((value, ctx.timestamp()))


def _plus_one(x: int) -> int:
    return x + 1


def _not_seven(x: int) -> bool:
    return x % 7 != 0


def _twice(x: int) -> list[int]:
    return [x, x * 10]


def _times_three(x: int) -> int:
    if x == 12_340:
        raise ValueError("twelve thousand three hundred forty")
    return x * 3


def _graph(main: Collect, odd: Collect) -> JobGraph:
    env = es.Environment(parallelism=1, runner="local")
    split = (
        env.from_collection([])
        .map(_plus_one)
        .filter(_not_seven)
        .map(_plus_one)
        .flat_map(_twice)
        .map(_times_three)
        .process(SplitOdd())
    )
    split.sink_to(main)
    split.get_side_output(ODD).sink_to(odd)
    return env.job_graph("fusion-test")


def _task(
    graph: JobGraph, tmp_path: Path, *, fuse: bool, monkeypatch: Any, chain: Any = None
) -> Task:
    env = TaskEnvironment(
        job_id="fusion",
        attempt=0,
        checkpoint_dir=None,
        checkpointing=False,
        exactly_once=True,
        send=lambda msg: None,
        snapshots=SnapshotExecutor(),
        state_backend=HeapStateBackend(),
        local_dir=str(tmp_path),
    )
    chain = chain or graph.chains[0]
    task = Task(env, graph, chain, TaskDeployment(chain_id=chain.chain_id, subtask=0))
    for edge in graph.outgoing(chain.chain_id):
        task.writers[edge.edge_id] = RecordWriter(
            [Drop()], partitioning=edge.partitioning, max_parallelism=128, batch_size=100
        )
    wire = chain_module.wire_chain
    monkeypatch.setattr(
        "epochstream.runtime.task.wire_chain",
        lambda *args: wire(*args, fuse=fuse),
    )
    task._build()
    return task


def _expected(values: list[int], timestamps: list[Any]) -> tuple[list[Any], list[Any]]:
    main: list[Any] = []
    odd: list[Any] = []
    for v, ts in zip(values, timestamps, strict=True):
        v = v + 1
        if not _not_seven(v):
            continue
        for w in _twice(v + 1):
            w = _times_three(w)
            (odd if w % 2 else main).append((w, ts))
    return main, odd


@pytest.mark.parametrize("timed", [True, False])
def test_fused_chain_gives_what_the_operators_give_one_by_one(
    tmp_path: Path, monkeypatch: Any, timed: bool
) -> None:
    values = list(range(200))
    timestamps = [1_000 + v for v in values] if timed else None
    results = {}
    for fuse in (False, True):
        main, odd = Collect(), Collect()
        graph = _graph(main, odd)
        task = _task(graph, tmp_path / str(fuse), fuse=fuse, monkeypatch=monkeypatch)
        source = task.operators[0]
        source.output.collect(values[:120], None if timestamps is None else timestamps[:120])
        source.output.collect(values[120:], None if timestamps is None else timestamps[120:])
        counts = {uid: (c.records_in, c.records_out) for uid, c in task.metrics.operators.items()}
        results[fuse] = (main.records, odd.records, counts)
    assert results[True] == results[False]
    main_records, odd_records, counts = results[True]
    expected_main, expected_odd = _expected(values, timestamps or [None] * len(values))
    assert main_records == expected_main and odd_records == expected_odd
    assert odd_records, "the side output got records"
    kept = sum(1 for v in values if _not_seven(v + 1))
    assert (len(values), kept) in counts.values(), "the filter's counts per batch"
    assert (kept, kept) in counts.values(), "the map after the filter"
    assert (kept, 2 * kept) in counts.values(), "the flat_map's counts per batch"
    assert (2 * kept, 2 * kept) in counts.values(), "the map after the flat_map"


def _runs(graph: JobGraph, tmp_path: Path, monkeypatch: Any) -> list[list[list[str]]]:
    """Per chain, the kinds of each fusable run."""
    out = []
    for n, chain in enumerate(graph.chains):
        task = _task(graph, tmp_path / str(n), fuse=False, monkeypatch=monkeypatch, chain=chain)
        ops = {op.uid: op for op in task.operators}
        out.append([[spec.kind for spec in run] for run in fusable_runs(chain, ops)])
    return out


def test_runs_hold_one_count_changing_step_and_stop_at_keyed_or_shared_outputs(
    tmp_path: Path, monkeypatch: Any
) -> None:
    assert _runs(_graph(Collect(), Collect()), tmp_path / "a", monkeypatch) == [
        [["map", "filter", "map"], ["flat_map", "map"]]
    ]
    env = es.Environment(parallelism=1, runner="local")
    shared = env.from_collection([]).map(_plus_one)
    shared.map(_plus_one).map(_plus_one).sink_to(Collect())
    shared.filter(_not_seven).sink_to(Collect())
    keyed = env.from_collection([]).key_by(_plus_one).map(_plus_one).map(_plus_one)
    keyed.map(_plus_one).sink_to(Collect())
    runs = _runs(env.job_graph("runs"), tmp_path / "b", monkeypatch)
    assert sorted(runs) == sorted([[["map", "map"]], [], [["map", "map"]]]), (
        "a map with two consumers and a keyed map stay on their own"
    )


def test_a_failing_step_is_reported_as_its_operators_error_on_its_input(
    tmp_path: Path, monkeypatch: Any
) -> None:
    errors = []
    for fuse in (False, True):
        task = _task(
            _graph(Collect(), Collect()), tmp_path / str(fuse), fuse=fuse, monkeypatch=monkeypatch
        )
        with pytest.raises(UserFunctionError) as info:
            # 1232 -> 1233 (kept) -> 1234 -> [1234, 12340]: _times_three fails on 12340.
            task.operators[0].output.collect([5, 1232, 9], None)
        errors.append((info.value.operator, info.value.record_repr, str(info.value)))
    assert errors[0] == errors[1]
    assert errors[1][1] == "12340" and "twelve thousand" in errors[1][2]


def test_generated_loop_of_a_map_run_passes_the_timestamps_on() -> None:
    source, _ = _loop_source(("map", "map"), timed=True)
    assert "zip" not in source, "a run of maps keeps the input's timestamps list"
    assert "keep_ts" in _loop_source(("map", "filter"), timed=True)[0]
