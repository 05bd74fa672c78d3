"""State TTL (``table.exec.state.ttl``) of the GROUP BY without a window, on an injected
clock and both backends: expired groups go without output and their state (groups and
distinct values) is deleted; the key's next row starts a new group (+I); retractions of
expired groups and values are ignored and counted under a TTL; a restore at another
parallelism keeps the write times; switching the TTL on or off needs a new uid; random
batches on a random clock give the changes of a batch-at-a-time Python reference."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from aggregate_support import BACKENDS, operator_on, routed, snapshot_target

from epochstream.core.changelog import OP, RowKind, kind_names, with_kinds
from epochstream.core.clock import ManualClock
from epochstream.exceptions import ConfigurationError, DataError, StateError
from epochstream.graph.specs import AggCall, GroupAggregateSpec, TopNSpec
from epochstream.state.handles import OperatorRestore

KIND = "columnar_group_aggregate"
SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.int64())])
TTL = 10_000


def _spec(ttl: int = TTL, *, updating: bool = False) -> GroupAggregateSpec:
    distinct = AggCall("count", "v", "cd", distinct=True)
    aggs = (AggCall("count_star", None, "n"), AggCall("max", "v", "top") if updating else distinct)
    return GroupAggregateSpec(keys=("k",), aggs=aggs, updating_input=updating, state_ttl_ms=ttl)


def _ops(
    spec: GroupAggregateSpec, clock: ManualClock, backend: str, root: Path, parallelism: int = 1
) -> list[tuple[Any, Any]]:
    return [
        operator_on(
            KIND,
            spec,
            spec.keys,
            subtask=i,
            parallelism=parallelism,
            backend=backend,
            local_dir=str(root),
            clock=clock,
        )
        for i in range(parallelism)
    ]


def _batch(rows: list[tuple[int, int]], kinds: list[RowKind] | None = None) -> pa.RecordBatch:
    batch = pa.RecordBatch.from_pylist([{"k": k, "v": v} for k, v in rows], schema=SCHEMA)
    return batch if kinds is None else with_kinds(batch, kinds)


def _send(ops: list[tuple[Any, Any]], batch: pa.RecordBatch) -> list[tuple[Any, ...]]:
    """``batch`` routed to the subtasks; their changes as sorted (kind, k, aggregates...)."""
    changes = []
    for op, out in ops:
        op.process_batch(routed(batch, ("k",), op.keyed.key_group_range), None)
        for emitted in out.batches():
            kinds = kind_names(emitted.column(OP)).to_pylist()
            rows = emitted.drop_columns([OP]).to_pylist()
            changes += [(kind, *row.values()) for kind, row in zip(kinds, rows, strict=True)]
        out.items.clear()
    return sorted(changes, key=repr)


def _quiet_watermark(ops: list[tuple[Any, Any]], mark: int) -> None:
    """A watermark (which runs the cleanup) that emits no change, only itself."""
    for op, out in ops:
        op.process_watermark(mark)
        assert out.batches() == []


def _groups(ops: list[tuple[Any, Any]]) -> list[int]:
    """The keys of the groups kept over the subtasks."""
    return sorted(row[0] for row in _kept(ops, "groups"))


def _kept(ops: list[tuple[Any, Any]], table: str) -> list[tuple[Any, ...]]:
    """Table ``table``'s rows over the subtasks, without their key groups and stamps."""
    rows = []
    for op, _ in ops:
        kept = op.keyed.row_table(table)
        if kept is not None:
            rows += [
                tuple(v for c, v in r.items() if c not in ("_kg", "_written"))
                for r in kept.table().to_pylist()
            ]
    return sorted(rows)


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_groups_expire_silently_come_back_as_inserts_and_keep_stamps_through_a_rescale(
    tmp_path: Path, backend: str
) -> None:
    clock = ManualClock(start=1_000.0)
    ops = _ops(_spec(), clock, backend, tmp_path)
    first = _send(ops, _batch([(1, 1), (1, 2), (2, 1)]))
    assert first == [("+I", 1, 2, 2), ("+I", 2, 1, 1)]
    clock.advance(6)
    assert _send(ops, _batch([(2, 3)])) == [("+U", 2, 2, 2), ("-U", 2, 1, 1)]
    clock.advance(5)  # group 1 was written 11 s ago: expired; group 2 5 s ago
    _quiet_watermark(ops, 1)
    assert _groups(ops) == [2]
    assert _kept(ops, "distinct1") == [(2, 1), (2, 3)]
    # The expired key's next row starts a new group: +I, not -U/+U of the old result.
    assert _send(ops, _batch([(1, 5)])) == [("+I", 1, 1, 1)]
    handles = []
    for i, (op, _) in enumerate(ops):
        handle = op.snapshot(snapshot_target(tmp_path, 1, i)).keyed.run()
        if handle is not None:
            handles.append(handle)
    ops = _ops(_spec(), clock, backend, tmp_path, parallelism=2)
    for op, _ in ops:
        parts = [p for h in handles if (p := h.restricted_to(op.keyed.key_group_range))]
        op.initialize_state(OperatorRestore(keyed=parts), 1)
    clock.advance(6)  # group 2 (written at 6 s) expired; group 1 (at 11 s) not
    _quiet_watermark(ops, 2)
    assert _groups(ops) == [1]
    assert _kept(ops, "distinct1") == [(1, 5)]
    assert _send(ops, _batch([(2, 1), (1, 5)])) == [
        ("+I", 2, 1, 1),
        ("+U", 1, 2, 1),
        ("-U", 1, 1, 1),
    ]


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_retractions_of_expired_state_are_ignored_and_counted_under_a_ttl(
    tmp_path: Path, backend: str
) -> None:
    clock = ManualClock(start=1_000.0)
    ops = _ops(_spec(updating=True), clock, backend, tmp_path)
    op = ops[0][0]
    assert _send(ops, _batch([(1, 5), (1, 7)])) == [("+I", 1, 2, 7)]
    clock.advance(11)
    # The group expired: its -U is dropped; the +U after it starts a new group.
    retracted = _batch([(1, 7), (1, 8)], [RowKind.UPDATE_BEFORE, RowKind.UPDATE_AFTER])
    assert _send(ops, retracted) == [("+I", 1, 1, 8)]
    assert op.counters.late_records_dropped == 1
    assert _send(ops, _batch([(2, 1)], [RowKind.DELETE])) == []  # never kept (or expired)
    assert op.counters.late_records_dropped == 2
    # A value retracted more often than it was added (its add expired upstream, say):
    # ignored under a TTL, a DataError without (test_columnar_group_aggregates).
    assert _send(ops, _batch([(1, 9), (1, 4)], [RowKind.INSERT, RowKind.DELETE])) == [
        ("+U", 1, 1, 9),
        ("-U", 1, 1, 8),
    ]
    assert op.counters.late_records_dropped == 3
    assert _kept(ops, "values1") == [(1, 8, 1), (1, 9, 1)]
    clock.advance(11)
    _quiet_watermark(ops, 1)
    assert _groups(ops) == [] and _kept(ops, "values1") == []


def test_without_a_ttl_retracting_a_value_never_added_stays_an_error(tmp_path: Path) -> None:
    ops = _ops(_spec(0, updating=True), ManualClock(start=1_000.0), "heap", tmp_path)
    _send(ops, _batch([(1, 5)]))
    with pytest.raises(DataError, match="retracts value 4 of group"):
        _send(ops, _batch([(1, 4)], [RowKind.DELETE]))


@pytest.mark.parametrize(("before", "after"), [(TTL, 0), (0, TTL)])
def test_switching_the_ttl_on_or_off_against_kept_state_asks_for_a_new_uid(
    tmp_path: Path, before: int, after: int
) -> None:
    clock = ManualClock(start=1_000.0)
    ops = _ops(_spec(before), clock, "heap", tmp_path)
    _send(ops, _batch([(1, 1)]))
    handle = ops[0][0].snapshot(snapshot_target(tmp_path, 1)).keyed.run()
    (op, _), *_ = _ops(_spec(after), clock, "heap", tmp_path)
    with pytest.raises(
        StateError, match=r"switching table\.exec\.state\.ttl on or off needs a new"
    ):
        op.initialize_state(OperatorRestore(keyed=[handle]), 1)


class _Reference:
    """The group aggregation under a TTL a batch at a time, in Python: a group written
    ``ttl`` ago or earlier is gone when its key comes again."""

    def __init__(self, ttl: int) -> None:
        self.ttl = ttl
        self.groups: dict[int, tuple[list[int], int]] = {}  # key -> (values, written)

    @staticmethod
    def result(values: list[int]) -> tuple[int, int]:
        return len(values), len(set(values))

    def batch(self, rows: list[tuple[int, int]], now: int) -> list[tuple[Any, ...]]:
        changes: list[tuple[Any, ...]] = []
        for key in sorted({k for k, _ in rows}):
            held = self.groups.get(key)
            if held is not None and held[1] <= now - self.ttl:
                held = None  # expired: gone without output
            values = [v for k, v in rows if k == key]
            new = self.result([*(held[0] if held else []), *values])
            if held is None:
                changes.append(("+I", key, *new))
            elif self.result(held[0]) != new:
                changes += [("-U", key, *self.result(held[0])), ("+U", key, *new)]
            self.groups[key] = ([*(held[0] if held else []), *values], now)
        return sorted(changes, key=repr)


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_random_batches_with_a_ttl_equal_a_python_reference_through_a_rescale(
    tmp_path: Path, backend: str
) -> None:
    rng = random.Random(11)
    clock = ManualClock(start=100.0)
    ttl = 4_000
    ops = _ops(_spec(ttl), clock, backend, tmp_path, parallelism=2)
    reference = _Reference(ttl)
    for step in range(40):
        clock.advance(rng.choice([0, 0.5, 1, 2.5]))
        now = int(clock.wall() * 1000)
        rows = [(rng.randint(0, 7), rng.randint(0, 3)) for _ in range(rng.randint(1, 8))]
        assert _send(ops, _batch(rows)) == reference.batch(rows, now), step
        if rng.random() < 0.3:
            _quiet_watermark(ops, step)
        if step == 20:
            handles = []
            for i, (op, _) in enumerate(ops):
                handle = op.snapshot(snapshot_target(tmp_path, 1, i)).keyed.run()
                if handle is not None:
                    handles.append(handle)
            ops = _ops(_spec(ttl), clock, backend, tmp_path, parallelism=3)
            for op, _ in ops:
                parts = [p for h in handles if (p := h.restricted_to(op.keyed.key_group_range))]
                op.initialize_state(OperatorRestore(keyed=parts), 1)
    clock.advance(5)
    _quiet_watermark(ops, 99)
    assert _groups(ops) == [] and _kept(ops, "distinct1") == []


def test_a_bad_ttl_and_a_key_named_like_the_stamps_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="a group aggregation's state_ttl_ms is a non-neg"):
        _spec(-1)
    with pytest.raises(ConfigurationError, match="a Top-N's state_ttl_ms is a non-negative int"):
        TopNSpec(("p",), (("x", "desc"),), 1, state_ttl_ms=True)
    stamped = GroupAggregateSpec(
        keys=("_written",), aggs=(AggCall("count_star", None, "n"),), state_ttl_ms=TTL
    )
    with pytest.raises(ConfigurationError, match="key column '_written' is the name"):
        operator_on(KIND, stamped, stamped.keys, local_dir=str(tmp_path))
