"""The jobs of ``throughput_bench.py`` and the measurement of one recovery.

Workload B as that script times it (``run_keyed_sum``: one run, its checkpoints listed by
``checkpoint_rows``), and the recovery run (``run_recovery_once``): the same job with a
map and a reduce that log their progress to files (``ProgressMap``, ``LoggingSum``),
slot 0 killed once the state holds every key, the way back timed from those logs.

``throughput_bench.py`` imports this module after putting ``bench/`` on ``sys.path``
(for ``epochstream_jobs``). The module is pickled by value (see the bottom of the file):
its functions go to Spark's Python workers, which cannot import ``bench/``.

Example::

    row = run_keyed_sum(args, spark, "heap", 1.0, 1_000_000)   # args of throughput_bench
    print(row["rate"], len(row["checkpoints"]))
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import cloudpickle
from epochstream_jobs import B_KEYS, checkpoint_summary

import epochstream as es

BACKENDS: dict[str, Callable[[], es.state.backends.base.StateBackend]] = {
    "heap": lambda: es.state.HeapStateBackend(),
    "rocksdb": lambda: es.state.RocksDBStateBackend(),
}
LOG_EVERY = 1 << 16


def environment(args: argparse.Namespace, spark: Any, backend: str) -> es.Environment:
    """A Spark environment at ``--parallelism`` with ``backend``'s state backend."""
    env = es.Environment(parallelism=args.parallelism, runner="spark", spark=spark)
    env.set_state_backend(BACKENDS[backend]())
    return env


def fresh_storage(args: argparse.Namespace, name: str) -> str:
    """An empty checkpoint directory ``name`` under ``--tmp``."""
    path = os.path.join(args.tmp, name)
    shutil.rmtree(path, ignore_errors=True)  # a leftover checkpoint would be restored
    return path


def checkpoint_rows(result: es.JobResult) -> list[dict[str, Any]]:
    """Every checkpoint of a run: duration, state size, slowest sync/async, bytes written."""
    return [
        {
            "id": c.checkpoint_id,
            "duration_s": c.duration,
            "state_size": c.state_size,
            "max_sync_s": c.max_sync_s,
            "max_async_s": c.max_async_s,
            "max_alignment_s": c.max_alignment_s,
            "bytes_written": sum(t.bytes_written for t in c.tasks.values()),
        }
        for c in result.checkpoints
        if c.kind == "checkpoint"
    ]


def build_keyed_sum(env: es.Environment, n: int) -> None:
    """Workload B exactly as ``bench/epochstream_jobs.run_keyed_sum`` builds it."""
    keys = B_KEYS
    (
        env.from_sequence(0, n)
        .uid("numbers")
        .map(lambda i: (i * 7919 % keys, i % 1000))
        .key_by(lambda t: t[0])
        .reduce(lambda a, b: (a[0], a[1] + b[1]))
        .uid("sums")
        .sink_to(es.sinks.DiscardSink())
    )


def run_keyed_sum(
    args: argparse.Namespace, spark: Any, backend: str, checkpoint: float | None, n: int
) -> dict[str, Any]:
    """Workload B on ``backend``; checkpoints every ``checkpoint`` s (``None``: off)."""
    load1 = os.getloadavg()[0]
    env = environment(args, spark, backend)
    if checkpoint is not None:
        env.enable_checkpointing(checkpoint, storage=fresh_storage(args, f"ck-{backend}"))
    build_keyed_sum(env, n)
    start = time.perf_counter()
    result = env.execute(f"state-bench-b-{backend}")
    wall = time.perf_counter() - start
    row: dict[str, Any] = {
        "events": n,
        "seconds": wall,
        "rate": n / wall,
        "load1_before": load1,
        "job_duration": result.duration,
        "restarts": result.restarts,
        "checkpoint_stats": checkpoint_summary(result),
        "checkpoints": checkpoint_rows(result),
    }
    if result.restarts:
        row["failures"] = list(result.failures)
    return row


class ProgressMap(es.MapFunction):
    """Workload B's map that logs its attempt, first record and progress to a file."""

    def __init__(self, log_dir: str, keys: int) -> None:
        self.log_dir = log_dir
        self.keys = keys

    def open(self, ctx: Any) -> None:
        self._count = 0
        self._first = True
        path = os.path.join(
            self.log_dir, f"map-{ctx.attempt}-{ctx.subtask_index}-{os.getpid()}.log"
        )
        self._log = open(path, "a", buffering=1, encoding="utf-8")
        self._log.write(f"open {time.time():.6f} {ctx.attempt} {ctx.subtask_index}\n")

    def map(self, i: int) -> tuple[int, int]:
        self._count += 1
        if self._first or self._count % LOG_EVERY == 0:
            kind = "first" if self._first else "progress"
            self._first = False
            self._log.write(f"{kind} {time.time():.6f} {i} {self._count}\n")
        return (i * 7919 % self.keys, i % 1000)

    def close(self) -> None:
        self._log.close()


class LoggingSum(es.ReduceFunction):
    """Workload B's reduce that logs when it opens (state restored) and first reduces."""

    def __init__(self, log_dir: str) -> None:
        self.log_dir = log_dir

    def open(self, ctx: Any) -> None:
        self._first = True
        path = os.path.join(
            self.log_dir, f"reduce-{ctx.attempt}-{ctx.subtask_index}-{os.getpid()}.log"
        )
        self._log = open(path, "a", buffering=1, encoding="utf-8")
        self._log.write(f"open {time.time():.6f} {ctx.attempt} {ctx.subtask_index}\n")

    def reduce(self, a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
        if self._first:
            self._first = False
            self._log.write(f"first {time.time():.6f}\n")
        return (a[0], a[1] + b[1])

    def close(self) -> None:
        self._log.close()


def _read_logs(log_dir: str, op: str) -> dict[tuple[int, int], dict[str, Any]]:
    """``{(attempt, subtask): {"open": t, "first": t, "progress": [(t, i, count)]}}``."""
    out: dict[tuple[int, int], dict[str, Any]] = {}
    for path in glob.glob(os.path.join(log_dir, f"{op}-*.log")):
        _, attempt, subtask, _pid = os.path.basename(path)[: -len(".log")].split("-")
        entry = out.setdefault((int(attempt), int(subtask)), {"progress": []})
        with open(path, encoding="utf-8") as f:
            for line in f:
                parts = line.split()
                if not parts or (parts[0] != "open" and len(parts) < 2):
                    continue
                try:
                    if parts[0] == "open":
                        entry.setdefault("open", float(parts[1]))
                    elif parts[0] == "first":
                        entry.setdefault("first", float(parts[1]))
                        if len(parts) >= 4:
                            entry["progress"].append(
                                (float(parts[1]), int(parts[2]), int(parts[3]))
                            )
                    elif parts[0] == "progress":
                        entry["progress"].append((float(parts[1]), int(parts[2]), int(parts[3])))
                except (ValueError, IndexError):
                    continue  # a line cut by the kill
    return out


def run_recovery_once(
    args: argparse.Namespace, spark: Any, backend: str, keys: int
) -> dict[str, Any]:
    """Kill slot 0 of a running job holding ``keys`` keys; time the way back."""
    log_dir = tempfile.mkdtemp(prefix="recovery-logs-", dir=args.tmp)
    env = environment(args, spark, backend)
    env.enable_checkpointing(1.0, storage=fresh_storage(args, f"ck-recovery-{backend}"))
    env.set_restart_strategy(es.restart.fixed_delay(attempts=3, delay=args.restart_delay))
    n = args.recovery_events
    (
        env.from_sequence(0, n)
        .uid("numbers")
        .map(ProgressMap(log_dir, keys))
        .key_by(lambda t: t[0])
        .reduce(LoggingSum(log_dir))
        .uid("sums")
        .sink_to(es.sinks.DiscardSink())
    )
    client = env.execute_async(f"state-bench-recovery-{backend}-{keys}")
    row: dict[str, Any] = {
        "backend": backend,
        "keys": keys,
        "events": n,
        "load1_before": os.getloadavg()[0],
    }
    try:
        client.wait_for_checkpoint(2, timeout=300)
        # Every source subtask covers all keys in any `keys` consecutive records.
        deadline = time.monotonic() + 300
        full_at = None
        while full_at is None:
            logs = _read_logs(log_dir, "map")
            counts = {
                s: max((c for _, _, c in e["progress"]), default=0)
                for (a, s), e in logs.items()
                if a == 1
            }
            if len(counts) == args.parallelism and min(counts.values()) >= keys:
                full_at = time.time()
                break
            if client.done or time.monotonic() > deadline:
                raise RuntimeError(f"state never reached {keys} keys (progress {counts})")
            time.sleep(0.05)
        while True:
            stats = client.checkpoint_stats()
            after = [c for c in stats if c.trigger_time > full_at]
            if after:
                last = after[-1]
                break
            if client.done or time.monotonic() > deadline:
                raise RuntimeError("no checkpoint after the state was full")
            time.sleep(0.01)
        before_ids = set(client.completed_checkpoints())
        row["checkpoint_before_kill"] = {
            "id": last.checkpoint_id,
            "state_size": last.state_size,
            "duration_s": last.duration,
            "completed_s_before_kill": None,
        }
        attempt0 = client.attempt
        t_kill = time.time()
        row["checkpoint_before_kill"]["completed_s_before_kill"] = t_kill - (
            last.trigger_time + last.duration
        )
        pid = es.testing.kill_slot(client, 0)
        row["killed_pid"] = pid
        t_attempt = t_first_ck = None
        limit = time.monotonic() + args.recovery_timeout
        measured: dict[str, Any] = {}
        while time.monotonic() < limit and not client.done:
            now = time.time()
            if t_attempt is None and client.attempt > attempt0:
                t_attempt = now
            if t_first_ck is None and set(client.completed_checkpoints()) - before_ids:
                t_first_ck = now
            if t_attempt is not None:
                measured = _recovery_times(log_dir, attempt0, client.attempt, args.parallelism)
                if t_first_ck is not None and measured.get("caught_up") is not None:
                    break
            time.sleep(0.005)
        measured = _recovery_times(log_dir, attempt0, client.attempt, args.parallelism)

        def since(t: float | None) -> float | None:
            return None if t is None else t - t_kill

        row.update(
            {
                "new_attempt_s": since(t_attempt),
                "map_open_s": since(measured.get("map_open")),
                "reduce_open_s": since(measured.get("reduce_open")),
                "processing_s": since(measured.get("processing")),
                "processing_first_subtask_s": since(measured.get("processing_first")),
                "caught_up_s": since(measured.get("caught_up")),
                "replayed_records": measured.get("replayed"),
                "first_checkpoint_s": since(t_first_ck),
                "attempts": client.attempt,
                "failures": client.failures,
            }
        )
    finally:
        if not client.done:
            client.cancel()
        try:
            client.result(timeout=120)
        except es.JobCancelled:
            pass
        except Exception as exc:  # the measurement stands; the ending is recorded
            row["end_error"] = f"{type(exc).__name__}: {exc}"
        shutil.rmtree(log_dir, ignore_errors=True)
    return row


def _recovery_times(
    log_dir: str, old_attempt: int, new_attempt: int, parallelism: int
) -> dict[str, Any]:
    """Open, first-record and caught-up times of the attempt after ``old_attempt``."""
    if new_attempt <= old_attempt:
        return {}
    maps = _read_logs(log_dir, "map")
    reduces = _read_logs(log_dir, "reduce")
    out: dict[str, Any] = {}
    new_maps = [maps.get((new_attempt, s)) for s in range(parallelism)]
    new_reduces = [reduces.get((new_attempt, s)) for s in range(parallelism)]
    if all(e is not None and "open" in e for e in new_maps):
        out["map_open"] = max(e["open"] for e in new_maps if e)
    if all(e is not None and "open" in e for e in new_reduces):
        out["reduce_open"] = max(e["open"] for e in new_reduces if e)
    firsts = [e["first"] for e in new_reduces if e is not None and "first" in e]
    if firsts:
        out["processing_first"] = min(firsts)
    if len(firsts) == parallelism:
        out["processing"] = max(firsts)
    caught: list[float] = []
    replayed = 0
    for s in range(parallelism):
        old = maps.get((old_attempt, s))
        new = maps.get((new_attempt, s))
        if old is None or new is None or not old["progress"]:
            continue
        mark = max(i for _, i, _ in old["progress"])
        hit = next(((t, c) for t, i, c in new["progress"] if i >= mark), None)
        if hit is not None:
            caught.append(hit[0])
            replayed += hit[1]
    if len(caught) == parallelism:
        out["caught_up"] = max(caught)
        out["replayed"] = replayed
    return out


# Spark's Python workers cannot import bench/: ship these jobs' functions by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])
