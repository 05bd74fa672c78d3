"""The ``epochstream`` command line: run, watch and stop jobs; look at their snapshots.

::

    epochstream run [options] JOB.py [ARGS...]     run a job script (options apply to its Environments)
    epochstream list                                running jobs of this user
    epochstream status JOB_ID [--open|--dashboard]  a job's progress once (or its dashboard, signed in)
    epochstream savepoint JOB_ID [DIR]              take a savepoint of a running job
    epochstream cancel JOB_ID [--savepoint DIR]     cancel a job, or stop it with a savepoint
    epochstream checkpoints DIR                     completed checkpoints and savepoints under DIR
    epochstream inspect DIR                         operators, states, key groups, sizes of one
    epochstream check-upgrade JOB.py -s SP          dry run: would JOB.py start from savepoint SP?

Errors are one line on stderr. Exit codes: 0 success; 1 the job failed (or a listing
found nothing, or something unreadable, or check-upgrade found the restore would fail);
2 bad usage, an unknown job or a path that does not exist.

Example::

    epochstream run --parallelism 4 --runner local wordcount.py book.txt out/
    epochstream savepoint 3f2a /data/savepoints
"""

from __future__ import annotations

import argparse
import sys

from epochstream.cli.check_upgrade import add_check_upgrade_command
from epochstream.cli.jobs import add_job_commands
from epochstream.cli.progress import add_status_command
from epochstream.cli.run import add_run_command
from epochstream.cli.snapshots import add_snapshot_commands

__all__ = ["main"]

_EXAMPLES = """\
examples:
  epochstream run job.py                       run job.py as written
  epochstream run -p 4 --master spark://h:7077 job.py in/ out/
                                               parallelism 4 on a Spark cluster; in/ out/ go to the script
  epochstream run --supervise --checkpoint-dir /ckpt job.py
                                               restart the driver if it dies, resuming from its checkpoints
  epochstream run --from-savepoint /sp/savepoint-3f2a9c-1b2c job.py
                                               a new version of a job, from a savepoint
  epochstream list                             running jobs: id, name, state, endpoint
  epochstream status 3f2a                      records/s, last checkpoint, restarts, backpressure
  epochstream savepoint 3f2a /sp               take a savepoint of job 3f2a... into /sp
  epochstream cancel 3f2a --savepoint /sp      stop job 3f2a... with a savepoint
  epochstream checkpoints /ckpt                list completed checkpoints (and unreadable ones)
  epochstream inspect /sp/savepoint-3f2a9c-1b2c
                                               operators, states, key-group coverage, sizes
  epochstream check-upgrade job.py --from-savepoint /sp/savepoint-3f2a9c-1b2c -p 4
                                               would job.py start from it? each state's verdict
"""


def _version() -> str:
    from epochstream import __version__

    return __version__


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="epochstream",
        description="Run epochstream jobs (Flink-style exactly-once streams on Spark), "
        "manage running ones, and inspect their checkpoints and savepoints.",
        epilog=_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"epochstream {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_run_command(sub)
    add_job_commands(sub)
    add_status_command(sub)
    add_snapshot_commands(sub)
    add_check_upgrade_command(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``epochstream`` console script; returns the exit code.

    Example: ``main(["checkpoints", "checkpoints"])``
    """
    ns = _parser().parse_args(argv)
    code: int = ns.handler(ns)
    return code


if __name__ == "__main__":
    sys.exit(main())
