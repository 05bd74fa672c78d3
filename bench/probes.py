"""Measuring sinks for the harness: they run in the slots and report through files.

A slot is a Spark task in another process, so each writer appends JSON lines to
``<directory>/<kind>-<attempt>-<subtask>-<pid>.jsonl`` and the driver reads them with
:func:`read_probe` once the job ended (or while it runs). Work is per batch: one
clock read and one list append per ``write_batch``; only :class:`LatencySink` looks at
records, up to 16 of a batch.

- :class:`SumsSink`: the last value per key (a running sum's final value), for the
  closed-form check of W1; rows ``(k, v, ...)`` or Arrow batches with ``k``/``v``.

On a columnar stream a writer's ``write_batch`` gets one ``pyarrow.RecordBatch``, on
a row stream a list of records.
- :class:`RateSink`: ``(wall time, records)`` per batch, flushed every 0.2 s, so a
  SIGKILL loses at most that much; the recovery measurement's throughput series.
- :class:`LatencySink`: sink wall time minus the creation wall time the job put in
  the record (``record[ts_index]`` or the batch's ``ts`` column), sampled.
- :class:`StampSink`: ``(wall time, value)`` of up to 16 records of each batch, the
  value read from the record (``record[index]``, ``record[key]``) or a column, or the
  batch's largest (``largest=True``); Nexmark's latency pairs the event times an input
  reached with the timestamps of the results (``bench/nexmark_jobs.py``).

This module is pickled by value: Spark's Python workers cannot import ``bench/``.

Example::

    sink = RateSink("/tmp/probe")
    ...sink_to(sink); env.execute()
    samples = [s for line in read_probe("/tmp/probe", "rate") for s in line["samples"]]
"""

from __future__ import annotations

import glob
import json
import os
import sys
import time
from typing import Any

import cloudpickle
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import epochstream as es

__all__ = ["LatencySink", "RateSink", "StampSink", "SumsSink", "read_probe"]

FLUSH_EVERY_S = 0.2


def read_probe(directory: str, kind: str) -> list[dict[str, Any]]:
    """Every JSON line the writers of ``kind`` wrote, each with its ``attempt`` and
    ``subtask``; a line cut short by a kill is skipped.

    Example: ``read_probe("/tmp/probe", "sums")[0]["attempt"] == 0``
    """
    out: list[dict[str, Any]] = []
    for path in sorted(glob.glob(os.path.join(directory, f"{kind}-*.jsonl"))):
        _, attempt, subtask, _pid = os.path.basename(path)[: -len(".jsonl")].split("-")
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    doc = json.loads(line)
                except json.JSONDecodeError:
                    continue  # the writer was killed mid-line
                doc["attempt"] = int(attempt)
                doc["subtask"] = int(subtask)
                out.append(doc)
    return out


class _ProbeWriter(es.sinks.AtLeastOnceSinkWriter):
    """Appends JSON lines to its own file; subclasses say what a line holds."""

    def __init__(self, directory: str, kind: str, ctx: es.sinks.SinkContext) -> None:
        os.makedirs(directory, exist_ok=True)
        name = f"{kind}-{ctx.attempt}-{ctx.subtask_index}-{os.getpid()}.jsonl"
        self._file = open(os.path.join(directory, name), "a", encoding="utf-8")

    def _emit(self, doc: dict[str, Any]) -> None:
        self._file.write(json.dumps(doc) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class SumsSink(es.sinks.Sink):
    """Keeps the last ``v`` per ``k`` and writes them when the input ends.

    ``columnar``: records are Arrow record batches with columns ``k`` and ``v``;
    otherwise rows whose first two fields are ``k`` and ``v``. A running sum only grows,
    so the last value is the maximum, and a replayed record re-emits the same value.

    Example: ``stream.sink_to(SumsSink("/tmp/probe", columnar=False))``
    """

    accepts_batches = True

    def __init__(self, directory: str, *, columnar: bool = False) -> None:
        self.directory = directory
        self.columnar = columnar

    def create_writer(self, ctx: es.sinks.SinkContext) -> es.sinks.SinkWriter:
        return _SumsWriter(self.directory, ctx, self.columnar)


class _SumsWriter(_ProbeWriter):
    def __init__(self, directory: str, ctx: es.sinks.SinkContext, columnar: bool) -> None:
        super().__init__(directory, "sums", ctx)
        self._columnar = columnar
        self._sums: dict[int, int] = {}
        # Columnar: the largest sum per (non-negative int) key, vectorized, so the probe
        # costs the measured job a few NumPy calls per batch rather than a dict update
        # per row; -1 marks a key never seen.
        self._latest = np.full(0, -1, dtype=np.int64)
        self._records = 0

    def write_batch(self, records: list[Any]) -> None:
        if self._columnar:
            k = records.column("k").to_numpy()
            v = records.column("v").to_numpy()
            if len(k) and k.max() >= len(self._latest):
                grown = np.full(max(int(k.max()) + 1, 2 * len(self._latest)), -1, dtype=np.int64)
                grown[: len(self._latest)] = self._latest
                self._latest = grown
            np.maximum.at(self._latest, k, v)
            self._records += records.num_rows
        else:
            # dict.update takes (k, v) pairs at C speed; rows are (k, v) tuples.
            self._sums.update(records)
            self._records += len(records)

    def end_input(self) -> None:
        sums = self._sums
        if self._columnar:
            seen = np.flatnonzero(self._latest >= 0)
            sums = dict(zip(seen.tolist(), self._latest[seen].tolist(), strict=True))
        self._emit({"records": self._records, "sums": list(sums.items())})


class RateSink(es.sinks.Sink):
    """Records ``(wall time, records)`` per batch (Arrow batches count their rows).

    Example: ``stream.sink_to(RateSink("/tmp/probe"))``
    """

    accepts_batches = True

    def __init__(self, directory: str, *, columnar: bool = False) -> None:
        self.directory = directory
        self.columnar = columnar

    def create_writer(self, ctx: es.sinks.SinkContext) -> es.sinks.SinkWriter:
        return _RateWriter(self.directory, ctx, self.columnar)


class _RateWriter(_ProbeWriter):
    def __init__(self, directory: str, ctx: es.sinks.SinkContext, columnar: bool) -> None:
        super().__init__(directory, "rate", ctx)
        self._columnar = columnar
        self._samples: list[tuple[float, int]] = []
        self._flushed = time.time()

    def write_batch(self, records: list[Any]) -> None:
        now = time.time()
        n = records.num_rows if self._columnar else len(records)
        self._samples.append((now, n))
        if now - self._flushed >= FLUSH_EVERY_S:
            self._flush(now)

    def _flush(self, now: float) -> None:
        self._emit({"samples": self._samples})
        self._samples = []
        self._flushed = now

    def end_input(self) -> None:
        self._flush(time.time())


class LatencySink(es.sinks.Sink):
    """Samples end-to-end latency: sink wall time - the record's creation wall time.

    Rows carry the creation time at ``ts_index``; Arrow batches (``columnar``) in a
    ``ts`` column. Up to ``per_batch`` records of a batch are sampled, evenly spaced
    from its first to its last: the probe must not slow the job it measures (sampling
    every 8th record made the sink write ~100,000 samples a second, and the pause of
    writing them showed up as latency).

    Example: ``stream.sink_to(LatencySink("/tmp/probe", ts_index=2))``
    """

    accepts_batches = True

    def __init__(
        self, directory: str, *, ts_index: int = -1, columnar: bool = False, per_batch: int = 16
    ) -> None:
        self.directory = directory
        self.ts_index = ts_index
        self.columnar = columnar
        self.per_batch = per_batch

    def create_writer(self, ctx: es.sinks.SinkContext) -> es.sinks.SinkWriter:
        return _LatencyWriter(self, ctx)


class _LatencyWriter(_ProbeWriter):
    def __init__(self, sink: LatencySink, ctx: es.sinks.SinkContext) -> None:
        super().__init__(sink.directory, "latency", ctx)
        self._sink = sink
        self._samples: list[tuple[float, float]] = []

    def write_batch(self, records: list[Any]) -> None:
        now = time.time()
        n = len(records)
        if not n:
            return
        picks = _picks(n, self._sink.per_batch)
        if self._sink.columnar:
            column = records.column("ts").to_numpy()
            created = [float(column[p]) for p in picks]
        else:
            i = self._sink.ts_index
            created = [records[p][i] for p in picks]
        self._samples.extend((now, now - c) for c in created)

    def end_input(self) -> None:
        # Written once, at the end: formatting a second's samples (some 8,000) took
        # the measured task 5-10 ms every second, a pause the samples then showed.
        self._emit({"samples": [(round(t, 4), round(lat, 6)) for t, lat in self._samples]})
        self._samples = []


def _picks(n: int, want: int) -> list[int]:
    """Up to ``want`` positions of ``n``, evenly spaced from the first to the last."""
    want = min(n, want)
    return sorted({round(j * (n - 1) / max(want - 1, 1)) for j in range(want)})


class StampSink(es.sinks.Sink):
    """Records ``(wall time, value)`` for every ``every``-th record (counted across
    batches, so busy moments are sampled as often as quiet ones), the value being
    ``record[field]`` (an index or a key) of rows or column ``field`` of Arrow batches
    (``columnar``); with ``largest``, one pair per batch instead, with the largest
    value of up to 16 records of it (of the whole column on batches).

    Example: ``events.sink_to(StampSink("/tmp/probe", "clock", field="date_time", largest=True))``
    """

    accepts_batches = True

    def __init__(
        self,
        directory: str,
        kind: str,
        *,
        field: Any,
        columnar: bool = False,
        largest: bool = False,
        every: int = 1,
    ) -> None:
        self.directory = directory
        self.kind = kind
        self.field = field
        self.columnar = columnar
        self.largest = largest
        self.every = every

    def create_writer(self, ctx: es.sinks.SinkContext) -> es.sinks.SinkWriter:
        return _StampWriter(self, ctx)


class _StampWriter(_ProbeWriter):
    def __init__(self, sink: StampSink, ctx: es.sinks.SinkContext) -> None:
        super().__init__(sink.directory, sink.kind, ctx)
        self._sink = sink
        self._samples: list[tuple[float, Any]] = []
        self._flushed = time.time()
        self._skip = 0  # records before the next sampled one

    def write_batch(self, records: Any) -> None:
        now = time.time()
        sink = self._sink
        n = records.num_rows if sink.columnar else len(records)
        if not n:
            return
        if sink.largest:
            if sink.columnar:
                values = [pc.max(records.column(sink.field)).as_py()]
            else:
                values = [max(records[p][sink.field] for p in _picks(n, 16))]
        else:
            picks = range(self._skip, n, sink.every)
            self._skip = (self._skip - n) % sink.every
            if sink.columnar:
                values = records.column(sink.field).take(pa.array(picks, pa.int64())).to_pylist()
            else:
                values = [records[p][sink.field] for p in picks]
        self._samples.extend((now, v) for v in values)
        if now - self._flushed >= FLUSH_EVERY_S:
            self._flush(now)

    def _flush(self, now: float) -> None:
        self._emit({"samples": [(round(t, 4), v) for t, v in self._samples]})
        self._samples = []
        self._flushed = now

    def end_input(self) -> None:
        self._flush(time.time())


cloudpickle.register_pickle_by_value(sys.modules[__name__])
