"""The regular join (``columnar_regular_join``) driven directly on each backend:

- exact changelogs of LEFT/RIGHT/FULL joins (padded rows retracted on the first match,
  back on the last retraction; null keys padded or dropped);
- a property test: random changelogs on both sides (inserts, updates, deletes, null
  keys), random batches, a residual condition, a restore at another parallelism
  mid-stream; the emitted changelog applied as a multiset equals DuckDB's join of the
  final inputs, for inner, left, right and full joins;
- state TTL on an injected clock: rows expire (no output), the state shrinks.
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from join_support import BACKENDS, Cluster

from epochstream.core.changelog import OP, RowKind, kind_names, with_kinds
from epochstream.core.clock import ManualClock
from epochstream.exceptions import ConfigurationError, DataError, StateError
from epochstream.graph.specs import EquiJoinSpec, IntervalBounds

OUTPUT = pa.schema([(n, pa.int64()) for n in ("lk", "lid", "lv", "rk", "rid", "rv")])
JOINS = ("inner", "left", "right", "full")


class LeftAbove:
    """The residual condition ``lv > rv`` (picklable; NULL where either is null)."""

    def __call__(self, batch: pa.RecordBatch) -> pa.Array:
        return pc.greater(batch.column("lv"), batch.column("rv"))


def spec_of(
    join_type: str = "left",
    *,
    condition: Any = None,
    updating: bool = True,
    ttl: int = 0,
) -> EquiJoinSpec:
    return EquiJoinSpec(
        ("k",),
        ("k",),
        (("k", "lk"), ("id", "lid"), ("v", "lv")),
        (("k", "rk"), ("id", "rid"), ("v", "rv")),
        condition=condition,
        join_type=join_type,
        updating_input=updating,
        state_ttl_ms=ttl,
        output_schema=OUTPUT,
    )


def changes(rows: list[tuple[str, Any, int, Any]]) -> pa.RecordBatch:
    """``(kind, k, id, v)`` rows (kind ``+I``, ``-U``, ``+U``, ``-D``) as a changelog batch."""
    kinds = [("+I", "-U", "+U", "-D").index(r[0]) for r in rows]
    batch = pa.record_batch(
        {
            "k": pa.array([r[1] for r in rows], pa.int64()),
            "id": pa.array([r[2] for r in rows], pa.int64()),
            "v": pa.array([r[3] for r in rows], pa.int64()),
        }
    )
    return with_kinds(batch, kinds)


def shown(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """Emitted rows as ``(kind, lid, rid)``."""
    kinds = kind_names(pa.array([r[OP] for r in rows], pa.int8())).to_pylist() if rows else []
    return [(kind, r["lid"], r["rid"]) for kind, r in zip(kinds, rows, strict=True)]


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_left_join_retracts_padded_rows_on_the_first_match_and_restores_them(
    backend: str, tmp_path: Path
) -> None:
    cluster = Cluster(backend, tmp_path, spec_of("left"), 1)
    cluster.send(0, changes([("+I", 1, 10, 5), ("+I", None, 11, 5)]))
    assert sorted(shown(cluster.rows()), key=repr) == [("+I", 10, None), ("+I", 11, None)]
    cluster.send(1, changes([("+I", 1, 20, 1), ("+I", None, 21, 1)]))
    assert shown(cluster.rows()) == [("-D", 10, None), ("+I", 10, 20)]
    cluster.send(1, changes([("+I", 1, 22, 2)]))
    assert shown(cluster.rows()) == [("+I", 10, 22)]
    # An update of a right row: -U then +U; the left row keeps a match throughout.
    cluster.send(1, changes([("-U", 1, 20, 1), ("+U", 1, 20, 3)]))
    assert shown(cluster.rows()) == [("-D", 10, 20), ("+I", 10, 20)]
    cluster.send(1, changes([("-D", 1, 20, 3), ("-D", 1, 22, 2)]))
    assert shown(cluster.rows()) == [("-D", 10, 20), ("-D", 10, 22), ("+I", 10, None)]
    cluster.send(0, changes([("-D", 1, 10, 5), ("-D", None, 11, 5)]))
    assert sorted(shown(cluster.rows()), key=repr) == [("-D", 10, None), ("-D", 11, None)]
    assert (
        sum(
            len(op.keyed.row_table(side) or ())
            for op, _ in cluster.ops
            for side in ("left", "right")
        )
        == 0
    )


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_full_join_pads_both_sides_and_condition_decides_matches(
    backend: str, tmp_path: Path
) -> None:
    cluster = Cluster(backend, tmp_path, spec_of("full", condition=LeftAbove()), 1)
    cluster.send(1, changes([("+I", 1, 20, 5)]))
    assert shown(cluster.rows()) == [("+I", None, 20)]
    # lv 3 > rv 5 is false: no match, both padded.
    cluster.send(0, changes([("+I", 1, 10, 3)]))
    assert shown(cluster.rows()) == [("+I", 10, None)]
    cluster.send(0, changes([("+I", 1, 11, 9)]))
    assert shown(cluster.rows()) == [("-D", None, 20), ("+I", 11, 20)]
    cluster.send(0, changes([("-D", 1, 11, 9)]))
    assert shown(cluster.rows()) == [("-D", 11, 20), ("+I", None, 20)]
    # A retraction of a row never kept removes nothing (the kept row 10 stays).
    cluster.send(0, changes([("-D", 1, 12, 3)]))
    assert shown(cluster.rows()) == [("-D", 12, None)]
    cluster.send(1, changes([("+I", 1, 21, 0)]))
    assert shown(cluster.rows()) == [("-D", 10, None), ("+I", 10, 21)]


def test_right_join_emits_the_right_rows_and_drops_unmatched_left_ones(tmp_path: Path) -> None:
    cluster = Cluster("heap", tmp_path, spec_of("right", updating=False), 1)
    cluster.send(0, changes([("+I", 1, 10, 0)]).drop_columns([OP]))
    assert cluster.rows() == []
    cluster.send(1, changes([("+I", 1, 20, 0), ("+I", 2, 21, 0)]).drop_columns([OP]))
    assert sorted(shown(cluster.rows()), key=repr) == [("+I", 10, 20), ("+I", None, 21)]


def test_an_inner_join_of_an_updating_input_emits_a_changelog_without_ts(tmp_path: Path) -> None:
    cluster = Cluster("heap", tmp_path, spec_of("inner"), 1)
    cluster.send(0, changes([("+I", 1, 10, 0)]))
    cluster.send(1, changes([("+I", 1, 20, 0), ("-D", 1, 20, 0), ("+I", 1, 21, 0)]))
    rows = cluster.rows()
    assert shown(rows) == [("+I", 10, 20), ("-D", 10, 20), ("+I", 10, 21)]
    assert all("_ts" not in r for r in rows)


def oracle(
    join_type: str, left: Counter[tuple[Any, ...]], right: Counter[tuple[Any, ...]]
) -> Counter[tuple[Any, ...]]:
    """DuckDB's join of the final left and right multisets on ``k`` and ``lv > rv``."""
    con = duckdb.connect()

    def table(rows: Counter[tuple[Any, ...]]) -> pa.Table:
        flat = [r for r, n in rows.items() for _ in range(n)]
        return pa.table(
            {
                name: pa.array([r[i] for r in flat], pa.int64())
                for i, name in enumerate(("k", "id", "v"))
            }
        )

    con.register("l", table(left))
    con.register("r", table(right))
    query = (
        f"SELECT l.k, l.id, l.v, r.k, r.id, r.v FROM l {join_type.upper()} JOIN r "
        "ON l.k = r.k AND l.v > r.v"
    )
    return Counter(con.execute(query).fetchall())


def applied(rows: list[dict[str, Any]]) -> Counter[tuple[Any, ...]]:
    """The emitted changelog applied as a multiset; no row may go below zero."""
    result: Counter[tuple[Any, ...]] = Counter()
    for r in rows:
        row = tuple(r[n] for n in OUTPUT.names)
        result[row] += 1 if r[OP] in (RowKind.INSERT, RowKind.UPDATE_AFTER) else -1
        assert result[row] >= 0, f"{row} retracted more often than emitted"
    return +result


def random_changes(
    rng: random.Random, kept: Counter[tuple[Any, ...]], first_id: int, n: int
) -> list[tuple[str, Any, int, Any]]:
    """``n`` random changes of a side whose live rows are ``kept`` (updated in place):
    inserts (null keys too), updates (-U, +U) and deletes of live rows."""
    out: list[tuple[str, Any, int, Any]] = []
    for i in range(n):
        live = sorted(kept.elements(), key=repr)
        choice = rng.random()
        if live and choice < 0.2:
            row = rng.choice(live)
            kept[row] -= 1
            out.append(("-D", *row))
        elif live and choice < 0.4:
            row = rng.choice(live)
            new = (row[0], row[1], rng.choice([None, *range(4)]))
            kept[row] -= 1
            kept[new] += 1
            out += [("-U", *row), ("+U", *new)]
        else:
            row = (rng.choice([0, 1, 2, None]), first_id + i, rng.choice([None, *range(4)]))
            kept[row] += 1
            out.append(("+I", *row))
    return out


@pytest.mark.parametrize("join_type", JOINS)
@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("seed", [1, 2])
def test_random_changelogs_equal_duckdb_through_a_rescale(
    join_type: str, backend: str, seed: int, tmp_path: Path
) -> None:
    rng = random.Random(seed * 101 + JOINS.index(join_type))
    cluster = Cluster(backend, tmp_path, spec_of(join_type, condition=LeftAbove()), 2)
    kept: tuple[Counter[tuple[Any, ...]], Counter[tuple[Any, ...]]] = (Counter(), Counter())
    emitted: list[dict[str, Any]] = []
    for step in range(12):
        side = rng.randrange(2)
        batch = random_changes(rng, kept[side], 1_000 * step + 100 * side, rng.randint(1, 6))
        cluster.send(side, changes(batch))
        if step == 6:
            emitted += cluster.rows()
            cluster = cluster.rescaled(3 if backend == "heap" else 1, checkpoint_id=1)
    emitted += cluster.rows()
    assert applied(emitted) == oracle(join_type, +kept[0], +kept[1])


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_state_ttl_expires_rows_without_output_and_shrinks_the_state(
    backend: str, tmp_path: Path
) -> None:
    clock = ManualClock(start=1_000.0)
    cluster = Cluster(backend, tmp_path, spec_of("left", ttl=10_000), 1, clock)
    [(op, _)] = cluster.ops

    def kept(side: str) -> int:
        table = op.keyed.row_table(side)
        return 0 if table is None else len(table)

    cluster.send(0, changes([("+I", 1, 10, 5), ("+I", 2, 11, 5)]))
    clock.advance(6)
    cluster.send(1, changes([("+I", 1, 20, 1)]))
    assert shown(cluster.rows()) == [
        ("+I", 10, None),
        ("+I", 11, None),
        ("-D", 10, None),
        ("+I", 10, 20),
    ]
    clock.advance(5)  # left rows written 11 s ago: expired; the right row 5 s ago
    cluster.watermark(0)
    assert (kept("left"), kept("right")) == (0, 1)
    assert cluster.rows() == []  # expiry emits nothing
    cluster.send(0, changes([("+I", 2, 12, 5)]))
    assert shown(cluster.rows()) == [("+I", 12, None)]  # 2's older row is gone
    # State restored at another parallelism keeps the write times.
    cluster = cluster.rescaled(2, checkpoint_id=1)
    clock.advance(6)  # the right row: 11 s old, expired; the new left row 6 s
    cluster.send(0, changes([("+I", 1, 13, 5)]))
    assert shown(cluster.rows()) == [("+I", 13, None)]
    clock.advance(10)
    cluster.watermark(1)
    assert (
        sum(len(op.keyed.row_table(s) or ()) for op, _ in cluster.ops for s in ("left", "right"))
        == 0
    )


def test_the_retraction_of_an_expired_row_restores_its_partner_s_padded_row(
    tmp_path: Path,
) -> None:
    clock = ManualClock(start=1_000.0)
    cluster = Cluster("heap", tmp_path, spec_of("right", ttl=10_000), 1, clock)
    cluster.send(0, changes([("+I", 1, 10, 5)]))
    clock.advance(5)
    cluster.send(1, changes([("+I", 1, 20, 1)]))
    assert shown(cluster.rows()) == [("+I", 10, 20)]
    clock.advance(6)  # the left row expired (silently); the right one is 6 s old
    cluster.send(0, changes([("-D", 1, 10, 5)]))
    assert shown(cluster.rows()) == [("-D", 10, 20), ("+I", None, 20)]
    cluster.send(0, changes([("+I", 1, 11, 5)]))
    assert shown(cluster.rows()) == [("-D", None, 20), ("+I", 11, 20)]


def test_errors_name_the_misuse(tmp_path: Path) -> None:
    cluster = Cluster("heap", tmp_path, spec_of("inner", updating=False), 1)
    with pytest.raises(DataError, match=r"changelog.*updating_input=True"):
        cluster.send(0, changes([("+I", 1, 10, 5)]))
    with pytest.raises(ConfigurationError, match="output_schema"):
        EquiJoinSpec(("k",), ("k",), (("k", "lk"),), (("id", "rid"),), join_type="left")
    with pytest.raises(ConfigurationError, match="join_type"):
        spec_of("cross")
    with pytest.raises(ConfigurationError, match="regular join's"):
        EquiJoinSpec(
            ("k",),
            ("k",),
            (("k", "lk"),),
            (("id", "rid"),),
            retention=IntervalBounds(0, 1),
            state_ttl_ms=5,
        )
    with_ttl = Cluster("heap", tmp_path, spec_of("left", ttl=1_000), 1)
    with_ttl.send(0, changes([("+I", 1, 10, 5)]))
    with_ttl.spec = spec_of("left")  # restored without the TTL
    with pytest.raises(StateError, match="state TTL"):
        with_ttl.rescaled(1, checkpoint_id=1)


def test_phases_apply_a_key_s_changes_in_order(tmp_path: Path) -> None:
    # One batch inserts, deletes and re-inserts a left key: the padded rows follow.
    cluster = Cluster("heap", tmp_path, spec_of("left"), 1)
    batch = changes([("+I", 1, 10, 5), ("-D", 1, 10, 5), ("+I", 1, 11, 5), ("+I", 2, 12, 5)])
    cluster.send(0, batch)
    result = applied(cluster.rows())
    assert result == Counter({(1, 11, 5, None, None, None): 1, (2, 12, 5, None, None, None): 1})


class Reference:
    """Flink's ``StreamingJoinOperator`` one row at a time, with state TTL: each side's
    live rows with their write times; match counts counted over the live rows."""

    def __init__(self, join_type: str, ttl: int) -> None:
        self.outer = (join_type in ("left", "full"), join_type in ("right", "full"))
        self.ttl = ttl
        self.rows: tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]] = ([], [])
        self.result: Counter[tuple[Any, ...]] = Counter()

    def _live(self, side: int, now: int) -> list[tuple[Any, ...]]:
        if self.ttl:
            self.rows[side][:] = [r for r in self.rows[side] if r[-1] > now - self.ttl]
        return self.rows[side]

    @staticmethod
    def _match(left: tuple[Any, ...], right: tuple[Any, ...]) -> bool:
        (lk, _, lv, _), (rk, _, rv, _) = left, right
        return lk is not None and lk == rk and lv is not None and rv is not None and lv > rv

    def _emit(
        self, side: int, mine: tuple[Any, ...] | None, theirs: tuple[Any, ...] | None, sign: int
    ) -> None:
        left, right = (mine, theirs) if side == 0 else (theirs, mine)
        row = (*(left[:3] if left else (None,) * 3), *(right[:3] if right else (None,) * 3))
        self.result[row] += sign

    def apply(self, side: int, kind: str, k: Any, rid: int, v: Any, now: int) -> None:
        row = (k, rid, v, now)
        mine, theirs = self._live(side, now), self._live(1 - side, now)
        pairs = (lambda a, b: self._match(a, b)) if side == 0 else (lambda a, b: self._match(b, a))
        partners = [t for t in theirs if pairs(row, t)]
        adds = kind in ("+I", "+U")
        if not adds:
            equal = next((r for r in mine if r[:3] == row[:3]), None)
            if equal is not None:
                mine.remove(equal)
        for t in partners:
            if self.outer[1 - side]:
                others = sum(1 for m in mine if pairs(m, t))
                if adds and others == 0:
                    self._emit(side, None, t, -1)
                if not adds and others == 0:
                    self._emit(side, None, t, +1)
            self._emit(side, row, t, 1 if adds else -1)
        if not partners and self.outer[side]:
            self._emit(side, row, None, 1 if adds else -1)
        if adds and k is not None:
            mine.append(row)


@pytest.mark.parametrize("join_type", JOINS)
@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_random_changelogs_with_a_ttl_equal_a_row_at_a_time_reference(
    join_type: str, backend: str, tmp_path: Path
) -> None:
    rng = random.Random(7 + JOINS.index(join_type))
    clock = ManualClock(start=100.0)
    ttl = 4_000
    cluster = Cluster(
        backend, tmp_path, spec_of(join_type, condition=LeftAbove(), ttl=ttl), 2, clock
    )
    reference = Reference(join_type, ttl)
    kept: tuple[Counter[tuple[Any, ...]], Counter[tuple[Any, ...]]] = (Counter(), Counter())
    written: dict[tuple[Any, ...], int] = {}
    got: Counter[tuple[Any, ...]] = Counter()
    for step in range(24):
        clock.advance(rng.choice([0, 0.5, 1, 2.5]))
        now = int(clock.wall() * 1000)
        side = rng.randrange(2)
        # Changes retract live rows only (an expired row's retraction: the test below).
        for row in [r for r in kept[side] if written[r] <= now - ttl]:
            del kept[side][row]
        batch = random_changes(rng, kept[side], 1_000 * step + 100 * side, rng.randint(1, 6))
        for change in batch:
            reference.apply(side, *change, now)
            if change[0] in ("+I", "+U"):
                written[change[1:]] = now
        cluster.send(side, changes(batch))
        for r in cluster.rows():
            got[tuple(r[n] for n in OUTPUT.names)] += 1 if r[OP] == RowKind.INSERT else -1
        if step == 12:
            cluster = cluster.rescaled(3 if backend == "heap" else 1, checkpoint_id=1)
    assert {r: n for r, n in got.items() if n} == {r: n for r, n in reference.result.items() if n}
