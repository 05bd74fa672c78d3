"""Checkpoint metadata with the channel state of an unaligned checkpoint ("channel" in a
subtask's JSON)."""

from __future__ import annotations

import json

import pytest

from epochstream.checkpoint.metadata import CheckpointMetadata
from epochstream.core.checkpoint_stats import CheckpointStats, TaskCheckpointStats
from epochstream.exceptions import CheckpointError
from epochstream.state.channel_state import (
    INPUT,
    OUTPUT,
    ChannelStateEntry,
    ChannelStateHandle,
)
from epochstream.state.handles import OperatorSubtaskState

BASE = "/ck/job-1/chk-9"


def _metadata() -> CheckpointMetadata:
    channel = ChannelStateHandle(
        path=f"{BASE}/channels-sum-1",
        size=30,
        entries=(
            ChannelStateEntry(INPUT, "src[main] -> sum #0", 0, ((0, 10), (10, 5))),
            ChannelStateEntry(OUTPUT, "sum[main] -> sink #0", 1, ((15, 15),)),
        ),
        crc=0xDEADBEEF,
    )
    stats = CheckpointStats(
        checkpoint_id=9,
        trigger_time=5.0,
        duration=0.5,
        state_size=30,
        tasks={
            "sum/1": TaskCheckpointStats(
                alignment_s=0.0,
                sync_s=0.01,
                async_s=0.1,
                state_size=30,
                unaligned=True,
                channel_state_bytes=30,
            )
        },
    )
    return CheckpointMetadata(
        job_id="job-1",
        checkpoint_id=9,
        trigger_time=5.0,
        completion_time=5.5,
        parallelism=2,
        max_parallelism=128,
        operators={
            "sum": {
                0: OperatorSubtaskState(operator_lists={"x": [1]}),
                1: OperatorSubtaskState(channel=channel),
            }
        },
        operator_parallelism={"sum": 2},
        stats=stats,
    )


def test_channel_handle_round_trips_with_a_relative_path() -> None:
    md = _metadata()
    data = md.to_json(BASE)
    back = CheckpointMetadata.from_json(data, base=BASE)
    assert back == md
    assert back.operators["sum"][1].channel == md.operators["sum"][1].channel
    assert back.stats.unaligned and back.stats.channel_state_bytes == 30
    assert back.stats.tasks["sum/1"].unaligned
    doc = json.loads(data)
    assert doc["operators"]["sum"]["1"]["channel"]["path"] == "channels-sum-1"
    assert "channel" not in doc["operators"]["sum"]["0"], "no channel state: no key"


def test_a_subtask_with_only_channel_state_is_not_empty() -> None:
    assert not _metadata().operators["sum"][1].is_empty


def test_malformed_channel_state_names_the_file_and_the_subtask() -> None:
    doc = json.loads(_metadata().to_json(BASE))
    doc["operators"]["sum"]["1"]["channel"]["entries"][0]["direction"] = "both"
    with pytest.raises(CheckpointError) as info:
        CheckpointMetadata.from_json(
            json.dumps(doc).encode(), base=BASE, source=f"{BASE}/_metadata"
        )
    message = str(info.value)
    assert f"{BASE}/_metadata: operators['sum'][1].channel is malformed channel state" in message
    assert "'both'" in message


def test_metadata_written_before_unaligned_checkpoints_still_loads() -> None:
    doc = json.loads(_metadata().to_json(BASE))
    del doc["operators"]["sum"]["1"]["channel"]
    for task in doc["stats"]["tasks"].values():
        del task["unaligned"], task["channel_state_bytes"]
    md = CheckpointMetadata.from_json(json.dumps(doc).encode(), base=BASE)
    assert md.operators["sum"][1].channel is None
    assert not md.stats.unaligned and md.stats.channel_state_bytes == 0


@pytest.mark.parametrize(
    ("field", "value"), [("unaligned", "no"), ("unaligned", 1), ("channel_state_bytes", "30")]
)
def test_malformed_unaligned_stats_name_the_field(field: str, value: object) -> None:
    doc = json.loads(_metadata().to_json(BASE))
    doc["stats"]["tasks"]["sum/1"][field] = value
    with pytest.raises(CheckpointError, match=field) as info:
        CheckpointMetadata.from_json(
            json.dumps(doc).encode(), base=BASE, source=f"{BASE}/_metadata"
        )
    assert "stats.tasks['sum/1']" in str(info.value)
