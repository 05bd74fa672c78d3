"""The heap backend's snapshot files: CRC-checked segments of pickled state.

A file holds the state of one subtask's key groups as pickles of its entries, each
segment behind a header with a CRC-32 of the payload (big-endian); read back, a segment
is ``{state_name: {key: value}}``:

- a *chunked block* (written since 2026-11-23): one segment for a range of key groups,
  header ``b"ESKC"``, first key group, number of key groups, CRC (16 bytes), then a
  sequence of pickles, each ``(state_name, [key, ...], [value, ...])`` for at most
  :data:`CHUNK_ENTRIES` entries (one with empty lists for a state without entries).
  Every key group of the range maps to the block's span in
  :attr:`HeapStateFile.segments`. Chunks, not one ``pickle.dumps`` of everything: a C
  call holds the GIL until it returns, and pickling 50,000 entries at once stalled the
  task thread for 8-20 ms at every checkpoint. Between chunks CPython hands the GIL to
  a waiting thread after the switch interval, which the snapshot thread lowers to 1 ms
  while it works (see :mod:`epochstream.runtime.snapshots`), so the task thread waits
  about that long. Key and value lists, because they cost less than a dict per chunk,
  taken from the dict's iterators a chunk at a time (:func:`_chunked`), and pickled
  without the memo (:func:`_pickle_chunk`). No split by key group on the snapshot
  thread (splitting 50,000 entries into key groups one by one in Python cost 1.7
  times the whole asynchronous part); a reader that wants only some of the block's
  key groups (a restore at another parallelism) keeps the entries of its key groups,
  hashing their keys;
- a *block* (written before): the same header with ``b"ESKB"`` and one pickle of all
  entries. Still read;
- a *key-group segment* (older still): header ``b"ESKG"``, key group, CRC (12 bytes), one
  per key group in key-group order. Still read.

In a *delta* file a value may be :data:`DELETED` (the key was removed since the file the
delta builds on). A snapshot is a chain of files: one full file and the deltas written
after it, applied in order.

Reading checks the magic, the key groups and the CRC of every segment; a mismatch is a
:class:`StateError` naming the file, key group and offset.

Example::

    spans, size = write_encoded(fs, path, encode_block({"count": {"a": 1}}), range(0, 64))
    merge_chain(fs, [HeapStateFile(path, True, spans, size)], range(0, 64), assigner)
    # {"count": {"a": 1}}
"""

from __future__ import annotations

import io
import pickle
import struct
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import islice
from typing import TYPE_CHECKING, Any

from epochstream.core.serializers import pickle_dumps
from epochstream.core.storage_faults import READ_RETRY, read_error, unavailable_or
from epochstream.exceptions import CorruptStateError, StateError
from epochstream.state.handles import HeapStateFile
from epochstream.state.keygroups import KeyGroupAssigner

if TYPE_CHECKING:
    from epochstream.core.filesystems import StorageFS

__all__ = [
    "CHUNK_ENTRIES",
    "DELETED",
    "EncodedBlock",
    "KeyGroupState",
    "apply_segment",
    "encode_block",
    "key_groups_of",
    "merge_chain",
    "split_key_groups",
    "write_encoded",
]

_MAGIC = b"ESKG"
_HEADER = struct.Struct(">4sII")
_BLOCK_MAGIC = b"ESKB"
_CHUNKED_MAGIC = b"ESKC"
_BLOCK_HEADER = struct.Struct(">4sIII")

#: Entries per pickled chunk: pickling 2,048 (key, tuple) entries takes about 0.3 ms,
#: so the snapshot thread can hand the GIL over at least that often.
CHUNK_ENTRIES = 2048

#: ``{state_name: {key: value}}`` of one key group, or of several (a block).
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


@dataclass(frozen=True)
class EncodedBlock:
    """A chunked block's payload before it is written: its pickled chunks, in order,
    and their CRC-32 (see the module docstring).

    Example: ``write_encoded(fs, path, encode_block({"count": {"a": 1}}), range(0, 64))``
    """

    chunks: list[bytes]
    crc: int


def encode_block(state: KeyGroupState) -> EncodedBlock:
    """The chunked block of ``state``: pickled a chunk at a time, without the memo."""
    chunks: list[bytes] = []
    crc = 0
    for name, entries in state.items():
        for keys, values in _chunked(entries):
            pickled = _pickle_chunk((name, keys, values))
            crc = zlib.crc32(pickled, crc)
            chunks.append(pickled)
    return EncodedBlock(chunks, crc)


def write_encoded(
    fs: StorageFS, path: str, block: EncodedBlock, key_groups: range
) -> tuple[dict[int, tuple[int, int]], int]:
    """Write ``block`` (entries of ``key_groups`` only) to ``path``;
    ``({kg: (offset, length)}, size)`` with every key group mapped to the block."""
    header = _BLOCK_HEADER.pack(_CHUNKED_MAGIC, key_groups.start, len(key_groups), block.crc)
    try:
        with fs.open_write(path) as out:
            out.write(header)
            for pickled in block.chunks:
                out.write(pickled)
    except OSError as err:
        # Storage that cannot be reached fails this checkpoint as unavailable, not as a
        # state error: the job master then reports the outage.
        raise unavailable_or(
            err, what="write keyed state file", path=path, other=StateError
        ) from err
    size = len(header) + sum(map(len, block.chunks))
    return dict.fromkeys(key_groups, (0, size)), size


def _chunked(entries: dict[Any, Any]) -> Iterator[tuple[list[Any], list[Any]]]:
    """``entries`` as lists of at most :data:`CHUNK_ENTRIES` keys and their values, in
    order (one pair of empty lists for no entries). Taken piece by piece from the dict's
    iterators: two lists of every key and value would be two more containers of the
    whole state for the collector to walk while they live.

    Example: ``list(_chunked({"a": 1}))`` is ``[(["a"], [1])]``
    """
    keys, values = iter(entries), iter(entries.values())
    for _ in range(0, max(len(entries), 1), CHUNK_ENTRIES):
        yield list(islice(keys, CHUNK_ENTRIES)), list(islice(values, CHUNK_ENTRIES))


def _pickle_chunk(chunk: tuple[str, list[Any], list[Any]]) -> bytes:
    """A chunk's pickle without the memo: about half the CPU on tuples of atomics,
    which the memo records one by one. The backend stores and hands out copies, so no
    two entries are meant to share an object: read back, they are equal, not shared.
    A value the memo-less pickler refuses (a cycle, a class plain pickle cannot reach)
    goes through :func:`pickle_dumps`, which raises what is really wrong."""
    out = io.BytesIO()
    pickler = pickle.Pickler(out, protocol=5)
    pickler.fast = True
    try:
        pickler.dump(chunk)
    except Exception:  # pickled again with the memo (and cloudpickle) or refused there
        return pickle_dumps(chunk)
    return out.getvalue()


def key_groups_of(
    assigner: KeyGroupAssigner, entries: dict[Any, Any], *, namespaced: bool
) -> list[int]:
    """The key group of every entry of ``entries``, in order (cached keys at C speed)."""
    # Namespaced entries are (key, namespace) pairs: the key alone places them.
    return assigner.key_groups([k[0] for k in entries] if namespaced else entries)


def split_key_groups(
    state: KeyGroupState,
    assigner: KeyGroupAssigner,
    namespaced: Iterable[str] = (),
) -> dict[int, KeyGroupState]:
    """``state`` split by key group, ``{kg: {state_name: {key: value}}}`` (entry by entry:
    for savepoints and the state reader, not for checkpoints)."""
    ns = frozenset(namespaced)
    groups: dict[int, KeyGroupState] = {}
    for name, entries in state.items():
        kgs = key_groups_of(assigner, entries, namespaced=name in ns)
        for (key, value), kg in zip(entries.items(), kgs, strict=True):
            group = groups.get(kg)
            if group is None:
                group = groups[kg] = {}
            table = group.get(name)
            if table is None:
                table = group[name] = {}
            table[key] = value
    return groups


def _corrupt(where: str, path: str, what: str) -> CorruptStateError:
    return CorruptStateError(f"{where}: {what}", path=path)


def _payload(
    path: str, where: str, data: bytes, length: int, header: struct.Struct
) -> tuple[Any, ...]:
    if len(data) != length or length < header.size:
        raise _corrupt(where, path, f"expected {length} bytes, found {len(data)} (file truncated?)")
    return header.unpack_from(data)


def _load(
    path: str, where: str, data: bytes, offset: int, crc: int, *, chunked: bool = False
) -> KeyGroupState:
    payload = memoryview(data)[offset:]
    if zlib.crc32(payload) != crc:
        raise _corrupt(where, path, "checksum mismatch (file corrupt)")
    try:
        if not chunked:
            loaded: KeyGroupState = pickle.loads(payload)
            return loaded
        merged: KeyGroupState = {}
        stream = io.BytesIO(payload)
        while stream.tell() < len(payload):
            name, keys, values = pickle.Unpickler(stream).load()
            merged.setdefault(name, {}).update(zip(keys, values, strict=True))
        return merged
    except Exception as err:  # any unpickling failure means unusable state
        raise StateError(f"{where}: cannot unpickle state: {err!r}") from err


def _check(
    path: str, kgs: list[int], offset: int, length: int, data: bytes
) -> tuple[KeyGroupState, range]:
    """The state in the segment at ``offset`` and the key groups it holds, verified to
    hold ``kgs`` (the wanted key groups the file maps to this span)."""
    where = f"keyed state file {path}, key group {kgs[0]} at offset {offset}"
    magic = data[:4]
    if magic in (_CHUNKED_MAGIC, _BLOCK_MAGIC):
        _, first, count, crc = _payload(path, where, data, length, _BLOCK_HEADER)
        held = range(first, first + count)
        if kgs[0] < held.start or kgs[-1] >= held.stop:
            raise _corrupt(where, path, f"block of key groups {first}..{first + count - 1}")
        chunked = magic == _CHUNKED_MAGIC
        return _load(path, where, data, _BLOCK_HEADER.size, crc, chunked=chunked), held
    magic, stored_kg, crc = _payload(path, where, data, length, _HEADER)
    if magic != _MAGIC or stored_kg != kgs[0] or len(kgs) != 1:
        raise _corrupt(where, path, f"bad segment header (magic {magic!r}, key group {stored_kg})")
    return _load(path, where, data, _HEADER.size, crc), range(stored_kg, stored_kg + 1)


def _read_file(
    fs: StorageFS, file: HeapStateFile, key_groups: range
) -> Iterable[tuple[KeyGroupState, range]]:
    """The verified segments of ``file`` that hold any of ``key_groups``, in file order,
    each with the key groups it holds (more than wanted when a block is shared)."""
    spans: dict[tuple[int, int], list[int]] = {}
    for kg in sorted(kg for kg in file.segments if kg in key_groups):
        spans.setdefault(file.segments[kg], []).append(kg)
    if not spans:
        return
    wanted = sorted(spans.items())

    def read_spans() -> list[bytes]:
        with fs.open_read(file.path) as stream:
            blobs = []
            for (offset, length), _kgs in wanted:
                stream.seek(offset)
                blobs.append(stream.read(length))
            return blobs

    # Read whole before checking: an outage mid-file is retried from the start, and only
    # a file the store really lacks (or bytes that fail their checks) is corrupt.
    try:
        blobs = READ_RETRY.run(read_spans, what="read keyed state file", path=file.path)
    except OSError as err:
        raise read_error(err, what="read keyed state file", path=file.path) from err
    for ((offset, length), kgs), data in zip(wanted, blobs, strict=True):
        yield _check(file.path, kgs, offset, length, data)


def apply_segment(target: KeyGroupState, segment: KeyGroupState, *, full: bool = False) -> None:
    """Apply a full or delta segment onto ``target`` (``DELETED`` removes a key; a
    ``full`` segment has no deletions and is applied at C speed)."""
    for name, entries in segment.items():
        table = target.get(name)
        if table is None:
            table = target[name] = {}
        if full:
            table.update(entries)
            continue
        for key, value in entries.items():
            if value is DELETED:
                table.pop(key, None)
            else:
                table[key] = value


def _restrict(
    segment: KeyGroupState,
    assigner: KeyGroupAssigner,
    key_groups: range,
    namespaced: frozenset[str],
) -> KeyGroupState:
    """The entries of ``segment`` in ``key_groups`` (a block read for part of its range)."""
    kept: KeyGroupState = {}
    for name, entries in segment.items():
        kgs = key_groups_of(assigner, entries, namespaced=name in namespaced)
        kept[name] = {
            k: v for (k, v), kg in zip(entries.items(), kgs, strict=True) if kg in key_groups
        }
    return kept


def merge_chain(
    fs: StorageFS,
    chain: Iterable[HeapStateFile],
    key_groups: range,
    assigner: KeyGroupAssigner,
    namespaced: Iterable[str] = (),
) -> KeyGroupState:
    """The state of ``key_groups`` after applying every file of ``chain`` in order
    (``namespaced``: the names of namespaced states, whose keys are (key, namespace))."""
    ns = frozenset(namespaced)
    merged: KeyGroupState = {}
    for file in chain:
        for segment, held in _read_file(fs, file, key_groups):
            inside = key_groups.start <= held.start and held.stop <= key_groups.stop
            if not inside:
                segment = _restrict(segment, assigner, key_groups, ns)
            apply_segment(merged, segment, full=file.full)
    return merged
