"""The measurements of ``snapshot_bench.py``: keyed-state backends driven directly.

``measure_size`` fills one backend and times its checkpoints (synchronous and
asynchronous part, bytes written), point reads and restores; ``measure_snapshot_thread``
and ``measure_task_cycle`` time value-table updates on the main thread while snapshots
run beside them. Each backend is created as a keyed operator subtask creates it, in a
``Scratch`` directory that is removed afterwards. ``args`` are ``snapshot_bench.py``'s.

Example::

    row = measure_size("heap-incremental", 100_000, args)
    print(row["one_percent"]["sync_s_median"], row["restore_s_median"])
"""

from __future__ import annotations

import argparse
import gc
import os
import queue
import random
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from epochstream.core.clock import SystemClock
from epochstream.core.filesystems import storage_fs
from epochstream.core.state_descriptors import ValueStateDescriptor
from epochstream.state.backends.base import (
    KeyedBackendContext,
    KeyedStateBackend,
    SnapshotTarget,
    StateBackend,
)
from epochstream.state.backends.heap.backend import HeapStateBackend
from epochstream.state.backends.rocksdb.backend import RocksDBStateBackend

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

    def target(
        self, checkpoint_id: int, base: int | None, name: str = "reduce-0"
    ) -> SnapshotTarget:
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
