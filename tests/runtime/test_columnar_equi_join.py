"""The SQL joins' operators (``columnar_regular_join``, ``columnar_equi_join``) driven
directly on each backend, against DuckDB:

- regular join on two key columns with a residual condition (NULLs drop), through a
  restore at another parallelism;
- interval join: a property test over random out-of-order batches, bounds, watermarks
  and late rows, with a restore at another parallelism mid-stream: the emitted pairs
  (and their ``_ts``) equal DuckDB's ``BETWEEN`` join of the rows that were not late,
  the state is empty after a final watermark, the output watermark is held back;
- window-end retention: the regular join's pairs, rows dropped once their window ends.
"""

from __future__ import annotations

import random
import tempfile
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from join_support import BACKENDS, Cluster

import epochstream as es
from epochstream.api.columnar_joins import equi_join
from epochstream.core.events import MAX_WATERMARK, MIN_WATERMARK
from epochstream.exceptions import ConfigurationError, DataError
from epochstream.graph.specs import EquiJoinSpec, IntervalBounds, WindowEnd

LEFT_KEYS, RIGHT_KEYS = ("a", "b"), ("x", "y")


class LeftAbove:
    """The residual condition ``lv > rv`` (picklable; NULL where either is null)."""

    def __call__(self, batch: pa.RecordBatch) -> pa.Array:
        return pc.greater(batch.column("lv"), batch.column("rv"))


def spec_of(retention: Any = None, condition: Any = None) -> EquiJoinSpec:
    return EquiJoinSpec(
        LEFT_KEYS,
        RIGHT_KEYS,
        (("a", "a"), ("b", "b"), ("id", "lid"), ("v", "lv")),
        (("id", "rid"), ("v", "rv")),
        condition=condition,
        retention=retention,
    )


def batch_of(rows: list[tuple[Any, ...]]) -> pa.RecordBatch:
    """Rows ``(key a, key b, id, v, ts)`` as a batch (the right side renames the keys)."""
    a, b, ids, v, ts = (list(c) for c in zip(*rows, strict=True)) if rows else ([],) * 5
    return pa.record_batch(
        [
            pa.array(a, pa.int32()),
            pa.array(b, pa.string()),
            pa.array(ids, pa.int64()),
            pa.array(v, pa.int64()),
            pa.array(ts, pa.int64()),
        ],
        names=["a", "b", "id", "v", "_ts"],
    )


def right_of(batch: pa.RecordBatch) -> pa.RecordBatch:
    # Another integer width on the right: keys compare as int64.
    return pa.record_batch(
        [batch.column("a").cast(pa.int64()), *batch.columns[1:]],
        names=["x", "y", "id", "v", "_ts"],
    )


def oracle(
    left: list[tuple[Any, ...]], right: list[tuple[Any, ...]], where: str
) -> list[tuple[Any, ...]]:
    """DuckDB's join of ``left`` and ``right`` rows on both keys and ``where``."""
    con = duckdb.connect()
    con.register("l", pa.Table.from_batches([batch_of(left)]))
    con.register("r", pa.Table.from_batches([right_of(batch_of(right))]))
    query = (
        "SELECT l.a, l.b, l.id, l.v, r.id, r.v, greatest(l._ts, r._ts) FROM l JOIN r "
        f"ON l.a = r.x AND l.b = r.y WHERE {where}"
    )
    return sorted(con.execute(query).fetchall(), key=repr)


def emitted(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    names = ["a", "b", "lid", "lv", "rid", "rv", "_ts"]
    return sorted((tuple(r[n] for n in names) for r in rows), key=repr)


def random_rows(rng: random.Random, n: int, first_id: int, times: range) -> list[tuple[Any, ...]]:
    return [
        (
            rng.choice([0, 1, 2, None]),
            rng.choice(["p", "q", None]),
            first_id + i,
            rng.choice([None, *range(10)]),
            rng.choice(times),
        )
        for i in range(n)
    ]


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_regular_join_on_two_keys_with_a_condition_equals_duckdb(
    backend: str, tmp_path: Path
) -> None:
    rng = random.Random(3)
    cluster = Cluster(backend, tmp_path, spec_of(condition=LeftAbove()), 1)
    lefts: list[tuple[Any, ...]] = []
    rights: list[tuple[Any, ...]] = []
    got: list[dict[str, Any]] = []
    for step in range(8):
        left = random_rows(rng, 30, 1_000 * step, range(100))
        right = random_rows(rng, 20, 1_000 * step + 500, range(100))
        lefts += left
        rights += right
        cluster.send(0, batch_of(left))
        cluster.send(1, right_of(batch_of(right)))
        if step == 3:
            got += cluster.rows()
            cluster = cluster.rescaled(2, 1)
    got += cluster.rows()
    assert got and emitted(got) == oracle(lefts, rights, "l.v > r.v")
    cluster.send(0, batch_of([(1, "p", 9_999, 100, 5)]))
    names = {tuple(b.schema.names) for _, out in cluster.ops for b in out.items}
    assert names == {("a", "b", "lid", "lv", "rid", "rv", "_ts")}


def interval_where(lower: int, upper: int) -> str:
    return f"l._ts BETWEEN r._ts + {lower} AND r._ts + {upper}"


ROWS = st.tuples(
    st.sampled_from([0, 1]),
    st.lists(
        st.tuples(
            st.sampled_from([0, 0, 1, None]),
            st.sampled_from(["p", "p", "p", "q"]),
            st.integers(0, 3_000),
        ),
        min_size=1,
        max_size=12,
    ),
)
STEP = st.one_of(
    ROWS,
    ROWS,
    ROWS,
    st.tuples(st.just(2), st.integers(0, 1_000)),  # the watermark moves on by this much
    st.tuples(st.just(3), st.integers(1, 3)),  # snapshot, restore at this parallelism
)


def run_interval(backend: str, lower: int, upper: int, steps: list[Any]) -> int:
    """Drive the interval join through ``steps``, check it against DuckDB; the number
    of pairs."""
    with tempfile.TemporaryDirectory() as root:
        cluster = Cluster(backend, Path(root), spec_of(IntervalBounds(lower, upper)), 1)
        sides: tuple[list[Any], list[Any]] = ([], [])
        got: list[dict[str, Any]] = []
        mark, late = MIN_WATERMARK, 0
        for n, step in enumerate(steps):
            if step[0] == 2:
                mark = max(mark, 0) + step[1]
                cluster.watermark(mark)
            elif step[0] == 3:
                got += cluster.rows()
                cluster = cluster.rescaled(step[1], n)
                if mark != MIN_WATERMARK:  # as sources send theirs again
                    cluster.watermark(mark)
            else:
                index, raw = step
                rows = [(a, b, 100 * n + i, i, t) for i, (a, b, t) in enumerate(raw)]
                # Late: every partner time is at most the watermark.
                high = -lower if index == 0 else upper
                live = [r for r in rows if r[4] + high > mark]
                late += len(rows) - len(live)
                sides[index].extend(live)
                batch = batch_of(rows)
                cluster.send(index, batch if index == 0 else right_of(batch))
        got += cluster.rows()
        assert emitted(got) == oracle(*sides, interval_where(lower, upper))
        assert sum(op.counters.late_records_dropped for op, _ in cluster.ops) <= late
        # (<=: a restore starts new counters)
        cluster.watermark(2**62)
        assert cluster.tables() == []
        delay = max(-lower, upper)
        for _, out in cluster.ops:
            assert out.watermarks[-1] == 2**62 - delay
        return len(got)


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    bounds=st.tuples(st.integers(-2_000, 1_000), st.integers(0, 3_000)),
    steps=st.lists(STEP, min_size=2, max_size=25),
)
def test_interval_join_equals_duckdb_between_join_of_the_rows_not_late_heap(
    bounds: tuple[int, int], steps: list[Any]
) -> None:
    lower, width = bounds
    run_interval("heap", lower, lower + width, steps)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    bounds=st.tuples(st.integers(-2_000, 1_000), st.integers(0, 3_000)),
    steps=st.lists(STEP, min_size=2, max_size=20),
)
def test_interval_join_equals_duckdb_between_join_of_the_rows_not_late_rocksdb(
    bounds: tuple[int, int], steps: list[Any]
) -> None:
    lower, width = bounds
    run_interval("rocksdb", lower, lower + width, steps)


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("seed", range(4))
def test_interval_join_on_longer_random_streams_equals_duckdb(backend: str, seed: int) -> None:
    """Longer streams than the property test's: many pairs, buckets and restores."""
    rng = random.Random(seed)
    lower = rng.randrange(-3_000, 1_000)
    upper = lower + rng.randrange(0, 4_000)
    steps: list[Any] = []
    for n in range(60):
        base = 500 * n  # event time moves on, rows up to 3 s out of order
        rows = [
            (rng.choice([0, 1, None]), rng.choice("pq"), base + rng.randrange(-3_000, 500))
            for _ in range(rng.randrange(1, 25))
        ]
        steps.append((rng.randrange(2), rows))
        if n % 5 == 4:
            steps.append((2, rng.randrange(0, 1_500)))
        if n in (20, 41):
            steps.append((3, rng.randrange(1, 4)))
    assert run_interval(backend, lower, upper, steps) > 50


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_interval_join_drops_late_rows_and_expired_buckets(backend: str, tmp_path: Path) -> None:
    cluster = Cluster(backend, tmp_path, spec_of(IntervalBounds(-2_000, 1_000)), 1)
    (op, out) = cluster.ops[0]
    cluster.send(0, batch_of([(1, "p", 1, 5, 9_000), (1, "p", 2, 5, 20_000)]))
    assert sorted(op.keyed.row_tables()) == ["left@18000", "left@9000"]  # buckets of 3 s
    # The left row at 9_000 meets right rows of [8_000, 11_000]: a right row at 11_000
    # is not late while the watermark is below 11_000 + upper.
    cluster.watermark(11_999)
    assert out.watermarks == [11_999 - 2_000]
    cluster.send(1, right_of(batch_of([(1, "p", 3, 1, 11_000)])))
    assert [(r["lid"], r["_ts"]) for r in out.take()] == [(1, 11_000)]
    # Its bucket is dropped once the watermark reaches its last ms + (upper - lower).
    cluster.watermark(14_998)
    assert "left@9000" in op.keyed.row_tables()
    cluster.watermark(14_999)
    assert op.keyed.row_tables() == ["left@18000"]  # right@9000 held the row at 11_000
    # A right row whose partners are all at most the watermark (13_000 + 1_000) is late.
    cluster.send(1, right_of(batch_of([(1, "p", 4, 1, 13_000), (1, "p", 5, 1, 19_500)])))
    assert op.counters.late_records_dropped == 1
    assert [(r["lid"], r["rid"], r["_ts"]) for r in out.take()] == [(2, 5, 20_000)]
    # The end of input is passed on as it is (downstream flushes on it).
    cluster.watermark(MAX_WATERMARK)
    assert out.watermarks[-1] == MAX_WATERMARK and op.keyed.row_tables() == []


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_window_end_retention_equals_the_regular_join_and_drops_closed_windows(
    backend: str, tmp_path: Path
) -> None:
    """Inputs as two window aggregations put them out: each window's rows before the
    watermark reaches its end - 1, keyed by (key, window_end)."""
    spec = EquiJoinSpec(
        ("a", "end"),
        ("x", "end"),
        (("a", "a"), ("end", "window_end"), ("v", "lv")),
        (("v", "rv"),),
        retention=WindowEnd("end", "end"),
    )

    def window_rows(side: str, end: int, keys: list[int]) -> pa.RecordBatch:
        n = len(keys)
        return pa.record_batch(
            [
                pa.array(keys, pa.int64()),
                pa.array([end] * n, pa.timestamp("ms")),
                pa.array([10 * end + k for k in keys], pa.int64()),
                pa.array([end - 1] * n, pa.int64()),
            ],
            names=["a" if side == "left" else "x", "end", "v", "_ts"],
        )

    cluster = Cluster(backend, tmp_path, spec, 1)
    expected = []
    got: list[dict[str, Any]] = []
    for w, end in enumerate(range(1_000, 6_000, 1_000)):
        lefts, rights = list(range(w, w + 6)), list(range(w + 3, w + 9))
        cluster.send(0, window_rows("left", end, lefts))
        cluster.send(1, window_rows("right", end, rights))
        expected += [(k, end, 10 * end + k, 10 * end + k, end - 1) for k in lefts if k in rights]
        if w == 2:
            got += cluster.rows()
            cluster = cluster.rescaled(2, 1)
            cluster.watermark(end - 1_000 - 1)
        assert sorted(set(cluster.tables())) == [f"left@{end}", f"right@{end}"]
        cluster.watermark(end - 1)
        assert cluster.tables() == []
    # A window's rows after the watermark reached its end - 1 are late.
    cluster.send(0, window_rows("left", 5_000, [4, 5]))
    assert sum(op.counters.late_records_dropped for op, _ in cluster.ops) == 2
    got += cluster.rows()
    key = ["a", "window_end", "lv", "rv", "_ts"]
    pairs = sorted(
        (r["a"], int(r["window_end"].timestamp() * 1000), r["lv"], r["rv"], r["_ts"]) for r in got
    )
    assert pairs == sorted(expected)
    assert all(list(r) == key for r in got)


def test_spec_and_operator_errors() -> None:
    with pytest.raises(ConfigurationError, match="as many left keys as right keys"):
        EquiJoinSpec(("a", "b"), ("x",), (), ())
    with pytest.raises(ConfigurationError, match="two columns named 'v'"):
        EquiJoinSpec(("a",), ("x",), (("v", "v"),), (("v", "v"),))
    with pytest.raises(ConfigurationError, match="two columns named '_ts'"):
        EquiJoinSpec(("a",), ("x",), (("t", "_ts"),), ())
    with pytest.raises(ConfigurationError, match="a column named '_kg'"):
        EquiJoinSpec(("a",), ("x",), (("g", "_kg"),), ())
    with pytest.raises(ConfigurationError, match=r"lower bound .* above its upper bound"):
        IntervalBounds(5, 4)
    assert IntervalBounds.of(0, 10, lower_inclusive=False, upper_inclusive=False) == (
        IntervalBounds(1, 9)
    )
    with tempfile.TemporaryDirectory() as root:

        def fresh() -> Cluster:
            return Cluster("heap", Path(root), spec_of(IntervalBounds(0, 5)), 1)

        row = batch_of([(1, "p", 1, 1, 1)])
        with pytest.raises(DataError, match="an interval join needs event time"):
            fresh().send(0, row.drop_columns(["_ts"]))
        with pytest.raises(DataError, match="has no column 'v', which the join emits"):
            fresh().send(0, row.drop_columns(["v"]))
        cluster = fresh()
        cluster.send(0, row)
        with pytest.raises(ConfigurationError, match="incompatible types: left 'b' is string"):
            cluster.send(1, right_of(row).set_column(1, "y", pa.array([1])))


def test_the_api_builds_each_mode_and_refuses_misuse() -> None:
    env = es.Environment(parallelism=1, runner="local")
    rows = env.from_collection([1, 2])
    schema = pa.schema([("a", pa.int32()), ("b", pa.string()), ("v", pa.int64())])
    left, right = rows.to_batches(schema), rows.to_batches(schema)
    regular = left.join(right).where(["a", "b"]).equal_to(["a", "b"])
    regular.select(["a", ("v", "lv")], [("v", "rv")], condition=LeftAbove())
    left.join(right).where("a").equal_to("a").between(-10, 5, upper_inclusive=False).select(
        ["a"], [("v", "rv")]
    )
    left.join(right).where(["a", "b"]).equal_to(["a", "b"]).within_windows("v", "v").select(
        ["a"], [("b", "rb")], name="windowed"
    )
    joins = ("columnar_regular_join", "columnar_equi_join")
    nodes = [t for t in env._graph.transformations if t.kind in joins]
    assert [n.name for n in nodes] == ["join(a=a,b=b)", "interval-join(a=a)", "windowed"]
    specs = [n.payload for n in nodes]
    assert specs[0].left_output == (("a", "a"), ("v", "lv"))
    assert isinstance(specs[0].condition, LeftAbove)
    assert specs[1].retention == IntervalBounds(-10, 4)
    assert specs[2].retention == WindowEnd("v", "v")
    with pytest.raises(ConfigurationError, match="finish it with select"):
        left.join(right).where(["a", "b"]).equal_to(["a", "b"]).apply()
    with pytest.raises(ConfigurationError, match="takes apply"):
        left.join(right).where("a").equal_to("a").window(es.TumblingEventTimeWindows.of(10)).select(
            ["a"], ["v"]
        )
    with pytest.raises(ConfigurationError, match="as many left keys as right keys"):
        left.join(right).where(["a", "b"]).equal_to("a").select(["a"], ["v"])
    with pytest.raises(ConfigurationError, match="the right stream 'to_batches' has no column 'w'"):
        left.join(right).where("a").equal_to("a").select(["a"], ["w"])
    with pytest.raises(ConfigurationError, match=r"a name or an \(input, output\) pair"):
        left.join(right).where("a").equal_to("a").select(["a"], [("v",)])
    with pytest.raises(ConfigurationError, match="left 'b' is string, right 'v' is int64"):
        left.join(right).where(["a", "b"]).equal_to(["a", "v"]).select(["a"], ["v"])
    with pytest.raises(ConfigurationError, match="must both be columnar"):
        equi_join(left, rows, spec_of())


def test_regular_join_stamps_the_later_time_or_the_one_side_s() -> None:
    with tempfile.TemporaryDirectory() as root:
        cluster = Cluster("heap", Path(root), spec_of(), 1)
        cluster.send(0, batch_of([(1, "p", 1, 5, 30)]))
        cluster.send(1, right_of(batch_of([(1, "p", 2, 6, 10)])))
        assert [r["_ts"] for r in cluster.rows()] == [30]
        timeless = Cluster("heap", Path(root), spec_of(), 1)
        timeless.send(1, right_of(batch_of([(1, "p", 2, 6, 10)])).drop_columns(["_ts"]))
        timeless.send(0, batch_of([(1, "p", 1, 5, 30)]))
        assert [(r["lid"], r["_ts"]) for r in timeless.rows()] == [(1, 30)]
