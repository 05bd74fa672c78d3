"""Columnar joins driven directly: pairs per window, watermarks of two inputs through
the task's real watermark valve, late rows, regular joins in both arrival orders,
duplicate and null keys, snapshots restored at another parallelism (a real snapshot
target on the local file system), and the errors naming the operator."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from columnar_support import MAX_P, Emitted, make_operator

import epochstream as es
from epochstream.core.filesystems import storage_fs
from epochstream.exceptions import ConfigurationError, DataError, StateError, UserFunctionError
from epochstream.graph.specs import JoinSpec
from epochstream.runtime.watermarks import WatermarkValve
from epochstream.state.backends.base import SnapshotTarget
from epochstream.state.columnar_aggregates import columnar_rows
from epochstream.state.handles import OperatorRestore
from epochstream.state.keygroups import key_group_for_key


def make(spec: JoinSpec, *, subtask: int = 0, parallelism: int = 1) -> tuple[Any, Emitted]:
    kind = "columnar_join" if spec.size is None else "columnar_window_join"
    return make_operator(
        kind, spec, keys=[spec.left_key, spec.right_key], subtask=subtask, parallelism=parallelism
    )


def auctions(ids: list[Any], sellers: list[Any], ts: list[int] | None = None) -> pa.RecordBatch:
    batch = pa.record_batch([pa.array(ids, pa.int64()), pa.array(sellers)], names=["id", "seller"])
    return batch if ts is None else batch.append_column("_ts", pa.array(ts, pa.int64()))


def persons(ids: list[Any], names: list[str], ts: list[int] | None = None) -> pa.RecordBatch:
    batch = pa.record_batch([pa.array(ids), pa.array(names)], names=["id", "name"])
    return batch if ts is None else batch.append_column("_ts", pa.array(ts, pa.int64()))


WINDOW = JoinSpec("seller", "id", size=1_000, slide=1_000)
REGULAR = JoinSpec("seller", "id")


def _pairs(out: Emitted, *columns: str) -> list[tuple[Any, ...]]:
    return sorted(tuple(r[c] for c in columns) for r in out.rows())


def test_window_join_emits_each_windows_pairs_as_one_batch_at_the_watermark() -> None:
    op, out = make(WINDOW)
    op.process_input(0, auctions([1, 2, 3], [7, 8, 7], ts=[100, 200, 1_100]), None)
    op.process_input(1, persons([7, 8], ["ann", "bob"], ts=[900, 999]), None)
    op.process_input(1, persons([7], ["ann"], ts=[1_500]), None)
    assert out.items == []
    op.process_watermark(999)
    assert len(out.items) == 1 and out.watermarks == [999]
    batch = out.items[0]
    # Left columns, then right ones (clashes suffixed), then the window and _ts.
    assert batch.schema.names == [
        "id",
        "seller",
        "id_right",
        "name",
        "window_start",
        "window_end",
        "_ts",
    ]
    assert _pairs(out, "id", "id_right", "name", "window_start", "_ts") == [
        (1, 7, "ann", 0, 999),
        (2, 8, "bob", 0, 999),
    ]
    op.process_watermark(5_000)
    assert _pairs(out, "id", "window_start")[-1] == (3, 1_000)
    assert op.windows == set() and op.keyed.row_tables() == []


def test_the_watermark_of_two_inputs_is_their_minimum() -> None:
    op, out = make(WINDOW)
    valve = WatermarkValve(2)  # channel 0: the left input, channel 1: the right one

    def watermark(channel: int, ts: int) -> None:
        mark, _ = valve.on_watermark(channel, ts)
        if mark is not None:
            op.process_watermark(mark)

    op.process_input(0, auctions([1], [7], ts=[10]), None)
    op.process_input(1, persons([7], ["ann"], ts=[20]), None)
    watermark(0, 5_000)
    assert out.items == []  # the right input is still at the start of time
    watermark(1, 999)
    assert _pairs(out, "id", "name") == [(1, "ann")] and out.watermarks == [999]


def test_late_rows_are_dropped_and_counted() -> None:
    op, out = make(WINDOW)
    op.process_watermark(1_999)
    op.process_input(0, auctions([1, 2], [7, 7], ts=[500, 2_500]), None)
    op.process_input(1, persons([7, 7], ["old", "new"], ts=[1_999, 2_001]), None)
    assert op.counters.late_records_dropped == 2
    op.process_watermark(2_999)
    assert _pairs(out, "id", "name") == [(2, "new")]


def test_sliding_window_join_pairs_in_every_shared_window() -> None:
    op, out = make(JoinSpec("seller", "id", size=1_000, slide=500))
    op.process_input(0, auctions([1], [7], ts=[700]), None)
    op.process_input(1, persons([7], ["ann"], ts=[900]), None)
    op.process_watermark(10_000)
    assert _pairs(out, "window_start", "window_end", "_ts") == [
        (0, 1_000, 999),
        (500, 1_500, 1_499),
    ]


def test_duplicate_keys_on_both_sides_give_every_pair_and_null_keys_never_join() -> None:
    for spec in (WINDOW, REGULAR):
        op, out = make(spec)
        op.process_input(0, auctions([1, 2, 3, 4], [7, 7, None, None], ts=[1, 2, 3, 4]), None)
        op.process_input(1, persons([7, 7, 7, None], ["a", "b", "c", "n"], ts=[5, 6, 7, 8]), None)
        op.process_watermark(999)
        assert _pairs(out, "id", "name") == [(i, n) for i in (1, 2) for n in ("a", "b", "c")], (
            spec.kind
        )


def test_regular_join_in_both_arrival_orders_stamps_the_arriving_rows_time() -> None:
    left_first, a = make(REGULAR)
    left_first.process_input(0, auctions([1, 2], [7, 8], ts=[10, 20]), None)
    assert a.items == []
    left_first.process_input(1, persons([7, 8], ["ann", "bob"], ts=[30, 40]), None)
    right_first, b = make(REGULAR)
    right_first.process_input(1, persons([7, 8], ["ann", "bob"], ts=[30, 40]), None)
    right_first.process_input(0, auctions([1, 2], [7, 8], ts=[10, 20]), None)
    assert a.items[0].schema == b.items[0].schema
    assert a.items[0].schema.names == ["id", "seller", "id_right", "name", "_ts"]
    assert _pairs(a, "id", "name", "_ts") == [(1, "ann", 30), (2, "bob", 40)]
    assert _pairs(b, "id", "name", "_ts") == [(1, "ann", 10), (2, "bob", 20)]
    # State is kept: a later person with seller 7's id joins the first auction again.
    right_first.process_input(1, persons([7], ["ann2"], ts=[50]), None)
    assert b.items[-1].to_pylist() == [
        {"id": 1, "seller": 7, "id_right": 7, "name": "ann2", "_ts": 50}
    ]


def test_regular_join_with_event_time_on_one_side_stamps_every_pair_with_it() -> None:
    op, out = make(REGULAR)
    op.process_input(0, auctions([1], [7], ts=[10]), None)
    op.process_input(1, persons([7], ["ann"]), None)  # no event time on this side
    op.process_input(0, auctions([2], [7], ts=[20]), None)
    assert [b.schema.names for b in out.items] == [["id", "seller", "id_right", "name", "_ts"]] * 2
    assert _pairs(out, "id", "_ts") == [(1, 10), (2, 20)]


def test_regular_join_without_event_time_and_with_a_function() -> None:
    op, out = make(JoinSpec("seller", "id", function=lambda b: b.select(["name", "id"])))
    op.process_input(1, persons([7], ["ann"]), None)
    for i in range(40):  # more batches than the side keeps before compacting
        op.process_input(0, auctions([i], [7]), None)
    assert [b.schema.names for b in out.items[:1]] == [["name", "id"]]
    assert _pairs(out, "id") == [(i,) for i in range(40)]
    op.process_input(1, persons([7], ["again"]), None)
    assert len(out.items[-1]) == 40


def test_errors_name_the_operator() -> None:
    op, _ = make(REGULAR)
    op.process_input(0, auctions([1], [7]), None)
    with pytest.raises(
        ConfigurationError,
        match=r"join \(1/1\): the join keys have incompatible types: "
        r"left 'seller' is int64, right 'id' is string",
    ):
        op.process_input(1, persons(["7"], ["ann"]), None)
    with pytest.raises(
        ConfigurationError, match=r"join \(1/1\): the right input has no key column 'id'"
    ):
        op.process_input(1, pa.record_batch([pa.array([1])], names=["x"]), None)
    # Integer widths do not matter: keys are compared as int64.
    narrow, out = make(REGULAR)
    narrow.process_input(0, auctions([1], pa.array([7], pa.int16())), None)
    narrow.process_input(1, persons(pa.array([7], pa.uint32()), ["ann"]), None)
    assert _pairs(out, "id", "name") == [(1, "ann")]
    with pytest.raises(
        DataError, match=r"join \(1/1\): the right key column 'id' \(uint64\) does not fit int64"
    ):
        narrow.process_input(1, persons(pa.array([2**63], pa.uint64()), ["big"]), None)
    timeless, _ = make(WINDOW)
    with pytest.raises(DataError, match=r"join \(1/1\): a window join needs event time"):
        timeless.process_input(0, auctions([1], [7]), None)
    timed, _ = make(WINDOW)
    with pytest.raises(
        DataError, match=r"join \(1/1\): 1 of 2 rows have no event time \(null _ts\)"
    ):
        timed.process_input(0, auctions([1, 2], [7, 8], ts=[5, None]), None)  # type: ignore[list-item]
    failing, _ = make(JoinSpec("seller", "id", function=lambda b: 1 / 0))
    failing.process_input(0, auctions([1], [7]), None)
    with pytest.raises(UserFunctionError, match="batch of 1 rows"):
        failing.process_input(1, persons([7], ["ann"]), None)
    listing, _ = make(JoinSpec("seller", "id", function=lambda b: b.to_pylist()))
    listing.process_input(0, auctions([1], [7]), None)
    with pytest.raises(DataError, match="join apply function returned list"):
        listing.process_input(1, persons([7], ["ann"]), None)


@pytest.mark.parametrize(
    "payload",
    [pa.array([[1, 2], [3]]), pa.array([{"a": 1}, {"a": 2}]), pa.nulls(2)],
    ids=["list", "struct", "null"],
)
@pytest.mark.parametrize("spec", [WINDOW, REGULAR], ids=["window", "regular"])
def test_columns_arrows_hash_join_cannot_carry_are_joined_too(
    payload: pa.Array, spec: JoinSpec
) -> None:
    """Acero refuses list, struct and null non-key columns; they were a DataError."""
    op, out = make(spec)
    left = auctions([1, 2], [7, 8], ts=[100, 200]).append_column("payload", payload)
    op.process_input(0, left, None)
    op.process_input(1, persons([8, 7, 7], ["bob", "ann", "amy"], ts=[300, 400, 500]), None)
    op.process_watermark(999)
    first, second = payload[0].as_py(), payload[1].as_py()
    expected = sorted([(1, first, "ann"), (1, first, "amy"), (2, second, "bob")], key=str)
    assert sorted(((r["id"], r["payload"], r["name"]) for r in out.rows()), key=str) == expected
    assert out.items[0].schema.names[:5] == ["id", "seller", "payload", "id_right", "name"]


@pytest.mark.parametrize("spec", [WINDOW, REGULAR], ids=["window", "regular"])
def test_input_columns_the_join_reserves_or_would_repeat_are_refused(spec: JoinSpec) -> None:
    """A left column _window_start vanished from the output, and a window join's output
    had two window_start columns."""
    op, _ = make(spec)
    with pytest.raises(DataError, match=r"the left input has a column named '_window_start'"):
        op.process_input(
            0, auctions([1], [7], ts=[1]).append_column("_window_start", pa.array([5])), None
        )
    clashing = persons([7], ["ann"], ts=[1]).append_column("window_end", pa.array([5]))
    if spec.size is None:
        op.process_input(1, clashing, None)  # a regular join adds no window columns
    else:
        with pytest.raises(DataError, match=r"the right input has a column named 'window_end'"):
            op.process_input(1, clashing, None)
    repeated, _ = make(spec)
    repeated.process_input(
        0, auctions([1], [7], ts=[1]).append_column("id_right", pa.array([0])), None
    )
    with pytest.raises(DataError, match=r"two columns named 'id_right'"):
        repeated.process_input(1, persons([7], ["ann"], ts=[2]), None)
        repeated.process_watermark(999)


def _target(root: Path, checkpoint_id: int) -> SnapshotTarget:
    return SnapshotTarget(
        fs=storage_fs(str(root)),
        checkpoint_id=checkpoint_id,
        directory=str(root / f"chk-{checkpoint_id}"),
        shared_dir=None,
        name="join-0",
    )


@pytest.mark.parametrize("spec", [WINDOW, REGULAR], ids=["window", "regular"])
def test_snapshot_restores_both_sides_at_another_parallelism(
    tmp_path: Path, spec: JoinSpec
) -> None:
    keys = list(range(40))
    op, _ = make(spec)
    op.process_input(0, auctions(keys, keys, ts=[100] * 40), None)
    op.process_input(1, persons(keys[:20], [f"p{k}" for k in keys[:20]], ts=[200] * 20), None)
    parts = op.snapshot(_target(tmp_path, 1))
    assert parts.keyed is not None
    # Rows after the barrier are not in the snapshot.
    op.process_input(0, auctions([99], [0], ts=[300]), None)
    handle = parts.keyed.run()
    assert handle is not None and handle.TYPE == "columnar"
    with pytest.raises(StateError, match=r"state 'left.* is a row table"):
        list(columnar_rows(storage_fs(str(tmp_path)), handle))
    got: list[tuple[Any, ...]] = []
    for subtask in range(2):
        restored, out = make(spec, subtask=subtask, parallelism=2)
        part = handle.restricted_to(restored.key_groups)
        restored.initialize_state(OperatorRestore(keyed=[part] if part else []), 1)
        mine = [k for k in keys if key_group_for_key(k, MAX_P) in restored.key_groups]
        # The right side's new rows meet the restored left rows of this subtask only.
        restored.process_input(1, persons(keys, [f"q{k}" for k in keys], ts=[300] * 40), None)
        restored.process_watermark(999)
        pairs = _pairs(out, "id", "name")
        assert {i for i, _ in pairs} == set(mine)
        got.extend(pairs)
    expected = [(k, f"q{k}") for k in keys]
    if spec.size is not None:  # window join: the restored right rows pair too
        expected += [(k, f"p{k}") for k in keys[:20]]
    assert sorted(got) == sorted(expected)


def test_the_api_builds_the_join_and_refuses_misuse() -> None:
    env = es.Environment(parallelism=1, runner="local")
    left = env.from_sequence(0, 10, batch_size=4)
    right = env.from_sequence(0, 10, batch_size=4)
    joined = left.join(right).where("value").equal_to("value").apply()
    assert joined.columnar
    windowed = left.join(right).where("value").equal_to("value")
    windowed.window(es.SlidingEventTimeWindows.of(1_000, 500)).apply(lambda b: b)
    kinds = [t.kind for t in env._graph.transformations]
    assert kinds[-2:] == ["columnar_join", "columnar_window_join"]
    with pytest.raises(ConfigurationError, match="takes a column name"):
        left.join(right).where(lambda r: r["value"])
    with pytest.raises(ConfigurationError, match="tumbling or sliding event-time windows"):
        left.join(right).window(es.EventTimeSessionWindows.with_gap(1_000))
    with pytest.raises(ConfigurationError, match="needs where"):
        left.join(right).apply()
    rows = env.from_collection([1, 2])
    # Declared schemas are checked when the job is built.
    ints = rows.to_batches(pa.schema([("k", pa.int32())]))
    strings = rows.to_batches(pa.schema([("k", pa.string())]))
    with pytest.raises(ConfigurationError, match="left 'k' is int32, right 'k' is string"):
        ints.join(strings).where("k").equal_to("k").apply()
    with pytest.raises(ConfigurationError, match="the right stream 'to_batches' has no column 'x'"):
        ints.join(strings).where("k").equal_to("x").apply()
    wide = rows.to_batches(pa.schema([("k", pa.int64())]))
    assert ints.join(wide).where("k").equal_to("k").apply().columnar
    windowed_output = rows.to_batches(pa.schema([("k", pa.int64()), ("window_start", pa.int64())]))
    assert ints.join(windowed_output).where("k").equal_to("k").apply().columnar
    with pytest.raises(
        ConfigurationError, match="the right stream 'to_batches' has a column named 'window_start'"
    ):
        ints.join(windowed_output).where("k").equal_to("k").window(
            es.TumblingEventTimeWindows.of(10)
        ).apply()
    with pytest.raises(ConfigurationError, match="carries rows"):
        left.join(rows)
    with pytest.raises(ConfigurationError, match="carries rows and"):
        rows.join(left)
    # Rows keep their window join: apply() without window() is refused as before.
    with pytest.raises(
        ConfigurationError, match="needs where\\(\\), equal_to\\(\\) and window\\(\\)"
    ):
        rows.join(rows).where(lambda x: x).equal_to(lambda x: x).apply(lambda a, b: a)


@pytest.mark.parametrize("spec", [WINDOW, REGULAR], ids=["window", "regular"])
def test_a_sides_batches_must_keep_its_schema_but_for_widths_and_order(spec: JoinSpec) -> None:
    """A regular join put out the pairs of a batch whose column changed type (its output
    mixed ints and strings in one column) before the state refused it."""
    op, out = make(spec)
    op.process_input(
        1, persons([7], ["ann"], ts=[1]).append_column("age", pa.array([30], pa.int32())), None
    )
    # Another integer width and another column order are the same schema.
    reordered = pa.record_batch(
        [pa.array(["bob"]), pa.array([8]), pa.array([2], pa.int64()), pa.array([40], pa.int64())],
        names=["name", "id", "_ts", "age"],
    )
    op.process_input(1, reordered, None)
    changed = persons([9], ["cy"], ts=[3]).append_column("age", pa.array(["old"]))
    type_change = (
        r"right input must share a schema .*: column 'age' is int32 in one batch and string"
    )
    with pytest.raises(DataError, match=type_change):
        op.process_input(1, changed, None)
    missing = persons([9], ["cy"], ts=[3])
    with pytest.raises(
        DataError, match=r"right input must share a schema .*: column 'age' in some batches only"
    ):
        op.process_input(1, missing, None)
    op.process_input(0, auctions([1, 2, 3], [7, 8, 9], ts=[5, 5, 5]), None)
    op.process_watermark(999)
    assert _pairs(out, "id", "name", "age") == [(1, "ann", 30), (2, "bob", 40)]
    assert {b.schema.field("age").type for b in out.items} == {pa.int32()}
