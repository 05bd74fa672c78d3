"""The dry-run keyed backend of ``check-upgrade`` gives each state the verdict a real
restore gives it: states snapshotted by the heap and RocksDB backends (checkpoint and
savepoint formats) are restored both into a real backend and into the dry run, and
asked for with the same new descriptor."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from epochstream.core.clock import ManualClock
from epochstream.core.filesystems import storage_fs
from epochstream.core.state_descriptors import (
    ListStateDescriptor,
    MapStateDescriptor,
    StateDescriptor,
    ValueStateDescriptor,
)
from epochstream.deploy.dry_run_backend import DryRunKeyedBackend, is_descriptor_kind
from epochstream.exceptions import StateError
from epochstream.state.backends.base import KeyedBackendContext, SnapshotTarget, StateBackend
from epochstream.state.backends.heap.backend import HeapStateBackend
from epochstream.state.backends.rocksdb.backend import RocksDBStateBackend
from epochstream.state.handles import KeyedStateHandle

MAX_P = 16


@dataclasses.dataclass
class Visit:
    page: str


def _ctx(root: Path, name: str) -> KeyedBackendContext:
    return KeyedBackendContext(
        operator_uid="op",
        subtask=0,
        max_parallelism=MAX_P,
        key_group_range=range(0, MAX_P),
        clock=ManualClock(start=1_000.0),
        local_dir=str(root / name),
    )


def _saved(config: StateBackend, root: Path, savepoint: bool) -> KeyedStateHandle:
    backend = config.create(_ctx(root, "source"))
    count = backend.get_state(ValueStateDescriptor("count"))
    seen = backend.get_state(ListStateDescriptor("seen"))
    visit = backend.get_state(ValueStateDescriptor("visit"))
    for k in range(10):
        backend.set_current_key(k)
        count.update(k)
        seen.add(k)
        visit.update(Visit("/a"))
    (root / "job").mkdir(exist_ok=True)
    target = SnapshotTarget(
        fs=storage_fs(str(root)),
        checkpoint_id=1,
        directory=str(root / ("sp" if savepoint else "job/chk-1")),
        shared_dir=None if savepoint else str(root / "job" / "shared"),
        name="op-0",
        savepoint=savepoint,
    )
    handle = backend.snapshot(target).run()
    assert handle is not None
    backend.dispose()
    return handle


def _migrate(value: Any, old: int) -> Any:
    return value


NEW_DESCRIPTORS = {
    "same": ValueStateDescriptor("count"),
    "migrated": ValueStateDescriptor("count", version=2, migrate=_migrate),
    "version without migrate": ValueStateDescriptor("count", version=2),
    "downgrade": ValueStateDescriptor("count", version=1),
    "kind changed": MapStateDescriptor("seen"),
    "list kept": ListStateDescriptor("seen"),
    "new state": ValueStateDescriptor("fresh"),
}


def _real_verdict(
    config: StateBackend, root: Path, handle: KeyedStateHandle, descriptor: StateDescriptor
) -> tuple[str, str]:
    backend = config.create(_ctx(root, f"real-{descriptor.name}-{descriptor.version}"))
    backend.restore([handle], checkpoint_id=1, owned=False)
    migrated: list[Any] = []
    if descriptor.migrate is not None:
        descriptor = dataclasses.replace(descriptor, migrate=lambda v, old: migrated.append(v) or v)
    try:
        backend.get_state(descriptor)
    except StateError as err:
        return "fail", str(err)
    finally:
        backend.dispose()
    if descriptor.name not in {"count", "seen", "visit"}:
        return "new", ""
    return ("migrate" if migrated else "restore"), ""


@pytest.mark.parametrize("savepoint", [False, True], ids=["checkpoint", "savepoint"])
@pytest.mark.parametrize("kind", ["heap", "rocksdb"])
def test_every_verdict_is_the_real_restores(tmp_path: Path, kind: str, savepoint: bool) -> None:
    config: StateBackend = (
        HeapStateBackend() if kind == "heap" else RocksDBStateBackend(block_cache_mb=8)
    )
    handle = _saved(config, tmp_path, savepoint)
    for case, descriptor in NEW_DESCRIPTORS.items():
        dry = DryRunKeyedBackend(_ctx(tmp_path, "dry"), state_backend_name=config.NAME)
        dry.restore([handle], checkpoint_id=1, owned=False)
        dry.get_state(descriptor)
        outcome = dry.outcomes[descriptor.name]
        assert (outcome.action, outcome.error) == _real_verdict(
            config, tmp_path, handle, descriptor
        ), case


def test_a_changed_class_fails_naming_the_field_and_the_check_goes_on(tmp_path: Path) -> None:
    handle = _saved(HeapStateBackend(), tmp_path, savepoint=True)
    dry = DryRunKeyedBackend(_ctx(tmp_path, "dry"), state_backend_name="heap")
    name = f"{Visit.__module__}:Visit"
    dry.set_class_changes({"visit": [f"{name}: field 'email' added"]})
    dry.restore([handle], checkpoint_id=1, owned=False)
    dry.get_state(ValueStateDescriptor("visit"))
    dry.get_state(ValueStateDescriptor("count"))  # a failed state does not stop the check
    assert dry.outcomes["visit"].action == "fail"
    assert "field 'email' added" in dry.outcomes["visit"].error
    assert dry.outcomes["count"].action == "restore"
    assert set(dry.outcomes) == {"visit", "count"}


def test_state_objects_refuse_use_and_timers_open_empty(tmp_path: Path) -> None:
    dry = DryRunKeyedBackend(_ctx(tmp_path, "dry"), state_backend_name="heap")
    state = dry.get_state(ValueStateDescriptor("count"))
    assert dry.get_state(ValueStateDescriptor("count")) is state
    dry.set_current_key("k")
    with pytest.raises(StateError, match="check-upgrade holds no state"):
        state.value()
    assert not hasattr(state, "__deepcopy__")  # a protocol probe is no use of the state
    table = dry.value_table(ValueStateDescriptor("_timers"), namespaced=True)
    assert list(table.items()) == [] and table.get("k", 7) == 7
    with pytest.raises(StateError, match="check-upgrade holds no state"):
        table["k"] = 1
    assert dry.row_table("rows") is None and dry.row_tables() == []


def test_a_snapshot_of_another_backend_is_refused_as_that_backend_refuses_it(
    tmp_path: Path,
) -> None:
    handle = _saved(HeapStateBackend(), tmp_path, savepoint=False)
    dry = DryRunKeyedBackend(_ctx(tmp_path, "dry"), state_backend_name="rocksdb")
    with pytest.raises(StateError, match="snapshotted by the heap backend"):
        dry.restore([handle], checkpoint_id=1, owned=False)


def test_descriptor_kinds() -> None:
    assert is_descriptor_kind("value") and is_descriptor_kind("ns-list")
    assert not is_descriptor_kind("rows") and not is_descriptor_kind("int64")
