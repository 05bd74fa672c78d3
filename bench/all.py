"""Every benchmark in one run: W1 and Nexmark on epochstream and its peers.

One command measures, on this machine and in this run:

- **W1** (keyed running sum, ``i -> (i * 7919 % 100_000, i % 1000)``): epochstream's
  row path and columnar path (``bench/w1_jobs.py``, results checked against the closed
  form) with checkpoints every 1 s and off, their end-to-end latency p50/p99 at half
  the checkpointed rate (or at half of the latency job's own rate, when carrying the
  records' times makes it slower: ``w1_jobs.run_capacity``), and the recovery time
  after a SIGKILL of a slot process;
  PyFlink SQL (1 s checkpoints and off), Spark Structured Streaming (checkpoint
  location, micro-batches), Bytewax (recovery on, and off) and a plain dict loop;
  Spark SS's and Bytewax's latency p50/p99 at half their own checkpointed rate
  (``spark_ss_job.py`` / ``bytewax_job.py`` with ``--rate``: a throttled source whose
  events carry their due time; PyFlink SQL's is not measured, the table says why).
- **Nexmark** (``bench/nexmark/queries.py`` on epochstream, checkpoints 1 s and off,
  and the recovery time after a SIGKILL; the peers' versions in ``bench/peers/``:
  PyFlink SQL, Spark Structured Streaming, Bytewax, each over the files
  ``write_nexmark_files`` wrote for the same events, and each killed and restarted
  per query over larger files of ``--nexmark-peer-recovery-events``).

epochstream runs at parallelism ``--parallelism`` (2) on Spark ``local[P]``, one
SparkSession for all its jobs (``--warmup-runs`` untimed W1 jobs take the session's
warm-up first). Runs with checkpoints and without alternate.
Peers run in their own processes, installed on first use into ``/tmp/bench-venvs``
(``bench/peers/install.py``); a peer that cannot run becomes a row with the reason.
Ratios are epochstream's rate over the peer's, both with checkpoints (a peer with only
a figure without them is compared with ours without).

Peers at their best (``bench/peer_profiles.py``): a peer whose own benchmark suite
publishes a tuning runs its throughput jobs twice per setting, untuned then tuned
(PyFlink SQL: Flink's Nexmark ``config.yaml``, mini-batches and the distinct-aggregation
split); the table quotes the better of the two in the ratio and shows both. The latency
and recovery runs stay untuned. Every peer's rows carry the handicap it has here that
the harness cannot remove (PyFlink reads CSV, Spark SS micro-batches, Bytewax one
worker), printed beside its figures. q15-q17 run on PyFlink SQL only (rows of the
others say why).

Output (rewritten after every measurement, so an interrupted run keeps what it has):
``<out-dir>/<name>.json`` (machine, command, date, every measurement),
``<name>.md`` (the table) and ``<name>.png`` (throughput per system; matplotlib runs
in its own venv like the peers). ``<name>`` is ``all``, or ``quick`` with ``--quick``.

Example::

    .venv/bin/python bench/all.py                         # everything (about 50 minutes)
    .venv/bin/python bench/all.py --quick                 # smoke run, under 3 minutes
    .venv/bin/python bench/all.py --only epochstream,pyflink --queries q0,q5
    .venv/bin/python bench/all.py --workloads nexmark --only spark-ss
    .venv/bin/python bench/all.py --render bench/results/all.json
"""

from __future__ import annotations

import os

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

import argparse
import compileall
import json
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "peers"))

from install import PEERS, java_home, venv_root  # noqa: E402
from machine import machine_facts  # noqa: E402
from measure import DATA_DIR, Results, measure, nexmark_files  # noqa: E402
from ours import run_epochstream  # noqa: E402
from peer_profiles import PROFILES, variants  # noqa: E402
from peer_recovery import kill_and_restart  # noqa: E402
from report import markdown, merge_documents  # noqa: E402
from workloads import ensure_sequence_csv  # noqa: E402

SYSTEMS = ("epochstream", "pyflink", "spark-ss", "bytewax", "dictloop")
WORKLOADS = ("W1", "nexmark")
# q15-q17 (Flink's distinct and filtered aggregations) run on PyFlink SQL only, for its
# tuned against untuned figures: no other system here has them written.
ALL_QUERIES = ("q0", "q1", "q2", "q3", "q4", "q5", "q7", "q8", "q11", "q12", "q15", "q16", "q17")
QUICK_QUERIES = ("q1",)
PEER_TIMEOUT_S = 900.0
# Bytewax gets a share of W1's events so that one run stays near 20 s; rates are per
# event. PyFlink gets them all: on 1 M its job's own start held its rate at half of
# its steady rate (0.27 against 0.52 M/s, 2026-11-26).
W1_SHARE = {"bytewax": 0.2}


# ------------------------------------------------------------------ peers


def _peer_command(peer_name: str, script: str, argv: list[str]) -> list[str]:
    """The command running ``script`` in the peer's interpreter (installed on first use)."""
    return [PEERS[peer_name].ensure(), os.path.join(HERE, "peers", script), *argv]


def _run_peer(
    peer_name: str, script: str, argv: list[str], log_name: str, *, throughput: bool = True
) -> dict[str, Any]:
    """Run a peer's script in its interpreter; its JSON line, or an error naming the log.
    A ``throughput`` run's line gets its ``rate`` (events over the job's time)."""
    peer = PEERS[peer_name]
    cmd = _peer_command(peer_name, script, argv)
    log_path = os.path.join(venv_root(), f"{log_name}.log")
    with open(log_path, "w", encoding="utf-8") as log:
        done = subprocess.run(
            cmd,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env=peer.environment(),
            timeout=PEER_TIMEOUT_S,
            check=False,
        )
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = done.stdout.strip().splitlines()[-1:] or [""]
        raise RuntimeError(
            f"{peer_name} {script} exited {done.returncode} {tail[0][:200]!r}; see {log_path}"
        )
    out: dict[str, Any] = json.loads(lines[-1])
    if throughput:
        # PyFlink's wall time includes starting its MiniCluster (the analogue of the
        # SparkSession, which epochstream's figures leave out): its job's own net runtime
        # is the comparable time.
        out["rate"] = out["events"] / out.get("net_seconds", out["seconds"])
    if peer.install_seconds is not None:
        out["install_seconds"] = peer.install_seconds
        peer.install_seconds = None
    return out


def _peer_w1(results: Results, args: argparse.Namespace, system: str) -> None:
    n = int(args.w1_events * W1_SHARE.get(system, 1.0))
    p = str(args.parallelism)
    runs: list[tuple[str, str, str, list[str]]] = []  # label, checkpoints, script, argv
    if system == "pyflink":
        seq = ensure_sequence_csv(os.path.join(DATA_DIR, f"seq-{n}-4"), n, 4)
        label = f"PyFlink 2.3 SQL (p={p})"
        for ck in args.peer_checkpoints:
            argv = ["W1", "--path", seq, "--n", str(n), "--checkpoint", ck, "--parallelism", p]
            runs.append((label, "1 s" if ck == "1" else "off", "pyflink_sql_job.py", argv))
    elif system == "spark-ss":
        argv = ["B", "--n", str(n), "--rows-per-batch", str(args.ss_rows_per_batch)]
        runs.append(
            (
                f"Spark Structured Streaming (local[{p}])",
                "micro-batch",
                "spark_ss_job.py",
                [*argv, "--parallelism", p],
            )
        )
    elif system == "bytewax":
        for ck in args.peer_checkpoints:
            runs.append(
                (
                    "Bytewax 0.21 (1 worker)",
                    "1 s" if ck == "1" else "off",
                    "bytewax_job.py",
                    ["B", "--n", str(n), "--checkpoint", ck],
                )
            )
    elif system == "dictloop":
        runs.append(("dict loop (1 core)", "off", "dictloop_job.py", ["B", "--n", str(n)]))
    rate_on: float | None = None
    for label, ck, script, argv in runs:
        base = {"workload": "W1", "system": label, "checkpoints": ck}
        for rate in _measure_tunings(results, system, script, argv, base, f"W1-{ck}"):
            if ck != "off":
                rate_on = max(rate_on or 0.0, rate)
    if system != "dictloop" and not args.no_latency:
        _peer_w1_latency(results, args, system, runs[0][0], rate_on)
    if system != "dictloop" and not args.no_recovery:
        _peer_w1_recovery(results, args, system, runs[0][0])


def _measure_tunings(
    results: Results,
    system: str,
    script: str,
    argv: list[str],
    base: dict[str, Any],
    log: str,
) -> list[float]:
    """One row per variant of ``system`` (``peer_profiles.variants``: untuned, then its
    published tuning if it has one) of ``script argv``, each row carrying its tuning and
    the peer's handicap; the rates measured. Callers loop over the checkpoint settings
    outside, so tuned and untuned runs alternate."""
    profile = PROFILES.get(system)
    extra: dict[str, Any] = {}
    if profile is not None:
        extra["handicap"] = profile.handicap
        if profile.always:
            extra["settings"] = profile.always
    tunings = variants(system)
    rates = []
    for tuning, tuning_argv in tunings:
        row_base = {**base, **extra}
        if len(tunings) > 1:
            row_base["tuning"] = tuning
        log_name = f"{system}-{log}-{tuning.split(':')[0]}".replace(" ", "")
        run_argv = [*argv, *tuning_argv]
        row = measure(
            results,
            "rows",
            row_base,
            lambda a=run_argv, log_name=log_name: _run_peer(system, script, a, log_name),
        )
        if "rate" in row:
            rates.append(row["rate"])
    return rates


def _start_peer(
    peer_name: str, script: str, argv: list[str], log_name: str
) -> subprocess.Popen[bytes]:
    """Start a peer's script in a session of its own (so that a SIGKILL of the group
    takes its JVM too), its output appended to the log."""
    with open(os.path.join(venv_root(), f"{log_name}.log"), "ab") as log:
        return subprocess.Popen(
            _peer_command(peer_name, script, argv),
            stdout=log,
            stderr=log,
            env=PEERS[peer_name].environment(),
            start_new_session=True,
        )


def _peer_w1_recovery(results: Results, args: argparse.Namespace, system: str, label: str) -> None:
    """W1's recovery time on a peer: its process group SIGKILLed after ``--kill-after``
    s of output, started again at once from its checkpoints (``peer_recovery.py``)."""
    p = str(args.parallelism)
    if system == "pyflink":
        n = args.pyflink_recovery_events
        seq = ensure_sequence_csv(os.path.join(DATA_DIR, f"seq-{n}-4"), n, 4)
        script = "pyflink_sql_job.py"
        argv = ["W1", "--path", seq, "--n", str(n), "--checkpoint", "1", "--parallelism", p]
    elif system == "spark-ss":
        script = "spark_ss_job.py"
        argv = ["B", "--rows-per-batch", str(args.ss_rows_per_batch), "--parallelism", p]
        argv += ["--seconds", str(PEER_TIMEOUT_S)]
    else:
        # The source is a lazy range, resumed by skipping to its snapshot's position.
        script = "bytewax_job.py"
        argv = ["B", "--n", str(10**10), "--checkpoint", "1"]
    _measure_peer_recovery(results, args, system, script, argv, {"workload": "W1", "system": label})


# Where each peer keeps what a restarted process resumes from.
_KEPT_STATE = {
    "pyflink": "--checkpoint-dir",
    "spark-ss": "--checkpoint-dir",
    "bytewax": "--recovery-dir",
}


def _measure_peer_recovery(
    results: Results,
    args: argparse.Namespace,
    system: str,
    script: str,
    argv: list[str],
    base: dict[str, Any],
) -> None:
    """One recovery figure: ``script argv`` SIGKILLed with its process group after
    ``--kill-after`` s of output, then started again at once (``peer_recovery.py``),
    both attempts with one probe and one directory of kept state, removed after."""
    state = tempfile.mkdtemp(prefix=f"{system}-recovery-")
    probe = os.path.join(state, "probe")
    argv = [*argv, _KEPT_STATE[system], os.path.join(state, "state")]
    log = f"{system}-{base['workload'].replace(' ', '-')}-recovery"

    def start(attempt: int) -> subprocess.Popen[bytes]:
        more = ["--probe", probe, "--attempt", str(attempt)]
        return _start_peer(system, script, [*argv, *more], f"{log}-{attempt}")

    try:
        measure(
            results,
            "recovery",
            {**base, "restart": "process restarted at once"},
            lambda: kill_and_restart(
                start,
                probe,
                what=f"{base['system']} {base['workload']}",
                kill_after=args.kill_after,
                timeout=args.recovery_timeout,
            ),
        )
    finally:
        shutil.rmtree(state, ignore_errors=True)


# Why PyFlink SQL has no W1 latency figure (shown in the table's notes).
PYFLINK_LATENCY_GAP = (
    "not measured: of Flink SQL's built-in sinks, those taking the running sum's updates "
    "(blackhole, print) cannot report when each result was emitted, and the W1 job reads "
    "files, not a throttled source; a Python UDF or collecting the results to the client "
    "would change the job measured"
)


def _peer_w1_latency(
    results: Results, args: argparse.Namespace, system: str, label: str, rate_on: float | None
) -> None:
    """W1's end-to-end latency on a peer at half its checkpointed W1 rate, with its
    checkpoints or recovery as in that run: Spark SS micro-batches on the ``rate`` source,
    Bytewax with 1 s snapshots (the scripts' docstrings say what exactly is measured)."""
    base = {"workload": "W1", "system": label}
    if system == "pyflink":
        results.add("latency", {**base, "error": PYFLINK_LATENCY_GAP})
        return
    if rate_on is None:
        results.add("latency", {**base, "error": "no checkpointed rate to take half of"})
        return
    p, batch = str(args.parallelism), str(args.ss_rows_per_batch)  # batch: Spark's warm-up job
    script, argv = {
        "spark-ss": ("spark_ss_job.py", ["B", "--parallelism", p, "--rows-per-batch", batch]),
        "bytewax": ("bytewax_job.py", ["B", "--checkpoint", "1"]),
    }[system]
    argv = [*argv, "--rate", f"{rate_on / 2:.0f}", "--seconds", str(args.latency_seconds)]
    measure(
        results,
        "latency",
        {**base, "throughput_rate": rate_on},
        lambda: _run_peer(system, script, argv, f"{system}-W1-latency", throughput=False),
    )


# Which peer has which query, and why not (shown in the table instead of a figure).
SPARK_MISSING = {
    "q4": "not expressible (chained non-window aggregations; no retractions)",
    "q15": "not expressible (COUNT(DISTINCT) is not supported on streaming DataFrames)",
    "q16": "not expressible (COUNT(DISTINCT) is not supported on streaming DataFrames)",
    "q17": "not written (see spark_ss_nexmark.py)",
}
BYTEWAX_QUERIES = ("q0", "q1", "q2", "q3", "q7", "q11", "q12")


# The peers' Nexmark jobs: label, script, and the arguments of one query's run.
NEXMARK_PEERS = {
    "pyflink": ("PyFlink 2.3 SQL (p={p})", "pyflink_sql_job.py"),
    "spark-ss": ("Spark Structured Streaming (local[{p}])", "spark_ss_nexmark.py"),
    "bytewax": ("Bytewax 0.21 (1 worker)", "bytewax_nexmark.py"),
}


def _nexmark_argv(system: str, args: argparse.Namespace, q: str, path: str) -> list[str]:
    """Arguments of ``system``'s Nexmark script for query ``q`` over the files in ``path``
    (without the checkpoint setting, which PyFlink and Bytewax take per run)."""
    p = str(args.parallelism)
    if system == "pyflink":
        return ["nexmark", "--path", path, "--query", q, "--parallelism", p]
    if system == "spark-ss":
        return ["--path", path, "--query", q, "--parallelism", p]
    return ["--path", path, "--query", q]


def _peer_missing(system: str, q: str) -> str | None:
    """Why ``system`` has no job for query ``q``, or None."""
    if system == "spark-ss":
        return SPARK_MISSING.get(q)
    if system == "bytewax" and q not in BYTEWAX_QUERIES:
        return "not written (see bytewax_nexmark.py)"
    return None


def _peer_nexmark(
    results: Results, args: argparse.Namespace, system: str, path: str, recovery_path: str
) -> None:
    label, script = NEXMARK_PEERS[system]
    label = label.format(p=args.parallelism)
    for q in args.queries:
        workload = f"nexmark {q}"
        missing = _peer_missing(system, q)
        argv = _nexmark_argv(system, args, q, path)
        # Spark's micro-batches commit to its checkpoint location: one run, no setting.
        settings = ("micro-batch",) if system == "spark-ss" else args.peer_checkpoints
        for ck in settings:
            base = {
                "workload": workload,
                "system": label,
                "checkpoints": {"1": "1 s", "0": "off"}.get(ck, ck),
            }
            if missing is not None:
                if ck != "0":
                    results.add("rows", {**base, "error": missing})
                continue
            run_argv = argv if ck == "micro-batch" else [*argv, "--checkpoint", ck]
            _measure_tunings(results, system, script, run_argv, base, f"{q}-{ck}")
        if missing is None and not args.no_recovery:
            _peer_nexmark_recovery(results, args, system, q, recovery_path)


def _peer_nexmark_recovery(
    results: Results, args: argparse.Namespace, system: str, q: str, path: str
) -> None:
    """Query ``q``'s recovery time on a peer, over the larger files of
    ``--nexmark-peer-recovery-events`` (a peer must still be reading after the kill
    and its restart), with checkpoints every 1 s (Spark: every micro-batch)."""
    label, script = NEXMARK_PEERS[system]
    argv = _nexmark_argv(system, args, q, path)
    if system == "spark-ss":
        # Parts of about 125 k events: micro-batches as long as in the throughput runs.
        argv += ["--parts", str(max(8, args.nexmark_peer_recovery_events // 125_000))]
    else:
        argv += ["--checkpoint", "1"]
    base = {"workload": f"nexmark {q}", "system": label.format(p=args.parallelism)}
    _measure_peer_recovery(results, args, system, script, argv, base)


def run_peers(results: Results, args: argparse.Namespace, systems: list[str]) -> None:
    """W1 and the Nexmark queries on every selected peer."""
    path = recovery_path = ""
    if "nexmark" in args.workloads and any(s != "dictloop" for s in systems):
        path = nexmark_files(args)
        if not args.no_recovery:
            recovery_path = nexmark_files(args, events=args.nexmark_peer_recovery_events)
    for system in systems:
        if "W1" in args.workloads:
            _peer_w1(results, args, system)
        if "nexmark" in args.workloads and system != "dictloop":
            _peer_nexmark(results, args, system, path, recovery_path)


# ------------------------------------------------------------------ plot


def plot(results: Results) -> None:
    """The PNG, drawn by ``plot_results.py`` in the plot venv (matplotlib)."""
    try:
        out = _run_peer(
            "plot",
            "plot_results.py",
            [results.json_path, results.png_path],
            "plot",
        )
        results.doc["plot"] = out.get("png", results.png_path)
    except Exception as exc:  # the table stands without the picture
        results.doc["plot_error"] = f"{type(exc).__name__}: {exc}"
    results.save()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="smoke run (< 3 minutes)")
    parser.add_argument("--only", default=",".join(SYSTEMS), help=f"among {','.join(SYSTEMS)}")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="W1, nexmark")
    parser.add_argument(
        "--queries", default=None, help=f"Nexmark queries (default all: {','.join(ALL_QUERIES)})"
    )
    parser.add_argument("--w1-events", type=int, default=10_000_000)
    parser.add_argument(
        "--w1-columnar-events", type=int, default=100_000_000, help="W1 on the columnar path"
    )
    parser.add_argument("--nexmark-events", type=int, default=1_000_000)
    parser.add_argument(
        "--nexmark-recovery-events",
        type=int,
        # q2 and q3 on rows read 20 M in about 12 s since 2026-11-26: the input ran out
        # around the kill.
        default=200_000_000,
        help="events of a Nexmark recovery run (it is cancelled once recovered)",
    )
    parser.add_argument(
        "--nexmark-peer-recovery-events",
        type=int,
        # Bytewax reads q3's files at 1.4-1.8 M events/s: 8 s before the kill, its
        # restart and the seconds after must not run out of input.
        default=30_000_000,
        help="events of the files the peers' Nexmark recovery runs read",
    )
    parser.add_argument(
        "--nexmark-source",
        choices=["files", "generator"],
        default="files",
        help="epochstream's Nexmark input: the peers' files (default) or its own generator",
    )
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument(
        "--repeat", type=int, default=3, help="runs per epochstream figure (median)"
    )
    parser.add_argument(
        "--warmup-runs", type=int, default=2, help="untimed W1 row jobs before measuring"
    )
    parser.add_argument("--warmup-events", type=int, default=5_000_000)
    parser.add_argument("--latency-seconds", type=float, default=20.0, help="W1 latency runs")
    parser.add_argument(
        "--nexmark-latency-seconds", type=float, default=20.0, help="Nexmark latency runs"
    )
    parser.add_argument(
        "--kill-after", type=float, default=8.0, help="seconds of output before the kill"
    )
    parser.add_argument(
        "--recovery-timeout",
        type=float,
        default=120.0,
        help="seconds after the kill to wait for 90 %% of the throughput",
    )
    parser.add_argument(
        "--pyflink-recovery-events",
        type=int,
        default=30_000_000,
        help="W1 events in PyFlink's recovery run (files; it is killed once recovered)",
    )
    parser.add_argument("--no-latency", action="store_true")
    parser.add_argument("--no-recovery", action="store_true")
    parser.add_argument("--ss-rows-per-batch", type=int, default=500_000)
    parser.add_argument("--out-dir", default=os.path.join(HERE, "results"))
    parser.add_argument("--render", metavar="JSON", help="print a results file's table and exit")
    parser.add_argument(
        "--merge",
        nargs="+",
        metavar="JSON",
        help="combine the results of runs made in parts (e.g. per system) into "
        "<out-dir>/all.{json,md,png} and exit",
    )
    args = parser.parse_args(argv)
    if args.render:
        with open(args.render, encoding="utf-8") as f:
            print(markdown(json.load(f)), end="")
        return 0
    if args.merge:
        merged = merge_documents(args.merge)
        results = Results(args.out_dir, "all", merged)
        results.save()
        plot(results)
        print(markdown(results.doc), end="")
        return 0
    # Every job starts fresh slot processes that import epochstream: with bytecode
    # writes off (PYTHONDONTWRITEBYTECODE) each would compile it again, inside the figures.
    compileall.compile_dir(os.path.join(os.path.dirname(HERE), "src"), quiet=1)
    systems = [s.strip() for s in args.only.split(",") if s.strip()]
    args.workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    queries = args.queries or ",".join(QUICK_QUERIES if args.quick else ALL_QUERIES)
    args.queries = [q.strip() for q in queries.split(",") if q.strip()]
    for name, given, allowed in (
        ("systems", systems, SYSTEMS),
        ("workloads", args.workloads, WORKLOADS),
        ("queries", args.queries, ALL_QUERIES),
    ):
        unknown = sorted(set(given) - set(allowed))
        if unknown:
            parser.error(f"unknown {name} {unknown}; choose among {', '.join(allowed)}")
    if args.quick:
        args.w1_events = min(args.w1_events, 300_000)
        args.w1_columnar_events = min(args.w1_columnar_events, 3_000_000)
        args.nexmark_events = min(args.nexmark_events, 50_000)
        args.nexmark_recovery_events = min(args.nexmark_recovery_events, 2_000_000)
        args.pyflink_recovery_events = min(args.pyflink_recovery_events, 3_000_000)
        args.nexmark_peer_recovery_events = min(args.nexmark_peer_recovery_events, 3_000_000)
        args.repeat = 1
        args.warmup_runs = min(args.warmup_runs, 1)
        args.warmup_events = min(args.warmup_events, 300_000)
        args.latency_seconds = min(args.latency_seconds, 3.0)
        args.nexmark_latency_seconds = min(args.nexmark_latency_seconds, 3.0)
        args.kill_after = min(args.kill_after, 3.0)
        args.recovery_timeout = min(args.recovery_timeout, 30.0)
        args.ss_rows_per_batch = min(args.ss_rows_per_batch, 100_000)
    # A smoke run starts each peer once: with checkpoints (each start costs a JVM).
    args.peer_checkpoints = ("1",) if args.quick else ("1", "0")
    name = "quick" if args.quick else "all"
    machine = machine_facts(spark=True)
    machine["java_home"] = java_home()
    machine["peer_requirements"] = {k: p.requirement for k, p in PEERS.items() if p.requirement}
    peer_tunings = {k: p.tuning.describe() for k, p in PROFILES.items() if p.tuning is not None}
    doc: dict[str, Any] = {
        "machine": machine,
        "command": shlex.join([sys.executable, *sys.argv]),
        "settings": {k: v for k, v in vars(args).items() if k not in ("out_dir", "render")},
        "rows": [],
        "latency": [],
        "recovery": [],
    }
    doc["settings"]["systems"] = systems
    doc["settings"]["peer_tunings"] = peer_tunings
    results = Results(args.out_dir, name, doc)
    started = time.monotonic()
    if "epochstream" in systems:
        run_epochstream(results, args)
    run_peers(results, args, [s for s in systems if s != "epochstream"])
    doc["machine"]["loadavg_end"] = os.getloadavg()
    doc["settings"]["wall_seconds"] = time.monotonic() - started
    plot(results)
    print()
    print(markdown(doc))
    print(f"wrote {results.json_path}, {results.md_path}, {results.png_path}")
    failed = [r for sec in ("rows", "latency", "recovery") for r in doc[sec] if "error" in r]
    return 1 if failed and not all(_expected_gap(r) for r in failed) else 0


def _expected_gap(row: dict[str, Any]) -> bool:
    """A query a peer cannot express, or a figure it cannot give, is a documented gap,
    not a failed run."""
    gaps = ("not expressible", "not written", "not measured")
    return str(row.get("error", "")).startswith(gaps)


if __name__ == "__main__":
    sys.exit(main())
