"""Metrics overhead on workload B (keyed running sum): this tree against a base commit.

The per-batch counters cannot be switched off (they are the metrics), so the
comparison is before/after: ``--base`` is exported with ``git archive`` to a temporary
directory, and each round runs the same workload (``epochstream_jobs.run_keyed_sum``,
checkpoints every 1 s) once per tree, alternating the order, each in a fresh process.
It prints the median wall-clock rate of each tree and, steadier on a shared machine,
the median CPU seconds per million events (the driver plus its slot processes: use
the local runner, whose slots are the driver's children), with the overhead of each.
Record the figures in ``docs/benchmarks.md`` with the command.

Example::

    .venv/bin/python bench/metrics_overhead.py --base fddb306 --events 2000000 --rounds 7
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
ROOT = os.path.dirname(HERE)

_RUN = """
import json, resource, sys
sys.path.insert(0, {bench!r})
import epochstream_jobs as jobs
row = jobs.run_keyed_sum({n}, runner={runner!r}, parallelism={p}, checkpoint=1.0)
cpu = sum(r.ru_utime + r.ru_stime for r in (
    resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)))
print(json.dumps({{"rate": row["rate"], "cpu_s": cpu}}))
"""


def _export(commit: str, into: str) -> str:
    archive = subprocess.run(
        ["git", "-C", ROOT, "archive", commit, "src"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", into], input=archive, check=True)
    return os.path.join(into, "src")


def _measure(src: str, args: argparse.Namespace) -> tuple[float, float]:
    """(events/s, CPU seconds per million events) of one run."""
    code = _RUN.format(bench=HERE, n=args.events, runner=args.runner, p=args.parallelism)
    env = {**os.environ, "PYTHONPATH": src, "SPARK_LOCAL_IP": "127.0.0.1"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True
    ).stdout
    row = json.loads(out.strip().splitlines()[-1])
    return float(row["rate"]), float(row["cpu_s"]) / args.events * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base", required=True, help="commit without the metrics")
    parser.add_argument("--events", type=int, default=2_000_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--runner", choices=["local", "spark"], default="local")
    parser.add_argument("--parallelism", type=int, default=2)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="epochstream-base-") as tmp:
        trees = {"base": _export(args.base, tmp), "metrics": os.path.join(ROOT, "src")}
        rates: dict[str, list[float]] = {name: [] for name in trees}
        cpu: dict[str, list[float]] = {name: [] for name in trees}
        for round_no in range(args.rounds):
            order = list(trees) if round_no % 2 == 0 else list(reversed(trees))
            for name in order:
                rate, cpu_per_million = _measure(trees[name], args)
                rates[name].append(rate)
                cpu[name].append(cpu_per_million)
            shown = [f"{n} {rates[n][-1]:,.0f}/s {cpu[n][-1]:.3f} cpu-s/M" for n in trees]
            print(f"round {round_no + 1}: " + ", ".join(shown), flush=True)
    base, metrics = (statistics.median(rates[n]) for n in trees)
    print(f"median events/s: base {base:,.0f}, metrics {metrics:,.0f}")
    print(f"wall-clock overhead: {(base - metrics) / base * 100:+.2f} %")
    base_cpu, metrics_cpu = (statistics.median(cpu[n]) for n in trees)
    print(f"median CPU s per million events: base {base_cpu:.3f}, metrics {metrics_cpu:.3f}")
    print(f"CPU overhead: {(metrics_cpu - base_cpu) / base_cpu * 100:+.2f} % (negative: less)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
