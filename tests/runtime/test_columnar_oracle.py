"""Every columnar aggregation and both columnar joins against a DuckDB oracle, on random
batches as an acceptance tester writes them: null keys and values, negative and large
integers, floats, string keys, empty batches, one key or many, and watermarks that make
rows (and whole batches) late. The operators are driven directly (a recording emit, as
in test_columnar_sessions.py); the same queries run end to end in tests/e2e."""

from __future__ import annotations

import math
import random
from typing import Any

import pyarrow as pa
import pytest
from columnar_support import Emitted, make_operator

import epochstream as es
from epochstream.graph.specs import AggregateSpec, JoinSpec, SessionWindowSpec, WindowAggregateSpec
from epochstream.state.columnar_aggregates import STATE_KEY
from epochstream.state.keygroups import key_group_for_key

duckdb = pytest.importorskip("duckdb")


def make(kind: str, payload: Any) -> tuple[Any, Emitted]:
    return make_operator(kind, payload, keys=[payload.key])


def make_join(spec: JoinSpec) -> tuple[Any, Emitted]:
    kind = "columnar_join" if spec.size is None else "columnar_window_join"
    return make_operator(kind, spec, keys=[spec.left_key, spec.right_key])


SQL = {"sum": "SUM(v)", "count": "COUNT(*)", "min": "MIN(v)", "max": "MAX(v)", "mean": "AVG(v)"}
KINDS = tuple(SQL)
BOUND = 500  # the watermark trails the largest time seen by this much


def _keys(rng: random.Random, key_type: str, n: int) -> pa.Array:
    many = rng.choice([1, 3, 40])
    if key_type == "str":
        return pa.array(
            [None if rng.random() < 0.05 else f"k{rng.randrange(many)}" for _ in range(n)],
            pa.string(),
        )
    if key_type == "wide":  # beyond the dense key table, both signs
        return pa.array(
            [rng.choice([-(2**63), 2**63 - 1, -5, 0, 2**40]) for _ in range(n)], pa.int64()
        )
    return pa.array([rng.randrange(many) for _ in range(n)], pa.int64())


def _values(rng: random.Random, value_type: str, n: int) -> pa.Array:
    if value_type == "int":
        choices: list[Any] = [-3, 0, 5, -(10**12), 10**12, rng.randrange(-100, 100)]
        return pa.array(
            [None if rng.random() < 0.1 else rng.choice(choices) for _ in range(n)], pa.int64()
        )
    choices = [-1.5, 0.25, 1e300, rng.uniform(-100, 100)]
    return pa.array(
        [None if rng.random() < 0.1 else rng.choice(choices) for _ in range(n)], pa.float64()
    )


def _batches(seed: int, key_type: str, value_type: str) -> list[pa.RecordBatch]:
    rng = random.Random(seed)
    out = []
    for _ in range(6):
        n = rng.choice([0, 1, 5, 50])
        ts = pa.array([rng.randrange(0, 5_000) for _ in range(n)], pa.int64())
        out.append(
            pa.record_batch(
                [_keys(rng, key_type, n), _values(rng, value_type, n), ts], names=["k", "v", "_ts"]
            )
        )
    # A last batch of rows all behind the watermark by then.
    out.append(
        pa.record_batch(
            [_keys(rng, key_type, 3), _values(rng, value_type, 3), pa.array([0, 1, 2], pa.int64())],
            names=["k", "v", "_ts"],
        )
    )
    return out


def _arrivals(batches: list[pa.RecordBatch], *, late: bool) -> tuple[pa.Table, list[int | None]]:
    """All rows with ``wm``: the watermark when their batch came (the one before it);
    and the watermark sent after each batch (None: none)."""
    marks: list[int | None] = []
    parts, top, current = [], None, -(2**63)
    for batch in batches:
        parts.append(batch.append_column("wm", pa.array([current] * batch.num_rows, pa.int64())))
        if late and batch.num_rows:
            top = max(top or 0, max(batch.column("_ts").to_pylist()))
            current = top - BOUND
            marks.append(current)
        else:
            marks.append(None)
    return pa.Table.from_batches(parts), marks


def _same(got: list[tuple[Any, ...]], expected: list[tuple[Any, ...]]) -> bool:
    def close(a: Any, b: Any) -> bool:
        if a is None or b is None:
            return a is None and b is None
        if isinstance(a, float) or isinstance(b, float):
            return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)
        return bool(a == b)

    got, expected = sorted(got, key=repr), sorted(expected, key=repr)
    return len(got) == len(expected) and all(
        len(g) == len(e) and all(close(x, y) for x, y in zip(g, e, strict=True))
        for g, e in zip(got, expected, strict=True)
    )


def _windows_sql(table: str, size: int, slide: int, columns: str) -> str:
    """Each row once per window it falls in (``ws``), kept unless the window had fired
    when the row came (the watermark ``wm`` reached its end - 1)."""
    return (
        f"SELECT {columns}, _ts - _ts % {slide} - o * {slide} AS ws FROM {table}, "
        f"range(0, {-(-size // slide)}) r(o) WHERE _ts - _ts % {slide} - o * {slide} > _ts - {size} "
        f"AND _ts - _ts % {slide} - o * {slide} + {size} - 1 > wm"
    )


COMBOS = [(k, v) for k in ("int", "str", "wide") for v in ("int", "float")]


@pytest.mark.parametrize(("key_type", "value_type"), COMBOS)
@pytest.mark.parametrize("seed", range(2))
def test_aggregations_equal_duckdb(seed: int, key_type: str, value_type: str) -> None:
    con = duckdb.connect()
    batches = _batches(seed, key_type, value_type)
    problems = []
    for kind in KINDS:
        value, column = (None, "count") if kind == "count" else ("v", "v")
        table, _ = _arrivals(batches, late=False)
        con.register("t", table)
        rolling, out = make("columnar_aggregate", AggregateSpec(kind, "k", value))
        last: dict[Any, Any] = {}
        for batch in batches:
            rolling.process_batch(batch, None)
            last.update((r["k"], r[column]) for r in out.take())
        expected = con.execute(f"SELECT k, {SQL[kind]} FROM t GROUP BY k").fetchall()
        if not _same(list(last.items()), expected):
            problems.append(f"rolling {kind}")
        # The golden rule: the state's key groups are the row path's for the same keys.
        state = rolling.state_table()
        row_path = [key_group_for_key(k, 128) for k in state.column(STATE_KEY).to_pylist()]
        if state.column("_kg").to_pylist() != row_path:
            problems.append(f"rolling {kind}: key groups differ from the row path's")

        table, marks = _arrivals(batches, late=True)
        con.register("t", table)
        for size, slide in ((1_000, 1_000), (1_000, 300)):
            windows, out = make(
                "columnar_window", WindowAggregateSpec(kind, "k", value, size, slide)
            )
            for batch, mark in zip(batches, marks, strict=True):
                windows.process_batch(batch, None)
                if mark is not None:
                    windows.process_watermark(mark)
            windows.process_watermark(es.WatermarkGenerator.MAX_WATERMARK)
            got = [(r["k"], r["window_start"], r["window_end"], r[column]) for r in out.take()]
            expected = con.execute(
                f"SELECT k, ws, ws + {size}, {SQL[kind]} FROM ({_windows_sql('t', size, slide, 'k, v')}) "
                "GROUP BY k, ws"
            ).fetchall()
            if not _same(got, expected):
                problems.append(f"window {size}/{slide} {kind}")

        # Sessions (lateness is held equal to the row path in test_columnar_sessions.py).
        table, _ = _arrivals(batches, late=False)
        con.register("t", table)
        gap = 200
        sessions, out = make("columnar_session_window", SessionWindowSpec(kind, "k", value, gap))
        for batch in batches:
            sessions.process_batch(batch, None)
        sessions.process_watermark(es.WatermarkGenerator.MAX_WATERMARK)
        got = [(r["k"], r["window_start"], r["window_end"], r[column]) for r in out.take()]
        expected = con.execute(
            f"""WITH ends AS (SELECT *, MAX(_ts + {gap}) OVER (PARTITION BY k ORDER BY _ts
                    ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS reach FROM t),
                ids AS (SELECT *, SUM(CASE WHEN reach IS NULL OR _ts > reach THEN 1 ELSE 0 END)
                    OVER (PARTITION BY k ORDER BY _ts ROWS UNBOUNDED PRECEDING) AS sid FROM ends)
            SELECT k, MIN(_ts), MAX(_ts) + {gap}, {SQL[kind]} FROM ids GROUP BY k, sid"""
        ).fetchall()
        if not _same(got, expected):
            problems.append(f"session {kind}")
    assert problems == []


def _side(rng: random.Random, name: str, key_type: pa.DataType) -> list[pa.RecordBatch]:
    out = []
    for _ in range(rng.choice([1, 3])):
        n, many = rng.choice([0, 1, 4, 30]), rng.choice([1, 5, 20])
        low = 0 if pa.types.is_unsigned_integer(key_type) or key_type == pa.string() else -many
        raw = [None if rng.random() < 0.1 else rng.randrange(low, many) for _ in range(n)]
        keys = pa.array(
            [None if k is None else f"k{k}" for k in raw] if key_type == pa.string() else raw,
            key_type,
        )
        ts = pa.array([rng.randrange(0, 3_000) for _ in range(n)], pa.int64())
        out.append(
            pa.record_batch(
                [keys, pa.array([rng.random() for _ in range(n)], pa.float64()), ts],
                names=["key", f"{name}v", "_ts"],
            )
        )
    return out


@pytest.mark.parametrize(
    ("left_type", "right_type"),
    [
        (pa.string(), pa.string()),
        (pa.int64(), pa.int64()),
        (pa.int32(), pa.int64()),
        (pa.int8(), pa.uint16()),
    ],
    ids=["str", "int64", "int32-int64", "int8-uint16"],
)
@pytest.mark.parametrize("seed", range(3))
def test_joins_equal_duckdb(seed: int, left_type: pa.DataType, right_type: pa.DataType) -> None:
    rng = random.Random(seed)
    con = duckdb.connect()
    left, right = _side(rng, "l", left_type), _side(rng, "r", right_type)
    arrivals = [(0, b) for b in left] + [(1, b) for b in right]
    rng.shuffle(arrivals)
    regular, out = make_join(JoinSpec("key", "key"))
    for index, batch in arrivals:
        regular.process_input(index, batch, None)
    con.register("l", pa.Table.from_batches(left))
    con.register("r", pa.Table.from_batches(right))
    got = sorted((r["key"], r["lv"], r["rv"]) for r in out.take())
    assert got == sorted(
        con.execute("SELECT l.key, lv, rv FROM l JOIN r ON l.key = r.key").fetchall()
    )

    # Window joins, with a watermark after every batch (both inputs share it here).
    mark, stamped = -(2**63), []
    for index, batch in arrivals:
        stamped.append(
            (index, batch.append_column("wm", pa.array([mark] * batch.num_rows, pa.int64())))
        )
        if batch.num_rows:
            mark = max(mark, max(batch.column("_ts").to_pylist()) - BOUND)
    for name, index in (("l", 0), ("r", 1)):
        parts = [b for i, b in stamped if i == index]
        con.register(name, pa.Table.from_batches(parts))
    for size, slide in ((1_000, 1_000), (1_000, 400)):
        windowed, out = make_join(JoinSpec("key", "key", size=size, slide=slide))
        mark = -(2**63)
        for index, batch in arrivals:
            windowed.process_input(index, batch, None)
            if batch.num_rows:
                mark = max(mark, max(batch.column("_ts").to_pylist()) - BOUND)
                windowed.process_watermark(mark)
        windowed.process_watermark(es.WatermarkGenerator.MAX_WATERMARK)
        got = sorted((r["key"], r["lv"], r["rv"], r["window_start"]) for r in out.take())
        expected = con.execute(
            f"SELECT a.key, lv, rv, a.ws FROM ({_windows_sql('l', size, slide, 'key, lv')}) a "
            f"JOIN ({_windows_sql('r', size, slide, 'key, rv')}) b ON a.key = b.key AND a.ws = b.ws"
        ).fetchall()
        assert got == sorted(expected), (size, slide)
