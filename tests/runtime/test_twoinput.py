"""Two-input operators driven directly: a keyed co-process function whose state and
timers both inputs share, and the interval join, on real heap and RocksDB backends,
with snapshots and restores (the rig of ``test_windows``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import epochstream as es
from epochstream.runtime.operators import OperatorContext, create_operator
from epochstream.runtime.operators.twoinput import TwoInputOperator
from epochstream.state.backends.base import KeyedBackendContext
from epochstream.state.backends.heap.backend import HeapStateBackend
from epochstream.state.backends.rocksdb.backend import RocksDBStateBackend
from epochstream.state.handles import OperatorRestore
from epochstream.state.keygroups import key_group_range_for_operator
from epochstream.state.operator import OperatorStateStore

from .window_support import MAX_P, Out, Rig


def _first(t: Any) -> Any:
    return t[0]


def two_input(rig: Rig, build: Any, kind: str, restore: Any = None) -> tuple[TwoInputOperator, Out]:
    """The ``kind`` operator of the job ``build(env)`` makes, on ``rig``'s backend kind."""
    rig.made += 1
    env = es.Environment(parallelism=1, runner="local")
    build(env)
    graph = env.job_graph("two-input")
    spec = next(op for chain in graph.chains for op in chain.operators if op.kind == kind)
    config = HeapStateBackend() if rig.kind == "heap" else RocksDBStateBackend(block_cache_mb=8)
    backend = config.create(
        KeyedBackendContext(
            operator_uid=spec.uid,
            subtask=0,
            max_parallelism=MAX_P,
            key_group_range=key_group_range_for_operator(MAX_P, 1, 0),
            clock=rig.clock,
            local_dir=str(rig.root / f"local-{rig.made}"),
        )
    )
    ctx = OperatorContext(
        subtask_index=0,
        parallelism=1,
        max_parallelism=MAX_P,
        attempt=0,
        job_id="job",
        task_name=f"{kind} (1/1)",
        operator_state=OperatorStateStore(),
        keyed_backend=backend,
        checkpointing=True,
        clock=rig.clock,
    )
    op = create_operator(spec, ctx)
    assert isinstance(op, TwoInputOperator)
    out = Out()
    op.output = out
    if restore is not None:
        op.initialize_state(OperatorRestore(keyed=[restore]), checkpoint_id=None)
    op.open()
    return op, out


@pytest.fixture(params=["heap", "rocksdb"])
def rig(request: pytest.FixtureRequest, tmp_path: Path) -> Rig:
    return Rig(request.param, tmp_path)


class Pairing(es.KeyedCoProcessFunction):
    """Keeps the last value of input 1 per key; input 2 pairs with it; a timer per
    input-2 record emits (key, "timeout") if input 1 never came."""

    def open(self, ctx: Any) -> None:
        self.last = ctx.get_state(es.state.ValueStateDescriptor("last"))

    def process_element1(self, value: Any, ctx: Any, out: Any) -> None:
        self.last.update(value[1])

    def process_element2(self, value: Any, ctx: Any, out: Any) -> None:
        if self.last.value() is None:
            ctx.timer_service().register_event_time_timer(ctx.timestamp() + 100)
        else:
            out.collect((value[0], self.last.value(), value[1]))

    def on_timer(self, timestamp: int, ctx: Any, out: Any) -> None:
        if self.last.value() is None:
            out.collect((ctx.current_key, "timeout", timestamp))


def _pairing(env: es.Environment) -> None:
    a = env.from_collection([]).key_by(_first)
    b = env.from_collection([]).key_by(_first)
    a.connect(b).process(Pairing()).print()


def test_keyed_co_process_shares_state_and_timers_across_inputs_and_restores(rig: Rig) -> None:
    op, out = two_input(rig, _pairing, "co_process")
    op.process_input(0, [("a", 1)], [10])
    op.process_input(1, [("a", "x"), ("b", "y")], [20, 30])  # b has no input-1 value: timer
    assert out.take() == [("a", 1, "x")]
    handle = rig.snapshot(op, 1)  # type: ignore[arg-type]
    again, out2 = two_input(rig, _pairing, "co_process", restore=handle)
    again.process_input(0, [("a", 2)], [40])
    again.process_input(1, [("a", "z")], [50])
    assert out2.take() == [("a", 2, "z")], "input 1's state came back with the restore"
    again.process_watermark(129)
    assert out2.take() == []
    again.process_watermark(130)
    again.flush_timer_output()
    assert out2.records == [("b", "timeout", 130)], "the timer came back with the restore"
    assert out2.timestamps == [130], "an event-time timer's output has the timer's time"


class Pairs(es.ProcessJoinFunction):
    def process_element(self, left: Any, right: Any, ctx: Any, out: Any) -> None:
        out.collect((left[1], right[1], ctx.timestamp()))


def _interval(env: es.Environment) -> None:
    a = env.from_collection([]).key_by(_first)
    b = env.from_collection([]).key_by(_first)
    a.interval_join(b).between(-10, 20).process(Pairs()).print()


def test_interval_join_pairs_within_bounds_in_either_arrival_order(rig: Rig) -> None:
    op, out = two_input(rig, _interval, "interval_join")
    op.process_input(0, [("k", "L100")], [100])
    rights = [("k", "R89"), ("k", "R90"), ("k", "R120"), ("k", "R121"), ("j", "R100")]
    op.process_input(1, rights, [89, 90, 120, 121, 100])
    op.process_input(0, [("k", "L105")], [105])  # a left after its rights: pairs too
    assert sorted(out.take()) == sorted(
        [("L100", "R90", 100), ("L100", "R120", 120), ("L105", "R120", 120), ("L105", "R121", 121)]
    )


def test_interval_join_state_is_cleaned_up_once_the_watermark_passes(rig: Rig) -> None:
    op, out = two_input(rig, _interval, "interval_join")
    op.process_input(0, [("k", "L100")], [100])
    op.process_input(1, [("k", "R110")], [110])
    assert out.take() == [("L100", "R110", 110)]
    op.process_watermark(10_000)
    op.flush_timer_output()
    assert op.timers is not None and op.timers.pending() == 0, "cleanup timers fired"
    op.process_input(1, [("k", "R111")], [111])  # late: its left is gone
    assert out.take() == []


def _bounded(
    lower_exclusive: bool, upper_exclusive: bool, lower: int = -10, upper: int = 20
) -> Any:
    def build(env: es.Environment) -> None:
        a = env.from_collection([]).key_by(_first)
        b = env.from_collection([]).key_by(_first)
        join = a.interval_join(b).between(lower, upper)
        if lower_exclusive:
            join = join.lower_bound_exclusive()
        if upper_exclusive:
            join = join.upper_bound_exclusive()
        join.process(Pairs()).print()

    return build


@pytest.mark.parametrize(
    ("lower_exclusive", "upper_exclusive", "expected"),
    [
        (False, False, ["R90", "R91", "R119", "R120"]),
        (True, False, ["R91", "R119", "R120"]),
        (False, True, ["R90", "R91", "R119"]),
        (True, True, ["R91", "R119"]),
    ],
)
def test_interval_join_exclusive_bounds_leave_out_pairs_exactly_at_a_bound(
    rig: Rig, lower_exclusive: bool, upper_exclusive: bool, expected: list[str]
) -> None:
    """Flink's lowerBoundExclusive()/upperBoundExclusive(): left.ts + lower < right.ts
    (resp. right.ts < left.ts + upper); in either arrival order."""
    op, out = two_input(rig, _bounded(lower_exclusive, upper_exclusive), "interval_join")
    op.process_input(0, [("k", "L100")], [100])
    rights = [("k", f"R{t}") for t in (89, 90, 91, 119, 120, 121)]
    op.process_input(1, rights, [89, 90, 91, 119, 120, 121])
    assert sorted(r for _, r, _ in out.take()) == sorted(expected)
    op2, out2 = two_input(rig, _bounded(lower_exclusive, upper_exclusive), "interval_join")
    op2.process_input(1, rights, [89, 90, 91, 119, 120, 121])
    op2.process_input(0, [("k", "L100")], [100])
    assert sorted(r for _, r, _ in out2.take()) == sorted(expected)


def test_interval_join_with_equal_bounds_one_exclusive_joins_nothing(rig: Rig) -> None:
    op, out = two_input(rig, _bounded(True, False, lower=0, upper=0), "interval_join")
    op.process_input(0, [("k", "L100")], [100])
    op.process_input(1, [("k", "R100")], [100])
    assert out.take() == []
    op.process_watermark(10_000)
    assert op.timers is not None and op.timers.pending() == 0, "records are still cleaned up"
