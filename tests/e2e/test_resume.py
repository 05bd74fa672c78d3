"""A new job resumes a cancelled job's retained checkpoint at another parallelism."""

from __future__ import annotations

import collections
from pathlib import Path

import pytest

import epochstream as es

N = 60_000
KEYS = 13


def _pipeline(env: es.Environment, out: Path, reduce_uid: str = "sums") -> None:
    (
        env.from_sequence(0, N, rate=20_000)
        .uid("numbers")
        .map(lambda i: (i % KEYS, i + 1))
        .uid("pairs")
        .key_by(lambda t: t[0])
        .reduce(lambda a, b: (a[0], a[1] + b[1]))
        .uid(reduce_uid)
        .sink_to(es.sinks.FileSink(str(out)))
        .uid("files")
    )


@pytest.mark.slow
@pytest.mark.parametrize("new_parallelism", [3, 1])
def test_resume_at_other_parallelism_is_exactly_once(tmp_path: Path, new_parallelism: int) -> None:
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    first = es.Environment(parallelism=2, runner="local")
    first.enable_checkpointing(0.2, storage=str(ckpt), retain_on_cancel=True)
    _pipeline(first, out)
    client = first.execute_async("v1")
    client.wait_for_checkpoint(2)
    client.cancel()
    with pytest.raises(es.JobCancelled):
        client.result(timeout=60)
    committed_before = len(es.testing.read_committed(out))
    assert 0 < committed_before < N, "the first job must stop mid-run"

    second = es.Environment(parallelism=new_parallelism, runner="local")
    second.enable_checkpointing(0.2, storage=str(ckpt))
    _pipeline(second, out)
    result = second.execute("v2", restore_from=str(ckpt / client.job_id))
    assert result.restored_from is not None and client.job_id in result.restored_from

    assert _exactly_once_problems(es.testing.read_committed(out)) == []


def _exactly_once_problems(rows: list[list[int]]) -> list[str]:
    """Running sums arrive in a nondeterministic order per key (parallel source splits),
    so check what every order must give: sorted sums step by exactly the key's inputs,
    each once (inputs are distinct and positive, so each update has its own sum)."""
    sums: dict[int, list[int]] = collections.defaultdict(list)
    for key, value in rows:
        sums[key].append(value)
    problems = []
    for k in range(KEYS):
        got = sorted(sums.get(k, []))
        steps = [b - a for a, b in zip([0, *got], got, strict=False)]
        inputs = [i + 1 for i in range(k, N, KEYS)]
        if collections.Counter(steps) != collections.Counter(inputs):
            problems.append(f"key {k}: {len(got)} updates, expected {len(inputs)}")
    return problems


@pytest.mark.slow
def test_resume_after_a_crash_that_ended_the_job(tmp_path: Path) -> None:
    """No restart strategy: a SIGKILL ends the job; a new job resumes its last checkpoint."""
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    first = es.Environment(parallelism=2, runner="local")
    first.enable_checkpointing(0.2, storage=str(ckpt))
    first.set_restart_strategy(es.restart.none())
    _pipeline(first, out)
    client = first.execute_async("v1")
    client.wait_for_checkpoint(2)
    es.testing.kill_slot(client, 1)
    with pytest.raises(es.JobExecutionError, match="lost its control connection"):
        client.result(timeout=60)
    assert len(es.testing.read_committed(out)) < N

    second = es.Environment(parallelism=2, runner="local")
    second.enable_checkpointing(0.2, storage=str(ckpt))
    _pipeline(second, out)
    second.execute("v2", restore_from=str(ckpt / client.job_id))
    assert _exactly_once_problems(es.testing.read_committed(out)) == []


def test_state_without_matching_uid_is_refused(tmp_path: Path) -> None:
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    env = es.Environment(parallelism=2, runner="local")
    env.enable_checkpointing(0.1, storage=str(ckpt))
    _pipeline(env, out)
    job = env.execute("v1")
    assert job.checkpoints
    renamed = es.Environment(parallelism=2, runner="local")
    _pipeline(renamed, tmp_path / "out2", reduce_uid="renamed-sums")
    with pytest.raises(es.StateError, match="sums"):
        renamed.execute("v2", restore_from=str(ckpt / job.job_id))
