"""How late a paced task's batches finish while heap checkpoints run: this tree against
a base commit.

A latency probe through a whole job on the shared 2-core machine measures mostly the
machine's scheduling; this keeps the part checkpoints add. One process: the main
thread is a W1 reduce subtask at half load, paced (``--rate`` records a second in
batches of 512: a batch is due at ``start + n * 512 / rate``; it reads and writes each
key's running sum in the heap backend's value table and declares the batch's keys),
over the 50,047 keys of ``i * 7919 % 100_000`` that fall in key groups 0..63 of 128.
Every ``--interval`` seconds it takes the synchronous part of a checkpoint itself and
hands the job to a second thread, as a task hands it to the slot's snapshot thread
(files fsynced under ``--tmp``). A batch's lateness is the time from its due time to its
end; the first twelfth of the run is left out. Each round runs each tree in a fresh
process, alternating the order; the p50, p99 and p99.9 lateness are printed per run
and as medians over the rounds.

Example::

    .venv/bin/python bench/state/checkpoint_lateness.py --base c153040 --rounds 3
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
import json, os, queue, shutil, tempfile, threading, time
from epochstream.core.filesystems import storage_fs
from epochstream.core.clock import SystemClock
from epochstream.state.backends.base import KeyedBackendContext, SnapshotTarget
from epochstream.state.backends.heap.backend import HeapStateBackend
from epochstream.core.state_descriptors import ValueStateDescriptor
from epochstream.state.keygroups import key_group_for_key

root = tempfile.mkdtemp(prefix="lateness-", dir={tmp!r})
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
    jobs = queue.Queue()

    def snapshots():
        while (job := jobs.get()) is not None:
            job.run()

    thread = threading.Thread(target=snapshots, daemon=True)
    thread.start()
    batch, rate = 512, {rate}
    step = batch / rate
    get, touched = table.get, table.touched
    late, n, i, ck = [], 0, 0, 0
    start = time.perf_counter()
    next_ck, end = start + {interval}, start + {seconds}
    while True:
        due = start + n * step
        now = time.perf_counter()
        if now < due:
            time.sleep(due - now)
        part = keys[i : i + batch]
        i = (i + batch) % (len(keys) - batch)
        for k in part:
            cur = get(k)
            table[k] = (k, 1) if cur is None else (k, cur[1] + 1)
        touched(part)
        done = time.perf_counter()
        late.append(done - due)
        n += 1
        if done >= next_ck:
            ck += 1
            if ck > 1:
                backend.notify_checkpoint_complete(ck - 1)
            jobs.put(backend.snapshot(SnapshotTarget(
                fs=fs, checkpoint_id=ck, directory=os.path.join(root, f"chk-{{ck}}"),
                shared_dir=os.path.join(root, "shared"), name="sums-0",
                base_checkpoint_id=ck - 1 if ck > 1 else None,
            )))
            next_ck += {interval}
        if done > end:
            break
    jobs.put(None)
    thread.join()
    late = sorted(late[len(late) // 12 :])
    q = lambda p: late[int(p * (len(late) - 1))] * 1e3
    print(json.dumps({{"batches": len(late), "checkpoints": ck, "p50": q(0.5), "p99": q(0.99), "p999": q(0.999)}}))
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base", help="commits to compare with, comma-separated")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rate", type=int, default=250_000)
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between checkpoints")
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--tmp", default="/tmp")
    args = parser.parse_args(argv)
    code = _RUN.format(tmp=args.tmp, rate=args.rate, interval=args.interval, seconds=args.seconds)
    with tempfile.TemporaryDirectory(prefix="epochstream-base-") as scratch:
        trees: dict[str, str] = {}
        for commit in args.base.split(",") if args.base else []:
            trees[commit] = _export(commit, os.path.join(scratch, commit))
        trees["this"] = os.path.join(ROOT, "src")
        rows: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
        for round_no in range(args.rounds):
            order = list(trees) if round_no % 2 == 0 else list(reversed(trees))
            for name in order:
                out = subprocess.run(
                    [sys.executable, "-c", code],
                    env={**os.environ, "PYTHONPATH": trees[name]},
                    check=True,
                    capture_output=True,
                    text=True,
                ).stdout
                row = json.loads(out.strip().splitlines()[-1])
                rows[name].append(row)
                load = os.getloadavg()[0]
                print(
                    f"round {round_no + 1} {name}: p50 {row['p50']:.2f} ms, p99 {row['p99']:.2f} ms, "
                    f"p99.9 {row['p999']:.2f} ms ({row['checkpoints']} checkpoints, load {load:.1f})",
                    flush=True,
                )
        for name, got in rows.items():
            med = {k: statistics.median(r[k] for r in got) for k in ("p50", "p99", "p999")}
            print(
                f"{name}: batch lateness, median of {args.rounds} rounds: p50 {med['p50']:.2f} ms, "
                f"p99 {med['p99']:.2f} ms, p99.9 {med['p999']:.2f} ms"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
