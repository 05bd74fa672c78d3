"""What the columnar operator tests share: an output recorder and an operator built
the way a task builds it (spec, context, wiring), driven directly.

Example::

    op, out = make_operator("columnar_aggregate", AggregateSpec("sum", "k", "v"), keys=["k"])
    op.process_batch(batch, None)
    out.take()          # the emitted rows, as dicts; clears them
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from output_support import RecordingOutput

from epochstream.core.clock import ManualClock
from epochstream.graph.jobgraph import OperatorSpec
from epochstream.graph.transformations import ColumnKey
from epochstream.runtime.operators import OperatorContext, create_operator
from epochstream.state.operator import OperatorStateStore

MAX_P = 128


class Emitted(RecordingOutput):
    """Records what an operator emits: batches, their timestamps, watermarks."""

    def __init__(self) -> None:
        super().__init__()
        self.items: list[Any] = []
        self.timestamps: list[Any] = []

    def collect(self, batch: Any, timestamps: Any = None) -> None:
        self.items.append(batch)
        self.timestamps.append(timestamps)

    def rows(self) -> list[dict[str, Any]]:
        """Every emitted row so far, as dicts."""
        return [r for b in self.items for r in b.to_pylist()]

    def take(self) -> list[dict[str, Any]]:
        """The rows emitted since the last ``take``."""
        rows = self.rows()
        self.items, self.timestamps = [], []
        return rows

    def batches(self) -> list[pa.RecordBatch]:
        """The emitted batches."""
        return list(self.items)


def make_operator(
    kind: str,
    payload: Any,
    *,
    keys: list[str] | None = None,
    subtask: int = 0,
    parallelism: int = 1,
    clock: ManualClock | None = None,
    uid: str | None = None,
    keyed_backend: Any = None,
) -> tuple[Any, Emitted]:
    """Operator ``kind`` with ``payload``, keyed by ``keys`` (one column per input), as
    subtask ``subtask`` of ``parallelism``, opened, its output into an :class:`Emitted`
    (its keyed state in ``keyed_backend``, else a heap backend of its own)."""
    spec = OperatorSpec(
        uid=uid or f"{kind}-1",
        name=kind,
        kind=kind,
        payload=payload,
        key_selector=ColumnKey(keys[0]) if keys else None,
        input_key_selectors=[ColumnKey(k) for k in keys] if keys and len(keys) > 1 else None,
    )
    ctx = OperatorContext(
        subtask_index=subtask,
        parallelism=parallelism,
        max_parallelism=MAX_P,
        attempt=0,
        job_id="job",
        task_name=f"{kind} ({subtask + 1}/{parallelism})",
        operator_state=OperatorStateStore(),
        checkpointing=True,
        clock=clock,
        keyed_backend=keyed_backend,
    )
    op = create_operator(spec, ctx)
    out = Emitted()
    op.output = out
    op.open()
    return op, out
