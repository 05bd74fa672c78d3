"""Restoring a task's channel state: what was in flight when an unaligned checkpoint
was taken goes through again, before anything new.

The order is the one that keeps every channel's records in order: first the task's
*output* frames (its barrier overtook them, so the next task has not seen them), then its
*input* frames (records it had received and not processed), then new input. At the same
parallelism every frame goes back to its channel; at another one, output frames go
through the edge's partitioner again and input frames of a hash edge keep only the
records of this subtask's key groups (:class:`~epochstream.state.channel_state.ChannelRestore`).

Example::

    replay = ChannelReplay(fs_of, writers_by_edge, deliver, key_groups=range(0, 64),
                           max_parallelism=128, input_positions={"src[] -> sum #0": 0})
    replay.run(deployment.channel_state)
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyarrow import RecordBatch

from epochstream.core.arrow import KG
from epochstream.core.filesystems import StorageFS
from epochstream.core.storage_faults import StorageFault, classify
from epochstream.exceptions import CorruptStateError, StorageUnavailableError
from epochstream.runtime.batches import RowBatch
from epochstream.runtime.frames import decode_frame
from epochstream.runtime.outputs import RecordWriter
from epochstream.state.channel_state import (
    INPUT,
    OUTPUT,
    ChannelRestore,
    ChannelStateHandle,
    read_frames,
)
from epochstream.state.keygroups import KeyGroupAssigner

__all__ = ["ChannelReplay"]

#: Takes one replayed input batch: (input position, batch).
Deliver = Callable[[int, Any], None]


class ChannelReplay:
    """Sends a restoring task's output frames again and feeds it its input frames."""

    def __init__(
        self,
        fs_of: Callable[[str], StorageFS],
        writers: dict[str, RecordWriter],
        deliver: Deliver,
        *,
        key_groups: range,
        max_parallelism: int,
        input_positions: dict[str, int],
    ) -> None:
        self._fs_of = fs_of
        self._writers = writers
        self._deliver = deliver
        self._key_groups = key_groups
        self._assigner = KeyGroupAssigner.shared(max_parallelism)
        self._positions = input_positions
        self._files: dict[str, bytes] = {}

    def run(self, restores: list[ChannelRestore]) -> None:
        """Replay ``restores``: every output first, then every input."""
        for restore in restores:
            if restore.entry.direction == OUTPUT:
                self._send(restore)
        for writer in self._writers.values():
            writer.flush()
        for restore in restores:
            if restore.entry.direction == INPUT:
                self._feed(restore)
        self._files.clear()

    def _items(self, restore: ChannelRestore) -> list[Any]:
        handle = restore.handle
        data = self._files.get(handle.path)
        if data is None:
            data = self._files[handle.path] = self._read(handle)
        frames = read_frames(self._fs_of(handle.path), handle, restore.entry, data)
        return [decode_frame(frame, _unpickler(handle)) for frame in frames]

    def _read(self, handle: ChannelStateHandle) -> bytes:
        """The file's bytes; an outage or a missing file raised as the restore's typed
        errors (wait for the storage; fall back to an older checkpoint)."""
        try:
            return self._fs_of(handle.path).read_bytes(handle.path)
        except Exception as exc:
            fault = classify(exc)
            if fault is StorageFault.TRANSIENT:
                raise StorageUnavailableError(
                    f"channel state {handle.path} cannot be read now: {exc!r}", path=handle.path
                ) from exc
            if fault is StorageFault.CORRUPT:
                raise CorruptStateError(
                    f"channel state {handle.path} cannot be read: {exc!r}", path=handle.path
                ) from exc
            raise

    def _send(self, restore: ChannelRestore) -> None:
        writer = self._writers.get(restore.entry.edge)
        if writer is None:
            raise CorruptStateError(
                f"channel state {restore.handle.path} holds output of edge "
                f"{restore.entry.edge}, which this task does not write",
                path=restore.handle.path,
            )
        for item in self._items(restore):
            if not restore.reroute:
                writer.channels[restore.entry.channel].send(item)
            elif type(item) is RecordBatch:
                writer.write(item)
            else:
                writer.write(item.records, item.timestamps)

    def _feed(self, restore: ChannelRestore) -> None:
        position = self._positions.get(restore.entry.edge)
        if position is None:
            raise CorruptStateError(
                f"channel state {restore.handle.path} holds input of edge "
                f"{restore.entry.edge}, which this task does not read",
                path=restore.handle.path,
            )
        for item in self._items(restore):
            if restore.reroute:
                item = self._mine(item)
                if not len(item):
                    continue
            self._deliver(position, item)

    def _mine(self, item: Any) -> Any:
        """The records of ``item`` in this subtask's key groups (a hash edge's batch)."""
        groups = self._key_groups
        if type(item) is RecordBatch:
            kg = item.column(KG)
            keep = pc.and_(
                pc.greater_equal(kg, pa.scalar(groups.start, kg.type)),
                pc.less(kg, pa.scalar(groups.stop, kg.type)),
            )
            return item.filter(keep)
        key_group = self._assigner.key_group
        keys = item.keys
        picked = [i for i, key in enumerate(keys) if key_group(key) in groups]
        stamps = item.timestamps
        return RowBatch(
            [item.records[i] for i in picked],
            None if stamps is None else [stamps[i] for i in picked],
            [keys[i] for i in picked],
        )


def _unpickler(handle: ChannelStateHandle) -> Callable[[bytes], Any]:
    def unpickle(payload: bytes) -> Any:
        try:
            return pickle.loads(payload)
        except Exception as exc:  # a damaged frame, or a class the job no longer has
            raise CorruptStateError(
                f"channel state {handle.path}: a frame of {len(payload)} bytes does not "
                f"unpickle: {type(exc).__name__}: {exc}",
                path=handle.path,
            ) from exc

    return unpickle
