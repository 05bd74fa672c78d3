"""Entry point of a local-runner slot process: ``python -m epochstream.deploy.localslot INDEX HOST``.

The launch description (job master address and job secret) arrives pickled on
standard input, never on the command line where other users could read it.

Example::

    python -m epochstream.deploy.localslot 0 127.0.0.1 < launch.pickle
"""

from __future__ import annotations

import pickle
import signal
import sys

from epochstream.runtime.slot import SlotLaunch, run_slot


def main(argv: list[str]) -> int:
    """Run one slot; exit code 0 when the job master finished or cancelled it."""
    # No handler of its own: while the slot runs its records go to the driver's log
    # (runtime.slotlogs); before that, logging's last resort prints warnings to stderr.
    # A terminal's Ctrl-C reaches the driver's whole process group; the driver decides
    # what it means (a savepoint, a cancel), as on Spark, where slots never see it. A
    # slot still ends when its driver does: it loses the job master's connection.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    index, host = int(argv[1]), argv[2]
    launch = pickle.loads(sys.stdin.buffer.read())
    if not isinstance(launch, SlotLaunch):
        raise TypeError(f"expected a SlotLaunch on stdin, got {type(launch).__name__}")
    run_slot(launch, index=index, host=host)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
