"""Benchmark harness: epochstream and its peers on workloads A (word count) and B (keyed sum).

One run measures every selected system, prints a table and writes ``bench/results.json``
(rewritten after every measurement, so an interrupted run keeps what it measured).
Peers are installed lazily into ``/tmp/bench-venvs/`` on first use; see
``docs/benchmarks.md`` for the method and the figures.

Example::

    .venv/bin/python bench/run.py                       # everything (about 10 minutes)
    .venv/bin/python bench/run.py --only epochstream    # no peers
    .venv/bin/python bench/run.py --skip-peers --quick  # a smoke run
    .venv/bin/python bench/run.py --only dictloop,bytewax --workloads B
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "peers"))

from install import PEERS, PeerUnavailable, java_home, venv_root  # noqa: E402
from machine import machine_facts  # noqa: E402
from workloads import ensure_text, split_text, text_stats  # noqa: E402

SYSTEMS = ("epochstream", "dictloop", "bytewax", "spark-ss", "pyflink")
DATA_DIR = "/tmp/epochstream-bench"
PEER_TIMEOUT_S = 900.0
# Slow peers get a smaller input so one run stays near a minute; rates are per event.
B_SHARE = {"bytewax": 0.2, "pyflink": 0.1}
A_SHARE = {"bytewax": 0.25, "pyflink": 1 / 16}
# Peers quick enough to repeat like epochstream (--repeat); the others use --repeat-slow.
FAST_PEERS = ("dictloop", "spark-ss")


class Results:
    """Rows measured so far plus machine facts; saved to JSON after every row."""

    def __init__(self, path: str, machine: dict[str, Any], settings: dict[str, Any]) -> None:
        self.path = path
        self.doc: dict[str, Any] = {"machine": machine, "settings": settings, "rows": []}

    @property
    def rows(self) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = self.doc["rows"]
        return rows

    def add(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        line = _format_row(row)
        print(line, flush=True)
        self.save()

    def save(self) -> None:
        tmp = f"{self.path}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(self.doc, f, indent=2, sort_keys=True)
            f.write("\n")
        os.replace(tmp, self.path)


def _machine_facts() -> dict[str, Any]:
    """What the figures were measured on, plus where Java is and the peers' versions."""
    facts = machine_facts(spark=True)
    facts["java_home"] = java_home()
    facts["peer_requirements"] = {k: p.requirement for k, p in PEERS.items() if p.requirement}
    return facts


def _row(workload: str, system: str, checkpoints: str, sink: str, **fields: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "workload": workload,
        "system": system,
        "checkpoints": checkpoints,
        "sink": sink,
    }
    row["load1_before"] = round(os.getloadavg()[0], 2)
    row.update(fields)
    return row


Measurement = tuple[dict[str, Any], Callable[[], dict[str, Any]]]


def _measure_all(results: Results, measurements: list[Measurement], repeat: int) -> None:
    """Run every measurement ``repeat`` times, interleaved, and add one row per measurement.

    Interleaving (all measurements once, then all again...) spreads slow phases of a
    shared machine over every configuration instead of one. A row reports the median
    run (its seconds, rate and checkpoint statistics) and every run's rate in
    ``rates``. A failure becomes a row with the error instead of ending the run.
    """
    outs: list[list[dict[str, Any]]] = [[] for _ in measurements]
    errors: list[str | None] = [None] * len(measurements)
    for rep in range(repeat):
        for i, (base, fn) in enumerate(measurements):
            if errors[i] is not None:
                continue
            try:
                out = fn()
            except PeerUnavailable as exc:
                errors[i] = f"unavailable: {exc}"
                continue
            except Exception as exc:  # recorded in the results and the table, never dropped
                errors[i] = f"{type(exc).__name__}: {exc}"
                continue
            out.setdefault("rate", out["events"] / out["seconds"])
            out["load1_before"] = base["load1_before"] if rep == 0 else None
            outs[i].append(out)
            print(
                f"  run {rep + 1}/{repeat}: {base['workload']} {base['system']} "
                f"{base['checkpoints']} {base['sink']}: {out['rate']:,.0f} events/s",
                flush=True,
            )
    for (base, _), runs, error in zip(measurements, outs, errors, strict=True):
        row = dict(base)
        if error is not None:
            row["error"] = error
        if runs:
            ordered = sorted(runs, key=lambda r: r["rate"])
            median = ordered[(len(ordered) - 1) // 2]
            row.update({k: v for k, v in median.items() if k != "load1_before"})
            row["rates"] = [r["rate"] for r in runs]
        results.add(row)


# ------------------------------------------------------------------ inputs


class Inputs:
    """Generated inputs, made on first use and reused across runs (seeded, deterministic)."""

    def __init__(self, text_mb: float, b_events: int) -> None:
        self.text_mb = text_mb
        self.b_events = b_events
        self._words: dict[str, int] = {}

    def text(self, system: str = "epochstream") -> tuple[str, int]:
        mb = round(self.text_mb * A_SHARE.get(system, 1.0), 3)
        path = ensure_text(os.path.join(DATA_DIR, f"words-{mb:g}mb.txt"), mb)
        if path not in self._words:
            self._words[path] = text_stats(path)[1]
        return path, self._words[path]

    def b_n(self, system: str = "epochstream") -> int:
        return int(self.b_events * B_SHARE.get(system, 1.0))


# ------------------------------------------------------------------ epochstream


def run_epochstream(results: Results, args: argparse.Namespace, inputs: Inputs) -> None:
    """Workloads A and B on epochstream, checkpoints every 1 s and off."""
    import epochstream_jobs as jobs

    spark = None
    if args.runner == "spark":
        from epochstream.deploy.spark import create_session

        start = time.perf_counter()
        spark = create_session(f"local[{args.parallelism}]", app_name="epochstream-bench")
        results.doc["settings"]["spark_session_start_s"] = time.perf_counter() - start
        # The first job of a session pays ~1.5 s of one-off warm-up (Python workers, JIT);
        # run it untimed so the fixed-cost rows show what every later job pays.
        warm = jobs.run_fixed_cost(
            spark=spark, parallelism=args.parallelism, runner="spark", checkpoint=None
        )
        results.doc["settings"]["spark_first_job_s"] = warm["seconds"]
    common = {"spark": spark, "parallelism": args.parallelism, "runner": args.runner}
    name = f"epochstream ({args.runner}, p={args.parallelism})"
    todo: list[Measurement] = []
    try:
        for ck in (1.0, None):
            todo.append(
                (
                    _row("fixed", name, "1 s" if ck else "off", "discard"),
                    functools.partial(jobs.run_fixed_cost, checkpoint=ck, **common),
                )
            )
        if "B" in args.workloads:
            n = inputs.b_n()
            for ck in (1.0, None):
                todo.append(
                    (
                        _row("B", name, "1 s" if ck else "off", "discard"),
                        functools.partial(jobs.run_keyed_sum, n, checkpoint=ck, **common),
                    )
                )
        if "A" in args.workloads:
            path, words = inputs.text()
            for ck in (1.0, None):
                todo.append(
                    (
                        _row("A", name, "1 s" if ck else "off", "discard"),
                        functools.partial(jobs.run_wordcount, path, words, checkpoint=ck, **common),
                    )
                )
            if not args.no_filesink:
                todo.append(
                    (
                        _row("A", name, "1 s", "file (2PC)"),
                        functools.partial(
                            jobs.run_wordcount, path, words, checkpoint=1.0, sink="file", **common
                        ),
                    )
                )
        _measure_all(results, todo, args.repeat)
    finally:
        if spark is not None:
            # Peers start their own JVMs; this one would only hold memory meanwhile.
            spark.stop()


# ------------------------------------------------------------------ peers


def _run_peer(system: str, workload: str, extra: list[str]) -> dict[str, Any]:
    peer = PEERS[system]
    python = peer.ensure()
    argv = peer.command(python, workload, extra)
    log_path = os.path.join(venv_root(), f"{system}-{workload}.log")
    with open(log_path, "w", encoding="utf-8") as log:
        done = subprocess.run(
            argv,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env=peer.environment(),
            timeout=PEER_TIMEOUT_S,
            check=False,
        )
    if done.returncode != 0:
        raise RuntimeError(f"{system} exited {done.returncode}; see {log_path}")
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        raise RuntimeError(f"{system} printed no result; see {log_path}")
    out: dict[str, Any] = json.loads(lines[-1])
    if peer.install_seconds is not None:
        out["install_seconds"] = peer.install_seconds
        peer.install_seconds = None
    return out


def run_peers(
    results: Results, args: argparse.Namespace, inputs: Inputs, systems: list[str]
) -> None:
    """Every selected peer on every selected workload."""
    labels = {
        "dictloop": "CPython dict loop (1 core)",
        "bytewax": "Bytewax 0.21.1 (1 worker)",
        "spark-ss": f"Spark Structured Streaming (local[{args.parallelism}])",
        "pyflink": f"PyFlink 2.3.0 ({args.pyflink_mode} mode, p={args.parallelism})",
    }
    for system in systems:
        label = labels[system]
        measure: list[tuple[str, str, str, list[str]]] = []  # workload, ckpt, sink, argv
        if "B" in args.workloads:
            b = ["--n", str(inputs.b_n(system))]
            if system == "dictloop":
                measure.append(("B", "off", "count", b))
            elif system == "spark-ss":
                measure.append(
                    (
                        "B",
                        "micro-batch",
                        "noop",
                        [
                            *b,
                            "--rows-per-batch",
                            str(args.ss_rows_per_batch),
                            "--parallelism",
                            str(args.parallelism),
                        ],
                    )
                )
            else:
                mode = ["--mode", args.pyflink_mode] if system == "pyflink" else []
                measure.append(("B", "1 s", "discard", [*b, "--checkpoint", "1", *mode]))
                measure.append(("B", "off", "discard", [*b, "--checkpoint", "0", *mode]))
        if "A" in args.workloads:
            path, words = inputs.text(system)
            a = ["--n", str(words), "--path", path]
            if system == "dictloop":
                measure.append(("A", "off", "count", a))
            elif system == "spark-ss":
                parts_dir = os.path.join(DATA_DIR, f"parts-{os.path.basename(path)}")
                split_text(path, parts_dir, args.ss_text_parts)
                measure.append(
                    (
                        "A",
                        "micro-batch",
                        "noop",
                        [
                            "--n",
                            str(words),
                            "--path",
                            parts_dir,
                            "--files-per-batch",
                            "2",
                            "--parallelism",
                            str(args.parallelism),
                        ],
                    )
                )
            else:
                mode = ["--mode", args.pyflink_mode] if system == "pyflink" else []
                measure.append(("A", "1 s", "discard", [*a, "--checkpoint", "1", *mode]))
        repeat = args.repeat if system in FAST_PEERS else args.repeat_slow
        _measure_all(
            results,
            [
                (
                    _row(workload, label, ckpt, sink),
                    functools.partial(_run_peer, system, workload, argv),
                )
                for workload, ckpt, sink, argv in measure
            ],
            repeat,
        )


# ------------------------------------------------------------------ report


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """``ratio`` = epochstream's rate / the peer's rate, same workload, same checkpoint setting.

    Peers with checkpoints ("1 s" or Spark's "micro-batch") compare with epochstream at
    1 s; peers without compare with epochstream with checkpoints off.
    """
    es_rate: dict[tuple[str, str], float] = {}
    for r in rows:
        if r["system"].startswith("epochstream") and r["sink"] == "discard" and "rate" in r:
            es_rate[(r["workload"], r["checkpoints"])] = r["rate"]
    for r in rows:
        if r["system"].startswith("epochstream") or "rate" not in r:
            continue
        ck = "off" if r["checkpoints"] == "off" else "1 s"
        ref = es_rate.get((r["workload"], ck))
        if ref:
            r["ratio_epochstream_over_peer"] = ref / r["rate"]


_HEADER = (
    f"{'wl':<5} {'system':<40} {'ckpt':<11} {'sink':<10} {'events':>10} {'s':>6} "
    f"{'events/s':>10} {'runs (k/s)':>17} {'es/peer':>8}"
)


def _format_row(r: dict[str, Any]) -> str:
    head = f"{r['workload']:<5} {r['system']:<40} {r['checkpoints']:<11} {r['sink']:<10}"
    if "rate" not in r:
        return f"{head} ERROR {r.get('error', '')}"
    ratio = r.get("ratio_epochstream_over_peer")
    rates = r.get("rates") or [r["rate"]]
    spread = f"{min(rates) / 1e3:,.0f}-{max(rates) / 1e3:,.0f} ({len(rates)})"
    return (
        f"{head} {r['events']:>10,} {r['seconds']:>6.2f} {r['rate']:>10,.0f} {spread:>17} "
        f"{'' if ratio is None else f'{ratio:.2f}x':>8}"
        + (f"  ERROR {r['error']}" if "error" in r else "")
    )


def print_table(results: Results) -> None:
    """The rate table, then the checkpoint statistics of the epochstream runs."""
    print()
    print(_HEADER)
    for r in results.rows:
        print(_format_row(r))
    print(
        f"\n{'wl':<6} {'ckpt':<5} {'sink':<11} {'count':>5} {'mean s':>7} {'max s':>7} "
        f"{'max align s':>11} {'mean sync s':>11} {'state bytes':>12}"
    )
    for r in results.rows:
        cps = r.get("checkpoint_stats")
        if not cps or not cps.get("count"):
            continue
        print(
            f"{r['workload']:<6} {r['checkpoints']:<5} {r['sink']:<11} {cps['count']:>5} "
            f"{cps['mean_duration_s']:>7.3f} {cps['max_duration_s']:>7.3f} "
            f"{cps['max_alignment_s']:>11.3f} {cps['mean_sync_s']:>11.3f} "
            f"{cps['state_bytes_last']:>12,}"
        )


def markdown(doc: dict[str, Any]) -> str:
    """Markdown tables (rates, then checkpoint statistics) of a results document.

    Example: ``print(markdown(json.load(open("bench/results.json"))))``
    """
    lines = [
        "| workload | system | checkpoints | sink | events | s (median) | events/s (median) "
        "| runs, k events/s | epochstream / peer |",
        "|---|---|---|---|---:|---:|---:|---|---:|",
    ]
    for r in doc["rows"]:
        if "rate" not in r:
            lines.append(
                f"| {r['workload']} | {r['system']} | {r['checkpoints']} | {r['sink']} "
                f"| | | | failed: {r.get('error', '')} | |"
            )
            continue
        ratio = r.get("ratio_epochstream_over_peer")
        runs = ", ".join(f"{x / 1e3:,.0f}" for x in r.get("rates") or [r["rate"]])
        lines.append(
            f"| {r['workload']} | {r['system']} | {r['checkpoints']} | {r['sink']} "
            f"| {r['events']:,} | {r['seconds']:.2f} | {r['rate']:,.0f} | {runs} "
            f"| {'' if ratio is None else f'{ratio:.2f}x'} |"
        )
    lines += [
        "",
        "| workload | sink | checkpoints | mean duration s | max duration s | max alignment s "
        "| mean sync s | mean async s | state bytes (last) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in doc["rows"]:
        cps = r.get("checkpoint_stats")
        if not cps or not cps.get("count"):
            continue
        lines.append(
            f"| {r['workload']} | {r['sink']} | {cps['count']} | {cps['mean_duration_s']:.3f} "
            f"| {cps['max_duration_s']:.3f} | {cps['max_alignment_s']:.3f} "
            f"| {cps['mean_sync_s']:.3f} | {cps['mean_async_s']:.3f} "
            f"| {cps['state_bytes_last']:,} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--only",
        default=",".join(SYSTEMS),
        help=f"comma-separated systems among {','.join(SYSTEMS)}",
    )
    parser.add_argument("--skip-peers", action="store_true", help="epochstream only")
    parser.add_argument("--workloads", default="A,B", help="A, B or A,B")
    parser.add_argument("--quick", action="store_true", help="small inputs (smoke run)")
    parser.add_argument("--b-events", type=int, default=10_000_000)
    parser.add_argument("--text-mb", type=float, default=64.0)
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--runner", choices=["spark", "local"], default="spark")
    parser.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="runs of each epochstream, dict-loop and Spark measurement (median)",
    )
    parser.add_argument(
        "--repeat-slow", type=int, default=1, help="runs of each Bytewax and PyFlink measurement"
    )
    parser.add_argument("--no-filesink", action="store_true", help="skip the FileSink run of A")
    parser.add_argument("--pyflink-mode", choices=["thread", "process"], default="thread")
    parser.add_argument("--ss-rows-per-batch", type=int, default=500_000)
    parser.add_argument("--ss-text-parts", type=int, default=32)
    parser.add_argument("--out", default=os.path.join(HERE, "results.json"))
    parser.add_argument(
        "--render",
        metavar="RESULTS_JSON",
        help="print an existing results file as Markdown tables and exit",
    )
    args = parser.parse_args(argv)
    if args.render:
        with open(args.render, encoding="utf-8") as f:
            print(markdown(json.load(f)))
        return 0
    systems = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = sorted(set(systems) - set(SYSTEMS))
    if unknown:
        parser.error(f"unknown systems {unknown}; choose among {SYSTEMS}")
    if args.skip_peers:
        systems = [s for s in systems if s == "epochstream"]
    args.workloads = [w.strip().upper() for w in args.workloads.split(",") if w.strip()]
    if args.quick:
        args.b_events, args.text_mb, args.repeat = 1_000_000, 8.0, 1
    settings = {k: v for k, v in vars(args).items() if k != "out"}
    settings["systems"] = systems
    results = Results(args.out, _machine_facts(), settings)
    inputs = Inputs(args.text_mb, args.b_events)
    print(_HEADER, flush=True)
    if "epochstream" in systems:
        run_epochstream(results, args, inputs)
    run_peers(results, args, inputs, [s for s in systems if s != "epochstream"])
    add_ratios(results.rows)
    results.doc["machine"]["loadavg_end"] = os.getloadavg()
    results.save()
    print_table(results)
    print(f"\nwrote {args.out}")
    return 1 if any("error" in r for r in results.rows) else 0


if __name__ == "__main__":
    sys.exit(main())
