"""Failure injection and helpers for testing jobs the way epochstream tests itself.

``FailOnce`` is an identity map that fails the job once, in one subtask, after a
number of records and/or completed checkpoints: by raising
(:class:`~epochstream.exceptions.InjectedFailure`) or by killing its own process
with SIGKILL (a real crash, no cleanup). A marker file makes "once" hold across
restarts, since the restarted process has no memory of the first one.

Example::

    env.enable_checkpointing(0.5, storage=str(tmp / "ckpt"))
    (env.from_sequence(0, 100_000)
        .map(es.testing.FailOnce(after_records=20_000, after_checkpoints=1, subtask=0))
        .key_by(lambda i: i % 10).sum()
        .sink_to(es.sinks.FileSink(str(tmp / "out"))))
    env.execute()
    rows = es.testing.read_committed(tmp / "out")
"""

from __future__ import annotations

import glob
import json
import os
import signal
import tempfile
from typing import Any

from epochstream.core.clock import ManualClock
from epochstream.core.functions import CheckpointListener, MapFunction, RuntimeContext
from epochstream.exceptions import ConfigurationError, InjectedFailure

__all__ = ["FailOnce", "FileClock", "ManualClock", "kill_slot", "read_committed"]


class FailOnce(MapFunction, CheckpointListener):
    """Identity map that fails ``times`` times (default once) in subtask ``subtask``.

    It fires when that subtask has seen ``after_records`` records in the current
    attempt and ``after_checkpoints`` checkpoints have completed in it. ``crash=True``
    kills the process with SIGKILL instead of raising. ``marker_dir`` (default: a new
    temporary directory made when the object is created) must be on a filesystem
    the slots share with the driver.

    Example: ``ds.map(es.testing.FailOnce(after_records=1000, crash=True))``
    """

    def __init__(
        self,
        *,
        after_records: int = 0,
        after_checkpoints: int = 0,
        subtask: int = 0,
        crash: bool = False,
        times: int = 1,
        marker_dir: str | None = None,
    ) -> None:
        if after_records < 0 or after_checkpoints < 0 or times < 1 or subtask < 0:
            raise ConfigurationError("FailOnce: counts must be >= 0 and times >= 1")
        self.after_records = after_records
        self.after_checkpoints = after_checkpoints
        self.subtask = subtask
        self.crash = crash
        self.times = times
        self.marker_dir = marker_dir or tempfile.mkdtemp(prefix="epochstream-failonce-")
        self._armed = False
        self._seen = 0
        self._checkpoints = 0

    def open(self, ctx: RuntimeContext) -> None:
        self._armed = ctx.subtask_index == self.subtask and self.failures_so_far() < self.times
        self._seen = 0
        self._checkpoints = 0

    def failures_so_far(self) -> int:
        """How many times this injector has fired (across restarts)."""
        return len(glob.glob(os.path.join(self.marker_dir, "fired-*")))

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self._checkpoints += 1

    def map(self, value: Any) -> Any:
        if self._armed:
            self._seen += 1
            if self._seen > self.after_records and self._checkpoints >= self.after_checkpoints:
                self._fire()
        return value

    def _fire(self) -> None:
        n = self.failures_so_far()
        if n >= self.times:
            self._armed = False
            return
        with open(os.path.join(self.marker_dir, f"fired-{n}"), "x") as marker:
            marker.write(str(os.getpid()))
        self._armed = False
        if self.crash:
            os.kill(os.getpid(), signal.SIGKILL)
        raise InjectedFailure(
            f"injected failure #{n + 1} in subtask {self.subtask} after {self._seen - 1} records "
            f"and {self._checkpoints} completed checkpoints"
        )


def kill_slot(client: Any, slot: int = 0) -> int:
    """SIGKILL the process of ``slot`` of a running job (a real crash); returns its PID.

    Example: ``es.testing.kill_slot(client, 0)``
    """
    pid = client.slot_pids()[slot]
    os.kill(pid, signal.SIGKILL)
    return pid


def read_committed(path: str | os.PathLike[str]) -> list[Any]:
    """Every record of the committed ``.jsonl`` files under ``path`` (hidden files skipped).

    Example: ``rows = es.testing.read_committed("out/")``
    """
    rows: list[Any] = []
    for name in sorted(os.listdir(path)):
        if name.startswith((".", "_")) or not name.endswith(".jsonl"):
            continue
        with open(os.path.join(path, name), encoding="utf-8") as f:
            rows.extend(json.loads(line) for line in f if line.strip())
    return rows


class FileClock:
    """A clock that moves only when a test moves it, shared by every process of a job
    (the driver and the slots read the same file).

    The time is int milliseconds since the epoch, kept in ``path``; ``advance_to``
    and ``advance`` write it atomically. Give it to ``env.set_clock`` to drive
    processing-time windows and timers deterministically.

    Example::

        clock = es.testing.FileClock(tmp / "clock", start_ms=1_700_000_000_000)
        env.set_clock(clock)
        client = env.execute_async("job")
        clock.advance(5_000)           # processing time moves 5 s in every slot
    """

    def __init__(self, path: str | os.PathLike[str], *, start_ms: int | None = None) -> None:
        self.path = os.fspath(path)
        if start_ms is not None or not os.path.exists(self.path):
            self.advance_to(0 if start_ms is None else start_ms)

    def now_ms(self) -> int:
        """The current time in ms."""
        with open(self.path, encoding="ascii") as f:
            text = f.read().strip()
        try:
            return int(text)
        except ValueError:
            raise ConfigurationError(f"FileClock {self.path}: not an int of ms: {text!r}") from None

    def wall_ms(self) -> int:
        """Milliseconds since the epoch (exact: what processing time reads)."""
        return self.now_ms()

    def now(self) -> float:
        """Seconds (the clock is monotonic: it only moves forward)."""
        return self.now_ms() / 1000

    def wall(self) -> float:
        """Seconds since the epoch."""
        return self.now_ms() / 1000

    def sleep(self, seconds: float) -> None:
        """Waiting on this clock advances it (as ``ManualClock`` does)."""
        if seconds > 0:
            self.advance(int(seconds * 1000))

    def advance_to(self, ms: int) -> None:
        """Set the time to ``ms`` (never backwards)."""
        if os.path.exists(self.path) and ms < self.now_ms():
            raise ConfigurationError(f"FileClock {self.path}: time cannot go back to {ms}")
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(self.path) or ".", prefix=".clock-")
        with os.fdopen(fd, "w", encoding="ascii") as f:
            f.write(str(int(ms)))
        os.replace(tmp, self.path)

    def advance(self, ms: int) -> None:
        """Move the time ``ms`` forward."""
        self.advance_to(self.now_ms() + int(ms))
