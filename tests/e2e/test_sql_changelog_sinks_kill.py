"""Updating SQL results into the changelog sinks through a SIGKILL of a slot, on Spark:
one statement set writes a GROUP BY without a window (a changelog of +I/-U/+U) over a
bounded, rate-limited Nexmark table into a ``delta`` table with a PRIMARY KEY (a MERGE
per checkpoint), an ``upsert-kafka`` topic (keyed records in Kafka transactions) and a
``filesystem`` table with ``'changelog-mode' = 'all'`` (every change with its kind),
checkpointing every 0.3 s. A slot is killed after the first checkpoints complete; the
restarted job replays from the last checkpoint. At the end each sink holds exactly
DuckDB's answer: the Delta table as it is, the topic read as a compacted view (and each
key's counts strictly increasing, so no change was written twice), the files with each
row's sign summed (no row retracted more often than added).
"""

from __future__ import annotations

import collections
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from e2e_support import is_python_process

import epochstream as es

sys.path.insert(0, str(Path(__file__).parents[1] / "sql"))

from duckdb_oracle import run_duckdb
from nexmark_tables import nexmark_arrow_tables, nexmark_ddl

deltalake = pytest.importorskip("deltalake")

pytestmark = [pytest.mark.slow, pytest.mark.spark]

EVENTS = 60_000
RATE = 6_000  # positions/s of the source: about 10 s of input, so the kill lands mid-run
WAIT = 120.0
PARTITIONS = 2

PER_BIDDER = (
    "SELECT bidder, COUNT(*) AS bids, SUM(price) AS total, AVG(price) AS mean "
    "FROM bid GROUP BY bidder"
)
COLUMNS = "bidder BIGINT, bids BIGINT, total BIGINT, mean BIGINT"


def _script(delta: Path, bootstrap: str, topic: str, files: Path) -> str:
    ddl = nexmark_ddl(events=EVENTS).replace(
        "'first-event.rate'", f"'rate' = '{RATE}', 'first-event.rate'"
    )
    return f"""{ddl}
CREATE TABLE lake ({COLUMNS}, PRIMARY KEY (bidder) NOT ENFORCED)
  WITH ('connector' = 'delta', 'table-path' = '{delta}');
CREATE TABLE topic ({COLUMNS}, PRIMARY KEY (bidder) NOT ENFORCED)
  WITH ('connector' = 'upsert-kafka', 'topic' = '{topic}',
        'properties.bootstrap.servers' = '{bootstrap}', 'key.format' = 'json',
        'value.format' = 'json', 'sink.transactional-id-prefix' = 'kill-{topic}');
CREATE TABLE changes ({COLUMNS})
  WITH ('connector' = 'filesystem', 'path' = '{files}', 'format' = 'parquet',
        'changelog-mode' = 'all');
EXECUTE STATEMENT SET BEGIN
INSERT INTO lake {PER_BIDDER};
INSERT INTO topic {PER_BIDDER};
INSERT INTO changes {PER_BIDDER};
END;
"""


def _row(r: dict[str, Any]) -> tuple[Any, ...]:
    return (r["bidder"], r["bids"], r["total"], r["mean"])


def test_changelogs_reach_delta_kafka_and_files_exactly_through_a_slot_sigkill(
    spark: Any, tmp_path: Path, kafka_server: Any
) -> None:
    topic = kafka_server.new_topic("per-bidder", partitions=PARTITIONS)
    delta, files = tmp_path / "lake", tmp_path / "changes"
    env = es.Environment(parallelism=2, spark=spark)
    env.enable_checkpointing(0.3, storage=str(tmp_path / "ck"))
    env.set_restart_strategy(es.restart.fixed_delay(attempts=3, delay=0.2))
    client: Any = env.execute_sql(_script(delta, kafka_server.bootstrap, topic, files), wait=False)
    try:
        client.wait_for_checkpoint(3, timeout=WAIT)
        assert not client.done, "the input ended before the kill: raise EVENTS or lower RATE"
        pid = client.slot_pids()[1]
        assert is_python_process(pid)
        os.kill(pid, signal.SIGKILL)
        client.result(timeout=WAIT)
    finally:
        if not client.done:
            client.cancel()
    assert client.attempt >= 2, "the kill did not restart the job"

    expected = collections.Counter(run_duckdb(PER_BIDDER, nexmark_arrow_tables(events=EVENTS)))
    assert len(expected) > 100

    lake = deltalake.DeltaTable(str(delta)).to_pyarrow_table().to_pylist()
    assert collections.Counter(map(_row, lake)) == expected, "delta"

    view: dict[bytes, tuple[Any, ...]] = {}
    counts: dict[bytes, int] = {}
    for _, _, key, value in kafka_server.read_committed(topic, PARTITIONS):
        assert value is not None, "a GROUP BY of growing counts deletes nothing"
        row = _row(json.loads(value))
        assert row[1] > counts.get(key, 0), f"key {key!r}: a change written twice"
        counts[key] = row[1]
        view[key] = row
    assert collections.Counter(view.values()) == expected, "upsert-kafka"

    signs = {"+I": 1, "+U": 1, "-U": -1, "-D": -1}
    net: collections.Counter[tuple[Any, ...]] = collections.Counter()
    for part in files.glob("part-*"):
        for r in pq.read_table(part).to_pylist():
            net[_row(r)] += signs[r["op"]]
    assert set(net.values()) <= {0, 1}, "a change written twice"
    assert collections.Counter(row for row, n in net.items() if n) == expected, "filesystem"
