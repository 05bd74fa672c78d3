"""Where the rows of one keyed state of a savepoint being written come from.

The savepoint writer (:mod:`epochstream.checkpoint.savepoint_writer`) plans a savepoint
lazily: every keyed state of an operator it rewrites is a :class:`KeyedStateSource`, a
recipe that produces the state's rows as canonical record batches
(:data:`~epochstream.state.canonical.CANONICAL_SCHEMA`: keys, namespaces and
user keys in the one key format, values serialized by the state's serializer, key
groups for the savepoint's max parallelism) one batch at a time when the savepoint is
written:

- :class:`SavedState`: a state of the savepoint or checkpoint the plan was loaded from
  (canonical rows are copied as bytes; a checkpoint's heap or RocksDB entries are
  decoded and encoded again);
- :class:`BootstrappedState`: rows built from Arrow, pandas or Polars data
  (``with_keyed_state``);
- :class:`TransformedState`: another source's rows through a function on Arrow record
  batches (``transform``); :class:`MappedValues`: through a function on each value
  (``map_values``), for values Arrow cannot hold.

Keys are encoded exactly as a running job's ``key_by`` stores them
(:func:`~epochstream.state.keyformat.encode_key`), so a key lands in the key group a job
routes it to.

Example::

    source = BootstrappedState("counter", "count", table, key="word", value="n")
    for batch in source.batches(max_parallelism=128):
        spill.add(batch)
"""

from __future__ import annotations

import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import islice
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from epochstream.checkpoint.reader import state_rows
from epochstream.core.filesystems import storage_fs
from epochstream.core.serializers import DEFAULT_SERIALIZER, Serializer
from epochstream.core.state_schema import StateSchema, shapes_of_types
from epochstream.exceptions import KeyEncodingError, StateError
from epochstream.state.backends.base import ROWS, base_kind, is_namespaced
from epochstream.state.backends.heap.columns import COLUMNAR
from epochstream.state.canonical import (
    CANONICAL_SCHEMA,
    StateMeta,
    read_batches,
    read_state_meta,
)
from epochstream.state.handles import CanonicalSnapshotHandle, KeyedStateHandle
from epochstream.state.keyformat import decode_key, encode_key
from epochstream.state.keygroups import key_group_of_bytes

__all__ = [
    "BOOTSTRAP_KINDS",
    "BootstrappedState",
    "Column",
    "KeyedStateSource",
    "MappedValues",
    "SavedState",
    "TransformedState",
    "checked_version",
    "is_regroupable",
]

#: The state kinds ``with_keyed_state`` builds.
BOOTSTRAP_KINDS = ("value", "list", "map")
#: A column name, several (their values as a tuple), or a function of the row as a dict.
Column = str | Sequence[str] | Callable[[dict[str, Any]], Any]
#: Rows per record batch decoded from states that are not already in batches.
_CHUNK = 65_536


def checked_version(version: int, where: str) -> int:
    """``version`` if it is a schema version (an int >= 1), else a StateError naming
    ``where``.

    Example: ``checked_version(2, "operator 'op', state 'n'") == 2``
    """
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise StateError(f"{where}: version must be an int >= 1, got {version!r}")
    return version


def is_regroupable(kind: str) -> bool:
    """Whether a state of ``kind`` is stored per key (value, list, map, and their
    namespaced forms), so its rows can be decoded, transformed and moved to other key
    groups; columnar aggregation state and row tables are filed by the operators that
    own them and are copied as they are.

    Example: ``is_regroupable("ns-list") and not is_regroupable("rows")``
    """
    return kind not in (ROWS, COLUMNAR) and base_kind(kind) in BOOTSTRAP_KINDS


class KeyedStateSource(ABC):
    """The rows of one keyed state, produced batch by batch (see the module docstring)."""

    uid: str
    name: str
    kind: str

    @abstractmethod
    def meta(self) -> StateMeta:
        """The state's kind and the serializer of its stored values."""

    @abstractmethod
    def batches(self, max_parallelism: int) -> Iterator[pa.RecordBatch]:
        """The state's rows, ``CANONICAL_SCHEMA``, key groups for ``max_parallelism``."""

    @abstractmethod
    def schema(self) -> StateSchema:
        """The version and value shapes to record (complete once :meth:`batches` ran)."""


class _Encoder:
    """Turns keys, namespaces, user keys and values (Python objects) into canonical
    rows of one state, noting the classes of the values for the state's schema.

    A null key is refused as bad input (``refuse_nulls``) except for state read from
    a checkpoint, where ``None`` was a job's own key.
    """

    def __init__(
        self,
        uid: str,
        name: str,
        meta: StateMeta,
        max_parallelism: int,
        *,
        refuse_nulls: bool = True,
    ) -> None:
        self.uid, self.name, self.meta = uid, name, meta
        self.max_parallelism = max_parallelism
        self.refuse_nulls = refuse_nulls
        self.seen: set[type] = set()

    def where(self, row: int) -> str:
        return f"operator {self.uid!r}, state {self.name!r}, row {row}"

    def _key(self, value: Any, row: int, what: str) -> bytes:
        if value is None and self.refuse_nulls:
            raise StateError(f"{self.where(row)}: the {what} is null")
        try:
            return encode_key(value)
        except KeyEncodingError as err:
            raise StateError(f"{self.where(row)}: the {what} cannot be a key: {err}") from err

    def encode(
        self,
        first_row: int,
        keys: list[Any],
        values: list[Any],
        namespaces: list[Any] | None = None,
        user_keys: list[Any] | None = None,
        ttls: list[float | None] | None = None,
    ) -> pa.RecordBatch:
        n = len(keys)
        kind = base_kind(self.meta.kind)
        key_bytes = [self._key(k, first_row + i, "key") for i, k in enumerate(keys)]
        ns_bytes: list[bytes | None] = [None] * n
        if namespaces is not None and is_namespaced(self.meta.kind):
            ns_bytes = [self._key(v, first_row + i, "namespace") for i, v in enumerate(namespaces)]
        uk_bytes: list[bytes | None] = [None] * n
        if kind == "map":
            if user_keys is None:
                raise StateError(f"operator {self.uid!r}, map state {self.name!r}: no user keys")
            uk_bytes = [self._key(v, first_row + i, "user key") for i, v in enumerate(user_keys)]
        dumps = self.meta.serializer.dumps
        self.seen.update(map(type, values))
        mp = self.max_parallelism
        return pa.record_batch(
            [
                pa.array([self.name] * n, pa.string()),
                pa.array([key_group_of_bytes(k, mp) for k in key_bytes], pa.int32()),
                pa.array(key_bytes, pa.binary()),
                pa.array(ns_bytes, pa.binary()),
                pa.array(uk_bytes, pa.binary()),
                pa.array([dumps(v) for v in values], pa.binary()),
                pa.array(ttls if ttls is not None else [None] * n, pa.float64()),
            ],
            schema=CANONICAL_SCHEMA,
        )


def _decoded(batch: pa.RecordBatch, meta: StateMeta) -> dict[str, list[Any]]:
    """A canonical batch's rows as Python objects, the columns ``read_keyed_state`` has."""
    cols = batch.to_pydict()
    loads = meta.serializer.loads
    return {
        "key": [decode_key(k) for k in cols["key"]],
        "value": [loads(v) for v in cols["value"]],
        "namespace": [None if n is None else decode_key(n) for n in cols["namespace"]],
        "user_key": [None if u is None else decode_key(u) for u in cols["user_key"]],
        "ttl_ts": cols["ttl_ts"],
    }


# ---------------------------------------------------------------- saved state


class SavedState(KeyedStateSource):
    """State ``name`` of operator ``uid`` in the loaded savepoint or checkpoint.

    Canonical rows (savepoints) are copied as bytes; their key groups are computed again
    from the key bytes only when the max parallelism changes. A checkpoint's heap or
    RocksDB entries are read with :func:`~epochstream.checkpoint.reader.state_rows` and
    encoded with the default serializer.
    """

    def __init__(
        self,
        uid: str,
        name: str,
        kind: str,
        handles: list[KeyedStateHandle],
        *,
        max_parallelism: int,
        schema: StateSchema,
        storage_options: Any = None,
    ) -> None:
        self.uid, self.name, self.kind = uid, name, kind
        self.handles = [h for h in handles if name in getattr(h, "states", {})]
        self.source_max_parallelism = max_parallelism
        self._schema = schema
        self.options = storage_options
        self._meta: StateMeta | None = None

    def _canonical(self) -> list[CanonicalSnapshotHandle]:
        return [h for h in self.handles if type(h) is CanonicalSnapshotHandle]

    def meta(self) -> StateMeta:
        if self._meta is None:
            canonical = self._canonical()
            if canonical:
                path = canonical[0].path
                self._meta = read_state_meta(storage_fs(path, self.options), path)[self.name]
            else:
                self._meta = StateMeta(self.kind, DEFAULT_SERIALIZER)
        return self._meta

    def schema(self) -> StateSchema:
        return self._schema

    def batches(self, max_parallelism: int) -> Iterator[pa.RecordBatch]:
        regroup = max_parallelism != self.source_max_parallelism
        if regroup and not is_regroupable(self.kind):
            raise StateError(
                f"operator {self.uid!r}, state {self.name!r}: {self.kind} state is filed by "
                f"key group by the operator that owns it and cannot move to max parallelism "
                f"{max_parallelism} (from {self.source_max_parallelism})"
            )
        for handle in self.handles:
            if type(handle) is CanonicalSnapshotHandle:
                yield from self._canonical_batches(handle, max_parallelism if regroup else None)
            else:
                yield from self._decoded_batches(handle, max_parallelism)

    def _canonical_batches(
        self, handle: CanonicalSnapshotHandle, regroup: int | None
    ) -> Iterator[pa.RecordBatch]:
        fs = storage_fs(handle.path, self.options)
        for _kg, batch in read_batches(fs, handle, sorted(handle.batches)):
            mine = batch.filter(pc.equal(batch.column("state"), self.name))
            if mine.num_rows == 0:
                continue
            columns = mine.columns
            if regroup is not None:
                kgs = [key_group_of_bytes(k, regroup) for k in mine.column("key").to_pylist()]
                columns[1] = pa.array(kgs, pa.int32())
            yield pa.record_batch(columns, schema=CANONICAL_SCHEMA)

    def _decoded_batches(
        self, handle: KeyedStateHandle, max_parallelism: int
    ) -> Iterator[pa.RecordBatch]:
        if not is_regroupable(self.kind):
            raise StateError(
                f"operator {self.uid!r}, state {self.name!r}: {self.kind} state in a "
                f"{type(handle).__name__} (a checkpoint's own files) cannot be rewritten; "
                "restore a job from the checkpoint and take a savepoint of it first"
            )
        encoder = _Encoder(self.uid, self.name, self.meta(), max_parallelism, refuse_nulls=False)
        rows = state_rows(handle, self.name, self.source_max_parallelism, self.options)
        done = 0
        while chunk := list(islice(rows, _CHUNK)):
            key, value, _kg, ns, user_key, ttl = (list(c) for c in zip(*chunk, strict=True))
            yield encoder.encode(done, key, value, ns, user_key, ttl)
            done += len(chunk)


# ---------------------------------------------------------------- bootstrap


def record_batches(data: Any, where: str) -> Iterator[pa.RecordBatch]:
    """``data`` as Arrow record batches: a ``pyarrow`` Table, RecordBatch or Dataset, a
    pandas or Polars DataFrame, or an iterable of record batches (or tables).

    Example: ``list(record_batches(pa.table({"a": [1]}), "here"))[0].num_rows == 1``
    """
    if isinstance(data, pa.Table):
        yield from data.to_batches(max_chunksize=_CHUNK)
        return
    if isinstance(data, pa.RecordBatch):
        yield data
        return
    dataset = sys.modules.get("pyarrow.dataset")
    if dataset is not None and isinstance(data, dataset.Dataset):
        yield from data.to_batches(batch_size=_CHUNK)
        return
    pandas = sys.modules.get("pandas")
    if pandas is not None and isinstance(data, pandas.DataFrame):
        yield from pa.Table.from_pandas(data, preserve_index=False).to_batches(_CHUNK)
        return
    polars = sys.modules.get("polars")
    if polars is not None and isinstance(data, polars.DataFrame):
        yield from data.to_arrow().to_batches(_CHUNK)
        return
    if not isinstance(data, Iterable) or isinstance(data, (str, bytes, dict)):
        raise StateError(
            f"{where}: data must be a pyarrow Table, RecordBatch or Dataset, a pandas or "
            f"Polars DataFrame, or an iterable of record batches; got {type(data).__name__}"
        )
    for i, item in enumerate(data):
        if isinstance(item, pa.Table):
            yield from item.to_batches(max_chunksize=_CHUNK)
        elif isinstance(item, pa.RecordBatch):
            yield item
        else:
            raise StateError(
                f"{where}: item {i} of the data is a {type(item).__name__}, not a RecordBatch"
            )


class BootstrappedState(KeyedStateSource):
    """A keyed state built from data (``Savepoint.with_keyed_state``).

    ``key``, ``value`` and ``user_key`` (map state) each name a column, several columns
    (a tuple of their values) or a function of the row as a dict. List state: every row
    is one element, a key's elements in input order. ``ttl_ts`` (for a state with a
    TTL): the wall-clock seconds of each row's last update, a column (or function) or
    one time for every row. Data given as an iterator is read
    once: writing the savepoint a second time raises.
    """

    def __init__(
        self,
        uid: str,
        name: str,
        data: Any,
        *,
        key: Column,
        value: Column | None,
        user_key: Column | None,
        kind: str,
        serializer: Serializer,
        version: int,
        ttl_ts: Column | float | None = None,
    ) -> None:
        if kind not in BOOTSTRAP_KINDS:
            raise StateError(
                f"operator {uid!r}, state {name!r}: kind must be one of {BOOTSTRAP_KINDS}, got {kind!r}"
            )
        if (kind == "map") != (user_key is not None):
            raise StateError(
                f"operator {uid!r}, state {name!r}: map state needs user_key=, other kinds take none"
            )
        checked_version(version, f"operator {uid!r}, state {name!r}")
        self.uid, self.name, self.kind = uid, name, kind
        self.data = data
        self.key, self.value, self.user_key = key, value, user_key
        self.ttl_ts = ttl_ts
        self._meta = StateMeta(kind, serializer)
        self.version = version
        self._seen: set[type] = set()
        self._read_once = isinstance(data, Iterator)
        self._read = False

    def meta(self) -> StateMeta:
        return self._meta

    def schema(self) -> StateSchema:
        return StateSchema(self.version, shapes_of_types(self._seen))

    def _column(self, batch: pa.RecordBatch, spec: Column | None, what: str) -> list[Any]:
        if spec is None:  # the value: every column but the key's, as a dict per row
            return batch.to_pylist()
        if callable(spec):
            return [spec(row) for row in batch.to_pylist()]
        names = [spec] if isinstance(spec, str) else list(spec)
        missing = [n for n in names if n not in batch.schema.names]
        if missing:
            raise StateError(
                f"operator {self.uid!r}, state {self.name!r}: the {what} column {missing[0]!r} "
                f"is not in the data (its columns: {batch.schema.names})"
            )
        columns = [batch.column(n).to_pylist() for n in names]
        if isinstance(spec, str):
            return columns[0]
        return list(zip(*columns, strict=True))

    def batches(self, max_parallelism: int) -> Iterator[pa.RecordBatch]:
        if self._read_once and self._read:
            raise StateError(
                f"operator {self.uid!r}, state {self.name!r}: its data was an iterator, "
                "already read by an earlier write; give a table or a re-iterable source"
            )
        self._read = True
        where = f"operator {self.uid!r}, state {self.name!r}"
        encoder = _Encoder(self.uid, self.name, self._meta, max_parallelism)
        done = 0
        for batch in record_batches(self.data, where):
            keys = self._column(batch, self.key, "key")
            self._check_nulls(keys, done, "key")
            values = self._column(batch, self.value, "value")
            user_keys = None
            if self.user_key is not None:
                user_keys = self._column(batch, self.user_key, "user key")
                self._check_nulls(user_keys, done, "user key")
            yield encoder.encode(done, keys, values, user_keys=user_keys, ttls=self._ttls(batch))
            done += batch.num_rows
        self._seen = encoder.seen

    def _ttls(self, batch: pa.RecordBatch) -> list[float | None] | None:
        """The rows' TTL timestamps: a column's, or one time for every row."""
        spec = self.ttl_ts
        if spec is None:
            return None
        if isinstance(spec, (int, float)):
            return [float(spec)] * batch.num_rows
        return [None if t is None else float(t) for t in self._column(batch, spec, "ttl_ts")]

    def _check_nulls(self, values: list[Any], first_row: int, what: str) -> None:
        spec = self.key if what == "key" else self.user_key
        for i, v in enumerate(values):
            if v is None or (isinstance(v, tuple) and None in v):
                column = (
                    spec
                    if isinstance(spec, str)
                    else list(spec)
                    if isinstance(spec, Sequence)
                    else "(function)"
                )
                raise StateError(
                    f"operator {self.uid!r}, state {self.name!r}, row {first_row + i}: the "
                    f"{what} (column {column!r}) is null"
                )


# ---------------------------------------------------------------- transform


class _DerivedState(KeyedStateSource):
    """A state computed from ``base``'s rows by ``fn``: ``base``'s serializer, the
    given ``version`` (else ``base``'s) and the shapes of the values it wrote."""

    def __init__(
        self, base: KeyedStateSource, fn: Callable[[Any], Any], *, version: int | None = None
    ) -> None:
        self.base = base
        self.uid, self.name, self.kind = base.uid, base.name, base.kind
        self.fn = fn
        self.version = version
        self._seen: set[type] = set()

    def meta(self) -> StateMeta:
        return self.base.meta()

    def schema(self) -> StateSchema:
        version = self.version if self.version is not None else self.base.schema().version
        return StateSchema(version, shapes_of_types(self._seen))


class TransformedState(_DerivedState):
    """``base``'s rows through ``fn``, a function from a ``pyarrow.RecordBatch`` with
    the columns ``read_keyed_state`` gives (``key``, ``value``, ``namespace``,
    ``user_key``, ``ttl_ts``) to a batch (or table) with at least ``key`` and ``value``:
    rows it drops are deleted, keys it changes move to their key groups.
    """

    def _arrow(self, rows: dict[str, list[Any]]) -> pa.RecordBatch:
        arrays = []
        for name, values in rows.items():
            try:
                arrays.append(pa.array(values, pa.float64() if name == "ttl_ts" else None))
            except (
                pa.ArrowInvalid,
                pa.ArrowTypeError,
                TypeError,
                ValueError,
                OverflowError,
            ) as err:
                raise StateError(
                    f"operator {self.uid!r}, state {self.name!r}: its {name}s do not fit one "
                    f"Arrow type ({err}); transform works on Arrow batches, use "
                    "map_values(uid, name, fn) to change values as Python objects"
                ) from err
        return pa.RecordBatch.from_arrays(arrays, names=list(rows))

    def batches(self, max_parallelism: int) -> Iterator[pa.RecordBatch]:
        meta = self.meta()
        encoder = _Encoder(self.uid, self.name, meta, max_parallelism)
        done = 0
        for batch in self.base.batches(max_parallelism):
            out = self.fn(self._arrow(_decoded(batch, meta)))
            for part in self._result_batches(out):
                cols = part.to_pydict()
                n = part.num_rows
                yield encoder.encode(
                    done,
                    cols["key"],
                    cols["value"],
                    cols.get("namespace"),
                    cols.get("user_key"),
                    cols.get("ttl_ts"),
                )
                done += n
        self._seen = encoder.seen

    def _result_batches(self, out: Any) -> list[pa.RecordBatch]:
        if isinstance(out, pa.Table):
            parts = out.to_batches()
        elif isinstance(out, pa.RecordBatch):
            parts = [out]
        else:
            raise StateError(
                f"operator {self.uid!r}, state {self.name!r}: the transform returned a "
                f"{type(out).__name__}, not a pyarrow RecordBatch or Table"
            )
        for part in parts:
            missing = [c for c in ("key", "value") if c not in part.schema.names]
            if base_kind(self.kind) == "map" and "user_key" not in part.schema.names:
                missing.append("user_key")
            if missing:
                raise StateError(
                    f"operator {self.uid!r}, state {self.name!r}: the transform's batch lacks "
                    f"column {missing[0]!r} (it has {part.schema.names})"
                )
        return parts


class MappedValues(_DerivedState):
    """``base``'s rows with every value (list state: element; map state: map value)
    replaced by ``fn(value)``; keys, namespaces and user keys stay as they are."""

    def batches(self, max_parallelism: int) -> Iterator[pa.RecordBatch]:
        serializer = self.meta().serializer
        fn = self.fn
        for batch in self.base.batches(max_parallelism):
            values = [fn(serializer.loads(v)) for v in batch.column("value").to_pylist()]
            self._seen.update(map(type, values))
            dumped = pa.array([serializer.dumps(v) for v in values], pa.binary())
            yield batch.set_column(5, "value", dumped)
