"""PyFlink peer of ``bench/unaligned_checkpoints.py backpressure``: checkpoint duration
under 100 % backpressure, aligned vs unaligned vs aligned-with-timeout.

The same job: parallelism 2, ``NumberSequenceSource(0, N-1)``, ``i -> (i*7919 % 100000,
i % 1000)``, ``key_by`` the first field, ``reduce`` summing the second, then a map that
holds each subtask to ``--sink-rate`` records/s (sleeps every 64 records, like
``SlowSink`` there), then a discarding sink. Checkpoints every ``--interval`` s, timeout
``--timeout`` s, tolerable failures 1,000,000, in three modes:

* ``aligned``: exactly-once, barriers aligned;
* ``unaligned``: ``enable_unaligned_checkpoints()`` (aligned timeout 0: unaligned at once);
* ``timeout``: unaligned on with ``set_aligned_checkpoint_timeout(--aligned-timeout)``.

Flink runs as its users run it locally: ``execute_async`` on the local mini cluster,
whose REST endpoint (``rest.port`` set to a free port) is polled once a second while the
job runs: ``/jobs/<id>/checkpoints`` for the counts and history, and for each checkpoint
that finished ``/jobs/<id>/checkpoints/details/<cid>`` (end-to-end duration, persisted
in-flight data, checkpoint type) and ``.../details/<cid>/subtasks/<vertex>`` (alignment
duration per subtask; the max over all subtasks is reported).

Handicap: the map/key/reduce/slow-map functions are Python, so Flink runs them outside
the JVM in Beam's fn-execution harness, fed over gRPC in bundles. On a local mini cluster
PyFlink's default is *loopback*: the harness of every Python operator and subtask runs as
threads of the client process (one GIL for the whole job); ``--worker process`` starts a
separate Python worker process per operator chain and subtask instead. Bundles are
bounded by ``python.fn-execution.bundle.size``/``.time``; a Python operator must finish
its open bundle before it can forward a barrier, so the records already handed to the
harness are processed (at the sink rate) inside every checkpoint, aligned or not. ``--bundle-size`` changes that buffer.

Runs in the PyFlink venv (``/tmp/bench-venvs/pyflink``, see ``install.py``)::

    /tmp/bench-venvs/pyflink/bin/python bench/peers/flink_unaligned_checkpoints.py \
        --events 600000 --sink-rate 20000 --timeout 30
    /tmp/bench-venvs/pyflink/bin/python bench/peers/flink_unaligned_checkpoints.py \
        --events 120000 --sink-rate 2000 --timeout 10
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
import urllib.request
from typing import Any

from pyflink.common import Configuration, Duration, Types, WatermarkStrategy
from pyflink.datastream import MapFunction, RuntimeContext, StreamExecutionEnvironment

KEYS = 100_000
MODES = ("aligned", "unaligned", "timeout")


class SlowSink(MapFunction):
    """Holds each subtask to ``per_second`` records/s (a sink that cannot keep up)."""

    def __init__(self, per_second: float) -> None:
        self.per_second = per_second
        self._t0 = 0.0
        self._n = 0

    def open(self, runtime_context: RuntimeContext) -> None:
        self._n = 0

    def map(self, value: Any) -> Any:
        if self._n == 0:
            self._t0 = time.monotonic()
        self._n += 1
        if self._n % 64 == 0:
            ahead = self._n / self.per_second - (time.monotonic() - self._t0)
            if ahead > 0:
                time.sleep(ahead)
        return value


def _to_pair(i: int) -> tuple[int, int]:
    return (i * 7919 % KEYS, i % 1000)


def _key(t: tuple[int, int]) -> int:
    return t[0]


def _add(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    return (a[0], a[1] + b[1])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


class Poller:
    """Collects checkpoint statistics of one job from the REST API."""

    def __init__(self, base: str, job: str) -> None:
        self.base = f"{base}/jobs/{job}/checkpoints"
        self.counts: dict[str, int] = {}
        self.done: dict[int, dict[str, Any]] = {}

    def poll(self) -> None:
        overview = _get(self.base)
        self.counts = overview.get("counts", self.counts)
        for entry in overview.get("history", []):
            cid, status = entry["id"], entry["status"]
            if status == "IN_PROGRESS" or cid in self.done:
                continue
            detail = _get(f"{self.base}/details/{cid}")
            alignment = delay = sync = 0.0
            for vertex in detail.get("tasks", {}):
                sub = _get(f"{self.base}/details/{cid}/subtasks/{vertex}")
                for s in sub.get("subtasks", []):
                    a = (s.get("alignment") or {}).get("duration") or 0
                    alignment = max(alignment, a / 1000.0)
                    delay = max(delay, (s.get("start_delay") or 0) / 1000.0)
                    sync = max(sync, ((s.get("checkpoint") or {}).get("sync") or 0) / 1000.0)
            ctype = str(detail.get("checkpoint_type", ""))
            self.done[cid] = {
                "id": cid,
                "status": status,
                "duration": (detail.get("end_to_end_duration") or 0) / 1000.0,
                "alignment": alignment,
                "start_delay": delay,
                "sync": sync,
                "persisted": detail.get("persisted_data") or 0,
                "processed": detail.get("processed_data") or 0,
                "type": ctype,
                "unaligned": bool(detail.get("is_unaligned")) or "UNALIGNED" in ctype.upper(),
                "trigger": detail.get("trigger_timestamp"),
            }


def _run(mode: str, args: argparse.Namespace) -> tuple[float, Poller, int]:
    port = _free_port()
    ckdir = tempfile.mkdtemp(prefix="flink-ua-ck-")
    conf = Configuration()
    conf.set_string("rest.port", str(port))
    conf.set_string("rest.bind-port", str(port))
    conf.set_string("rest.address", "127.0.0.1")
    conf.set_string("rest.bind-address", "127.0.0.1")
    conf.set_string("web.checkpoints.history", "10000")
    conf.set_string("python.execution-mode", "process")
    conf.set_string("python.executable", sys.executable)
    conf.set_string("python.client.executable", sys.executable)
    if args.state_cache:
        # Keyed state the Python reduce reads/writes is cached in the worker; past this
        # many keys every record is a state round trip to the JVM over gRPC.
        conf.set_string("python.state.cache-size", str(args.state_cache))
    if args.bundle_size:
        conf.set_string("python.fn-execution.bundle.size", str(args.bundle_size))
    conf.set_string("restart-strategy.type", "none")
    conf.set_string("execution.checkpointing.dir", f"file://{ckdir}")
    conf.set_string("state.backend.type", "hashmap")
    conf.set_string("taskmanager.network.memory.buffer-debloat.enabled", str(args.debloat).lower())
    env = StreamExecutionEnvironment.get_execution_environment(conf)
    env.set_parallelism(2)
    env.enable_checkpointing(int(args.interval * 1000))
    cc = env.get_checkpoint_config()
    cc.set_checkpoint_timeout(int(args.timeout * 1000))
    cc.set_tolerable_checkpoint_failure_number(1_000_000)
    if mode != "aligned":
        cc.enable_unaligned_checkpoints()
    if mode == "timeout":
        cc.set_aligned_checkpoint_timeout(Duration.of_millis(int(args.aligned_timeout * 1000)))

    from pyflink.datastream.connectors.base import Sink
    from pyflink.datastream.connectors.number_seq import NumberSequenceSource
    from pyflink.java_gateway import get_gateway

    pair = Types.TUPLE([Types.LONG(), Types.LONG()])
    src = env.from_source(
        NumberSequenceSource(0, args.events - 1), WatermarkStrategy.no_watermarks(), "numbers"
    )
    sums = (
        src.map(_to_pair, output_type=pair)
        .key_by(_key, key_type=Types.LONG())
        .reduce(_add)
        .map(SlowSink(args.sink_rate), output_type=pair)
    )
    discard = get_gateway().jvm.org.apache.flink.streaming.api.functions.sink.v2.DiscardingSink()
    sums.sink_to(Sink(discard))

    start = time.perf_counter()
    client = env.execute_async(f"flink-unaligned-{mode}")
    job = str(client.get_job_id())
    poller = Poller(f"http://127.0.0.1:{port}", job)
    result = client.get_job_execution_result()
    while not result.done():
        time.sleep(1.0)
        try:
            poller.poll()
        except Exception as exc:  # the mini cluster goes away as the job ends
            if not result.done():
                print(f"  poll error: {exc}", file=sys.stderr)
    result.result()
    wall = time.perf_counter() - start
    shutil.rmtree(ckdir, ignore_errors=True)
    return wall, poller, port


def _summary(values: list[float], fmt: str = "{:.2f}") -> str:
    if not values:
        return "-"
    return f"{fmt.format(statistics.median(values))} / {fmt.format(max(values))}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=600_000)
    parser.add_argument("--sink-rate", type=float, default=20_000)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--timeout", type=float, default=30.0)
    parser.add_argument("--aligned-timeout", type=float, default=0.5)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--bundle-size", type=int, default=0, help="0: Flink's default")
    parser.add_argument(
        "--state-cache", type=int, default=0, help="python.state.cache-size (0: default 1000)"
    )
    parser.add_argument("--debloat", action="store_true", help="buffer debloating on")
    parser.add_argument(
        "--worker",
        choices=["loopback", "process"],
        default="loopback",
        help="where the Python functions run: loopback (PyFlink's default on a local mini "
        "cluster: worker threads in this client process, one GIL) or process (one Python "
        "worker process per operator chain and subtask)",
    )
    parser.add_argument("--verbose", action="store_true", help="print every checkpoint")
    args = parser.parse_args()
    if args.worker == "process":
        # Read by StreamExecutionEnvironment._open: skip the loopback worker pool.
        os.environ["_python_worker_execution_mode"] = "process"

    print(
        f"PyFlink keyed running sum, {args.events:,} events, sink {args.sink_rate:,.0f} "
        f"records/s per subtask, p=2, interval {args.interval} s, timeout {args.timeout} s, "
        f"aligned timeout {args.aligned_timeout} s, debloat {'on' if args.debloat else 'off'}, "
        f"bundle size {args.bundle_size or 'default'}, "
        f"state cache {args.state_cache or 'default'}, Python workers: {args.worker}"
    )
    print(
        "mode       | wall s | done | failed | duration s med/max | alignment s med/max "
        "| in-flight KB med/max | unaligned"
    )
    for mode in args.modes.split(","):
        wall, poller, _ = _run(mode, args)
        done = [
            c
            for c in sorted(poller.done.values(), key=lambda c: c["id"])
            if c["status"] == "COMPLETED"
        ]
        completed = poller.counts.get("completed", len(done))
        failed = poller.counts.get("failed", 0)
        print(
            f"{mode:10} | {wall:6.1f} | {completed:4} | {failed:6} | "
            f"{_summary([c['duration'] for c in done]):>18} | "
            f"{_summary([c['alignment'] for c in done]):>19} | "
            f"{_summary([c['persisted'] / 1024 for c in done], '{:.0f}'):>20} | "
            f"{sum(c['unaligned'] for c in done)}",
            flush=True,
        )
        if args.verbose:
            for c in sorted(poller.done.values(), key=lambda c: c["id"]):
                print(
                    f"    #{c['id']:3} {c['status']:9} {c['type']:20} dur {c['duration']:6.2f} s "
                    f"align {c['alignment']:6.2f} s start delay {c['start_delay']:6.2f} s "
                    f"sync {c['sync']:6.2f} s persisted {c['persisted'] / 1024:8.0f} KB "
                    f"processed {c['processed'] / 1024:8.0f} KB",
                    flush=True,
                )


if __name__ == "__main__":
    main()
