"""Columnar operators driven directly with a recording emit and a real snapshot target."""

from __future__ import annotations

import collections
import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from columnar_support import MAX_P, Emitted, make_operator

from epochstream.core.arrow import KG_FIELD
from epochstream.core.filesystems import storage_fs
from epochstream.exceptions import DataError, UserFunctionError
from epochstream.graph.specs import AggregateSpec, WindowAggregateSpec
from epochstream.state.backends.base import SnapshotTarget
from epochstream.state.handles import OperatorRestore
from epochstream.state.keygroups import key_group_for_key


def make(
    kind: str, payload: Any, *, key: str | None = None, subtask: int = 0, parallelism: int = 1
) -> tuple[Any, Emitted]:
    return make_operator(
        kind, payload, keys=[key] if key else None, subtask=subtask, parallelism=parallelism
    )


def _kv(keys: list[Any], values: list[Any], ts: list[int] | None = None) -> pa.RecordBatch:
    batch = pa.record_batch([pa.array(keys), pa.array(values)], names=["k", "v"])
    return batch if ts is None else batch.append_column("_ts", pa.array(ts, pa.int64()))


def test_map_batches_keeps_event_time_and_checks_the_result_type() -> None:
    op, out = make("map_batches", lambda b: pa.record_batch([pc.multiply(b["v"], 2)], names=["v2"]))
    op.process_batch(_kv([1, 2], [3, 4], ts=[10, 20]), None)
    assert out.rows() == [{"v2": 6, "_ts": 10}, {"v2": 8, "_ts": 20}]
    bad, _ = make("map_batches", lambda b: b.to_pylist())
    with pytest.raises(DataError, match=r"returned list, not a pyarrow.RecordBatch"):
        bad.process_batch(_kv([1], [1]), None)
    failing, _ = make("map_batches", lambda b: 1 / 0)
    with pytest.raises(UserFunctionError, match="batch of 1 rows: k, v"):
        failing.process_batch(_kv([1], [1]), None)
    # Dropping _ts and changing the rows: the times cannot follow the rows (it used to
    # depend on the data whether the batch got _ts back, and fail later, elsewhere).
    filtering, filtered = make(
        "map_batches", lambda b: b.select(["k", "v"]).filter(pc.greater(b["v"], 3))
    )
    filtering.process_batch(_kv([1, 2], [5, 6], ts=[10, 20]), None)
    filtering.process_batch(_kv([1], [1], ts=[30]), None)  # no rows left: nothing to time
    assert filtered.rows() == [{"k": 1, "v": 5, "_ts": 10}, {"k": 2, "v": 6, "_ts": 20}]
    with pytest.raises(
        DataError, match=r"dropped the event-time column '_ts' and returned 1 rows for 2"
    ):
        filtering.process_batch(_kv([1, 2], [1, 6], ts=[10, 20]), None)
    # A _ts of its own must be integer milliseconds.
    narrow, narrowed = make(
        "map_batches", lambda b: b.set_column(2, "_ts", b["_ts"].cast(pa.int32()))
    )
    narrow.process_batch(_kv([1], [1], ts=[10]), None)
    assert narrowed.items[0].schema.field("_ts").type == pa.int64()
    for kind in (pa.float64(), pa.string()):
        floats, _ = make("map_batches", lambda b, k=kind: b.set_column(2, "_ts", b["_ts"].cast(k)))
        with pytest.raises(
            DataError, match=rf"returned the event-time column '_ts' as {kind}; event time is int64"
        ):
            floats.process_batch(_kv([1], [1], ts=[10]), None)
    # View types become plain ones where batches enter.
    views, viewed = make(
        "map_batches", lambda b: b.append_column("s", pa.array(["x"] * len(b), pa.string_view()))
    )
    views.process_batch(_kv([1], [1]), None)
    assert viewed.items[0].schema.field("s").type == pa.string()


def test_filter_expression_and_its_error_names_the_schema() -> None:
    op, out = make("filter_batches", pc.field("v") > 3)
    op.process_batch(_kv([1, 2, 3], [2, 5, 9]), None)
    assert [r["v"] for r in out.rows()] == [5, 9]
    bad, _ = make("filter_batches", pc.field("missing") > 3)
    with pytest.raises(DataError, match="cannot be evaluated on <batch of 1 rows: k, v>"):
        bad.process_batch(_kv([1], [1]), None)


def test_to_rows_and_to_batches_round_trip_with_timestamps() -> None:
    to_rows, rows_out = make("to_rows", None)
    # The edge's _kg is dropped; a user's column of that name is a column like any other.
    keyed = _kv(["a", "b"], [1, 2], ts=[100, 200]).append_column(
        KG_FIELD, pa.array([0, 1], pa.int32())
    )
    to_rows.process_batch(keyed, None)
    assert rows_out.items == [[{"k": "a", "v": 1}, {"k": "b", "v": 2}]]
    assert rows_out.timestamps == [[100, 200]]
    schema = pa.schema([("k", pa.string()), ("v", pa.int64())])
    to_batches, batches_out = make("to_batches", schema)
    to_batches.process_batch(rows_out.items[0], rows_out.timestamps[0])
    to_batches.process_batch([("c", 3)], None)
    expected = _kv(["a", "b"], [1, 2], ts=[100, 200])
    assert batches_out.items[0].equals(expected.cast(schema.append(pa.field("_ts", pa.int64()))))
    assert batches_out.rows()[-1] == {"k": "c", "v": 3}
    with pytest.raises(DataError, match=r"record 1: .*'v': 'x'"):
        to_batches.process_batch([{"k": "d", "v": 1}, {"k": "e", "v": "x"}], None)


def test_to_batches_with_a_schema_naming_ts_has_one_ts_column() -> None:
    """The records' timestamps were appended as a second ``_ts`` column."""
    to_batches, out = make("to_batches", pa.schema([("k", pa.string()), ("_ts", pa.int64())]))
    to_batches.process_batch([{"k": "a", "_ts": 1}], [5])
    assert out.items[0].schema.names == ["k", "_ts"] and out.rows() == [{"k": "a", "_ts": 5}]


def test_to_batches_refuses_rows_that_arrow_would_turn_into_nulls() -> None:
    """Arrow made a tuple among dict rows, a dict with none of the fields, or a missing
    non-nullable value a silent null; and an int beyond int64 was a raw OverflowError."""
    schema = pa.schema([pa.field("k", pa.string(), nullable=False), ("v", pa.int64())])
    to_batches, out = make("to_batches", schema)
    bad = {
        r"record 1 does not fit schema \['k', 'v'\] .*: \('b', 2\)": [{"k": "a", "v": 1}, ("b", 2)],
        r"record 0 has field\(s\) key that schema .*: \{'key': 'a'\}": [{"key": "a"}],
        r"record 1 does not fit schema .*: 'ab'": [("x", 1), "ab"],
        r"record 1 does not fit schema .*: \{'k': 'y', 'v': 2\}": [("x", 1), {"k": "y", "v": 2}],
        r"field 'k' .* is not nullable, but record 1 has no value for it: \{'v': 2\}": [
            {"k": "a"},
            {"v": 2},
        ],
        r"record 0: \{'k': 'a', 'v': 2\*\*70\}|record 0: \{'k': 'a', 'v': 1180591620717411303424\}": [
            {"k": "a", "v": 2**70}
        ],
        # A field the schema lacks was dropped, and the misspelt one came out null.
        r"record 1 has field\(s\) value that schema \['k', 'v'\] does not have .*'value': 5\}": [
            {"k": "a", "v": 1},
            {"k": "b", "value": 5},
        ],
    }
    for message, rows in bad.items():
        with pytest.raises(DataError, match=rf"to_batches \(1/1\): .*{message}"):
            to_batches.process_batch(rows, None)
    # Optional fields may be missing, and an all-null row of dicts is still a row.
    to_batches.process_batch([{"k": "a"}, {"k": "b", "v": None}], None)
    nullable, nullable_out = make("to_batches", pa.schema([("k", pa.string()), ("v", pa.int64())]))
    nullable.process_batch([{"k": None, "v": None}, {}], None)
    assert out.rows() == [{"k": "a", "v": None}, {"k": "b", "v": None}]
    assert nullable_out.rows() == [{"k": None, "v": None}] * 2


def test_to_batches_refuses_what_arrow_would_convert_with_a_loss() -> None:
    """Arrow truncated a float into an integer or timestamp field (1.5 -> 1) and took a
    string apart into a list field's characters, silently; an integral float loses
    nothing and is kept, in dict rows and tuple rows alike."""
    schema = pa.schema(
        [
            ("k", pa.string()),
            ("v", pa.int64()),
            ("t", pa.timestamp("ms")),
            ("l", pa.list_(pa.string())),
        ]
    )
    to_batches, out = make("to_batches", schema)
    bad = {
        r"record 1 .*field 'v' is 2.5, which its type int64 would truncate: \{'k': 'b', 'v': 2.5\}": [
            {"k": "a", "v": 1},
            {"k": "b", "v": 2.5},
        ],
        r"record 0 .*field 't' is 1.7, which its type timestamp\[ms\] would truncate": [
            ("a", 1, 1.7, None)
        ],
        r"record 0 .*field 'l' is a string, which Arrow would take apart into its characters: "
        r"\{'k': 'a', 'l': 'abc'\}": [{"k": "a", "l": "abc"}],
        r"record 1 .*field 'l' is a string": [("a", 1, 0, ["x"]), ("b", 2, 0, "xy")],
        # Rows of a dict subclass are dict rows too.
        r"record 0 .*field 'v' is 1.5": [collections.OrderedDict(k="c", v=1.5)],
        r"record 0 has field\(s\) w that schema": [collections.OrderedDict(k="c", w=1)],
    }
    for message, rows in bad.items():
        with pytest.raises(DataError, match=rf"to_batches \(1/1\): {message}"):
            to_batches.process_batch(rows, None)
    to_batches.process_batch([{"k": "a", "v": 2.0, "l": ["x", "y"]}], None)
    to_batches.process_batch([("b", 3, 4.0, None)], None)
    assert out.rows() == [
        {"k": "a", "v": 2, "t": None, "l": ["x", "y"]},
        {"k": "b", "v": 3, "t": datetime.datetime(1970, 1, 1, 0, 0, 0, 4000), "l": None},
    ]


def _target(root: Path, checkpoint_id: int, name: str) -> SnapshotTarget:
    return SnapshotTarget(
        fs=storage_fs(str(root)),
        checkpoint_id=checkpoint_id,
        directory=str(root / f"chk-{checkpoint_id}"),
        shared_dir=None,
        name=name,
    )


def test_aggregate_snapshot_restores_at_another_parallelism(tmp_path: Path) -> None:
    op, _ = make("columnar_aggregate", AggregateSpec("sum", key="k", value="v"), key="k")
    keys = list(range(40))
    op.process_batch(_kv(keys, [1] * 40), None)
    op.process_batch(_kv(keys[:10], [5] * 10), None)
    parts = op.snapshot(_target(tmp_path, 1, "sum-0"))
    assert parts.keyed is not None
    handle = parts.keyed.run()
    assert handle is not None and handle.TYPE == "columnar"
    final: dict[int, int] = {}
    for subtask in range(2):
        restored, restored_out = make(
            "columnar_aggregate",
            AggregateSpec("sum", key="k", value="v"),
            key="k",
            subtask=subtask,
            parallelism=2,
        )
        part = handle.restricted_to(restored.key_groups)
        restored.initialize_state(OperatorRestore(keyed=[part] if part else []), 1)
        restored.process_batch(_kv(keys, [100] * 40), None)
        # A subtask continues exactly the sums of the keys in its key groups.
        final.update(
            {
                r["k"]: r["v"]
                for r in restored_out.rows()
                if key_group_for_key(r["k"], MAX_P) in restored.key_groups
            }
        )
    assert final == {k: (106 if k < 10 else 101) for k in keys}


def test_window_fires_at_the_watermark_drops_late_rows_and_restores_open_windows(
    tmp_path: Path,
) -> None:
    spec = WindowAggregateSpec("count", key="k", value=None, size=1_000, slide=1_000)
    op, out = make("columnar_window", spec, key="k")
    op.process_batch(_kv(["a", "a", "b"], [1, 1, 1], ts=[10, 999, 1_500]), None)
    op.process_watermark(999)
    assert out.rows() == [
        {"k": "a", "window_start": 0, "window_end": 1_000, "count": 2, "_ts": 999}
    ]
    assert out.watermarks == [999]
    op.process_batch(_kv(["a"], [1], ts=[500]), None)  # late: its window fired
    assert op.counters.late_records_dropped == 1
    handle = op.snapshot(_target(tmp_path, 2, "win-0")).keyed.run()
    restored, restored_out = make("columnar_window", spec, key="k")
    restored.initialize_state(OperatorRestore(keyed=[handle]), 2)
    restored.process_batch(_kv(["b"], [1], ts=[1_200]), None)
    restored.process_watermark(2_000)
    assert restored_out.rows() == [
        {"k": "b", "window_start": 1_000, "window_end": 2_000, "count": 2, "_ts": 1_999}
    ]


def test_windows_with_integer_keys_of_several_widths_snapshot_and_restore(tmp_path: Path) -> None:
    """One window saw only int8 keys, the other int8 and int64 (held as int64): their
    state tables did not concatenate, so every snapshot failed."""
    spec = WindowAggregateSpec("count", key="k", value=None, size=1_000, slide=1_000)
    op, _ = make("columnar_window", spec, key="k")
    ts = pa.array([10], pa.int64())
    op.process_batch(pa.record_batch([pa.array([1], pa.int8()), ts], names=["k", "_ts"]), None)
    op.process_batch(
        pa.record_batch([pa.array([2], pa.int8()), pa.array([1_010])], names=["k", "_ts"]), None
    )
    op.process_batch(
        pa.record_batch([pa.array([1_000], pa.int64()), pa.array([1_020])], names=["k", "_ts"]),
        None,
    )
    handle = op.snapshot(_target(tmp_path, 1, "win-0")).keyed.run()
    restored, out = make("columnar_window", spec, key="k")
    restored.initialize_state(OperatorRestore(keyed=[handle]), 1)
    restored.process_watermark(2_000)
    assert sorted((r["window_start"], r["k"]) for r in out.rows()) == [
        (0, 1),
        (1_000, 2),
        (1_000, 1_000),
    ]


def test_sliding_windows_assign_each_row_to_every_window_it_falls_in() -> None:
    spec = WindowAggregateSpec("sum", key="k", value="v", size=1_000, slide=500)
    op, out = make("columnar_window", spec, key="k")
    op.process_batch(_kv([1], [7], ts=[700]), None)
    op.process_watermark(10_000)
    assert [(r["window_start"], r["v"]) for r in out.rows()] == [(0, 7), (500, 7)]


def test_a_window_value_column_turning_floating_point_is_refused_even_in_new_windows() -> None:
    """Each window checks its own rows; the operator checks across windows, so a batch
    touching only new windows cannot change the value type unnoticed."""
    spec = WindowAggregateSpec("sum", key="k", value="v", size=1_000, slide=1_000)
    op, _ = make("columnar_window", spec, key="k")
    op.process_batch(_kv(["a"], pa.array([1], pa.int32()), ts=[10]), None)
    op.process_batch(_kv(["a"], pa.array([2], pa.int64()), ts=[1_010]), None)  # widths may differ
    with pytest.raises(DataError, match=r"column 'v' changed type from int32 to double"):
        op.process_batch(_kv(["a"], [2.5], ts=[2_010]), None)


@pytest.mark.parametrize("kind", ["columnar_window", "columnar_processing_window"])
def test_a_window_key_column_changing_type_is_refused_even_in_new_windows(kind: str) -> None:
    """A key type changed in a batch touching only new windows passed, until every
    checkpoint failed putting the windows' tables together (and every restart was used)."""
    spec = WindowAggregateSpec("sum", key="k", value="v", size=1_000, slide=1_000)
    op, _ = make(kind, spec, key="k")
    op.process_batch(_kv(pa.array([1], pa.int32()), [1], ts=[10]), None)
    op.process_batch(_kv(pa.array([2], pa.int64()), [1], ts=[1_010]), None)  # widths may differ
    for later in (pa.array([True]), pa.array([2.0]), pa.array(["a"])):
        with pytest.raises(
            DataError, match=rf"key column 'k' changed type from int64 to {later.type}"
        ):
            op.process_batch(_kv(later, [1], ts=[2_010]), None)
