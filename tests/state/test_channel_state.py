"""Channel state files: writing and reading frames, damage detection, and the handle's
metadata form."""

from __future__ import annotations

import os
import zlib
from typing import Any

import pytest

from epochstream.core.filesystems import storage_fs
from epochstream.exceptions import CheckpointError, CorruptStateError
from epochstream.state.channel_state import (
    INPUT,
    OUTPUT,
    ChannelFrames,
    ChannelStateEntry,
    ChannelStateHandle,
    read_frames,
    write_channel_state,
)

EDGE_IN = "src[main] -> sum #0"
EDGE_OUT = "sum[main] -> sink #0"


def _write(tmp_path, channels: list[ChannelFrames]) -> ChannelStateHandle | None:
    path = str(tmp_path / "chk-4" / "channels-sum-1")
    return write_channel_state(storage_fs(path), path, channels)


def _written(tmp_path) -> ChannelStateHandle:
    handle = _write(
        tmp_path,
        [
            ChannelFrames(INPUT, EDGE_IN, 0, [b"first", b"second frame"]),
            ChannelFrames(INPUT, EDGE_IN, 1, []),  # nothing in flight: no entry
            ChannelFrames(OUTPUT, EDGE_OUT, 2, [b"\x00" * 3]),
        ],
    )
    assert handle is not None
    return handle


def test_frames_round_trip(tmp_path) -> None:
    handle = _written(tmp_path)
    fs = storage_fs(handle.path)
    data = fs.read_bytes(handle.path)
    assert data == b"firstsecond frame\x00\x00\x00"
    assert handle.size == len(data)
    assert handle.crc == zlib.crc32(data)
    assert handle.entries == (
        ChannelStateEntry(INPUT, EDGE_IN, 0, ((0, 5), (5, 12))),
        ChannelStateEntry(OUTPUT, EDGE_OUT, 2, ((17, 3),)),
    )
    assert [entry.size for entry in handle.entries] == [17, 3]
    assert read_frames(fs, handle, handle.entries[0]) == [b"first", b"second frame"]
    assert read_frames(fs, handle, handle.entries[1]) == [b"\x00" * 3]
    assert read_frames(fs, handle, handle.entries[1], data) == [b"\x00" * 3], "bytes given"


@pytest.mark.parametrize(
    "channels",
    [[], [ChannelFrames(INPUT, EDGE_IN, 0, []), ChannelFrames(OUTPUT, EDGE_OUT, 0, [])]],
)
def test_nothing_in_flight_writes_no_file(tmp_path, channels: list[ChannelFrames]) -> None:
    assert _write(tmp_path, channels) is None
    assert not os.path.exists(tmp_path / "chk-4" / "channels-sum-1")


def _damage(path: str, change: Any) -> None:
    with open(path, "rb") as f:
        data = f.read()
    os.chmod(path, 0o600)
    with open(path, "wb") as f:
        f.write(change(data))


@pytest.mark.parametrize(
    ("change", "size"),
    [
        (lambda d: d[:-1], "19 bytes"),  # truncated
        (lambda d: d + b"!", "21 bytes"),  # grown
        (lambda d: b"F" + d[1:], "20 bytes"),  # same size, a flipped byte: only the CRC says
    ],
)
def test_damaged_file_is_a_corrupt_state_error_naming_it(tmp_path, change, size: str) -> None:
    handle = _written(tmp_path)
    _damage(handle.path, change)
    fs = storage_fs(handle.path)
    with pytest.raises(CorruptStateError, match="is damaged") as info:
        read_frames(fs, handle, handle.entries[0])
    assert info.value.path == handle.path
    assert handle.path in str(info.value) and size in str(info.value)
    assert "its checkpoint metadata says 20 bytes" in str(info.value)


# ---------------------------------------------------------------- metadata form

BASE = "/ck/job/chk-4"


def _relativize(path: str) -> str:
    return os.path.relpath(path, BASE)


def _resolve(path: str) -> str:
    return os.path.normpath(os.path.join(BASE, path))


def _handle() -> ChannelStateHandle:
    return ChannelStateHandle(
        path=f"{BASE}/channels-sum-1",
        size=20,
        entries=(
            ChannelStateEntry(INPUT, EDGE_IN, 0, ((0, 5), (5, 12))),
            ChannelStateEntry(OUTPUT, EDGE_OUT, 2, ((17, 3),)),
        ),
        crc=123456789,
    )


def test_json_round_trip() -> None:
    doc = _handle().to_json(_relativize)
    assert doc["path"] == "channels-sum-1", "relative to the _metadata directory"
    assert doc["entries"][0] == {
        "direction": INPUT,
        "edge": EDGE_IN,
        "channel": 0,
        "frames": [[0, 5], [5, 12]],
    }
    assert ChannelStateHandle.from_json(doc, _resolve, "here") == _handle()


def _set(path: tuple[Any, ...], value: Any) -> Any:
    def change(doc: dict[str, Any]) -> None:
        target: Any = doc
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return change


def _drop(path: tuple[Any, ...]) -> Any:
    def change(doc: dict[str, Any]) -> None:
        target: Any = doc
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]

    return change


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        (_drop(("crc",)), "'crc'"),
        (_drop(("entries", 0, "edge")), "'edge'"),
        (_set(("size",), "20"), "expected int, got '20'"),
        (_set(("crc",), True), "expected int, got True"),
        (_set(("path",), 7), "expected str, got 7"),
        (_set(("entries", 0, "channel"), 1.0), "expected int, got 1.0"),
        (_set(("entries", 0, "direction"), "sideways"), "got 'sideways'"),
        (_set(("entries", 1, "frames"), [[17]]), "ValueError"),
        (_set(("entries", 1, "frames"), [[17, "3"]]), "expected int, got '3'"),
        (_set(("entries",), None), "TypeError"),
    ],
)
def test_malformed_json_is_a_checkpoint_error_naming_the_place(change, fragment: str) -> None:
    doc = _handle().to_json(_relativize)
    change(doc)
    with pytest.raises(CheckpointError) as info:
        ChannelStateHandle.from_json(doc, _resolve, "/ck/job/chk-4/_metadata: sum[1].channel")
    message = str(info.value)
    assert message.startswith("/ck/job/chk-4/_metadata: sum[1].channel is malformed channel state")
    assert fragment in message
