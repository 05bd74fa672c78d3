"""es.savepoint.load / new: bootstrapping, changing and writing savepoints offline.

Written savepoints are read back with ``read_keyed_state`` and restored into heap and
RocksDB backends at another parallelism, as a job's restore hands them out
(``build_restores``)."""

from __future__ import annotations

import json
import os
import shutil
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import epochstream as es
from epochstream.checkpoint.metadata import CheckpointMetadata
from epochstream.checkpoint.storage import load_metadata, write_metadata_file
from epochstream.core.checkpoint_stats import CheckpointStats
from epochstream.core.clock import ManualClock
from epochstream.core.filesystems import storage_fs
from epochstream.core.serializers import JsonSerializer
from epochstream.core.state_descriptors import (
    ListStateDescriptor,
    MapStateDescriptor,
    ValueStateDescriptor,
)
from epochstream.exceptions import CheckpointError, StateError
from epochstream.graph.windowing import TimeWindow
from epochstream.state.backends.base import KeyedBackendContext, RowSchema, SnapshotTarget
from epochstream.state.backends.heap.backend import HeapStateBackend
from epochstream.state.backends.rocksdb.backend import RocksDBStateBackend
from epochstream.state.handles import CanonicalSnapshotHandle, OperatorSubtaskState
from epochstream.state.keygroups import key_group_for_key, key_group_range_for_operator
from epochstream.state.redistribute import build_restores

WORDS = pa.table({"word": ["a", "b", "c", "d", "e"], "n": [1, 2, 3, 4, 5]})
BACKENDS = {"heap": HeapStateBackend, "rocksdb": lambda: RocksDBStateBackend(block_cache_mb=8)}


@pytest.fixture
def root(tmp_path: Path) -> Path:
    tmp_path.chmod(0o700)
    return tmp_path


def _backend(kind: str, root: Path, max_p: int, parallelism: int, subtask: int, uid: str) -> Any:
    ctx = KeyedBackendContext(
        operator_uid=uid,
        subtask=subtask,
        max_parallelism=max_p,
        key_group_range=key_group_range_for_operator(max_p, parallelism, subtask),
        clock=ManualClock(start=1_000.0),
        local_dir=str(root / "local" / f"{kind}-{uid}-{parallelism}-{subtask}"),
    )
    return BACKENDS[kind]().create(ctx)


def _restored(kind: str, path: str, uid: str, parallelism: int, root: Path) -> list[Any]:
    """One backend per subtask of ``uid`` at ``parallelism``, restored from ``path``."""
    _dir, md = load_metadata(path)
    restores = build_restores(
        md.operators[uid],
        old_parallelism=md.operator_parallelism[uid],
        new_parallelism=parallelism,
        max_parallelism=md.max_parallelism,
    )
    backends = []
    for i, restore in enumerate(restores):
        backend = _backend(kind, root, md.max_parallelism, parallelism, i, uid)
        backend.restore(restore.keyed, checkpoint_id=None, owned=False)
        backends.append(backend)
    return backends


def _state_of(backends: list[Any], descriptor: Any, keys: list[Any]) -> dict[Any, Any]:
    """The state of every key, read from the backend owning its key group."""
    out = {}
    for key in keys:
        owner = [
            b
            for b in backends
            if key_group_for_key(key, b.ctx.max_parallelism) in b.key_group_range
        ]
        assert len(owner) == 1
        state = owner[0].get_state(descriptor)
        owner[0].set_current_key(key)
        if isinstance(descriptor, ListStateDescriptor):
            out[key] = list(state.get())
        elif isinstance(descriptor, MapStateDescriptor):
            out[key] = dict(state.items())
        else:
            out[key] = state.value()
    return out


def _pairs(table: pa.Table) -> dict[Any, Any]:
    cols = table.to_pydict()
    return dict(zip(cols["key"], cols["value"], strict=True))


# ---------------------------------------------------------------- bootstrap


@pytest.mark.parametrize("kind", ["heap", "rocksdb"])
def test_bootstrapped_value_list_and_map_state_restore_into_either_backend(
    root: Path, kind: str
) -> None:
    events = pa.table({"user": ["u1", "u2", "u1", "u1"], "page": ["/a", "/b", "/c", "/a"]})
    visits = pa.table({"user": ["u1", "u1", "u2"], "page": ["/a", "/c", "/b"], "n": [2, 1, 1]})
    new = es.savepoint.new(max_parallelism=64, parallelism=3)
    new.with_keyed_state("op", "count", WORDS, key="word", value="n")
    new.with_keyed_state("op", "pages", events, key="user", value="page", kind="list")
    new.with_keyed_state("op", "visits", visits, key="user", user_key="page", value="n", kind="map")
    path = new.write(str(root / "sp"))

    for parallelism in (1, 2):
        backends = _restored(kind, path, "op", parallelism, root / f"p{parallelism}")
        assert _state_of(backends, ValueStateDescriptor("count"), list("abcde")) == dict(
            zip("abcde", [1, 2, 3, 4, 5], strict=True)
        )
        assert _state_of(backends, ListStateDescriptor("pages"), ["u1", "u2"]) == {
            "u1": ["/a", "/c", "/a"],  # a key's elements in input order
            "u2": ["/b"],
        }
        assert _state_of(backends, MapStateDescriptor("visits"), ["u1", "u2"]) == {
            "u1": {"/a": 2, "/c": 1},
            "u2": {"/b": 1},
        }


def test_bootstrap_writes_one_file_per_key_group_range_one_batch_per_key_group(root: Path) -> None:
    path = (
        es.savepoint.new(max_parallelism=16, parallelism=2)
        .with_keyed_state("op", "count", WORDS, key="word", value="n")
        .write(str(root / "sp"))
    )
    _dir, md = load_metadata(path)
    handles = [md.operators["op"][i].keyed for i in range(2)]
    assert [h.key_groups for h in handles] == [range(0, 8), range(8, 16)]
    assert md.kind == "savepoint" and md.max_parallelism == 16
    for handle in handles:
        assert isinstance(handle, CanonicalSnapshotHandle)
        assert handle.schemas["count"].version == 1
        reader = pa.ipc.open_file(handle.path)
        for kg, index in handle.batches.items():
            assert set(reader.get_batch(index).column("key_group").to_pylist()) == {kg}
    table = es.savepoint.read(path, "op", "count")
    assert table.column("key_group").to_pylist() == [
        key_group_for_key(k, 16) for k in table.column("key").to_pylist()
    ]


def test_keys_values_and_sources_of_every_shape(root: Path) -> None:
    pq.write_table(WORDS, root / "words.parquet")
    new = es.savepoint.new()
    new.with_keyed_state("op", "tuples", WORDS, key=["word", "n"], value=lambda r: r["n"] * 10)
    new.with_keyed_state("op", "rows", pads.dataset(root / "words.parquet"), key="word")
    new.with_keyed_state(
        "op",
        "json",
        iter(WORDS.to_batches(max_chunksize=2)),
        key="word",
        value="n",
        serializer=JsonSerializer(),
        version=3,
    )
    path = new.write(str(root / "sp"))
    sp = es.savepoint.load(path)
    tuples = sp.read_keyed_state("op", "tuples")  # tuple keys read as their repr
    assert _pairs(tuples)["('c', 3)"] == 30
    assert _pairs(sp.read_keyed_state("op", "rows"))["b"] == {"word": "b", "n": 2}
    assert _pairs(sp.read_keyed_state("op", "json")) == dict(zip("abcde", range(1, 6), strict=True))
    _dir, md = load_metadata(path)
    assert md.operators["op"][0].keyed.schemas["json"].version == 3
    with pytest.raises(StateError, match="iterator, already read"):
        new.write(str(root / "again"))


@pytest.mark.parametrize("library", ["pandas", "polars"])
def test_pandas_and_polars_frames_go_through_arrow(root: Path, library: str) -> None:
    frames = __import__(library)
    frame = frames.DataFrame({"word": ["x", "y"], "n": [7, 8]})
    path = (
        es.savepoint.new()
        .with_keyed_state("op", "n", frame, key="word", value="n")
        .write(str(root / "sp"))
    )
    assert _pairs(es.savepoint.read(path, "op", "n")) == {"x": 7, "y": 8}


def test_bad_input_is_refused_naming_operator_state_column_and_row(root: Path) -> None:
    def write(table: pa.Table, **options: Any) -> None:
        es.savepoint.new().with_keyed_state("op", "count", table, **options).write(
            str(root / f"sp-{len(os.listdir(root))}")
        )

    with pytest.raises(StateError, match=r"operator 'op', state 'count'.*column 'word'.*not in"):
        write(pa.table({"w": ["a"]}), key="word", value="w")
    with pytest.raises(StateError, match=r"'op'.*'count'.*row 1.*key \(column 'word'\) is null"):
        write(pa.table({"word": ["a", None], "n": [1, 2]}), key="word", value="n")
    with pytest.raises(StateError, match=r"'op'.*value state 'count': key 'a' appears more"):
        write(pa.table({"word": ["a", "b", "a"], "n": [1, 2, 3]}), key="word", value="n")
    with pytest.raises(StateError, match=r"map state 'count': key 'a', user key 1, appears"):
        write(
            pa.table({"word": ["a", "a"], "u": [1, 1], "n": [1, 2]}),
            key="word",
            user_key="u",
            value="n",
            kind="map",
        )
    with pytest.raises(StateError, match="kind must be one of"):
        write(WORDS, key="word", kind="reducing")
    with pytest.raises(StateError, match="map state needs user_key"):
        write(WORDS, key="word", kind="map")
    with pytest.raises(StateError, match="data must be a pyarrow Table"):
        write("not data", key="word")  # type: ignore[arg-type]


def test_operator_and_union_list_state(root: Path) -> None:
    new = es.savepoint.new(parallelism=2)
    new.with_operator_state("source", "offsets", [("t", 0, 5), ("t", 1, 9), ("t", 2, 1)])
    new.with_operator_state("source", "epoch", ["e7"], union=True)
    path = new.write(str(root / "sp"))
    _dir, md = load_metadata(path)
    assert md.operators["source"][0].operator_lists == {"offsets": [("t", 0, 5), ("t", 2, 1)]}
    assert md.operators["source"][1].operator_lists == {"offsets": [("t", 1, 9)]}
    assert md.operators["source"][0].union_lists == {"epoch": ["e7"]}
    sp = es.savepoint.load(path)
    assert sorted(sp.read_operator_state("source", "offsets")) == [
        ("t", 0, 5),
        ("t", 1, 9),
        ("t", 2, 1),
    ]
    assert sp.read_operator_state("source", "epoch") == ["e7"]
    info = sp.operators["source"]
    assert (info.operator_states, info.union_states, info.keyed_states) == (
        ("offsets",),
        ("epoch",),
        {},
    )
    with pytest.raises(StateError, match="has no operator state 'nope'"):
        sp.read_operator_state("source", "nope")
    with pytest.raises(StateError, match="made with new"):
        new.read_keyed_state("source", "offsets")


KEYS = st.sampled_from([st.integers(-(2**40), 2**40), st.text(max_size=6)])


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    entries=KEYS.flatmap(
        lambda keys: st.lists(st.tuples(keys, st.integers(-(2**62), 2**62)), max_size=60)
    ),
    max_p=st.sampled_from([1, 7, 128]),
    parallelism=st.integers(1, 4),
)
def test_bootstrap_then_read_gives_the_input(
    tmp_path_factory: pytest.TempPathFactory,
    entries: list[tuple[Any, int]],
    max_p: int,
    parallelism: int,
) -> None:
    root = tmp_path_factory.mktemp("prop")
    root.chmod(0o700)
    first: dict[Any, int] = {}
    expected: dict[Any, list[int]] = defaultdict(list)
    for k, v in entries:
        first.setdefault(k, v)
        expected[k].append(v)
    new = es.savepoint.new(max_parallelism=max_p, parallelism=min(parallelism, max_p))
    new.memory_budget = 512  # small: the spill splits its ranges before writing them
    values = pa.table({"k": list(first), "v": list(first.values())})
    new.with_keyed_state("op", "value", values, key="k", value="v")
    entries_table = pa.table({"k": [k for k, _ in entries], "v": [v for _, v in entries]})
    new.with_keyed_state("op", "list", entries_table, key="k", value="v", kind="list")
    path = new.write(str(root / "sp"))
    sp = es.savepoint.load(path)
    assert _pairs(sp.read_keyed_state("op", "value")) == first
    lists = sp.read_keyed_state("op", "list").to_pydict()
    got: dict[Any, list[int]] = defaultdict(list)
    for k, v, kg in zip(lists["key"], lists["value"], lists["key_group"], strict=True):
        assert kg == key_group_for_key(k, max_p)
        got[k].append(v)
    assert got == expected


# ---------------------------------------------------------------- changing


def _bootstrapped(root: Path, name: str = "sp", **options: Any) -> str:
    new = es.savepoint.new(**options)
    new.with_keyed_state("counter", "count", WORDS, key="word", value="n")
    new.with_keyed_state("counter", "pairs", WORDS, key="word", value=["word", "n"])
    new.with_operator_state("source", "offsets", [1, 2, 3])
    return new.write(str(root / name))


def test_transform_drops_rows_and_moves_changed_keys(root: Path) -> None:
    sp = es.savepoint.load(_bootstrapped(root, parallelism=2))

    def upper_odd_doubled(batch: pa.RecordBatch) -> pa.RecordBatch:
        odd = batch.filter(pc.equal(pc.bit_wise_and(batch["value"], 1), 1))
        keys = pc.utf8_upper(odd["key"])
        return odd.set_column(0, "key", keys).set_column(1, "value", pc.multiply(odd["value"], 2))

    out = sp.transform("counter", "count", upper_odd_doubled).write(str(root / "out"))
    table = es.savepoint.read(out, "counter", "count")
    assert _pairs(table) == {"A": 2, "C": 6, "E": 10}
    assert table.column("key_group").to_pylist() == [
        key_group_for_key(k, 128) for k in table.column("key").to_pylist()
    ]
    # The other state and operator are as they were.
    assert _pairs(es.savepoint.read(out, "counter", "pairs"))["b"] == "('b', 2)"  # as repr
    assert sorted(es.savepoint.load(out).read_operator_state("source", "offsets")) == [1, 2, 3]
    nulls = es.savepoint.load(out).transform(
        "counter", "count", lambda b: b.set_column(0, "key", pa.nulls(b.num_rows, pa.string()))
    )
    with pytest.raises(StateError, match=r"'counter', state 'count', row 0: the key is null"):
        nulls.write(str(root / "nulls"))


def test_transform_of_values_arrow_cannot_hold_points_to_map_values(root: Path) -> None:
    sp = es.savepoint.load(_bootstrapped(root))
    sp.transform("counter", "pairs", lambda b: b)
    with pytest.raises(StateError, match=r"'counter', state 'pairs'.*use map_values"):
        sp.write(str(root / "out"))
    sp = es.savepoint.load(_bootstrapped(root, "sp2"))
    out = sp.map_values("counter", "pairs", lambda t: (t[0], t[1] * 2)).write(str(root / "out2"))
    assert _pairs(es.savepoint.read(out, "counter", "pairs"))["e"] == "('e', 10)"
    with pytest.raises(StateError, match="returned a NoneType, not a pyarrow RecordBatch"):
        es.savepoint.load(out).transform("counter", "count", lambda b: None).write(
            str(root / "out3")
        )


def test_drop_rename_and_drop_state(root: Path) -> None:
    sp = es.savepoint.load(_bootstrapped(root))
    with pytest.raises(StateError, match="'source' exists"):
        sp.rename_operator("counter", "source")
    with pytest.raises(StateError, match="no operator with uid 'nope'"):
        sp.drop_operator("nope")
    with pytest.raises(StateError, match="has no state 'nope'"):
        sp.drop_state("counter", "nope")
    sp.rename_operator("counter", "counter-v2").drop_state("counter-v2", "pairs")
    sp.drop_state("source", "offsets")
    out = sp.write(str(root / "out"))
    loaded = es.savepoint.load(out)
    assert set(loaded.operators) == {"counter-v2", "source"}
    assert loaded.operators["counter-v2"].keyed_states == {"count": "value"}
    assert loaded.operators["source"].operator_states == ()
    assert _pairs(loaded.read_keyed_state("counter-v2", "count"))["d"] == 4
    sp = es.savepoint.load(out).drop_operator("source")
    assert set(es.savepoint.load(sp.write(str(root / "out2"))).operators) == {"counter-v2"}


@pytest.mark.parametrize("kind", ["heap", "rocksdb"])
def test_max_parallelism_changes_regroup_keys(root: Path, kind: str) -> None:
    sp = es.savepoint.load(_bootstrapped(root, parallelism=4))
    out = sp.with_max_parallelism(3).write(str(root / "out"))
    loaded = es.savepoint.load(out)
    assert loaded.max_parallelism == 3
    assert loaded.operators["counter"].parallelism == 3  # lowered to the key groups
    assert sorted(loaded.read_operator_state("source", "offsets")) == [1, 2, 3]
    backends = _restored(kind, out, "counter", 2, root)
    assert _state_of(backends, ValueStateDescriptor("count"), list("abcde")) == dict(
        zip("abcde", [1, 2, 3, 4, 5], strict=True)
    )


def _row_table_savepoint(root: Path) -> str:
    """A savepoint holding a row table (a RocksDB backend's canonical savepoint of one)."""
    backend = _backend("rocksdb", root, 128, 1, 0, "join")
    schema = RowSchema(pa.schema([("id", pa.int64()), ("name", pa.string())]), key="id")
    batch = pa.record_batch({"id": [1, 2], "name": ["x", "y"]})
    kgs = [key_group_for_key(k, 128) for k in batch.column("id").to_pylist()]
    backend.row_table("left@0", schema).append(batch, np.array(kgs, dtype=np.int32))
    return _savepoint_of(backend, root, "join", "rows-sp")


def test_state_kept_by_key_group_is_copied_not_regrouped(root: Path) -> None:
    sp = es.savepoint.load(_row_table_savepoint(root))
    assert sp.operators["join"].keyed_states == {"left@0": "rows"}
    with pytest.raises(StateError, match=r"'join' has state \['left@0'\] \(rows\)"):
        sp.with_max_parallelism(64)
    with pytest.raises(StateError, match="transform takes value, list and map state"):
        sp.transform("join", "left@0", lambda b: b)
    out = sp.write(str(root / "copy"))
    rows = es.savepoint.read(out, "join", "left@0")
    assert sorted(r["name"] for r in rows.column("value").to_pylist()) == ["x", "y"]


@pytest.mark.parametrize("kind", ["heap", "rocksdb"])
def test_a_checkpoint_becomes_a_self_contained_canonical_savepoint(root: Path, kind: str) -> None:
    backend = _backend(kind, root, 128, 1, 0, "counter")
    count, seen = (
        backend.get_state(ValueStateDescriptor("count")),
        backend.get_state(ListStateDescriptor("seen")),
    )
    for i in range(20):
        backend.set_current_key(f"k{i}")
        count.update(i)
        seen.add_all([i, i + 1])
    chk = root / "job" / "chk-1"
    chk.mkdir(parents=True)
    target = SnapshotTarget(
        fs=storage_fs(str(root)),
        checkpoint_id=1,
        directory=str(chk),
        shared_dir=str(root / "job" / "shared"),
        name="counter-0",
    )
    (root / "job" / "shared").mkdir()
    handle = backend.snapshot(target).run()
    md = CheckpointMetadata(
        job_id="j",
        checkpoint_id=1,
        trigger_time=1.0,
        completion_time=1.0,
        parallelism=1,
        max_parallelism=128,
        operators={"counter": {0: OperatorSubtaskState(keyed=handle)}},
        operator_parallelism={"counter": 1},
        stats=CheckpointStats(checkpoint_id=1, trigger_time=1.0, duration=0.0, state_size=0),
    )
    write_metadata_file(storage_fs(str(chk)), str(chk), md)

    # The job's checkpoint directory: its newest completed checkpoint.
    (root / "job" / "chk-2").mkdir()  # not completed: no _metadata
    sp = es.savepoint.load(str(root / "job"))
    assert sp.operators["counter"].keyed_states == {"count": "value", "seen": "list"}
    out = sp.write(str(root / "sp"))
    shutil.rmtree(root / "job")  # the savepoint needs nothing of its source
    doc = json.loads(Path(out, "_metadata").read_text())
    assert doc["kind"] == "savepoint"
    assert doc["operators"]["counter"]["0"]["keyed"]["type"] == "canonical"
    other = "rocksdb" if kind == "heap" else "heap"
    backends = _restored(other, out, "counter", 2, root)
    keys = [f"k{i}" for i in range(20)]
    assert _state_of(backends, ValueStateDescriptor("count"), keys) == {
        f"k{i}": i for i in range(20)
    }
    assert _state_of(backends, ListStateDescriptor("seen"), keys)["k3"] == [3, 4]


def test_unchanged_canonical_operators_are_copied(root: Path) -> None:
    source = _bootstrapped(root, parallelism=2)
    out = es.savepoint.load(source).write(str(root / "copy"))
    shutil.rmtree(source)
    assert len(os.listdir(out)) == 3  # a state file per subtask, and _metadata
    assert _pairs(es.savepoint.read(out, "counter", "count"))["c"] == 3
    assert sorted(es.savepoint.load(out).read_operator_state("source", "offsets")) == [1, 2, 3]


def test_write_refuses_an_existing_savepoint(root: Path) -> None:
    path = _bootstrapped(root)
    with pytest.raises(CheckpointError, match="already holds a savepoint"):
        es.savepoint.load(path).write(path)


def test_savepoints_are_written_to_and_loaded_from_s3(
    s3_bucket: str, s3_options: dict[str, str]
) -> None:
    new = es.savepoint.new(parallelism=2, storage_options=s3_options)
    new.with_keyed_state("counter", "count", WORDS, key="word", value="n")
    path = new.write(f"{s3_bucket}/sp/boot")
    assert path.startswith("s3://")
    sp = es.savepoint.load(path, storage_options=s3_options)
    doubled = sp.map_values("counter", "count", lambda n: n * 2).write(f"{s3_bucket}/sp/doubled")
    table = es.savepoint.read(doubled, "counter", "count", storage_options=s3_options)
    assert _pairs(table) == {w: 2 * n for w, n in zip("abcde", range(1, 6), strict=True)}


def _savepoint_of(backend: Any, root: Path, uid: str, name: str) -> str:
    """A savepoint directory holding ``backend``'s state as operator ``uid``'s."""
    directory = root / name
    directory.mkdir()
    target = SnapshotTarget(
        fs=storage_fs(str(root)),
        checkpoint_id=1,
        directory=str(directory),
        shared_dir=None,
        name=f"{uid}-0",
        savepoint=True,
    )
    handle = backend.snapshot(target).run()
    md = CheckpointMetadata(
        job_id="j",
        checkpoint_id=1,
        kind="savepoint",
        trigger_time=1.0,
        completion_time=1.0,
        parallelism=1,
        max_parallelism=backend.ctx.max_parallelism,
        operators={uid: {0: OperatorSubtaskState(keyed=handle)}},
        operator_parallelism={uid: 1},
        stats=CheckpointStats(checkpoint_id=1, trigger_time=1.0, duration=0.0, state_size=0),
    )
    write_metadata_file(storage_fs(str(directory)), str(directory), md)
    return str(directory)


@pytest.mark.parametrize(("first", "second"), [("heap", "rocksdb"), ("rocksdb", "heap")])
def test_window_contents_pass_through_transforms_and_regrouping(
    root: Path, first: str, second: str
) -> None:
    backend = _backend(first, root, 128, 1, 0, "window")
    contents = backend.get_namespaced_state(ListStateDescriptor("contents"))
    for key in ("a", "b", "c"):
        backend.set_current_key(key)
        for start in (0, 5_000):
            contents.set_namespace(TimeWindow(start, start + 5_000))
            contents.add_all([start, start + 1])
    path = _savepoint_of(backend, root, "window", "sp")
    sp = es.savepoint.load(path)
    assert sp.operators["window"].keyed_states == {"contents": "ns-list"}
    if first == "heap":
        out = sp.map_values("window", "contents", lambda v: v * 10)
    else:  # the namespace column holds the windows as lists of their bounds
        out = sp.transform(
            "window", "contents", lambda b: b.set_column(1, "value", pc.multiply(b["value"], 10))
        )
    out.with_max_parallelism(64)
    written = out.write(str(root / "out"))

    restored = _restored(second, written, "window", 2, root)
    for key in ("a", "b", "c"):
        (owner,) = [b for b in restored if key_group_for_key(key, 64) in b.key_group_range]
        state = owner.get_namespaced_state(ListStateDescriptor("contents"))
        owner.set_current_key(key)
        for start in (0, 5_000):
            state.set_namespace(TimeWindow(start, start + 5_000))
            assert list(state.get()) == [start * 10, (start + 1) * 10]


@pytest.mark.parametrize("kind", ["heap", "rocksdb"])
def test_bootstrapped_ttl_timestamps_expire_as_a_jobs_would(root: Path, kind: str) -> None:
    rows = pa.table({"k": ["fresh", "stale"], "n": [1, 2], "updated": [995.0, 980.0]})
    new = es.savepoint.new().with_keyed_state("op", "n", rows, key="k", value="n", ttl_ts="updated")
    new.with_keyed_state("op", "all", rows, key="k", value="n", ttl_ts=999.0)
    path = new.write(str(root / "sp"))
    assert es.savepoint.read(path, "op", "n").sort_by("key").column("ttl_ts").to_pylist() == [
        995.0,
        980.0,
    ]
    backends = _restored(kind, path, "op", 1, root)  # their clock reads 1000.0
    ttl = ValueStateDescriptor("n", ttl=10.0)
    assert _state_of(backends, ttl, ["fresh", "stale"]) == {"fresh": 1, "stale": None}
    both = _state_of(backends, ValueStateDescriptor("all", ttl=10.0), ["fresh", "stale"])
    assert both == {"fresh": 1, "stale": 2}


@pytest.mark.parametrize("kind", ["heap", "rocksdb"])
def test_values_migrated_offline_restore_at_their_new_version(root: Path, kind: str) -> None:
    path = _bootstrapped(root)
    v2 = ValueStateDescriptor("count", version=2)  # no migrate=: the values must be v2
    migrated = es.savepoint.load(path).map_values("counter", "count", str, version=2)
    out = migrated.write(str(root / "v2"))
    backends = _restored(kind, out, "counter", 2, root / "ok")
    assert _state_of(backends, v2, list("abcde")) == {
        w: str(n) for w, n in zip("abcde", range(1, 6), strict=True)
    }
    unmigrated = _restored(kind, path, "counter", 1, root / "refused")
    with pytest.raises(StateError, match="without migrate="):
        _state_of(unmigrated, v2, ["a"])
    with pytest.raises(StateError, match="version must be an int >= 1, got 0"):
        es.savepoint.load(path).transform("counter", "count", lambda b: b, version=0)
