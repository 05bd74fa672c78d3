"""Columnar session and processing-time windows driven directly: a recording emit, a
manual clock, real snapshot files; and the sessions held equal to the row path's
window operator (heap backend) on random data."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from columnar_support import MAX_P, Emitted, make_operator
from output_support import ListOutput

import epochstream as es
from epochstream.core.clock import ManualClock, wall_ms
from epochstream.core.filesystems import storage_fs
from epochstream.exceptions import ConfigurationError, DataError, StateError
from epochstream.graph.jobgraph import OperatorSpec
from epochstream.graph.specs import AggregateSpec, SessionWindowSpec, WindowAggregateSpec
from epochstream.runtime.operators import OperatorContext, create_operator
from epochstream.runtime.operators.columnar_sessions import merge_sessions
from epochstream.state.backends.base import KeyedBackendContext, SnapshotTarget
from epochstream.state.backends.heap.backend import HeapStateBackend
from epochstream.state.handles import OperatorRestore
from epochstream.state.keygroups import key_group_for_key, key_group_range_for_operator
from epochstream.state.operator import OperatorStateStore


def make(
    kind: str,
    payload: Any,
    *,
    subtask: int = 0,
    parallelism: int = 1,
    clock: ManualClock | None = None,
) -> tuple[Any, Emitted]:
    return make_operator(
        kind,
        payload,
        keys=[payload.key],
        subtask=subtask,
        parallelism=parallelism,
        clock=clock,
        uid="w",
    )


def sessions(
    kind: str = "count", value: str | None = None, gap: int = 100, **kw: Any
) -> tuple[Any, Emitted]:
    return make("columnar_session_window", SessionWindowSpec(kind, "k", value, gap), **kw)


def _kv(keys: list[Any], values: list[Any], ts: list[int] | None = None) -> pa.RecordBatch:
    batch = pa.record_batch([pa.array(keys), pa.array(values)], names=["k", "v"])
    return batch if ts is None else batch.append_column("_ts", pa.array(ts, pa.int64()))


def _target(root: Path, n: int) -> SnapshotTarget:
    return SnapshotTarget(
        fs=storage_fs(str(root)),
        checkpoint_id=n,
        directory=str(root / f"chk-{n}"),
        shared_dir=None,
        name=f"w-{n}",
    )


def _bounds(rows: list[dict[str, Any]], column: str = "count") -> list[tuple[Any, ...]]:
    return [(r["k"], r["window_start"], r["window_end"], r[column]) for r in rows]


# ---------------------------------------------------------------- sessions


def test_merge_sessions_merges_overlapping_and_touching_intervals_per_key() -> None:
    slot, start, end, acc, count = merge_sessions(
        np.array([1, 0, 0, 0, 1]),
        np.array([0, 30, 0, 10, 5]),
        np.array([10, 40, 10, 20, 15]),
        np.array([1, 1, 1, 1, 1]),
        np.array([1, 1, 1, 1, 1]),
        "count",
    )
    assert slot.tolist() == [0, 0, 1] and start.tolist() == [0, 30, 0]
    assert (
        end.tolist() == [20, 40, 15] and acc.tolist() == [2, 1, 2] and count.tolist() == [2, 1, 2]
    )


def test_merge_sessions_falls_back_to_ranks_when_times_span_too_far() -> None:
    far = 2**61
    slot, start, end, _, _ = merge_sessions(
        np.array([0, 0, 1, 1]),
        np.array([-far, 0, -far, far]),
        np.array([-far + 5, 5, 1, far + 5]),
        np.ones(4, dtype=np.int64),
        np.ones(4, dtype=np.int64),
        "sum",
    )
    assert list(zip(slot.tolist(), start.tolist(), end.tolist(), strict=True)) == [
        (0, -far, -far + 5),
        (0, 0, 5),
        (1, -far, 1),
        (1, far, far + 5),
    ]


def test_an_out_of_order_row_bridges_two_sessions() -> None:
    op, out = sessions("sum", "v")
    op.process_batch(_kv(["s", "s", "t"], [1, 2, 5], ts=[0, 300, 10]), None)
    op.process_watermark(98)
    assert out.take() == []
    op.process_batch(_kv(["s", "s", "s"], [4, 8, 16], ts=[90, 180, 270]), None)  # [0, 400)
    op.process_watermark(398)
    assert _bounds(out.take(), "v") == [("t", 10, 110, 5)]
    op.process_watermark(399)
    assert out.take() == [{"k": "s", "window_start": 0, "window_end": 400, "v": 31, "_ts": 399}]
    assert out.watermarks == [98, 398, 399]
    assert op.counters.late_records_dropped == 0 and op.state_table().num_rows == 0


def test_touching_sessions_merge_as_in_flink() -> None:
    op, out = sessions()
    op.process_batch(_kv(["s", "s", "s"], [1, 1, 1], ts=[100, 0, 201]), None)
    op.process_watermark(es.WatermarkGenerator.MAX_WATERMARK)
    assert _bounds(out.take()) == [("s", 0, 200, 2), ("s", 201, 301, 1)]


def test_rows_of_a_fired_session_are_late_unless_an_open_session_takes_them() -> None:
    op, out = sessions(gap=10)
    op.process_batch(_kv(["a", "b"], [1, 1], ts=[0, 100]), None)
    op.process_watermark(99)  # a's [0, 10) fires; b's [100, 110) stays open
    assert _bounds(out.take()) == [("a", 0, 10, 1)]
    # a@5 is late. b@95 touches b's open session; b@85 touches b@95's window, but only
    # once b@95 came: it is late here (it comes first), as on the row path.
    op.process_batch(_kv(["a", "b", "b", "b", "c"], [1, 1, 1, 1, 1], ts=[5, 85, 95, 87, 30]), None)
    assert op.counters.late_records_dropped == 3  # a@5, b@85, c@30
    op.process_watermark(es.WatermarkGenerator.MAX_WATERMARK)
    assert _bounds(out.take()) == [("b", 87, 110, 3)]


def test_min_max_mean_and_null_values() -> None:
    for kind, expected in (
        ("min", [2, None]),
        ("max", [7, None]),
        ("mean", [4.5, None]),
        ("sum", [9, None]),
    ):
        op, out = sessions(kind, "v")
        op.process_batch(_kv(["a", "a", "b"], [7, 2, None], ts=[0, 50, 0]), None)
        op.process_watermark(es.WatermarkGenerator.MAX_WATERMARK)
        assert [r["v"] for r in sorted(out.take(), key=lambda r: r["k"])] == expected, kind
    op, out = sessions("max", "v")
    op.process_batch(_kv([1, 1], [1.5, 2.5], ts=[0, 10]), None)
    op.process_watermark(es.WatermarkGenerator.MAX_WATERMARK)
    assert out.take()[0]["v"] == 2.5


def test_bad_input_errors_name_the_operator() -> None:
    op, _ = sessions("sum", "v")
    with pytest.raises(
        DataError,
        match=r"columnar_session_window \(1/1\): event-time session windows need event time",
    ):
        op.process_batch(_kv(["a"], [1]), None)
    with pytest.raises(
        ConfigurationError, match=r"columnar_session_window \(1/1\): the batch has no column 'v'"
    ):
        op.process_batch(
            pa.record_batch([pa.array(["a"]), pa.array([1])], names=["k", "_ts"]), None
        )
    with pytest.raises(ConfigurationError, match=r"\(1/1\): column 'v' is string"):
        op.process_batch(_kv(["a"], ["x"], ts=[1]), None)
    op.process_batch(_kv(["a"], [1], ts=[1]), None)
    with pytest.raises(DataError, match=r"\(1/1\): column 'v' changed type"):
        op.process_batch(_kv(["a"], [1.5], ts=[1]), None)
    with pytest.raises(ConfigurationError, match=r"expects columnar batches"):
        op.process_batch([{"k": "a"}], None)
    with pytest.raises(ConfigurationError, match="session gap must be positive"):
        SessionWindowSpec("count", "k", None, 0)


def test_sessions_restore_and_rescale_by_key_group(tmp_path: Path) -> None:
    op, _ = sessions("sum", "v")
    keys = list(range(40))
    op.process_batch(_kv(keys, [1] * 40, ts=[0] * 40), None)
    op.process_batch(_kv(keys[:10], [5] * 10, ts=[500] * 10), None)  # a second session
    handle = op.snapshot(_target(tmp_path, 1)).keyed.run()
    assert handle is not None and handle.TYPE == "columnar"
    got: list[tuple[Any, ...]] = []
    for subtask in range(2):
        restored, out = sessions("sum", "v", subtask=subtask, parallelism=2)
        part = handle.restricted_to(restored.key_groups)
        restored.initialize_state(OperatorRestore(keyed=[part] if part else []), 1)
        mine = [k for k in keys if key_group_for_key(k, MAX_P) in restored.key_groups]
        restored.process_batch(
            _kv(mine, [100] * len(mine), ts=[50] * len(mine)), None
        )  # joins [0, 100)
        restored.process_watermark(es.WatermarkGenerator.MAX_WATERMARK)
        got.extend(_bounds(out.take(), "v"))
    expected = [(k, 0, 150, 101) for k in keys] + [(k, 500, 600, 5) for k in keys[:10]]
    assert sorted(got) == sorted(expected)


def test_restore_refuses_state_of_another_window_kind(tmp_path: Path) -> None:
    spec = WindowAggregateSpec("count", key="k", value=None, size=1_000, slide=1_000)
    windows, _ = make("columnar_window", spec)
    windows.process_batch(_kv(["a"], [1], ts=[1]), None)
    handle = windows.snapshot(_target(tmp_path, 1)).keyed.run()
    op, _ = sessions()
    with pytest.raises(StateError, match=r"not session-window state .*another uid"):
        op.initialize_state(OperatorRestore(keyed=[handle]), 1)


def test_savepoint_reader_reads_session_state(tmp_path: Path) -> None:
    from epochstream.checkpoint.reader import state_rows

    op, _ = sessions("sum", "v")
    op.process_batch(_kv(["a", "b"], [3, 4], ts=[0, 1000]), None)
    handle = op.snapshot(_target(tmp_path, 1)).keyed.run()
    rows = sorted(
        (k, v["_acc"], v["_start"], v["_end"]) for k, v, *_ in state_rows(handle, "sessions", MAX_P)
    )
    assert rows == [("a", 3, 0, 100), ("b", 4, 1000, 1100)]


# ---------------------------------------------------------------- golden: the row path


class _Bounds(es.ProcessWindowFunction):
    def process(self, key: Any, ctx: Any, elements: Any, out: Any) -> None:
        values = [v for _, v in elements]
        out.collect(
            (
                key,
                ctx.window.start,
                ctx.window.end,
                len(values),
                sum(values),
                min(values),
                max(values),
            )
        )


def _row_sessions(gap: int) -> Any:
    env = es.Environment(parallelism=1, runner="local")
    env.from_collection([]).key_by(lambda t: t[0]).window(
        es.EventTimeSessionWindows.with_gap(gap)
    ).process(_Bounds()).print()
    payload = next(t for t in env._graph.transformations if t.kind == "window").payload
    backend = HeapStateBackend().create(
        KeyedBackendContext(
            operator_uid="w",
            subtask=0,
            max_parallelism=MAX_P,
            key_group_range=key_group_range_for_operator(MAX_P, 1, 0),
            clock=ManualClock(),
            local_dir="",
        )
    )
    spec = OperatorSpec(
        uid="w", name="window", kind="window", payload=payload, key_selector=lambda t: t[0]
    )
    ctx = OperatorContext(
        subtask_index=0,
        parallelism=1,
        max_parallelism=MAX_P,
        attempt=0,
        job_id="job",
        task_name="window (1/1)",
        operator_state=OperatorStateStore(),
        keyed_backend=backend,
    )
    op = create_operator(spec, ctx)
    out = ListOutput()
    op.output = out
    op.open()
    return op, out.records


@pytest.mark.parametrize("seed", range(6))
def test_sessions_equal_the_row_path_on_random_data(seed: int) -> None:
    rng = random.Random(seed)
    gap = rng.choice([5, 20, 50])
    row_op, row_out = _row_sessions(gap)
    outputs = {
        kind: sessions(kind, None if kind == "count" else "v", gap=gap)
        for kind in ("count", "sum", "min", "max")
    }
    t, watermark = 0, -(2**63)
    for _ in range(30):
        n = rng.randint(1, 40)
        keys = [rng.choice("abcdefg") for _ in range(n)]
        values = [rng.randint(-50, 50) for _ in range(n)]
        # Out of order by up to 3 gaps, so rows bridge sessions and some are late.
        times = [max(0, t + rng.randint(-3 * gap, gap)) for _ in range(n)]
        t += rng.randint(0, 2 * gap)
        row_op.process_batch(list(zip(keys, values, strict=True)), times)
        for op, _ in outputs.values():
            op.process_batch(_kv(keys, values, ts=times), None)
        if rng.random() < 0.6:
            watermark = max(watermark, t - rng.randint(0, 2 * gap))
            row_op.process_watermark(watermark)
            for op, _ in outputs.values():
                op.process_watermark(watermark)
    row_op.process_watermark(es.WatermarkGenerator.MAX_WATERMARK)
    for op, _ in outputs.values():
        op.process_watermark(es.WatermarkGenerator.MAX_WATERMARK)
    late = {op.counters.late_records_dropped for op, _ in outputs.values()}
    assert len(late) == 1 and late.pop() > 0, (
        "every kind drops the same late rows, and some are late"
    )
    for index, (kind, (_, out)) in enumerate(outputs.items()):
        column = "count" if kind == "count" else "v"
        got = sorted(_bounds(out.take(), column))
        expected = sorted((r[0], r[1], r[2], r[3 + index]) for r in row_out)
        assert got == expected, kind
    assert row_out, "no sessions"


# ---------------------------------------------------------------- processing time


def processing(
    size: int = 1_000, slide: int | None = None, clock: ManualClock | None = None, **kw: Any
) -> tuple[Any, Emitted]:
    spec = WindowAggregateSpec("sum", key="k", value="v", size=size, slide=slide or size)
    return make("columnar_processing_window", spec, clock=clock, **kw)


def test_processing_time_windows_fire_when_the_clock_passes_their_end() -> None:
    clock = ManualClock(start=10.2)  # 10_200 ms
    op, out = processing(clock=clock)
    assert op.next_processing_time() is None
    op.process_batch(_kv(["a", "b", "a"], [1, 2, 3]), None)  # no event time needed
    clock.advance(0.5)
    op.process_batch(_kv(["a"], [10], ts=[5]), None)
    assert op.next_processing_time() == 10_999
    op.process_watermark(10**12)  # watermarks pass through, they do not fire windows
    op.on_processing_time(10_998)
    assert out.take() == [] and out.watermarks == [10**12]
    op.on_processing_time(10_999)
    assert sorted(_bounds(out.take(), "v")) == [("a", 10_000, 11_000, 14), ("b", 10_000, 11_000, 2)]
    assert op.next_processing_time() is None


def test_sliding_processing_time_windows_and_end_of_input() -> None:
    clock = ManualClock(start=1.7)
    op, out = processing(size=1_000, slide=500, clock=clock)
    op.process_batch(_kv([1], [7]), None)
    op.process_watermark(
        es.WatermarkGenerator.MAX_WATERMARK
    )  # the end of a bounded input fires every window
    assert sorted(_bounds(out.take(), "v")) == [(1, 1_000, 2_000, 7), (1, 1_500, 2_500, 7)]
    assert (
        out.watermarks == [es.WatermarkGenerator.MAX_WATERMARK]
        and op.next_processing_time() is None
    )
    with pytest.raises(
        ConfigurationError, match=r"columnar_processing_window \(1/1\): the batch has no column 'v'"
    ):
        op.process_batch(pa.record_batch([pa.array([1])], names=["k"]), None)


def test_processing_time_windows_keep_their_starts_across_a_restore(tmp_path: Path) -> None:
    clock = ManualClock(start=3.5)
    op, _ = processing(clock=clock)
    op.process_batch(_kv(list(range(20)), [1] * 20), None)
    handle = op.snapshot(_target(tmp_path, 1)).keyed.run()
    clock.advance(5.0)  # the restart takes 5 s: the window ended meanwhile
    got: list[tuple[Any, ...]] = []
    for subtask in range(2):
        restored, out = processing(clock=clock, subtask=subtask, parallelism=2)
        part = handle.restricted_to(restored.key_groups)
        restored.initialize_state(OperatorRestore(keyed=[part] if part else []), 1)
        assert restored.next_processing_time() == 3_999  # timed again: due at once
        restored.on_processing_time(wall_ms(clock))
        got.extend(_bounds(out.take(), "v"))
    assert sorted(got) == [(k, 3_000, 4_000, 1) for k in range(20)]


@pytest.mark.parametrize(
    ("kind", "payload"),
    [
        ("columnar_aggregate", AggregateSpec("max", "k", "v")),
        ("columnar_session_window", SessionWindowSpec("count", "k", None, 100)),
        ("columnar_window", WindowAggregateSpec("count", "k", None, 100, 100)),
        ("columnar_processing_window", WindowAggregateSpec("max", "k", "v", 100, 100)),
    ],
)
def test_a_null_event_time_is_a_data_error_naming_the_operator(kind: str, payload: Any) -> None:
    """A null ``_ts`` (from map_batches or to_batches) was a session at -2**63 or a raw
    ArrowInvalid that the restart strategy retried."""
    op, out = make(kind, payload, clock=ManualClock(start=0))
    with pytest.raises(
        DataError, match=rf"{kind} \(1/1\): 1 of 2 rows have no event time \(null _ts\)"
    ):
        op.process_batch(_kv(["a", "b"], [1, 2], ts=[5, None]), None)  # type: ignore[list-item]
    assert out.items == []


def test_a_session_sum_that_would_wrap_int64_is_bad_data() -> None:
    op, _ = sessions("sum", "v")
    op.process_batch(_kv(["s", "s"], [2**62, 2**62 - 1], ts=[0, 10]), None)
    with pytest.raises(
        DataError, match=r"\(1/1\): the sum of column 'v' overflows int64 for key 's'"
    ):
        op.process_batch(_kv(["s"], [1], ts=[20]), None)


@pytest.mark.parametrize(
    ("kind", "payload"),
    [
        ("columnar_aggregate", AggregateSpec("max", "k", "v")),
        ("columnar_session_window", SessionWindowSpec("sum", "k", "v", 100)),
    ],
)
def test_uint64_values_above_int64_are_bad_data(kind: str, payload: Any) -> None:
    """The int64 accumulators wrapped them to negative numbers (then a raw ArrowInvalid)."""
    op, _ = make(kind, payload)
    batch = pa.record_batch(
        [pa.array(["a", "a"]), pa.array([1, 2**64 - 1], pa.uint64()), pa.array([0, 1], pa.int64())],
        names=["k", "v", "_ts"],
    )
    with pytest.raises(
        DataError, match=rf"{kind} \(1/1\): column 'v' holds 18446744073709551615, above the int64"
    ):
        op.process_batch(batch, None)


@pytest.mark.parametrize(
    ("kind", "payload"),
    [
        ("columnar_session_window", SessionWindowSpec("min", "k", "v", 100)),
        ("columnar_window", WindowAggregateSpec("max", "k", "v", 100, 100)),
    ],
)
def test_min_max_keep_the_value_type_across_a_restore(
    kind: str, payload: Any, tmp_path: Path
) -> None:
    """Restored min/max came out as int64 for an int32 column until a new batch came,
    so the output schema changed across a restore."""
    op, _ = make(kind, payload)
    batch = pa.record_batch(
        [pa.array(["a"]), pa.array([3], pa.int32()), pa.array([0], pa.int64())],
        names=["k", "v", "_ts"],
    )
    op.process_batch(batch, None)
    handle = op.snapshot(_target(tmp_path, 1)).keyed.run()
    restored, out = make(kind, payload)
    restored.initialize_state(OperatorRestore(keyed=[handle]), 1)
    restored.process_watermark(es.WatermarkGenerator.MAX_WATERMARK)
    assert out.items[0].schema.field("v").type == pa.int32()
