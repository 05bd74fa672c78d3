"""File sources and sinks end to end on Spark.

1. A monitored JSON-lines directory with files added while running -> keyed running
   counts -> Parquet FileSink; stop with a savepoint at parallelism 2, add files, resume
   at 3: no file is read twice or skipped, and ``spark.read.parquet`` reads the
   committed output back.
2. Malformed JSON lines, CSV rows and Parquet files: the job fails at once naming file
   and place; with ``on_error="dead_letter"`` the valid output is complete and the dead
   letters are exactly the bad records.
3. Files arriving in a monitored directory while one subtask is slow: splits are
   assigned on request, so the fast subtask reads most of them; the output is exact.
"""

from __future__ import annotations

import collections
import json
import os
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import epochstream as es

pytestmark = [pytest.mark.slow, pytest.mark.spark]

KEYS = 7


def _drop_file(directory: Path, name: str, rows: list[dict[str, Any]]) -> None:
    """Write a JSON-lines file under a hidden name, then rename it in (as it must appear)."""
    hidden = directory / f".{name}"
    hidden.write_text("".join(json.dumps(r) + "\n" for r in rows))
    os.replace(hidden, directory / name)


def _rows(file_no: int, count: int) -> list[dict[str, Any]]:
    return [{"user": f"u{(file_no * 31 + i) % KEYS}", "i": i} for i in range(count)]


def _committed(out: Path) -> list[dict[str, Any]]:
    if not out.exists():
        return []
    return pq.read_table(out).to_pylist() if any(out.glob("part-*.parquet")) else []


def _wait_for_rows(out: Path, count: int, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while len(_committed(out)) < count:
        assert time.monotonic() < deadline, f"{len(_committed(out))} of {count} rows committed"
        time.sleep(0.2)


def _counting_job(env: es.Environment, inbox: Path, out: Path) -> None:
    (
        env.from_files(str(inbox), format="jsonl", monitor_interval=0.2)
        .uid("files")
        .map(lambda r: (r["user"], 1))
        .uid("ones")
        .key_by(lambda t: t[0])
        .reduce(lambda a, b: (a[0], a[1] + b[1]))
        .uid("counts")
        .map(lambda t: {"user": t[0], "n": t[1]})
        .uid("rows")
        .sink_to(es.sinks.FileSink(str(out), format="parquet"))
        .uid("parquet")
    )


def _env(spark: Any, parallelism: int, ckpt: Path) -> es.Environment:
    env = es.Environment(parallelism=parallelism, spark=spark)
    env.enable_checkpointing(0.3, storage=str(ckpt))
    env.set_restart_strategy(es.restart.fixed_delay(attempts=2, delay=0.2))
    return env


def test_monitored_directory_rescaled_from_a_savepoint_reads_each_file_once(
    spark: Any, tmp_path: Path
) -> None:
    inbox, out, ckpt, sp = tmp_path / "in", tmp_path / "out", tmp_path / "ckpt", tmp_path / "sp"
    inbox.mkdir()
    sizes = [40, 25, 33, 17, 50, 12]
    expected: collections.Counter[str] = collections.Counter()
    for no in range(2):
        rows = _rows(no, sizes[no])
        expected.update(r["user"] for r in rows)
        _drop_file(inbox, f"f{no}.jsonl", rows)

    first = _env(spark, 2, ckpt)
    _counting_job(first, inbox, out)
    client = first.execute_async("monitor-p2")
    try:
        client.wait_for_checkpoint(1)
        for no in (2, 3):  # discovered while running
            rows = _rows(no, sizes[no])
            expected.update(r["user"] for r in rows)
            _drop_file(inbox, f"f{no}.jsonl", rows)
        _wait_for_rows(out, sum(sizes[:4]))
        savepoint = client.cancel(savepoint=str(sp))
    finally:
        if not client.done:
            client.cancel()
    assert savepoint is not None

    for no in (4, 5):  # appear while no job runs: the resumed job finds them new
        rows = _rows(no, sizes[no])
        expected.update(r["user"] for r in rows)
        _drop_file(inbox, f"f{no}.jsonl", rows)
    second = _env(spark, 3, ckpt)
    _counting_job(second, inbox, out)
    client = second.execute_async("monitor-p3", from_savepoint=savepoint)
    try:
        _wait_for_rows(out, sum(sizes))
        time.sleep(1.0)  # a double read would commit more updates by now
        client.cancel(savepoint=str(sp))
    finally:
        if not client.done:
            client.cancel()

    rows = [r.asDict() for r in spark.read.parquet(str(out)).collect()]
    counts: dict[str, list[int]] = collections.defaultdict(list)
    for r in rows:
        counts[r["user"]].append(r["n"])
    assert {u: sorted(ns) for u, ns in counts.items()} == {
        u: list(range(1, n + 1)) for u, n in expected.items()
    }, "each record counted exactly once"


def _bad_inputs(directory: Path) -> dict[str, tuple[Path, list[Any], int]]:
    """Per format: the input path, its good records and how many bad records it holds."""
    directory.mkdir()
    jsonl = directory / "a.jsonl"
    jsonl.write_text('{"id": 1}\n{"id": 2\n{"id": 3}\nnot json\n{"id": 4}\n')
    csv_path = directory / "a.csv"
    csv_path.write_text("id,name\n1,ann\n2\n3,cy\n4,dee,extra\n")
    pq_dir = directory / "pq"
    pq_dir.mkdir()
    pq.write_table(pa.Table.from_pylist([{"id": i} for i in range(5)]), pq_dir / "good.parquet")
    (pq_dir / "torn.parquet").write_bytes(b"PAR1 torn write")
    return {
        "jsonl": (jsonl, [{"id": i} for i in (1, 3, 4)], 2),
        "csv": (csv_path, [{"id": "1", "name": "ann"}, {"id": "3", "name": "cy"}], 2),
        "parquet": (pq_dir, [{"id": i} for i in range(5)], 1),
    }


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_bad_records_fail_with_their_place_or_go_to_dead_letters(
    spark: Any, tmp_path: Path, fmt: str
) -> None:
    path, good, bad = _bad_inputs(tmp_path / "in")[fmt]
    env = es.Environment(parallelism=2, spark=spark)
    env.enable_checkpointing(0.3, storage=str(tmp_path / "ckpt"))
    env.set_restart_strategy(es.restart.fixed_delay(attempts=5, delay=0.1))
    env.from_files(str(path), format=fmt).sink_to(es.sinks.FileSink(str(tmp_path / "none")))
    with pytest.raises(es.JobExecutionError) as info:
        env.execute(f"bad-{fmt}")
    assert info.value.restarts == 0, "bad data is not retried"
    place = "row group 0" if fmt == "parquet" else "byte offset"
    assert "SourceDecodeError" in info.value.cause and place in info.value.cause, info.value.cause

    out, dead = tmp_path / "out", tmp_path / "dead"
    env = es.Environment(parallelism=2, spark=spark)
    env.enable_checkpointing(0.3, storage=str(tmp_path / "ckpt2"))
    stream = env.from_files(str(path), format=fmt, on_error="dead_letter")
    stream.sink_to(es.sinks.FileSink(str(out)))
    stream.get_side_output(es.DEAD_LETTERS).sink_to(es.sinks.FileSink(str(dead)))
    result = env.execute(f"dead-{fmt}")
    assert result.restarts == 0
    assert sorted(es.testing.read_committed(out), key=json.dumps) == sorted(good, key=json.dumps)
    letters = es.testing.read_committed(dead)
    assert len(letters) == bad, letters
    assert all(str(path) in d["file"] and d["error"] for d in letters)


class _SlowOnSubtask1(es.MapFunction):
    """Tags each record with its subtask; subtask 1 takes 0.1 s per record."""

    def open(self, ctx: Any) -> None:
        self.subtask = ctx.subtask_index

    def map(self, record: dict[str, Any]) -> dict[str, Any]:
        if self.subtask == 1:
            time.sleep(0.1)
        return {**record, "subtask": self.subtask}


def test_the_subtask_that_finishes_first_reads_the_next_file(spark: Any, tmp_path: Path) -> None:
    inbox, out = tmp_path / "in", tmp_path / "out"
    inbox.mkdir()
    files, per_file = 8, 10
    env = es.Environment(parallelism=2, spark=spark)
    env.enable_checkpointing(0.3, storage=str(tmp_path / "ckpt"))
    (
        env.from_files(str(inbox), format="jsonl", monitor_interval=0.1)
        .map(_SlowOnSubtask1())
        .sink_to(es.sinks.FileSink(str(out)))
    )
    client = env.execute_async("on-demand")
    try:
        client.wait_for_checkpoint(1)
        for no in range(files):  # all found by one or two discoveries, while running
            _drop_file(inbox, f"f{no}.jsonl", [{"f": no, "i": i} for i in range(per_file)])
        deadline = time.monotonic() + 90.0
        while len(es.testing.read_committed(out) if out.exists() else []) < files * per_file:
            assert time.monotonic() < deadline, "not every record was committed"
            time.sleep(0.2)
        time.sleep(0.5)  # a double read would commit more records by now
    finally:
        client.cancel()

    rows = es.testing.read_committed(out)
    assert sorted((r["f"], r["i"]) for r in rows) == [
        (f, i) for f in range(files) for i in range(per_file)
    ], "each record exactly once"
    readers = {r["f"]: r["subtask"] for r in rows}
    fast = sum(1 for subtask in readers.values() if subtask == 0)
    # Round-robin would give each subtask 4 files; the fast one asks for more, sooner.
    assert fast > files // 2, f"files per subtask: {readers}"
