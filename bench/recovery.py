"""Kill a slot of a running job and time its way back (driver side of ``bench/all.py``).

The job must write ``(wall time, records)`` per batch through a
:class:`probes.RateSink` into ``probe``. Once two checkpoints completed and the sink
has seen ``kill_after`` seconds of output, slot 0's process gets SIGKILL
(``es.testing.kill_slot``, a real crash); the sink's series then gives the seconds
until the throughput is back at 90 % of the 3 s before the kill
(``report.recovery_time``). The job is cancelled afterwards.

Example::

    client = env.execute_async("w1-recovery")
    kill_and_measure(client, "/tmp/probe", what="W1 row")["recovery_s"]
"""

from __future__ import annotations

import time
from typing import Any

from probes import read_probe
from report import rate_series, recovery_time

import epochstream as es

__all__ = ["kill_and_measure", "throughput_series"]


def throughput_series(probe: str) -> list[tuple[float, float]]:
    """The ``rate`` samples every writer put in ``probe``, binned (``report.rate_series``).

    Example: ``throughput_series("/tmp/probe")[0] == (1764170000.0, 412000.0)``
    """
    return rate_series(s for line in read_probe(probe, "rate") for s in line["samples"])


def kill_and_measure(
    client: es.JobClient,
    probe: str,
    *,
    what: str,
    kill_after: float = 6.0,
    timeout: float = 60.0,
) -> dict[str, Any]:
    """Kill slot 0 of ``client``'s job after ``kill_after`` s of output; the recovery time.

    Raises RuntimeError naming ``what`` when the throughput is not back within
    ``timeout`` seconds of the kill.
    """
    out: dict[str, Any] = {}
    try:
        client.wait_for_checkpoint(2, timeout=120)
        series = throughput_series(probe)
        started = series[0][0] if series else time.time()
        time.sleep(max(0.0, started + kill_after - time.time()))
        attempt = client.attempt
        kill_at = time.time()
        try:
            out["killed_pid"] = es.testing.kill_slot(client, 0)
        except ProcessLookupError as exc:
            raise RuntimeError(
                f"{what}: slot 0's process was gone before the kill: the job's input ran out "
                "before it (give the recovery run more events)"
            ) from exc
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not client.done:
            time.sleep(0.5)
            out.update(recovery_time(throughput_series(probe), kill_at))
            if out["recovery_s"] is not None and client.attempt > attempt:
                break
        out["attempts"] = client.attempt
    finally:
        if not client.done:
            client.cancel()
        try:
            client.result(timeout=120)
        except es.JobCancelled:
            pass
    if out.get("recovery_s") is None:
        raise RuntimeError(
            f"{what}: throughput not back at 90 % of {out.get('baseline_rate')} within "
            f"{timeout:.0f} s of the kill (dipped: {out.get('dipped')}, "
            f"attempts: {out.get('attempts')})"
        )
    return out
