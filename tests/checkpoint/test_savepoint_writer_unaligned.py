"""es.savepoint.load of an unaligned checkpoint: its records in flight cannot be dropped
silently by writing a savepoint from it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import epochstream as es
from epochstream.checkpoint.metadata import CheckpointMetadata
from epochstream.checkpoint.storage import CheckpointStorage
from epochstream.core.checkpoint_stats import CheckpointStats
from epochstream.core.filesystems import storage_fs
from epochstream.exceptions import CheckpointError
from epochstream.runtime.batches import RowBatch
from epochstream.runtime.frames import FrameEncoder
from epochstream.state.channel_state import INPUT, ChannelFrames, write_channel_state
from epochstream.state.handles import OperatorSubtaskState


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "private"
    path.mkdir(mode=0o700)
    return path


def _unaligned_checkpoint(root: Path) -> str:
    storage = CheckpointStorage(str(root), "job")
    directory = storage.checkpoint_dir(3)  # made, as the coordinator makes it at trigger
    path = os.path.join(directory, "channels-down-0")
    frame = FrameEncoder().encode(RowBatch([("in", "flight")]))
    handle = write_channel_state(
        storage_fs(path), path, [ChannelFrames(INPUT, "src[main] -> down #0", 0, [frame])]
    )
    storage.write_metadata(
        3,
        CheckpointMetadata(
            job_id="job",
            checkpoint_id=3,
            trigger_time=1.0,
            completion_time=2.0,
            parallelism=1,
            max_parallelism=128,
            operators={
                "src": {0: OperatorSubtaskState(operator_lists={"offsets": [7]})},
                "down": {0: OperatorSubtaskState(channel=handle)},
            },
            operator_parallelism={"src": 1, "down": 1},
            stats=CheckpointStats(checkpoint_id=3, trigger_time=1.0, duration=1.0, state_size=0),
        ),
    )
    return directory


def test_a_savepoint_is_not_written_from_a_checkpoint_with_records_in_flight(
    root: Path,
) -> None:
    directory = _unaligned_checkpoint(root)
    with pytest.raises(CheckpointError, match=r"in flight|channel state"):
        es.savepoint.load(directory).write(str(root / "savepoint"))
