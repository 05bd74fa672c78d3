"""Delta Lake sink (``deltalake``, delta-rs): one Delta transaction per checkpoint.

Writers pre-commit: at each checkpoint's barrier a subtask writes the rows it received
since the last one as a Parquet file into the table directory (not yet in the table)
and returns its description. The job master's :class:`DeltaCommitter` (a global
committer) commits every subtask's files of a completed checkpoint as one Delta
transaction carrying the application transaction ``(epochstream-<sink>, <checkpoint>)``.
Before committing checkpoint ``n`` it reads the table's version of that application id:
``n`` or later means this checkpoint was committed already (a replay after a restore),
and it is skipped; files pre-committed at checkpoints up to that version were in it.
A writer keeps a file's description in its state until it hears that a checkpoint
covering it completed, so a file of an aborted checkpoint goes into the next commit.

Guarantee: exactly-once with checkpointing on. Files written for checkpoints that never
completed stay in the directory, outside the table, until ``DeltaTable.vacuum()``.
Records are dicts (column name to value); the table is created by the first commit,
with the schema of its files.

The sink takes rows or Arrow record batches (a columnar stream, no ``to_rows()``).
Batches are written as they are (Arrow to Parquet, no Python per row; the runtime's
``_ts`` and ``_kg`` columns left out), so the table gets their Arrow types as Delta
maps them (int64 to long, string to string, timestamp with a time zone to timestamp,
without one to timestamp_ntz, decimal to decimal). A checkpoint interval's batches make
one file, so they must share one schema (the job fails naming both otherwise); rows
written between them are converted to it. The commit protocol is the same for both.

``mode="upsert", key=[...]`` applies a changelog (or rows) by key instead, one
``MERGE`` commit per checkpoint, exactly once: :mod:`epochstream.connectors.delta_upsert`.

Example::

    rows.sink_to(es.sinks.DeltaSink("/lake/events"))
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from dataclasses import dataclass
from typing import Any

from epochstream.connectors.base import GlobalCommitter, Sink, SinkContext, SinkWriter
from epochstream.connectors.batchform import is_batch, user_columns
from epochstream.connectors.delta_upsert import (
    DeltaAppCommitter,
    DeltaMergeCommitter,
    DeltaUpsertWriter,
)
from epochstream.connectors.filesink import rows_to_table
from epochstream.core.changelog import OP
from epochstream.exceptions import ConfigurationError, SinkError, short_repr

__all__ = ["DeltaCommitter", "DeltaFile", "DeltaSink", "DeltaWriter"]

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


@dataclass(frozen=True)
class DeltaFile:
    """A pre-committed Parquet file: ``path`` relative to the table root, written at
    ``checkpoint_id``.

    Example::

        DeltaFile("part-3f2a9c1e-a0-s1-c4-9b1d.parquet", 4096, 120, 1700000000000, 4)
    """

    path: str
    size: int
    rows: int
    modified_ms: int
    checkpoint_id: int


class DeltaSink(Sink):
    """Appends records to the Delta table at ``path`` (module docstring), or with
    ``mode="upsert"`` applies them by the columns ``key``: a changelog's last change of
    each key per checkpoint, merged in one commit (:mod:`~epochstream.connectors.delta_upsert`).

    Guarantee: exactly-once (one Delta transaction per checkpoint, skipped on replay).
    Takes rows or Arrow record batches (written with their Arrow types).

    ``sink_id`` names the application transaction (default: the directory's name).

    Example::

        stream.sink_to(DeltaSink("/lake/events", mode="append"))
        counts.sink_to(DeltaSink("/lake/counts", mode="upsert", key=["word"]))
    """

    transactional = True
    accepts_batches = True

    def __init__(
        self,
        path: str | os.PathLike[str],
        mode: str = "append",
        *,
        key: list[str] | None = None,
        sink_id: str | None = None,
    ) -> None:
        self.path = os.path.abspath(os.fspath(path))
        if mode not in ("append", "upsert"):
            raise ConfigurationError(
                f"DeltaSink {self.path!r}: mode must be 'append' or 'upsert', got {mode!r}"
            )
        if mode == "upsert" and not key:
            raise ConfigurationError(f"DeltaSink {self.path!r}: mode='upsert' needs key=[...]")
        if mode == "append" and key:
            raise ConfigurationError(f"DeltaSink {self.path!r}: key applies to mode='upsert'")
        if key and OP in key:
            raise ConfigurationError(f"DeltaSink {self.path!r}: {OP!r} is the row kind, not a key")
        self.mode = mode
        self.key = list(key or [])
        self.app_id = "epochstream-" + _UNSAFE.sub("_", sink_id or os.path.basename(self.path))

    def create_writer(self, ctx: SinkContext) -> SinkWriter:
        if not ctx.checkpointing:
            raise ConfigurationError(
                "DeltaSink commits through checkpoints: enable checkpointing "
                "(env.enable_checkpointing(...))"
            )
        if self.mode == "upsert":
            return DeltaUpsertWriter(self.path, self.key, ctx)
        return DeltaWriter(self.path, ctx)

    def create_committer(self, job_id: str) -> GlobalCommitter:
        if self.mode == "upsert":
            return DeltaMergeCommitter(self.path, self.app_id, self.key)
        return DeltaCommitter(self.path, self.app_id)


class DeltaWriter(SinkWriter):
    """Buffers rows (until a batch arrives) or Arrow tables (from then on) and writes
    one Parquet file per checkpoint into the table directory.

    Example::

        w = DeltaSink("/lake/t").create_writer(ctx); w.restore([])
        w.write_batch([{"id": 1}]); files = w.snapshot(1)
    """

    def __init__(self, path: str, ctx: SinkContext) -> None:
        self._path = path
        self._ctx = ctx
        self._stem = f"part-{_UNSAFE.sub('_', ctx.job_id[:8])}-a{ctx.attempt}-s{ctx.subtask_index}"
        self._rows: list[Any] = []
        self._tables: list[Any] = []  # of one schema, set by the first batch
        self._schema: Any = None
        self._files: list[DeltaFile] = []  # pre-committed, no completed checkpoint heard of
        os.makedirs(path, exist_ok=True)

    def restore(self, entries: list[Any]) -> None:
        """Nothing to do: the job master's committer commits the restored checkpoint."""

    def write_batch(self, records: Any) -> None:
        if not len(records):
            return  # an empty batch would still make a file at the snapshot
        if not is_batch(records):
            if self._schema is None:
                self._rows.extend(records)
            else:
                self._tables.append(self._rows_as(records))
            return
        import pyarrow as pa

        table = pa.Table.from_batches([user_columns(records)])
        if self._schema is None:
            self._schema = table.schema
            if self._rows:  # rows came first: they take the batches' schema, in order
                self._tables.append(self._rows_as(self._rows))
                self._rows = []
        elif not table.schema.equals(self._schema, check_metadata=False):
            raise SinkError(
                f"DeltaSink {self._path!r}: a batch's schema differs from this checkpoint "
                f"interval's.\nFirst batch's schema:\n{self._schema}\n"
                f"This batch's schema:\n{table.schema}",
                retryable=False,  # the same batch comes back after every restart
            )
        self._tables.append(table)

    def snapshot(self, checkpoint_id: int) -> list[Any]:
        if self._rows or self._tables:
            self._files.append(self._write_file(checkpoint_id))
            self._clear()
        return list(self._files)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self._files = [f for f in self._files if f.checkpoint_id > checkpoint_id]

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        """Its files stay pending: the next completed checkpoint commits them."""

    def end_input(self) -> None:
        """The final checkpoint writes and commits what is left."""

    def close(self) -> None:
        """Rows not yet in a checkpoint are dropped: a restore replays them."""
        self._clear()

    def _clear(self) -> None:
        self._rows = []
        self._tables = []
        self._schema = None

    def _rows_as(self, rows: list[Any]) -> Any:
        import pyarrow as pa

        try:
            return pa.Table.from_pylist(rows, schema=self._schema)
        except (TypeError, ValueError, pa.ArrowException) as exc:
            raise SinkError(
                f"DeltaSink {self._path!r}: {len(rows)} rows (first: {short_repr(rows[0])}) do not "
                f"fit the batches' schema {self._schema}: {exc}",
                retryable=False,
            ) from exc

    def _write_file(self, checkpoint_id: int) -> DeltaFile:
        import pyarrow as pa
        import pyarrow.parquet as pq

        where = f"DeltaSink {self._path!r}"
        table = pa.concat_tables(self._tables) if self._tables else rows_to_table(self._rows, where)
        name = f"{self._stem}-c{checkpoint_id}-{uuid.uuid4().hex[:8]}.parquet"
        full = os.path.join(self._path, name)
        with open(full, "xb") as f:
            pq.write_table(table, f)
            f.flush()
            os.fsync(f.fileno())
        return DeltaFile(
            name, os.path.getsize(full), table.num_rows, int(time.time() * 1000), checkpoint_id
        )


class DeltaCommitter(DeltaAppCommitter):
    """Commits a checkpoint's files as one Delta transaction, once (module docstring).

    Example::

        DeltaCommitter("/lake/t", "epochstream-t").commit(4, files)
    """

    def commit(self, checkpoint_id: int, entries: list[Any]) -> None:
        from deltalake import CommitProperties, DeltaTable, Transaction
        from deltalake.transaction import AddAction, RemoveAction, create_table_with_add_actions

        last = self.last_committed()
        if checkpoint_id <= last:
            return  # committed before this restore
        files = sorted({e for e in entries if e.checkpoint_id > last}, key=lambda f: f.path)
        if not files:
            return
        adds = [
            AddAction(f.path, f.size, {}, f.modified_ms, True, json.dumps({"numRecords": f.rows}))
            for f in files
        ]
        props = CommitProperties(app_transactions=[Transaction(self._app_id, checkpoint_id)])
        schema = self._schema(files[0])
        if DeltaTable.is_deltatable(self._path):
            DeltaTable(self._path).create_write_transaction(
                list[AddAction | RemoveAction](adds),
                mode="append",
                schema=schema,
                commit_properties=props,
            )
        else:
            from deltalake import Schema

            create_table_with_add_actions(
                self._path, Schema.from_arrow(schema), adds, mode="append", commit_properties=props
            )

    def _schema(self, first: DeltaFile) -> Any:
        import pyarrow.parquet as pq

        path = os.path.join(self._path, first.path)
        if not os.path.exists(path):
            raise SinkError(
                f"DeltaSink {self._path!r}: pre-committed file {first.path!r} of checkpoint "
                f"{first.checkpoint_id} is gone; its records are covered by the checkpoint",
                retryable=False,
            )
        return pq.read_schema(path)
