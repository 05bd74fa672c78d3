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
import json
import os
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

from machine import int_list, machine_facts, machine_line  # noqa: E402
from snapshot_measures import (  # noqa: E402
    BACKENDS,
    BATCH,
    FAMILY,
    MAX_P,
    measure_size,
    measure_snapshot_thread,
    measure_task_cycle,
)

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
            mean_bytes = (
                "-" if r["bytes_written_mean"] is None else f"{r['bytes_written_mean']:,.0f}"
            )
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
