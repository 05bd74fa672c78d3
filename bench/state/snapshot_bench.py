"""Keyed-state backends measured directly: snapshot pause, asynchronous part, bytes, restore.

No job runs here: each backend is created the way a keyed operator subtask creates
it (``config.create(KeyedBackendContext(...))``, one subtask owning all 128 key
groups) and filled through its value table, the batch path of the built-in
``reduce`` (``table.get(k)`` and ``table[k] = v``, then ``touched(keys)`` once per
1,024-key batch). Values are ``(key, int)`` tuples, as in the keyed running sum
(workload B). Checkpoints go to a local directory under ``--tmp`` (default ``/tmp``),
through the same ``StorageFS`` the runtime uses (local files, fsynced on close).

For each backend (heap and RocksDB, each incremental and full) and each state size:

1. fill ``N`` keys, take a first (full) checkpoint and mark it complete;
2. ``--rounds`` times (default 5): overwrite 1 % of the keys (a fresh random sample
   each round; blind writes ``table[k] = (k, round)``: a read-modify-write would also
   time RocksDB's point reads, which step 4 measures on their own), then time
   ``backend.snapshot(target)`` (the synchronous part: the *pause* of the task thread
   at the barrier) and ``job.run()`` (the asynchronous part, on the snapshot thread in
   a job), record ``job.bytes_written``, and mark it complete. Medians over the rounds
   are reported;
3. for the incremental backends, the same with a fixed 1,000 changed keys, which
   shows whether the pause depends on the state size or only on what changed;
4. time 2,000 point reads (``table.get``) of random keys;
5. restore the latest handle into a fresh backend (``restore([handle], owned=True)``)
   and check 1,000 sampled keys against the original.

A size whose run would take longer than ``--budget-s`` is skipped, and the skip is
recorded with its estimate: the previous size's time scaled linearly, or the time of
the incremental variant of the same backend at this size if that is longer.

Then the cost of snapshots to the task thread (``contention``):

- *snapshot thread only*: the main thread updates a 100k-key state through the value
  table for ``--contention-seconds``, alone and while a second thread snapshots a
  separate 1M-key state of the same backend back to back (never marked complete, so
  every snapshot writes the whole state). The ratio of the two update rates is what
  the snapshot thread takes from the task thread (the GIL);
- *task-thread cycle*: the main thread updates a 1M-key state (workload B's key
  order, so every key changes between checkpoints) and every second takes the
  synchronous part itself and hands the job to a snapshot thread, as a task does;
  completion is noted on the main thread. Compared with the same loop without
  checkpoints.

Results go to ``bench/state/results.json`` (rewritten after every measurement) and
are printed as Markdown tables.

Example::

    .venv/bin/python bench/state/snapshot_bench.py            # full run (about 6 minutes)
    .venv/bin/python bench/state/snapshot_bench.py --quick    # smoke run (under a minute)
    .venv/bin/python bench/state/snapshot_bench.py --backends heap-incremental --sizes 10000,1000000
    .venv/bin/python bench/state/snapshot_bench.py --render bench/state/results.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import queue
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from epochstream.checkpoint.filesystems import storage_fs
from epochstream.runtime.clock import SystemClock
from epochstream.state.backends.base import (
    KeyedBackendContext,
    KeyedStateBackend,
    SnapshotTarget,
    StateBackend,
)
from epochstream.state.backends.heap import HeapStateBackend
from epochstream.state.backends.rocksdb import RocksDBStateBackend
from epochstream.state.descriptors import ValueStateDescriptor

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from machine import int_list, machine_facts, machine_line  # noqa: E402

MAX_P = 128
BATCH = 1024  # the runtime's default batch size
STATE = ValueStateDescriptor("_reduce")  # the value state of the built-in reduce
BACKENDS: dict[str, Callable[[], StateBackend]] = {
    "heap-incremental": lambda: HeapStateBackend(incremental=True),
    "heap-full": lambda: HeapStateBackend(incremental=False),
    "rocksdb-incremental": lambda: RocksDBStateBackend(incremental=True),
    "rocksdb-full": lambda: RocksDBStateBackend(incremental=False),
}
FAMILY = {
    "heap-incremental": "heap",
    "heap-full": "heap",
    "rocksdb-incremental": "rocksdb",
    "rocksdb-full": "rocksdb",
}
SIZES = (10_000, 100_000, 1_000_000, 5_000_000)
QUICK_SIZES = (10_000, 100_000)


class Results:
    """Measurements so far plus machine facts; saved to JSON after every measurement."""

    def __init__(self, path: str, machine: dict[str, Any], settings: dict[str, Any]) -> None:
        self.path = path
        self.doc: dict[str, Any] = {
            "machine": machine,
            "settings": settings,
            "snapshots": [],
            "skipped": [],
            "contention": {"snapshot_thread": [], "task_cycle": []},
        }

    def save(self) -> None:
        tmp = f"{self.path}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(self.doc, f, indent=2, sort_keys=True)
            f.write("\n")
        os.replace(tmp, self.path)


# ------------------------------------------------------------------ backends


class Scratch:
    """A temporary directory holding checkpoint storage and the backends of one kind."""

    def __init__(self, kind: str, parent: str) -> None:
        self.kind = kind
        self.config = BACKENDS[kind]()
        self.root = tempfile.mkdtemp(prefix=f"state-bench-{kind}-", dir=parent)
        self.fs = storage_fs(self.root)
        self._made = 0

    def backend(self) -> KeyedStateBackend:
        self._made += 1
        ctx = KeyedBackendContext(
            operator_uid="reduce",
            subtask=0,
            max_parallelism=MAX_P,
            key_group_range=range(MAX_P),
            clock=SystemClock(),
            local_dir=os.path.join(self.root, "local", str(self._made)),
        )
        return self.config.create(ctx)

    def target(self, checkpoint_id: int, base: int | None, name: str = "reduce-0") -> SnapshotTarget:
        return SnapshotTarget(
            fs=self.fs,
            checkpoint_id=checkpoint_id,
            directory=os.path.join(self.root, "job", f"chk-{checkpoint_id}"),
            shared_dir=os.path.join(self.root, "job", "shared"),
            name=name,
            base_checkpoint_id=base,
        )

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def fill(table: Any, n: int) -> None:
    """Keys ``0..n-1`` with values ``(key, key % 1000)``, in batches like the reduce."""
    touched = table.touched
    for lo in range(0, n, BATCH):
        keys = range(lo, min(lo + BATCH, n))
        for k in keys:
            table[k] = (k, k % 1000)
        touched(keys)


def change(table: Any, keys: Sequence[int], value: int) -> None:
    """Overwrite every key in ``keys`` with ``(key, value)``, then ``touched`` per batch."""
    touched = table.touched
    for lo in range(0, len(keys), BATCH):
        batch = keys[lo : lo + BATCH]
        for k in batch:
            table[k] = (k, value)
        touched(batch)


def read_us(table: Any, keys: Sequence[int]) -> float:
    """Mean microseconds of one ``table.get`` over ``keys``."""
    get = table.get
    t0 = time.perf_counter()
    for k in keys:
        get(k)
    return (time.perf_counter() - t0) / len(keys) * 1e6


def checkpoint(
    scratch: Scratch, backend: KeyedStateBackend, checkpoint_id: int, base: int | None
) -> tuple[dict[str, Any], Any]:
    """One checkpoint: timed synchronous and asynchronous parts, then marked complete."""
    target = scratch.target(checkpoint_id, base)
    t0 = time.perf_counter()
    job = backend.snapshot(target)
    t1 = time.perf_counter()
    handle = job.run()
    t2 = time.perf_counter()
    backend.notify_checkpoint_complete(checkpoint_id)
    stats = {"sync_s": t1 - t0, "async_s": t2 - t1, "bytes_written": job.bytes_written}
    return stats, handle


def _summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"rounds": rounds}
    for field in ("sync_s", "async_s", "bytes_written"):
        values = [r[field] for r in rounds]
        out[f"{field}_median"] = statistics.median(values)
        out[f"{field}_min"] = min(values)
        out[f"{field}_max"] = max(values)
    return out


def measure_size(kind: str, n: int, args: argparse.Namespace) -> dict[str, Any]:
    """Fill, first checkpoint, 1 % rounds, fixed-1k rounds, restores: one result row."""
    scratch = Scratch(kind, args.tmp)
    start = time.perf_counter()
    row: dict[str, Any] = {"backend": kind, "keys": n, "load1_before": os.getloadavg()[0]}
    try:
        backend = scratch.backend()
        table = backend.value_table(STATE)
        t0 = time.perf_counter()
        fill(table, n)
        row["fill_s"] = time.perf_counter() - t0
        first, handle = checkpoint(scratch, backend, 1, None)
        row["first"] = first
        rng = random.Random(n)
        cid = 1
        changed = max(1, n // 100)
        row["changed_keys"] = changed
        rounds = []
        for _ in range(args.rounds):
            keys = rng.sample(range(n), changed)
            change(table, keys, 1000 + cid)
            cid += 1
            stats, handle = checkpoint(scratch, backend, cid, cid - 1)
            rounds.append(stats)
        row["one_percent"] = _summary(rounds)
        if args.fixed_changes and not kind.endswith("-full"):
            fixed = []
            for _ in range(args.rounds):
                keys = rng.sample(range(n), min(args.fixed_changes, n))
                change(table, keys, 1000 + cid)
                cid += 1
                stats, handle = checkpoint(scratch, backend, cid, cid - 1)
                fixed.append(stats)
            row["fixed_changes"] = args.fixed_changes
            row["fixed"] = _summary(fixed)
        row["checkpoints"] = cid
        row["handle_files"] = len(handle.files())
        row["handle_bytes"] = handle.size
        row["get_us"] = read_us(table, rng.sample(range(n), min(2000, n)))
        sample = rng.sample(range(n), min(1000, n))
        expected = {k: table.get(k) for k in sample}
        restores = []
        for _ in range(args.restores if n <= 100_000 else 1):
            gc.collect()
            fresh = scratch.backend()
            t0 = time.perf_counter()
            fresh.restore([handle], checkpoint_id=cid, owned=True)
            restores.append(time.perf_counter() - t0)
            got = fresh.value_table(STATE)
            bad = [k for k in sample if got.get(k) != expected[k]]
            if bad:
                raise RuntimeError(
                    f"{kind} restore of {n} keys: {len(bad)} of {len(sample)} sampled keys "
                    f"differ, e.g. key {bad[0]}: {got.get(bad[0])!r} != {expected[bad[0]]!r}"
                )
            fresh.dispose()
            del fresh, got
        row["restore_s"] = restores
        row["restore_s_median"] = statistics.median(restores)
        backend.dispose()
        del backend, table
    finally:
        scratch.close()
        gc.collect()
    row["elapsed_s"] = time.perf_counter() - start
    return row


def run_snapshots(results: Results, args: argparse.Namespace) -> None:
    elapsed: dict[tuple[str, int], float] = {}
    for kind in args.backends:
        previous: tuple[int, float] | None = None
        for n in args.sizes:
            if previous is not None:
                estimate = previous[1] * n / previous[0]
                basis = f"{previous[1]:.1f} s at {previous[0]:,} keys, scaled linearly"
                sibling = elapsed.get((FAMILY[kind] + "-incremental", n))
                if sibling is not None and sibling > estimate:
                    estimate = sibling
                    basis = f"{FAMILY[kind]}-incremental took {sibling:.0f} s at this size"
                if estimate > args.budget_s:
                    reason = f"estimated {estimate:.0f} s ({basis}) > budget {args.budget_s:.0f} s"
                    results.doc["skipped"].append({"backend": kind, "keys": n, "reason": reason})
                    results.save()
                    print(f"skip {kind} {n:,} keys: {reason}", flush=True)
                    continue
            print(f"{kind} {n:,} keys ...", flush=True)
            try:
                row = measure_size(kind, n, args)
            except Exception as exc:  # recorded, never dropped
                row = {"backend": kind, "keys": n, "error": f"{type(exc).__name__}: {exc}"}
            results.doc["snapshots"].append(row)
            results.save()
            print("  " + _one_line(row), flush=True)
            if "elapsed_s" in row:
                previous = (n, row["elapsed_s"])
                elapsed[(kind, n)] = row["elapsed_s"]


def _one_line(r: dict[str, Any]) -> str:
    if "error" in r:
        return f"ERROR {r['error']}"
    one = r["one_percent"]
    return (
        f"fill {r['fill_s']:.1f} s; first sync {r['first']['sync_s'] * 1e3:.0f} ms async "
        f"{r['first']['async_s'] * 1e3:.0f} ms; 1% pause {one['sync_s_median'] * 1e3:.1f} ms "
        f"async {one['async_s_median'] * 1e3:.0f} ms {one['bytes_written_median']:,} B; "
        f"get {r['get_us']:.1f} us; restore {r['restore_s_median']:.2f} s; "
        f"total {r['elapsed_s']:.0f} s"
    )


# ------------------------------------------------------------------ contention


def key_batches(keys: int) -> list[list[int]]:
    """Workload B's key order (``i * 7919 % keys``) in 1,024-key batches: one pass = all keys."""
    order = [(i * 7919) % keys for i in range(keys)]
    return [order[lo : lo + BATCH] for lo in range(0, keys, BATCH)]


def update_loop(
    table: Any,
    batches: list[list[int]],
    seconds: float,
    between: Callable[[float], None] | None = None,
) -> tuple[int, float]:
    """The reduce's per-batch work for ``seconds``: ``(updates, elapsed seconds)``.

    ``between(now)`` runs after every batch (the task's mailbox: barriers, notices).
    """
    get, touched = table.get, table.touched
    updates = 0
    i = 0
    start = time.perf_counter()
    deadline = start + seconds
    while True:
        batch = batches[i]
        i = (i + 1) % len(batches)
        for k in batch:
            cur = get(k)
            table[k] = (k, 1) if cur is None else (k, cur[1] + 1)
        touched(batch)
        updates += len(batch)
        now = time.perf_counter()
        if between is not None:
            between(now)
        if now >= deadline:
            return updates, time.perf_counter() - start


class BackgroundSnapshots(threading.Thread):
    """Snapshots ``backend`` back to back (sync and async part) until stopped.

    Checkpoints are never marked complete, so each one holds the whole state (heap:
    every key is still unconfirmed; RocksDB: no base files to reuse). The previous
    snapshot's files are deleted after each one.
    """

    def __init__(self, scratch: Scratch, backend: KeyedStateBackend) -> None:
        super().__init__(name="snapshot-thread", daemon=True)
        self.scratch = scratch
        self.backend = backend
        self.stop = threading.Event()
        self.snapshots: list[dict[str, Any]] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        cid = 1000
        previous: list[str] = []
        try:
            while not self.stop.is_set():
                cid += 1
                target = self.scratch.target(cid, None, name="background")
                t0 = time.perf_counter()
                job = self.backend.snapshot(target)
                t1 = time.perf_counter()
                handle = job.run()
                t2 = time.perf_counter()
                self.snapshots.append(
                    {"sync_s": t1 - t0, "async_s": t2 - t1, "bytes_written": job.bytes_written}
                )
                for path in previous:
                    os.unlink(path)
                previous = handle.files() if handle is not None else []
        except BaseException as exc:  # reported by the caller
            self.error = exc


def measure_snapshot_thread(family: str, args: argparse.Namespace) -> dict[str, Any]:
    """Main-thread update rate alone and next to a thread snapshotting a large state."""
    kind = f"{family}-incremental"
    load1 = os.getloadavg()[0]
    scratch = Scratch(kind, args.tmp)
    try:
        main = scratch.backend()
        table = main.value_table(STATE)
        fill(table, args.contention_small)
        big = scratch.backend()
        fill(big.value_table(STATE), args.contention_keys)
        batches = key_batches(args.contention_small)
        gc.collect()
        alone, alone_s = update_loop(table, batches, args.contention_seconds)
        thread = BackgroundSnapshots(scratch, big)
        thread.start()
        time.sleep(0.2)  # let the first snapshot start
        busy, busy_s = update_loop(table, batches, args.contention_seconds)
        thread.stop.set()
        thread.join()
        if thread.error is not None:
            raise thread.error
        snaps = thread.snapshots
        rate_alone, rate_busy = alone / alone_s, busy / busy_s
        row = {
            "load1_before": load1,
            "family": family,
            "main_keys": args.contention_small,
            "snapshot_keys": args.contention_keys,
            "seconds": args.contention_seconds,
            "rate_alone": rate_alone,
            "rate_with_snapshots": rate_busy,
            "ratio": rate_busy / rate_alone,
            "snapshots": len(snaps),
            "snapshot_sync_s_mean": statistics.fmean(s["sync_s"] for s in snaps),
            "snapshot_async_s_mean": statistics.fmean(s["async_s"] for s in snaps),
            "snapshot_bytes_mean": statistics.fmean(s["bytes_written"] for s in snaps),
        }
        main.dispose()
        big.dispose()
        return row
    finally:
        scratch.close()
        gc.collect()


class SnapshotWorker(threading.Thread):
    """The snapshot thread of a task: runs jobs, reports each completed checkpoint."""

    def __init__(self) -> None:
        super().__init__(name="snapshot-thread", daemon=True)
        self.jobs: queue.Queue[tuple[int, Any] | None] = queue.Queue()
        self.done: queue.Queue[tuple[int, dict[str, Any]]] = queue.Queue()
        self.error: BaseException | None = None

    def run(self) -> None:
        while (item := self.jobs.get()) is not None:
            cid, job = item
            try:
                t0 = time.perf_counter()
                job.run()
                elapsed = time.perf_counter() - t0
            except BaseException as exc:  # reported by the caller
                self.error = exc
                elapsed = float("nan")
            self.done.put((cid, {"async_s": elapsed, "bytes_written": job.bytes_written}))


def measure_task_cycle(kind: str, args: argparse.Namespace) -> dict[str, Any]:
    """A task's cycle: updates, a sync snapshot every interval, async part on a thread."""
    load1 = os.getloadavg()[0]
    scratch = Scratch(kind, args.tmp)
    try:
        backend = scratch.backend()
        table = backend.value_table(STATE)
        keys = args.contention_keys
        fill(table, keys)
        checkpoint(scratch, backend, 1, None)
        batches = key_batches(keys)
        gc.collect()
        alone, alone_s = update_loop(table, batches, args.contention_seconds)

        worker = SnapshotWorker()
        worker.start()
        state: dict[str, Any] = {"next": 1, "completed": 1, "in_flight": None, "due": 0.0}
        records: dict[int, dict[str, Any]] = {}

        def between(now: float) -> None:
            while not worker.done.empty():
                cid, stats = worker.done.get()
                records[cid].update(stats)
                backend.notify_checkpoint_complete(cid)
                state["completed"] = cid
                state["in_flight"] = None
            if state["in_flight"] is None and now >= state["due"]:
                state["next"] += 1
                cid = state["next"]
                t0 = time.perf_counter()
                job = backend.snapshot(scratch.target(cid, state["completed"]))
                sync_s = time.perf_counter() - t0
                records[cid] = {"sync_s": sync_s}
                state["in_flight"] = cid
                state["due"] = now + args.interval
                worker.jobs.put((cid, job))

        state["due"] = time.perf_counter() + args.interval
        busy, busy_s = update_loop(table, batches, args.contention_seconds, between)
        worker.jobs.put(None)
        worker.join()
        if worker.error is not None:
            raise worker.error
        done = [r for r in records.values() if "async_s" in r]
        sync_total = sum(r["sync_s"] for r in records.values())
        rate_alone, rate_busy = alone / alone_s, busy / busy_s
        row = {
            "load1_before": load1,
            "backend": kind,
            "keys": keys,
            "seconds": args.contention_seconds,
            "interval_s": args.interval,
            "rate_alone": rate_alone,
            "rate_with_checkpoints": rate_busy,
            "ratio": rate_busy / rate_alone,
            "checkpoints": len(records),
            "sync_s_mean": statistics.fmean(r["sync_s"] for r in records.values()),
            "sync_s_max": max(r["sync_s"] for r in records.values()),
            "sync_share": sync_total / busy_s,
            "async_s_mean": statistics.fmean(r["async_s"] for r in done) if done else None,
            "bytes_written_mean": (
                statistics.fmean(r["bytes_written"] for r in done) if done else None
            ),
            # The rate while not paused at a barrier: what the snapshot thread leaves.
            "ratio_outside_pauses": busy / (busy_s - sync_total) / rate_alone,
        }
        backend.dispose()
        return row
    finally:
        scratch.close()
        gc.collect()


def run_contention(results: Results, args: argparse.Namespace) -> None:
    families = sorted({FAMILY[k] for k in args.backends})
    for family in families:
        print(f"contention: snapshot thread, {family} ...", flush=True)
        try:
            row = measure_snapshot_thread(family, args)
        except Exception as exc:
            row = {"family": family, "error": f"{type(exc).__name__}: {exc}"}
        results.doc["contention"]["snapshot_thread"].append(row)
        results.save()
        print(f"  {row}", flush=True)
    for kind in args.backends:
        print(f"contention: task cycle, {kind} ...", flush=True)
        try:
            row = measure_task_cycle(kind, args)
        except Exception as exc:
            row = {"backend": kind, "error": f"{type(exc).__name__}: {exc}"}
        results.doc["contention"]["task_cycle"].append(row)
        results.save()
        print(f"  {row}", flush=True)


# ------------------------------------------------------------------ report


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f}"


def markdown(doc: dict[str, Any]) -> str:
    """The Markdown tables of a results document."""
    rows = doc["snapshots"]
    out = [
        "Checkpoints with 1 % of the keys changed since the previous completed one "
        f"(median of {doc['settings']['rounds']} rounds, [min-max]):",
        "",
        "| backend | keys | changed keys | pause (sync) ms | async ms | bytes written "
        "| fixed-1k pause ms | fixed-1k async ms | fixed-1k bytes |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if "error" in r:
            out.append(f"| {r['backend']} | {r['keys']:,} | failed: {r['error']} | | | | | | |")
            continue
        one = r["one_percent"]
        fixed = r.get("fixed")
        fixed_cells = (
            f"{_ms(fixed['sync_s_median'])} | {_ms(fixed['async_s_median'])} "
            f"| {fixed['bytes_written_median']:,}"
            if fixed
            else "- | - | -"
        )
        out.append(
            f"| {r['backend']} | {r['keys']:,} | {r['changed_keys']:,} "
            f"| {_ms(one['sync_s_median'])} [{_ms(one['sync_s_min'])}-{_ms(one['sync_s_max'])}] "
            f"| {_ms(one['async_s_median'])} [{_ms(one['async_s_min'])}-{_ms(one['async_s_max'])}] "
            f"| {one['bytes_written_median']:,} | {fixed_cells} |"
        )
    for s in doc["skipped"]:
        out.append(f"| {s['backend']} | {s['keys']:,} | skipped: {s['reason']} | | | | | | |")
    out += [
        "",
        "Fill, first (full) checkpoint, latest checkpoint, random point reads, and the "
        "latest checkpoint's restore into a fresh backend:",
        "",
        "| backend | keys | fill s | first sync ms | first async ms | first bytes "
        "| latest: files | latest: bytes referenced | get µs | restore s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if "error" in r:
            continue
        first = r["first"]
        restores = ", ".join(f"{x:.3f}" for x in r["restore_s"])
        out.append(
            f"| {r['backend']} | {r['keys']:,} | {r['fill_s']:.2f} | {_ms(first['sync_s'])} "
            f"| {_ms(first['async_s'])} | {first['bytes_written']:,} | {r['handle_files']} "
            f"| {r['handle_bytes']:,} | {r['get_us']:.1f} | {restores} |"
        )
    by_key = {(r["backend"], r["keys"]): r for r in rows if "error" not in r}
    out += [
        "",
        "Bytes written per checkpoint with 1 % changed, full vs incremental (medians):",
        "",
        "| backend | keys | full | incremental | incremental / full |",
        "|---|---:|---:|---:|---:|",
    ]
    for family in ("heap", "rocksdb"):
        for n in sorted({k for _, k in by_key}):
            full = by_key.get((f"{family}-full", n))
            inc = by_key.get((f"{family}-incremental", n))
            if full is None and inc is None:
                continue
            fb = full["one_percent"]["bytes_written_median"] if full else None
            ib = inc["one_percent"]["bytes_written_median"] if inc else None
            ratio = f"{ib / fb:.3f}" if fb and ib is not None else "-"
            out.append(
                f"| {family} | {n:,} | {'-' if fb is None else f'{fb:,}'} "
                f"| {'-' if ib is None else f'{ib:,}'} | {ratio} |"
            )
    contention = doc["contention"]
    if contention["snapshot_thread"]:
        out += [
            "",
            "Main-thread value-table updates alone and while another thread snapshots a "
            "separate large state back to back (each snapshot the whole state):",
            "",
            "| backend | main-thread keys | snapshotted keys | updates/s alone "
            "| updates/s with snapshots | ratio | snapshots | mean sync ms | mean async ms "
            "| mean bytes |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in contention["snapshot_thread"]:
            if "error" in r:
                out.append(f"| {r['family']} | failed: {r['error']} | | | | | | | | |")
                continue
            out.append(
                f"| {r['family']} | {r['main_keys']:,} | {r['snapshot_keys']:,} "
                f"| {r['rate_alone']:,.0f} | {r['rate_with_snapshots']:,.0f} | {r['ratio']:.2f} "
                f"| {r['snapshots']} | {_ms(r['snapshot_sync_s_mean'])} "
                f"| {_ms(r['snapshot_async_s_mean'])} | {r['snapshot_bytes_mean']:,.0f} |"
            )
    if contention["task_cycle"]:
        out += [
            "",
            "A task's cycle: updates on the main thread (workload B's key order, every key "
            "changes between checkpoints), the synchronous part there every "
            f"{doc['settings']['interval']:g} s, the asynchronous part on a snapshot thread:",
            "",
            "| backend | keys | updates/s no checkpoints | updates/s checkpoints | ratio "
            "| checkpoints | mean pause ms | max pause ms | pause share | mean async ms "
            "| mean bytes | ratio outside pauses |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in contention["task_cycle"]:
            if "error" in r:
                out.append(f"| {r['backend']} | failed: {r['error']} | | | | | | | | | | |")
                continue
            async_ms = "-" if r["async_s_mean"] is None else _ms(r["async_s_mean"])
            mean_bytes = "-" if r["bytes_written_mean"] is None else f"{r['bytes_written_mean']:,.0f}"
            out.append(
                f"| {r['backend']} | {r['keys']:,} | {r['rate_alone']:,.0f} "
                f"| {r['rate_with_checkpoints']:,.0f} | {r['ratio']:.2f} | {r['checkpoints']} "
                f"| {_ms(r['sync_s_mean'])} | {_ms(r['sync_s_max'])} | {r['sync_share']:.1%} "
                f"| {async_ms} | {mean_bytes} | {r['ratio_outside_pauses']:.2f} |"
            )
    out += ["", machine_line(doc["machine"])]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small sizes and short loops")
    parser.add_argument(
        "--backends", default=",".join(BACKENDS), help=f"comma-separated among {','.join(BACKENDS)}"
    )
    parser.add_argument("--sizes", default=None, help="comma-separated key counts")
    parser.add_argument("--rounds", type=int, default=5, help="measured checkpoints per size")
    parser.add_argument(
        "--fixed-changes", type=int, default=1000, help="keys changed in the fixed rounds (0: off)"
    )
    parser.add_argument("--restores", type=int, default=3, help="restores up to 100k keys")
    parser.add_argument(
        "--budget-s", type=float, default=120.0, help="skip a size estimated to take longer"
    )
    parser.add_argument("--contention-seconds", type=float, default=10.0)
    parser.add_argument("--contention-keys", type=int, default=1_000_000)
    parser.add_argument("--contention-small", type=int, default=100_000)
    parser.add_argument("--interval", type=float, default=1.0, help="checkpoint interval (s)")
    parser.add_argument("--no-contention", action="store_true")
    parser.add_argument("--tmp", default=tempfile.gettempdir(), help="where scratch dirs go")
    parser.add_argument("--out", default=os.path.join(HERE, "results.json"))
    parser.add_argument("--render", metavar="RESULTS_JSON", help="print a results file and exit")
    args = parser.parse_args(argv)
    if args.render:
        with open(args.render, encoding="utf-8") as f:
            print(markdown(json.load(f)))
        return 0
    args.backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = sorted(set(args.backends) - set(BACKENDS))
    if unknown:
        parser.error(f"unknown backends {unknown}; choose among {list(BACKENDS)}")
    if args.sizes:
        args.sizes = int_list(args.sizes)
    elif args.quick:
        args.sizes = list(QUICK_SIZES)
    else:
        args.sizes = list(SIZES)
    if args.quick:
        args.rounds = min(args.rounds, 3)
        args.contention_seconds = min(args.contention_seconds, 2.0)
        args.contention_keys = min(args.contention_keys, 100_000)
        args.contention_small = min(args.contention_small, 10_000)
    settings = {k: v for k, v in vars(args).items() if k not in ("out", "render")}
    settings["batch"] = BATCH
    settings["max_parallelism"] = MAX_P
    settings["backend_configs"] = {k: repr(BACKENDS[k]()) for k in args.backends}
    results = Results(args.out, machine_facts(), settings)
    started = time.perf_counter()
    run_snapshots(results, args)
    if not args.no_contention:
        run_contention(results, args)
    results.doc["machine"]["loadavg_end"] = os.getloadavg()
    results.doc["total_s"] = time.perf_counter() - started
    results.save()
    print()
    print(markdown(results.doc))
    print(f"\nwrote {args.out} ({results.doc['total_s']:.0f} s)")
    failed = [r for r in results.doc["snapshots"] if "error" in r] + [
        r for rs in results.doc["contention"].values() for r in rs if "error" in r
    ]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
