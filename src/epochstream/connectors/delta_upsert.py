"""Delta Lake upserts by key (``DeltaSink(path, mode="upsert", key=[...])``): a
changelog (an ``_op`` column, :mod:`epochstream.core.changelog`) or plain rows applied
to a Delta table by its key, one ``MERGE`` commit per checkpoint, exactly once.

Each writer keeps the changes of a checkpoint interval and, at the checkpoint's barrier,
folds them by key: the last change of each key wins, an update's old value (``-U``)
changes nothing, a ``-D`` deletes the key. The folded changes (a
:class:`DeltaChanges`, an Arrow table) go into the checkpoint. When the checkpoint
completes, the job master's :class:`DeltaMergeCommitter` folds every subtask's changes
of the checkpoints not yet committed (ordered by checkpoint, then subtask) and applies
them in ONE Delta commit: ``MERGE`` on the key columns (matched: update, or delete for
a ``-D``; not matched: insert unless a ``-D``), carrying the application transaction
``(epochstream-<sink>, <checkpoint>)``. Before merging checkpoint ``n`` it reads the
table's version of that application id: ``n`` or later means the merge was committed
(a replay after a restore), and it does nothing, so a recovery never applies a
checkpoint's changes twice. The first commit creates the table (its inserts, with the
same application transaction). Output appears one checkpoint interval late.

Keys are compared with ``IS NOT DISTINCT FROM`` (a null key is a key). Changes of one
key arriving at two subtasks in one checkpoint interval have no order between them;
route a key's changes to one subtask (a keyed result, as SQL's GROUP BY gives) so that
its last change is well defined.

Example::

    counts.sink_to(DeltaSink("/lake/counts", mode="upsert", key=["word"]))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from epochstream.connectors.base import GlobalCommitter, SinkContext, SinkWriter
from epochstream.connectors.batchform import is_batch, user_columns
from epochstream.connectors.filesink import rows_to_table
from epochstream.core.changelog import OP, RowKind
from epochstream.exceptions import SinkError

__all__ = ["DeltaChanges", "DeltaMergeCommitter", "DeltaUpsertWriter", "fold_by_key"]

_ROW = "__row"


def fold_by_key(table: Any, key: list[str]) -> Any:
    """The last change of each ``key`` in ``table`` (an Arrow table with an int8 ``_op``
    column), in first-seen order of those last changes; ``-U`` rows are dropped.

    Example::

        t = pa.table({"k": ["a", "a"], "n": [1, 2], "_op": pa.array([0, 2], pa.int8())})
        fold_by_key(t, ["k"]).to_pylist() == [{"k": "a", "n": 2, "_op": 2}]
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    numbered = table.append_column(_ROW, pa.array(range(table.num_rows), pa.int64()))
    kept = numbered.filter(pc.not_equal(numbered.column(OP), RowKind.UPDATE_BEFORE.value))
    last = kept.group_by(key, use_threads=False).aggregate([(_ROW, "max")])
    rows = pc.sort_indices(last.column(f"{_ROW}_max"))
    return table.take(pc.take(last.column(f"{_ROW}_max"), rows))


@dataclass(frozen=True)
class DeltaChanges:
    """One subtask's changes of one checkpoint interval, folded by key: ``changes`` is an
    Arrow table of the written columns and ``_op`` (``+I``/``+U`` upsert, ``-D`` delete).

    Example::

        DeltaChanges(4, 1, fold_by_key(table, ["word"]))
    """

    checkpoint_id: int
    subtask: int
    changes: Any


class DeltaUpsertWriter(SinkWriter):
    """A subtask's upsert writer: buffers a checkpoint interval's changes and puts them,
    folded by key, into the checkpoint (module docstring).

    Example::

        w = DeltaSink("/lake/t", mode="upsert", key=["id"]).create_writer(ctx)
        w.restore([]); w.write_batch(changelog_batch); entries = w.snapshot(1)
    """

    def __init__(self, path: str, key: list[str], ctx: SinkContext) -> None:
        self._path = path
        self._key = key
        self._ctx = ctx
        self._tables: list[Any] = []
        self._pending: list[DeltaChanges] = []  # no completed checkpoint heard of

    def restore(self, entries: list[Any]) -> None:
        """Nothing to do: the job master's committer merges the restored checkpoint."""

    def write_batch(self, records: Any) -> None:
        import pyarrow as pa

        if not len(records):
            return
        if is_batch(records):
            table = pa.Table.from_batches([user_columns(records)])
        else:
            table = rows_to_table(records, f"DeltaSink {self._path!r}")
        if OP not in table.schema.names:  # rows or an append-only stream: all inserts
            kinds = pa.array([RowKind.INSERT.value] * table.num_rows, pa.int8())
            table = table.append_column(OP, kinds)
        missing = [k for k in self._key if k not in table.schema.names]
        if missing:
            raise SinkError(
                f"DeltaSink {self._path!r}: records with the columns {table.schema.names} "
                f"lack the key columns {missing}",
                retryable=False,  # the same records come back after every restart
            )
        if self._tables and not table.schema.equals(self._tables[0].schema):
            raise SinkError(
                f"DeltaSink {self._path!r}: records' schema differs from this checkpoint "
                f"interval's.\nFirst:\n{self._tables[0].schema}\nThese:\n{table.schema}",
                retryable=False,
            )
        self._tables.append(table)

    def snapshot(self, checkpoint_id: int) -> list[Any]:
        import pyarrow as pa

        if self._tables:
            folded = fold_by_key(pa.concat_tables(self._tables), self._key)
            self._pending.append(DeltaChanges(checkpoint_id, self._ctx.subtask_index, folded))
            self._tables = []
        return list(self._pending)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self._pending = [c for c in self._pending if c.checkpoint_id > checkpoint_id]

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        """Its changes stay pending: the next completed checkpoint merges them."""

    def end_input(self) -> None:
        """The final checkpoint folds and merges what is left."""

    def close(self) -> None:
        """Changes not yet in a checkpoint are dropped: a restore replays them."""
        self._tables = []


class DeltaAppCommitter(GlobalCommitter):
    """A Delta table's global committer whose commits carry the application transaction
    ``(app_id, checkpoint)``: the table's version of ``app_id`` is its last commit.

    Example: ``DeltaMergeCommitter("/lake/t", "epochstream-t", ["id"]).last_committed()``
    """

    def __init__(self, path: str, app_id: str) -> None:
        self._path = path
        self._app_id = app_id

    def last_committed(self) -> int:
        """The newest checkpoint this sink committed to the table (0: none)."""
        from deltalake import DeltaTable

        if not DeltaTable.is_deltatable(self._path):
            return 0
        return DeltaTable(self._path).transaction_version(self._app_id) or 0


class DeltaMergeCommitter(DeltaAppCommitter):
    """Merges a completed checkpoint's changes into the table as one Delta commit, once
    (module docstring).

    Example::

        DeltaMergeCommitter("/lake/t", "epochstream-t", ["id"]).commit(4, changes)
    """

    def __init__(self, path: str, app_id: str, key: list[str]) -> None:
        super().__init__(path, app_id)
        self._key = key

    def commit(self, checkpoint_id: int, entries: list[Any]) -> None:
        import pyarrow as pa
        import pyarrow.compute as pc
        from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

        last = self.last_committed()
        if checkpoint_id <= last:
            return  # merged before this restore
        fresh = sorted(
            (e for e in entries if e.checkpoint_id > last),
            key=lambda e: (e.checkpoint_id, e.subtask),
        )
        if not fresh:
            return
        try:
            changes = fold_by_key(pa.concat_tables([e.changes for e in fresh]), self._key)
        except pa.ArrowInvalid as exc:
            raise SinkError(
                f"DeltaSink {self._path!r}: the subtasks' changes of checkpoint "
                f"{checkpoint_id} do not share one schema: {exc}",
                retryable=False,
            ) from exc
        props = CommitProperties(app_transactions=[Transaction(self._app_id, checkpoint_id)])
        deletes = pc.equal(changes.column(OP), RowKind.DELETE.value)
        if not DeltaTable.is_deltatable(self._path):
            # Nothing to match yet: the upserts are the new table (deletes delete nothing).
            inserts = changes.filter(pc.invert(deletes)).drop_columns([OP])
            write_deltalake(self._path, inserts, mode="append", commit_properties=props)
            return
        on = " AND ".join(f"t.`{k}` IS NOT DISTINCT FROM s.`{k}`" for k in self._key)
        upsert = f"s.`{OP}` <> {RowKind.DELETE.value}"
        (
            DeltaTable(self._path)
            .merge(
                changes,
                predicate=on,
                source_alias="s",
                target_alias="t",
                error_on_type_mismatch=False,  # the table's types win (timestamp(ms) to us)
                commit_properties=props,
            )
            .when_matched_delete(predicate=f"s.`{OP}` = {RowKind.DELETE.value}")
            .when_matched_update_all(predicate=upsert, except_cols=[OP])
            .when_not_matched_insert_all(predicate=upsert, except_cols=[OP])
            .execute()
        )
