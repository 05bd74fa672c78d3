"""The comparison behind ``epochstream check-upgrade``, on savepoint metadata made in
memory (handles list their states; the dry run reads no file) and jobs built but not
run."""

from __future__ import annotations

import dataclasses
import datetime as dt
from pathlib import Path
from typing import Any

import epochstream as es
from epochstream.checkpoint.metadata import CheckpointMetadata
from epochstream.checkpoint.pending import CompletedCheckpoint
from epochstream.core.checkpoint_stats import CheckpointStats
from epochstream.core.filesystems import storage_fs
from epochstream.core.serializers import JsonSerializer, PickleSerializer
from epochstream.core.state_schema import StateSchema, ValueShape
from epochstream.deploy.upgrade_check import UpgradeReport, check_upgrade
from epochstream.graph.launch import JobDescription
from epochstream.runtime.operators.connectors import SPLITS, TXNS
from epochstream.state.canonical import StateMeta, write_canonical
from epochstream.state.handles import (
    CanonicalSnapshotHandle,
    HeapSnapshotHandle,
    KeyedStateHandle,
    OperatorSubtaskState,
)


@dataclasses.dataclass
class Profile:
    name: str
    visits: int


PROFILE = f"{Profile.__module__}:{Profile.__qualname__}"


class Counting(es.KeyedProcessFunction):
    """Declares ``count`` (and whatever ``extra`` descriptors it is given) in open()."""

    def __init__(self, *descriptors: Any) -> None:
        self.descriptors = descriptors or (es.state.ValueStateDescriptor("count"),)

    def open(self, ctx: Any) -> None:
        self.states = [ctx.get_state(d) for d in self.descriptors]

    def process_element(self, value: Any, ctx: Any, out: Any) -> None:
        out.collect(value)


class Broken(es.KeyedProcessFunction):
    def open(self, ctx: Any) -> None:
        raise RuntimeError("no database here")

    def process_element(self, value: Any, ctx: Any, out: Any) -> None:
        out.collect(value)


def _job(
    function: es.KeyedProcessFunction | None = None,
    *,
    uid: str = "counts",
    parallelism: int = 2,
    max_parallelism: int | None = None,
    allow_non_restored_state: bool = False,
) -> JobDescription:
    env = es.Environment(parallelism=parallelism, runner="local", max_parallelism=max_parallelism)
    stream = env.from_sequence(0, 10).uid("src")
    if function is not None:
        stream = stream.key_by(lambda x: x % 3).process(function).uid(uid)
    stream.sink_to(es.sinks.FileSink("/tmp/never-written")).uid("files")
    return env.job_description("j", allow_non_restored_state=allow_non_restored_state)


def _heap(
    states: dict[str, str], schemas: dict[str, StateSchema] | None = None
) -> HeapSnapshotHandle:
    return HeapSnapshotHandle(key_groups=range(0, 64), states=states, schemas=schemas or {})


def _point(operators: dict[str, dict[int, OperatorSubtaskState]], max_p: int = 128) -> Any:
    md = CheckpointMetadata(
        job_id="old",
        job_name="j",
        checkpoint_id=4,
        kind="savepoint",
        trigger_time=1.0,
        completion_time=2.0,
        parallelism=2,
        max_parallelism=max_p,
        operators=operators,
        operator_parallelism={uid: 2 for uid in operators},
        stats=CheckpointStats(checkpoint_id=4, trigger_time=1.0, duration=0.1, state_size=0),
    )
    return CompletedCheckpoint(4, "/sp/savepoint-1", md, owned=False)


def _saved(keyed: KeyedStateHandle | None = None, **more: Any) -> dict[str, dict[int, Any]]:
    """A savepoint of src (two splits), files (two pending transactions) and, with
    ``keyed``, operator ``counts``; ``more``: further uids' keyed handles."""
    ops: dict[str, dict[int, Any]] = {
        "src": {
            0: OperatorSubtaskState(operator_lists={SPLITS: ["a"]}),
            1: OperatorSubtaskState(operator_lists={SPLITS: ["b"]}),
        },
        "files": {
            0: OperatorSubtaskState(union_lists={TXNS: ["t0"]}),
            1: OperatorSubtaskState(union_lists={TXNS: ["t1"]}),
        },
    }
    if keyed is not None:
        ops["counts"] = {0: OperatorSubtaskState(keyed=keyed)}
    for uid, handle in more.items():
        ops[uid] = {0: OperatorSubtaskState(keyed=handle)}
    return ops


def _op(report: UpgradeReport, uid: str) -> Any:
    return {op.uid: op for op in report.operators}[uid]


def _verdicts(report: UpgradeReport, uid: str) -> dict[str, str]:
    return {s.name: s.verdict for s in _op(report, uid).states}


def test_an_unchanged_job_restores_every_state_and_names_sources_and_sinks() -> None:
    report = check_upgrade(_job(Counting()), _point(_saved(_heap({"count": "value"}))))
    assert report.ok and not report.errors
    assert _op(report, "counts").status == "restored"
    assert _verdicts(report, "counts") == {"count": "restore", "__timers": "new"}
    assert report.sources == {"src": 2} and report.sinks == {"files": 2}
    assert (report.max_parallelism, report.job_max_parallelism) == (128, None)
    doc = report.to_json()
    assert doc["ok"] is True and doc["sources"] == [{"uid": "src", "splits": 2}]
    assert doc["sinks"] == [{"uid": "files", "pending_transactions": 2}]
    assert set(doc) == {
        "ok",
        "savepoint",
        "max_parallelism",
        "parallelism",
        "allow_non_restored_state",
        "errors",
        "operators",
        "sources",
        "sinks",
    }


def test_a_state_verdict_fails_the_check_with_the_restores_error() -> None:
    new = Counting(es.state.ListStateDescriptor("count"), es.state.ValueStateDescriptor("more"))
    report = check_upgrade(_job(new), _point(_saved(_heap({"count": "value"}))))
    assert not report.ok
    states = {s.name: s for s in _op(report, "counts").states}
    assert states["count"].verdict == "fail"
    assert states["count"].error == (
        "operator 'counts', state 'count': cannot restore it: it was saved as value state "
        "and is now list state"
    )
    assert states["more"].verdict == "new"  # the check went on after the failure


def test_versions_migrate_or_fail_and_changed_classes_fail() -> None:
    saved = _heap(
        {"count": "value", "profile": "value"},
        {"profile": StateSchema(1, frozenset({ValueShape(PROFILE, ("name",))}))},
    )
    migrated = Counting(
        es.state.ValueStateDescriptor("count", version=2, migrate=lambda v, old: v),
        es.state.ValueStateDescriptor("profile"),
    )
    report = check_upgrade(_job(migrated), _point(_saved(saved)))
    verdicts = _verdicts(report, "counts")
    assert verdicts["count"] == "migrate" and verdicts["profile"] == "fail"
    profile = {s.name: s for s in _op(report, "counts").states}["profile"]
    assert "field 'visits' added" in profile.error
    assert (profile.saved_version, profile.version) == (1, 1)
    count = {s.name: s for s in _op(report, "counts").states}["count"]
    assert count.migration_needed and count.migrate_given
    assert count.to_json()["migration_needed"] is True
    assert profile.migration_needed is False and profile.migrate_given is False


def test_states_not_asked_for_in_open_and_columnar_state_are_reported_not_judged() -> None:
    saved = _heap({"count": "value", "later": "map", "groups": "rows"})
    report = check_upgrade(_job(Counting()), _point(_saved(saved)))
    assert report.ok
    verdicts = _verdicts(report, "counts")
    assert verdicts["later"] == "undeclared" and verdicts["groups"] == "unchecked"


def test_left_behind_uids_fail_unless_allowed_and_a_rename_is_hinted() -> None:
    saved = _saved(None, profiles=_heap({"count": "value", "__timers": "ns-value"}))
    refused = check_upgrade(_job(Counting(), uid="profiles-v2"), _point(saved))
    assert not refused.ok
    assert "state of operators ['profiles'] has no operator with that uid" in refused.errors[0]
    gone, fresh = _op(refused, "profiles"), _op(refused, "profiles-v2")
    assert (gone.status, fresh.status) == ("left_behind", "new")
    assert (gone.renamed_to, fresh.renamed_from) == ("profiles-v2", "profiles")
    assert _verdicts(refused, "profiles") == {"count": "dropped", "__timers": "dropped"}

    allowed = check_upgrade(
        _job(Counting(), uid="profiles-v2", allow_non_restored_state=True), _point(saved)
    )
    assert allowed.ok and allowed.allow_non_restored_state


def test_max_parallelism_is_adopted_or_refused_and_bounds_the_parallelism() -> None:
    saved = _saved(_heap({"count": "value"}))
    adopted = check_upgrade(_job(Counting()), _point(saved, max_p=32))
    assert adopted.ok and adopted.max_parallelism == 32

    changed = check_upgrade(_job(Counting(), max_parallelism=64), _point(saved, max_p=32))
    assert not changed.ok and changed.job_max_parallelism == 64
    assert "its max_parallelism is 32 but the job sets 64" in changed.errors[0]

    too_wide = check_upgrade(_job(Counting(), parallelism=40), _point(saved, max_p=32))
    assert not too_wide.ok and "parallelism 40 is above" in too_wide.errors[0]
    assert _verdicts(too_wide, "counts")["count"] == "restore"  # states are still checked


def test_an_open_that_fails_otherwise_fails_the_check_naming_the_error() -> None:
    report = check_upgrade(_job(Broken()), _point(_saved(_heap({"count": "value"}))))
    assert not report.ok
    assert _op(report, "counts").error == "RuntimeError: no database here"


def test_serializer_and_ttl_changes_are_read_from_savepoint_files(tmp_path: Path) -> None:
    fs = storage_fs(str(tmp_path))
    handle = write_canonical(
        fs,
        str(tmp_path / "op-0.arrow"),
        {"count": StateMeta("value", JsonSerializer()), "seen": StateMeta("value")},
        [(0, [("count", b"k", None, None, b"1", 5.0), ("seen", b"k", None, None, b"x", None)])],
        key_groups=range(0, 128),
    )
    assert isinstance(handle, CanonicalSnapshotHandle)
    new = Counting(
        es.state.ValueStateDescriptor("count"),
        es.state.ValueStateDescriptor("seen", serializer=PickleSerializer(), ttl=dt.timedelta(1)),
    )
    report = check_upgrade(_job(new), _point(_saved(handle)))
    states = {s.name: s for s in _op(report, "counts").states}
    assert states["count"].serializer_changed is True  # JSON saved, pickle now
    assert (states["count"].saved_ttl, states["count"].ttl, states["count"].ttl_changed) == (
        True,
        False,
        True,
    )
    assert states["seen"].serializer_changed is False
    assert (states["seen"].saved_ttl, states["seen"].ttl) == (False, True)

    unknown = check_upgrade(_job(new), _point(_saved(_heap({"count": "value"}))))
    count = {s.name: s for s in _op(unknown, "counts").states}["count"]
    assert count.serializer_changed is None and count.ttl_changed is None


def test_an_operator_no_longer_keyed_drops_its_keyed_state() -> None:
    env = es.Environment(parallelism=2, runner="local")
    stream = env.from_sequence(0, 10).uid("src").map(lambda x: x).uid("counts")
    stream.sink_to(es.sinks.FileSink("/tmp/never-written")).uid("files")
    report = check_upgrade(env.job_description("j"), _point(_saved(_heap({"count": "value"}))))
    assert report.ok and _op(report, "counts").status == "restored"
    assert _verdicts(report, "counts") == {"count": "dropped"}
