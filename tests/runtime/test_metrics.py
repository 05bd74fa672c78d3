"""Task metrics: wait clocks, the gate's idle and backpressure time, per-batch counting."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from epochstream.core.events import MAX_WATERMARK
from epochstream.runtime.channels import InputGate
from epochstream.runtime.messages import TaskCheckpointStats
from epochstream.runtime.metrics import TaskMetrics, TaskSampler, WaitClock
from epochstream.runtime.outputs import LocalChannel


def test_wait_clock_counts_finished_and_ongoing_waits() -> None:
    clock = WaitClock()
    assert clock.total(time.perf_counter()) == 0.0
    clock.begin()
    time.sleep(0.02)
    clock.end()
    done = clock.total(time.perf_counter())
    assert 0.02 <= done < 1.0
    clock.begin()
    later = time.perf_counter() + 5.0
    assert clock.total(later) >= done + 5.0  # a wait in progress counts up to "now"
    clock.end()
    clock.end()  # ending twice adds nothing
    assert clock.total(time.perf_counter()) < done + 1.0


def test_gate_counts_consumer_idle_time_only_while_waiting() -> None:
    gate = InputGate(1)
    gate.put(0, [1])
    assert gate.take(0.5) == (0, [1])
    assert gate.idle.total(time.perf_counter()) == 0.0  # input was there: no wait
    assert gate.take(0.05) is None
    assert gate.idle.total(time.perf_counter()) >= 0.04


def test_a_full_local_channel_counts_the_producers_backpressure() -> None:
    gate = InputGate(1, capacity=1)
    pressure = WaitClock()
    channel = LocalChannel(gate, 0, pressure)
    channel.send([1])
    assert pressure.total(time.perf_counter()) == 0.0
    threading.Timer(0.1, lambda: gate.take(0)).start()
    channel.send([2])  # blocks until the consumer takes the first batch
    assert pressure.total(time.perf_counter()) >= 0.08


def test_gate_fill_is_the_share_of_queued_batches() -> None:
    gate = InputGate(2, capacity=4)
    assert gate.fill() == 0.0
    for _ in range(4):
        gate.put(0, [0])
    assert gate.fill() == 0.5


class _FakeGate:
    """A gate whose idle time and fill the test sets."""

    def __init__(self) -> None:
        self.idle = WaitClock()
        self.queued = 0.25

    def fill(self) -> float:
        return self.queued


def test_sampler_turns_counters_into_rates_and_time_shares() -> None:
    gate = _FakeGate()
    metrics = TaskMetrics(("chain", 1), [("src", "numbers"), ("map", "triple")], gate)
    sampler = TaskSampler(metrics, now=100.0)
    metrics.operators["src"].records_out += 2000
    metrics.operators["map"].records_in += 2000
    metrics.operators["map"].records_out += 1000
    metrics.head.watermark = 9_000
    metrics.operators["map"].late_records_dropped += 3
    gate.idle._done = 0.25  # 250 ms idle in the 2 s interval below
    metrics.backpressure._done = 1.0  # 1 s backpressured
    metrics.last_checkpoint = TaskCheckpointStats(
        alignment_s=0.1, sync_s=0.2, async_s=0.3, state_size=77
    )
    sample = sampler.sample(now=102.0, wall_ms=10_000)
    ops = {op.uid: op for op in sample.operators}
    assert ops["src"].records_out == 2000 and ops["src"].records_out_per_s == 1000.0
    assert ops["map"].records_in_per_s == 1000.0 and ops["map"].records_out_per_s == 500.0
    assert ops["map"].late_records_dropped == 3 and ops["src"].late_records_dropped == 0
    assert sample.idle_ms_per_s == 125.0
    assert sample.backpressured_ms_per_s == 500.0
    assert sample.busy_ms_per_s == 375.0
    assert sample.queue_fill == 0.25
    assert (sample.watermark, sample.watermark_lag_ms) == (9_000, 1_000.0)
    assert sample.state_size == 77
    assert (sample.checkpoint_alignment_s, sample.checkpoint_sync_s) == (0.1, 0.2)
    assert sample.checkpoint_async_s == 0.3
    # The next interval counts only what happened since.
    metrics.operators["src"].records_out += 500
    later = sampler.sample(now=103.0, wall_ms=11_000)
    assert {op.uid: op.records_out_per_s for op in later.operators}["src"] == 500.0
    assert later.backpressured_ms_per_s == 0.0 and later.busy_ms_per_s == 1000.0
    assert later.to_dict()["operators"][0]["records_out"] == 2500


def test_end_of_time_watermarks_are_not_reported() -> None:
    metrics = TaskMetrics(("chain", 0), [("src", "numbers")], _FakeGate())
    sampler = TaskSampler(metrics, now=0.0)
    metrics.head.watermark = MAX_WATERMARK
    sample = sampler.sample(now=1.0, wall_ms=5)
    assert sample.watermark is None and sample.watermark_lag_ms is None


def test_wire_chain_counts_each_operators_batches() -> None:
    from epochstream.graph.jobgraph import ChainSpec, OperatorSpec, OutputSpec
    from epochstream.runtime.chain import wire_chain
    from epochstream.runtime.metrics import OperatorCounters
    from epochstream.runtime.operator_outputs import DISCARD

    class _Op:
        def __init__(self, uid: str) -> None:
            self.uid = uid
            self.got: list[Any] = []
            self.marks: list[int] = []
            self.output: Any = DISCARD
            self.side_outputs: dict[str, Any] = {}

        def process_batch(self, records: list[Any], timestamps: Any) -> None:
            self.got.extend(records)
            self.output.collect([r for r in records if r % 2 == 0], None)

        def process_watermark(self, mark: int) -> None:
            self.marks.append(mark)

        def process_status(self, idle: bool) -> None:
            pass

    chain = ChainSpec(
        "c",
        [
            OperatorSpec("a", "a", "map", None, outputs=[OutputSpec("main", chained_uid="b")]),
            OperatorSpec("b", "b", "map", None, outputs=[]),
        ],
    )
    ops = {"a": _Op("a"), "b": _Op("b")}
    counters = {uid: OperatorCounters(uid, uid) for uid in ops}
    wire_chain(chain, ops, {}, counters)  # type: ignore[arg-type]
    ops["a"].process_batch([1, 2, 3, 4], None)
    ops["a"].output.emit_watermark(42)
    assert (counters["a"].records_out, counters["b"].records_in) == (2, 2)
    assert counters["b"].records_out == 0  # a chain's last operator without outputs: a sink
    assert counters["b"].watermark == 42 and ops["b"].marks == [42]


@pytest.mark.parametrize("capacity", [1, 4])
def test_put_without_a_pressure_clock_still_blocks_and_delivers(capacity: int) -> None:
    gate = InputGate(1, capacity=capacity)
    for i in range(capacity):
        gate.put(0, [i])
    threading.Timer(0.05, lambda: gate.take(0)).start()
    gate.put(0, ["last"])
    assert gate.fill() == 1.0
