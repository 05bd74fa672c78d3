"""Workload B (keyed running sum) per state backend, checkpoint overhead, and recovery time.

Throughput: the job of ``bench/epochstream_jobs.py`` (``run_keyed_sum``), through the
public API on Spark ``local[P]`` (default P = 2), with the heap and the RocksDB
backend (both incremental, the defaults), each with checkpoints every second and
with checkpointing off. N is ``--events`` (10 M) for the heap and ``--rocksdb-events``
(3 M) for RocksDB, which runs at about a tenth of the heap's rate::

    env.from_sequence(0, N).map(lambda i: (i * 7919 % 100_000, i % 1000)) \\
       .key_by(lambda t: t[0]).reduce(lambda a, b: (a[0], a[1] + b[1])) \\
       .sink_to(es.sinks.DiscardSink())

As in ``bench/run.py``, one SparkSession serves every job (the first, untimed job
pays the session's warm-up), each job is timed as the wall time of
``env.execute()``, the measurements are interleaved ``--repeat`` times and a row
reports the median run. The overhead of checkpoints is ``1 - rate(1 s) / rate(off)``
per backend. Every checkpoint of the median runs is listed (duration, state size,
the slowest task's synchronous and asynchronous part, bytes written by all tasks).

Recovery: the same job over ``S`` distinct keys (``--recovery-keys``, default 100k
and 1M), checkpoints every second. Once each source subtask has produced ``S``
records (so the state holds all ``S`` keys) and a checkpoint triggered after that
has completed, slot 0's process is killed with SIGKILL
(``es.testing.kill_slot``). The map and the reduce log wall-clock times to files
(attempt, subtask, the first record after ``open``, progress every 65,536 records),
from which the driver takes: the new attempt starting, the reduce subtasks opening
(state restored), both reduce subtasks processing records again, the sources passing
the position they had logged before the kill (caught up), and the first checkpoint
of the new attempt. The restart strategy is ``fixed_delay(attempts=3,
delay=--restart-delay)``, 0 s by default, so the figures show the engine's own cost
(the default strategy waits 1 s more).

Results go to ``bench/state/throughput.json`` (rewritten after every measurement).

Example::

    .venv/bin/python bench/state/throughput_bench.py               # full run (about 8 minutes)
    .venv/bin/python bench/state/throughput_bench.py --quick       # smoke run
    .venv/bin/python bench/state/throughput_bench.py --no-recovery --repeat 1
    .venv/bin/python bench/state/throughput_bench.py --only-recovery --recovery-keys 100000
    .venv/bin/python bench/state/throughput_bench.py --profile /tmp/prof   # py-spy the slots
"""

from __future__ import annotations

import os

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

import argparse
import collections
import json
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

from epochstream_jobs import B_KEYS, checkpoint_summary  # noqa: E402
from machine import int_list, machine_facts, machine_line  # noqa: E402
from throughput_jobs import (  # noqa: E402
    BACKENDS,
    build_keyed_sum,
    environment,
    fresh_storage,
    run_keyed_sum,
    run_recovery_once,
)


class Results:
    """Rows measured so far plus machine facts; saved to JSON after every row."""

    def __init__(self, path: str, machine: dict[str, Any], settings: dict[str, Any]) -> None:
        self.path = path
        self.doc: dict[str, Any] = {
            "machine": machine,
            "settings": settings,
            "throughput": [],
            "overhead": [],
            "recovery": [],
        }

    def save(self) -> None:
        tmp = f"{self.path}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(self.doc, f, indent=2, sort_keys=True)
            f.write("\n")
        os.replace(tmp, self.path)


# ------------------------------------------------------------------ throughput


def run_throughput(results: Results, args: argparse.Namespace, spark: Any) -> None:
    configs = [(b, ck) for b in args.backends for ck in (1.0, None)]
    runs: dict[tuple[str, float | None], list[dict[str, Any]]] = {c: [] for c in configs}
    errors: dict[tuple[str, float | None], str] = {}
    for rep in range(args.repeat):
        for backend, ck in configs:
            if (backend, ck) in errors:
                continue
            n = args.events if backend == "heap" else args.rocksdb_events
            try:
                out = run_keyed_sum(args, spark, backend, ck, n)
            except Exception as exc:  # recorded, never dropped
                errors[(backend, ck)] = f"{type(exc).__name__}: {exc}"
                print(f"  {backend} ck={ck}: ERROR {errors[(backend, ck)]}", flush=True)
                continue
            runs[(backend, ck)].append(out)
            cps = out["checkpoint_stats"]
            print(
                f"  run {rep + 1}/{args.repeat}: {backend:<8} {_ck(ck):<4} {n:>11,} events "
                f"{out['seconds']:6.2f} s {out['rate']:>10,.0f} events/s "
                f"({cps.get('count', 0)} checkpoints)",
                flush=True,
            )
    for backend, ck in configs:
        row: dict[str, Any] = {"backend": backend, "checkpoints_every": _ck(ck)}
        done = runs[(backend, ck)]
        if (backend, ck) in errors:
            row["error"] = errors[(backend, ck)]
        if done:
            ordered = sorted(done, key=lambda r: r["rate"])
            row.update(ordered[(len(ordered) - 1) // 2])
            row["rates"] = [r["rate"] for r in done]
            row["runs"] = [
                {k: r[k] for k in ("rate", "seconds", "load1_before", "restarts")} for r in done
            ]
        results.doc["throughput"].append(row)
    for backend in args.backends:
        on = _find(results.doc["throughput"], backend, "1 s")
        off = _find(results.doc["throughput"], backend, "off")
        if on and off and "rate" in on and "rate" in off:
            results.doc["overhead"].append(
                {
                    "backend": backend,
                    "rate_1s": on["rate"],
                    "rate_off": off["rate"],
                    "overhead": 1 - on["rate"] / off["rate"],
                    # Each run's pairs are measured back to back (interleaved).
                    "overhead_per_repeat": [
                        1 - a / b for a, b in zip(on["rates"], off["rates"], strict=False)
                    ],
                }
            )
    results.save()


def _ck(ck: float | None) -> str:
    return "off" if ck is None else f"{ck:g} s"


def _find(rows: list[dict[str, Any]], backend: str, ck: str) -> dict[str, Any] | None:
    for r in rows:
        if r["backend"] == backend and r["checkpoints_every"] == ck:
            return r
    return None


# ------------------------------------------------------------------ recovery


def run_recovery(results: Results, args: argparse.Namespace, spark: Any) -> None:
    for rep in range(args.recovery_repeat):
        for backend in args.recovery_backends:
            for keys in args.recovery_keys:
                print(f"recovery {rep + 1}/{args.recovery_repeat}: {backend} {keys:,} keys ...")
                try:
                    row = run_recovery_once(args, spark, backend, keys)
                except Exception as exc:  # recorded, never dropped
                    row = {
                        "backend": backend,
                        "keys": keys,
                        "error": f"{type(exc).__name__}: {exc}",
                    }
                row["repeat"] = rep + 1
                results.doc["recovery"].append(row)
                results.save()
                print(f"  {_recovery_line(row)}", flush=True)


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _recovery_line(r: dict[str, Any]) -> str:
    if "error" in r:
        return f"ERROR {r['error']}"
    return (
        f"new attempt {_s(r['new_attempt_s'])} s, reduce open {_s(r['reduce_open_s'])} s, "
        f"processing {_s(r['processing_s'])} s, caught up {_s(r['caught_up_s'])} s, "
        f"first checkpoint {_s(r['first_checkpoint_s'])} s"
    )


# ------------------------------------------------------------------ profile


def run_profile(results: Results, args: argparse.Namespace, spark: Any) -> None:
    """Workload B on the heap backend, 1 s and off, with py-spy attached to every slot."""
    py_spy = os.path.join(os.path.dirname(sys.executable), "py-spy")
    os.makedirs(args.profile, exist_ok=True)
    summary: dict[str, Any] = {}
    for backend in args.backends:
        for ck in (1.0, None):
            label = f"{backend}-{'ck1s' if ck else 'off'}"
            n = args.events if backend == "heap" else args.rocksdb_events
            env = environment(args, spark, backend)
            if ck is not None:
                env.enable_checkpointing(ck, storage=fresh_storage(args, f"ck-profile-{backend}"))
            build_keyed_sum(env, n)
            start = time.perf_counter()
            client = env.execute_async(f"state-bench-profile-{label}")
            client.wait_until_running()
            spies = []
            paths = []
            for slot, pid in sorted(client.slot_pids().items()):
                path = os.path.join(args.profile, f"{label}-slot{slot}.txt")
                paths.append(path)
                argv = [py_spy, "record", "--pid", str(pid), "--rate", "200", "--gil"]
                argv += ["--format", "raw", "--output", path]
                spies.append(
                    subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                )
            result = client.result()
            wall = time.perf_counter() - start
            for spy in spies:
                spy.wait(timeout=60)
            summary[label] = {
                "events": n,
                "seconds": wall,
                "rate": n / wall,
                "checkpoint_stats": checkpoint_summary(result),
                "profile": summarize_profile(paths),
            }
            print(f"profile {label}: {n / wall:,.0f} events/s, files {paths}", flush=True)
            print(format_profile(summary[label]["profile"]), flush=True)
    results.doc["profile"] = summary
    results.save()


def _frame_name(frame: str) -> str:
    """``"function (path/file.py:12)"`` -> ``"function (file.py)"``."""
    name, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    parts = path.split("/")
    short = "/".join(parts[-2:]) if len(parts) > 1 else path
    return f"{name} ({short})"


def summarize_profile(paths: list[str], top: int = 20) -> dict[str, Any]:
    """Top frames by own samples (leaf) and by inclusive samples, over the raw files."""
    own: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    total = 0
    for path in paths:
        if not os.path.exists(path):
            continue
        with open(path, encoding="utf-8") as f:
            for line in f:
                stack, _, count_text = line.rstrip("\n").rpartition(" ")
                if not stack or not count_text.isdigit():
                    continue
                count = int(count_text)
                frames = [_frame_name(fr) for fr in stack.split(";") if fr]
                if not frames:
                    continue
                total += count
                own[frames[-1]] += count
                for name in set(frames):
                    incl[name] += count
    return {
        "samples": total,
        "own": [(name, c / total) for name, c in own.most_common(top)] if total else [],
        "inclusive": [(name, c / total) for name, c in incl.most_common(top * 2)] if total else [],
    }


def format_profile(p: dict[str, Any]) -> str:
    lines = [f"  {p['samples']:,} GIL-holding samples; own time:"]
    lines += [f"    {share:6.1%}  {name}" for name, share in p["own"]]
    lines.append("  inclusive:")
    lines += [f"    {share:6.1%}  {name}" for name, share in p["inclusive"]]
    return "\n".join(lines)


# ------------------------------------------------------------------ report


def markdown(doc: dict[str, Any]) -> str:
    """The Markdown tables of a results document."""
    s = doc["settings"]
    out: list[str] = []
    if doc["throughput"]:
        out += [
            f"Workload B, Spark local[{s['parallelism']}], {B_KEYS:,} keys, median of "
            f"{s['repeat']} interleaved runs:",
            "",
            "| backend | checkpoints | events | s (median) | events/s (median) | runs, k events/s "
            "| count | mean duration s | max duration s | mean sync s | mean async s "
            "| state bytes (last) |",
            "|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|",
        ]
        for r in doc["throughput"]:
            if "rate" not in r:
                out.append(
                    f"| {r['backend']} | {r['checkpoints_every']} | failed: {r.get('error')} "
                    "| | | | | | | | | |"
                )
                continue
            runs = ", ".join(f"{x / 1e3:,.0f}" for x in r["rates"])
            c = r["checkpoint_stats"]
            if c.get("count"):
                cells = (
                    f"{c['count']} | {c['mean_duration_s']:.3f} | {c['max_duration_s']:.3f} "
                    f"| {c['mean_sync_s']:.3f} | {c['mean_async_s']:.3f} | {c['state_bytes_last']:,}"
                )
            else:
                cells = "0 | - | - | - | - | -"
            out.append(
                f"| {r['backend']} | {r['checkpoints_every']} | {r['events']:,} "
                f"| {r['seconds']:.2f} | {r['rate']:,.0f} | {runs} | {cells} |"
            )
    if doc["overhead"]:
        out += [
            "",
            "Checkpoint overhead (1 - rate at 1 s / rate off; per repeat: the runs measured "
            "back to back):",
            "",
            "| backend | events/s 1 s | events/s off | overhead (medians) | per repeat |",
            "|---|---:|---:|---:|---|",
        ]
        for o in doc["overhead"]:
            per = ", ".join(f"{x:.1%}" for x in o["overhead_per_repeat"])
            out.append(
                f"| {o['backend']} | {o['rate_1s']:,.0f} | {o['rate_off']:,.0f} "
                f"| {o['overhead']:.1%} | {per} |"
            )
    for r in doc["throughput"]:
        if not r.get("checkpoints"):
            continue
        out += [
            "",
            f"Checkpoints of the median {r['backend']} run (1 s):",
            "",
            "| id | duration s | state size | max sync s | max async s | max alignment s "
            "| bytes written |",
            "|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for c in r["checkpoints"]:
            out.append(
                f"| {c['id']} | {c['duration_s']:.3f} | {c['state_size']:,} "
                f"| {c['max_sync_s']:.3f} | {c['max_async_s']:.3f} | {c['max_alignment_s']:.3f} "
                f"| {c['bytes_written']:,} |"
            )
    if doc["recovery"]:
        out += [
            "",
            "Recovery after SIGKILL of slot 0 (seconds after the kill; restart delay "
            f"{s['restart_delay']:g} s):",
            "",
            "| backend | keys | state bytes | new attempt | reduce open (restored) "
            "| processing (1st / both) | caught up | replayed records | first checkpoint |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in doc["recovery"]:
            if "error" in r:
                out.append(f"| {r['backend']} | {r['keys']:,} | failed: {r['error']} | | | | | | |")
                continue
            replayed = "-" if r["replayed_records"] is None else f"{r['replayed_records']:,}"
            out.append(
                f"| {r['backend']} | {r['keys']:,} | {r['checkpoint_before_kill']['state_size']:,} "
                f"| {_s(r['new_attempt_s'])} | {_s(r['reduce_open_s'])} "
                f"| {_s(r['processing_first_subtask_s'])} / {_s(r['processing_s'])} "
                f"| {_s(r['caught_up_s'])} | {replayed} | {_s(r['first_checkpoint_s'])} |"
            )
    out += ["", machine_line(doc["machine"])]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small inputs, one repeat")
    parser.add_argument("--events", type=int, default=10_000_000, help="events (heap runs)")
    parser.add_argument(
        "--rocksdb-events",
        type=int,
        default=3_000_000,
        help="events of the RocksDB runs (about 0.1 M events/s here: 10 M would take 90 s a run)",
    )
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--backends", default="heap,rocksdb")
    parser.add_argument("--no-throughput", action="store_true")
    parser.add_argument("--no-recovery", action="store_true")
    parser.add_argument("--only-recovery", action="store_true")
    parser.add_argument("--recovery-keys", default="100000,1000000")
    parser.add_argument("--recovery-backends", default="heap,rocksdb")
    parser.add_argument("--recovery-events", type=int, default=20_000_000)
    parser.add_argument("--recovery-repeat", type=int, default=1)
    parser.add_argument("--recovery-timeout", type=float, default=180.0)
    parser.add_argument("--restart-delay", type=float, default=0.0)
    parser.add_argument("--profile", metavar="DIR", help="py-spy the slots of one run each")
    parser.add_argument("--tmp", default=os.path.join(tempfile.gettempdir(), "state-bench"))
    parser.add_argument("--out", default=os.path.join(HERE, "throughput.json"))
    parser.add_argument("--render", metavar="RESULTS_JSON", help="print a results file and exit")
    args = parser.parse_args(argv)
    if args.render:
        with open(args.render, encoding="utf-8") as f:
            print(markdown(json.load(f)))
        return 0
    args.backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    args.recovery_backends = [b.strip() for b in args.recovery_backends.split(",") if b.strip()]
    for b in [*args.backends, *args.recovery_backends]:
        if b not in BACKENDS:
            parser.error(f"unknown backend {b!r}; choose among {list(BACKENDS)}")
    args.recovery_keys = int_list(args.recovery_keys)
    if args.quick:
        args.events, args.repeat = min(args.events, 1_000_000), 1
        args.rocksdb_events = min(args.rocksdb_events, 1_000_000)
        args.recovery_keys = [min(k, 100_000) for k in args.recovery_keys[:1]]
        args.recovery_events = min(args.recovery_events, 4_000_000)
    os.makedirs(args.tmp, exist_ok=True)
    settings = {k: v for k, v in vars(args).items() if k not in ("out", "render")}
    results = Results(args.out, machine_facts(spark=True), settings)

    from epochstream.deploy.spark import create_session

    start = time.perf_counter()
    spark = create_session(f"local[{args.parallelism}]", app_name="epochstream-state-bench")
    results.doc["settings"]["spark_session_start_s"] = time.perf_counter() - start
    try:
        # The session's first job pays a one-off warm-up; run it untimed.
        warm = run_keyed_sum(args, spark, "heap", 1.0, 1000)
        results.doc["settings"]["spark_first_job_s"] = warm["seconds"]
        if args.profile:
            run_profile(results, args, spark)
        else:
            if not args.no_throughput and not args.only_recovery:
                run_throughput(results, args, spark)
            if not args.no_recovery:
                run_recovery(results, args, spark)
    finally:
        spark.stop()
    results.doc["machine"]["loadavg_end"] = os.getloadavg()
    results.doc["total_s"] = time.perf_counter() - start
    results.save()
    print()
    print(markdown(results.doc))
    print(f"\nwrote {args.out} ({results.doc['total_s']:.0f} s)")
    failed = [r for r in results.doc["throughput"] + results.doc["recovery"] if "error" in r]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
