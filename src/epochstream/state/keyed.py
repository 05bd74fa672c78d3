"""The heap keyed state backend: state in Python dicts, snapshotted per key group.

Each state name has one flat dict ``key -> value``; the backend's current key (set by
the task before each record) selects the entry that state objects read and write.
A snapshot has two parts, as in Flink: :meth:`HeapKeyedStateBackend.snapshot` is the
synchronous part (a copy of each dict, taken at the barrier on the task thread) and
:meth:`KeyedSnapshot.write` the asynchronous part (grouping by key group and writing
the file, on a background thread).

File format: one segment per key group, in key-group order. A segment is a 12-byte
header (magic ``b"ESKG"``, key group, CRC-32 of the payload; big-endian) followed by
the payload, a pickle of ``{state_name: {key: value}}``. The
:class:`~epochstream.state.handles.KeyedStateHandle` records each segment's offset and
length (header included), so a restoring subtask reads only its own key groups.

Example::

    backend = HeapKeyedStateBackend(max_parallelism=128, key_group_range=range(0, 128))
    count = backend.get_state(ValueStateDescriptor("count", default=0))
    backend.set_current_key("user-7")
    count.update(count.value() + 1)
    handle = backend.snapshot().write("/ckpt/chk-1", "op-1-0.kst")
"""

from __future__ import annotations

import os
import pickle
import struct
import zlib
from collections.abc import Iterable
from typing import Any

import cloudpickle

from epochstream._fs import create_private, fsync_directory, makedirs_private
from epochstream.exceptions import StateError
from epochstream.state.descriptors import StateDescriptor
from epochstream.state.handles import KeyedStateHandle
from epochstream.state.keygroups import KeyGroupAssigner, validate_max_parallelism
from epochstream.state.states import (
    _NO_KEY,
    _STATE_CLASSES,
    AggregatingState,
    ListState,
    MapState,
    ReducingState,
    ValueState,
    _copy_table,
    _KeyContext,
    _KeyedState,
    copy_for_snapshot,
)

__all__ = [
    "AggregatingState",
    "HeapKeyedStateBackend",
    "KeyedSnapshot",
    "ListState",
    "MapState",
    "ReducingState",
    "ValueState",
    "copy_for_snapshot",
]

_SEGMENT_MAGIC = b"ESKG"
_SEGMENT_HEADER = struct.Struct(">4sII")


# Values of these types cannot change in place, so a snapshot may share them.
class KeyedSnapshot:
    """The synchronous part of a keyed snapshot; :meth:`write` is the asynchronous part.

    Holds private copies of the tables, so the task may keep changing state while
    another thread writes this snapshot.

    Example::

        snap = backend.snapshot()          # on the task thread, at the barrier
        handle = snap.write(chk_dir, "op-1-0.kst")   # on the snapshot thread
    """

    def __init__(
        self,
        tables: dict[str, dict[Any, Any]],
        *,
        assigner: KeyGroupAssigner,
        key_group_range: range,
    ) -> None:
        self.tables = tables
        self.assigner = assigner
        self.key_group_range = key_group_range

    @property
    def entry_count(self) -> int:
        """Number of ``(state, key)`` entries."""
        return sum(len(table) for table in self.tables.values())

    @property
    def is_empty(self) -> bool:
        """Whether there is nothing to write."""
        return not any(self.tables.values())

    def _group_by_key_group(self) -> dict[int, dict[str, dict[Any, Any]]]:
        # Shares the task thread's assigner: its cache is a plain dict, safe to share.
        key_group = self.assigner.key_group
        owned = self.key_group_range
        groups: dict[int, dict[str, dict[Any, Any]]] = {}
        for name, table in self.tables.items():
            for key, value in table.items():
                kg = key_group(key)
                if kg not in owned:
                    raise StateError(
                        f"state {name!r}: key {key!r:.80} is in key group {kg}, outside this "
                        f"backend's range {owned.start}..{owned.stop - 1}; the key was set "
                        "on the wrong subtask"
                    )
                per_state = groups.get(kg)
                if per_state is None:
                    per_state = groups[kg] = {}
                entries = per_state.get(name)
                if entries is None:
                    entries = per_state[name] = {}
                entries[key] = value
        return groups

    def write(self, directory: str, file_name: str) -> KeyedStateHandle | None:
        """Write one segment per key group to ``directory/file_name``, fsync, and describe it.

        Returns ``None`` (and writes no file) when the snapshot is empty. The handle's
        ``path`` is ``file_name``, relative to ``directory`` (the checkpoint directory).
        """
        if self.is_empty:
            return None
        groups = self._group_by_key_group()
        path = os.path.join(directory, file_name)
        offsets: dict[int, tuple[int, int]] = {}
        position = 0
        try:
            makedirs_private(directory)
            with create_private(path) as out:
                for kg in sorted(groups):
                    payload = cloudpickle.dumps(groups[kg], protocol=pickle.HIGHEST_PROTOCOL)
                    header = _SEGMENT_HEADER.pack(_SEGMENT_MAGIC, kg, zlib.crc32(payload))
                    out.write(header)
                    out.write(payload)
                    length = len(header) + len(payload)
                    offsets[kg] = (position, length)
                    position += length
                out.flush()
                os.fsync(out.fileno())
            fsync_directory(directory)
        except OSError as err:
            raise StateError(f"cannot write keyed state file {path}: {err}") from err
        return KeyedStateHandle(path=file_name, key_groups=offsets, size=position)


def _read_segment(path: str, stream: Any, kg: int, offset: int, length: int) -> Any:
    where = f"keyed state file {path}, key group {kg} at offset {offset}"
    stream.seek(offset)
    data = stream.read(length)
    if len(data) != length or length < _SEGMENT_HEADER.size:
        raise StateError(f"{where}: expected {length} bytes, found {len(data)} (file truncated?)")
    magic, stored_kg, crc = _SEGMENT_HEADER.unpack_from(data)
    payload = memoryview(data)[_SEGMENT_HEADER.size :]
    if magic != _SEGMENT_MAGIC or stored_kg != kg:
        raise StateError(f"{where}: bad segment header (magic {magic!r}, key group {stored_kg})")
    if zlib.crc32(payload) != crc:
        raise StateError(f"{where}: checksum mismatch (file corrupt)")
    try:
        return pickle.loads(payload)
    except Exception as err:  # any unpickling failure means unusable state
        raise StateError(f"{where}: cannot unpickle state: {err!r}") from err


class HeapKeyedStateBackend:
    """Keyed state for one operator in one subtask, kept in dicts on the heap.

    Owns the key groups in ``key_group_range``. ``get_state`` returns the same state
    object for the same name (bound to the first descriptor given); asking for a name
    with a different kind of descriptor raises :class:`StateError`.

    Example::

        backend = HeapKeyedStateBackend(max_parallelism=128, key_group_range=range(0, 64))
        seen = backend.get_state(ListStateDescriptor("seen"))
        backend.set_current_key("k")
        seen.add(1)
    """

    def __init__(
        self,
        *,
        max_parallelism: int,
        key_group_range: range,
        assigner: KeyGroupAssigner | None = None,
    ) -> None:
        validate_max_parallelism(max_parallelism)
        if (
            key_group_range.step != 1
            or key_group_range.start < 0
            or key_group_range.stop > max_parallelism
        ):
            raise StateError(
                f"key group range {key_group_range} does not fit max_parallelism {max_parallelism}"
            )
        if assigner is None:
            assigner = KeyGroupAssigner(max_parallelism)
        elif assigner.max_parallelism != max_parallelism:
            raise StateError(
                f"assigner max_parallelism {assigner.max_parallelism} != backend "
                f"max_parallelism {max_parallelism}"
            )
        self.max_parallelism = max_parallelism
        self.key_group_range = key_group_range
        self.assigner = assigner
        self._ctx = _KeyContext()
        self._tables: dict[str, dict[Any, Any]] = {}
        self._states: dict[str, _KeyedState] = {}

    def set_current_key(self, key: Any) -> None:
        """Select the key that state objects read and write (called per record)."""
        self._ctx.key = key

    @property
    def current_key(self) -> Any:
        """The current key; raises :class:`StateError` when none was set."""
        key = self._ctx.key
        if key is _NO_KEY:
            raise StateError("no current key is set on this keyed state backend")
        return key

    def get_state(self, descriptor: StateDescriptor) -> Any:
        """The state object for ``descriptor`` (ValueState, ListState, MapState, ...)."""
        existing = self._states.get(descriptor.name)
        if existing is not None:
            if type(existing.descriptor) is not type(descriptor):
                raise StateError(
                    f"state {descriptor.name!r} is registered as "
                    f"{type(existing.descriptor).__name__}, cannot get it as "
                    f"{type(descriptor).__name__}"
                )
            return existing
        state_class = _STATE_CLASSES.get(type(descriptor))
        if state_class is None:
            raise StateError(f"unsupported state descriptor {type(descriptor).__name__}")
        state = state_class(descriptor, self.table(descriptor.name), self._ctx)
        self._states[descriptor.name] = state
        return state

    def table(self, name: str) -> dict[Any, Any]:
        """The raw ``key -> value`` dict of state ``name`` (created if absent).

        For operator fast paths (e.g. a keyed reduce). Values follow the layout of the
        state kind using the name; never store empty lists/dicts for list/map state.
        """
        found = self._tables.get(name)
        if found is None:
            found = self._tables[name] = {}
        return found

    def keys(self, name: str) -> list[Any]:
        """The keys that have a value in state ``name`` (a new list)."""
        return list(self._tables.get(name, ()))

    def snapshot(self) -> KeyedSnapshot:
        """The synchronous snapshot: private copies of every non-empty table."""
        memo: dict[int, Any] = {}
        tables = {name: _copy_table(t, memo) for name, t in self._tables.items() if t}
        return KeyedSnapshot(tables, assigner=self.assigner, key_group_range=self.key_group_range)

    def restore(self, handles: Iterable[KeyedStateHandle]) -> None:
        """Load this backend's key groups from ``handles`` (absolute paths) into its tables."""
        owned = self.key_group_range
        for handle in handles:
            if not os.path.isabs(handle.path):
                raise StateError(
                    f"keyed state handle path {handle.path!r} is not absolute; resolve it "
                    "against the checkpoint directory first"
                )
            wanted = sorted((kg, span) for kg, span in handle.key_groups.items() if kg in owned)
            if not wanted:
                continue
            try:
                with open(handle.path, "rb") as stream:
                    for kg, (offset, length) in wanted:
                        segment = _read_segment(handle.path, stream, kg, offset, length)
                        for name, entries in segment.items():
                            self.table(name).update(entries)
            except OSError as err:
                raise StateError(f"cannot read keyed state file {handle.path}: {err}") from err
