"""A fake operator output for tests: keeps the watermarks and idleness it was given.

Each test helper's recording output subclasses :class:`RecordingOutput` and says in
``collect`` how it keeps batches.

Example::

    class Batches(RecordingOutput):
        def collect(self, records, timestamps=None):
            self.batches.append(records)
"""

from __future__ import annotations

from typing import Any

from epochstream.runtime.operator_outputs import Output


class RecordingOutput(Output):
    """Watermarks and status changes as they came; ``collect`` is the subclass's."""

    def __init__(self) -> None:
        self.watermarks: list[int] = []
        self.statuses: list[bool] = []

    def collect(self, records: Any, timestamps: list[Any] | None = None) -> None:
        raise AssertionError(f"{type(self).__name__} keeps no records")

    def emit_watermark(self, watermark: int) -> None:
        self.watermarks.append(watermark)

    def emit_status(self, idle: bool) -> None:
        self.statuses.append(idle)


class ListOutput(RecordingOutput):
    """Every record handed on, into one list (timestamps dropped).

    Example: ``op.output = out = ListOutput(); op.process_batch([1], None); out.records``
    """

    def __init__(self) -> None:
        super().__init__()
        self.records: list[Any] = []

    def collect(self, records: Any, timestamps: list[Any] | None = None) -> None:
        self.records.extend(records)
