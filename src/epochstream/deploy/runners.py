"""How slots are started: the runner interface and the local (subprocess) runner.

A runner starts ``parallelism`` slots for one attempt, each calling
:func:`epochstream.runtime.slot.run_slot`, reports when they exit, and can cancel
them. The job master owns everything else (failover, checkpoints).

Example::

    runner = LocalRunner(parallelism=2)
    runner.start(launch, on_exit=lambda error: print("attempt ended", error))
    runner.cancel(); runner.wait(10)
"""

from __future__ import annotations

import logging
import os
import pickle
import subprocess
import sys
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable

from epochstream.runtime.slot import SlotLaunch

__all__ = ["LocalRunner", "Runner", "RunnerLost"]

log = logging.getLogger(__name__)

OnExit = Callable[[BaseException | None], None]
#: Seconds a cancelled slot process has to exit before it is killed.
KILL_GRACE = 5.0


class RunnerLost(Exception):
    """The runner's backend is gone (the Spark driver JVM died): no attempt can start.

    Example: ``raise RunnerLost("the Spark context was lost")`` from ``Runner.cancel``.
    """


class Runner(ABC):
    """Starts and stops the slots of one attempt."""

    parallelism: int

    @abstractmethod
    def control_host(self) -> str:
        """The address the job master's control plane binds to and slots dial."""

    @abstractmethod
    def start(self, launch: SlotLaunch, on_exit: OnExit) -> None:
        """Start every slot of ``launch.attempt``; call ``on_exit`` once when they are all gone."""

    @abstractmethod
    def cancel(self) -> None:
        """Stop the current attempt's slots (idempotent); :class:`RunnerLost` if the
        backend itself is gone."""

    @abstractmethod
    def wait(self, timeout: float) -> bool:
        """Wait until the current attempt's slots are gone; False on timeout."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release runner resources at the end of the job."""

    def describe_exit_error(self, error: BaseException) -> tuple[str, bool]:
        """How the slots' early exit reads in a failure report, and whether to skip restarts."""
        return repr(error), False


class LocalRunner(Runner):
    """Runs each slot in its own Python subprocess on this machine (no Spark).

    It runs exactly the slot code Spark runs, so it serves fast tests and
    debugging; killing one of its processes is a real crash.
    """

    def __init__(self, *, parallelism: int, host: str = "127.0.0.1") -> None:
        self.parallelism = parallelism
        self._host = host
        self._procs: list[subprocess.Popen[bytes]] = []
        self._monitor: threading.Thread | None = None
        self._cancelled = threading.Event()

    def control_host(self) -> str:
        return self._host

    def start(self, launch: SlotLaunch, on_exit: OnExit) -> None:
        self._cancelled.clear()
        src_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (os.path.dirname(src_dir), env.get("PYTHONPATH", "")) if p
        )
        payload = pickle.dumps(launch)
        self._procs = []
        for index in range(self.parallelism):
            proc = subprocess.Popen(
                [sys.executable, "-m", "epochstream.deploy.localslot", str(index), self._host],
                stdin=subprocess.PIPE,
                env=env,
            )
            # Kept before the write: if that or a later Popen fails (EMFILE, EAGAIN), the
            # job master's cancel still reaches every process already started.
            self._procs.append(proc)
            assert proc.stdin is not None
            proc.stdin.write(payload)
            proc.stdin.close()
        procs = list(self._procs)
        self._monitor = threading.Thread(
            target=self._watch, args=(procs, on_exit), name="local-runner", daemon=True
        )
        self._monitor.start()

    def _watch(self, procs: list[subprocess.Popen[bytes]], on_exit: OnExit) -> None:
        reported = False
        while True:
            codes = [p.poll() for p in procs]
            failed = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
            if failed and not reported and not self._cancelled.is_set():
                i, code = failed[0]
                reported = True
                on_exit(
                    RuntimeError(f"slot {i} process (pid {procs[i].pid}) exited with code {code}")
                )
            if all(c is not None for c in codes):
                if not reported:
                    on_exit(None)
                return
            time.sleep(0.05)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def cancel(self) -> None:
        self._cancelled.set()
        for p in self._procs:
            if p.poll() is None:
                p.terminate()

    def wait(self, timeout: float) -> bool:
        # Cancelled slots get KILL_GRACE seconds to leave on their own (they were told by
        # the job master and sent SIGTERM); a stopped or hung process is then killed.
        deadline = time.monotonic() + timeout
        grace = time.monotonic() + KILL_GRACE if self._cancelled.is_set() else deadline
        for p in self._procs:
            try:
                p.wait(max(0.0, min(grace, deadline) - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("slot process %d did not stop; killing it", p.pid)
                p.kill()
                p.wait(5)
        return all(p.poll() is not None for p in self._procs)

    def close(self) -> None:
        self.cancel()
        self.wait(5.0)
