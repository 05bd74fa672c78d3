"""Canonical savepoint rows partitioned by key group through local temporary files.

The savepoint writer (:mod:`epochstream.checkpoint.savepoint_writer`) gets the rows of an
operator's keyed states in any order (a Parquet file, a transformed savepoint), batch by
batch. A canonical state file needs them grouped: one record batch per key group, in
ascending key-group order (:func:`~epochstream.state.canonical.write_canonical`). A
:class:`KeyGroupSpill` appends each incoming batch, split by the key-group ranges of the
files it will write, to one Arrow IPC stream per range in a local scratch directory, so
only one batch is in memory while the input is read. Writing a range then reads its
stream back; a stream larger than ``memory_budget`` is first split again into smaller
key-group ranges (recursively), so a range is sorted in memory only when it fits the
budget, the one exception being a single key group larger than it (a canonical file
holds a key group as one record batch).

Rows keep their input order within a key group (the sort is stable), which list state
relies on: a key's elements are restored in the order they were given.

Example::

    with KeyGroupSpill(uid="counter", states=metas, ranges=[range(0, 64), range(64, 128)]) as spill:
        for batch in canonical_batches:   # CANONICAL_SCHEMA, key_group filled in
            spill.add(batch)
        handles = spill.write(fs, "/sp/new", "counter")   # one CanonicalSnapshotHandle per range
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from types import TracebackType
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from epochstream.exceptions import StateError
from epochstream.state.backends.base import base_kind
from epochstream.state.canonical import CANONICAL_SCHEMA, CanonicalRow, StateMeta, write_canonical
from epochstream.state.handles import CanonicalSnapshotHandle
from epochstream.state.keyformat import decode_key

if TYPE_CHECKING:
    from epochstream.core.filesystems import StorageFS

__all__ = ["DEFAULT_MEMORY_BUDGET", "KeyGroupSpill"]

#: Bytes of spilled rows one range may have before it is split again to be written.
DEFAULT_MEMORY_BUDGET = 64 << 20
#: Into how many key-group ranges a range over the budget is split.
_FANOUT = 16


class _RangeStreams:
    """One Arrow IPC stream file per key-group range; each batch appended is split by range."""

    def __init__(self, ranges: list[range], directory: str) -> None:
        self.ranges = ranges
        self.paths = [os.path.join(directory, f"kg-{r.start}-{r.stop}.arrows") for r in ranges]
        self._starts = np.array([r.start for r in ranges], dtype=np.int64)
        self._writers: list[Any] = [None] * len(ranges)

    def add(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        kgs = batch.column("key_group").to_numpy(zero_copy_only=False)
        where = np.searchsorted(self._starts, kgs, side="right") - 1
        for index in np.unique(where):
            part = batch.filter(pa.array(where == index))
            writer = self._writers[index]
            if writer is None:
                writer = self._writers[index] = pa.ipc.new_stream(
                    self.paths[index], CANONICAL_SCHEMA
                )
            writer.write_batch(part)

    def close(self) -> list[tuple[range, str | None]]:
        """Each range with its stream file (``None``: no rows fell into it)."""
        out: list[tuple[range, str | None]] = []
        for kgs, path, writer in zip(self.ranges, self.paths, self._writers, strict=True):
            if writer is not None:
                writer.close()
            out.append((kgs, path if writer is not None else None))
        return out


def _split(key_groups: range, parts: int) -> list[range]:
    n = len(key_groups)
    parts = min(parts, n)
    start = key_groups.start
    return [range(start + n * i // parts, start + n * (i + 1) // parts) for i in range(parts)]


class KeyGroupSpill:
    """Partitions one operator's canonical rows by key group and writes one canonical
    file per key-group range (see the module docstring).

    ``states``: every state whose rows are added, with its kind and serializer (the
    file's metadata); a value state's key, or a map state's user key of one key, must
    not repeat (checked as each key group is written: an error names the operator, the
    state and the key). ``ranges`` must partition ``0..max_parallelism-1``. The spilled
    rows go to a new directory in ``scratch_dir`` (default: the system's temporary
    directory), removed by :meth:`close`.
    """

    def __init__(
        self,
        *,
        uid: str,
        states: dict[str, StateMeta],
        ranges: list[range],
        memory_budget: int = DEFAULT_MEMORY_BUDGET,
        scratch_dir: str | None = None,
    ) -> None:
        self.uid = uid
        self.states = states
        self.memory_budget = memory_budget
        self._scratch = tempfile.mkdtemp(prefix="epochstream-savepoint-", dir=scratch_dir)
        self._streams = _RangeStreams(ranges, self._scratch)
        self._unique = {
            name: kind
            for name, m in states.items()
            if (kind := base_kind(m.kind)) in ("value", "map")
        }

    def __enter__(self) -> KeyGroupSpill:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Remove the scratch files."""
        shutil.rmtree(self._scratch, ignore_errors=True)

    def add(self, batch: pa.RecordBatch) -> None:
        """Spill ``batch`` (columns of :data:`CANONICAL_SCHEMA`, any key groups)."""
        unknown = set(pc.unique(batch.column("state")).to_pylist()) - set(self.states)
        if unknown:
            raise StateError(
                f"operator {self.uid!r}: rows of states {sorted(unknown)} the savepoint does "
                f"not declare (it has {sorted(self.states)})"
            )
        self._streams.add(batch)

    def write(self, fs: StorageFS, directory: str, name: str) -> list[CanonicalSnapshotHandle]:
        """Write one canonical file per range, ``<directory>/<name>-<i>.arrow``, and
        return their handles in range order. The spill cannot be added to afterwards."""
        handles = []
        for index, (kgs, stream) in enumerate(self._streams.close()):
            path = fs.join(directory, f"{name}-{index}.arrow")
            groups = self._groups(stream, kgs) if stream is not None else iter(())
            handle = write_canonical(fs, path, self.states, groups, key_groups=kgs)
            assert handle is not None
            handles.append(handle)
        return handles

    def _groups(self, stream: str, key_groups: range) -> Iterator[tuple[int, list[CanonicalRow]]]:
        """The rows of ``stream`` per key group, ascending (splitting it first when it
        is over the memory budget)."""
        if os.path.getsize(stream) <= self.memory_budget or len(key_groups) == 1:
            yield from self._sorted_groups(stream)
            return
        directory = tempfile.mkdtemp(dir=self._scratch)
        parts = _RangeStreams(_split(key_groups, _FANOUT), directory)
        with pa.ipc.open_stream(stream) as reader:
            for batch in reader:
                parts.add(batch)
        os.remove(stream)
        for part, path in parts.close():
            if path is not None:
                yield from self._groups(path, part)

    def _sorted_groups(self, stream: str) -> Iterator[tuple[int, list[CanonicalRow]]]:
        with pa.ipc.open_stream(stream) as reader:
            table = reader.read_all()
        os.remove(stream)
        # Arrow's sort is stable: a key's list elements keep their input order.
        table = table.take(pc.sort_indices(table, [("key_group", "ascending")]))
        kgs = table.column("key_group").to_numpy()
        bounds = np.flatnonzero(np.diff(kgs)) + 1
        starts = [0, *bounds.tolist()]
        stops = [*bounds.tolist(), len(kgs)]
        for start, stop in zip(starts, stops, strict=True):
            part = table.slice(start, stop - start).to_pydict()
            rows: list[CanonicalRow] = list(
                zip(
                    part["state"],
                    part["key"],
                    part["namespace"],
                    part["user_key"],
                    part["value"],
                    part["ttl_ts"],
                    strict=True,
                )
            )
            self._check_unique(rows)
            yield int(kgs[start]), rows

    def _check_unique(self, rows: list[CanonicalRow]) -> None:
        if not self._unique:
            return
        seen: set[tuple[Any, ...]] = set()
        for state, key, ns, user_key, _value, _ttl in rows:
            kind = self._unique.get(state)
            if kind is None:
                continue
            entry = (state, key, ns, user_key) if kind == "map" else (state, key, ns)
            if entry in seen:
                what = f"key {decode_key(key)!r}"
                if kind == "map" and user_key is not None:
                    what += f", user key {decode_key(user_key)!r},"
                if ns is not None:
                    what += f" (namespace {decode_key(ns)!r})"
                raise StateError(
                    f"operator {self.uid!r}, {kind} state {state!r}: {what} appears more "
                    "than once; a value state holds one value per key and a map state one "
                    "value per user key (aggregate the rows first, or use kind='list')"
                )
            seen.add(entry)
