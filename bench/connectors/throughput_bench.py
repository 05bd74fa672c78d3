"""Connector throughput at parallelism 2 with 1 s checkpoints, on Spark ``local[2]``.

Sources feed ``DiscardSink``; sinks are fed by ``from_sequence(...).map(row)``. Each
epochstream figure is the wall time of the job (``env.execute``, or for the unbounded
JetStream source, from submission until the consumer's ack floor reaches the last
message: acks follow completed checkpoints, so that includes up to one checkpoint
interval). References on the same data: a plain ``COPY`` of the rows with psycopg for
``PostgresSink``, and ``nats-py`` alone draining the stream (pull consumer with
AckPolicy.ALL, batches of 1,000, acking the last of each) for ``JetStreamSource``.
PostgreSQL and nats-server run on loopback, started the way the tests start them
(tests/pg_server.py, tests/nats_server.py).

Example::

    .venv/bin/python bench/connectors/throughput_bench.py            # about 3 min
    .venv/bin/python bench/connectors/throughput_bench.py --rows 50000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests"))

from machine import machine_facts, machine_line  # noqa: E402

import epochstream as es  # noqa: E402
from nats_server import NatsServer  # noqa: E402
from pg_server import PostgresServer  # noqa: E402


def row(i: int) -> dict[str, Any]:
    return {"id": i, "user": f"user-{i % 1000}", "amount": i % 977, "note": "x" * 40}


def dir_bytes(path: str) -> int:
    return sum(
        os.path.getsize(os.path.join(d, f))
        for d, _, files in os.walk(path)
        for f in files
        if not f.startswith((".", "_"))
    )


class Bench:
    def __init__(self, spark: Any, rows: int, repeat: int) -> None:
        self.spark = spark
        self.rows = rows
        self.repeat = repeat
        self.results: list[dict[str, Any]] = []

    def env(self, ckpt: str) -> es.Environment:
        env = es.Environment(parallelism=2, spark=self.spark)
        env.enable_checkpointing(1.0, storage=ckpt)
        return env

    def measure(self, name: str, nbytes: int, run: Callable[[], float]) -> None:
        runs = [run() for _ in range(self.repeat)]
        best = statistics.median(runs)
        self.results.append(
            {
                "name": name,
                "rows": self.rows,
                "bytes": nbytes,
                "seconds": runs,
                "rows_per_s": self.rows / best,
                "mb_per_s": nbytes / best / 1e6,
            }
        )
        print(f"{name}: {self.rows / best:,.0f} rows/s, {nbytes / best / 1e6:.1f} MB/s ({runs})")

    def job(self, build: Callable[[es.Environment], None]) -> float:
        with tempfile.TemporaryDirectory() as ckpt:
            env = self.env(ckpt)
            build(env)
            start = time.perf_counter()
            env.execute("connector-bench")
            return time.perf_counter() - start


def file_sources(b: Bench, work: str) -> None:
    rows = [row(i) for i in range(b.rows)]
    jsonl = os.path.join(work, "in-jsonl")
    os.makedirs(jsonl)
    for part in range(4):
        with open(os.path.join(jsonl, f"p{part}.jsonl"), "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows[part::4])
    pq_dir = os.path.join(work, "in-parquet")
    os.makedirs(pq_dir)
    import pyarrow as pa
    import pyarrow.parquet as pq

    for part in range(4):
        pq.write_table(
            pa.Table.from_pylist(rows[part::4]),
            os.path.join(pq_dir, f"p{part}.parquet"),
            row_group_size=25_000,
        )
    for fmt, path in (("jsonl", jsonl), ("parquet", pq_dir)):
        b.measure(
            f"from_files {fmt} -> DiscardSink",
            dir_bytes(path),
            lambda fmt=fmt, path=path: b.job(
                lambda env: env.from_files(path, format=fmt).sink_to(es.sinks.DiscardSink())
            ),
        )


def file_sinks(b: Bench, work: str) -> None:
    for fmt in ("jsonl", "parquet"):
        out = os.path.join(work, f"out-{fmt}")

        def run(fmt: str = fmt, out: str = out) -> float:
            import shutil

            shutil.rmtree(out, ignore_errors=True)
            return b.job(
                lambda env: (
                    env.from_sequence(0, b.rows)
                    .map(row)
                    .sink_to(es.sinks.FileSink(out, format=fmt))
                )
            )

        run()  # to size the output
        b.measure(f"FileSink {fmt}", dir_bytes(out), run)


def postgres(b: Bench) -> None:
    import psycopg

    server = PostgresServer().start()
    try:
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE t (id bigint, user_id text, amount int, note text)")
        rows = [tuple(row(i).values()) for i in range(b.rows)]
        nbytes = sum(len(str(v)) + 1 for r in rows for v in r)

        def truncate() -> None:
            with psycopg.connect(server.dsn, autocommit=True) as conn:
                conn.execute("TRUNCATE t")

        def sink() -> float:
            truncate()
            took = b.job(
                lambda env: (
                    env.from_sequence(0, b.rows)
                    .map(lambda i: tuple(row(i).values()))
                    .sink_to(es.sinks.PostgresSink(server.dsn, "t"))
                )
            )
            with psycopg.connect(server.dsn) as conn:
                assert conn.execute("SELECT count(*) FROM t").fetchone() == (b.rows,)
            return took

        def plain_copy() -> float:
            truncate()
            start = time.perf_counter()
            with psycopg.connect(server.dsn) as conn, conn.cursor() as cur:
                with cur.copy("COPY t (id, user_id, amount, note) FROM STDIN") as copy:
                    for r in rows:
                        copy.write_row(r)
            return time.perf_counter() - start

        b.measure("PostgresSink two_phase", nbytes, sink)
        b.measure("reference: one psycopg COPY of the same rows", nbytes, plain_copy)
    finally:
        server.stop()


def jetstream(b: Bench) -> None:
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig, StreamConfig

    server = NatsServer().start()
    payloads = [json.dumps(row(i)).encode() for i in range(b.rows)]
    nbytes = sum(map(len, payloads))

    async def admin(work: Callable[[Any], Any]) -> Any:
        nc = await nats.connect(server.url)
        try:
            return await work(nc.jetstream())
        finally:
            await nc.close()

    async def fill(js: Any) -> None:
        await js.add_stream(StreamConfig(name="IN", subjects=["in"]))
        for i in range(0, len(payloads), 1000):
            await asyncio.gather(*(js.publish("in", p) for p in payloads[i : i + 1000]))

    try:
        asyncio.run(admin(fill))

        def source() -> float:
            async def names(js: Any) -> set[str]:
                return {c.name for c in await js.consumers_info("IN")}

            before = asyncio.run(admin(names))  # consumers of earlier runs linger a while
            with tempfile.TemporaryDirectory() as ckpt:
                env = b.env(ckpt)
                env.from_source(es.sources.JetStreamSource(server.url, "IN")).sink_to(
                    es.sinks.DiscardSink()
                )
                start = time.perf_counter()
                client = env.execute_async("jetstream-bench")
                try:
                    while True:
                        floors = asyncio.run(admin(lambda js: js.consumers_info("IN")))
                        if any(
                            c.name not in before and c.ack_floor.stream_seq >= b.rows
                            for c in floors
                        ):
                            return time.perf_counter() - start
                        time.sleep(0.05)
                finally:
                    client.cancel()

        def alone() -> float:
            async def drain(js: Any) -> float:
                start = time.perf_counter()
                config = ConsumerConfig(ack_policy=AckPolicy.ALL, max_ack_pending=-1)
                sub = await js.pull_subscribe("in", stream="IN", config=config)
                got = 0
                while got < b.rows:
                    msgs = await sub.fetch(1000, timeout=5)
                    if msgs:
                        got += len(msgs)
                        await msgs[-1].ack()
                return time.perf_counter() - start

            return float(asyncio.run(admin(drain)))

        b.measure("JetStreamSource -> DiscardSink", nbytes, source)
        b.measure("reference: nats-py pull consumer alone", nbytes, alone)

        def sink() -> float:
            async def reset(js: Any) -> None:
                try:
                    await js.delete_stream("OUT")
                except Exception:  # first run: no stream yet
                    pass
                await js.add_stream(StreamConfig(name="OUT", subjects=["out"]))

            asyncio.run(admin(reset))
            return b.job(
                lambda env: (
                    env.from_sequence(0, b.rows)
                    .map(lambda i: json.dumps(row(i)))
                    .sink_to(es.sinks.JetStreamSink(server.url, "out"))
                )
            )

        b.measure("JetStreamSink", nbytes, sink)
    finally:
        server.stop()


def delta(b: Bench, work: str) -> None:
    out = os.path.join(work, "delta")

    def run() -> float:
        import shutil

        shutil.rmtree(out, ignore_errors=True)
        return b.job(
            lambda env: env.from_sequence(0, b.rows).map(row).sink_to(es.sinks.DeltaSink(out))
        )

    run()
    b.measure("DeltaSink", dir_bytes(out), run)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--out", default=os.path.join(HERE, "throughput.json"))
    args = parser.parse_args()
    from epochstream.deploy.spark import create_session

    machine = machine_facts(spark=True)
    spark = create_session("local[2]", app_name="connector-bench")
    b = Bench(spark, args.rows, args.repeat)
    try:
        b.job(lambda env: env.from_sequence(0, 1000).sink_to(es.sinks.DiscardSink()))  # warm-up
        with tempfile.TemporaryDirectory() as work:
            file_sources(b, work)
            file_sinks(b, work)
            delta(b, work)
        postgres(b)
        jetstream(b)
    finally:
        spark.stop()
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump({"machine": machine, "results": b.results}, f, indent=2)
    print(machine_line(machine))
    print("| connector | rows/s | MB/s | seconds per run |")
    for r in b.results:
        runs = ", ".join(f"{s:.2f}" for s in r["seconds"])
        print(f"| {r['name']} | {r['rows_per_s']:,.0f} | {r['mb_per_s']:.1f} | {runs} |")


if __name__ == "__main__":
    main()
