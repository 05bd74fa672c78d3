"""The checkpoint coordinator with unaligned checkpoints: periodic checkpoints carry the
unaligned options, savepoints and the final checkpoint stay aligned, and a completed
checkpoint keeps the channel state the tasks acknowledged."""

from __future__ import annotations

import os

from test_coordinator import SINK0, SRC0, SRC1, TASKS, Harness

from epochstream.core.checkpoint_stats import TaskCheckpointStats
from epochstream.core.events import CheckpointOptions
from epochstream.state.acknowledgements import AcknowledgeCheckpoint
from epochstream.state.channel_state import INPUT, ChannelStateEntry, ChannelStateHandle
from epochstream.state.handles import OperatorSubtaskState


def _unaligned(tmp_path, **cfg) -> Harness:
    h = Harness(tmp_path, interval=1.0, timeout=10.0, unaligned=True, **cfg)
    h.coord.start_attempt(TASKS)
    return h


def test_periodic_checkpoints_carry_the_unaligned_options(tmp_path) -> None:
    h = _unaligned(tmp_path, aligned_timeout=0.5)
    h.advance(1.0)
    options = h.cb.options[1]
    assert isinstance(options, CheckpointOptions)
    assert options.unaligned and options.aligned_timeout == 0.5
    assert not options.is_savepoint


def test_without_unaligned_periodic_checkpoints_stay_aligned(tmp_path) -> None:
    h = Harness(tmp_path, interval=1.0, timeout=10.0)
    h.coord.start_attempt(TASKS)
    h.advance(1.0)
    assert h.cb.options[1] == CheckpointOptions()


def test_savepoints_stay_aligned(tmp_path) -> None:
    h = _unaligned(tmp_path)
    n = h.coord.trigger_savepoint(str(tmp_path / "sp"))
    options = h.cb.options[n]
    assert isinstance(options, CheckpointOptions)
    assert options.is_savepoint and not options.unaligned and options.aligned_timeout == 0.0


def test_the_final_checkpoint_stays_aligned(tmp_path) -> None:
    h = _unaligned(tmp_path, aligned_timeout=0.5)
    h.coord.trigger_final()
    [(_, n, final)] = h.cb.of("trigger")
    assert final
    assert h.cb.options[n] == CheckpointOptions()


def test_a_completed_checkpoint_keeps_the_acknowledged_channel_state(tmp_path) -> None:
    h = _unaligned(tmp_path)
    h.advance(1.0)
    directory = h.storage.checkpoint_path(1)
    channel = ChannelStateHandle(
        path=os.path.join(directory, "channels-sink-0"),
        size=12,
        entries=(ChannelStateEntry(INPUT, "src[main] -> sink #0", 1, ((0, 12),)),),
        crc=99,
    )
    h.ack(1, SRC0)
    h.ack(1, SRC1)
    h.coord.receive_ack(
        AcknowledgeCheckpoint(
            checkpoint_id=1,
            task=SINK0,
            states={"sink": OperatorSubtaskState(channel=channel)},
            stats=TaskCheckpointStats(state_size=12, unaligned=True, channel_state_bytes=12),
        )
    )
    assert h.cb.take() == [("trigger", 1, False), ("complete", 1)]
    md = h.storage.load(1)
    assert md.operators["sink"][0].channel == channel
    assert md.stats.unaligned and md.stats.channel_state_bytes == 12
    assert md.stats.tasks["sink/0"].unaligned and not md.stats.tasks["src/0"].unaligned
