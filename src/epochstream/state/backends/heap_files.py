"""The heap backend's snapshot files: one CRC-checked segment per key group.

A file is a sequence of segments in key-group order. A segment is a 12-byte header
(magic ``b"ESKG"``, key group, CRC-32 of the payload; big-endian) and a pickle of
``{state_name: {key: value}}``. In a *delta* file a value may be :data:`DELETED`
(the key was removed since the file the delta builds on). A snapshot is a chain of
files: one full file and the deltas written after it, applied in order.

Reading checks the magic, the key group and the CRC of every segment; a mismatch is a
:class:`StateError` naming the file, key group and offset.

Example::

    spans, size = write_segments(fs, path, {3: {"count": {"a": 1}}})
    read_segment(fs, path, 3, *spans[3]) == {"count": {"a": 1}}
"""

from __future__ import annotations

import pickle
import struct
import zlib
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, BinaryIO

from epochstream.exceptions import CorruptStateError, StateError
from epochstream.state.handles import HeapStateFile
from epochstream.state.serializers import pickle_dumps

if TYPE_CHECKING:
    from epochstream.checkpoint.filesystems import StorageFS

__all__ = ["DELETED", "KeyGroupState", "merge_chain", "read_segment", "write_segments"]

_MAGIC = b"ESKG"
_HEADER = struct.Struct(">4sII")

#: ``{state_name: {key: value}}`` of one key group.
KeyGroupState = dict[str, dict[Any, Any]]


class _Deleted:
    """Marks a key removed since the previous file of the chain (delta files only)."""

    _instance: _Deleted | None = None

    def __new__(cls) -> _Deleted:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __reduce__(self) -> str:
        return "DELETED"

    def __repr__(self) -> str:
        return "DELETED"


DELETED = _Deleted()


def write_segments(
    fs: StorageFS, path: str, groups: dict[int, KeyGroupState]
) -> tuple[dict[int, tuple[int, int]], int]:
    """Write one segment per key group (ascending); ``({kg: (offset, length)}, size)``."""
    spans: dict[int, tuple[int, int]] = {}
    position = 0
    try:
        with fs.open_write(path) as out:
            for kg in sorted(groups):
                payload = pickle_dumps(groups[kg])
                header = _HEADER.pack(_MAGIC, kg, zlib.crc32(payload))
                out.write(header)
                out.write(payload)
                length = len(header) + len(payload)
                spans[kg] = (position, length)
                position += length
    except OSError as err:
        raise StateError(f"cannot write keyed state file {path}: {err}") from err
    return spans, position


def _check(path: str, kg: int, offset: int, length: int, data: bytes) -> KeyGroupState:
    where = f"keyed state file {path}, key group {kg} at offset {offset}"
    if len(data) != length or length < _HEADER.size:
        raise CorruptStateError(
            f"{where}: expected {length} bytes, found {len(data)} (file truncated?)", path=path
        )
    magic, stored_kg, crc = _HEADER.unpack_from(data)
    payload = memoryview(data)[_HEADER.size :]
    if magic != _MAGIC or stored_kg != kg:
        raise CorruptStateError(
            f"{where}: bad segment header (magic {magic!r}, key group {stored_kg})", path=path
        )
    if zlib.crc32(payload) != crc:
        raise CorruptStateError(f"{where}: checksum mismatch (file corrupt)", path=path)
    try:
        loaded: KeyGroupState = pickle.loads(payload)
    except Exception as err:  # any unpickling failure means unusable state
        raise StateError(f"{where}: cannot unpickle state: {err!r}") from err
    return loaded


def read_segment(fs: StorageFS, path: str, kg: int, offset: int, length: int) -> KeyGroupState:
    """Read and verify one segment."""
    try:
        data = fs.read_range(path, offset, length)
    except OSError as err:
        raise CorruptStateError(f"cannot read keyed state file {path}: {err}", path=path) from err
    return _check(path, kg, offset, length, data)


def read_file_segments(
    fs: StorageFS, file: HeapStateFile, key_groups: Iterable[int]
) -> Iterable[tuple[int, KeyGroupState]]:
    """The verified segments of ``file`` for ``key_groups`` (those it has), in order."""
    wanted = sorted((kg, file.segments[kg]) for kg in key_groups if kg in file.segments)
    if not wanted:
        return
    try:
        stream: BinaryIO = fs.open_read(file.path)
    except OSError as err:
        raise CorruptStateError(
            f"cannot read keyed state file {file.path}: {err}", path=file.path
        ) from err
    with stream:
        for kg, (offset, length) in wanted:
            stream.seek(offset)
            yield kg, _check(file.path, kg, offset, length, stream.read(length))


def apply_segment(target: KeyGroupState, segment: KeyGroupState) -> None:
    """Apply a full or delta segment onto ``target`` (``DELETED`` removes a key)."""
    for name, entries in segment.items():
        table = target.get(name)
        if table is None:
            table = target[name] = {}
        for key, value in entries.items():
            if value is DELETED:
                table.pop(key, None)
            else:
                table[key] = value


def merge_chain(
    fs: StorageFS, chain: Iterable[HeapStateFile], key_groups: Iterable[int]
) -> dict[int, KeyGroupState]:
    """The state of ``key_groups`` after applying every file of ``chain`` in order."""
    merged: dict[int, KeyGroupState] = {}
    groups = list(key_groups)
    for file in chain:
        for kg, segment in read_file_segments(fs, file, groups):
            apply_segment(merged.setdefault(kg, {}), segment)
    return merged
