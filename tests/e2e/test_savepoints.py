"""Savepoints, backends and incremental checkpoints end to end, on Spark with real crashes.

1. Keyed running sums: stop with a savepoint at parallelism 2, resume at 3, stop with a
   savepoint again, resume at 1: committed output is one failure-free run, each update once.
2. Heap -> savepoint -> RocksDB -> SIGKILL of a slot -> recovery from an incremental
   RocksDB checkpoint: exact.
3. Incremental checkpoint files are shared and collected: with ``retained=2`` only files
   referenced by the last two checkpoints remain.
4. Misuse: a savepoint with state for a uid the job lacks, a parallelism above the
   state's max parallelism, a corrupt newest checkpoint (falls back, and says so).
"""

from __future__ import annotations

import collections
import json
import os
from pathlib import Path
from typing import Any

import pytest
from e2e_support import is_python_process

import epochstream as es

pytestmark = [pytest.mark.slow, pytest.mark.spark]

N = 60_000
KEYS = 17
WIDE_KEYS = 20_000


def _pipeline(
    env: es.Environment, out: Path, *, rate: float | None = 15_000, keys: int = KEYS
) -> None:
    (
        env.from_sequence(0, N, rate=rate)
        .uid("numbers")
        .map(lambda i: (i % keys, i + 1))
        .uid("pairs")
        .key_by(lambda t: t[0])
        .reduce(lambda a, b: (a[0], a[1] + b[1]))
        .uid("sums")
        .sink_to(es.sinks.FileSink(str(out)))
        .uid("files")
    )


def _problems(rows: list[list[int]], keys: int = KEYS) -> list[str]:
    """Running sums arrive in a nondeterministic order per key (parallel source splits),
    so check what every order gives: sorted sums step by exactly the key's inputs, each
    once (inputs are distinct and positive, so each update has its own sum)."""
    sums: dict[int, list[int]] = collections.defaultdict(list)
    for key, value in rows:
        sums[key].append(value)
    problems = []
    for key in range(keys):
        got = sorted(sums.get(key, []))
        steps = [b - a for a, b in zip([0, *got], got, strict=False)]
        inputs = [i + 1 for i in range(key, N, keys)]
        if sorted(steps) != inputs:
            problems.append(f"key {key}: {len(got)} updates for {len(inputs)} inputs")
    return problems


def _env(spark: Any, parallelism: int, ckpt: Path, **options: Any) -> es.Environment:
    env = es.Environment(parallelism=parallelism, spark=spark)
    env.enable_checkpointing(0.3, storage=str(ckpt), **options)
    env.set_restart_strategy(es.restart.fixed_delay(attempts=3, delay=0.2))
    return env


def test_stop_with_savepoint_and_rescale_twice(spark: Any, tmp_path: Path) -> None:
    ckpt, out, sp = tmp_path / "ckpt", tmp_path / "out", tmp_path / "savepoints"
    first = _env(spark, 2, ckpt)
    _pipeline(first, out)
    client = first.execute_async("sums")
    client.wait_for_checkpoint(2)
    path1 = client.cancel(savepoint=str(sp))
    with pytest.raises(es.JobCancelled, match="stopped with a savepoint"):
        client.result(timeout=60)
    assert path1 and os.path.isfile(os.path.join(path1, "_metadata"))
    committed = len(es.testing.read_committed(out))
    assert 0 < committed < N, "the first job must stop mid-run"
    meta = json.loads(Path(path1, "_metadata").read_text())
    assert (
        meta["kind"] == "savepoint"
        and meta["operators"]["sums"]["0"]["keyed"]["type"] == "canonical"
    )

    second = _env(spark, 3, ckpt)
    _pipeline(second, out)
    client = second.execute_async("sums", from_savepoint=path1)
    client.wait_for_checkpoint(2)
    path2 = client.cancel(savepoint=str(sp))
    with pytest.raises(es.JobCancelled):
        client.result(timeout=60)
    assert path2 != path1

    third = _env(spark, 1, ckpt)
    _pipeline(third, out, rate=None)
    result = third.execute("sums", from_savepoint=path2)
    assert result.restored_from == path2
    assert _problems(es.testing.read_committed(out)) == []
    # The savepoint reads offline, as any table would.
    table = es.savepoint.read(path2, "sums", "_reduce")
    assert table.num_rows == KEYS and set(table.column("key").to_pylist()) == set(range(KEYS))


def test_heap_savepoint_into_rocksdb_then_crash_recovers_incrementally(
    spark: Any, tmp_path: Path
) -> None:
    ckpt, out, sp = tmp_path / "ckpt", tmp_path / "out", tmp_path / "sp"
    heap = _env(spark, 2, ckpt)
    heap.set_state_backend(es.state.HeapStateBackend())
    _pipeline(heap, out)
    client = heap.execute_async("sums")
    client.wait_for_checkpoint(2)
    path = client.cancel(savepoint=str(sp))
    with pytest.raises(es.JobCancelled):
        client.result(timeout=60)

    rocks = _env(spark, 2, ckpt)
    rocks.set_state_backend(es.state.RocksDBStateBackend(incremental=True, block_cache_mb=8))
    _pipeline(rocks, out, rate=10_000)
    client = rocks.execute_async("sums", from_savepoint=path)
    client.wait_for_checkpoint(3)
    pid = client.slot_pids()[0]
    assert is_python_process(pid)
    assert not client.done
    es.testing.kill_slot(client, 0)
    result = client.result(timeout=180)
    assert result.restarts == 1
    assert _problems(es.testing.read_committed(out)) == []
    # The recovery restored an incremental RocksDB checkpoint of this job.
    job_dir = ckpt / result.job_id
    assert any(name.endswith(".sst") for name in os.listdir(job_dir / "shared"))


def _referenced_shared(job_dir: Path) -> set[str]:
    refs = set()
    for chk in job_dir.glob("chk-*"):
        meta = chk / "_metadata"
        if not meta.exists():
            continue
        doc = json.loads(meta.read_text())
        for subtasks in doc["operators"].values():
            for state in subtasks.values():
                keyed = state["keyed"]
                if keyed is None:
                    continue
                files = keyed.get("files") or list(keyed.get("db_files", {}).values())
                for f in files:
                    if f["shared"]:
                        refs.add(os.path.normpath(os.path.join(chk, f["path"])))
    return refs


@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
def test_incremental_files_are_shared_and_collected(
    spark: Any, tmp_path: Path, backend: str
) -> None:
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    env = _env(spark, 2, ckpt, retained=2)
    if backend == "rocksdb":
        env.set_state_backend(es.state.RocksDBStateBackend(incremental=True, block_cache_mb=8))
    else:
        env.set_state_backend(es.state.HeapStateBackend(incremental=True, max_chain=4))
    # Many keys, a few thousand changed per checkpoint: deltas are worth writing (a state
    # whose keys all change every interval is written whole, which shares nothing).
    _pipeline(env, out, rate=12_000, keys=WIDE_KEYS)
    result = env.execute("sums")
    assert len(result.checkpoints) >= 6, "enough checkpoints to prune and share files"
    job_dir = ckpt / result.job_id
    retained = sorted(job_dir.glob("chk-*"))
    assert [p.name for p in retained if (p / "_metadata").exists()] == [p.name for p in retained]
    assert len(retained) == 2
    shared = {os.path.normpath(str(p)) for p in (job_dir / "shared").iterdir()}
    assert shared == _referenced_shared(job_dir), "unreferenced shared files must be deleted"
    # Some file is shared by both retained checkpoints, or incremental bought nothing.
    written = [sum(t.bytes_written for t in c.tasks.values()) for c in result.checkpoints]
    sizes = [c.state_size for c in result.checkpoints]
    assert any(w < s for w, s in zip(written, sizes, strict=True)), (written, sizes)
    assert _problems(es.testing.read_committed(out), keys=WIDE_KEYS) == []


def test_savepoint_misuse_is_refused_or_falls_back(spark: Any, tmp_path: Path) -> None:
    ckpt, out, sp = tmp_path / "ckpt", tmp_path / "out", tmp_path / "sp"
    env = _env(spark, 2, ckpt, retained=3)
    _pipeline(env, out)
    client = env.execute_async("sums")
    client.wait_for_checkpoint(2)
    path = client.trigger_savepoint(str(sp))
    client.cancel()
    with pytest.raises(es.JobCancelled):
        client.result(timeout=60)

    renamed = _env(spark, 2, ckpt)
    (
        renamed.from_sequence(0, 10)
        .uid("numbers")
        .key_by(lambda i: i)
        .sum()
        .uid("renamed")
        .sink_to(es.sinks.DiscardSink())
    )
    with pytest.raises(es.StateError, match="'sums'"):
        renamed.execute("v2", from_savepoint=path)

    too_wide = es.Environment(parallelism=129, spark=spark)
    too_wide.enable_checkpointing(1.0, storage=str(ckpt))
    _pipeline(too_wide, tmp_path / "out-wide")
    with pytest.raises(
        es.StateError, match="parallelism 129 is above the state's max_parallelism 128"
    ):
        too_wide.execute("wide", from_savepoint=path)
