"""Workload W1 (keyed running sum) on epochstream: the row path and the columnar path.

W1: ``i`` for ``0 <= i < n`` becomes ``(i * 7919 % 100_000, i % 1000)``; the running
sum of the value per key. The row job (the one of ``bench/epochstream_jobs.py``)::

    env.from_sequence(0, n).map(lambda i: (i * 7919 % 100_000, i % 1000)) \\
       .key_by(lambda t: t[0]).reduce(lambda a, b: (a[0], a[1] + b[1]))

The columnar job (per input batch, one row ``(k, running sum)`` per key touched)::

    env.from_sequence(0, n, batch_size=65_536).map_batches(to_kv).key_by("k").sum("v")

Three measurements per path, each returning a JSON-ready dict:

- :func:`run_throughput`: wall time of ``env.execute()``; the sink keeps the last sum
  per key, checked against the closed form (``bench/report.py``).
- :func:`run_latency`: the source throttled to ``rate``; each record carries its
  creation wall time (when the throttled source released it, by its schedule,
  stamped right after the source in the same chained task) and the sink samples
  ``now - created``. The columnar job measures ``key_by("k").max("ts")`` in place of
  ``sum("v")``: the same columnar keyed aggregation, but its output keeps the time.
- :func:`run_recovery`: an endless source, checkpoints every 1 s; once two
  checkpoints completed and ``kill_after`` seconds passed, slot 0's process gets
  SIGKILL (``es.testing.kill_slot``); the sinks' throughput series gives the time
  until the output rate is back at 90 % of the rate before the kill
  (``bench/recovery.py``).

Example::

    from epochstream.deploy.spark import create_session
    spark = create_session("local[2]")
    run_throughput("row", 1_000_000, spark=spark, checkpoint=1.0)["rate"]
"""

from __future__ import annotations

import inspect
import os
import shutil
import sys
import tempfile
import time
from typing import Any

import cloudpickle
from probes import LatencySink, RateSink, SumsSink, read_probe
from recovery import kill_and_measure
from report import WARMUP_S, check_w1, latency_summary, steady

import epochstream as es

__all__ = [
    "PATHS",
    "ColumnarUnavailable",
    "run_capacity",
    "run_latency",
    "run_recovery",
    "run_throughput",
]

PATHS = ("row", "columnar")
KEYS = 100_000
COLUMNAR_BATCH = 65_536
SCRATCH = "/tmp/epochstream-bench/w1"


class ColumnarUnavailable(RuntimeError):
    """This checkout's epochstream lacks the columnar API the W1 columnar job uses."""


def _require_columnar() -> None:
    params = inspect.signature(es.Environment.from_sequence).parameters
    missing = [
        name
        for name, ok in (
            ("Environment.from_sequence(batch_size=)", "batch_size" in params),
            ("DataStream.map_batches", hasattr(es.DataStream, "map_batches")),
        )
        if not ok
    ]
    if missing:
        raise ColumnarUnavailable(
            f"the columnar API is not in this checkout (missing {', '.join(missing)})"
        )


def _to_kv(b: Any) -> Any:
    import pyarrow as pa
    import pyarrow.compute as pc

    v = b["value"]
    return pa.record_batch(
        [pc.remainder(pc.multiply(v, 7919), 100_000), pc.remainder(v, 1000)], names=["k", "v"]
    )


class _Schedule:
    """When the throttled sequence source released record ``i`` of this subtask.

    Its reader releases the first record of its split (``lo``) at ``t0`` and record
    ``i`` at ``t0 + (i - lo) * parallelism / rate``. ``t0`` is the reader's and not
    visible here, but a record seen at ``now`` was released by then, so
    ``now - (i - lo) * step`` bounds ``t0`` from above; the schedule keeps the smallest
    bound seen (records batched or queued before this operator make later ones only
    looser), so the due times it gives are never late, and tighten within the first
    batches that pass without waiting.
    """

    def __init__(self, rate: float, parallelism: int) -> None:
        self.step = parallelism / rate
        self.lo: int | None = None
        self.t0 = float("inf")

    def observe(self, i: int) -> int:
        """Tighten ``t0`` with record ``i`` seen now; returns ``lo``."""
        if self.lo is None:
            self.lo = i
        self.t0 = min(self.t0, time.time() - (i - self.lo) * self.step)
        return self.lo


class _StampRow(es.MapFunction):
    """``i -> (k, v, due time of i)``; the clock is read every 256th record."""

    def __init__(self, rate: float, parallelism: int) -> None:
        self.schedule = _Schedule(rate, parallelism)

    def map(self, i: int) -> tuple[int, int, float]:
        s = self.schedule
        lo = s.lo
        if lo is None or (i - lo) % 256 == 0:
            lo = s.observe(i)
        return (i * 7919 % KEYS, i % 1000, s.t0 + (i - lo) * s.step)


class _StampBatch:
    """``_to_kv`` plus a ``ts`` column: each record's due time (for latency)."""

    def __init__(self, rate: float, parallelism: int) -> None:
        self.schedule = _Schedule(rate, parallelism)

    def __call__(self, b: Any) -> Any:
        import pyarrow as pa
        import pyarrow.compute as pc

        kv = _to_kv(b)
        values = b["value"]
        s = self.schedule
        if s.lo is None:
            s.lo = values[0].as_py()
        lo = s.observe(values[len(values) - 1].as_py())
        offsets = pc.subtract(pc.cast(values, pa.float64()), float(lo))
        ts = pc.add(pc.multiply(offsets, s.step), s.t0)
        return pa.record_batch([kv["k"], kv["v"], ts], names=["k", "v", "ts"])


def _environment(
    spark: Any, parallelism: int, checkpoint: float | None, name: str
) -> es.Environment:
    env = es.Environment(parallelism=parallelism, runner="spark", spark=spark)
    if checkpoint is not None:
        storage = os.path.join(SCRATCH, f"ck-{name}")
        # A leftover checkpoint would make the job restore from it.
        shutil.rmtree(storage, ignore_errors=True)
        env.enable_checkpointing(checkpoint, storage=storage)
    return env


def _build(env: es.Environment, path: str, n: int, rate: float | None, stamped: bool) -> Any:
    """The W1 pipeline up to (not including) the sink; ``stamped`` (needs ``rate``)
    carries each record's due time as a third field / ``ts`` column."""
    if stamped and rate is None:
        raise ValueError("a stamped W1 job needs a rate (the due times follow it)")
    if path == "row":
        seq = env.from_sequence(0, n, rate=rate).uid("numbers")
        if stamped and rate is not None:
            keyed = seq.map(_StampRow(rate, env.parallelism))
            summed = keyed.key_by(lambda t: t[0]).reduce(lambda a, b: (a[0], a[1] + b[1], b[2]))
        else:
            keyed = seq.map(lambda i: (i * 7919 % KEYS, i % 1000))
            summed = keyed.key_by(lambda t: t[0]).reduce(lambda a, b: (a[0], a[1] + b[1]))
        return summed.uid("sums")
    if path == "columnar":
        _require_columnar()
        kwargs: dict[str, Any] = {"batch_size": COLUMNAR_BATCH}
        if rate is not None:
            kwargs["rate"] = rate
        seq = env.from_sequence(0, n, **kwargs).uid("numbers")  # type: ignore[call-arg]
        fn = _StampBatch(rate, env.parallelism) if stamped and rate is not None else _to_kv
        keyed = seq.map_batches(fn).key_by("k")
        if stamped:
            # The sum's output is (k, v) only: nothing carries the creation time through
            # it. The running max of ``ts`` per key has the same shape (columnar keyed
            # aggregate, one row per key touched per batch) and outputs the newest
            # record's creation time of each key it touched.
            return keyed.max("ts").uid("sums")
        return keyed.sum("v").uid("sums")
    raise ValueError(f"unknown W1 path {path!r}; choose among {PATHS}")


def _probe_dir(name: str) -> str:
    os.makedirs(SCRATCH, exist_ok=True)
    return tempfile.mkdtemp(prefix=f"probe-{name}-", dir=SCRATCH)


def _execute_timed(env: es.Environment, name: str) -> tuple[Any, float]:
    """Run the job; its result and wall seconds. A restart would make the time mean
    something else, so it fails the measurement."""
    start = time.perf_counter()
    result = env.execute(name)
    wall = time.perf_counter() - start
    if result.restarts:
        raise RuntimeError(f"{name} restarted {result.restarts} times: {result.failures}")
    return result, wall


def run_throughput(
    path: str,
    n: int,
    *,
    spark: Any,
    parallelism: int = 2,
    checkpoint: float | None = 1.0,
) -> dict[str, Any]:
    """W1 over ``n`` events; its rate, checkpoint count and the closed-form check.

    Example: ``run_throughput("row", 1_000_000, spark=spark)["check"]["keys"] == 100_000``
    """
    probe = _probe_dir(f"{path}-tp")
    try:
        env = _environment(spark, parallelism, checkpoint, f"{path}-tp")
        _build(env, path, n, None, False).sink_to(SumsSink(probe, columnar=path == "columnar"))
        result, wall = _execute_timed(env, f"w1-{path}")
        lines = read_probe(probe, "sums")
        sums: dict[int, int] = {}
        for line in lines:
            sums.update((int(k), int(v)) for k, v in line["sums"])
        return {
            "events": n,
            "seconds": wall,
            "rate": n / wall,
            "output_records": sum(line["records"] for line in lines),
            "checkpoints_completed": len([c for c in result.checkpoints if c.kind == "checkpoint"]),
            "check": check_w1(n, sums),
        }
    finally:
        shutil.rmtree(probe, ignore_errors=True)


def run_capacity(
    path: str, n: int, *, spark: Any, parallelism: int = 2, checkpoint: float | None = 1.0
) -> float:
    """Events/s of the job :func:`run_latency` measures, unthrottled: W1 plus the due
    time each record carries (a third field, a ``ts`` column) and the latency probe.
    Carrying the time costs the row job some 15-25 %, so half of W1's own rate would
    be above half of this one's.

    Example: ``run_latency("row", run_capacity("row", 4_000_000, spark=spark) / 2, 20, spark=spark)``
    """
    probe = _probe_dir(f"{path}-cap")
    try:
        env = _environment(spark, parallelism, checkpoint, f"{path}-cap")
        # A rate far above any reachable one: the source never waits, records still carry
        # due times (all about the start), and the probe samples as in a latency run.
        _build(env, path, n, 1e12, True).sink_to(
            LatencySink(probe, ts_index=2, columnar=path == "columnar")
        )
        return n / _execute_timed(env, f"w1-{path}-capacity")[1]
    finally:
        shutil.rmtree(probe, ignore_errors=True)


def run_latency(
    path: str,
    rate: float,
    seconds: float,
    *,
    spark: Any,
    parallelism: int = 2,
    checkpoint: float | None = 1.0,
    detail: bool = False,
) -> dict[str, Any]:
    """End-to-end latency at ``rate`` events/s for about ``seconds``; p50/p99 in ms.

    Samples of the first second of output are left out (``report.steady``: slot
    start-up and the first batches' interpreter warm-up are not steady state).
    ``detail``: also ``samples`` (every ``(sink wall time, latency s)`` pair) and
    ``checkpoints`` (the job's :class:`~epochstream.CheckpointStats`), to place the
    tail against the checkpoints.

    Example: ``run_latency("row", 200_000, 10, spark=spark)["p99_ms"]``
    """
    probe = _probe_dir(f"{path}-lat")
    try:
        env = _environment(spark, parallelism, checkpoint, f"{path}-lat")
        n = int(rate * seconds)
        columnar = path == "columnar"
        _build(env, path, n, rate, True).sink_to(LatencySink(probe, ts_index=2, columnar=columnar))
        result = env.execute(f"w1-{path}-latency")
        samples = [s for line in read_probe(probe, "latency") for s in line["samples"]]
        if not samples:
            raise RuntimeError(f"W1 {path} latency run produced no samples")
        latencies = steady([(t, (lat,)) for t, lat in samples], WARMUP_S)
        out = {"latency_rate": rate, "events": n, **latency_summary(latencies)}
        if detail:
            out.update(samples=sorted(samples), checkpoints=result.checkpoints)
        return out
    finally:
        shutil.rmtree(probe, ignore_errors=True)


def run_recovery(
    path: str,
    *,
    spark: Any,
    parallelism: int = 2,
    kill_after: float = 6.0,
    timeout: float = 60.0,
    restart_delay: float = 0.0,
) -> dict[str, Any]:
    """SIGKILL slot 0 of a running W1 job; seconds until the throughput is back at 90 %.

    The restart strategy is ``fixed_delay(attempts=3, delay=restart_delay)`` (0 s by
    default: the figure is the engine's own; the default strategy adds 1 s).

    Example: ``run_recovery("row", spark=spark)["recovery_s"]``
    """
    probe = _probe_dir(f"{path}-rec")
    env = _environment(spark, parallelism, 1.0, f"{path}-rec")
    env.set_restart_strategy(es.restart.fixed_delay(attempts=3, delay=restart_delay))
    columnar = path == "columnar"
    _build(env, path, 10**15, None, False).sink_to(RateSink(probe, columnar=columnar))
    client = env.execute_async(f"w1-{path}-recovery")
    try:
        out = kill_and_measure(
            client, probe, what=f"W1 {path}", kill_after=kill_after, timeout=timeout
        )
    finally:
        shutil.rmtree(probe, ignore_errors=True)
    return {"restart_delay_s": restart_delay, **out}


# The jobs' lambdas travel to Spark's Python workers, which cannot import bench/.
cloudpickle.register_pickle_by_value(sys.modules[__name__])
