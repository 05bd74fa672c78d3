"""An exactly-once file sink built on :class:`TwoPhaseCommitSinkWriter`.

Formats: ``"jsonl"`` (``json.dumps`` per record), ``"csv"`` (dict records under a
header taken from the file's first record, or tuples/lists as bare rows) and
``"parquet"`` (dict records, one Arrow table per file). JSON lines and CSV are row
formats: a part file rolls by :class:`RollingPolicy` (records, bytes, age) and at every
checkpoint. Parquet is a bulk format: its rows are buffered and the file is written
whole when it rolls, at every checkpoint (or by ``max_records``).

The sink takes rows or Arrow record batches (a columnar stream, no ``to_rows()``); a
batch is written without the runtime's ``_ts`` and ``_kg`` columns:

* parquet: the batches are buffered and written as one table, with their Arrow types;
  a part file's schema is its first batch's, and a batch of another schema fails the
  job naming both (rows joining a file of batches are converted to its schema);
* csv: ``pyarrow.csv.write_csv`` (header from the batch's column names on a new file;
  strings quoted; timestamps ``2026-11-28 10:00:00.123``, then ``Z`` (UTC) or the offset,
  decimals as numbers, booleans ``true``/``false``, nulls empty);
* jsonl: one object per row, spaced as ``json.dumps`` spaces dict rows; timestamps,
  dates and times as ISO-8601 strings to the column's precision (``Z`` or the offset
  after a time-zoned one), decimals as strings, binaries as base64
  (:mod:`epochstream.connectors.batchform`).

One transaction is one file, moving through three names in the sink directory::

    .part-<subtask>-<job8>-a<attempt>-<seq>.<ext>.inprogress   being written
    .part-<subtask>-<job8>-a<attempt>-<seq>.<ext>.pending      pre-committed (fsynced, closed)
     part-<subtask>-<job8>-a<attempt>-<seq>.<ext>              committed (visible)

``job8`` is the first 8 characters of the job id (characters other than letters,
digits, ``_`` and ``-`` become ``_``), ``attempt`` the job's restart count and ``seq``
a per-writer counter (6 digits, zero-padded), so names never collide across subtasks,
checkpoints, attempts or jobs. Readers of the directory should ignore names starting
with ``.`` or ``_`` (Spark's ``spark.read.parquet(dir)`` does). Only one job should
write into a sink directory at a time: recovery deletes the hidden files of other jobs
and attempts.

Commit is ``os.replace(pending, final)`` followed by an fsync of the directory; it is
idempotent (final present and pending gone means committed already). On restore,
subtask 0 commits every recovered pending file (the union of all subtasks' entries)
and deletes every in-progress or pending file of this sink's naming scheme that is
neither recovered nor written by the current ``(job_id, attempt)``.

A restored job whose sink now points at another directory: a pending file belongs to
the checkpoint that covers its records, so it is committed where it was written (the
old directory, with a warning), or, if that directory is gone, in the new directory
when the file was moved along with it. A pending file found in neither fails the job
at once (no restarts) naming both places: its records are covered by the checkpoint,
so committing nothing would lose them silently.

A changelog (an updating SQL result, ``_op`` row kinds) is written with
``changelog_column="op"``: the kinds become the first column, a string (``+I``,
``-U``, ``+U``, ``-D``), and every change is a row, so reading the files in order and
applying them (or summing each row's sign) gives the result.

Partitioned output (``partition_by``, Flink's and Hive's layout): each row goes to the
sub-directory of its partition columns' values, ``<col>=<value>/`` per column, in the
order given (``day=2026-11-28/hour=10/part-...``); the files hold the other columns. A
batch's value is its Arrow cast to a string (timestamps ``2026-11-28 10:00:00.000``), a
dict record's ``str(value)``, with ``%XX`` for the characters a directory name cannot
hold (``/``, ``=``, ``%``, ...); a null or empty value is ``__DEFAULT_PARTITION__``
(Flink's default name). A transaction is then one
file per partition it wrote into, all committed together, and recovery looks for
leftovers in the partition directories too.

Guarantee: exactly-once with checkpointing on (two-phase commit); at-least-once
without.

Example::

    sink = FileSink("/out/counts", format="parquet")
    daily = FileSink("/out/daily", format="parquet", partition_by=("day",))
    writer = sink.create_writer(SinkContext(0, 2, attempt=0, job_id=job_id, checkpointing=True))
"""

from __future__ import annotations

import csv
import io
import json
import logging
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from epochstream.connectors.base import Sink, SinkContext
from epochstream.connectors.batchform import is_batch, json_rows, user_columns
from epochstream.connectors.twophase import TwoPhaseCommitSinkWriter
from epochstream.core.changelog import OP, KindsToColumn
from epochstream.core.private_files import fsync_directory
from epochstream.exceptions import ConfigurationError, DataError, SinkError, short_repr

__all__ = [
    "DEFAULT_PARTITION",
    "FileCommittable",
    "FileSink",
    "FileSinkWriter",
    "FileTxn",
    "RollingPolicy",
    "partition_directory",
]

log = logging.getLogger(__name__)

_INPROGRESS = ".inprogress"
_PENDING = ".pending"
# Every hidden file this sink's naming scheme produces, whatever job or attempt made it.
_HIDDEN_PART = re.compile(
    r"^\.part-\d+-.*-a\d+-\d+\.(?:jsonl|csv|parquet)\.(?:inprogress|pending)$"
)
FORMATS = ("jsonl", "csv", "parquet")
_UNSAFE_NAME_CHARS = re.compile(r"[^A-Za-z0-9_-]")
#: The directory name of a null partition value (Flink's 'partition.default-name').
DEFAULT_PARTITION = "__DEFAULT_PARTITION__"
# Escaped as %XX in a partition directory name: Hive's and Flink's set (path separators,
# '=' between column and value, '%' itself, and characters file systems refuse).
_ESCAPED = frozenset("\"#%'*/:=?\\\x7f{[]^") | frozenset(chr(c) for c in range(0x20))


def partition_directory(column: str, value: str | None) -> str:
    """The directory of one partition column's value: ``<column>=<value>``, escaped.

    Example: ``partition_directory("city", "a/b") == "city=a%2Fb"``; a null or empty
    value is :data:`DEFAULT_PARTITION`.
    """

    def escape(text: str) -> str:
        return "".join(f"%{ord(c):02X}" if c in _ESCAPED else c for c in text)

    # Flink's partition computer: an empty value goes to the default partition too.
    shown = escape(value) if value else DEFAULT_PARTITION
    return f"{escape(column)}={shown}"


@dataclass(frozen=True)
class FileCommittable:
    """The checkpoint entry of a pre-committed file: names in the directory it was written to.

    ``directory`` is where the file was written; if it is gone at restore, the names
    are looked up in the sink's current directory (the output was moved or mounted
    elsewhere).

    Example::

        FileCommittable(pending=".part-0-3f2a9c1e-a0-000001.jsonl.pending",
                        final="part-0-3f2a9c1e-a0-000001.jsonl", directory="/out")
    """

    pending: str
    final: str
    directory: str | None = None


@dataclass(frozen=True)
class RollingPolicy:
    """When a part file rolls besides at every checkpoint: after ``max_records`` records,
    ``max_bytes`` bytes (row formats) or ``max_seconds`` since its first record (checked
    as records arrive). None: no such limit.

    Example::

        FileSink("/out", rolling=RollingPolicy(max_bytes=128 << 20, max_seconds=60))
    """

    max_records: int | None = None
    max_bytes: int | None = None
    max_seconds: float | None = None

    def __post_init__(self) -> None:
        for name in ("max_records", "max_bytes", "max_seconds"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ConfigurationError(f"RollingPolicy {name} must be > 0, got {value!r}")


@dataclass
class FileTxn:
    """One part file; the file is created on the first write, so empty txns leave none.

    ``size`` counts bytes written, ``opened`` is the monotonic time of the first write,
    ``rows`` buffers a bulk format's records until a batch arrives, ``tables`` its
    Arrow data from then on (of the one ``schema``), and ``columns`` is a CSV file's
    header. ``subdir`` is a partition's directory (relative; "" unpartitioned). A
    partitioned sink's transaction holds no file itself: ``parts`` has one FileTxn per
    partition directory written into.

    Example::

        FileTxn(base="part-0-3f2a9c1e-a0-000001.jsonl")
    """

    base: str
    subdir: str = ""
    parts: dict[str, FileTxn] = field(default_factory=dict)
    file: BinaryIO | None = None
    size: int = 0
    opened: float | None = None
    rows: list[Any] = field(default_factory=list)
    tables: list[Any] = field(default_factory=list)
    schema: Any = None
    columns: list[str] | None = None

    @property
    def inprogress(self) -> str:
        """The hidden name while being written (relative to the sink directory)."""
        return os.path.join(self.subdir, f".{self.base}{_INPROGRESS}")

    @property
    def pending(self) -> str:
        """The hidden name once pre-committed (relative to the sink directory)."""
        return os.path.join(self.subdir, f".{self.base}{_PENDING}")

    @property
    def final(self) -> str:
        """The visible name once committed (relative to the sink directory)."""
        return os.path.join(self.subdir, self.base)


class FileSink(Sink):
    """Writes records into part files in ``path`` (module docstring).

    Guarantee: exactly-once with checkpointing on (two-phase commit), else at-least-once.
    Takes rows or Arrow record batches (module docstring for what a batch writes).

    ``format``: ``"jsonl"``, ``"csv"`` or ``"parquet"``. ``rolling``: a
    :class:`RollingPolicy`; ``roll_records=n`` is short for
    ``RollingPolicy(max_records=n)``. ``partition_by``: column names; each row is
    written under ``<col>=<value>/`` directories without those columns (module
    docstring). Records are then Arrow batches or dicts. ``changelog_column``: a
    changelog's row kinds (``_op``) are written as a first string column of that name
    (``+I``, ``-U``, ``+U``, ``-D``, as ``DataStream.to_changelog`` writes them; rows
    and batches without ``_op`` are ``+I``), so the files hold every change.

    Example::

        env.from_collection(data).sink_to(FileSink("/tmp/out", format="parquet"))
        changes.sink_to(FileSink("/tmp/changes", format="parquet", changelog_column="op"))
        stream.sink_to(FileSink("/tmp/by_city", format="parquet", partition_by=("city",)))
    """

    transactional = True
    accepts_batches = True

    def __init__(
        self,
        path: str | os.PathLike[str],
        format: str = "jsonl",
        *,
        roll_records: int | None = None,
        rolling: RollingPolicy | None = None,
        partition_by: tuple[str, ...] | list[str] = (),
        changelog_column: str | None = None,
    ) -> None:
        if format not in FORMATS:
            raise ConfigurationError(f"FileSink format must be one of {FORMATS}, got {format!r}")
        if roll_records is not None:
            if rolling is not None:
                raise ConfigurationError("FileSink: pass roll_records or rolling, not both")
            if roll_records < 1:
                raise ConfigurationError(f"FileSink roll_records must be >= 1, got {roll_records}")
            rolling = RollingPolicy(max_records=roll_records)
        # Absolute now, in the driver: slots may run with another working directory.
        self.path = os.path.abspath(os.fspath(path))
        self.format = format
        self.rolling = rolling or RollingPolicy()
        if isinstance(partition_by, str) or not all(isinstance(c, str) and c for c in partition_by):
            raise ConfigurationError(
                f"FileSink partition_by must be a sequence of column names, got {partition_by!r}"
            )
        if len(set(partition_by)) != len(partition_by):
            raise ConfigurationError(f"FileSink partition_by names a column twice: {partition_by}")
        self.partition_by = tuple(partition_by)
        if changelog_column is not None and (not changelog_column or changelog_column == OP):
            raise ConfigurationError(
                f"FileSink changelog_column must name a new column, got {changelog_column!r}"
            )
        if changelog_column in self.partition_by:
            raise ConfigurationError(
                f"FileSink changelog_column {changelog_column!r} is a partition column"
            )
        self.changelog_column = changelog_column

    def create_writer(self, ctx: SinkContext) -> FileSinkWriter:
        return FileSinkWriter(
            self.path,
            ctx,
            format=self.format,
            rolling=self.rolling,
            partition_by=self.partition_by,
            changelog_column=self.changelog_column,
        )

    def exclusive_target(self) -> str:
        # Part names hold the subtask, job and attempt, not the sink; a restored writer
        # also removes its directory's leftovers, which would be another sink's files.
        return f"directory {os.path.realpath(self.path)}"


class FileSinkWriter(TwoPhaseCommitSinkWriter[FileTxn]):
    """One subtask's writer of a :class:`FileSink`; creates the directory if missing.

    Example::

        w = FileSinkWriter("/out", ctx)
        w.restore([])
        w.write_batch([{"word": "a", "n": 1}])
    """

    def __init__(
        self,
        directory: str,
        ctx: SinkContext,
        *,
        format: str = "jsonl",
        rolling: RollingPolicy | None = None,
        partition_by: tuple[str, ...] = (),
        changelog_column: str | None = None,
    ) -> None:
        rolling = rolling or RollingPolicy()
        super().__init__(ctx, roll_records=rolling.max_records)
        self.directory = directory
        self.format = format
        self._rolling = rolling
        self._partition_by = partition_by
        self._kinds = None if changelog_column is None else KindsToColumn(changelog_column)
        os.makedirs(directory, exist_ok=True)
        job8 = _UNSAFE_NAME_CHARS.sub("_", ctx.job_id[:8])
        self._stem = f"part-{ctx.subtask_index}-{job8}-a{ctx.attempt}-"
        self._own_attempt = re.compile(
            rf"^\.part-\d+-{re.escape(job8)}-a{ctx.attempt}-\d+\.{format}\.(?:inprogress|pending)$"
        )
        self._seq = 0

    # -- transaction hooks -------------------------------------------------------------

    def begin_transaction(self) -> FileTxn:
        self._seq += 1
        return FileTxn(base=f"{self._stem}{self._seq:06d}.{self.format}")

    def write(self, txn: FileTxn, records: list[Any]) -> None:
        if txn.opened is None:
            txn.opened = time.monotonic()
        if self._kinds is not None:
            records = self._with_kinds(records)
        if not self._partition_by:
            self._write_file(txn, records)
            return
        for subdir, rows in self._partitions(records):
            part = txn.parts.get(subdir)
            if part is None:
                part = txn.parts[subdir] = FileTxn(base=txn.base, subdir=subdir)
                self._make_directory(subdir)
            self._write_file(part, rows)
        txn.size = sum(part.size for part in txn.parts.values())

    def _write_file(self, txn: FileTxn, records: Any) -> None:
        if self.format == "parquet":
            self._buffer_parquet(txn, records)  # a bulk format: written whole at pre-commit
            return
        if is_batch(records):
            batch = user_columns(records)
            data = (
                self._encode_jsonl_batch(batch)
                if self.format == "jsonl"
                else self._encode_csv_batch(txn, batch)
            )
        else:
            data = (
                self._encode_jsonl(records)
                if self.format == "jsonl"
                else self._encode_csv(txn, records)
            )
        if txn.file is None:
            # "xb": a name clash would mean two writers share a file; fail instead.
            txn.file = open(self._path(txn.inprogress), "xb")
        txn.file.write(data)
        txn.size += len(data)

    def is_full(self, txn: FileTxn) -> bool:
        policy = self._rolling
        if policy.max_bytes is not None and txn.size >= policy.max_bytes:
            return True
        return (
            policy.max_seconds is not None
            and txn.opened is not None
            and time.monotonic() - txn.opened >= policy.max_seconds
        )

    def pre_commit(self, txn: FileTxn) -> None:
        if self._partition_by:
            for part in txn.parts.values():
                self._pre_commit_file(part)
            return
        self._pre_commit_file(txn)

    def _pre_commit_file(self, txn: FileTxn) -> None:
        if txn.rows or txn.tables:
            self._write_parquet(txn)
        f = txn.file
        if f is None:
            raise SinkError(f"FileSink: pre-commit of {self._path(txn.inprogress)} with no data")
        f.flush()
        os.fsync(f.fileno())
        f.close()
        txn.file = None
        os.replace(self._path(txn.inprogress), self._path(txn.pending))
        fsync_directory(os.path.dirname(self._path(txn.pending)))

    def commit(self, txn: FileTxn) -> None:
        handle = self.txn_handle(txn)
        for entry in handle if isinstance(handle, tuple) else (handle,):
            self._commit_entry(entry)

    def abort(self, txn: FileTxn) -> None:
        for part in txn.parts.values():
            self.abort(part)
        txn.rows = []
        txn.tables = []
        if txn.file is not None:
            txn.file.close()
            txn.file = None
        for name in (txn.inprogress, txn.pending):
            try:
                os.remove(self._path(name))
            except FileNotFoundError:
                continue

    def txn_handle(self, txn: FileTxn) -> FileCommittable | tuple[FileCommittable, ...]:
        """One file's entry; a partitioned transaction's files' entries, as a tuple."""
        if self._partition_by:
            return tuple(
                FileCommittable(pending=p.pending, final=p.final, directory=self.directory)
                for p in txn.parts.values()
            )
        return FileCommittable(pending=txn.pending, final=txn.final, directory=self.directory)

    def recover(self, entries: list[Any]) -> None:
        """Subtask 0 commits all recovered files and deletes leftovers; others do nothing."""
        if self.ctx.subtask_index != 0:
            return
        recovered: set[str] = set()
        files = [f for e in entries for f in (e if isinstance(e, tuple) else (e,))]
        for entry in files:
            if not isinstance(entry, FileCommittable):
                raise SinkError(
                    f"FileSink {self.directory!r}: cannot recover a "
                    f"{type(entry).__qualname__} entry: {entry!r}"
                )
            self._commit_entry(entry)
            recovered.add(entry.pending)
        self._remove_leftovers(recovered)

    # -- internals ---------------------------------------------------------------------

    def _path(self, name: str) -> str:
        return os.path.join(self.directory, name)

    def _commit_entry(self, entry: FileCommittable) -> None:
        written_in = getattr(entry, "directory", None) or self.directory
        places = [written_in] if written_in == self.directory else [written_in, self.directory]
        for directory in places:
            pending = os.path.join(directory, entry.pending)
            final = os.path.join(directory, entry.final)
            try:
                os.replace(pending, final)
            except FileNotFoundError:
                if os.path.exists(final):
                    return  # committed before: commit is idempotent
                continue
            fsync_directory(os.path.dirname(final))
            if directory != self.directory:
                log.warning(
                    "FileSink now writes to %s; committed %s of the restored checkpoint in %s, "
                    "where it was written",
                    self.directory,
                    entry.final,
                    directory,
                )
            return
        where = " nor in ".join(repr(d) for d in places)
        raise SinkError(
            f"FileSink: cannot commit {entry.final!r} of the restored checkpoint: neither its "
            f"pending file {entry.pending!r} nor the committed file is in {where}. The checkpoint "
            "covers its records, so they would be lost; restore the file, or give the sink a "
            "new uid and pass allow_non_restored_state=True to drop its pending output",
            retryable=False,
        )

    def _remove_leftovers(self, recovered: set[str]) -> None:
        for name in self._hidden_parts():
            base = os.path.basename(name)
            if (
                _HIDDEN_PART.match(base)
                and name not in recovered
                and not self._own_attempt.match(base)
            ):
                try:
                    os.remove(self._path(name))
                except FileNotFoundError:
                    continue  # removed meanwhile (an abort of the same file)

    def _hidden_parts(self) -> list[str]:
        """The hidden part files' names relative to the directory, in it and, when
        partitioned, in its partition directories (as deep as the partition columns)."""
        found: list[str] = []
        levels = [""]
        for depth in range(len(self._partition_by) + 1):
            deeper: list[str] = []
            for subdir in levels:
                try:
                    with os.scandir(self._path(subdir)) as entries:
                        for e in entries:
                            if e.name.startswith(".part-"):
                                found.append(os.path.join(subdir, e.name))
                            elif depth < len(self._partition_by) and e.is_dir():
                                deeper.append(os.path.join(subdir, e.name))
                except FileNotFoundError:
                    continue  # a partition directory removed meanwhile
            levels = deeper
        return found

    def _make_directory(self, subdir: str) -> None:
        """Create a partition directory; its new entries are made durable before a
        file in it is pre-committed (each parent fsynced)."""
        path = self.directory
        for name in subdir.split(os.sep):
            parent, path = path, os.path.join(path, name)
            if not os.path.isdir(path):
                os.makedirs(path, exist_ok=True)
                fsync_directory(parent)

    def _with_kinds(self, records: Any) -> Any:
        """``records`` with their row kinds as the changelog column, first."""
        assert self._kinds is not None
        if is_batch(records):
            try:
                return self._kinds(records)
            except DataError as exc:  # the column exists: every restart would fail alike
                raise SinkError(f"FileSink {self.directory!r}: {exc}", retryable=False) from exc
        column = self._kinds.column
        out = []
        for record in records:
            if not isinstance(record, dict) or column in record:
                raise self._record_error(
                    record, f"is not a dict without a {column!r} key (the changelog column)"
                )
            out.append({column: "+I", **record})
        return out

    def _partitions(self, records: Any) -> list[tuple[str, Any]]:
        """``(partition directory, its rows without the partition columns)`` of a batch
        or of dict records, in the order the partitions first occur."""
        columns = self._partition_by
        if is_batch(records):
            import pyarrow as pa

            batch = user_columns(records)
            missing = [c for c in columns if c not in batch.schema.names]
            if missing:
                raise self._partition_error(f"a batch of {batch.schema.names}", missing)
            keys = zip(
                *(batch.column(c).cast(pa.string()).to_pylist() for c in columns),
                strict=True,
            )
            groups: dict[tuple[Any, ...], list[int]] = {}
            for i, key in enumerate(keys):
                groups.setdefault(key, []).append(i)
            rest = batch.select([n for n in batch.schema.names if n not in columns])
            return [
                (self._subdir(key), rest.take(pa.array(rows, pa.int64())))
                for key, rows in groups.items()
            ]
        grouped: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
        for record in records:
            if not isinstance(record, dict):
                raise self._record_error(record, f"is not a dict (partitioned by {columns})")
            missing = [c for c in columns if c not in record]
            if missing:
                raise self._partition_error(f"record {short_repr(record)}", missing)
            key = tuple(None if record[c] is None else str(record[c]) for c in columns)
            rest = {k: v for k, v in record.items() if k not in columns}
            grouped.setdefault(key, []).append(rest)
        return [(self._subdir(key), rows) for key, rows in grouped.items()]

    def _subdir(self, key: tuple[Any, ...]) -> str:
        return os.path.join(
            *(partition_directory(c, v) for c, v in zip(self._partition_by, key, strict=True))
        )

    def _partition_error(self, what: str, missing: list[str]) -> SinkError:
        return SinkError(
            f"FileSink {self.directory!r}: {what} lacks the partition column(s) {missing}",
            retryable=False,  # the same records come back after every restart
        )

    def _encode_jsonl(self, records: list[Any]) -> bytes:
        try:
            text = "\n".join(map(json.dumps, records))
        except (TypeError, ValueError) as exc:
            raise self._encode_error(records, exc) from exc
        return (text + "\n").encode("utf-8")

    def _encode_csv(self, txn: FileTxn, records: list[Any]) -> bytes:
        buf = io.StringIO()
        out = csv.writer(buf, lineterminator="\n")
        if txn.columns is None and isinstance(records[0], dict):
            txn.columns = list(records[0])
            out.writerow(txn.columns)
        columns = txn.columns
        for record in records:
            if columns is not None:
                if not isinstance(record, dict) or list(record) != columns:
                    raise self._record_error(record, f"is not a dict with the columns {columns}")
                out.writerow(record.values())
            elif isinstance(record, list | tuple):
                out.writerow(record)
            else:
                raise self._record_error(record, "is neither a dict nor a tuple/list row")
        return buf.getvalue().encode("utf-8")

    def _encode_jsonl_batch(self, batch: Any) -> bytes:
        try:
            lines = json_rows(batch)
        except (TypeError, ValueError) as exc:
            raise SinkError(
                f"FileSink {self.directory!r} (jsonl): cannot encode a batch of "
                f"{batch.schema.names} as JSON: {exc}",
                retryable=False,  # the same batch comes back after every restart
            ) from exc
        return ("\n".join(lines) + "\n").encode("utf-8")

    def _encode_csv_batch(self, txn: FileTxn, batch: Any) -> bytes:
        import pyarrow as pa
        import pyarrow.csv as pacsv

        names = batch.schema.names
        if txn.columns is not None and names != txn.columns:
            raise SinkError(
                f"FileSink {self.directory!r} (csv): a batch with the columns {names} does "
                f"not fit the file's header {txn.columns}",
                retryable=False,
            )
        header = txn.columns is None and txn.size == 0  # a file of bare rows takes none
        out = pa.BufferOutputStream()
        try:
            pacsv.write_csv(batch, out, write_options=pacsv.WriteOptions(include_header=header))
        except pa.ArrowException as exc:  # a list or struct column, for one
            raise SinkError(
                f"FileSink {self.directory!r} (csv): cannot write a batch of {batch.schema.names} "
                f"as CSV: {exc}",
                retryable=False,  # the same batch comes back after every restart
            ) from exc
        if header:
            txn.columns = names
        return out.getvalue().to_pybytes()

    def _buffer_parquet(self, txn: FileTxn, records: Any) -> None:
        import pyarrow as pa

        if not is_batch(records):
            if txn.schema is None:
                txn.rows.extend(records)  # rows only so far: one table at pre-commit
            else:
                txn.tables.append(self._rows_as(records, txn.schema))
            return
        table = pa.Table.from_batches([user_columns(records)])
        if txn.schema is None:
            txn.schema = table.schema
            if txn.rows:  # rows came first: they take the batches' schema, in order
                txn.tables.append(self._rows_as(txn.rows, table.schema))
                txn.rows = []
        elif not table.schema.equals(txn.schema, check_metadata=False):
            raise SinkError(
                f"FileSink {self.directory!r} (parquet): a batch's schema differs from the "
                f"open part file {txn.inprogress!r}'s.\nFile schema:\n{txn.schema}\n"
                f"Batch schema:\n{table.schema}",
                retryable=False,  # the same batch comes back after every restart
            )
        txn.tables.append(table)

    def _rows_as(self, rows: list[Any], schema: Any) -> Any:
        import pyarrow as pa

        try:
            return pa.Table.from_pylist(rows, schema=schema)
        except (TypeError, ValueError, pa.ArrowException) as exc:
            raise SinkError(
                f"FileSink {self.directory!r} (parquet): {len(rows)} rows (first: "
                f"{short_repr(rows[0])}) do not fit the part file's schema {schema}: {exc}",
                retryable=False,
            ) from exc

    def _write_parquet(self, txn: FileTxn) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        where = f"FileSink {self.directory!r}"
        table = pa.concat_tables(txn.tables) if txn.tables else rows_to_table(txn.rows, where)
        txn.rows = []
        txn.tables = []
        txn.file = open(self._path(txn.inprogress), "xb")
        pq.write_table(table, txn.file)
        txn.size = txn.file.tell()

    def _record_error(self, record: Any, problem: str) -> SinkError:
        return SinkError(
            f"FileSink {self.directory!r} ({self.format}): record {short_repr(record)} of type "
            f"{type(record).__qualname__} {problem}",
            retryable=False,
        )

    def _encode_error(self, records: list[Any], batch_exc: Exception) -> SinkError:
        for record in records:
            try:
                json.dumps(record)
            except (TypeError, ValueError) as exc:
                return SinkError(
                    f"FileSink {self.directory!r}: cannot encode record {short_repr(record)} of type "
                    f"{type(record).__qualname__} as JSON: {exc}",
                    retryable=False,  # the same record comes back after every restart
                )
        return SinkError(f"FileSink {self.directory!r}: cannot encode a batch: {batch_exc}")


def rows_to_table(rows: list[Any], where: str) -> Any:
    """A ``pyarrow.Table`` of ``rows`` (dicts), or a ``SinkError`` naming ``where`` and the
    first row when they do not make one (not retryable: the rows come back on restart).

    Example: ``rows_to_table([{"a": 1}], "FileSink 'out'").num_rows == 1``
    """
    import pyarrow as pa

    try:
        return pa.Table.from_pylist(rows)
    except (TypeError, ValueError, pa.ArrowException) as exc:
        raise SinkError(
            f"{where}: cannot build an Arrow table from {len(rows)} records "
            f"(first: {short_repr(rows[0])}): {exc}",
            retryable=False,
        ) from exc
