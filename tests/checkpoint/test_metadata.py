from __future__ import annotations

import base64
import json
import pickle
from collections import OrderedDict
from dataclasses import dataclass

import pytest

from epochstream.checkpoint.metadata import CheckpointMetadata
from epochstream.core.checkpoint_stats import (
    CheckpointStats,
    TaskCheckpointStats,
)
from epochstream.exceptions import CheckpointError
from epochstream.state.handles import HeapSnapshotHandle, HeapStateFile, OperatorSubtaskState

BASE = "/ck/job-1/chk-7"


@dataclass(frozen=True)
class SplitOffset:
    path: str
    offset: int


def make_metadata() -> CheckpointMetadata:
    stats = CheckpointStats(
        checkpoint_id=7,
        trigger_time=1700000000.125,
        duration=0.75,
        state_size=300,
        tasks={
            "src-map/0": TaskCheckpointStats(
                alignment_s=0.0, sync_s=0.01, async_s=0.2, state_size=100
            ),
            "a/b/1": TaskCheckpointStats(alignment_s=0.3, sync_s=0.02, async_s=0.1, state_size=200),
        },
    )
    return CheckpointMetadata(
        job_id="job-1",
        checkpoint_id=7,
        kind="checkpoint",
        trigger_time=1700000000.125,
        completion_time=1700000000.875,
        parallelism=2,
        max_parallelism=128,
        operators={
            "sum": {
                0: OperatorSubtaskState(
                    keyed=HeapSnapshotHandle(
                        range(0, 64),
                        (
                            HeapStateFile(
                                "/ck/job-1/shared/3-sum-0-ab.kst",
                                True,
                                {0: (0, 40), 63: (40, 60)},
                                100,
                            ),
                            HeapStateFile(f"{BASE}/sum-0.kst", False, {5: (0, 9)}, 9, shared=False),
                        ),
                        {"_reduce": "value"},
                    )
                ),
                1: OperatorSubtaskState(
                    keyed=HeapSnapshotHandle(
                        range(64, 128),
                        (HeapStateFile(f"{BASE}/sum-1.kst", True, {64: (0, 200)}, 200, False),),
                        {"_reduce": "value"},
                    )
                ),
            },
            "source": {
                0: OperatorSubtaskState(
                    operator_lists={"splits": [SplitOffset("/in/a.csv", 1234), ("t", 1.5)]},
                    union_lists={"seen": [{"k": b"\x00\xff"}, None, 2**70]},
                ),
            },
        },
        operator_parallelism={"sum": 2, "source": 1},
        stats=stats,
    )


def test_round_trip_is_exact() -> None:
    md = make_metadata()
    back = CheckpointMetadata.from_json(md.to_json(BASE), base=BASE)
    assert back == md
    split = back.operators["source"][0].operator_lists["splits"][0]
    assert isinstance(split, SplitOffset) and split.offset == 1234
    assert back.operators["source"][0].operator_lists["splits"][1] == ("t", 1.5)
    assert back.operators["sum"][0].keyed is not None
    keyed = back.operators["sum"][0].keyed
    assert keyed.chain[0].segments[63] == (40, 60)
    doc = json.loads(md.to_json(BASE))
    paths = [f["path"] for f in doc["operators"]["sum"]["0"]["keyed"]["files"]]
    assert paths == ["../shared/3-sum-0-ab.kst", "sum-0.kst"], "paths are relative to _metadata"
    assert list(back.stats.tasks) == ["src-map/0", "a/b/1"]


def test_json_is_inspectable_and_uses_pickle5_base64() -> None:
    doc = json.loads(make_metadata().to_json(BASE))
    assert doc["version"] == 2 and doc["job_id"] == "job-1"
    keyed = doc["operators"]["sum"]["0"]["keyed"]
    assert keyed["type"] == "heap" and keyed["key_groups"] == [0, 64]
    assert keyed["files"][0] == {
        "path": "../shared/3-sum-0-ab.kst",
        "full": True,
        "shared": True,
        "size": 100,
        "segments": {"0": [0, 40], "63": [40, 60]},
    }
    assert keyed["states"] == {"_reduce": "value"}
    blob = base64.b64decode(doc["operators"]["source"]["0"]["union_lists"]["seen"])
    assert blob[:2] == b"\x80\x05"  # pickle protocol 5 header
    assert pickle.loads(blob) == [{"k": b"\x00\xff"}, None, 2**70]


def _mutated(change) -> bytes:
    doc = json.loads(make_metadata().to_json(BASE))
    change(doc)
    return json.dumps(doc).encode()


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        (lambda d: d.pop("checkpoint_id"), "lacks field 'checkpoint_id'"),
        (lambda d: d.update(version=1), "unsupported metadata version 1"),
        (lambda d: d.update(parallelism="2"), "parallelism"),
        (lambda d: d.update(kind="snapshot"), "kind"),
        (lambda d: d["operators"]["sum"].update({"x": {}}), "subtask key 'x'"),
        (
            lambda d: d["operators"]["sum"]["0"]["keyed"]["files"][0]["segments"].update(
                {"5": [1]}
            ),
            "bad segment '5'",
        ),
        (
            lambda d: d["operators"]["source"]["0"]["operator_lists"].update(splits="!!"),
            "operator_lists['splits'] is not valid base64",
        ),
        (lambda d: d["stats"]["tasks"]["src-map/0"].pop("sync_s"), "lacks field 'sync_s'"),
        (lambda d: d.update(format="other"), "format"),
    ],
)
def test_malformed_input_names_source_and_field(change, fragment: str) -> None:
    with pytest.raises(CheckpointError) as info:
        CheckpointMetadata.from_json(_mutated(change), base=BASE, source="/ck/job/chk-7/_metadata")
    assert "/ck/job/chk-7/_metadata" in str(info.value)
    assert fragment in str(info.value)


def test_garbage_bytes_raise_checkpoint_error() -> None:
    with pytest.raises(CheckpointError, match=r"^<bytes>: not valid checkpoint metadata JSON"):
        CheckpointMetadata.from_json(b"\x00{not json", base=BASE)
    with pytest.raises(CheckpointError, match="top level must be an object"):
        CheckpointMetadata.from_json(b"[1, 2]", base=BASE, source="x")


def test_unpicklable_blob_names_state() -> None:
    bogus = base64.b64encode(pickle.dumps(OrderedDict(a=1))).decode()  # not a list
    doc = json.loads(make_metadata().to_json(BASE))
    doc["operators"]["source"]["0"]["union_lists"]["seen"] = bogus
    with pytest.raises(CheckpointError, match=r"union_lists\['seen'\] must be a pickled list"):
        CheckpointMetadata.from_json(json.dumps(doc).encode(), base=BASE, source="f")


def test_unpicklable_state_fails_encoding_with_location() -> None:
    md = make_metadata()
    md.operators["source"][0].operator_lists["bad"] = [_Unpicklable()]
    with pytest.raises(CheckpointError, match=r"operators\['source'\]\[0\] list state 'bad'"):
        md.to_json(BASE)


class _Unpicklable:
    def __reduce__(self):
        raise TypeError("no pickling here")
