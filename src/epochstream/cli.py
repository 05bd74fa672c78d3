"""The ``epochstream`` command line.

::

    epochstream run [--parallelism N] [--runner spark|local] [--master URL]
                    [--checkpoint-dir D] [--restore-from PATH] JOB.py [ARGS...]
    epochstream checkpoints DIR

``run`` executes the script with those settings applied to every Environment it
creates (as ``flink run -p`` does); options come before the script, the script's
own arguments after it (as with ``spark-submit``). ``checkpoints`` lists the
completed checkpoints under DIR (a storage root, a job directory or one ``chk-n``).

Example::

    epochstream run --parallelism 4 --runner local wordcount.py book.txt out/
    epochstream checkpoints /tmp/ckpt
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import os
import runpy
import sys

from epochstream.api.environment import set_overrides
from epochstream.checkpoint.storage import find_completed_checkpoints
from epochstream.exceptions import EpochstreamError

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="epochstream", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a job script with settings applied to its Environments")
    run.add_argument("--parallelism", "-p", type=int, help="parallelism of every Environment")
    run.add_argument("--runner", choices=("spark", "local"), help="where slots run")
    run.add_argument("--master", help="Spark master URL, e.g. local[4] or spark://host:7077")
    run.add_argument(
        "--checkpoint-dir", help="checkpoint storage root (when the job enables checkpointing)"
    )
    run.add_argument(
        "--restore-from",
        "-s",
        metavar="PATH",
        help="start from a completed checkpoint (chk-<n> dir, _metadata, or a dir holding them)",
    )
    run.add_argument("--log-level", default="WARNING", help="Python log level (default WARNING)")
    run.add_argument("script", help="the job script")
    run.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the script")
    ck = sub.add_parser("checkpoints", help="list completed checkpoints under DIR")
    ck.add_argument("dir")
    return parser


def _human(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"


def _cmd_checkpoints(directory: str) -> int:
    found = find_completed_checkpoints(directory)
    if not found:
        print(f"no completed checkpoints under {directory}")
        return 1
    print(
        f"{'job':<34} {'id':>6}  {'kind':<10} {'completed (UTC)':<20} {'size':>10} {'duration':>9}  path"
    )
    for path, md in found:
        when = dt.datetime.fromtimestamp(md.completion_time, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
        print(
            f"{md.job_id:<34} {md.checkpoint_id:>6}  {md.kind:<10} {when:<20} "
            f"{_human(md.stats.state_size):>10} {md.stats.duration * 1000:>7.0f}ms  {path}"
        )
    return 0


def _cmd_run(ns: argparse.Namespace) -> int:
    if not os.path.isfile(ns.script):
        print(f"epochstream run: no such job script: {ns.script}", file=sys.stderr)
        return 2
    if ns.parallelism is not None and ns.parallelism < 1:
        print("epochstream run: --parallelism must be >= 1", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=ns.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
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
    """Entry point of the ``epochstream`` console script."""
    ns = _parser().parse_args(argv)
    if ns.command == "checkpoints":
        return _cmd_checkpoints(ns.dir)
    return _cmd_run(ns)


if __name__ == "__main__":
    sys.exit(main())
