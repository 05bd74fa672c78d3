"""A SQL statement stopped with a savepoint and started again from it, on Spark.

1. ``execute_sql(..., wait=False)``, stop with a savepoint mid-run at parallelism 2,
   then the same script ``from_savepoint`` at parallelism 3: the union of the committed
   output equals DuckDB's over the whole input (no window lost or repeated).
2. The same savepoint under a changed query (another window size): the aggregation's
   uid follows the query, so its state has no operator to go to and the restore fails
   saying so, unless ``allow_non_restored_state=True``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

import epochstream as es

sys.path.insert(0, str(Path(__file__).parents[1] / "sql"))

from duckdb_oracle import run_duckdb
from nexmark_tables import nexmark_arrow_tables, nexmark_ddl, read_sink_rows

pytestmark = [pytest.mark.slow, pytest.mark.spark]

EVENTS = 40_000
RATE = 8_000  # positions/s of the source: about 5 s of input, so the stop lands mid-run

INSERT = """INSERT INTO out
SELECT channel, window_start, window_end, COUNT(*) AS bids, SUM(price) AS total,
       COUNT(DISTINCT bidder) AS bidders, MAX(price) AS top
FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(`dateTime`), INTERVAL '{seconds}' SECOND))
GROUP BY channel, window_start, window_end"""


def _script(out: Path, *, seconds: int = 1) -> str:
    ddl = nexmark_ddl(events=EVENTS).replace(
        "'first-event.rate'", f"'rate' = '{RATE}', 'first-event.rate'"
    )
    sink = (
        "CREATE TABLE out (channel STRING, window_start TIMESTAMP(3), window_end TIMESTAMP(3), "
        "bids BIGINT, total BIGINT, bidders BIGINT, top BIGINT) "
        f"WITH ('connector' = 'filesystem', 'path' = '{out}', 'format' = 'parquet');"
    )
    return f"{ddl}\n{sink}\n{INSERT.format(seconds=seconds)}"


def _env(spark: Any, parallelism: int, ckpt: Path) -> es.Environment:
    env = es.Environment(parallelism=parallelism, spark=spark)
    env.enable_checkpointing(0.3, storage=str(ckpt))
    return env


def _stopped_midway(spark: Any, tmp_path: Path) -> tuple[str, Path]:
    """The statement run at parallelism 2 and stopped with a savepoint after two
    checkpoints; the savepoint's path and the output directory."""
    out = tmp_path / "out"
    client = _env(spark, 2, tmp_path / "ck").execute_sql(_script(out), wait=False)
    client.wait_for_checkpoint(2)
    path = client.cancel(savepoint=str(tmp_path / "savepoints"))
    with pytest.raises(es.JobCancelled, match="stopped with a savepoint"):
        client.result(timeout=60)
    assert path and os.path.isfile(os.path.join(path, "_metadata"))
    return path, out


def test_stop_with_savepoint_and_resume_the_statement_at_parallelism_3(
    spark: Any, tmp_path: Path
) -> None:
    path, out = _stopped_midway(spark, tmp_path)
    expected = run_duckdb(INSERT.format(seconds=1), nexmark_arrow_tables(events=EVENTS))
    before = len(read_sink_rows(str(out)))
    assert before < len(expected), "the first job must stop mid-run"

    result = _env(spark, 3, tmp_path / "ck").execute_sql(_script(out), from_savepoint=path)
    assert result is not None and result.restored_from == path
    assert sorted(read_sink_rows(str(out))) == sorted(expected)


def test_a_changed_window_does_not_restore_the_savepoint_unless_allowed(
    spark: Any, tmp_path: Path
) -> None:
    path, out = _stopped_midway(spark, tmp_path)
    changed = _script(out, seconds=2)
    with pytest.raises(es.StateError, match="has no operator with that uid"):
        _env(spark, 2, tmp_path / "ck").execute_sql(changed, from_savepoint=path)

    result = _env(spark, 2, tmp_path / "ck").execute_sql(
        changed, from_savepoint=path, allow_non_restored_state=True
    )
    assert result is not None and result.restored_from == path
