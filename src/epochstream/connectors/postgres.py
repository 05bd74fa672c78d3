"""PostgreSQL sink (psycopg 3): two-phase commit, or idempotent upserts.

``mode="two_phase"`` (exactly-once): each subtask writes a checkpoint's rows into one
database transaction with ``COPY``; at the checkpoint's barrier it runs
``PREPARE TRANSACTION '<gid>'`` (the rows are durable but invisible) and, when the
checkpoint completes, ``COMMIT PREPARED '<gid>'``. The transaction id names sink, job,
attempt, subtask and checkpoint::

    es-<sink>-<job8>-a<attempt>-s<subtask>-c<checkpoint>-<seq>

``<sink>`` is ``sink_id`` (default: the table name, letters, digits and ``_`` kept).
Recovery, by subtask 0 with every subtask's entries of the restored checkpoint, commits
the prepared transactions the checkpoint recorded and rolls back every other prepared
transaction whose id starts with ``es-<sink>-`` and that the current attempt did not
make (left by a crash between a prepare and the checkpoint's completion), by scanning
``pg_prepared_xacts``. The server needs ``max_prepared_transactions`` > 0 (checked at
start). Two jobs must not write the same table under the same ``sink_id``.

``COMMIT PREPARED`` of an id the server no longer has prepared counts as committed
before (a restore repeats commits); a prepared transaction this sink's recovery rolled
back was never in a completed checkpoint, so nothing committed is rolled back.

``mode="upsert"`` (idempotent, effectively exactly-once for keyed results):
``INSERT ... ON CONFLICT (key_columns) DO UPDATE`` in batches (``executemany``),
committed at every checkpoint. Records replayed after a failure overwrite their keys
again, so the table converges to the failure-free result; between a failure and the
replay catching up, a key may show an older value. A changelog batch (an ``_op``
column, :mod:`epochstream.core.changelog`) is applied by key: a delete (``-D``) deletes
the key's row, ``+I``/``+U`` upsert it, ``-U`` (an update's old value) is skipped.

``mode="transactional_upsert"`` (exactly-once for keyed results and changelogs): the
changes of a checkpoint interval are folded by key (the last upsert or delete of each)
by each subtask and kept in the checkpoint; when it completes, the job master's
committer applies every subtask's changes in ONE transaction that also moves the
sink's row in ``epochstream_sink_checkpoints`` (created if missing; one row per sink)
to the checkpoint. The table moves from one checkpoint's state to the next at once,
and a recovery, which commits the restored checkpoint again, skips it. Output appears
one checkpoint interval late. Without checkpointing, each subtask applies its changes
at the end of the input.

Records are dicts (keys are column names) or tuples in column order. ``columns``
chooses the columns written (default: all of the table's, in table order).

The sink takes rows or Arrow record batches (a columnar stream, no ``to_rows()``): a
batch's columns are matched to the table's by name (the runtime's ``_ts`` and ``_kg``
are not written; a table column the batch lacks fails the job naming it), and each
row is written exactly as a row record would be (the same ``COPY`` into the same
prepared transaction, or the same upsert, last row of a key in a batch winning).
Values go through psycopg's adaptation of the Python values Arrow gives: integers,
floats, strings, booleans, ``Decimal`` (numeric), ``datetime``/``date``/``time``
(timestamp, timestamptz for a time-zoned column, date, time), ``bytes`` (bytea)
and lists (arrays); struct and map columns are not adapted (write them as JSON strings).

Example::

    counts.sink_to(es.sinks.PostgresSink("host=127.0.0.1 dbname=app", "word_counts"))
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any

from epochstream.connectors.base import GlobalCommitter, Sink, SinkContext, SinkWriter
from epochstream.connectors.batchform import is_batch, user_columns
from epochstream.connectors.twophase import TwoPhaseCommitSinkWriter
from epochstream.core.changelog import OP, RowKind
from epochstream.exceptions import ConfigurationError, SinkError, short_repr

__all__ = [
    "COMMITS_TABLE",
    "PgTxn",
    "PostgresSink",
    "PostgresTransactionalUpsertWriter",
    "PostgresTwoPhaseWriter",
    "PostgresUpsertWriter",
    "UpsertEntry",
]

log = logging.getLogger(__name__)

MODES = ("two_phase", "upsert", "transactional_upsert")
_UNSAFE = re.compile(r"[^A-Za-z0-9_]")


class PostgresSink(Sink):
    """Writes records into a PostgreSQL table (module docstring).

    Guarantee: ``mode="two_phase"`` exactly-once (PREPARE TRANSACTION / COMMIT
    PREPARED); ``mode="upsert"`` idempotent, effectively exactly-once for keyed results.
    Takes rows or Arrow record batches (columns matched by name; module docstring).

    Example::

        es.sinks.PostgresSink(dsn, "counts", mode="upsert", key_columns=["word"])
    """

    transactional = True
    accepts_batches = True

    def __init__(
        self,
        dsn: str,
        table: str,
        mode: str = "two_phase",
        key_columns: list[str] | None = None,
        *,
        columns: list[str] | None = None,
        sink_id: str | None = None,
    ) -> None:
        if mode not in MODES:
            raise ConfigurationError(f"PostgresSink mode must be one of {MODES}, got {mode!r}")
        if mode != "two_phase" and not key_columns:
            raise ConfigurationError(f"PostgresSink mode={mode!r} needs key_columns")
        if mode == "two_phase" and key_columns:
            raise ConfigurationError(
                "PostgresSink key_columns apply to mode='upsert' and 'transactional_upsert' only"
            )
        if not table:
            raise ConfigurationError("PostgresSink needs a table name")
        self.dsn = dsn
        self.table = table
        self.mode = mode
        self.key_columns = list(key_columns or [])
        self.columns = list(columns) if columns is not None else None
        self.sink_id = _UNSAFE.sub("_", sink_id or table)
        self.transactional = mode != "upsert"

    def create_committer(self, job_id: str) -> GlobalCommitter | None:
        """``transactional_upsert``: the job master applies each checkpoint's changes of
        every subtask in one transaction (:class:`PostgresUpsertCommitter`)."""
        return PostgresUpsertCommitter(self) if self.mode == "transactional_upsert" else None

    def create_writer(self, ctx: SinkContext) -> SinkWriter:
        if self.mode == "two_phase":
            return PostgresTwoPhaseWriter(self, ctx)
        if self.mode == "transactional_upsert":
            return PostgresTransactionalUpsertWriter(self, ctx)
        return PostgresUpsertWriter(self, ctx)


class _Table:
    """Connections, column order and row conversion shared by both writers."""

    def __init__(self, sink: PostgresSink) -> None:
        import psycopg
        from psycopg import sql

        self.sink = sink
        try:
            self.conn = psycopg.connect(sink.dsn)
            self.admin = psycopg.connect(sink.dsn, autocommit=True)
        except psycopg.OperationalError as exc:
            raise SinkError(f"PostgresSink {sink.table!r}: cannot connect: {exc}") from exc
        self.columns = self._columns()
        self.ident = sql.Identifier(*sink.table.split("."))
        self.column_list = sql.SQL(", ").join(map(sql.Identifier, self.columns))

    def _columns(self) -> list[str]:
        schema, _, name = self.sink.table.rpartition(".")
        rows = self.admin.execute(
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_schema = coalesce(nullif(%s, ''), current_schema()) AND table_name = %s "
            "ORDER BY ordinal_position",
            (schema, name),
        ).fetchall()
        existing = [r[0] for r in rows]
        if not existing:
            raise ConfigurationError(f"PostgresSink: table {self.sink.table!r} does not exist")
        wanted = self.sink.columns or existing
        missing = [c for c in [*wanted, *self.sink.key_columns] if c not in existing]
        if missing:
            raise ConfigurationError(
                f"PostgresSink: table {self.sink.table!r} has no columns {missing} "
                f"(it has {existing})"
            )
        return wanted

    def rows(self, records: Any) -> list[tuple[Any, ...]]:
        """Records (a list of rows or a record batch) as tuples in column order;
        SinkError naming a record or column that does not fit."""
        if is_batch(records):
            return self._batch_rows(records)
        columns = self.columns
        width = len(columns)
        try:
            if isinstance(records[0], dict):
                return [tuple([r[c] for c in columns]) for r in records]
            out = [tuple(r) for r in records]
        except (KeyError, TypeError):
            out = []
        if out and all(len(r) == width for r in out):
            return out
        return [self._row(record) for record in records]  # mixed or bad: one by one

    def _batch_rows(self, batch: Any) -> list[tuple[Any, ...]]:
        batch = user_columns(batch)
        names = batch.schema.names
        missing = [c for c in self.columns if c not in names]
        if missing:
            raise SinkError(
                f"PostgresSink {self.sink.table!r}: a batch with the columns {names} lacks "
                f"{missing} of the columns written {self.columns}",
                retryable=False,
            )
        # One Python list per column, zipped: no dict per row.
        values = [batch.column(c).to_pylist() for c in self.columns]
        return list(zip(*values, strict=True))

    def _row(self, record: Any) -> tuple[Any, ...]:
        columns = self.columns
        if isinstance(record, dict):
            if not all(c in record for c in columns):
                raise self.bad_record(record, f"lacks columns of {columns}")
            return tuple([record[c] for c in columns])
        if not isinstance(record, tuple | list) or len(record) != len(columns):
            raise self.bad_record(record, f"is not a dict or a {len(columns)}-tuple for {columns}")
        return tuple(record)

    def bad_record(self, record: Any, problem: str) -> SinkError:
        text = short_repr(record)
        return SinkError(
            f"PostgresSink {self.sink.table!r}: record {text} {problem}", retryable=False
        )

    def close(self) -> None:
        self.conn.close()
        self.admin.close()


@dataclass
class PgTxn:
    """One database transaction of a writer; ``gid`` is set when it is prepared.

    Example::

        PgTxn(seq=3, gid="es-counts-3f2a9c1e-a0-s1-c7-3")
    """

    seq: int
    gid: str | None = None


class PostgresTwoPhaseWriter(TwoPhaseCommitSinkWriter[PgTxn]):
    """A subtask's two-phase-commit writer (``PREPARE TRANSACTION`` at the snapshot).

    Example::

        w = PostgresTwoPhaseWriter(sink, ctx); w.restore([]); w.write_batch(rows)
        gids = w.snapshot(1); w.notify_checkpoint_complete(1)
    """

    def __init__(self, sink: PostgresSink, ctx: SinkContext) -> None:
        super().__init__(ctx)
        self._table = _Table(sink)
        self._prefix = f"es-{sink.sink_id}-"
        job8 = _UNSAFE.sub("_", ctx.job_id[:8])
        self._own = f"{self._prefix}{job8}-a{ctx.attempt}-"
        self._checkpoint_id = 0
        self._seq = 0
        prepared = self._table.admin.execute("SHOW max_prepared_transactions").fetchone()
        if prepared is None or int(prepared[0]) < 1:
            raise ConfigurationError(
                f"PostgresSink {sink.table!r}: the server has max_prepared_transactions = 0; "
                "set it above the sink's parallelism times the checkpoints in flight"
            )

    def snapshot(self, checkpoint_id: int) -> list[Any]:
        self._checkpoint_id = checkpoint_id  # names the transaction prepared now
        return super().snapshot(checkpoint_id)

    def begin_transaction(self) -> PgTxn:
        self._seq += 1
        return PgTxn(self._seq)

    def write(self, txn: PgTxn, records: Any) -> None:
        from psycopg import sql

        rows = self._table.rows(records)
        query = sql.SQL("COPY {} ({}) FROM STDIN").format(
            self._table.ident, self._table.column_list
        )
        with self._table.conn.cursor() as cur, cur.copy(query) as copy:
            for row in rows:
                copy.write_row(row)

    def pre_commit(self, txn: PgTxn) -> None:
        gid = f"{self._own}s{self.ctx.subtask_index}-c{self._checkpoint_id}-{txn.seq}"
        self._table.conn.execute(_gid_statement("PREPARE TRANSACTION", gid))
        txn.gid = gid

    def commit(self, txn: PgTxn) -> None:
        assert txn.gid is not None
        self._commit_gid(txn.gid)

    def abort(self, txn: PgTxn) -> None:
        if txn.gid is None:
            self._table.conn.rollback()
            return
        self._rollback_gid(txn.gid)

    def txn_handle(self, txn: PgTxn) -> str:
        assert txn.gid is not None
        return txn.gid

    def recover(self, entries: list[Any]) -> None:
        """Subtask 0 commits the recorded transactions and rolls back this sink's others."""
        if self.ctx.subtask_index != 0:
            return
        recorded = set()
        for gid in entries:
            if not isinstance(gid, str) or not gid.startswith(self._prefix):
                raise SinkError(
                    f"PostgresSink {self._table.sink.table!r}: cannot recover entry {gid!r} "
                    f"(not a transaction id of sink {self._table.sink.sink_id!r})",
                    retryable=False,
                )
            recorded.add(gid)
        for gid in sorted(recorded):
            self._commit_gid(gid)
        for gid in self._prepared():
            if gid not in recorded and not gid.startswith(self._own):
                log.info("PostgresSink %s: rolling back leftover %s", self._table.sink.table, gid)
                self._rollback_gid(gid)

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._table.close()

    def _prepared(self) -> list[str]:
        rows = self._table.admin.execute(
            "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() "
            "AND starts_with(gid, %s) ORDER BY gid",
            (self._prefix,),
        ).fetchall()
        return [r[0] for r in rows]

    def _commit_gid(self, gid: str) -> None:
        import psycopg

        try:
            self._table.admin.execute(_gid_statement("COMMIT PREPARED", gid))
        except psycopg.errors.UndefinedObject:
            log.debug("PostgresSink: %s was committed before", gid)

    def _rollback_gid(self, gid: str) -> None:
        import psycopg

        try:
            self._table.admin.execute(_gid_statement("ROLLBACK PREPARED", gid))
        except psycopg.errors.UndefinedObject:
            log.debug("PostgresSink: %s is gone already", gid)


def _gid_statement(command: str, gid: str) -> Any:
    """``command '<gid>'``: utility statements take no bound parameters, so a literal."""
    from psycopg import sql

    return sql.SQL(command + " {}").format(sql.Literal(gid))


class _Upserts:
    """The statements that apply changes by key (``INSERT ... ON CONFLICT (keys) DO
    UPDATE``, ``DELETE ... WHERE keys``) and the folding of changes into each key's
    last state, shared by the upsert writers."""

    def __init__(self, table: _Table) -> None:
        from psycopg import sql

        self.table = table
        cols = table.columns
        keys = table.sink.key_columns
        self.index = [cols.index(k) for k in keys]
        updates = [c for c in cols if c not in keys]
        conflict = (
            sql.SQL("DO UPDATE SET {}").format(
                sql.SQL(", ").join(
                    sql.SQL("{} = EXCLUDED.{}").format(sql.Identifier(c), sql.Identifier(c))
                    for c in updates
                )
            )
            if updates
            else sql.SQL("DO NOTHING")
        )
        self.upsert = sql.SQL("INSERT INTO {} ({}) VALUES ({}) ON CONFLICT ({}) {}").format(
            table.ident,
            table.column_list,
            sql.SQL(", ").join(sql.Placeholder() * len(cols)),
            sql.SQL(", ").join(map(sql.Identifier, keys)),
            conflict,
        )
        self.delete = sql.SQL("DELETE FROM {} WHERE {}").format(
            table.ident,
            sql.SQL(" AND ").join(
                sql.SQL("{} IS NOT DISTINCT FROM {}").format(sql.Identifier(k), sql.Placeholder())
                for k in keys
            ),
        )

    def fold(self, records: Any, into: dict[tuple[Any, ...], tuple[Any, ...] | None]) -> None:
        """Fold ``records`` (rows, or a batch with or without ``_op``) into each key's last
        state: its last row (an upsert) or ``None`` (a delete); an update's old value
        (``-U``) changes nothing by key."""
        rows = self.table.rows(records)
        kinds: list[int] = [RowKind.INSERT] * len(rows)
        if is_batch(records) and OP in records.schema.names:  # a changelog
            kinds = records.column(OP).to_pylist()
        index = self.index
        for row, kind in zip(rows, kinds, strict=True):
            if kind == RowKind.UPDATE_BEFORE:
                continue
            into[tuple(row[i] for i in index)] = None if kind == RowKind.DELETE else row

    def apply(self, cur: Any, changes: dict[tuple[Any, ...], tuple[Any, ...] | None]) -> None:
        """Run ``changes`` (from :meth:`fold`) on cursor ``cur``."""
        deletes = [key for key, row in changes.items() if row is None]
        upserts = [row for row in changes.values() if row is not None]
        if deletes:
            cur.executemany(self.delete, deletes)
        if upserts:
            cur.executemany(self.upsert, upserts)


class PostgresUpsertWriter(SinkWriter):
    """A subtask's upsert writer: ``INSERT ... ON CONFLICT DO UPDATE``, committed at each
    checkpoint (and at the end of input).

    Example::

        w = PostgresUpsertWriter(sink, ctx); w.write_batch([{"word": "a", "n": 3}])
    """

    def __init__(self, sink: PostgresSink, ctx: SinkContext) -> None:
        self._table = _Table(sink)
        self._upserts = _Upserts(self._table)

    def restore(self, entries: list[Any]) -> None:
        """Nothing to recover: replayed records overwrite their keys."""

    def write_batch(self, records: Any) -> None:
        if not len(records):
            return
        last: dict[tuple[Any, ...], tuple[Any, ...] | None] = {}
        self._upserts.fold(records, last)
        with self._table.conn.cursor() as cur:
            self._upserts.apply(cur, last)

    def snapshot(self, checkpoint_id: int) -> list[Any]:
        """Commit what was written: the checkpoint stores nothing for this sink."""
        self._table.conn.commit()
        return []

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Nothing to do: rows were committed at the snapshot."""

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        """Nothing to undo: upserts are idempotent."""

    def end_input(self) -> None:
        self._table.conn.commit()

    def close(self) -> None:
        self._table.close()


#: The table of the checkpoints each transactional upsert sink applied: one row per
#: sink, its newest applied checkpoint, written in the transaction that applied it.
COMMITS_TABLE = "epochstream_sink_checkpoints"


@dataclass(frozen=True)
class UpsertEntry:
    """One checkpoint interval's changes of one transactional upsert writer, by key:
    ``upserts`` (rows) and ``deletes`` (key tuples).

    Example::

        UpsertEntry(0, 4, upserts=(("a", 3),), deletes=(("b",),))
    """

    subtask: int
    checkpoint_id: int
    upserts: tuple[tuple[Any, ...], ...]
    deletes: tuple[tuple[Any, ...], ...]


class _Checkpoints:
    """The sink's row in :data:`COMMITS_TABLE`: read, and moved on inside the
    transaction that applies a checkpoint."""

    def __init__(self, table: _Table) -> None:
        from psycopg import sql

        self.sink = table.sink.sink_id
        ident = sql.Identifier(COMMITS_TABLE)
        table.admin.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (sink TEXT PRIMARY KEY, checkpoint BIGINT NOT NULL)"
            ).format(ident)
        )
        self.read = sql.SQL("SELECT checkpoint FROM {} WHERE sink = %s").format(ident)
        self.lock = sql.SQL("SELECT checkpoint FROM {} WHERE sink = %s FOR UPDATE").format(ident)
        self.write = sql.SQL(
            "INSERT INTO {} (sink, checkpoint) VALUES (%s, %s) "
            "ON CONFLICT (sink) DO UPDATE SET checkpoint = EXCLUDED.checkpoint"
        ).format(ident)


def _apply_entries(cur: Any, upserts: _Upserts, entries: list[UpsertEntry]) -> None:
    """Apply ``entries`` in order (checkpoint, then subtask): each key's last change."""
    changes: dict[tuple[Any, ...], tuple[Any, ...] | None] = {}
    index = upserts.index
    for entry in sorted(entries, key=lambda e: (e.checkpoint_id, e.subtask)):
        changes.update(dict.fromkeys(entry.deletes))
        changes.update((tuple(row[i] for i in index), row) for row in entry.upserts)
    upserts.apply(cur, changes)


class PostgresTransactionalUpsertWriter(SinkWriter):
    """A subtask's transactional upsert writer (``mode="transactional_upsert"``): a
    checkpoint interval's changes are folded by key and kept in the checkpoint (an
    :class:`UpsertEntry`); the job master's :class:`PostgresUpsertCommitter` applies
    every subtask's entries of a completed checkpoint in one transaction. An entry
    stays in this writer's snapshots until a completed checkpoint covers it (an aborted
    checkpoint's changes go into the next commit).

    Example::

        w = PostgresSink(dsn, "counts", "transactional_upsert", ["word"]).create_writer(ctx)
        w.restore([]); w.write_batch(batch); entries = w.snapshot(1)
    """

    def __init__(self, sink: PostgresSink, ctx: SinkContext) -> None:
        self._ctx = ctx
        self._table = _Table(sink)
        self._upserts = _Upserts(self._table)
        self._buffer: dict[tuple[Any, ...], tuple[Any, ...] | None] = {}
        self._pending: list[UpsertEntry] = []

    def restore(self, entries: list[Any]) -> None:
        """Nothing to do: the job master's committer applies the restored checkpoint."""

    def write_batch(self, records: Any) -> None:
        if len(records):
            self._upserts.fold(records, self._buffer)

    def _entry(self, checkpoint_id: int) -> UpsertEntry:
        buffer, self._buffer = self._buffer, {}
        return UpsertEntry(
            self._ctx.subtask_index,
            checkpoint_id,
            upserts=tuple(row for row in buffer.values() if row is not None),
            deletes=tuple(key for key, row in buffer.items() if row is None),
        )

    def snapshot(self, checkpoint_id: int) -> list[Any]:
        if self._buffer:
            self._pending.append(self._entry(checkpoint_id))
        return list(self._pending)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self._pending = [e for e in self._pending if e.checkpoint_id > checkpoint_id]

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        """Its changes stay pending: the next completed checkpoint applies them."""

    def end_input(self) -> None:
        """With checkpointing off there is no committer: apply now (this subtask's
        changes in one transaction); else the final checkpoint's commit does."""
        if not self._ctx.checkpointing and self._buffer:
            with self._table.conn.transaction(), self._table.conn.cursor() as cur:
                _apply_entries(cur, self._upserts, [self._entry(0)])

    def close(self) -> None:
        self._table.close()


class PostgresUpsertCommitter(GlobalCommitter):
    """Applies a completed checkpoint's changes (every subtask's :class:`UpsertEntry`)
    in ONE transaction that also moves the sink's row in :data:`COMMITS_TABLE` to the
    checkpoint, so the table moves from one checkpoint's state to the next at once,
    and a checkpoint at most that row's is a replay (a restore) and is skipped.

    Example::

        PostgresSink(dsn, "counts", "transactional_upsert", ["word"]).create_committer(job)
    """

    def __init__(self, sink: PostgresSink) -> None:
        self._table = _Table(sink)
        self._upserts = _Upserts(self._table)
        self._checkpoints = _Checkpoints(self._table)

    def last_committed(self) -> int:
        row = self._table.admin.execute(
            self._checkpoints.read, (self._checkpoints.sink,)
        ).fetchone()
        return int(row[0]) if row is not None else 0

    def commit(self, checkpoint_id: int, entries: list[Any]) -> None:
        for entry in entries:
            if not isinstance(entry, UpsertEntry):
                raise SinkError(
                    f"PostgresSink {self._table.sink.table!r}: cannot commit a "
                    f"{type(entry).__qualname__} entry",
                    retryable=False,
                )
        conn, checkpoints = self._table.conn, self._checkpoints
        with conn.transaction(), conn.cursor() as cur:
            row = cur.execute(checkpoints.lock, (checkpoints.sink,)).fetchone()
            last = int(row[0]) if row is not None else 0
            if checkpoint_id <= last:
                return  # applied before this restore
            # Entries of checkpoints up to ``last`` were in an earlier commit.
            _apply_entries(cur, self._upserts, [e for e in entries if e.checkpoint_id > last])
            cur.execute(checkpoints.write, (checkpoints.sink, checkpoint_id))

    def close(self) -> None:
        self._table.close()
