"""The group aggregation's mini-batch (Flink's ``table.exec.mini-batch``): the input is
held until ``size`` rows or ``latency`` on the operator's clock, and folded before a
watermark, a checkpoint barrier and the end of the input; its changelog leaves the
same table as the unbuffered operator's with fewer changes."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from aggregate_support import (
    BACKENDS,
    CATALOG,
    VALUES_SCHEMA,
    Upserted,
    assert_equal,
    operator_on,
    snapshot_target,
)
from task_support import Control, LogSink, barrier, chain_with, finish_when_done, make_task

import epochstream as es
from epochstream.core.changelog import RowKind, kind_names, with_kinds
from epochstream.core.clock import ManualClock
from epochstream.core.events import END_OF_INPUT, CheckpointBarrier
from epochstream.exceptions import ConfigurationError
from epochstream.graph.specs import AggCall, GroupAggregateSpec, MiniBatch
from epochstream.runtime.messages import AcknowledgeCheckpoint
from epochstream.state.handles import OperatorRestore

KIND = "columnar_group_aggregate"
COUNT = (AggCall("count_star", None, "n"), AggCall("max", "v", "top"))


def _op(spec: GroupAggregateSpec, clock: ManualClock, backend: str = "heap", d: str = "") -> Any:
    return operator_on(KIND, spec, spec.keys, clock=clock, backend=backend, local_dir=d)


def _rows(n: int, seed: int = 0) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [
        {
            "k1": rng.randint(0, 4),
            "k2": rng.choice(["a", None]),
            "v": rng.choice([None, rng.randint(-9, 9)]),
            "f": rng.choice([None, float("nan"), 0.5, -1.5]),
            "b": rng.choice([True, False, None]),
        }
        for _ in range(n)
    ]


def _batch(rows: list[dict[str, Any]]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(rows, schema=VALUES_SCHEMA)


def _spec(size: int, latency_ms: int = 1_000, **kw: Any) -> GroupAggregateSpec:
    return GroupAggregateSpec(
        keys=("k1",), aggs=COUNT, mini_batch=MiniBatch(latency_ms=latency_ms, size=size), **kw
    )


def test_the_buffer_folds_when_it_holds_size_rows() -> None:
    clock = ManualClock(start=100.0)
    op, out = _op(_spec(size=5), clock)
    rows = _rows(7)
    op.process_batch(_batch(rows[:2]), None)
    op.process_batch(_batch(rows[2:4]), None)
    assert out.batches() == []  # 4 rows of 5: held
    op.process_batch(_batch(rows[4:7]), None)  # 7 rows: folded as one batch
    (only,) = out.batches()
    assert set(kind_names(only.column("_op")).to_pylist()) == {"+I"}
    assert sum(only.column("n").to_pylist()) == 7
    assert op.next_processing_time() is None  # nothing held: no timer


def test_the_buffer_folds_when_its_latency_runs_out_on_the_clock() -> None:
    clock = ManualClock(start=100.0)
    op, out = _op(_spec(size=1_000, latency_ms=2_000), clock)
    op.process_batch(_batch(_rows(3)), None)
    assert op.next_processing_time() == 102_000  # first row at 100 s, plus 2 s
    clock.advance(1.5)
    op.process_batch(_batch(_rows(3, seed=1)), None)  # the deadline stays the first row's
    op.on_processing_time(101_500)
    assert out.batches() == []
    op.on_processing_time(102_000)
    (only,) = out.batches()
    assert sum(only.column("n").to_pylist()) == 6
    assert op.next_processing_time() is None


def test_a_watermark_a_barrier_and_the_end_of_input_fold_the_buffer_first(
    tmp_path: Path,
) -> None:
    clock = ManualClock(start=100.0)
    op, out = _op(_spec(size=1_000), clock)
    changes_before_watermark = []
    forward = out.emit_watermark

    def watermark(at: int) -> None:
        changes_before_watermark.append(len(out.batches()))
        forward(at)

    out.emit_watermark = watermark
    op.process_batch(_batch(_rows(3)), None)
    op.process_watermark(50)
    assert changes_before_watermark == [1]  # the held rows' changes, then the watermark
    op.process_batch(_batch(_rows(3, seed=1)), None)
    op.prepare_snapshot_pre_barrier(1)
    assert len(out.batches()) == 2
    op.process_batch(_batch(_rows(3, seed=2)), None)
    op.end_input()
    assert len(out.batches()) == 3
    table = Upserted(op.agg)
    for emitted in out.batches():
        table.apply(emitted)
    assert sum(v["n"] for v in table.table.values()) == 9  # every row folded


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("updating", [False, True])
def test_the_buffered_changelog_leaves_the_unbuffered_table_with_fewer_changes(
    tmp_path: Path, backend: str, updating: bool
) -> None:
    rng = random.Random(11)
    aggs = tuple(a for a in CATALOG if not updating or a.kind not in ("sum", "avg"))
    plain = GroupAggregateSpec(keys=("k1",), aggs=aggs, updating_input=updating)
    buffered = GroupAggregateSpec(
        keys=("k1",),
        aggs=aggs,
        updating_input=updating,
        mini_batch=MiniBatch(latency_ms=500, size=40),
    )
    rows = _rows(300, seed=3)
    batches = []
    live: list[dict[str, Any]] = []
    for i in range(0, 300, 10):
        chunk = rows[i : i + 10]
        kinds = [RowKind.INSERT] * len(chunk)
        if updating and live:  # retract some rows inserted before
            gone = [live.pop(rng.randrange(len(live))) for _ in range(min(3, len(live)))]
            chunk = chunk + gone
            kinds = kinds + [RowKind.UPDATE_BEFORE] * len(gone)
        live += rows[i : i + 10]
        batch = _batch(chunk)
        batches.append(with_kinds(batch, kinds) if updating else batch)
    clock = ManualClock(start=100.0)
    tables = []
    changes = []
    for n_spec, spec in enumerate((plain, buffered)):
        op, out = _op(spec, clock, backend, str(tmp_path / str(n_spec)))
        for n, batch in enumerate(batches):
            op.process_batch(batch, None)
            if n % 7 == 6:  # now and then the latency runs out
                clock.advance(1.0)
                op.on_processing_time(round(clock.wall() * 1000))
        op.end_input()
        table = Upserted(spec)
        for emitted in out.batches():
            table.apply(emitted)
        tables.append(table.table)
        changes.append(sum(b.num_rows for b in out.batches()))
        op.keyed.dispose()
    assert_equal(tables[1], tables[0])
    assert changes[1] < changes[0]


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_a_snapshot_after_the_barrier_fold_restores_every_buffered_row(
    tmp_path: Path, backend: str
) -> None:
    clock = ManualClock(start=100.0)
    spec = _spec(size=1_000)
    op, out = _op(spec, clock, backend, str(tmp_path))
    rows = _rows(20)
    op.process_batch(_batch(rows[:10]), None)
    op.prepare_snapshot_pre_barrier(1)
    handle = op.snapshot(snapshot_target(tmp_path, 1)).keyed.run()
    new, new_out = _op(spec, clock, backend, str(tmp_path))
    new.initialize_state(OperatorRestore(keyed=[handle]), 1)
    new.process_batch(_batch(rows[10:]), None)
    new.end_input()
    table = Upserted(spec)
    for emitted in out.batches() + new_out.batches():
        table.apply(emitted)
    plain = GroupAggregateSpec(keys=("k1",), aggs=COUNT)
    reference, ref_out = _op(plain, clock)
    reference.process_batch(_batch(rows), None)
    expected = Upserted(plain)
    for emitted in ref_out.batches():
        expected.apply(emitted)
    assert_equal(table.table, expected.table)


def test_a_mini_batch_needs_a_latency_and_a_size() -> None:
    with pytest.raises(ConfigurationError, match="latency and a size above 0"):
        MiniBatch(latency_ms=0, size=10)


def test_in_a_task_the_barrier_follows_the_held_rows_changes(tmp_path: Path) -> None:
    """The task calls ``prepare_snapshot_pre_barrier`` before it snapshots and forwards
    the barrier: the rows held when barrier 1 came are emitted before it, the later
    ones after it (at the end of the input), with neither size nor latency reached."""
    pq.write_table(pa.Table.from_batches([], schema=VALUES_SCHEMA), tmp_path / "in.parquet")
    env = es.Environment(parallelism=1, runner="local")
    held = MiniBatch(latency_ms=10**9, size=10**6)
    (
        env.from_parquet(str(tmp_path / "in.parquet"))
        .key_by("k1")
        .aggregate(es.agg.count_star("n"), mini_batch=held)
        .rebalance()
        .to_rows()
        .sink_to(LogSink())
    )
    graph = env.job_graph("mini-batch")
    chain = chain_with(graph, KIND)
    control = Control()
    task, outputs = make_task(graph, chain, tmp_path, control)
    channel = task.channel_index(chain.inputs[0].edge_id, 0)
    task.gate.put(channel, _batch([{**r, "k1": 1} for r in _rows(3)]))
    task.gate.put(channel, barrier(1))
    task.gate.put(channel, _batch([{**r, "k1": 2} for r in _rows(2)]))
    task.gate.put(channel, END_OF_INPUT)
    finish_when_done(control, task)
    task.run()
    (channels,) = outputs.values()
    (items,) = [c.items for c in channels]
    kinds = [type(i).__name__ for i in items if not isinstance(i, pa.RecordBatch)]
    at = next(n for n, i in enumerate(items) if isinstance(i, CheckpointBarrier))
    before = [b.to_pylist() for b in items[:at] if isinstance(b, pa.RecordBatch)]
    after = [b.to_pylist() for b in items[at:] if isinstance(b, pa.RecordBatch)]
    assert before == [[{"k1": 1, "n": 3, "_op": RowKind.INSERT}]], kinds
    assert after == [[{"k1": 2, "n": 2, "_op": RowKind.INSERT}]]
    assert control.of(AcknowledgeCheckpoint)[0].checkpoint_id == 1
