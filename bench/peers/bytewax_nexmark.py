"""Bytewax peer: the Nexmark queries that Bytewax's operators express, over the files.

Runs inside the Bytewax virtualenv (``/tmp/bench-venvs/bytewax``, which gets pyarrow
too), started by ``bench/all.py``, one worker (``run_main``) like the W1 peer. Each
table is read from its Parquet file inside the timed run (record batches ->
Python dicts, ``--batch-size`` items per Bytewax batch). With ``--checkpoint S``:
a SQLite recovery directory and ``S``-second epochs (snapshots); 0: no recovery.
Event time: ``EventClock`` on ``date_time`` with 4 s of lateness (the Nexmark
watermark). Output is counted, then dropped. Prints one JSON line (``events``: every
event of the files, as the other systems count them).

- q0, q1, q2: ``map`` / ``filter``.
- q3: persons (OR, ID, CA) and auctions (category 10) keyed by person id / seller
  into one ``stateful_flat_map`` holding the person and the auctions that came before
  it: an incremental inner join. Bytewax's ``join`` keeps one value per side and key
  (``insert_mode``), so a seller's many auctions do not fit it.
- q7: ``max_window`` by price over 10 s tumbling event-time windows, one key for all
  bids (a global window aggregation, as in Flink's plan); one bid per window on ties.
- q11: ``count_window`` per bidder over ``SessionWindower(gap=10 s)``.
- q12: ``count_window`` per bidder over 10 s tumbling windows of ``SystemClock``.

Not written: q4 (a windowless interval join, then two chained aggregations with
retractions: Bytewax has neither retractions nor interval joins, so it is a
hand-written state machine, not a use of its operators), q5 (the maximum per sliding
window of counts per auction: the window operators' output carries no event time to
window again on, so the second stage is hand-written state with its own close
signal), q8 (a join of two windowed streams: ``join_window`` needs both sides keyed
the same and windowed by one clock; the person and auction streams are two sources
with their own event-time watermarks).

Each table is one partition of a resumable Parquet source (:func:`parquet_source`:
its snapshot is the rows emitted; a resumed run seeks there through the row groups).
Recovery (``--probe DIR --recovery-dir DB``, driven by ``bench/peer_recovery.py``'s
``kill_and_restart``): the recovery partition is kept in ``DB``, every batch the
sources emit is written to the probe (one worker: a batch is processed before the
next is read), and a restarted process (``--attempt 1``) records each table's resume
position (``restore-1.json``).

Example::

    /tmp/bench-venvs/bytewax/bin/python bench/peers/bytewax_nexmark.py \\
        --path /tmp/nexmark --query q3 --checkpoint 1
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from nexmark_files import event_count
from rate_probe import RateProbe, write_restore

LATENESS = timedelta(seconds=4)
ALIGN = datetime(1970, 1, 1, tzinfo=UTC)


class _ParquetPartition:
    """One table's rows as dicts, ``batch_size`` a batch; its snapshot is the number of
    rows emitted, and a resumed partition seeks there through the row groups."""

    def __init__(self, path: str, batch_size: int, position: int, probe: RateProbe | None) -> None:
        import pyarrow.parquet as pq

        self.position = position
        self.probe = probe
        source = pq.ParquetFile(path)
        first, skip = 0, position
        while first < source.num_row_groups and skip >= source.metadata.row_group(first).num_rows:
            skip -= source.metadata.row_group(first).num_rows
            first += 1
        self._skip = skip
        self._batches = source.iter_batches(
            batch_size=batch_size, row_groups=range(first, source.num_row_groups)
        )

    def next_batch(self) -> list[dict[str, Any]]:
        batch = next(self._batches)  # StopIteration ends the partition
        if self._skip:
            cut = min(self._skip, batch.num_rows)
            batch, self._skip = batch.slice(cut), self._skip - cut
        rows: list[dict[str, Any]] = batch.to_pylist()
        self.position += len(rows)
        if self.probe is not None:
            self.probe.add(time.time(), len(rows))
        return rows

    def snapshot(self) -> int:
        return self.position


def parquet_source(
    path: str,
    batch_size: int,
    probe: RateProbe | None,
    on_resume: Callable[[str, int | None], None] | None,
) -> Any:
    """A Bytewax source over the Parquet file ``path``, resumable at a row: what a
    Bytewax user writes for a file (``TestingSource`` resumes by iterating again over
    everything it emitted). ``probe`` gets every batch's rows; ``on_resume(part,
    position)`` hears where each partition was built to start."""
    from bytewax.inputs import FixedPartitionedSource, StatefulSourcePartition

    class _Partition(_ParquetPartition, StatefulSourcePartition[dict[str, Any], int]):
        pass

    class _Source(FixedPartitionedSource[dict[str, Any], int]):
        def list_parts(self) -> list[str]:
            return [os.path.basename(path)]

        def build_part(self, step_id: str, for_part: str, resume_state: int | None) -> _Partition:
            if on_resume is not None:
                on_resume(for_part, resume_state)
            return _Partition(path, batch_size, resume_state or 0, probe)

    return _Source()


def _ts(e: dict[str, Any]) -> datetime:
    return datetime.fromtimestamp(e["date_time"] / 1000.0, tz=UTC)


def _q3_join(
    state: tuple[Any, list[Any]] | None, value: tuple[str, dict[str, Any]]
) -> tuple[tuple[Any, list[Any]], list[tuple[Any, ...]]]:
    person, waiting = state if state is not None else (None, [])
    side, e = value
    if side == "p":
        out = [(e["name"], e["city"], e["state"], a["id"]) for a in waiting]
        return (e, []), out
    if person is None:
        return (None, [*waiting, e]), []
    return (person, waiting), [(person["name"], person["city"], person["state"], e["id"])]


def build(
    query: str,
    path: str,
    batch_size: int,
    counts: list[int],
    *,
    probe: RateProbe | None = None,
    on_resume: Callable[[str, int | None], None] | None = None,
) -> Any:
    """The dataflow of ``query`` reading the files under ``path`` (``parquet_source``)."""
    import bytewax.operators as op
    import bytewax.operators.windowing as win
    from bytewax.dataflow import Dataflow
    from bytewax.outputs import DynamicSink, StatelessSinkPartition

    class _Counter(StatelessSinkPartition[Any]):
        def write_batch(self, items: list[Any]) -> None:
            counts[0] += len(items)

    class _CountSink(DynamicSink[Any]):
        def build(self, step_id: str, worker_index: int, worker_count: int) -> _Counter:
            return _Counter()

    flow = Dataflow(f"nexmark-{query}")

    def table(name: str) -> Any:
        source = parquet_source(os.path.join(path, f"{name}.parquet"), batch_size, probe, on_resume)
        return op.input(name, flow, source)

    event_clock = win.EventClock(_ts, wait_for_system_duration=LATENESS)
    if query == "q0":
        out = op.map(
            "q0", table("bid"), lambda b: (b["auction"], b["bidder"], b["price"], b["date_time"])
        )
    elif query == "q1":
        out = op.map(
            "q1",
            table("bid"),
            lambda b: (b["auction"], b["bidder"], int(0.908 * b["price"]), b["date_time"]),
        )
    elif query == "q2":
        kept = op.filter("q2-filter", table("bid"), lambda b: b["auction"] % 123 == 0)
        out = op.map("q2", kept, lambda b: (b["auction"], b["price"]))
    elif query == "q3":
        persons = op.filter("q3-state", table("person"), lambda p: p["state"] in ("OR", "ID", "CA"))
        auctions = op.filter("q3-category", table("auction"), lambda a: a["category"] == 10)
        p_keyed = op.key_on("q3-pkey", persons, lambda p: str(p["id"]))
        a_keyed = op.key_on("q3-akey", auctions, lambda a: str(a["seller"]))
        both = op.merge(
            "q3-merge",
            op.map_value("q3-ptag", p_keyed, lambda p: ("p", p)),
            op.map_value("q3-atag", a_keyed, lambda a: ("a", a)),
        )
        out = op.stateful_flat_map("q3-join", both, _q3_join)
    elif query == "q7":
        keyed = op.key_on("q7-all", table("bid"), lambda _b: "all")
        windower = win.TumblingWindower(length=timedelta(seconds=10), align_to=ALIGN)
        out = win.max_window("q7", keyed, event_clock, windower, by=lambda b: b["price"]).down
    elif query == "q11":
        windower = win.SessionWindower(gap=timedelta(seconds=10))
        out = win.count_window(
            "q11", table("bid"), event_clock, windower, lambda b: str(b["bidder"])
        ).down
    elif query == "q12":
        windower = win.TumblingWindower(length=timedelta(seconds=10), align_to=ALIGN)
        out = win.count_window(
            "q12", table("bid"), win.SystemClock(), windower, lambda b: str(b["bidder"])
        ).down
    else:
        raise SystemExit(f"query {query!r} is not written for Bytewax; see this module")
    op.output("out", out, _CountSink())
    return flow


QUERIES: tuple[str, ...] = ("q0", "q1", "q2", "q3", "q7", "q11", "q12")


def main() -> None:
    parser = argparse.ArgumentParser(description="Bytewax Nexmark peer")
    parser.add_argument("--path", required=True, help="write_nexmark_files' directory")
    parser.add_argument("--query", required=True)
    parser.add_argument("--checkpoint", type=float, default=1.0)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--probe", default="", help="recovery run's probe directory")
    parser.add_argument("--attempt", type=int, default=0, help="recovery: 0, then 1 restarted")
    parser.add_argument("--recovery-dir", default="", help="recovery: kept recovery partition")
    args = parser.parse_args()
    if args.query not in QUERIES:
        raise SystemExit(f"{args.query}: not written for Bytewax (see the module docstring)")
    if args.probe and (args.checkpoint <= 0 or not args.recovery_dir):
        raise SystemExit("--probe needs --checkpoint above 0 and --recovery-dir")
    from bytewax.recovery import RecoveryConfig, init_db_dir
    from bytewax.testing import run_main

    counts = [0]
    probe = RateProbe(args.probe, attempt=args.attempt) if args.probe else None
    resumed: dict[str, int | None] = {}

    def record_restore(part: str, position: int | None) -> None:
        resumed[part] = position
        write_restore(args.probe, args.attempt, {"source_positions": dict(resumed)})

    on_resume = record_restore if probe is not None and args.attempt else None
    flow = build(args.query, args.path, args.batch_size, counts, probe=probe, on_resume=on_resume)
    kwargs: dict[str, Any] = {}
    if args.checkpoint > 0:
        db_dir = args.recovery_dir or tempfile.mkdtemp(prefix="bytewax-recovery-")
        if not args.attempt:
            os.makedirs(db_dir, exist_ok=True)
            init_db_dir(Path(db_dir), 1)
        kwargs["epoch_interval"] = timedelta(seconds=args.checkpoint)
        kwargs["recovery_config"] = RecoveryConfig(Path(db_dir))
    start = time.perf_counter()
    run_main(flow, **kwargs)
    wall = time.perf_counter() - start
    if probe is not None:
        probe.close()
    total = event_count(args.path)["total"]
    print(json.dumps({"events": total, "seconds": wall, "query": args.query, "output": counts[0]}))


if __name__ == "__main__":
    main()
