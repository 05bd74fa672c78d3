"""Discovered files and global commits through the job master with ``ThreadRunner``
slots: exactly once across a failure."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from jobmaster_support import JOBMASTER_MARKS, WAIT, drop_jsonl, make_env, running_client, wait_for

import epochstream as es
from epochstream.connectors.base import GlobalCommitter, SinkWriter

pytestmark = JOBMASTER_MARKS


# ---------------------------------------------------------------- enumerators and global commits


class _TaggedBatches(SinkWriter):
    """Pre-commits each checkpoint interval's records, tagged with the checkpoint id, until
    it hears that a checkpoint covering them completed (the DeltaSink pattern)."""

    def __init__(self) -> None:
        self.buffer: list[int] = []
        self.pending: list[tuple[int, tuple[int, ...]]] = []

    def restore(self, entries: list[Any]) -> None:
        """The job master's committer commits the restored checkpoint."""

    def write_batch(self, records: list[Any]) -> None:
        self.buffer.extend(records)

    def snapshot(self, checkpoint_id: int) -> list[Any]:
        if self.buffer:
            self.pending.append((checkpoint_id, tuple(self.buffer)))
            self.buffer = []
        return list(self.pending)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self.pending = [p for p in self.pending if p[0] > checkpoint_id]

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        """Pending entries wait for the next completed checkpoint."""

    def end_input(self) -> None:
        """The final checkpoint covers the rest."""

    def close(self) -> None:
        """Nothing held."""


def _commits(log: Path) -> list[tuple[int, list[int]]]:
    if not log.exists():
        return []
    return [tuple(json.loads(line)) for line in log.read_text().splitlines()]  # type: ignore[misc]


class _RecordingCommitter(GlobalCommitter):
    """Appends each commit to a JSON-lines log (the graph reaches the job master as a
    copy, so the record must live outside the objects)."""

    def __init__(self, log: Path) -> None:
        self.log = log

    def last_committed(self) -> int:
        done = _commits(self.log)
        return done[-1][0] if done else 0

    def commit(self, checkpoint_id: int, entries: list[Any]) -> None:
        last = self.last_committed()
        if checkpoint_id <= last:
            return
        new = sorted(r for tag, records in entries if tag > last for r in records)
        if new:
            with open(self.log, "a", encoding="utf-8") as f:
                f.write(json.dumps([checkpoint_id, new]) + "\n")


class _GlobalSink(es.sinks.Sink):
    transactional = True

    def __init__(self, log: Path) -> None:
        self.log = log

    def create_writer(self, ctx: es.sinks.SinkContext) -> SinkWriter:
        return _TaggedBatches()

    def create_committer(self, job_id: str) -> GlobalCommitter:
        return _RecordingCommitter(self.log)


def _field_i(record: dict[str, int]) -> int:
    return record["i"]


def test_discovered_files_and_global_commits_are_exactly_once_across_a_failure(
    tmp_path: Path,
) -> None:
    inbox, markers, log = tmp_path / "in", tmp_path / "markers", tmp_path / "commits.jsonl"
    inbox.mkdir()
    markers.mkdir()
    drop_jsonl(inbox, "a.jsonl", range(0, 40))
    drop_jsonl(inbox, "b.jsonl", range(40, 80))
    env = make_env(tmp_path)
    env.set_restart_strategy(es.restart.fixed_delay(attempts=2, delay=0.05))
    fail = es.testing.FailOnce(after_checkpoints=1, subtask=0, marker_dir=str(markers))
    (
        env.from_files(str(inbox), format="jsonl", monitor_interval=0.05)
        .map(_field_i)
        .map(fail)
        .sink_to(_GlobalSink(log))
    )
    client, master = running_client(env, "discover")
    try:
        wait_for(lambda: bool(_commits(log)))
        for k, name in enumerate(["c.jsonl", "d.jsonl", "e.jsonl"]):  # both subtasks wait for one
            drop_jsonl(inbox, name, range(80 + 30 * k, 110 + 30 * k))
        wait_for(lambda: sum(len(c[1]) for c in _commits(log)) >= 170 and master.attempt == 2)
    finally:
        client.cancel()
    with pytest.raises(es.JobCancelled):
        client.result(WAIT)

    assert master.attempt == 2, "the injected failure restarted the job"
    commits = _commits(log)
    committed = sorted(r for _, records in commits for r in records)
    assert committed == list(range(170)), "each record committed once, none skipped"
    ids = [cid for cid, _ in commits]
    assert ids == sorted(set(ids)), f"one commit per checkpoint: {ids}"
