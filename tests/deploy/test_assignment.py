"""Choosing and assigning the checkpoint a new job restores from."""

from __future__ import annotations

import dataclasses
import logging

import pytest

import epochstream as es
from epochstream.checkpoint.metadata import CheckpointMetadata
from epochstream.checkpoint.storage import CheckpointStorage
from epochstream.core.checkpoint_stats import CheckpointStats
from epochstream.core.state_schema import StateSchema, ValueShape
from epochstream.deploy.assignment import load_restore_point, operator_class_changes
from epochstream.exceptions import ConfigurationError
from epochstream.graph.launch import JobDescription
from epochstream.state.handles import CanonicalSnapshotHandle, OperatorSubtaskState


def _description() -> JobDescription:
    env = es.Environment(parallelism=2, runner="local")
    env.from_sequence(0, 10).uid("src").print()
    return env.job_description("j")


def _metadata(n: int) -> CheckpointMetadata:
    return CheckpointMetadata(
        job_id="old-job",
        checkpoint_id=n,
        trigger_time=float(n),
        completion_time=100.0 + n,
        parallelism=2,
        max_parallelism=128,
        operators={"src": {0: OperatorSubtaskState(operator_lists={"splits": [n]})}},
        operator_parallelism={"src": 2},
        stats=CheckpointStats(checkpoint_id=n, trigger_time=float(n), duration=0.1, state_size=0),
    )


def test_corrupt_older_checkpoint_does_not_block_the_newest(tmp_path, caplog) -> None:
    storage = CheckpointStorage(str(tmp_path), "old-job")
    for n in (1, 2, 3):
        storage.write_metadata(n, _metadata(n))
    with open(storage.metadata_path(1), "wb") as f:
        f.write(b"garbage")
    description = _description()
    with caplog.at_level(logging.WARNING):
        points = load_restore_point(str(tmp_path / "old-job"), description)
    assert [p.checkpoint_id for p in points] == [3, 2], "newest first, older ones as fallbacks"
    assert "skipping unreadable checkpoint" in caplog.text and "chk-1" in caplog.text


def test_corrupt_newest_checkpoint_falls_back_to_an_older_one(tmp_path) -> None:
    storage = CheckpointStorage(str(tmp_path), "old-job")
    for n in (1, 2):
        storage.write_metadata(n, _metadata(n))
    with open(storage.metadata_path(2), "wb") as f:
        f.write(b"{}")
    description = _description()
    assert [p.checkpoint_id for p in load_restore_point(str(tmp_path), description)] == [1]


def test_only_unreadable_checkpoints_is_a_clear_error(tmp_path) -> None:
    storage = CheckpointStorage(str(tmp_path), "old-job")
    storage.write_metadata(1, _metadata(1))
    with open(storage.metadata_path(1), "wb") as f:
        f.write(b"")
    description = _description()
    with pytest.raises(ConfigurationError, match=r"no readable completed checkpoint.*1 unreadable"):
        load_restore_point(str(tmp_path), description)


@dataclasses.dataclass
class _SavedProfile:
    """A job's dataclass that gained ``email`` since the savepoint (saved: ``name``)."""

    name: str
    email: str


def test_class_changes_are_found_per_state_against_this_processes_classes() -> None:
    here = _SavedProfile.__module__
    old = frozenset({ValueShape(f"{here}:_SavedProfile", ("name",))})

    def handle(kgs: range, schemas: dict[str, StateSchema]) -> CanonicalSnapshotHandle:
        return CanonicalSnapshotHandle(
            key_groups=kgs, path="x", states={"p": "value", "n": "value"}, schemas=schemas
        )

    states = {
        0: OperatorSubtaskState(keyed=handle(range(0, 64), {"p": StateSchema(1, old)})),
        1: OperatorSubtaskState(keyed=handle(range(64, 128), {})),
        2: OperatorSubtaskState(operator_lists={"splits": [1]}),
    }
    assert operator_class_changes(states) == {"p": [f"{here}:_SavedProfile: field 'email' added"]}
