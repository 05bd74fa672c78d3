"""A peer's throughput series for the recovery runs, written where the driver reads it.

Standard library only: the peers import it from their own virtualenvs. The file
format is that of ``probes.RateSink`` (``bench/probes.py``), so the driver reads the
peers' series and epochstream's with the same ``probes.read_probe``: JSON lines
``{"samples": [[wall time, records], ...]}`` appended to
``<directory>/rate-<attempt>-0-<pid>.jsonl``, flushed every ``FLUSH_EVERY_S``, so a
SIGKILL loses at most that much of the series (and a line cut short is skipped).
A restarted peer says what it resumed from with :func:`write_restore`
(``<directory>/restore-<attempt>.json``): the driver reports it, so a figure can be
told from a restart that began again from nothing.

Example::

    probe = RateProbe("/tmp/probe", attempt=0)
    probe.add(time.time(), 1024)     # per batch the peer finished
    probe.close()
"""

from __future__ import annotations

import json
import os
import time

__all__ = ["RateProbe", "read_restore", "spread", "write_restore"]

FLUSH_EVERY_S = 0.2


class RateProbe:
    """Appends ``(wall time, records)`` samples to this process's probe file.

    Example: ``RateProbe("/tmp/probe", attempt=1).add(time.time(), 500)``
    """

    def __init__(self, directory: str, *, attempt: int) -> None:
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, f"rate-{attempt}-0-{os.getpid()}.jsonl")
        self._file = open(path, "a", encoding="utf-8")
        self._samples: list[tuple[float, int]] = []
        self._flushed = time.time()

    def add(self, at: float, records: int) -> None:
        """``records`` finished at wall time ``at``."""
        self._samples.append((at, records))
        now = time.time()
        if now - self._flushed >= FLUSH_EVERY_S:
            self.flush(now)

    def flush(self, now: float | None = None) -> None:
        """Write the samples taken since the last flush (one line)."""
        if self._samples:
            self._file.write(json.dumps({"samples": self._samples}) + "\n")
            self._file.flush()
            self._samples = []
        self._flushed = time.time() if now is None else now

    def close(self) -> None:
        """Flush and close the file."""
        self.flush()
        self._file.close()


def spread(
    start: float, end: float, records: int, *, step_s: float = 0.05
) -> list[tuple[float, int]]:
    """``records`` processed between ``start`` and ``end``, as samples every ``step_s``.

    A micro-batch's rows become visible at its end, but they were processed over its
    whole duration; a throughput series smoothed over one second would otherwise swing
    between zero and twice the rate with batches about a second long.

    Example: ``spread(10.0, 10.1, 9, step_s=0.05) == [(10.05, 4), (10.1, 5)]``
    """
    k = max(1, round((end - start) / step_s))
    out: list[tuple[float, int]] = []
    done = 0
    for j in range(1, k + 1):
        upto = records * j // k
        out.append((start + (end - start) * j / k, upto - done))
        done = upto
    return out


def _restore_path(directory: str, attempt: int) -> str:
    return os.path.join(directory, f"restore-{attempt}.json")


def write_restore(directory: str, attempt: int, resumed_from: dict[str, object]) -> None:
    """Record what the peer's ``attempt`` resumed from (a checkpoint, a batch, a position).

    Example: ``write_restore("/tmp/probe", 1, {"checkpoint": "/tmp/ck/abc/chk-7"})``
    """
    os.makedirs(directory, exist_ok=True)
    with open(_restore_path(directory, attempt), "w", encoding="utf-8") as f:
        json.dump(resumed_from, f)


def read_restore(directory: str, attempt: int) -> dict[str, object] | None:
    """What :func:`write_restore` recorded for ``attempt``, or None if nothing was.

    Example: ``read_restore("/tmp/probe", 1) == {"checkpoint": "/tmp/ck/abc/chk-7"}``
    """
    try:
        with open(_restore_path(directory, attempt), encoding="utf-8") as f:
            doc: dict[str, object] = json.load(f)
    except FileNotFoundError:
        return None
    return doc
