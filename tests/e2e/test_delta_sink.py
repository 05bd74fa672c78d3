"""Parquet files -> DeltaSink on Spark with a SIGKILL mid-run: the Delta table equals the
failure-free result, read back with deltalake, and its log holds each application
transaction version once."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from e2e_support import is_python_process

import epochstream as es

deltalake = pytest.importorskip("deltalake")

pytestmark = [pytest.mark.slow, pytest.mark.spark]

FILES, ROWS = 4, 1_500


def _slowly(row: dict[str, Any]) -> dict[str, Any]:
    time.sleep(0.0008)  # keeps the job running for a few seconds, so the kill is mid-run
    return {"id": row["id"], "name": row["name"], "double": row["id"] * 2}


def test_parquet_to_delta_survives_sigkill_with_one_commit_per_checkpoint(
    spark: Any, tmp_path: Path
) -> None:
    inbox, table = tmp_path / "in", tmp_path / "lake" / "events"
    inbox.mkdir()
    expected = []
    for f in range(FILES):
        rows = [{"id": f * ROWS + i, "name": f"n{i % 37}"} for i in range(ROWS)]
        pq.write_table(pa.Table.from_pylist(rows), inbox / f"f{f}.parquet", row_group_size=500)
        expected += [{"id": r["id"], "name": r["name"], "double": r["id"] * 2} for r in rows]

    env = es.Environment(parallelism=2, spark=spark)
    env.enable_checkpointing(0.3, storage=str(tmp_path / "ckpt"))
    env.set_restart_strategy(es.restart.fixed_delay(attempts=3, delay=0.2))
    (
        env.from_files(str(inbox), format="parquet")
        .uid("parquet-in")
        .map(_slowly)
        .uid("rows")
        .sink_to(es.sinks.DeltaSink(str(table)))
        .uid("delta")
    )
    client = env.execute_async("parquet-to-delta")
    try:
        client.wait_for_checkpoint(2)
        assert not client.done
        pid = client.slot_pids()[1]
        assert is_python_process(pid)
        os.kill(pid, signal.SIGKILL)
        result = client.result(timeout=180)
    finally:
        if not client.done:
            client.cancel()

    assert result.restarts >= 1
    got = deltalake.DeltaTable(str(table)).to_pyarrow_table().to_pylist()
    assert sorted(got, key=lambda r: r["id"]) == expected
    versions = []
    for log in sorted((table / "_delta_log").glob("*.json")):
        for line in log.read_text().splitlines():
            action = json.loads(line)
            if "txn" in action:
                versions.append(action["txn"]["version"])
    assert versions == sorted(set(versions)), f"a checkpoint committed twice: {versions}"
    assert len(versions) >= 2
