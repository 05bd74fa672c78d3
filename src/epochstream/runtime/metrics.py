"""Task metrics: counters a task bumps per batch, sampled once a second by its slot.

The task thread only adds to plain attributes (one add per batch, per operator); it
never locks or reads a clock per record. Time is split the way Flink's
``busyTimeMsPerSecond`` / ``idleTimeMsPerSecond`` / ``backPressuredTimeMsPerSecond``
split it: *idle* is time the task waits for input (:class:`WaitClock` in the input
gate), *backpressured* is time it waits for room downstream (a full local channel or
a socket whose buffers are full), *busy* is the rest. The slot's reporter thread turns
the cumulative figures into a :class:`TaskMetricsSample` with per-second rates; reads
race benignly with the task's writes (a sample may be a batch early or late).

Example::

    metrics = TaskMetrics(("map-1", 0), [("map-1", "map")], gate)
    metrics.operators["map-1"].records_in += len(batch)
    sampler = TaskSampler(metrics, now=time.perf_counter())
    sample = sampler.sample(now=time.perf_counter(), wall_ms=wall_ms(clock))
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from epochstream.core.events import MAX_WATERMARK, MIN_WATERMARK

__all__ = [
    "OperatorCounters",
    "OperatorSample",
    "TaskMetrics",
    "TaskMetricsSample",
    "TaskSampler",
    "WaitClock",
]


class WaitClock:
    """Total seconds spent waiting, including a wait still in progress.

    Only the waiting thread calls ``begin``/``end`` (on the slow path: when it really
    blocks); any thread may read ``total``.

    Example::

        clock = WaitClock(); clock.begin(); ...; clock.end(); clock.total(time.perf_counter())
    """

    __slots__ = ("_done", "_since")

    def __init__(self) -> None:
        self._done = 0.0
        self._since: float | None = None

    def begin(self) -> None:
        """The thread starts waiting."""
        self._since = time.perf_counter()

    def end(self) -> None:
        """The thread stops waiting."""
        since = self._since
        if since is not None:
            self._done += time.perf_counter() - since
            self._since = None

    def total(self, now: float) -> float:
        """Seconds waited so far (``now`` from ``time.perf_counter()``)."""
        since = self._since
        return self._done + (now - since if since is not None else 0.0)


class OperatorCounters:
    """Records into and out of one operator of a task, its current watermark, and the
    late records it dropped.

    ``watermark`` is the last watermark the operator received (a source: emitted).
    ``late_records_dropped``: records of event-time windows (or joins) that had fired
    already, dropped without a late side output to take them (Flink's
    ``numLateRecordsDropped``); and, under a state TTL, retractions a group
    aggregation ignored because the state they retract had expired.

    Example: ``counters = OperatorCounters("map-1", "map"); counters.records_in += 1024``
    """

    __slots__ = ("late_records_dropped", "name", "records_in", "records_out", "uid", "watermark")

    def __init__(self, uid: str, name: str) -> None:
        self.uid = uid
        self.name = name
        self.records_in = 0
        self.records_out = 0
        self.watermark: int | None = None
        self.late_records_dropped = 0


class TaskMetrics:
    """Everything one task counts; shared between the task thread and the reporter.

    Example: ``TaskMetrics(("chain", 0), [("src", "numbers")], gate).head.records_out``
    """

    def __init__(self, task: tuple[str, int], operators: list[tuple[str, str]], gate: Any) -> None:
        self.task = task
        self.operators = {uid: OperatorCounters(uid, name) for uid, name in operators}
        self.head = self.operators[operators[0][0]]
        self.gate = gate
        #: Time the task thread waited for room in downstream channels.
        self.backpressure = WaitClock()
        #: The task's part of its latest completed snapshot (set by the snapshot thread).
        self.last_checkpoint: Any = None


@dataclass(frozen=True)
class OperatorSample:
    """One operator's counts (cumulative) and rates (records/s over the last interval).

    Example: ``OperatorSample("map", "map", 10, 10, 5.0, 5.0, None).records_in_per_s``
    """

    uid: str
    name: str
    records_in: int
    records_out: int
    records_in_per_s: float
    records_out_per_s: float
    watermark: int | None
    late_records_dropped: int = 0


@dataclass(frozen=True)
class TaskMetricsSample:
    """What one task reports each interval (times in ms per second of wall time).

    Example: ``sample.backpressured_ms_per_s > 500`` means the task waited on its
    consumers for more than half of the last interval.
    """

    task: tuple[str, int]
    operators: list[OperatorSample]
    busy_ms_per_s: float
    idle_ms_per_s: float
    backpressured_ms_per_s: float
    queue_fill: float
    watermark: int | None
    watermark_lag_ms: float | None
    state_size: int
    checkpoint_alignment_s: float | None = None
    checkpoint_sync_s: float | None = None
    checkpoint_async_s: float | None = None
    #: Bytes of in-flight records the last checkpoint kept (0: it was aligned).
    checkpoint_channel_state_bytes: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "subtask": self.task[1],
            "operators": [vars_of(op) for op in self.operators],
            "busy_ms_per_s": self.busy_ms_per_s,
            "idle_ms_per_s": self.idle_ms_per_s,
            "backpressured_ms_per_s": self.backpressured_ms_per_s,
            "queue_fill": self.queue_fill,
            "watermark": self.watermark,
            "watermark_lag_ms": self.watermark_lag_ms,
            "state_size": self.state_size,
            "checkpoint_alignment_s": self.checkpoint_alignment_s,
            "checkpoint_sync_s": self.checkpoint_sync_s,
            "checkpoint_async_s": self.checkpoint_async_s,
            "checkpoint_channel_state_bytes": self.checkpoint_channel_state_bytes,
        }


def vars_of(op: OperatorSample) -> dict[str, Any]:
    """An operator sample as a JSON-ready dict."""
    return {
        "uid": op.uid,
        "name": op.name,
        "records_in": op.records_in,
        "records_out": op.records_out,
        "records_in_per_s": op.records_in_per_s,
        "records_out_per_s": op.records_out_per_s,
        "watermark": op.watermark,
        "late_records_dropped": op.late_records_dropped,
    }


def _real(watermark: int | None) -> int | None:
    """A watermark worth showing: not the start/end-of-time sentinels."""
    if watermark is None or watermark <= MIN_WATERMARK or watermark >= MAX_WATERMARK:
        return None
    return watermark


class TaskSampler:
    """Turns a task's cumulative counters into per-interval samples (reporter thread).

    Example: ``TaskSampler(metrics, now=time.perf_counter()).sample(now=t, wall_ms=ms)``
    """

    def __init__(self, metrics: TaskMetrics, *, now: float) -> None:
        self.metrics = metrics
        self._at = now
        self._counts = {uid: (0, 0) for uid in metrics.operators}
        self._idle = metrics.gate.idle.total(now)
        self._pressure = metrics.backpressure.total(now)

    def sample(self, *, now: float, wall_ms: int) -> TaskMetricsSample:
        """The rates since the previous sample; ``now`` is ``time.perf_counter()``."""
        m = self.metrics
        elapsed = max(now - self._at, 1e-9)
        operators = []
        for uid, c in m.operators.items():
            records_in, records_out = c.records_in, c.records_out
            before_in, before_out = self._counts[uid]
            self._counts[uid] = (records_in, records_out)
            operators.append(
                OperatorSample(
                    uid=uid,
                    name=c.name,
                    records_in=records_in,
                    records_out=records_out,
                    records_in_per_s=(records_in - before_in) / elapsed,
                    records_out_per_s=(records_out - before_out) / elapsed,
                    watermark=_real(c.watermark),
                    late_records_dropped=c.late_records_dropped,
                )
            )
        idle = m.gate.idle.total(now)
        pressure = m.backpressure.total(now)
        idle_ms = _per_second(idle - self._idle, elapsed)
        pressure_ms = _per_second(pressure - self._pressure, elapsed)
        self._idle, self._pressure, self._at = idle, pressure, now
        watermark = _real(m.head.watermark)
        stats = m.last_checkpoint
        return TaskMetricsSample(
            task=m.task,
            operators=operators,
            busy_ms_per_s=max(1000.0 - idle_ms - pressure_ms, 0.0),
            idle_ms_per_s=idle_ms,
            backpressured_ms_per_s=pressure_ms,
            queue_fill=m.gate.fill(),
            watermark=watermark,
            watermark_lag_ms=None if watermark is None else float(wall_ms - watermark),
            state_size=stats.state_size if stats is not None else 0,
            checkpoint_alignment_s=stats.alignment_s if stats is not None else None,
            checkpoint_sync_s=stats.sync_s if stats is not None else None,
            checkpoint_async_s=stats.async_s if stats is not None else None,
            checkpoint_channel_state_bytes=stats.channel_state_bytes if stats is not None else None,
        )


def _per_second(seconds: float, elapsed: float) -> float:
    """Milliseconds per second of ``elapsed``, clamped to [0, 1000]."""
    return min(max(seconds / elapsed * 1000.0, 0.0), 1000.0)
