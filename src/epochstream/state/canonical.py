"""The canonical, backend-independent keyed-state format of savepoints (Arrow IPC).

One file per operator subtask; one record batch per key group, rows of every state of
the operator::

    state       string   state name
    key_group   int32
    key         binary   canonical key bytes (routing encoding; decodes back to the key)
    namespace   binary   canonical bytes of the namespace (window, timer domain), or null
    user_key    binary   map state: canonical bytes of the user key; else null
    value       binary   the value serialized by the state's serializer (list state: one
                         row per element, in order)
    ttl_ts      float64  with TTL: wall-clock seconds of the last update; else null

The schema metadata ``epochstream.states`` maps each state name to its kind and its
serializer (base64 of a cloudpickle), so any backend can restore the file and
``es.savepoint.read`` can decode it offline. Both backends write and read it.

Example::

    write_canonical(fs, path, states, rows_by_key_group)   # -> CanonicalSnapshotHandle
    for kg, batch in read_batches(fs, handle, range(0, 64)):
        ...
"""

from __future__ import annotations

import base64
import json
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, BinaryIO

import cloudpickle
import pyarrow as pa

from epochstream.core.serializers import DEFAULT_SERIALIZER, Serializer
from epochstream.core.storage_faults import READ_RETRY, read_error, unavailable_or
from epochstream.exceptions import CorruptStateError, StateError
from epochstream.state.handles import CanonicalSnapshotHandle

if TYPE_CHECKING:
    from epochstream.core.filesystems import StorageFS

__all__ = [
    "CANONICAL_SCHEMA",
    "CanonicalRow",
    "StateMeta",
    "read_batches",
    "read_state_meta",
    "write_canonical",
    "write_ipc_file",
]

_META_KEY = b"epochstream.states"
#: The columns of canonical rows (a file's schema adds its states' metadata).
CANONICAL_SCHEMA = pa.schema(
    [
        ("state", pa.string()),
        ("key_group", pa.int32()),
        ("key", pa.binary()),
        ("namespace", pa.binary()),
        ("user_key", pa.binary()),
        ("value", pa.binary()),
        ("ttl_ts", pa.float64()),
    ]
)
#: (state, key bytes, namespace bytes | None, user key bytes | None, value bytes, ttl_ts | None)
CanonicalRow = tuple[str, bytes, bytes | None, bytes | None, bytes, float | None]


@dataclass(frozen=True)
class StateMeta:
    """A state's kind and the serializer of its values.

    Example::

        StateMeta("value", PickleSerializer())
    """

    kind: str
    serializer: Serializer = DEFAULT_SERIALIZER


def _schema(states: dict[str, StateMeta]) -> pa.Schema:

    meta = {
        name: {
            "kind": m.kind,
            "serializer": base64.b64encode(cloudpickle.dumps(m.serializer)).decode("ascii"),
        }
        for name, m in sorted(states.items())
    }
    return CANONICAL_SCHEMA.with_metadata({_META_KEY: json.dumps(meta).encode("utf-8")})


def write_canonical(
    fs: StorageFS,
    path: str,
    states: dict[str, StateMeta],
    groups: Iterable[tuple[int, list[CanonicalRow]]],
    *,
    key_groups: range,
) -> CanonicalSnapshotHandle | None:
    """Write one record batch per key group (groups must come in ascending order)."""
    import pyarrow as pa

    schema = _schema(states)

    def batches_of() -> Iterator[tuple[int, Any]]:
        for kg, rows in groups:
            if not rows:
                continue
            columns = list(zip(*rows, strict=True))
            yield (
                kg,
                pa.record_batch(
                    [
                        pa.array(columns[0], pa.string()),
                        pa.array([kg] * len(rows), pa.int32()),
                        pa.array(columns[1], pa.binary()),
                        pa.array(columns[2], pa.binary()),
                        pa.array(columns[3], pa.binary()),
                        pa.array(columns[4], pa.binary()),
                        pa.array(columns[5], pa.float64()),
                    ],
                    schema=schema,
                ),
            )

    batches, size, crc = write_ipc_file(fs, path, schema, batches_of())
    return CanonicalSnapshotHandle(
        key_groups=key_groups,
        path=path,
        file_size=size,
        batches=batches,
        states={name: m.kind for name, m in states.items()},
        crc=crc,
    )


class _Checksummed:
    """A writable file passing writes through to ``raw`` and keeping their CRC-32 and
    size, so a file is checksummed as it is written (not read back, not held twice)."""

    def __init__(self, raw: BinaryIO) -> None:
        self.raw = raw
        self.crc = 0
        self.size = 0
        self.closed = False

    def write(self, data: Any) -> int:
        view = memoryview(data)
        self.crc = zlib.crc32(view, self.crc)
        self.size += view.nbytes
        self.raw.write(view)
        return view.nbytes

    def tell(self) -> int:
        return self.size

    def flush(self) -> None:
        self.raw.flush()

    def close(self) -> None:
        self.closed = True  # ``raw`` is closed by its owner, which makes it durable


def write_ipc_file(
    fs: StorageFS, path: str, schema: Any, batches: Iterable[tuple[int, Any]]
) -> tuple[dict[int, int], int, int]:
    """Write ``(key group, record batch)`` pairs (ascending key groups) as one Arrow IPC
    file: each key group's batch index, the file's size and its CRC-32. Every
    canonical and columnar state file is written here.

    Example: ``indices, size, crc = write_ipc_file(fs, path, table.schema, split_by_key_group(table))``
    """
    import pyarrow as pa

    indices: dict[int, int] = {}
    try:
        with fs.open_write(path) as raw:
            sink = _Checksummed(raw)
            writer = pa.ipc.new_file(pa.PythonFile(sink, mode="w"), schema)
            for kg, batch in batches:
                indices[kg] = len(indices)
                writer.write_batch(batch)
            writer.close()
    except OSError as err:
        # An outage fails the checkpoint as storage unavailable (see core.storage_faults).
        raise unavailable_or(err, what="write state file", path=path, other=StateError) from err
    return indices, sink.size, sink.crc


def _open(fs: StorageFS, path: str, crc: int | None = None) -> Any:
    """An IPC file reader of ``path``, whose CRC-32 must be ``crc`` when given. A file
    missing in a reachable store, failing its checksum or not an IPC file is a
    :class:`CorruptStateError`, so a restore falls back to an earlier checkpoint;
    storage that cannot be reached is retried, then a ``StorageUnavailableError``."""
    import pyarrow as pa

    try:
        data = READ_RETRY.run(lambda: fs.read_bytes(path), what="read state file", path=path)
    except OSError as err:
        raise read_error(err, what="read state file", path=path) from err
    # crc is None for files written before checksums were kept.
    if crc is not None and zlib.crc32(data) != crc:
        raise CorruptStateError(f"state file {path}: checksum mismatch (file corrupt)", path=path)
    try:
        return pa.ipc.open_file(pa.BufferReader(data))
    except (OSError, pa.ArrowInvalid) as err:
        raise CorruptStateError(f"cannot read state file {path}: {err}", path=path) from err


def read_state_meta(fs: StorageFS, path: str) -> dict[str, StateMeta]:
    """The kind and serializer of every state in a canonical file."""
    reader = _open(fs, path)
    raw = (reader.schema.metadata or {}).get(_META_KEY)
    if raw is None:
        raise StateError(f"{path}: not an epochstream savepoint state file (no state metadata)")
    try:
        doc = json.loads(raw)
        return {
            name: StateMeta(
                kind=entry["kind"],
                serializer=cloudpickle.loads(base64.b64decode(entry["serializer"])),
            )
            for name, entry in doc.items()
        }
    except Exception as err:  # any decoding failure makes the file unusable
        raise StateError(f"{path}: unreadable state metadata: {err!r}") from err


def read_batches(
    fs: StorageFS, handle: CanonicalSnapshotHandle, key_groups: Iterable[int]
) -> Iterator[tuple[int, pa.RecordBatch]]:
    """The record batches of ``key_groups`` present in ``handle``, in key-group order."""
    wanted = sorted((kg, handle.batches[kg]) for kg in key_groups if kg in handle.batches)
    if not wanted:
        return
    reader = _open(fs, handle.path, handle.crc)
    for kg, index in wanted:
        try:
            batch = reader.get_batch(index)
        except Exception as err:  # pyarrow raises several types for corrupt files
            raise CorruptStateError(
                f"state file {handle.path}: key group {kg} (batch {index}): {err}", path=handle.path
            ) from err
        yield kg, batch
