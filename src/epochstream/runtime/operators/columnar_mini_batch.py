"""Flink's mini-batch (``table.exec.mini-batch.*``) for a columnar operator: input batches
held in memory until enough rows came or enough processing time passed since the first,
then handed on as one batch.

The buffer holds no state a checkpoint keeps: its owner folds it before every barrier
(:meth:`Operator.prepare_snapshot_pre_barrier`, as Flink's ``MapBundleOperator``
finishes its bundle in ``prepareSnapshotPreBarrier``), before every watermark (so a
watermark never overtakes the rows it follows) and at the end of the input, so what a
snapshot does not hold was already emitted before its barrier.

Example::

    buffer = MiniBatchBuffer(MiniBatch(latency_ms=2_000, size=5_000))
    buffer.add(batch, now_ms=10_000)   # True once 5 000 rows are held
    buffer.due(12_000)                 # True: 2 s since the first held row
    whole = buffer.take()              # the held rows as one batch (None: none)
"""

from __future__ import annotations

import pyarrow as pa

from epochstream.core.arrow import table_batch
from epochstream.graph.specs import MiniBatch

__all__ = ["MiniBatchBuffer"]


class MiniBatchBuffer:
    """Batches held until ``config.size`` rows or ``config.latency_ms`` after the first
    (see the module docstring).

    Example::

        buffer = MiniBatchBuffer(MiniBatch(latency_ms=100, size=2))
        buffer.add(pa.record_batch({"k": [1]}), now_ms=0)   # False: 1 row of 2
        buffer.deadline                                      # 100
    """

    def __init__(self, config: MiniBatch) -> None:
        self.config = config
        self._batches: list[pa.RecordBatch] = []
        self._rows = 0
        #: When the held rows are due (None: nothing held).
        self.deadline: int | None = None

    def add(self, batch: pa.RecordBatch, now_ms: int) -> bool:
        """Hold ``batch`` (arrived at ``now_ms``); True when the buffer is full."""
        if self.deadline is None:
            self.deadline = now_ms + self.config.latency_ms
        self._batches.append(batch)
        self._rows += batch.num_rows
        return self._rows >= self.config.size

    def due(self, now_ms: int) -> bool:
        """Whether the held rows' latency ran out at ``now_ms``."""
        return self.deadline is not None and now_ms >= self.deadline

    def take(self) -> pa.RecordBatch | None:
        """The held rows as one batch (in arrival order), emptying the buffer; None when
        nothing is held. Batches whose schemas differ (an integer widened, a changelog
        batch without ``_op``) are unified: a missing ``_op`` is NULL, which reads as
        ``+I``."""
        if not self._batches:
            return None
        held, self._batches, self._rows, self.deadline = self._batches, [], 0, None
        if len(held) == 1:
            return held[0]
        tables = [pa.Table.from_batches([b]) for b in held]
        return table_batch(pa.concat_tables(tables, promote_options="permissive"))
