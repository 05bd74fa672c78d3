"""Per group, each value's multiplicity: what MIN, MAX and COUNT(DISTINCT) of a ``GROUP
BY`` over a changelog need, since a retraction may take a group's extreme (or a distinct
value) away and the next one must be known (Flink's ``MinWithRetractAggFunction`` and
``CountDistinct`` keep the same map per group).

A :class:`ValueCounts` is one row table of the keyed-state backend, keyed by the group's
state key, of rows ``(state key, value, _ga_n)``: a value's net count in the group (its
adds minus its retractions), kept while it is above 0. A batch pops its groups' rows,
adds its rows' signed weights and sums per (group, value) with one Arrow ``group_by``,
and writes back the values still counted: the Python cost is per batch, never per row
or group. NULLs are not kept (SQL's aggregates skip them).

A value retracted more often than it was added is a DataError, unless the group
aggregation has a state TTL (``forgiving``): then its state may have expired, and the
retractions beyond the count are ignored (as Flink ignores retractions of state that is
gone) and counted. The rows of a group whose state expired are the operator's to drop:
:meth:`ValueCounts.update` takes which groups are still held.

Example::

    counts = ValueCounts(backend, "values0", "k", "op (1/1)")
    change = counts.update(found, pa.array([5, 7]), np.array([1, 1]), found.keys.type)
    after = change.after
    per_group_extreme(after, "max", len(found.keys))   # [7]: the one group's MAX
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from epochstream.core.arrow import table_batch
from epochstream.exceptions import DataError, StateError
from epochstream.runtime.operators.columnar_group_keys import BatchKeys, key_slots
from epochstream.state.backends.base import KeyedStateBackend, RowSchema, RowTable

__all__ = [
    "SLOT",
    "VALUE",
    "CountsChange",
    "ValueCounts",
    "distinct_counts",
    "per_group_extreme",
]

#: The columns of :meth:`ValueCounts.update`'s results: a group's position among the
#: batch's keys, a value, and its count.
SLOT, VALUE, COUNT = "_ga_id", "_ga_value", "_ga_n"


class CountsChange(NamedTuple):
    """A batch's groups' values before and after it (columns ``_ga_id``, ``_ga_value``,
    ``_ga_n``; counts above 0), and how many retractions it had of values not counted
    (only with ``forgiving``: else they are a DataError)."""

    before: pa.Table
    after: pa.Table
    ignored: int


class ValueCounts:
    """One aggregate's values per group with their net counts (module docstring), in row
    table ``name`` (made with the first values written, or restored). ``forgiving``:
    ignore retractions beyond a value's count (the group aggregation has a state TTL).

    Example::

        counts = ValueCounts(backend, "values0", "k", "op (1/1)")
        counts.update(found, values, weights, key_type)   # -> CountsChange
    """

    def __init__(
        self,
        backend: KeyedStateBackend,
        name: str,
        state_key: str,
        where: str,
        *,
        forgiving: bool = False,
    ) -> None:
        self.backend = backend
        self.name = name
        self.state_key = state_key
        self.where = where
        self.forgiving = forgiving
        self.table: RowTable | None = backend.row_table(name)
        if self.table is not None and self.table.schema.schema.names != [state_key, VALUE, COUNT]:
            raise StateError(
                f"{where}: restored table {name!r} does not hold value counts of this "
                f"query's groups (it has {', '.join(self.table.schema.schema.names)}); give "
                "the new operator another uid"
            )

    def update(
        self,
        found: BatchKeys,
        values: pa.Array,
        weights: np.ndarray,
        key_type: pa.DataType,
        held_groups: np.ndarray | None = None,
    ) -> CountsChange:
        """Add the batch's ``values`` (per row) with their signed ``weights`` to their
        groups (``found.slots``); return the groups' values before and after. A value
        whose count would fall below 0 (retracted more often than added) is a DataError,
        or ignored when ``forgiving``. ``held_groups`` (per slot; None: all): the groups
        whose state is held; the kept values of the others (expired) are dropped."""
        held = self.table.pop(found.keys, found.key_groups) if self.table is not None else None
        if held is not None and held_groups is not None and held.num_rows:
            slots = key_slots(held.column(self.state_key), found.keys)
            held = held.filter(pa.array(held_groups[slots]))
        valid = np.asarray(pc.is_valid(values).to_numpy(zero_copy_only=False), dtype=bool)
        added = pa.table(
            {
                SLOT: found.slots[valid],
                VALUE: values.filter(pa.array(valid)),
                COUNT: weights[valid],
            }
        )
        if held is not None and held.num_rows:
            before = pa.table(
                {
                    SLOT: key_slots(held.column(self.state_key), found.keys),
                    VALUE: held.column(VALUE).combine_chunks().cast(values.type),
                    COUNT: held.column(COUNT).combine_chunks(),
                }
            )
        else:
            before = added.schema.empty_table()
        both = pa.concat_tables([before, added])
        summed = both.group_by([SLOT, VALUE], use_threads=False).aggregate([(COUNT, "sum")])
        summed = summed.rename_columns(
            [COUNT if c == f"{COUNT}_sum" else c for c in summed.schema.names]
        )
        counts = np.asarray(summed.column(COUNT).to_numpy(), dtype=np.int64)
        negative = counts < 0
        if negative.any() and not self.forgiving:
            self._retracted_too_often(found, summed, counts)
        after = summed.filter(pa.array(counts > 0)).select([SLOT, VALUE, COUNT])
        self._write(found, after, key_type)
        return CountsChange(before, after, int(-counts[negative].sum()))

    def _write(self, found: BatchKeys, rows: pa.Table, key_type: pa.DataType) -> None:
        """Keep ``rows`` (the groups' counted values) under their state keys."""
        if not rows.num_rows:
            return
        ids = rows.column(SLOT).to_numpy()
        stored = pa.table(
            {
                self.state_key: found.keys.take(pa.array(ids)).cast(key_type),
                VALUE: rows.column(VALUE),
                COUNT: rows.column(COUNT),
            }
        )
        if self.table is None:
            schema = pa.schema([f.with_nullable(True) for f in stored.schema])
            self.table = self.backend.row_table(self.name, RowSchema(schema, self.state_key))
            assert self.table is not None
        self.table.append(table_batch(stored), found.key_groups[ids])

    def _retracted_too_often(self, found: BatchKeys, summed: pa.Table, counts: np.ndarray) -> None:
        at = int(np.flatnonzero(counts < 0)[0])
        slot = int(summed.column(SLOT)[at].as_py())
        group = {k: c[int(found.first[slot])].as_py() for k, c in found.columns.items()}
        value = summed.column(VALUE)[at].as_py()
        raise DataError(
            f"{self.where}: the changelog retracts value {value!r} of group {group} more "
            "often than it added it (a -U/-D without its +I/+U: the input is not the "
            "changelog of a consistent table)"
        )


def distinct_counts(rows: pa.Table, n_keys: int) -> np.ndarray:
    """Per group (``_ga_id`` in ``0..n_keys-1``), how many values ``rows`` counts."""
    return np.bincount(rows.column(SLOT).to_numpy(), minlength=n_keys).astype(np.int64)


def per_group_extreme(rows: pa.Table, kind: str, n_keys: int) -> pa.Array:
    """Per group, the ``kind`` (``min``/``max``) of its values in ``rows``; NULL for a
    group without values."""
    grouped = rows.group_by([SLOT], use_threads=False).aggregate([(VALUE, kind)])
    at = np.full(n_keys, -1, dtype=np.int64)
    at[grouped.column(SLOT).to_numpy()] = np.arange(grouped.num_rows)
    extremes = grouped.column(f"{VALUE}_{kind}").combine_chunks()
    return extremes.take(pa.array(at, mask=at < 0))
