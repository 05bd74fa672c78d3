"""Joins end to end on Spark with a crash: interval join and window join of orders and
payments against DuckDB over the same events; connected streams with a shared keyed
state and timers.
"""

from __future__ import annotations

import collections
from datetime import timedelta
from pathlib import Path
from typing import Any

import duckdb
import pytest

import epochstream as es

pytestmark = [pytest.mark.slow, pytest.mark.spark]

BASE = 1_700_000_000_000
ORDERS = 3_000


def order(i: int) -> tuple[int, int, int]:
    """(order id, timestamp, amount): 20 ms apart, up to 0.5 s out of order."""
    return (i, BASE + i * 20 - (i * 7_919) % 500, i % 100)


def payment(j: int) -> tuple[int, int, int]:
    """(payment id, order id, timestamp): two per order, 0-4.5 s after it."""
    o = j // 2
    return (j, o, order(o)[1] + (j * 104_729) % 4_500)


def _orders(env: es.Environment, rate: float) -> es.DataStream:
    return (
        env.from_sequence(0, ORDERS, rate=rate)
        .uid("order-ids")
        .map(order)
        .assign_timestamps_and_watermarks(
            es.WatermarkStrategy.bounded_out_of_orderness(600).with_timestamp_assigner(
                lambda o, ts: o[1]
            )
        )
    )


def _payments(env: es.Environment, rate: float) -> es.DataStream:
    return (
        env.from_sequence(0, 2 * ORDERS, rate=rate)
        .uid("payment-ids")
        .map(payment)
        .assign_timestamps_and_watermarks(
            es.WatermarkStrategy.bounded_out_of_orderness(
                timedelta(seconds=5)
            ).with_timestamp_assigner(lambda p, ts: p[2])
        )
    )


def _tables() -> duckdb.DuckDBPyConnection:
    db = duckdb.connect()
    db.execute("CREATE TABLE orders (id BIGINT, ts BIGINT, amount BIGINT)")
    db.execute("CREATE TABLE payments (id BIGINT, oid BIGINT, ts BIGINT)")
    db.executemany("INSERT INTO orders VALUES (?, ?, ?)", [order(i) for i in range(ORDERS)])
    db.executemany("INSERT INTO payments VALUES (?, ?, ?)", [payment(j) for j in range(2 * ORDERS)])
    return db


class Pair(es.ProcessJoinFunction):
    def process_element(self, left: Any, right: Any, ctx: Any, out: Any) -> None:
        assert ctx.timestamp() == max(left[1], right[2])
        out.collect([left[0], right[0], ctx.timestamp()])


def test_interval_join_with_a_crash_equals_duckdb(
    spark: Any, tmp_path: Path, failure_markers: str
) -> None:
    env = es.Environment(parallelism=2, spark=spark)
    env.enable_checkpointing(0.3, storage=str(tmp_path / "ckpt"))
    env.set_restart_strategy(es.restart.fixed_delay(attempts=3, delay=0.2))
    orders = _orders(env, rate=1_500).map(
        es.testing.FailOnce(
            after_records=600,
            after_checkpoints=2,
            subtask=1,
            crash=True,
            marker_dir=failure_markers,
        )
    )
    (
        orders.key_by(lambda o: o[0])
        .interval_join(_payments(env, rate=3_000).key_by(lambda p: p[1]))
        .between(0, timedelta(seconds=3))
        .process(Pair())
        .uid("interval-join")
        .sink_to(es.sinks.FileSink(str(tmp_path / "out")))
    )
    result = env.execute("interval-join")
    assert result.restarts == 1
    got = collections.Counter(tuple(r) for r in es.testing.read_committed(tmp_path / "out"))
    expected = collections.Counter(
        _tables()
        .execute(
            "SELECT o.id, p.id, greatest(o.ts, p.ts) FROM orders o JOIN payments p "
            "ON o.id = p.oid AND p.ts BETWEEN o.ts AND o.ts + 3000"
        )
        .fetchall()
    )
    assert got == expected and len(got) > ORDERS


def test_window_join_with_a_crash_equals_duckdb(
    spark: Any, tmp_path: Path, failure_markers: str
) -> None:
    env = es.Environment(parallelism=2, spark=spark)
    env.enable_checkpointing(0.3, storage=str(tmp_path / "ckpt"))
    env.set_restart_strategy(es.restart.fixed_delay(attempts=3, delay=0.2))
    payments = _payments(env, rate=3_000).map(
        es.testing.FailOnce(
            after_records=1_500,
            after_checkpoints=2,
            subtask=0,
            crash=True,
            marker_dir=failure_markers,
        )
    )
    (
        _orders(env, rate=1_500)
        .join(payments)
        .where(lambda o: o[0])
        .equal_to(lambda p: p[1])
        .window(es.TumblingEventTimeWindows.of(timedelta(seconds=2)))
        .apply(lambda o, p: [o[0], p[0], o[2]])
        .uid("window-join")
        .sink_to(es.sinks.FileSink(str(tmp_path / "out")))
    )
    result = env.execute("window-join")
    assert result.restarts == 1
    got = collections.Counter(tuple(r) for r in es.testing.read_committed(tmp_path / "out"))
    expected = collections.Counter(
        _tables()
        .execute(
            "SELECT o.id, p.id, o.amount FROM orders o JOIN payments p "
            "ON o.id = p.oid AND o.ts // 2000 = p.ts // 2000"
        )
        .fetchall()
    )
    assert got == expected and len(got) > 0


class Enrich(es.KeyedCoProcessFunction):
    """Remembers each order's amount (input 2) and emits it with each payment (input 1);
    a payment that comes before its order waits for it, with a 10 s event-time timeout."""

    def open(self, ctx: Any) -> None:
        self.amount = ctx.get_state(es.state.ValueStateDescriptor("amount"))
        self.waiting = ctx.get_list_state(es.state.ListStateDescriptor("waiting"))

    def process_element1(self, payment: Any, ctx: Any, out: Any) -> None:
        amount = self.amount.value()
        if amount is None:
            self.waiting.add(payment[0])
            ctx.timer_service().register_event_time_timer(ctx.timestamp() + 10_000)
        else:
            out.collect([payment[0], ctx.current_key, amount])

    def process_element2(self, order_: Any, ctx: Any, out: Any) -> None:
        self.amount.update(order_[2])
        for pid in self.waiting.get():
            out.collect([pid, ctx.current_key, order_[2]])
        self.waiting.clear()

    def on_timer(self, timestamp: int, ctx: Any, out: Any) -> None:
        for pid in self.waiting.get():
            out.collect([pid, ctx.current_key, None])
        self.waiting.clear()


def test_keyed_connected_streams_share_state_and_timers(spark: Any, tmp_path: Path) -> None:
    env = es.Environment(parallelism=2, spark=spark)
    env.enable_checkpointing(0.3, storage=str(tmp_path / "ckpt"))
    (
        _payments(env, rate=6_000)
        .key_by(lambda p: p[1])
        .connect(_orders(env, rate=3_000).key_by(lambda o: o[0]))
        .process(Enrich())
        .uid("enrich")
        .sink_to(es.sinks.FileSink(str(tmp_path / "out")))
    )
    env.execute("enrich")
    rows = sorted(tuple(r) for r in es.testing.read_committed(tmp_path / "out"))
    assert rows == sorted((j, j // 2, (j // 2) % 100) for j in range(2 * ORDERS))


class Tag(es.CoMapFunction):
    def map1(self, value: Any) -> Any:
        return ["left", value]

    def map2(self, value: Any) -> Any:
        return ["right", value]


def test_co_map_over_two_unkeyed_streams(spark: Any, tmp_path: Path) -> None:
    env = es.Environment(parallelism=2, spark=spark)
    env.from_sequence(0, 50).connect(env.from_collection(["x", "y"])).map(Tag()).sink_to(
        es.sinks.FileSink(str(tmp_path / "out"))
    )
    env.execute("co-map")
    rows = es.testing.read_committed(tmp_path / "out")
    assert sorted(map(tuple, rows)) == sorted(
        [("left", i) for i in range(50)] + [("right", "x"), ("right", "y")]
    )
