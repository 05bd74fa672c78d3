"""The heap backend's snapshot files: blocks, key-group segments of older files, checks."""

from __future__ import annotations

import io
import pickle
import struct
import zlib
from pathlib import Path

import pytest

from epochstream.core.filesystems import storage_fs
from epochstream.core.state_descriptors import ValueStateDescriptor
from epochstream.exceptions import CorruptStateError
from epochstream.state.backends.heap.backend import HeapStateBackend
from epochstream.state.backends.heap.files import (
    CHUNK_ENTRIES,
    DELETED,
    encode_block,
    merge_chain,
    split_key_groups,
    write_encoded,
)
from epochstream.state.handles import HeapSnapshotHandle, HeapStateFile
from epochstream.state.keygroups import KeyGroupAssigner, key_group_for_key

from ..conftest import Harness

MAX_P = 128
ASSIGNER = KeyGroupAssigner.shared(MAX_P)


def _keys_in(groups: range, n: int) -> list[str]:
    keys = [f"k{i}" for i in range(n * 4)]
    return [k for k in keys if key_group_for_key(k, MAX_P) in groups][:n]


def _block(
    tmp_path: Path, name: str, state: dict, groups: range, *, full: bool = True
) -> HeapStateFile:
    fs = storage_fs(str(tmp_path))
    path = str(tmp_path / name)
    spans, size = write_encoded(fs, path, encode_block(state), groups)
    return HeapStateFile(path, full, spans, size, shared=False)


def test_a_block_maps_every_key_group_to_one_segment_and_reads_back(tmp_path: Path) -> None:
    groups = range(0, 64)
    keys = _keys_in(groups, 200)
    state = {"sums": {k: (k, i) for i, k in enumerate(keys)}}
    file = _block(tmp_path, "a.kst", state, groups)
    assert set(file.segments) == set(groups)
    assert set(file.segments.values()) == {(0, file.size)}
    fs = storage_fs(str(tmp_path))
    assert merge_chain(fs, [file], groups, ASSIGNER) == state


def test_a_restore_of_part_of_a_block_keeps_only_its_key_groups(tmp_path: Path) -> None:
    groups = range(0, 64)
    keys = _keys_in(groups, 300)
    state = {
        "sums": {k: i for i, k in enumerate(keys)},
        "win": {(k, "ns"): [i] for i, k in enumerate(keys)},  # namespaced: (key, namespace)
    }
    file = _block(tmp_path, "a.kst", state, groups)
    fs = storage_fs(str(tmp_path))
    part = range(32, 64)
    kept = file.restricted_to(part)
    assert kept is not None
    merged = merge_chain(fs, [kept], part, ASSIGNER, ["win"])
    mine = [k for k in keys if key_group_for_key(k, MAX_P) in part]
    assert 0 < len(mine) < len(keys)
    assert merged["sums"] == {k: state["sums"][k] for k in mine}
    assert merged["win"] == {(k, "ns"): state["win"][(k, "ns")] for k in mine}


def test_deltas_apply_in_order_and_delete(tmp_path: Path) -> None:
    groups = range(0, 64)
    a, b, c = _keys_in(groups, 3)
    full = _block(tmp_path, "full.kst", {"s": {a: 1, b: 2}}, groups)
    delta = _block(tmp_path, "d1.kst", {"s": {a: DELETED, c: 3}, "t": {b: 9}}, groups, full=False)
    fs = storage_fs(str(tmp_path))
    assert merge_chain(fs, [full, delta], groups, ASSIGNER) == {"s": {b: 2, c: 3}, "t": {b: 9}}


def test_split_key_groups_groups_entries_by_their_key_group() -> None:
    keys = [f"x{i}" for i in range(100)]
    state = {"s": {k: i for i, k in enumerate(keys)}, "n": {(k, 1): 0 for k in keys[:10]}}
    groups = split_key_groups(state, ASSIGNER, ["n"])
    for kg, segment in groups.items():
        assert all(key_group_for_key(k, MAX_P) == kg for k in segment.get("s", {}))
        assert all(key_group_for_key(k, MAX_P) == kg for k, _ in segment.get("n", {}))
    assert sum(len(s.get("s", {})) for s in groups.values()) == 100


def _old_format_file(tmp_path: Path, groups: dict[int, dict]) -> HeapStateFile:
    """A file as heap snapshots wrote them before blocks: one segment per key group."""
    path = tmp_path / "old.kst"
    spans: dict[int, tuple[int, int]] = {}
    data = b""
    for kg in sorted(groups):
        payload = pickle.dumps(groups[kg], protocol=5)
        segment = struct.pack(">4sII", b"ESKG", kg, zlib.crc32(payload)) + payload
        spans[kg] = (len(data), len(segment))
        data += segment
    path.write_bytes(data)
    return HeapStateFile(str(path), True, spans, len(data), shared=False)


def test_files_with_one_segment_per_key_group_still_restore(tmp_path: Path) -> None:
    keys = _keys_in(range(0, 128), 100)
    groups: dict[int, dict] = {}
    for i, k in enumerate(keys):
        groups.setdefault(key_group_for_key(k, MAX_P), {}).setdefault("_sum", {})[k] = (k, i)
    file = _old_format_file(tmp_path, groups)
    h = Harness("heap", tmp_path)
    h.config = HeapStateBackend()
    backend = h.backend(parallelism=2, subtask=1)  # key groups 64..127
    handle = HeapSnapshotHandle(range(0, 128), (file,), {"_sum": "value"})
    backend.restore([handle.restricted_to(range(64, 128))], checkpoint_id=1, owned=False)
    table = backend.value_table(ValueStateDescriptor("_sum"))
    expected = {k: (k, i) for i, k in enumerate(keys) if key_group_for_key(k, MAX_P) >= 64}
    assert dict(table.items()) == expected


def test_a_corrupt_or_truncated_block_is_reported_with_its_file(tmp_path: Path) -> None:
    groups = range(0, 64)
    file = _block(tmp_path, "a.kst", {"s": {k: 1 for k in _keys_in(groups, 50)}}, groups)
    fs = storage_fs(str(tmp_path))
    raw = bytearray(Path(file.path).read_bytes())
    raw[-3] ^= 0xFF
    Path(file.path).write_bytes(bytes(raw))
    with pytest.raises(
        CorruptStateError, match=r"a\.kst, key group 0 at offset 0: checksum mismatch"
    ):
        merge_chain(fs, [file], groups, ASSIGNER)
    Path(file.path).write_bytes(bytes(raw[:-10]))
    with pytest.raises(CorruptStateError, match="file truncated"):
        merge_chain(fs, [file], groups, ASSIGNER)


def test_a_block_is_pickled_in_chunks_and_reads_back_whole(tmp_path: Path) -> None:
    groups = range(0, 64)
    keys = _keys_in(groups, CHUNK_ENTRIES + 10)
    state = {
        "sums": {k: (k, i) for i, k in enumerate(keys)},
        "empty": {},
        "one": {keys[0]: DELETED},
    }
    fs = storage_fs(str(tmp_path))
    path = str(tmp_path / "c.kst")
    spans, size = write_encoded(fs, path, encode_block(state), groups)
    raw = Path(path).read_bytes()
    assert raw[:4] == b"ESKC"
    stream = io.BytesIO(raw[16:])  # after the header
    pickles = []
    while stream.tell() < len(raw) - 16:
        pickles.append(pickle.load(stream))
    assert [(name, len(keys), len(values)) for name, keys, values in pickles] == [
        ("sums", CHUNK_ENTRIES, CHUNK_ENTRIES),
        ("sums", 10, 10),
        ("empty", 0, 0),
        ("one", 1, 1),
    ]
    file = HeapStateFile(path, False, spans, size, shared=False)
    assert merge_chain(fs, [file], groups, ASSIGNER) == {
        "sums": state["sums"],
        "empty": {},
        "one": {},
    }


def test_blocks_of_one_pickle_written_before_chunks_still_restore(tmp_path: Path) -> None:
    groups = range(0, 64)
    state = {"sums": {k: (k, i) for i, k in enumerate(_keys_in(groups, 100))}}
    payload = pickle.dumps(state, protocol=5)
    header = struct.pack(">4sIII", b"ESKB", groups.start, len(groups), zlib.crc32(payload))
    path = tmp_path / "old.kst"
    path.write_bytes(header + payload)
    size = len(header) + len(payload)
    file = HeapStateFile(str(path), True, dict.fromkeys(groups, (0, size)), size, shared=False)
    assert merge_chain(storage_fs(str(tmp_path)), [file], groups, ASSIGNER) == state


def test_chunks_are_pickled_without_the_memo_and_values_come_back_equal(tmp_path: Path) -> None:
    groups = range(0, 64)
    keys = _keys_in(groups, 3)
    shared = ("same", 1)
    state = {"pairs": {k: shared for k in keys}}
    file = _block(tmp_path, "m.kst", state, groups)
    raw = Path(file.path).read_bytes()
    # Without the memo a repeated object is written out each time (no BINPUT/MEMOIZE).
    assert raw.count(b"same") == len(keys)
    restored = merge_chain(storage_fs(str(tmp_path)), [file], groups, ASSIGNER)
    assert restored == state


def test_values_the_memo_less_pickler_refuses_still_round_trip(tmp_path: Path) -> None:
    groups = range(0, 64)
    a, b = _keys_in(groups, 2)
    cyclic: list = ["loop"]
    cyclic.append(cyclic)
    offset = 3
    state = {"odd": {a: cyclic, b: lambda x: x + offset}}  # a cycle; a lambda (cloudpickle)
    restored = merge_chain(
        storage_fs(str(tmp_path)), [_block(tmp_path, "o.kst", state, groups)], groups, ASSIGNER
    )
    back = restored["odd"][a]
    assert back[0] == "loop" and back[1] is back
    assert restored["odd"][b](4) == 7
