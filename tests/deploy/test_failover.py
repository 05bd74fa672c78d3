"""Job master failover on the local runner: user errors, lost heartbeats, cancellation."""

from __future__ import annotations

import collections
import os
import signal
import time

import pytest

import epochstream as es


def _explode_on_13(i: int) -> int:
    if i == 13:
        raise ValueError("thirteen is unlucky")
    return i


def test_user_error_names_operator_and_record(tmp_path) -> None:
    env = es.Environment(parallelism=2, runner="local")
    env.from_sequence(0, 100).map(_explode_on_13).print()
    with pytest.raises(es.JobExecutionError) as info:
        env.execute("boom")
    err = info.value
    assert "failed on record 13" in err.cause and "thirteen is unlucky" in err.cause
    assert "ValueError" in err.cause and err.restarts == 0


@pytest.mark.slow
def test_lost_heartbeat_triggers_failover(tmp_path) -> None:
    """A slot that stops responding (SIGSTOP, no crash, sockets stay open) is detected."""
    env = es.Environment(
        parallelism=2, runner="local", heartbeat_interval=0.2, heartbeat_timeout=2.0
    )
    env.enable_checkpointing(0.2, storage=str(tmp_path / "ckpt"))
    env.set_restart_strategy(es.restart.fixed_delay(attempts=2, delay=0.1))
    n = 40_000
    (
        env.from_sequence(0, n, rate=8_000)
        .map(lambda i: (i % 5, 1))
        .key_by(lambda t: t[0])
        .reduce(lambda a, b: (a[0], a[1] + b[1]))
        .sink_to(es.sinks.FileSink(str(tmp_path / "out")))
    )
    client = env.execute_async("hb")
    client.wait_for_checkpoint(1)
    pid = client.slot_pids()[1]
    os.kill(pid, signal.SIGSTOP)
    try:
        result = client.result(timeout=120)
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert result.restarts == 1
    assert "missed heartbeats" in result.failures[0]
    rows = es.testing.read_committed(tmp_path / "out")
    assert collections.Counter(tuple(r) for r in rows).most_common(1)[0][1] == 1
    final: dict[int, int] = {}
    for k, c in rows:
        final[k] = max(final.get(k, 0), c)
    assert final == {k: n // 5 for k in range(5)}


@pytest.mark.slow
def test_cancel_stops_the_job(tmp_path) -> None:
    env = es.Environment(parallelism=2, runner="local")
    env.from_sequence(0, 10**9, rate=1000).sink_to(es.sinks.DiscardSink())
    client = env.execute_async("forever")
    client.wait_until_running()
    pids = client.slot_pids()
    start = time.monotonic()
    client.cancel()
    with pytest.raises(es.JobCancelled):
        client.result(timeout=60)
    assert time.monotonic() - start < 30
    for pid in pids.values():
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def _reject_negative(i: int) -> int:
    if i == 7:
        raise es.DataError("record 7 is malformed")
    return i


def test_data_error_from_user_code_suppresses_restarts() -> None:
    env = es.Environment(parallelism=2, runner="local")
    env.set_restart_strategy(es.restart.fixed_delay(attempts=3, delay=0.1))
    env.from_sequence(0, 50).map(_reject_negative).print()
    with pytest.raises(es.JobExecutionError) as info:
        env.execute("data-error")
    assert info.value.restarts == 0
    assert "record 7 is malformed" in info.value.cause and "failed on record 7" in info.value.cause
