"""The epochstream side of the benchmark: workloads A, B and C as epochstream jobs.

Each ``run_*`` function builds one job on a fresh :class:`epochstream.Environment`,
runs it to completion, and returns a plain dict (JSON-ready) with the wall time of
``env.execute()``, the events per second and the checkpoint statistics of the
:class:`~epochstream.JobResult`. The wall time covers the whole job: job master start,
Spark barrier-job submission, slot start-up, processing and the final checkpoint, but
not the SparkSession, which the caller creates once and passes in.

This module is pickled by value (see the bottom of the file): the job's lambdas are
defined here and Spark's Python workers cannot import ``bench/``.

Example::

    from epochstream.deploy.spark import create_session
    spark = create_session("local[2]")
    row = run_keyed_sum(10_000_000, spark=spark, checkpoint=1.0, storage="/tmp/ck")
    print(row["rate"], row["checkpoint_stats"]["count"])
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import time
from typing import Any

import cloudpickle

import epochstream as es

__all__ = [
    "checkpoint_summary",
    "count_committed_lines",
    "run_fixed_cost",
    "run_keyed_sum",
    "run_windowed_wordcount",
    "run_wordcount",
]

B_KEYS = 100_000


def _environment(parallelism: int, runner: str, spark: Any) -> es.Environment:
    if runner == "spark":
        return es.Environment(parallelism=parallelism, runner="spark", spark=spark)
    return es.Environment(parallelism=parallelism, runner=runner)


def _enable(env: es.Environment, checkpoint: float | None, storage: str) -> None:
    if checkpoint is None:
        return
    # A fresh directory per run: a leftover checkpoint would make the job restore from it.
    shutil.rmtree(storage, ignore_errors=True)
    env.enable_checkpointing(checkpoint, storage=storage)


def _sink(kind: str, out_dir: str) -> es.sinks.Sink:
    if kind == "discard":
        return es.sinks.DiscardSink()
    if kind == "file":
        shutil.rmtree(out_dir, ignore_errors=True)
        return es.sinks.FileSink(out_dir, format="jsonl")
    raise ValueError(f"unknown sink kind {kind!r} (discard or file)")


def _execute(env: es.Environment, name: str, events: int) -> tuple[es.JobResult, dict[str, Any]]:
    start = time.perf_counter()
    result = env.execute(name)
    wall = time.perf_counter() - start
    row: dict[str, Any] = {
        "events": events,
        "seconds": wall,
        "rate": events / wall,
        "job_duration": result.duration,
        "restarts": result.restarts,
        "checkpoint_stats": checkpoint_summary(result),
    }
    if result.restarts:
        row["failures"] = list(result.failures)
    return result, row


def run_keyed_sum(
    n: int,
    *,
    spark: Any = None,
    parallelism: int = 2,
    runner: str = "spark",
    checkpoint: float | None = None,
    storage: str = "/tmp/epochstream-bench/ck-b",
    sink: str = "discard",
    out_dir: str = "/tmp/epochstream-bench/out-b",
) -> dict[str, Any]:
    """Workload B: keyed running sum over ``from_sequence(0, n)``.

    Example: ``run_keyed_sum(1_000_000, runner="local", checkpoint=1.0)["rate"]``
    """
    env = _environment(parallelism, runner, spark)
    _enable(env, checkpoint, storage)
    (
        env.from_sequence(0, n)
        .uid("numbers")
        .map(lambda i: (i * 7919 % B_KEYS, i % 1000))
        .key_by(lambda t: t[0])
        .reduce(lambda a, b: (a[0], a[1] + b[1]))
        .uid("sums")
        .sink_to(_sink(sink, out_dir))
    )
    _, row = _execute(env, "bench-keyed-sum", n)
    return row


def run_wordcount(
    path: str,
    words: int,
    *,
    spark: Any = None,
    parallelism: int = 2,
    runner: str = "spark",
    checkpoint: float | None = None,
    storage: str = "/tmp/epochstream-bench/ck-a",
    sink: str = "discard",
    out_dir: str = "/tmp/epochstream-bench/out-a",
) -> dict[str, Any]:
    """Workload A: word count over the text at ``path`` (``words`` words in it).

    With ``sink="file"`` the committed output is counted afterwards: the rolling
    reduce emits one record per word, so it must hold exactly ``words`` lines.

    Example: ``run_wordcount("/tmp/words.txt", 2_929_224, checkpoint=1.0)["rate"]``
    """
    env = _environment(parallelism, runner, spark)
    _enable(env, checkpoint, storage)
    (
        env.from_text_file(path)
        .uid("text")
        .flat_map(str.split)
        .map(lambda w: (w.lower(), 1))
        .key_by(lambda t: t[0])
        .reduce(lambda a, b: (a[0], a[1] + b[1]))
        .uid("sums")
        .sink_to(_sink(sink, out_dir))
    )
    _, row = _execute(env, "bench-wordcount", words)
    if sink == "file":
        lines = count_committed_lines(out_dir)
        row["committed_lines"] = lines
        if lines != words:
            raise RuntimeError(
                f"FileSink output in {out_dir} has {lines} committed lines, expected {words}"
            )
    return row


def run_windowed_wordcount(
    path: str,
    words: int,
    *,
    spark: Any = None,
    parallelism: int = 2,
    runner: str = "spark",
    checkpoint: float | None = None,
    storage: str = "/tmp/epochstream-bench/ck-c",
    bound_ms: int = 2_000,
    window_ms: int = 5_000,
) -> dict[str, Any]:
    """Workload C: words per tumbling event-time window over a timestamped text
    (``"<ms> word word ..."``), watermark ``bound_ms`` behind, results discarded.

    Example: ``run_windowed_wordcount("/tmp/words-ts.txt", 2_929_224, checkpoint=1.0)["rate"]``
    """
    env = _environment(parallelism, runner, spark)
    _enable(env, checkpoint, storage)
    (
        env.from_text_file(path)
        .uid("text")
        .assign_timestamps_and_watermarks(
            es.WatermarkStrategy.bounded_out_of_orderness(bound_ms).with_timestamp_assigner(
                lambda line, ts: int(line[: line.index(" ")])
            )
        )
        .flat_map(lambda line: [(w.lower(), 1) for w in line.split()[1:]])
        .key_by(lambda t: t[0])
        .window(es.TumblingEventTimeWindows.of(window_ms))
        .sum(1)
        .uid("window-counts")
        .sink_to(es.sinks.DiscardSink())
    )
    _, row = _execute(env, "bench-windowed-wordcount", words)
    return row


def run_fixed_cost(
    *,
    spark: Any = None,
    parallelism: int = 2,
    runner: str = "spark",
    checkpoint: float | None = 1.0,
    storage: str = "/tmp/epochstream-bench/ck-fixed",
) -> dict[str, Any]:
    """A 1,000-record keyed sum: its wall time is the per-job fixed cost (start-up, teardown).

    Example: ``run_fixed_cost(runner="local")["seconds"]``
    """
    return run_keyed_sum(
        1000,
        spark=spark,
        parallelism=parallelism,
        runner=runner,
        checkpoint=checkpoint,
        storage=storage,
    )


def count_committed_lines(out_dir: str) -> int:
    """Lines in the committed (visible, non-hidden) part files under ``out_dir``.

    Example: ``count_committed_lines("/tmp/epochstream-bench/out-a")``
    """
    total = 0
    for root, dirs, files in os.walk(out_dir):
        dirs[:] = [d for d in dirs if not d.startswith((".", "_"))]
        for name in files:
            if name.startswith((".", "_")):
                continue
            with open(os.path.join(root, name), "rb") as f:
                while chunk := f.read(1 << 22):
                    total += chunk.count(b"\n")
    return total


def checkpoint_summary(result: es.JobResult) -> dict[str, Any]:
    """Count, mean/max duration, max alignment, mean sync/async time and state size.

    Alignment, sync and async are per task; the maxima and means run over every task
    of every checkpoint. ``state_bytes_last`` is the last checkpoint's total.

    Example: ``checkpoint_summary(env.execute())["mean_duration_s"]``
    """
    cps = [c for c in result.checkpoints if c.kind == "checkpoint"]
    if not cps:
        return {"count": 0}
    tasks = [t for c in cps for t in c.tasks.values()]
    durations = [c.duration for c in cps]
    return {
        "count": len(cps),
        "mean_duration_s": statistics.fmean(durations),
        "max_duration_s": max(durations),
        "max_alignment_s": max((t.alignment_s for t in tasks), default=0.0),
        "mean_sync_s": statistics.fmean(t.sync_s for t in tasks) if tasks else 0.0,
        "mean_async_s": statistics.fmean(t.async_s for t in tasks) if tasks else 0.0,
        "state_bytes_last": cps[-1].state_size,
        "state_bytes_max": max(c.state_size for c in cps),
    }


# The lambdas above travel to Spark's Python workers, which cannot import bench/.
cloudpickle.register_pickle_by_value(sys.modules[__name__])
