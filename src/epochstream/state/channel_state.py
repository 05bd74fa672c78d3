"""Channel state: the in-flight records an unaligned checkpoint keeps, and where.

A task that takes an unaligned snapshot keeps, besides its operators' state, the frames
that were between tasks at that moment: on its inputs, the records queued before the
barrier and those that came on the other channels until their barrier did; on its
outputs, the frames its barrier overtook. They are written to one file per task and
checkpoint (``channels-<chain>-<subtask>`` in the checkpoint's directory), frames one
after the other, described by a :class:`ChannelStateHandle` whose entries say, per
channel, the edge (by :meth:`~epochstream.graph.jobgraph.JobGraph.edge_key`), the
channel and where its frames are. The handle travels in the checkpoint metadata with the
state of the chain's head operator.

Example::

    handle = write_channel_state(fs, "/ck/j/chk-4/channels-sum-0", [
        ChannelFrames(INPUT, "src[] -> sum #0", 1, [frame1, frame2]),
    ])
    read_frames(fs, handle, handle.entries[0])     # [frame1, frame2]
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from epochstream.core.filesystems import StorageFS
from epochstream.exceptions import CheckpointError, CorruptStateError

__all__ = [
    "INPUT",
    "OUTPUT",
    "ChannelFrames",
    "ChannelRestore",
    "ChannelStateEntry",
    "ChannelStateHandle",
    "read_frames",
    "write_channel_state",
]

#: Frames a task had received and not processed (replayed into the task on restore).
INPUT = "input"
#: Frames a task had produced and not sent (sent again on restore, before anything new).
OUTPUT = "output"


@dataclass(frozen=True)
class ChannelFrames:
    """The frames of one channel, to be written.

    ``channel``: for input, the upstream subtask; for output, the downstream subtask.

    Example: ``ChannelFrames(OUTPUT, "map[] -> sum #0", 2, [b"..."])``
    """

    direction: str
    edge: str
    channel: int
    frames: Sequence[bytes]


@dataclass(frozen=True)
class ChannelStateEntry:
    """Where one channel's frames are in a channel state file: (offset, length) each.

    Example: ``ChannelStateEntry(INPUT, "src[] -> sum #0", 1, ((0, 812), (812, 790)))``
    """

    direction: str
    edge: str
    channel: int
    frames: tuple[tuple[int, int], ...]

    @property
    def size(self) -> int:
        return sum(length for _, length in self.frames)


@dataclass(frozen=True)
class ChannelStateHandle:
    """One task's channel state file of one checkpoint.

    Example: ``ChannelStateHandle(path, size=1602, entries=(entry,))``
    """

    path: str
    size: int
    entries: tuple[ChannelStateEntry, ...]
    #: CRC-32 of the whole file.
    crc: int = 0

    def to_json(self, relativize: Any) -> dict[str, Any]:
        """The metadata form, ``path`` relative to the ``_metadata`` directory."""
        return {
            "path": relativize(self.path),
            "size": self.size,
            "crc": self.crc,
            "entries": [
                {
                    "direction": e.direction,
                    "edge": e.edge,
                    "channel": e.channel,
                    "frames": [list(f) for f in e.frames],
                }
                for e in self.entries
            ],
        }

    @classmethod
    def from_json(cls, doc: Any, resolve: Any, where: str) -> ChannelStateHandle:
        """Inverse of :meth:`to_json`; a malformed document raises :class:`CheckpointError`."""
        try:
            entries = tuple(
                ChannelStateEntry(
                    direction=_one_of(e["direction"], (INPUT, OUTPUT)),
                    edge=_typed(e["edge"], str),
                    channel=_typed(e["channel"], int),
                    frames=tuple(
                        (_typed(off, int), _typed(size, int)) for off, size in e["frames"]
                    ),
                )
                for e in doc["entries"]
            )
            return cls(
                path=resolve(_typed(doc["path"], str)),
                size=_typed(doc["size"], int),
                entries=entries,
                crc=_typed(doc["crc"], int),
            )
        except (KeyError, TypeError, ValueError) as err:
            raise CheckpointError(f"{where} is malformed channel state: {err!r}") from err


@dataclass(frozen=True)
class ChannelRestore:
    """One channel's frames for a restoring task.

    ``reroute``: the parallelism changed. Output frames then go through the edge's
    partitioner again (by key group on a hash edge, round robin otherwise) instead of to
    ``entry.channel``; input frames of a hash edge keep only the records of the
    restoring subtask's key groups.

    Example: ``ChannelRestore(handle, handle.entries[0], reroute=False)``
    """

    handle: ChannelStateHandle
    entry: ChannelStateEntry
    reroute: bool = False


def _typed(value: Any, kind: type) -> Any:
    if not isinstance(value, kind) or isinstance(value, bool):
        raise TypeError(f"expected {kind.__name__}, got {value!r}")
    return value


def _one_of(value: Any, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ValueError(f"expected one of {allowed}, got {value!r}")
    return str(value)


def write_channel_state(
    fs: StorageFS, path: str, channels: Sequence[ChannelFrames]
) -> ChannelStateHandle | None:
    """Write the frames of ``channels`` to ``path``; ``None`` (no file) when there are none."""
    entries: list[ChannelStateEntry] = []
    chunks: list[bytes] = []
    offset = 0
    for part in channels:
        if not part.frames:
            continue
        placed = []
        for frame in part.frames:
            placed.append((offset, len(frame)))
            chunks.append(frame)
            offset += len(frame)
        entries.append(ChannelStateEntry(part.direction, part.edge, part.channel, tuple(placed)))
    if not entries:
        return None
    data = b"".join(chunks)
    fs.write_bytes(path, data)
    return ChannelStateHandle(path=path, size=offset, entries=tuple(entries), crc=zlib.crc32(data))


def read_frames(
    fs: StorageFS, handle: ChannelStateHandle, entry: ChannelStateEntry, data: bytes | None = None
) -> list[bytes]:
    """The frames of ``entry`` (``data``: the file's bytes, when already read).

    A file shorter than its handle says raises :class:`CorruptStateError` naming it.
    """
    if data is None:
        data = fs.read_bytes(handle.path)
    if len(data) != handle.size or zlib.crc32(data) != handle.crc:
        raise CorruptStateError(
            f"channel state file {handle.path} is damaged: {len(data)} bytes with CRC "
            f"{zlib.crc32(data):#010x}, its checkpoint metadata says {handle.size} bytes "
            f"with CRC {handle.crc:#010x}",
            path=handle.path,
        )
    return [data[offset : offset + length] for offset, length in entry.frames]
