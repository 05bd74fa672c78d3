"""Metrics on real Spark: exact record counts per operator, and a slow sink's backpressure."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest

import epochstream as es
from epochstream.sinks import AtLeastOnceSinkWriter, Sink

N = 5_000


def _even(x: int) -> bool:
    return x % 2 == 0


def _add(a: int, b: int) -> int:
    return a + b


class Triple(es.MapFunction):
    """Triples; says hello in the slot's log (which must reach the driver's)."""

    def open(self, ctx: Any) -> None:
        logging.getLogger("userjob").warning("triple opened in subtask %d", ctx.subtask_index)

    def map(self, value: int) -> int:
        return value * 3


class _SlowWriter(AtLeastOnceSinkWriter):
    def write_batch(self, records: list[Any]) -> None:
        time.sleep(0.05)


class SlowSink(Sink):
    """Takes 50 ms per batch: its upstream must wait for it."""

    transactional = False

    def create_writer(self, ctx: Any) -> _SlowWriter:
        return _SlowWriter()


@pytest.mark.slow
@pytest.mark.spark
def test_records_in_and_out_per_operator_equal_the_known_counts(
    spark: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="epochstream.slots")
    env = es.Environment(parallelism=2, spark=spark)
    (
        env.from_sequence(0, N)
        .name("numbers")
        .map(Triple())
        .name("triple")
        .filter(_even)
        .name("even")
        .key_by(lambda x: x % 10)
        .reduce(_add)
        .name("sum")
        .sink_to(es.sinks.DiscardSink())
        .name("drop")
    )
    client = env.execute_async("metrics-counts")
    client.result(timeout=120)
    ops = {op["name"]: op for v in client.metrics() for op in v["operators"]}
    evens = N // 2
    assert (ops["numbers"]["records_in"], ops["numbers"]["records_out"]) == (0, N)
    assert (ops["triple"]["records_in"], ops["triple"]["records_out"]) == (N, N)
    assert (ops["even"]["records_in"], ops["even"]["records_out"]) == (N, evens)
    assert (ops["sum"]["records_in"], ops["sum"]["records_out"]) == (evens, evens)
    assert (ops["drop"]["records_in"], ops["drop"]["records_out"]) == (evens, 0)
    vertices = {v["name"]: v for v in client.metrics()}
    source = vertices["numbers -> triple -> even"]
    assert (source["records_in"], source["records_out"]) == (0, evens)
    assert vertices["sum -> drop"]["records_in"] == evens
    assert client.status()["state"] == "FINISHED"
    slot_lines = {r.getMessage() for r in caplog.records if r.name == "epochstream.slots"}
    for slot in (0, 1):
        assert f"[slot {slot} attempt 1] userjob: triple opened in subtask {slot}" in slot_lines


@pytest.mark.slow
@pytest.mark.spark
def test_a_slow_sink_shows_its_upstream_backpressured(spark: Any) -> None:
    env = es.Environment(parallelism=2, spark=spark, batch_size=64)
    (
        env.from_sequence(0, 10**9)
        .name("numbers")
        .map(lambda x: "x" * 1000)
        .name("pad")
        .rebalance()
        .sink_to(SlowSink())
        .name("slow")
    )
    client = env.execute_async("metrics-backpressure")
    try:
        client.wait_until_running(timeout=120)
        deadline = time.monotonic() + 30
        upstream: dict[str, Any] = {}
        while time.monotonic() < deadline:
            vertices = {v["name"]: v for v in client.metrics()}
            upstream = vertices.get("numbers -> pad", {})
            if upstream.get("backpressured") and vertices["slow"]["records_in"] > 0:
                break
            time.sleep(0.5)
        assert upstream.get("backpressured"), f"upstream never backpressured: {upstream}"
        assert upstream["backpressured_ms_per_s"] >= 500
        sink = {v["name"]: v for v in client.metrics()}["slow"]
        assert not sink["backpressured"], f"the sink itself is not backpressured: {sink}"
        assert sink["busy_ms_per_s"] > 500, f"the slow sink should be busy: {sink}"
    finally:
        client.cancel()
        with pytest.raises(es.JobCancelled):
            client.result(timeout=60)
