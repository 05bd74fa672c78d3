"""Kill a peer's process and time its way back (driver side of ``bench/all.py``).

A peer runs locally in one process (its JVM, or Bytewax's worker, is a child or part
of it), so a SIGKILL of its process group ends the whole job and nothing inside it
restarts it. What a user of that deployment relies on is a supervisor starting it
again from the checkpoint it kept: :func:`kill_and_restart` does exactly that, at
once, and times the way back on the same series as epochstream's
(``recovery.kill_and_measure``; the peer writes it with ``peers/rate_probe.py`` in the
same format, and ``report.recovery_time`` reads both). The figure therefore includes
the peer's process and JVM start, where ours includes redeploying the slots (the job
master survives a slot's death).

Example::

    def start(attempt: int) -> subprocess.Popen[bytes]:
        return subprocess.Popen([python, "bytewax_job.py", "B", "--probe", probe,
                                 "--attempt", str(attempt), ...], start_new_session=True)

    kill_and_restart(start, probe, what="Bytewax W1")["recovery_s"]
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from typing import Any

from rate_probe import read_restore
from recovery import throughput_series
from report import recovery_time

__all__ = ["kill_and_restart"]

# A peer's first output can take this long (a JVM, a planner, a first micro-batch).
PEER_START_TIMEOUT_S = 180.0


# How long a SIGKILLed group may take to be gone: a JVM unmapping a large heap takes
# a moment after its parent has been reaped.
GROUP_EXIT_TIMEOUT_S = 30.0


def _live_members(pgid: int) -> list[int]:
    """Pids in process group ``pgid`` that have not exited (zombies count as exited:
    an orphan is reaped by whoever adopted it, which may be late or never here)."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as f:
                # The command name is in parentheses and may hold spaces.
                fields = f.read().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue  # exited while we looked
        state, pgrp = fields[0], int(fields[2])
        if pgrp == pgid and state not in ("Z", "X"):
            members.append(int(entry))
    return members


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL ``process``'s process group (it was started in a session of its own) and
    wait until every member has exited, not only the leader: SIGKILL is delivered
    asynchronously, so a child (a peer's JVM) can still be tearing down when the leader
    is reaped, and would overlap the restarted peer's start."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    deadline = time.monotonic() + GROUP_EXIT_TIMEOUT_S
    while members := _live_members(process.pid):
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"process group {process.pid}: {members} still running "
                f"{GROUP_EXIT_TIMEOUT_S:.0f} s after SIGKILL"
            )
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # a member forked after the first kill
        time.sleep(0.02)


def kill_and_restart(
    start: Callable[[int], subprocess.Popen[bytes]],
    probe: str,
    *,
    what: str,
    kill_after: float = 6.0,
    timeout: float = 60.0,
) -> dict[str, Any]:
    """SIGKILL a peer's process group after ``kill_after`` s of output, start it again at
    once; seconds until the throughput is back at 90 %.

    ``start(attempt)`` starts the peer (``attempt`` 0, then 1 for the restarted
    process, which resumes from the first one's checkpoints) in a new session, writing
    its series into ``probe``. Raises RuntimeError naming ``what`` when the first
    process ends before the kill, or the throughput is not back within ``timeout`` s.
    """
    out: dict[str, Any] = {}
    first = start(0)
    restarted: subprocess.Popen[bytes] | None = None
    try:
        deadline = time.monotonic() + PEER_START_TIMEOUT_S + kill_after
        while True:
            if first.poll() is not None:
                raise RuntimeError(f"{what}: exited {first.returncode} before the kill")
            series = throughput_series(probe)
            if series and series[-1][0] - series[0][0] >= kill_after:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what}: not {kill_after} s of output in time")
            time.sleep(0.25)
        kill_at = time.time()
        _kill_group(first)
        restarted = start(1)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and restarted.poll() is None:
            time.sleep(0.5)
            out.update(recovery_time(throughput_series(probe), kill_at))
            if out["recovery_s"] is not None:
                break
        out["restored"] = read_restore(probe, 1)
    finally:
        _kill_group(first)
        if restarted is not None:
            _kill_group(restarted)
    if out.get("recovery_s") is None:
        raise RuntimeError(
            f"{what}: throughput not back at 90 % of {out.get('baseline_rate')} within "
            f"{timeout:.0f} s of the kill (dipped: {out.get('dipped')}, restarted process "
            f"exit code: {restarted.returncode if restarted else None})"
        )
    return out
