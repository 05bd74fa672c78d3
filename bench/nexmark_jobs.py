"""The Nexmark queries of ``bench/nexmark/queries.py`` timed on epochstream, for ``bench/all.py``.

One job per query, results into ``es.sinks.DiscardSink()``. The events come from the
files ``write_nexmark_files`` wrote for the peers (``files=``: ``<kind>.parquet`` read
as rows or, for the columnar versions in ``bench/nexmark/columnar.py``, as Arrow
batches), or from the generator itself (``streams.NexmarkStreams.generated``: the same
events, with their generation in epochstream's time). Either way a query reads only
the kinds it needs, as the peers' SQL over its person, auction and bid tables. The
rate counts every event of the config, as the peers', whatever part of them a query
reads.

Latency (:func:`run_latency`): the generator's sources throttled to a rate; two probes
pair wall times with event times. One on the query's main input records the event
time each source subtask has reached (``date_time``); one on the results records
each result's timestamp. A result is ready when the input that makes it possible has
been read (``TRIGGERS``): the event itself for stateless queries and q3's join
(timestamp ``t``: the wall time the input subtask that read it reached ``t``; splits
take turns by blocks of positions, so the other subtask jumps past ``t`` from an
earlier block to a later one, while the reader of ``t`` reaches it closely); for
results a watermark fires (windows,
q4's timers at ``expires``), every input subtask reaching ``t + 1 + 4 s`` (the
watermark bound); for q12's processing-time windows, the window's end on the wall
clock. Latency is the result's wall time minus that; results fired only by the end of
the input (past every event time read) are left out. The latency runs generate the
events in order (``out_of_order_group_size=1``; the watermarks keep their 4 s bound):
with shuffled groups, an event read after later ones would look late by up to a
group's event time (1,000 events), which at a low rate is hundreds of milliseconds.

Recovery (:func:`run_recovery`): the same job, checkpoints every 1 s, with the query's
main input also going to a :class:`probes.RateSink`: the rate at which the source hands
out events, which backpressure holds to what the query keeps up with (a query's own
output is too bursty for it: windows fire in bursts). Slot 0 is killed as for W1
(``bench/recovery.py``).

Example::

    run_query("q5", es.sources.nexmark.NexmarkConfig(events=1_000_000), spark=spark, checkpoint=1.0)["rate"]
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from types import ModuleType
from typing import Any

import cloudpickle
import numpy as np
from probes import RateSink, StampSink, read_probe
from recovery import kill_and_measure
from report import latency_summary

import epochstream as es

__all__ = [
    "QUERY_NAMES",
    "TRIGGERS",
    "nexmark_files",
    "queries",
    "ready_times",
    "run_latency",
    "run_query",
    "run_recovery",
]

HERE = os.path.dirname(os.path.abspath(__file__))
SCRATCH = "/tmp/epochstream-bench/nexmark"


def _load_queries() -> tuple[ModuleType, ModuleType, ModuleType]:
    """The row and columnar query modules and the streams of the ``bench/nexmark`` package."""
    sys.path.insert(0, HERE)
    import nexmark
    from nexmark import columnar, queries, streams

    # Slots cannot import bench/: the query functions travel by value.
    cloudpickle.register_pickle_by_value(nexmark)
    return queries, columnar, streams


queries, columnar, streams = _load_queries()
QUERY_NAMES: tuple[str, ...] = tuple(queries.QUERIES)


def nexmark_files(events: int, data_dir: str) -> str:
    """``es.sources.nexmark.write_nexmark_files`` of ``events`` events under ``data_dir``, reused while
    the config and the files' layout match.

    Example: ``nexmark_files(1_000_000, "/tmp/epochstream-bench")``
    """
    config = es.sources.nexmark.NexmarkConfig(events=events)
    directory = os.path.join(data_dir, f"nexmark-{events}")
    stamp = os.path.join(directory, ".config")
    # The layout number changes with write_nexmark_files' layout or the generator's
    # events (2: row groups of 64 k rows; 3: the reference generator's hot-key blocks).
    want = f"{config!r} layout 3\n"
    if os.path.exists(stamp):
        with open(stamp, encoding="utf-8") as f:
            if f.read() == want:
                return directory
    es.sources.nexmark.write_nexmark_files(directory, config)
    with open(stamp, "w", encoding="utf-8") as f:
        f.write(want)
    return directory


def run_query(
    name: str,
    config: es.sources.nexmark.NexmarkConfig,
    *,
    spark: Any,
    parallelism: int = 2,
    checkpoint: float | None = 1.0,
    path: str = "row",
    files: str | None = None,
) -> dict[str, Any]:
    """Run query ``name`` over ``config``'s events; wall time of ``env.execute()``.

    ``path="columnar"``: the query's columnar version (``columnar.COLUMNAR_QUERIES``)
    over Arrow batches of each kind (``streams.NexmarkStreams(columnar=True)``).
    ``files``: read ``write_nexmark_files``' directory (of the same ``config``) instead
    of generating the events: rows from ``events.parquet``, batches from ``<kind>.parquet``.

    Example: ``run_query("q1", es.sources.nexmark.NexmarkConfig(events=100_000), spark=spark)["seconds"]``
    """
    table = columnar.COLUMNAR_QUERIES if path == "columnar" else queries.QUERIES
    if name not in table:
        raise ValueError(f"no {path} Nexmark query {name!r}; choose among {sorted(table)}")
    env = es.Environment(parallelism=parallelism, runner="spark", spark=spark)
    if checkpoint is not None:
        storage = os.path.join(SCRATCH, f"ck-{name}-{path}")
        shutil.rmtree(storage, ignore_errors=True)  # a leftover would be restored
        env.enable_checkpointing(checkpoint, storage=storage)
    columnar_path = path == "columnar"
    inputs = (
        streams.NexmarkStreams.generated(env, config, columnar=columnar_path)
        if files is None
        else streams.NexmarkStreams.from_files(env, files, columnar=columnar_path)
    )
    table[name](inputs).sink_to(es.sinks.DiscardSink())
    start = time.perf_counter()
    result = env.execute(f"nexmark-{name}")
    wall = time.perf_counter() - start
    if result.restarts:
        raise RuntimeError(f"Nexmark {name} restarted {result.restarts} times: {result.failures}")
    return {
        "events": config.events,
        "seconds": wall,
        "rate": config.events / wall,
        "checkpoints_completed": len([c for c in result.checkpoints if c.kind == "checkpoint"]),
    }


#: What makes a query's result possible: its own input event ("element"), the
#: watermark passing its timestamp ("watermark"), or the processing-time clock.
TRIGGERS = {
    "q0": "element",
    "q1": "element",
    "q2": "element",
    "q3": "element",
    "q4": "watermark",
    "q5": "watermark",
    "q7": "watermark",
    "q8": "watermark",
    "q11": "watermark",
    "q12": "processing",
}


class _WithTimestamp(es.ProcessFunction):
    """(timestamp, result): the row results' timestamps for the latency probe."""

    def process_element(self, value: Any, ctx: Any, out: Any) -> None:
        out.collect((ctx.timestamp(), value))


def ready_times(
    clock: dict[int, list[tuple[float, int]]], stamps: list[int], trigger: str, bound_ms: int
) -> list[float | None]:
    """The wall time each result timestamp of ``stamps`` became possible (None: past
    every event time an input reached), from ``clock``: per input subtask, its
    ``(wall time, event time reached)`` samples.

    Example: ``ready_times({0: [(1.0, 5_000)]}, [500], "watermark", 4_000) == [1.0]``
    """
    if trigger == "processing":
        return [(t + 1) / 1000.0 for t in stamps]
    curves = []
    for samples in clock.values():
        ordered = sorted(samples)
        walls = np.array([w for w, _ in ordered])
        reached = np.maximum.accumulate(np.array([e for _, e in ordered], dtype=np.int64))
        curves.append((walls, reached))
    wanted = np.array(stamps, dtype=np.int64) + (1 + bound_ms if trigger == "watermark" else 0)
    when, overshoot = [], []
    for walls, reached in curves:
        at = np.searchsorted(reached, wanted, side="left")
        ok = at < len(reached)
        at = np.minimum(at, len(walls) - 1)
        when.append(np.where(ok, walls[at], np.nan))
        overshoot.append(np.where(ok, reached[at] - wanted, np.iinfo(np.int64).max))
    table = np.vstack(when)
    if trigger == "watermark":
        # A watermark needs every input subtask to have reached the time.
        ready = np.max(table, axis=0)
    else:
        # An event needed only the subtask that read it: the one reaching its time by
        # reading up to it, not by jumping past it into its next block of positions.
        ready = table[np.argmin(np.vstack(overshoot), axis=0), np.arange(len(wanted))]
    return [None if np.isnan(r) else float(r) for r in ready]


def run_latency(
    name: str,
    rate: float,
    seconds: float,
    *,
    spark: Any,
    parallelism: int = 2,
    path: str = "row",
    warmup_s: float = 2.0,
) -> dict[str, Any]:
    """Latency p50/p99 of query ``name``'s results with the generator's sources at
    ``rate`` positions/s for about ``seconds``, checkpoints every 1 s (see the module
    docstring for what a result's latency is).

    Example: ``run_latency("q5", 100_000, 10, spark=spark)["p99_ms"]``
    """
    import tempfile

    table = columnar.COLUMNAR_QUERIES if path == "columnar" else queries.QUERIES
    if name not in table:
        raise ValueError(f"no {path} Nexmark query {name!r}; choose among {sorted(table)}")
    os.makedirs(SCRATCH, exist_ok=True)
    probe = tempfile.mkdtemp(prefix=f"probe-{name}-lat-", dir=SCRATCH)
    try:
        env = es.Environment(parallelism=parallelism, runner="spark", spark=spark)
        storage = os.path.join(SCRATCH, f"ck-{name}-{path}-lat")
        shutil.rmtree(storage, ignore_errors=True)
        env.enable_checkpointing(1.0, storage=storage)
        # In order (no shuffle groups): an event's time then says when it was read.
        config = es.sources.nexmark.NexmarkConfig(
            events=int(rate * seconds), out_of_order_group_size=1
        )
        is_columnar = path == "columnar"
        inputs = streams.NexmarkStreams.generated(env, config, columnar=is_columnar, rate=rate)
        results = table[name](inputs)
        main_input = inputs.of(inputs.used()[-1])
        main_input.sink_to(
            StampSink(probe, "clock", field="date_time", columnar=is_columnar, largest=True)
        )
        # q0 and q1 output every bid: about a thousand samples a second of them are
        # enough for a p99 and cheap for the job. The others output far fewer results.
        every = max(1, int(rate / 1_000)) if name in ("q0", "q1") else 1
        if is_columnar:
            results.sink_to(StampSink(probe, "stamps", field="_ts", columnar=True, every=every))
        else:
            results.process(_WithTimestamp()).sink_to(
                StampSink(probe, "stamps", field=0, every=every)
            )
        env.execute(f"nexmark-{name}-{path}-latency")
        clock: dict[int, list[tuple[float, int]]] = {}
        for line in read_probe(probe, "clock"):
            clock.setdefault(line["subtask"], []).extend((w, e) for w, e in line["samples"])
        outputs = [(w, t) for line in read_probe(probe, "stamps") for w, t in line["samples"]]
        if not clock or not outputs:
            raise RuntimeError(f"Nexmark {name} {path} latency run produced no samples")
        ready = ready_times(
            clock, [t for _, t in outputs], TRIGGERS[name], streams.WATERMARK_BOUND_MS
        )
        start = min(w for samples in clock.values() for w, _ in samples)
        warmup_s = min(warmup_s, seconds / 4)  # short (smoke) runs keep most of their samples
        # Results written before they were ready were fired by the end of the input.
        steady = [
            w - r
            for (w, _), r in zip(outputs, ready, strict=True)
            if r is not None and r <= w and w >= start + warmup_s
        ]
        if not steady:
            raise RuntimeError(f"Nexmark {name} {path}: no result was ready within the run")
        return {"latency_rate": rate, "events": config.events, **latency_summary(steady)}
    finally:
        shutil.rmtree(probe, ignore_errors=True)


def run_recovery(
    name: str,
    config: es.sources.nexmark.NexmarkConfig,
    *,
    spark: Any,
    parallelism: int = 2,
    path: str = "row",
    kill_after: float = 6.0,
    timeout: float = 60.0,
) -> dict[str, Any]:
    """SIGKILL slot 0 of query ``name`` running over ``config``'s events (enough of them
    to last past the recovery); seconds until the event rate is back at 90 %.

    The rate is that of the query's most frequent input kind (bids, else auctions,
    else persons).

    Example: ``run_recovery("q5", es.sources.nexmark.NexmarkConfig(events=20_000_000), spark=spark)``
    """
    import tempfile

    table = columnar.COLUMNAR_QUERIES if path == "columnar" else queries.QUERIES
    if name not in table:
        raise ValueError(f"no {path} Nexmark query {name!r}; choose among {sorted(table)}")
    os.makedirs(SCRATCH, exist_ok=True)
    probe = tempfile.mkdtemp(prefix=f"probe-{name}-rec-", dir=SCRATCH)
    env = es.Environment(parallelism=parallelism, runner="spark", spark=spark)
    storage = os.path.join(SCRATCH, f"ck-{name}-{path}-rec")
    shutil.rmtree(storage, ignore_errors=True)
    env.enable_checkpointing(1.0, storage=storage)
    env.set_restart_strategy(es.restart.fixed_delay(attempts=3, delay=0.0))
    inputs = streams.NexmarkStreams.generated(env, config, columnar=path == "columnar")
    table[name](inputs).sink_to(es.sinks.DiscardSink())
    main_input = inputs.of(inputs.used()[-1])  # KINDS order: the last is the most frequent
    main_input.sink_to(RateSink(probe, columnar=path == "columnar"))
    client = env.execute_async(f"nexmark-{name}-{path}-recovery")
    try:
        out = kill_and_measure(
            client, probe, what=f"Nexmark {name} {path}", kill_after=kill_after, timeout=timeout
        )
    finally:
        shutil.rmtree(probe, ignore_errors=True)
    return {"restart_delay_s": 0.0, "events": config.events, **out}


# _WithTimestamp travels to Spark's Python workers, which cannot import bench/.
cloudpickle.register_pickle_by_value(sys.modules[__name__])
