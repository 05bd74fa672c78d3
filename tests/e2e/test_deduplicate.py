"""Deduplication end to end: a source that redelivers 10 % of its records, a SIGKILL
mid-run on Spark, and an exactly-once sink: the committed output has each id once."""

from __future__ import annotations

import datetime as dt
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from e2e_support import is_python_process

import epochstream as es

pytestmark = [pytest.mark.slow, pytest.mark.spark]

IDS = 20_000
POSITIONS = IDS // 10 * 11  # every 11th record redelivers an id of its block


def _event(position: int) -> dict[str, Any]:
    block, slot = divmod(position, 11)
    offset = 3 if slot == 10 else slot
    return {"id": f"ev-{block * 10 + offset}", "position": position}


def test_redelivered_records_come_out_once_across_a_crash(spark: Any, tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = es.Environment(parallelism=2, spark=spark)
    env.enable_checkpointing(0.3, storage=str(tmp_path / "ckpt"))
    env.set_restart_strategy(es.restart.fixed_delay(attempts=3, delay=0.2))
    (
        env.from_sequence(0, POSITIONS, rate=7_000)
        .uid("positions")
        .map(_event)
        .uid("events")
        .deduplicate(lambda e: e["id"], ttl=dt.timedelta(hours=1))
        .uid("dedup")
        .map(lambda e: e["id"])
        .uid("ids")
        .sink_to(es.sinks.FileSink(str(out)))
        .uid("out")
    )
    client = env.execute_async("dedup-sigkill")
    try:
        client.wait_for_checkpoint(1)
        assert not client.done
        pid = client.slot_pids()[0]
        assert is_python_process(pid)
        os.kill(pid, signal.SIGKILL)
        result = client.result(timeout=180)
    finally:
        if not client.done:
            client.cancel()

    assert result.restarts >= 1
    ids = es.testing.read_committed(out)
    assert len(ids) == IDS, f"{len(ids) - len(set(ids))} duplicates, {IDS - len(set(ids))} missing"
    assert sorted(ids) == sorted(f"ev-{i}" for i in range(IDS))
    redelivered = POSITIONS - IDS
    assert redelivered == IDS // 10, "the input did redeliver 10 % of its records"
