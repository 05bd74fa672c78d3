"""Checkpoint barriers of unaligned checkpoints: when they overtake, their alignment
deadline, and turning an aligned one unaligned."""

from __future__ import annotations

import pickle

import pytest

from epochstream.core.events import CheckpointBarrier, CheckpointOptions


def test_a_plain_barrier_is_aligned_without_a_deadline() -> None:
    barrier = CheckpointBarrier(3, 100.0)
    assert not barrier.overtakes
    assert barrier.alignment_deadline is None


def test_unaligned_without_a_timeout_overtakes_at_once() -> None:
    barrier = CheckpointBarrier(3, 100.0, CheckpointOptions(unaligned=True))
    assert barrier.overtakes
    assert barrier.alignment_deadline is None


def test_unaligned_with_a_timeout_aligns_until_its_deadline() -> None:
    barrier = CheckpointBarrier(3, 100.0, CheckpointOptions(unaligned=True, aligned_timeout=0.5))
    assert not barrier.overtakes
    assert barrier.alignment_deadline == pytest.approx(100.5)


def test_a_timeout_without_unaligned_has_no_deadline() -> None:
    barrier = CheckpointBarrier(3, 100.0, CheckpointOptions(aligned_timeout=0.5))
    assert not barrier.overtakes and barrier.alignment_deadline is None


def test_unaligned_now_keeps_everything_but_the_timeout() -> None:
    options = CheckpointOptions(
        base_checkpoint_id=2, unaligned=True, aligned_timeout=0.5, savepoint_dir=None
    )
    barrier = CheckpointBarrier(3, 100.0, options)
    now = barrier.unaligned_now()
    assert now.overtakes and now.alignment_deadline is None
    assert (now.checkpoint_id, now.timestamp) == (3, 100.0)
    assert now.options == CheckpointOptions(base_checkpoint_id=2, unaligned=True)
    assert barrier.options.aligned_timeout == 0.5, "the original is unchanged"


def test_barriers_survive_pickling_as_frames() -> None:
    barrier = CheckpointBarrier(3, 100.0, CheckpointOptions(unaligned=True, aligned_timeout=0.5))
    back = pickle.loads(pickle.dumps(barrier, protocol=5))
    assert back == barrier and back.alignment_deadline == barrier.alignment_deadline
