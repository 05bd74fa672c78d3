"""The Nexmark queries of ``bench/nexmark/queries.py`` timed on epochstream, for ``bench/all.py``.

One job per query, results into ``es.sinks.DiscardSink()``. The events come from the
files ``write_nexmark_files`` wrote for the peers (``files=``: ``<kind>.parquet`` read
as rows or, for the columnar versions in ``bench/nexmark/columnar.py``, as Arrow
batches), or from the generator itself (``streams.NexmarkStreams.generated``: the same
events, with their generation in epochstream's time). Either way a query reads only
the kinds it needs, as the peers' SQL over its person, auction and bid tables. The
rate counts every event of the config, as the peers', whatever part of them a query
reads.

Recovery (:func:`run_recovery`): the same job, checkpoints every 1 s, with the query's
main input also going to a :class:`probes.RateSink`: the rate at which the source hands
out events, which backpressure holds to what the query keeps up with (a query's own
output is too bursty for it: windows fire in bursts). Slot 0 is killed as for W1
(``bench/recovery.py``).

Example::

    run_query("q5", es.NexmarkConfig(events=1_000_000), spark=spark, checkpoint=1.0)["rate"]
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from types import ModuleType
from typing import Any

import cloudpickle
from probes import RateSink
from recovery import kill_and_measure

import epochstream as es

__all__ = ["QUERY_NAMES", "queries", "run_query", "run_recovery"]

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


def run_query(
    name: str,
    config: es.NexmarkConfig,
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

    Example: ``run_query("q1", es.NexmarkConfig(events=100_000), spark=spark)["seconds"]``
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


def run_recovery(
    name: str,
    config: es.NexmarkConfig,
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

    Example: ``run_recovery("q5", es.NexmarkConfig(events=20_000_000), spark=spark)``
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
