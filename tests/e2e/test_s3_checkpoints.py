"""Checkpoints and savepoints in S3 end to end (SeaweedFS on loopback, see tests/conftest.py).

A throttled word count (keyed running count, FileSink output in a local directory)
checkpoints every 0.3 s into ``s3://<bucket>/ckpt``. A slot process is SIGKILLed after
two checkpoints and the job recovers from S3; after two more checkpoints a savepoint is
taken into ``s3://<bucket>/sp`` while the job runs, the job is cancelled, the savepoint's
objects are copied to another prefix (and the originals deleted), and a new job at
another parallelism starts from the copy. Together the two jobs' output must be each
update ``(word, 1..count)`` exactly once: the first job's output up to the savepoint's
counts, then the second job's.

Run on Spark with the heap backend (2 -> 1 slots) and on the local runner with RocksDB
(2 -> 3 slots).
"""

from __future__ import annotations

import ast
import json
import posixpath
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from e2e_support import (
    build_wordcount,
    exactly_once_problems,
    final_values,
    is_python_process,
    update_counts,
    write_corpus,
)

import epochstream as es

LINES = 30_000
# Per source subtask: the first job (two attempts) needs a few seconds of input left.
LINES_PER_SECOND = 2_000
JOB = "wordcount-s3"


def _wait(condition: Callable[[], bool], what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"not {what} after {timeout}s")
        time.sleep(0.05)


def _env(
    runner: str,
    parallelism: int,
    backend: str,
    bucket: str,
    options: dict[str, str],
    request: pytest.FixtureRequest,
) -> es.Environment:
    if runner == "spark":
        env = es.Environment(parallelism=parallelism, spark=request.getfixturevalue("spark"))
    else:
        env = es.Environment(parallelism=parallelism, runner="local")
    env.enable_checkpointing(0.3, storage=f"{bucket}/ckpt", storage_options=options)
    env.set_restart_strategy(es.restart.fixed_delay(attempts=3, delay=0.2))
    if backend == "rocksdb":
        env.set_state_backend(es.state.RocksDBStateBackend())
    return env


def _s3_files(server: Any, prefix: str) -> list[str]:
    """Keys of every object under ``prefix`` (``bucket/key``), read with pyarrow directly."""
    from pyarrow import fs as pafs

    s3 = pafs.S3FileSystem(**server.pyarrow_options())
    infos = s3.get_file_info(pafs.FileSelector(prefix, recursive=True, allow_not_found=True))
    return sorted(i.path for i in infos if i.type == pafs.FileType.File)


def _move_savepoint(server: Any, source: str, target: str) -> list[str]:
    """Copy every object of ``source`` to the same relative key under ``target`` (both
    ``s3://`` URIs), then delete the originals; returns the new keys."""
    from pyarrow import fs as pafs

    s3 = pafs.S3FileSystem(**server.pyarrow_options())
    src, dst = source.removeprefix("s3://"), target.removeprefix("s3://")
    files = _s3_files(server, src)
    assert files, f"savepoint {source} has no objects"
    for path in files:
        with s3.open_input_stream(path) as f:
            data = f.read()
        with s3.open_output_stream(dst + path[len(src) :]) as out:
            out.write(data)
    for path in files:
        s3.delete_file(path)
    return _s3_files(server, dst)


def _referenced(server: Any, metadata_key: str) -> set[str]:
    """Keys of the state files a checkpoint's ``_metadata`` references."""
    from pyarrow import fs as pafs

    s3 = pafs.S3FileSystem(**server.pyarrow_options())
    with s3.open_input_stream(metadata_key) as f:
        doc = json.loads(f.read())
    directory = metadata_key.rsplit("/", 1)[0]
    refs = set()
    for subtasks in doc["operators"].values():
        for state in subtasks.values():
            keyed = state["keyed"] or {}
            for file in keyed.get("files") or list(keyed.get("db_files", {}).values()):
                refs.add(posixpath.normpath(posixpath.join(directory, file["path"])))
    return refs


def _savepoint_counts(path: str, options: dict[str, str]) -> dict[str, int]:
    """The running count of every word in the savepoint's reduce state."""
    table = es.savepoint.read(path, "word-counts", "_reduce", storage_options=options)
    counts = {}
    for key, value in zip(
        table.column("key").to_pylist(), table.column("value").to_pylist(), strict=True
    ):
        word, count = ast.literal_eval(value) if isinstance(value, str) else value
        assert word == key
        counts[word] = count
    return counts


def _prefix_problems(rows: list[Any]) -> list[str]:
    """Why ``rows`` is not updates ``(word, 1..n_word)`` each once for some ``n_word``."""
    seen = update_counts(rows)
    problems = [f"duplicated update {u} x{n}" for u, n in seen.items() if n > 1]
    for word, top in final_values(rows).items():
        gaps = [c for c in range(1, top + 1) if (word, c) not in seen]
        if gaps:
            problems.append(f"{word}: missing counts {gaps[:5]} below {top}")
    return problems


@pytest.mark.slow
@pytest.mark.parametrize(
    ("runner", "backend", "new_parallelism"),
    [
        pytest.param("spark", "heap", 1, marks=pytest.mark.spark),
        pytest.param("local", "rocksdb", 3),
    ],
)
def test_s3_recovery_and_moved_savepoint_are_exactly_once(
    runner: str,
    backend: str,
    new_parallelism: int,
    tmp_path: Path,
    s3_bucket: str,
    s3_options: dict[str, str],
    s3_server: Any,
    request: pytest.FixtureRequest,
) -> None:
    text, out1, out2 = tmp_path / "words.txt", tmp_path / "out1", tmp_path / "out2"
    expected = write_corpus(text, lines=LINES, seed=20_250_314)
    bucket_key = s3_bucket.removeprefix("s3://")

    first = _env(runner, 2, backend, s3_bucket, s3_options, request)
    build_wordcount(first, text, out1, lines_per_second=LINES_PER_SECOND)
    client = first.execute_async(JOB)
    try:
        client.wait_for_checkpoint(2, timeout=120)
        assert not client.done, "job finished before the kill: input too small or too fast"
        victim = client.slot_pids()[0]
        assert is_python_process(victim), f"slot 0 PID {victim} is not a live Python process"
        es.testing.kill_slot(client, 0)
        _wait(
            lambda: client.attempt >= 2 and victim not in client.slot_pids().values(),
            "restarted after the SIGKILL",
        )
        done_before = len(client.completed_checkpoints())
        client.wait_for_checkpoint(done_before + 2, timeout=120)  # recovered from S3
        job_prefix = f"{bucket_key}/ckpt/{client.job_id}"
        assert any(k.endswith("/_metadata") for k in _s3_files(s3_server, job_prefix))
        if backend == "rocksdb":
            assert any(k.endswith(".sst") for k in _s3_files(s3_server, f"{job_prefix}/shared"))
        savepoint = client.trigger_savepoint(f"{s3_bucket}/sp")
        assert not client.done, "job finished before the savepoint: input too small or too fast"
    finally:
        client.cancel()
    with pytest.raises(es.JobCancelled):
        client.result(timeout=60)
    assert len(client.failures) == 1, client.failures
    assert _s3_files(s3_server, job_prefix) == [], "a cancelled job's checkpoints are deleted"
    assert savepoint.startswith(f"{s3_bucket}/sp/savepoint-"), savepoint

    moved = f"{s3_bucket}/moved/{savepoint.rsplit('/', 1)[-1]}"
    keys = _move_savepoint(s3_server, savepoint, moved)
    assert f"{moved.removeprefix('s3://')}/_metadata" in keys
    assert _s3_files(s3_server, savepoint.removeprefix("s3://")) == []

    covered = _savepoint_counts(moved, s3_options)
    assert 0 < sum(covered.values()) < sum(expected.values()), "savepoint must be mid-run"

    second = _env(runner, new_parallelism, backend, s3_bucket, s3_options, request)
    build_wordcount(second, text, out2)
    result = second.execute(JOB, from_savepoint=moved)
    assert result.restored_from == moved and result.restarts == 0
    # retained=1: one checkpoint is left, and exactly the objects its _metadata references.
    left = _s3_files(s3_server, f"{bucket_key}/ckpt/{result.job_id}")
    metadata = [k for k in left if k.endswith("/_metadata")]
    assert len(metadata) == 1, metadata
    assert set(left) - set(metadata) == _referenced(s3_server, metadata[0])

    rows1 = es.testing.read_committed(out1)
    rows2 = es.testing.read_committed(out2)
    # The first job alone: exactly once up to where it was cancelled (after the savepoint).
    assert _prefix_problems(rows1) == []
    firsts = final_values(rows1)
    assert all(firsts.get(w, 0) >= n for w, n in covered.items()), "savepoint beyond output"
    # Together: the first job's updates the savepoint covers, then the second job's.
    combined = [row for row in rows1 if row[1] <= covered.get(row[0], 0)] + rows2
    assert exactly_once_problems(combined, expected) == []
    assert Counter(w for w, _ in rows2) == Counter(
        {w: n - covered.get(w, 0) for w, n in expected.items() if n > covered.get(w, 0)}
    )
