"""``epochstream run``: run a job script, optionally resumed or supervised.

The options apply to every Environment the script creates (as ``flink run -p`` does);
options come before the script, the script's own arguments after it (as with
``spark-submit``).

``--resume`` starts the job from the newest completed checkpoint of the newest earlier
run of a job with the same name under its checkpoint storage: how a job whose driver
died carries on. ``--supervise`` runs the driver as a child process (in its own
process group) and, when it dies from a signal or an unexpected exit code, starts it
again with ``--resume``, up to ``--max-driver-restarts`` times with a growing delay:
on one machine, what Flink's JobManager high availability does. A finished (0),
failed (1) or misused (2) run is not restarted; a driver whose Spark context died
exits with 3 and is.

Example::

    epochstream run --supervise --checkpoint-dir /ckpt --runner local job.py in.txt out/
"""

from __future__ import annotations

import argparse
import logging
import os
import runpy
import signal
import subprocess
import sys
import time
from typing import Any

from epochstream.api.environment import set_overrides
from epochstream.cli.common import fail, int_at_least, positive_int, prepare_script
from epochstream.cli.progress import ProgressReporter
from epochstream.cli.snapshots import add_trust_flag
from epochstream.core.clock import SystemClock
from epochstream.deploy.runners import RunnerLost
from epochstream.exceptions import EpochstreamError, JobCancelled

__all__ = ["LOST", "add_run_command", "supervise"]

_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
#: Exit codes of a driver that ended on purpose: finished, job failed, bad usage.
_DELIBERATE = (0, 1, 2)
#: Exit code of a driver whose Spark context died under it (a supervisor restarts it).
LOST = 3
_MAX_DELAY = 30.0


def _log_level(text: str) -> str:
    level = text.upper()
    if level not in _LOG_LEVELS:
        raise argparse.ArgumentTypeError(
            f"unknown log level {text!r} (choose from {', '.join(_LOG_LEVELS)})"
        )
    return level


def add_run_command(sub: Any) -> None:
    """Register ``run`` on the subcommand parser ``sub``."""
    run = sub.add_parser(
        "run",
        help="run a job script with settings applied to its Environments",
        description="Run JOB.py; the options apply to every Environment it creates.",
        epilog="examples:\n"
        "  epochstream run -p 2 --runner local --checkpoint-dir /ckpt job.py in.txt\n"
        "  epochstream run --from-savepoint /sp/savepoint-3f2a9c-1b2c job.py\n"
        "  epochstream run --supervise --checkpoint-dir /ckpt job.py",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument(
        "--parallelism",
        "-p",
        type=positive_int,
        metavar="N",
        help="parallelism of every Environment",
    )
    run.add_argument("--runner", choices=("spark", "local"), help="where slots run")
    run.add_argument("--master", help="Spark master URL, e.g. local[4] or spark://host:7077")
    run.add_argument(
        "--checkpoint-dir",
        metavar="DIR",
        help="checkpoint storage root, a path or s3://bucket/prefix (when the job checkpoints)",
    )
    start = run.add_mutually_exclusive_group()
    start.add_argument(
        "--from-savepoint",
        "-s",
        metavar="PATH",
        help="start from a savepoint (or a completed checkpoint: chk-<n>, _metadata, a dir of them)",
    )
    start.add_argument("--restore-from", metavar="PATH", help=argparse.SUPPRESS)
    start.add_argument(
        "--resume",
        action="store_true",
        help="continue from the newest checkpoint of the newest earlier run of this job",
    )
    run.add_argument(
        "--allow-non-restored-state",
        action="store_true",
        help="drop state of operators the job no longer has (with --from-savepoint)",
    )
    run.add_argument(
        "--supervise",
        action="store_true",
        help="restart the driver with --resume when it dies (one-machine high availability)",
    )
    run.add_argument(
        "--max-driver-restarts",
        type=int_at_least(0),
        default=10,
        metavar="N",
        help="with --supervise: give up after N driver restarts (default 10)",
    )
    add_trust_flag(run)
    run.add_argument(
        "--log-level",
        type=_log_level,
        default="WARNING",
        metavar="LEVEL",
        help=f"Python log level: {', '.join(_LOG_LEVELS)} (default WARNING)",
    )
    run.add_argument(
        "--quiet",
        "-q",
        action="store_true",
        help="no progress on stderr (a status line on a terminal, plain lines otherwise)",
    )
    run.add_argument("script", metavar="JOB.py", help="the job script")
    run.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the script")
    run.set_defaults(handler=_cmd_run)


def _cmd_run(ns: argparse.Namespace) -> int:
    if not os.path.isfile(ns.script):
        return fail("run", f"no such job script: {ns.script}")
    if ns.supervise:
        return supervise(_child_arguments(ns), ns.max_driver_restarts)
    logging.basicConfig(
        level=ns.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    set_overrides(
        parallelism=ns.parallelism,
        runner=ns.runner,
        spark_master=ns.master,
        checkpoint_dir=ns.checkpoint_dir,
        restore_from=ns.from_savepoint or ns.restore_from,
        allow_non_restored_state=ns.allow_non_restored_state or None,
        resume=ns.resume or None,
        trust_shared_storage=ns.trust_shared_storage or None,
    )
    problem = prepare_script(ns.script, ns.args)
    if problem is not None:
        return fail("run", problem)
    reporter = None if ns.quiet else ProgressReporter(sys.stderr, clock=SystemClock())
    if reporter is not None:
        reporter.start()
    try:
        runpy.run_path(ns.script, run_name="__main__")
    except JobCancelled as exc:
        print(f"epochstream run: {exc}", file=sys.stderr)
        return 0  # cancelled (or stopped with a savepoint) on purpose
    except EpochstreamError as exc:
        print(f"epochstream run: job failed: {exc}", file=sys.stderr)
        # A lost Spark context is the driver's death, not the job's: a supervisor resumes.
        return LOST if isinstance(exc.__cause__, RunnerLost) else 1
    finally:
        if reporter is not None:
            reporter.stop()
        set_overrides(
            parallelism=None,
            runner=None,
            spark_master=None,
            checkpoint_dir=None,
            restore_from=None,
            allow_non_restored_state=None,
            resume=None,
            trust_shared_storage=None,
        )
    return 0


def _child_arguments(ns: argparse.Namespace) -> list[str]:
    """The ``run`` arguments of the supervised driver: the same, always with --resume."""
    argv = ["run", "--resume", "--log-level", ns.log_level]
    for flag, value in (
        ("--parallelism", ns.parallelism),
        ("--runner", ns.runner),
        ("--master", ns.master),
        ("--checkpoint-dir", ns.checkpoint_dir),
    ):
        if value is not None:
            argv += [flag, str(value)]
    if ns.allow_non_restored_state:
        argv.append("--allow-non-restored-state")
    if ns.quiet:
        argv.append("--quiet")
    if ns.trust_shared_storage:
        argv.append("--trust-shared-storage")
    return [*argv, ns.script, *ns.args]


def _describe(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def supervise(child_args: list[str], max_restarts: int, *, first_delay: float = 1.0) -> int:
    """Run the driver ``python -m epochstream.cli <child_args>`` until it ends on purpose.

    Example: ``supervise(["run", "--resume", "job.py"], max_restarts=5)``
    """
    restarts, delay = 0, first_delay
    child: subprocess.Popen[bytes] | None = None

    def forward(signum: int, _frame: Any) -> None:
        if child is not None and child.poll() is None:
            os.killpg(child.pid, signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        while True:
            child = subprocess.Popen(
                [sys.executable, "-m", "epochstream.cli", *child_args], start_new_session=True
            )
            print(
                f"epochstream run: supervising driver pid {child.pid}", file=sys.stderr, flush=True
            )
            code = child.wait()
            _kill_group(child.pid)  # the driver's Spark JVM or slot processes, if any survived
            if code in _DELIBERATE:
                return code
            if restarts >= max_restarts:
                return fail(
                    "run", f"driver {_describe(code)}; {restarts} restarts used, giving up", 1
                )
            restarts += 1
            print(
                f"epochstream run: driver {_describe(code)}; restarting it with --resume in "
                f"{delay:.1f} s (restart {restarts} of {max_restarts})",
                file=sys.stderr,
                flush=True,
            )
            time.sleep(delay)
            delay = min(delay * 2, _MAX_DELAY)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        return  # nothing of the driver's group is left
