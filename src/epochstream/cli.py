"""The ``epochstream`` command line: run jobs and look at their checkpoints.

``run`` executes a job script with settings applied to every Environment it creates
(as ``flink run -p`` does); options come before the script, the script's own
arguments after it (as with ``spark-submit``). ``checkpoints`` lists the completed
checkpoints under a directory (a storage root, a job directory or one ``chk-n``) and
reports unreadable ones instead of failing.

Errors are one line on stderr; exit codes: 0 success, 1 the job failed (or a listing
found nothing or something unreadable), 2 bad usage or a path that does not exist.

Example::

    epochstream run --parallelism 4 --runner local wordcount.py book.txt out/
    epochstream checkpoints ~/.cache/epochstream/checkpoints
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import os
import runpy
import sys

from epochstream.api.environment import set_overrides
from epochstream.checkpoint.storage import scan_checkpoints
from epochstream.exceptions import EpochstreamError

__all__ = ["main"]

_EXAMPLES = """\
examples:
  epochstream run job.py                       run job.py as written
  epochstream run -p 4 --master spark://h:7077 job.py in/ out/
                                               parallelism 4 on a Spark cluster; in/ out/ go to the script
  epochstream run --restore-from /ckpt/JOB_ID job.py
                                               start from the newest completed checkpoint of an earlier job
  epochstream checkpoints /ckpt                list completed checkpoints (and unreadable ones)
"""
_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def _version() -> str:
    from epochstream import __version__

    return __version__


def _log_level(text: str) -> str:
    level = text.upper()
    if level not in _LOG_LEVELS:
        raise argparse.ArgumentTypeError(
            f"unknown log level {text!r} (choose from {', '.join(_LOG_LEVELS)})"
        )
    return level


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="epochstream",
        description="Run epochstream jobs (Flink-style exactly-once streams on Spark) "
        "and inspect their checkpoints.",
        epilog=_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"epochstream {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = sub.add_parser(
        "run",
        help="run a job script with settings applied to its Environments",
        description="Run JOB.py; the options apply to every Environment it creates.",
        epilog="example:\n  epochstream run -p 2 --runner local --checkpoint-dir /ckpt job.py in.txt",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument(
        "--parallelism",
        "-p",
        type=_positive_int,
        metavar="N",
        help="parallelism of every Environment",
    )
    run.add_argument("--runner", choices=("spark", "local"), help="where slots run")
    run.add_argument("--master", help="Spark master URL, e.g. local[4] or spark://host:7077")
    run.add_argument(
        "--checkpoint-dir",
        metavar="DIR",
        help="checkpoint storage root (when the job enables checkpointing)",
    )
    run.add_argument(
        "--restore-from",
        "-s",
        metavar="PATH",
        help="start from a completed checkpoint (chk-<n> dir, _metadata, or a dir holding them)",
    )
    run.add_argument(
        "--log-level",
        type=_log_level,
        default="WARNING",
        metavar="LEVEL",
        help=f"Python log level: {', '.join(_LOG_LEVELS)} (default WARNING)",
    )
    run.add_argument("script", metavar="JOB.py", help="the job script")
    run.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the script")
    ck = sub.add_parser(
        "checkpoints",
        help="list completed checkpoints under DIR",
        description="List the completed checkpoints under DIR (a storage root, a job "
        "directory or one chk-<n>); unreadable ones are reported, not fatal.",
    )
    ck.add_argument("dir", metavar="DIR")
    return parser


def _human(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"


def _fail(command: str, message: str) -> int:
    print(f"epochstream {command}: {message}", file=sys.stderr)
    return 2


def _cmd_checkpoints(directory: str) -> int:
    try:
        entries = scan_checkpoints(directory)
    except EpochstreamError as exc:
        return _fail("checkpoints", str(exc))
    if not entries:
        print(f"no completed checkpoints under {directory}")
        return 1
    print(
        f"{'job':<34} {'id':>6}  {'kind':<10} {'completed (UTC)':<20} {'size':>10} {'duration':>9}  path"
    )
    unreadable = 0
    for entry in entries:
        md = entry.metadata
        if md is None:
            unreadable += 1
            reason = (entry.error or "").splitlines()[0]
            print(
                f"{entry.job:<34} {entry.checkpoint_id:>6}  UNREADABLE {entry.directory}: {reason}"
            )
            continue
        when = dt.datetime.fromtimestamp(md.completion_time, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
        print(
            f"{md.job_id:<34} {md.checkpoint_id:>6}  {md.kind:<10} {when:<20} "
            f"{_human(md.stats.state_size):>10} {md.stats.duration * 1000:>7.0f}ms  {entry.directory}"
        )
    return 1 if unreadable else 0


def _cmd_run(ns: argparse.Namespace) -> int:
    if not os.path.isfile(ns.script):
        return _fail("run", f"no such job script: {ns.script}")
    logging.basicConfig(
        level=ns.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    set_overrides(
        parallelism=ns.parallelism,
        runner=ns.runner,
        spark_master=ns.master,
        checkpoint_dir=ns.checkpoint_dir,
        restore_from=ns.restore_from,
    )
    args = ns.args[1:] if ns.args[:1] == ["--"] else ns.args
    sys.argv = [ns.script, *args]
    script_dir = os.path.dirname(os.path.abspath(ns.script))
    if script_dir not in sys.path:
        sys.path.insert(0, script_dir)
    try:
        runpy.run_path(ns.script, run_name="__main__")
    except EpochstreamError as exc:
        print(f"epochstream run: job failed: {exc}", file=sys.stderr)
        return 1
    finally:
        set_overrides(
            parallelism=None, runner=None, spark_master=None, checkpoint_dir=None, restore_from=None
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``epochstream`` console script.

    Example: ``main(["checkpoints", "/tmp/ckpt"])`` returns the exit code.
    """
    ns = _parser().parse_args(argv)
    if ns.command == "checkpoints":
        return _cmd_checkpoints(ns.dir)
    return _cmd_run(ns)


if __name__ == "__main__":
    sys.exit(main())
