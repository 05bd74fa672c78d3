"""JetStream source -> keyed counts -> JetStream sink on Spark, with a SIGKILL and a
rescale from a savepoint (2 -> 3): the output stream holds each result exactly once,
so no message was read twice or skipped."""

from __future__ import annotations

import asyncio
import collections
import json
import os
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from e2e_support import is_python_process

import epochstream as es

nats = pytest.importorskip("nats")

pytestmark = [pytest.mark.slow, pytest.mark.spark]

KEYS = 6


async def _with_js(url: str, work: Any) -> Any:
    nc = await nats.connect(url)
    try:
        return await work(nc.jetstream())
    finally:
        await nc.close()


def _publish(
    url: str, subject: str, start: int, count: int, expected: collections.Counter[str]
) -> None:
    events = [{"user": f"u{(start + i) * 7 % KEYS}", "i": start + i} for i in range(count)]
    expected.update(e["user"] for e in events)

    async def work(js: Any) -> None:
        for e in events:
            await js.publish(subject, json.dumps(e).encode())

    asyncio.run(_with_js(url, work))


def _out(url: str, stream: str) -> list[dict[str, Any]]:
    async def work(js: Any) -> list[dict[str, Any]]:
        info = await js.stream_info(stream)
        if info.state.messages == 0:
            return []
        return [
            json.loads((await js.get_msg(stream, seq)).data)
            for seq in range(info.state.first_seq, info.state.last_seq + 1)
        ]

    return asyncio.run(_with_js(url, work))


def _wait_for(url: str, stream: str, count: int, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while len(_out(url, stream)) < count:
        assert time.monotonic() < deadline, f"{len(_out(url, stream))} of {count} results"
        time.sleep(0.2)


def _job(env: es.Environment, url: str, instream: str, outsubject: str) -> None:
    (
        env.from_source(es.sources.JetStreamSource(url, instream, subject=f"{instream}.events"))
        .uid("nats-in")
        .map(lambda data: (json.loads(data)["user"], 1))
        .uid("ones")
        .key_by(lambda t: t[0])
        .reduce(lambda a, b: (a[0], a[1] + b[1]))
        .uid("counts")
        .map(lambda t: json.dumps({"user": t[0], "n": t[1]}))
        .uid("encode")
        .sink_to(es.sinks.JetStreamSink(url, outsubject, sink_id="counts"))
        .uid("nats-out")
    )


def _env(spark: Any, parallelism: int, ckpt: Path) -> es.Environment:
    env = es.Environment(parallelism=parallelism, spark=spark)
    env.enable_checkpointing(0.3, storage=str(ckpt))
    env.set_restart_strategy(es.restart.fixed_delay(attempts=3, delay=0.2))
    return env


def test_jetstream_counts_exactly_once_across_sigkill_and_rescale(
    spark: Any, tmp_path: Path, nats_url: str
) -> None:
    from nats.js.api import StreamConfig

    instream, outstream = f"IN{uuid.uuid4().hex[:8]}", f"OUT{uuid.uuid4().hex[:8]}"
    outsubject = f"{outstream}.counts"

    async def setup(js: Any) -> None:
        await js.add_stream(StreamConfig(name=instream, subjects=[f"{instream}.>"]))
        await js.add_stream(
            StreamConfig(name=outstream, subjects=[outsubject], duplicate_window=300.0)
        )

    asyncio.run(_with_js(nats_url, setup))
    expected: collections.Counter[str] = collections.Counter()
    _publish(nats_url, f"{instream}.events", 0, 60, expected)
    _publish(nats_url, f"{instream}.other", 0, 5, collections.Counter())  # filtered out
    ckpt, sp = tmp_path / "ckpt", tmp_path / "sp"

    first = _env(spark, 2, ckpt)
    _job(first, nats_url, instream, outsubject)
    client = first.execute_async("jetstream-p2")
    try:
        client.wait_for_checkpoint(1)
        _wait_for(nats_url, outstream, 10)
        pid = client.slot_pids()[0]  # subtask 0 reads the stream (one split)
        assert is_python_process(pid)
        os.kill(pid, signal.SIGKILL)
        _publish(nats_url, f"{instream}.events", 60, 40, expected)
        deadline = time.monotonic() + 60
        while client.status()["restarts"] < 1:
            assert time.monotonic() < deadline, "the SIGKILL caused no restart"
            time.sleep(0.1)
        _wait_for(nats_url, outstream, sum(expected.values()))
        savepoint = client.cancel(savepoint=str(sp))
    finally:
        if not client.done:
            client.cancel()

    _publish(nats_url, f"{instream}.events", 100, 30, expected)
    second = _env(spark, 3, ckpt)
    _job(second, nats_url, instream, outsubject)
    client = second.execute_async("jetstream-p3", from_savepoint=savepoint)
    try:
        _wait_for(nats_url, outstream, sum(expected.values()))
        time.sleep(1.0)  # a duplicate would be published by now
        client.cancel(savepoint=str(sp))
    finally:
        if not client.done:
            client.cancel()

    results = _out(nats_url, outstream)
    per_user: dict[str, list[int]] = collections.defaultdict(list)
    for r in results:
        per_user[r["user"]].append(r["n"])
    assert {u: sorted(ns) for u, ns in per_user.items()} == {
        u: list(range(1, c + 1)) for u, c in expected.items()
    }, "each result exactly once"
