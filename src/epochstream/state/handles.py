"""What a snapshot leaves behind, and what a restoring subtask is handed.

A task's asynchronous snapshot writes keyed state to files and describes them with a
:class:`KeyedStateHandle`. There is one handle type per snapshot format:

- :class:`HeapSnapshotHandle`: the heap backend's files, a *chain* of one full file
  and the deltas written after it; each file holds one CRC-checked segment per key group;
- :class:`RocksDBSnapshotHandle`: the files of a RocksDB checkpoint (SST files shared
  between incremental checkpoints, plus per-checkpoint MANIFEST/CURRENT/OPTIONS);
- :class:`CanonicalSnapshotHandle`: the backend-independent savepoint format, an
  Arrow IPC file of ``(state, key group, key, namespace, user key, value)`` rows with one
  record batch per key group;
- :class:`ColumnarSnapshotHandle`: the state of columnar aggregations, an Arrow IPC
  file of native columns, one record batch per key group.

Handles hold full locations (paths or ``s3://`` URIs) in memory; in ``_metadata`` they
are written relative to the directory holding the ``_metadata`` file, so a savepoint
directory can be moved. Operator (non-keyed) list state is small and travels inline.

On restore the job master turns the metadata into one :class:`OperatorRestore` per
operator and subtask: the keyed handles whose key groups intersect the subtask's new
key-group range, and the operator list state redistributed to the new parallelism.

Example::

    f = HeapStateFile(path="/ck/j/shared/4-op-0-ab.kst", full=True, segments={3: (0, 120)}, size=120)
    h = HeapSnapshotHandle(key_groups=range(0, 64), chain=(f,))
    h.restricted_to(range(0, 2)) is None      # key group 3 is outside
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from epochstream.core.state_schema import StateSchema
from epochstream.exceptions import CheckpointError
from epochstream.state.channel_state import ChannelStateHandle

__all__ = [
    "CanonicalSnapshotHandle",
    "ColumnarSnapshotHandle",
    "HeapSnapshotHandle",
    "HeapStateFile",
    "KeyedStateHandle",
    "OperatorRestore",
    "OperatorSubtaskState",
    "RocksDBSnapshotHandle",
    "StateFile",
    "handle_from_json",
    "saved_schemas",
]

#: Resolves a path stored relative to ``_metadata``'s directory into a full location.
Resolve = Callable[[str], str]
#: Turns a full location into a path relative to ``_metadata``'s directory.
Relativize = Callable[[str], str]


def _range_json(r: range) -> list[int]:
    return [r.start, r.stop]


def _range_of(doc: Any, where: str) -> range:
    if (
        not isinstance(doc, list)
        or len(doc) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in doc)
        or not 0 <= doc[0] <= doc[1]
    ):
        raise CheckpointError(f"{where}: key group range must be [start, stop], got {doc!r}")
    return range(doc[0], doc[1])


class KeyedStateHandle(ABC):
    """One subtask's keyed state of one operator in one snapshot."""

    #: ``"type"`` in the JSON encoding.
    TYPE: ClassVar[str]
    #: The backend that can restore it (``None``: any, the canonical format).
    BACKEND: ClassVar[str | None]

    key_groups: range

    @property
    @abstractmethod
    def size(self) -> int:
        """Bytes of the files it references."""

    @abstractmethod
    def files(self) -> list[str]:
        """Every file it references."""

    @abstractmethod
    def shared_files(self) -> list[str]:
        """The files that other snapshots may reference too (reference-counted)."""

    @abstractmethod
    def restricted_to(self, key_groups: range) -> KeyedStateHandle | None:
        """The part covering ``key_groups``; ``None`` when nothing overlaps."""

    @abstractmethod
    def to_json(self, relativize: Relativize) -> dict[str, Any]:
        """A JSON-ready dict with paths made relative."""

    @classmethod
    @abstractmethod
    def from_json(cls, doc: dict[str, Any], resolve: Resolve, where: str) -> KeyedStateHandle:
        """Inverse of :meth:`to_json`."""

    def overlaps(self, key_groups: range) -> bool:
        """Whether this handle covers any of ``key_groups``."""
        return max(self.key_groups.start, key_groups.start) < min(
            self.key_groups.stop, key_groups.stop
        )


def _need(doc: dict[str, Any], key: str, kind: type, where: str) -> Any:
    value = doc.get(key)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise CheckpointError(f"{where}: field {key!r} must be {kind.__name__}, got {value!r}")
    return value


def _schemas_json(schemas: dict[str, StateSchema]) -> dict[str, Any]:
    return {name: schema.to_json() for name, schema in sorted(schemas.items())}


def _schemas_of(doc: dict[str, Any], where: str) -> dict[str, StateSchema]:
    """A handle's ``schemas`` (absent in snapshots written before schemas were kept:
    every state at version 1, shapes unknown)."""
    raw = doc.get("schemas", {})
    if not isinstance(raw, dict):
        raise CheckpointError(f"{where}: schemas must be an object, got {raw!r}")
    return {
        str(name): StateSchema.from_json(entry, f"{where}.schemas[{name!r}]")
        for name, entry in raw.items()
    }


# ---------------------------------------------------------------- heap


@dataclass(frozen=True)
class HeapStateFile:
    """A heap snapshot file: ``full`` state or a ``delta``; ``(offset, length)`` per key group.

    ``shared`` files live in the job's ``shared/`` directory and may be referenced by
    later checkpoints; the others belong to one checkpoint directory.
    """

    path: str
    full: bool
    segments: dict[int, tuple[int, int]]
    size: int
    shared: bool = True

    def restricted_to(self, key_groups: range) -> HeapStateFile | None:
        kept = {kg: span for kg, span in self.segments.items() if kg in key_groups}
        return replace(self, segments=kept) if kept else None

    def to_json(self, relativize: Relativize) -> dict[str, Any]:
        return {
            "path": relativize(self.path),
            "full": self.full,
            "shared": self.shared,
            "size": self.size,
            "segments": {str(kg): [o, n] for kg, (o, n) in sorted(self.segments.items())},
        }

    @staticmethod
    def from_json(doc: Any, resolve: Resolve, where: str) -> HeapStateFile:
        if not isinstance(doc, dict):
            raise CheckpointError(f"{where}: a heap state file must be an object")
        segments: dict[int, tuple[int, int]] = {}
        for kg, span in _need(doc, "segments", dict, where).items():
            ok = (
                kg.isdigit()
                and isinstance(span, list)
                and len(span) == 2
                and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in span)
            )
            if not ok:
                raise CheckpointError(f"{where}: bad segment {kg!r}: {span!r}")
            segments[int(kg)] = (span[0], span[1])
        return HeapStateFile(
            path=resolve(_need(doc, "path", str, where)),
            full=bool(doc.get("full")),
            segments=segments,
            size=_need(doc, "size", int, where),
            shared=bool(doc.get("shared", True)),
        )


@dataclass(frozen=True)
class HeapSnapshotHandle(KeyedStateHandle):
    """The heap backend's snapshot: a full file followed by deltas, applied in order.

    Example::

        HeapSnapshotHandle(key_groups=range(0, 64), chain=(full, delta1, delta2))
    """

    TYPE: ClassVar[str] = "heap"
    BACKEND: ClassVar[str | None] = "heap"

    key_groups: range
    #: The files, oldest (the full one, if any) first.
    chain: tuple[HeapStateFile, ...] = ()
    #: Kind of each state in the files (``value``, ``list``, ``map``, ...).
    states: dict[str, str] = field(default_factory=dict)
    #: Version (and value shapes) of each state (see :mod:`epochstream.core.state_schema`).
    schemas: dict[str, StateSchema] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return sum(f.size for f in self.chain)

    def files(self) -> list[str]:
        return [f.path for f in self.chain]

    def shared_files(self) -> list[str]:
        return [f.path for f in self.chain if f.shared]

    def restricted_to(self, key_groups: range) -> HeapSnapshotHandle | None:
        if not self.overlaps(key_groups):
            return None
        kept = tuple(r for r in (f.restricted_to(key_groups) for f in self.chain) if r is not None)
        return replace(self, chain=kept) if kept else None

    def to_json(self, relativize: Relativize) -> dict[str, Any]:
        return {
            "type": self.TYPE,
            "key_groups": _range_json(self.key_groups),
            "files": [f.to_json(relativize) for f in self.chain],
            "states": dict(sorted(self.states.items())),
            "schemas": _schemas_json(self.schemas),
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any], resolve: Resolve, where: str) -> HeapSnapshotHandle:
        files = tuple(
            HeapStateFile.from_json(f, resolve, f"{where}.files[{i}]")
            for i, f in enumerate(_need(doc, "files", list, where))
        )
        states = {str(k): str(v) for k, v in _need(doc, "states", dict, where).items()}
        return cls(_range_of(doc.get("key_groups"), where), files, states, _schemas_of(doc, where))


# ---------------------------------------------------------------- RocksDB


@dataclass(frozen=True)
class StateFile:
    """A file of a snapshot: location, size, whether snapshots share it, CRC-32."""

    path: str
    size: int
    shared: bool
    crc: int | None = None

    def to_json(self, relativize: Relativize) -> dict[str, Any]:
        return {
            "path": relativize(self.path),
            "size": self.size,
            "shared": self.shared,
            "crc": self.crc,
        }

    @staticmethod
    def from_json(doc: Any, resolve: Resolve, where: str) -> StateFile:
        if not isinstance(doc, dict):
            raise CheckpointError(f"{where}: a state file must be an object")
        crc = _crc_of(doc, where)
        return StateFile(
            resolve(_need(doc, "path", str, where)),
            _need(doc, "size", int, where),
            bool(doc.get("shared")),
            crc,
        )


@dataclass(frozen=True)
class RocksDBSnapshotHandle(KeyedStateHandle):
    """A RocksDB checkpoint: its files by their name in the database directory.

    SST files are immutable and ``shared`` between incremental checkpoints; the
    MANIFEST, CURRENT, OPTIONS and log files are written for every checkpoint.

    Example::

        RocksDBSnapshotHandle(key_groups=range(0, 64), db_files={"000011.sst": sst, "CURRENT": cur})
    """

    TYPE: ClassVar[str] = "rocksdb"
    BACKEND: ClassVar[str | None] = "rocksdb"

    key_groups: range
    db_files: dict[str, StateFile] = field(default_factory=dict)
    #: Kind of each state (one column family each).
    states: dict[str, str] = field(default_factory=dict)
    #: Version (and value shapes) of each state (see :mod:`epochstream.core.state_schema`).
    schemas: dict[str, StateSchema] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return sum(f.size for f in self.db_files.values())

    def files(self) -> list[str]:
        return [f.path for f in self.db_files.values()]

    def shared_files(self) -> list[str]:
        return [f.path for f in self.db_files.values() if f.shared]

    def restricted_to(self, key_groups: range) -> RocksDBSnapshotHandle | None:
        # A database cannot be cut by file: the restoring backend keeps only its range.
        return self if self.overlaps(key_groups) else None

    def to_json(self, relativize: Relativize) -> dict[str, Any]:
        return {
            "type": self.TYPE,
            "key_groups": _range_json(self.key_groups),
            "db_files": {n: f.to_json(relativize) for n, f in sorted(self.db_files.items())},
            "states": dict(sorted(self.states.items())),
            "schemas": _schemas_json(self.schemas),
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any], resolve: Resolve, where: str) -> RocksDBSnapshotHandle:
        files = {
            name: StateFile.from_json(f, resolve, f"{where}.db_files[{name!r}]")
            for name, f in _need(doc, "db_files", dict, where).items()
        }
        states = {str(k): str(v) for k, v in _need(doc, "states", dict, where).items()}
        return cls(_range_of(doc.get("key_groups"), where), files, states, _schemas_of(doc, where))


# ---------------------------------------------------------------- canonical (savepoints)


@dataclass(frozen=True)
class CanonicalSnapshotHandle(KeyedStateHandle):
    """Savepoint keyed state in the backend-independent format (Arrow IPC).

    ``batches[kg]`` is the index of key group ``kg``'s record batch in the file;
    ``states`` maps each state name to its kind (``value``, ``list``, ``map``, ...).

    Example::

        CanonicalSnapshotHandle(key_groups=range(0, 64), path="/sp/op-0.arrow",
                                size=4096, batches={0: 0, 5: 1}, states={"count": "value"})
    """

    TYPE: ClassVar[str] = "canonical"
    BACKEND: ClassVar[str | None] = None

    key_groups: range
    path: str = ""
    file_size: int = 0
    batches: dict[int, int] = field(default_factory=dict)
    states: dict[str, str] = field(default_factory=dict)
    #: CRC-32 of the whole file (None in files written before it was kept).
    crc: int | None = None
    #: Version (and value shapes) of each state (see :mod:`epochstream.core.state_schema`).
    schemas: dict[str, StateSchema] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return self.file_size

    def files(self) -> list[str]:
        return [self.path]

    def shared_files(self) -> list[str]:
        return []

    def restricted_to(self, key_groups: range) -> CanonicalSnapshotHandle | None:
        kept = {kg: i for kg, i in self.batches.items() if kg in key_groups}
        return replace(self, batches=kept) if kept else None

    def to_json(self, relativize: Relativize) -> dict[str, Any]:
        return {
            "type": self.TYPE,
            "key_groups": _range_json(self.key_groups),
            "path": relativize(self.path),
            "size": self.file_size,
            "batches": {str(kg): i for kg, i in sorted(self.batches.items())},
            "states": dict(sorted(self.states.items())),
            "crc": self.crc,
            "schemas": _schemas_json(self.schemas),
        }

    @classmethod
    def from_json(
        cls, doc: dict[str, Any], resolve: Resolve, where: str
    ) -> CanonicalSnapshotHandle:
        batches: dict[int, int] = {}
        for kg, index in _need(doc, "batches", dict, where).items():
            if not kg.isdigit() or not isinstance(index, int):
                raise CheckpointError(f"{where}: bad batch entry {kg!r}: {index!r}")
            batches[int(kg)] = index
        states = _need(doc, "states", dict, where)
        return cls(
            key_groups=_range_of(doc.get("key_groups"), where),
            path=resolve(_need(doc, "path", str, where)),
            file_size=_need(doc, "size", int, where),
            batches=batches,
            states={str(k): str(v) for k, v in states.items()},
            crc=_crc_of(doc, where),
            schemas=_schemas_of(doc, where),
        )


@dataclass(frozen=True)
class ColumnarSnapshotHandle(CanonicalSnapshotHandle):
    """Columnar aggregation state (Arrow IPC file, one record batch per key group).

    Rows are ``(_kg, key, window bounds if windowed, accumulators...)`` in native Arrow
    types; ``states`` names the accumulator columns. Written by the columnar
    aggregation operators, full each time (it is small: one row per key and window),
    and read back by them, restricted to a subtask's key groups like any keyed handle.

    Example::

        ColumnarSnapshotHandle(key_groups=range(0, 64), path="/ck/chk-3/op-0.arrow",
                               file_size=2048, batches={4: 0}, states={"v_sum": "int64"})
    """

    TYPE: ClassVar[str] = "columnar"
    BACKEND: ClassVar[str | None] = "columnar"


_HANDLE_TYPES: dict[str, type[KeyedStateHandle]] = {
    t.TYPE: t
    for t in (
        HeapSnapshotHandle,
        RocksDBSnapshotHandle,
        CanonicalSnapshotHandle,
        ColumnarSnapshotHandle,
    )
}


def _crc_of(doc: dict[str, Any], where: str) -> int | None:
    """A handle's optional ``crc`` entry, checked to be an integer."""
    crc = doc.get("crc")
    if crc is not None and (not isinstance(crc, int) or isinstance(crc, bool)):
        raise CheckpointError(f"{where}: crc must be an integer, got {crc!r}")
    return crc


def handle_from_json(doc: Any, resolve: Resolve, where: str) -> KeyedStateHandle:
    """Decode any keyed state handle written by ``to_json``.

    Example::

        handle_from_json(h.to_json(rel), resolve, "operators['sum'][0].keyed")
    """
    if not isinstance(doc, dict):
        raise CheckpointError(f"{where}: a keyed state handle must be an object")
    kind = doc.get("type")
    handle_type = _HANDLE_TYPES.get(kind) if isinstance(kind, str) else None
    if handle_type is None:
        raise CheckpointError(
            f"{where}: unknown keyed state handle type {kind!r} (known: {sorted(_HANDLE_TYPES)})"
        )
    return handle_type.from_json(doc, resolve, where)


def saved_schemas(handles: list[KeyedStateHandle]) -> dict[str, StateSchema]:
    """Per keyed state of one operator, the schema its snapshot files record (their
    shapes together; states of files without one at version 1).

    Example: ``saved_schemas([h0, h1])["profile"].version``
    """
    out: dict[str, StateSchema] = {}
    for handle in handles:
        schemas: dict[str, StateSchema] = getattr(handle, "schemas", {})
        for name in getattr(handle, "states", {}):
            schema = schemas.get(name, StateSchema())
            known = out.get(name)
            shapes = schema.shapes | (known.shapes if known is not None else frozenset())
            out[name] = StateSchema(schema.version, shapes)
    return out


# ---------------------------------------------------------------- per operator subtask


@dataclass
class OperatorSubtaskState:
    """One operator's state in one subtask's snapshot (what a task acks per operator).

    ``operator_lists`` are split round-robin on rescale; ``union_lists`` are given
    whole to every subtask on restore (Flink's union list state). ``channel``: the
    in-flight records of an unaligned checkpoint (:mod:`epochstream.state.channel_state`).
    """

    keyed: KeyedStateHandle | None = None
    operator_lists: dict[str, list[object]] = field(default_factory=dict)
    union_lists: dict[str, list[object]] = field(default_factory=dict)
    #: The task's channel state (unaligned checkpoints), kept with its head operator.
    channel: ChannelStateHandle | None = None

    @property
    def is_empty(self) -> bool:
        return (
            self.keyed is None
            and not self.operator_lists
            and not self.union_lists
            and self.channel is None
        )


@dataclass
class OperatorRestore:
    """What one restoring subtask of one operator receives.

    ``owned``: the files belong to this job's own checkpoint storage, so the backend
    may keep building incremental snapshots on them; otherwise (a savepoint, another
    job's checkpoint) its first snapshot is self-contained.
    """

    keyed: list[KeyedStateHandle] = field(default_factory=list)
    operator_lists: dict[str, list[object]] = field(default_factory=dict)
    union_lists: dict[str, list[object]] = field(default_factory=dict)
    owned: bool = False
    #: Per keyed state, how the classes of its saved values changed in the job's code
    #: (found by the job master: :func:`~epochstream.core.state_schema.class_changes`).
    class_changes: dict[str, list[str]] = field(default_factory=dict)
