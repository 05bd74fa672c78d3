"""Non-transactional sinks for debugging and benchmarks.

:class:`PrintSink` prints records as they arrive (at-least-once: records replayed after
a restore are printed again). :class:`DiscardSink` drops records and counts them.

Example::

    stream.sink_to(PrintSink(prefix="words"))   # "words:1> ('a', 3)" at parallelism > 1
    stream.sink_to(DiscardSink())
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from epochstream.connectors.base import AtLeastOnceSinkWriter, Sink, SinkContext
from epochstream.core.arrow import rows_of
from epochstream.core.changelog import OP, kind_names

__all__ = ["DiscardSink", "DiscardWriter", "PrintSink", "PrintWriter"]


class PrintSink(Sink):
    """Writes ``str(record)`` lines to ``sys.stdout``, flushed once per batch.

    Guarantee: at-least-once (lines are written as records arrive; a restore replays).

    The line prefix is ``"<prefix>:<subtask>> "`` with a prefix at parallelism > 1,
    ``"<prefix>> "`` with a prefix at parallelism 1, ``"<subtask>> "`` without a
    prefix at parallelism > 1, and nothing otherwise.

    Example::

        PrintSink().create_writer(ctx).write_batch([1, 2])   # prints "1" and "2"
    """

    transactional = False
    accepts_batches = True

    def __init__(self, prefix: str | None = None) -> None:
        self.prefix = prefix

    def create_writer(self, ctx: SinkContext) -> PrintWriter:
        return PrintWriter(_line_prefix(self.prefix, ctx), console=ctx.console)


def _line_prefix(prefix: str | None, ctx: SinkContext) -> str:
    if ctx.parallelism > 1:
        return f"{prefix}:{ctx.subtask_index}> " if prefix else f"{ctx.subtask_index}> "
    return f"{prefix}> " if prefix else ""


class PrintWriter(AtLeastOnceSinkWriter):
    """Prints each record on its own line, behind ``line_prefix``.

    Example::

        PrintWriter("0> ").write_batch(["a"])   # prints "0> a"
    """

    def __init__(self, line_prefix: str, *, console: Callable[[str], None] | None = None) -> None:
        self.line_prefix = line_prefix
        self.console = console

    def write_batch(self, records: Any) -> None:
        if not len(records):
            return
        p = self.line_prefix
        if type(records) is not list and OP in records.schema.names:
            # A changelog: each row behind its kind, as Flink prints them (+I{...}).
            kinds = kind_names(records.column(OP)).to_pylist()
            rows = rows_of(records.drop_columns([OP]))
            text = "".join([f"{p}{k}{r!s}\n" for k, r in zip(kinds, rows, strict=True)])
        else:
            if type(records) is not list:  # a columnar batch: one line per row
                records = rows_of(records)
            text = "".join([f"{p}{r!s}\n" for r in records])
        if self.console is not None:
            self.console(text)
            return
        # Looked up per batch, so a redirected or captured stdout is honoured.
        out = sys.stdout
        out.write(text)
        out.flush()


class DiscardSink(Sink):
    """Drops records (rows or columnar batches); ``count`` sums the records of the
    writers made in this process.

    Guarantee: none needed (nothing is written); for benchmarks.

    Example::

        sink = DiscardSink()
        sink.create_writer(ctx).write_batch([1, 2, 3])
        sink.count == 3
    """

    transactional = False
    accepts_batches = True

    def __init__(self) -> None:
        self._writers: list[DiscardWriter] = []

    def create_writer(self, ctx: SinkContext) -> DiscardWriter:
        writer = DiscardWriter()
        self._writers.append(writer)
        return writer

    @property
    def count(self) -> int:
        """Records written to this process's writers of this sink."""
        return sum(w.count for w in list(self._writers))

    def __getstate__(self) -> dict[str, Any]:
        # A copy shipped to a task starts counting afresh: its writers live there.
        return {"_writers": []}


class DiscardWriter(AtLeastOnceSinkWriter):
    """Counts records and drops them.

    Example::

        w = DiscardWriter()
        w.write_batch(["a", "b"])
        w.count == 2
    """

    def __init__(self) -> None:
        self.count = 0

    def write_batch(self, records: list[Any]) -> None:
        self.count += len(records)
