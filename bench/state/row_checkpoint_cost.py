"""CPU of one heap checkpoint of a W1 reduce subtask: this tree against a base commit.

End-to-end checkpoint overhead on the shared 2-core machine moves by more than the
change being measured, so this runs the state side of a W1 checkpoint alone, the way
the reduce subtask 0 of a parallelism-2 job holds it: a heap backend (incremental, the
default) owning key groups 0..63 of 128, its value table filled by the reduce's batch
path (``table[k] = (k, v)``, ``touched`` per 1,024-key batch) with the 50,047 keys of
``i * 7919 % 100_000`` that fall in those key groups. Every round writes every key
(in W1 each key changes about ten times a second), then times, in CPU seconds of the
thread (``time.thread_time``): ``backend.snapshot(target)``, the synchronous part the
task thread runs at the barrier, and ``job.run()``, the asynchronous part on the
snapshot thread (files fsynced under ``--tmp``), then marks the checkpoint complete.
Garbage lists are allocated between writes so that the entries are spread over the
heap as in a slot (which runs with CPython's collector thresholds).

``--workload join`` measures instead the state of a Nexmark-style join subtask: 1,000
keys, each with a list state and a map state of event dicts (six fields), 4,000 events
added to each state between checkpoints (``ListState.add``, ``MapState.put``), so
every checkpoint copies the changed keys' growing lists and maps.

The first checkpoint is reported apart (it pays for hashing the keys into key groups
when no writer of the process did); the figure is the median of the others.
``--base COMMIT[,COMMIT...]`` exports each commit's ``src`` (``git archive``) and
measures them and this tree in turn (the order alternating by round), each in a fresh
process; the medians over rounds are printed.

Example::

    .venv/bin/python bench/state/row_checkpoint_cost.py --base c153040 --rounds 5
    .venv/bin/python bench/state/row_checkpoint_cost.py --base c153040,8cc442e --rounds 5
    .venv/bin/python bench/state/row_checkpoint_cost.py --base 8439bda --workload join
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

_RUN = r"""
import json, os, shutil, statistics, tempfile, time
from epochstream.core.filesystems import storage_fs
from epochstream.core.clock import SystemClock
from epochstream.state.backends.base import KeyedBackendContext, SnapshotTarget
from epochstream.state.backends.heap.backend import HeapStateBackend
from epochstream.core.state_descriptors import (
    ListStateDescriptor, MapStateDescriptor, ValueStateDescriptor,
)
from epochstream.state.keygroups import key_group_for_key

root = tempfile.mkdtemp(prefix="row-ckpt-", dir={tmp!r})
try:
    fs = storage_fs(root)
    ctx = KeyedBackendContext(
        operator_uid="sums", subtask=0, max_parallelism=128, key_group_range=range(0, 64),
        clock=SystemClock(), local_dir=os.path.join(root, "local"),
    )
    backend = HeapStateBackend().create(ctx)
    table = backend.value_table(ValueStateDescriptor("_reduce"))
    keys = sorted({{i * 7919 % 100_000 for i in range(100_000)}})
    keys = [k for k in keys if key_group_for_key(k, 128) < 64]
    lists = backend.get_state(ListStateDescriptor("auctions"))
    maps = backend.get_state(MapStateDescriptor("persons"))
    joined = [k for k in range(4_000) if key_group_for_key(k, 128) < 64][:1_000]
    junk = []
    sync, run, size = [], [], 0
    for n in range(1, {checkpoints} + 2):
        if {workload!r} == "join":
            for i in range((n - 1) * 4_000, n * 4_000):
                backend.set_current_key(joined[i % 1_000])
                event = {{"id": i, "seller": i % 997, "category": i % 10, "price": i * 3,
                         "dateTime": 1_700_000_000_000 + i, "extra": "x" * 8}}
                lists.add(event)
                maps.put(i, event)
            keys = ()
        for lo in range(0, len(keys), 1024):
            batch = keys[lo : lo + 1024]
            for k in batch:
                table[k] = (k, n)
                junk.append([k, n])
            table.touched(batch)
            if len(junk) > 300_000:
                del junk[:150_000]
        target = SnapshotTarget(
            fs=fs, checkpoint_id=n, directory=os.path.join(root, f"chk-{{n}}"),
            shared_dir=os.path.join(root, "shared"), name="sums-0",
            base_checkpoint_id=n - 1 if n > 1 else None,
        )
        t = time.thread_time()
        job = backend.snapshot(target)
        sync.append(time.thread_time() - t)
        t = time.thread_time()
        handle = job.run()
        run.append(time.thread_time() - t)
        size = handle.size
        del job
        backend.notify_checkpoint_complete(n)
    print(json.dumps({{
        "keys": len(joined) if {workload!r} == "join" else len(keys), "bytes": size,
        "first_sync_ms": sync[0] * 1e3, "first_async_ms": run[0] * 1e3,
        "sync_ms": statistics.median(sync[1:]) * 1e3, "async_ms": statistics.median(run[1:]) * 1e3,
    }}))
finally:
    shutil.rmtree(root, ignore_errors=True)
"""


def _export(commit: str, into: str) -> str:
    os.makedirs(into)
    archive = subprocess.run(
        ["git", "-C", ROOT, "archive", commit, "src"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", into], input=archive, check=True)
    return os.path.join(into, "src")


def _measure(src: str, args: argparse.Namespace) -> dict[str, float]:
    code = _RUN.format(tmp=args.tmp, checkpoints=args.checkpoints, workload=args.workload)
    env = {**os.environ, "PYTHONPATH": src}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True
    ).stdout
    row: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base", help="commits to compare with, comma-separated")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--checkpoints", type=int, default=8, help="timed, after the first")
    parser.add_argument("--tmp", default="/tmp")
    parser.add_argument("--workload", choices=["w1", "join"], default="w1")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="epochstream-base-") as scratch:
        trees: dict[str, str] = {}
        for commit in args.base.split(",") if args.base else []:
            trees[commit] = _export(commit, os.path.join(scratch, commit))
        trees["this"] = os.path.join(ROOT, "src")
        rows: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
        for round_no in range(args.rounds):
            order = list(trees) if round_no % 2 == 0 else list(reversed(trees))
            for name in order:
                row = _measure(trees[name], args)
                rows[name].append(row)
                print(
                    f"round {round_no + 1} {name}: sync {row['sync_ms']:.1f} ms, "
                    f"async {row['async_ms']:.1f} ms, first async {row['first_async_ms']:.1f} ms",
                    flush=True,
                )
        for name, got in rows.items():
            med = {k: statistics.median(r[k] for r in got) for k in got[0]}
            print(
                f"{name}: {int(med['keys'])} keys, {int(med['bytes']):,} bytes; CPU per "
                f"checkpoint (median of {args.rounds} rounds): sync {med['sync_ms']:.1f} ms, "
                f"async {med['async_ms']:.1f} ms; first checkpoint: sync "
                f"{med['first_sync_ms']:.1f} ms, async {med['first_async_ms']:.1f} ms"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
