"""Checkpoint statistics, task keys and the typed reader of ``_metadata`` fields."""

from __future__ import annotations

import pytest

from epochstream.core.checkpoint_stats import (
    KIND_SAVEPOINT,
    CheckpointStats,
    MetadataReader,
    TaskCheckpointStats,
    parse_task_key,
    task_key_str,
)
from epochstream.exceptions import CheckpointError


def _stats() -> CheckpointStats:
    return CheckpointStats(
        checkpoint_id=4,
        trigger_time=1.5,
        duration=0.25,
        state_size=30,
        kind=KIND_SAVEPOINT,
        tasks={
            "a/b/1": TaskCheckpointStats(alignment_s=0.3, sync_s=0.01, async_s=0.2, state_size=20),
            "c/0": TaskCheckpointStats(alignment_s=0.1, sync_s=0.02, async_s=0.1, state_size=10),
        },
    )


def test_stats_helpers() -> None:
    stats = _stats()
    assert stats.id == 4
    assert stats.max_alignment_s == 0.3
    assert stats.max_sync_s == 0.02
    assert stats.max_async_s == 0.2
    assert stats.largest_task == "a/b/1"
    assert stats.alignment_s == {"a/b/1": 0.3, "c/0": 0.1}
    empty = CheckpointStats(checkpoint_id=1, trigger_time=0.0, duration=0.0, state_size=0)
    assert empty.max_alignment_s == 0.0 and empty.largest_task is None


def test_stats_dict_round_trip() -> None:
    # bytes_written is a live figure of the run, not part of the stored statistics.
    assert CheckpointStats.from_dict(_stats().to_dict()) == _stats()


def test_task_key_text_round_trip() -> None:
    assert task_key_str(("a/b", 3)) == "a/b/3"
    assert parse_task_key("a/b/3") == ("a/b", 3)
    with pytest.raises(ValueError, match="chain_id/subtask"):
        parse_task_key("nosubtask")


def test_reader_names_source_and_field() -> None:
    r = MetadataReader("/ck/_metadata")
    assert r.integer({"n": 3}, "n", "top") == 3
    with pytest.raises(CheckpointError, match=r"/ck/_metadata: .*top\.n must be an integer"):
        r.integer({"n": True}, "n", "top")
    with pytest.raises(CheckpointError, match="lacks field 'kind'"):
        r.kind({}, "stats")
    with pytest.raises(CheckpointError, match="one of"):
        r.kind({"kind": "backup"}, "stats")
    with pytest.raises(CheckpointError, match="non-negative decimal"):
        r.index("01", "subtask")
