"""The SQL group aggregation (GROUP BY without a window) on batches: its changelog
(+I, -U/+U, nothing for an unchanged result), a property test whose changelog, applied
to a table, equals DuckDB's GROUP BY after every batch (every aggregate, zero to two
keys, both backends), and snapshot/restore at another parallelism."""

from __future__ import annotations

import math
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest
from aggregate_support import (
    BACKENDS,
    CATALOG,
    VALUES_SCHEMA,
    Upserted,
    assert_equal,
    duckdb_aggregates,
    duckdb_values,
    operator_on,
    routed,
    snapshot_target,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from epochstream.core.changelog import OP, RowKind, kind_names, with_kinds
from epochstream.exceptions import ConfigurationError, DataError, StateError
from epochstream.graph.specs import AggCall, GroupAggregateSpec
from epochstream.state.handles import OperatorRestore

KIND = "columnar_group_aggregate"
SCHEMA = VALUES_SCHEMA


def _op(
    spec: GroupAggregateSpec,
    subtask: int = 0,
    parallelism: int = 1,
    backend: str = "heap",
    local_dir: str = "",
) -> Any:
    return operator_on(
        KIND,
        spec,
        spec.keys,
        subtask=subtask,
        parallelism=parallelism,
        backend=backend,
        local_dir=local_dir,
    )


def _batch(rows: list[dict[str, Any]]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(rows, schema=SCHEMA)


def _duckdb(rows: list[dict[str, Any]], spec: GroupAggregateSpec) -> dict[Any, Any]:
    db = duckdb.connect()
    db.register("t", pa.Table.from_pylist(rows, schema=SCHEMA))
    select = duckdb_aggregates(spec.aggs)
    keys = list(spec.keys)
    group = f" GROUP BY {', '.join(keys)}" if keys else ""
    query = f"SELECT {', '.join([*keys, *select])} FROM t{group}"
    out: dict[Any, Any] = {}
    for row in db.execute(query).fetchall():
        values = list(row[len(keys) :])
        out[tuple(row[: len(keys)])] = duckdb_values(values, spec.aggs)
    return out


# ---------------------------------------------------------------------- examples


def test_new_groups_insert_changed_ones_update_unchanged_ones_stay_quiet() -> None:
    spec = GroupAggregateSpec(
        keys=("k2",), aggs=(AggCall("count_star", None, "n"), AggCall("max", "v", "top"))
    )
    op, out = _op(spec)
    row = {"k1": 1, "f": 0.0, "b": True}
    op.process_batch(_batch([{**row, "k2": "a", "v": 5}, {**row, "k2": "a", "v": 9}]), None)
    op.process_batch(_batch([{**row, "k2": "a", "v": 1}, {**row, "k2": "b", "v": 2}]), None)
    first, second = out.batches()
    assert first.to_pylist() == [{"k2": "a", "n": 2, "top": 9, OP: RowKind.INSERT}]
    assert kind_names(second.column(OP)).to_pylist() == ["-U", "+U", "+I"]
    assert second.to_pydict()["n"] == [2, 3, 1]
    # COUNT unchanged needs a new row... an aggregate whose result stays the same:
    spec = GroupAggregateSpec(keys=("k2",), aggs=(AggCall("max", "v", "top"),))
    op, out = _op(spec)
    op.process_batch(_batch([{**row, "k2": "a", "v": 9}]), None)
    op.process_batch(_batch([{**row, "k2": "a", "v": 1}]), None)  # MAX stays 9: no change
    assert len(out.batches()) == 1


def test_the_spec_and_a_changelog_input_are_refused_with_the_reason() -> None:
    with pytest.raises(ConfigurationError, match="'_op'"):
        GroupAggregateSpec(keys=("k1",), aggs=(AggCall("count_star", None, "_op"),))
    spec = GroupAggregateSpec(keys=("k1",), aggs=(AggCall("count_star", None, "n"),))
    op, _ = _op(spec)
    changes = with_kinds(pa.record_batch({"k1": [1]}), [RowKind.DELETE])
    with pytest.raises(DataError, match=r"columnar_group_aggregate \(1/1\): the input is a "):
        op.process_batch(changes, None)


# ---------------------------------------------------------------------- property


@st.composite
def _scenarios(draw: Any) -> tuple[GroupAggregateSpec, list[list[dict[str, Any]]]]:
    keys = draw(st.sampled_from([(), ("k1",), ("k2",), ("k1", "k2")]))
    aggs = draw(st.lists(st.sampled_from(CATALOG), min_size=1, max_size=6, unique=True))
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    n = draw(st.integers(1, 100))
    floats = [None, float("nan"), -0.0, 0.0, 1.5, -2.25, 1e300]
    rows = [
        {
            "k1": rng.choice([None, 1, 2, -(2**40)]),
            "k2": rng.choice([None, "a", "é"]),
            "v": rng.choice([None, rng.randint(-50, 50), rng.randint(-(2**40), 2**40)]),
            "f": rng.choice(floats),
            "b": rng.choice([None, True, False]),
        }
        for _ in range(n)
    ]
    cuts = sorted(rng.sample(range(1, n), min(n - 1, rng.randint(0, 8)))) if n > 1 else []
    batches = [rows[a:b] for a, b in zip([0, *cuts], [*cuts, n], strict=True)]
    return GroupAggregateSpec(keys=keys, aggs=tuple(aggs)), batches


def _run_against_duckdb(scenario: Any, backend: str) -> None:
    spec, batches = scenario
    scratch = tempfile.mkdtemp(prefix="ga-test-")
    try:
        op, out = _op(spec, backend=backend, local_dir=scratch)
        table = Upserted(spec)
        seen: list[dict[str, Any]] = []
        for batch in batches:
            done = len(out.batches())
            op.process_batch(_batch(batch), None)
            for emitted in out.batches()[done:]:
                table.apply(emitted)
            seen += batch
            assert_equal(table.table, _duckdb(seen, spec))  # after every batch
        op.keyed.dispose()
    finally:
        shutil.rmtree(scratch)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_scenarios())
def test_the_changelog_equals_duckdb_after_every_batch(scenario: Any) -> None:
    _run_against_duckdb(scenario, "heap")


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_scenarios())
def test_the_changelog_equals_duckdb_after_every_batch_on_rocksdb(scenario: Any) -> None:
    _run_against_duckdb(scenario, "rocksdb")


# ---------------------------------------------------------------------- snapshots


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_restore_at_another_parallelism_continues_the_changelog(
    tmp_path: Path, backend: str
) -> None:
    rng = random.Random(3)
    spec = GroupAggregateSpec(keys=("k1", "k2"), aggs=tuple(CATALOG))
    rows = [
        {
            "k1": rng.randint(0, 9),
            "k2": rng.choice(["a", "b", None]),
            "v": rng.choice([None, rng.randint(-9, 9)]),
            "f": rng.choice([None, float("nan"), 1.5]),
            "b": rng.choice([True, False]),
        }
        for _ in range(300)
    ]
    first, second = _batch(rows[:150]), _batch(rows[150:])
    table = Upserted(spec)
    handles = []
    for subtask in range(2):
        op, out = _op(spec, subtask, 2, backend, str(tmp_path))
        for i in range(0, first.num_rows, 25):
            op.process_batch(routed(first.slice(i, 25), spec.keys, op.keyed.key_group_range), None)
        for batch in out.batches():
            table.apply(batch)
        handle = op.snapshot(snapshot_target(tmp_path, 1, subtask)).keyed.run()
        if handle is not None:
            handles.append(handle)
    for subtask in range(3):
        op, out = _op(spec, subtask, 3, backend, str(tmp_path))
        groups = op.keyed.key_group_range
        parts = [p for h in handles if (p := h.restricted_to(groups)) is not None]
        op.initialize_state(OperatorRestore(keyed=parts), 1)
        op.process_batch(routed(second, spec.keys, groups), None)
        for batch in out.batches():
            table.apply(batch)
    assert_equal(table.table, _duckdb(rows, spec))


def test_restore_refuses_state_of_another_query(tmp_path: Path) -> None:
    spec = GroupAggregateSpec(keys=("k1",), aggs=(AggCall("sum", "v", "s"),))
    op, _ = _op(spec)
    op.process_batch(_batch([{"k1": 1, "k2": "a", "v": 1, "f": 1.0, "b": True}]), None)
    handle = op.snapshot(snapshot_target(tmp_path, 1)).keyed.run()
    other = GroupAggregateSpec(keys=("k1",), aggs=(AggCall("count", "v", "d", distinct=True),))
    new, _ = _op(other)
    with pytest.raises(StateError, match="another uid"):
        new.initialize_state(OperatorRestore(keyed=[handle]), 1)


# ---------------------------------------------------------------------- retractions

NAN = float("nan")


@st.composite
def _changelogs(
    draw: Any,
) -> tuple[GroupAggregateSpec, list[tuple[list[dict[str, Any]], list[int]]]]:
    """Batches of a changelog: inserts, and retractions (-U or -D) of rows inserted
    before and not yet retracted, so the input's net rows are a multiset."""
    keys = draw(st.sampled_from([(), ("k1",), ("k2",), ("k1", "k2")]))
    aggs = draw(st.lists(st.sampled_from(CATALOG), min_size=1, max_size=5, unique=True))
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    floats = [None, NAN, -0.0, 0.0, 0.5, -2.25, 3.0]
    if any(a.kind in ("sum", "avg") and a.column == "f" for a in aggs):
        floats.remove(NAN)  # a float sum cannot take a NaN back (NaN - NaN is NaN)
    live: list[dict[str, Any]] = []
    batches = []
    for _ in range(draw(st.integers(1, 8))):
        rows, kinds = [], []
        for _ in range(rng.randint(1, 15)):
            if live and rng.random() < 0.4:
                row = live.pop(rng.randrange(len(live)))
                rows.append(row)
                kinds.append(rng.choice([RowKind.UPDATE_BEFORE, RowKind.DELETE]))
            else:
                row = {
                    "k1": rng.choice([None, 1, 2]),
                    "k2": rng.choice([None, "a", "é"]),
                    "v": rng.choice([None, rng.randint(-5, 5), rng.randint(-(2**40), 2**40)]),
                    "f": rng.choice(floats),
                    "b": rng.choice([None, True, False]),
                }
                live.append(row)
                rows.append(row)
                kinds.append(rng.choice([RowKind.INSERT, RowKind.UPDATE_AFTER]))
        batches.append((rows, kinds))
    return GroupAggregateSpec(keys=keys, aggs=tuple(aggs), updating_input=True), batches


def _run_changelog_against_duckdb(scenario: Any, backend: str) -> None:
    spec, batches = scenario
    scratch = tempfile.mkdtemp(prefix="ga-test-")
    try:
        op, out = _op(spec, backend=backend, local_dir=scratch)
        table = Upserted(spec)
        net: list[dict[str, Any]] = []
        for rows, kinds in batches:
            done = len(out.batches())
            op.process_batch(with_kinds(_batch(rows), kinds), None)
            for emitted in out.batches()[done:]:
                table.apply(emitted)
            for row, kind in zip(rows, kinds, strict=True):
                if RowKind(kind).adds:
                    net.append(row)
                else:
                    net.remove(row)
            expected = _duckdb(net, spec) if net else {}
            if not spec.keys and not net:
                expected = {}  # no rows: no group (the global group is deleted)
            assert_equal(table.table, expected)
        op.keyed.dispose()
    finally:
        shutil.rmtree(scratch)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_changelogs())
def test_retractions_leave_what_duckdb_computes_over_the_net_rows(scenario: Any) -> None:
    """Every aggregate (MIN, MAX and COUNT(DISTINCT) by their value counts), NaN, -0.0
    and NULL values included."""
    _run_changelog_against_duckdb(scenario, "heap")


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_changelogs())
def test_retractions_leave_what_duckdb_computes_on_rocksdb(scenario: Any) -> None:
    _run_changelog_against_duckdb(scenario, "rocksdb")


def test_retracting_the_extreme_falls_back_to_the_next_value_and_null_when_none() -> None:
    aggs = (
        AggCall("max", "v", "top"),
        AggCall("min", "f", "low"),
        AggCall("count", "v", "d", distinct=True),
    )
    spec = GroupAggregateSpec(keys=("k1",), aggs=aggs, updating_input=True)
    op, out = _op(spec)
    row = {"k1": 1, "k2": "a", "b": True}
    rows = [{**row, "v": 9, "f": NAN}, {**row, "v": 9, "f": 2.0}, {**row, "v": 4, "f": None}]
    op.process_batch(_batch(rows), None)
    assert out.batches()[-1].to_pylist() == [
        {"k1": 1, "top": 9, "low": 2.0, "d": 2, OP: RowKind.INSERT}
    ]
    # One copy of 9 goes: MAX stays 9 (a second copy), MIN loses 2.0: NaN is left.
    op.process_batch(with_kinds(_batch([rows[1]]), [RowKind.UPDATE_BEFORE]), None)
    after = out.batches()[-1].to_pylist()[1]
    assert (after["top"], after["d"], math.isnan(after["low"])) == (9, 2, True)
    # The last 9 and the NaN go: MAX falls to 4, MIN has no value (NULL).
    op.process_batch(with_kinds(_batch([rows[0]]), [RowKind.DELETE]), None)
    after = out.batches()[-1].to_pylist()[1]
    assert (after["top"], after["low"], after["d"]) == (4, None, 1)


def test_retracting_a_value_never_added_names_the_operator_and_group() -> None:
    spec = GroupAggregateSpec(keys=("k1",), aggs=(AggCall("max", "v", "top"),), updating_input=True)
    op, _ = _op(spec)
    row = {"k1": 1, "k2": "a", "v": 1, "f": 1.0, "b": True}
    op.process_batch(_batch([row]), None)
    wrong = with_kinds(_batch([{**row, "v": 2}]), [RowKind.UPDATE_BEFORE])
    with pytest.raises(DataError, match=r"\(1/1\): the changelog retracts value 2 of group"):
        op.process_batch(wrong, None)


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_value_counts_restore_at_another_parallelism(tmp_path: Path, backend: str) -> None:
    rng = random.Random(5)
    # Not SUM/AVG(f): a float sum cannot take a NaN back.
    aggs = tuple(a for a in CATALOG if a.kind not in ("sum", "avg") or a.column != "f")
    spec = GroupAggregateSpec(keys=("k1",), aggs=aggs, updating_input=True)
    rows = [
        {
            "k1": rng.randint(0, 9),
            "k2": "a",
            "v": rng.choice([None, rng.randint(-9, 9)]),
            "f": rng.choice([None, NAN, 1.5, -0.5]),
            "b": rng.choice([True, False]),
        }
        for _ in range(200)
    ]
    first = _batch(rows[:150])
    gone = rng.sample(range(150), 60)  # retracted after the restore, with new rows
    second = with_kinds(
        _batch([rows[i] for i in gone] + rows[150:]),
        [RowKind.DELETE] * len(gone) + [RowKind.INSERT] * 50,
    )
    table = Upserted(spec)
    handles = []
    for subtask in range(2):
        op, out = _op(spec, subtask, 2, backend, str(tmp_path))
        op.process_batch(routed(first, spec.keys, op.keyed.key_group_range), None)
        for batch in out.batches():
            table.apply(batch)
        handle = op.snapshot(snapshot_target(tmp_path, 1, subtask)).keyed.run()
        if handle is not None:
            handles.append(handle)
    for subtask in range(3):
        op, out = _op(spec, subtask, 3, backend, str(tmp_path))
        groups = op.keyed.key_group_range
        parts = [p for h in handles if (p := h.restricted_to(groups)) is not None]
        op.initialize_state(OperatorRestore(keyed=parts), 1)
        op.process_batch(routed(second, spec.keys, groups), None)
        for batch in out.batches():
            table.apply(batch)
    net = [r for i, r in enumerate(rows) if i not in set(gone)]
    assert_equal(table.table, _duckdb(net, spec))


@pytest.mark.parametrize("updating_first", [False, True])
def test_restore_refuses_distinct_values_of_the_other_input_kind(
    tmp_path: Path, updating_first: bool
) -> None:
    """Append-only COUNT(DISTINCT) keeps ``distinct<i>``, over a changelog ``values<i>``
    (with counts): neither restores into the other."""
    aggs = (AggCall("count", "v", "d", distinct=True),)
    spec = GroupAggregateSpec(keys=("k1",), aggs=aggs, updating_input=updating_first)
    op, _ = _op(spec)
    op.process_batch(_batch([{"k1": 1, "k2": "a", "v": 1, "f": 1.0, "b": True}]), None)
    handle = op.snapshot(snapshot_target(tmp_path, 1)).keyed.run()
    other = GroupAggregateSpec(keys=("k1",), aggs=aggs, updating_input=not updating_first)
    new, _ = _op(other)
    with pytest.raises(StateError, match="another uid"):
        new.initialize_state(OperatorRestore(keyed=[handle]), 1)
