"""One-record-at-a-time operators: map, flat_map, filter and the rolling reduce.

Records keep their timestamps: map and reduce pass the input's timestamps list on as
it is (one output per input), filter keeps those of the records it keeps, flat_map
repeats each input's timestamp for every output it produces.

Example::

    op = MapOperator(spec, ctx)
    op.output = ChainedOutput(sink_op, produced=op.counters, consumed=sink_op.counters)
    op.process_batch([1, 2], [1_000, 2_000])
"""

from __future__ import annotations

from typing import Any

from epochstream.core.functions import FilterFunction, FlatMapFunction, MapFunction, ReduceFunction
from epochstream.core.state_descriptors import ValueStateDescriptor
from epochstream.exceptions import UserFunctionError
from epochstream.runtime.operators.base import Operator

__all__ = ["FilterOperator", "FlatMapOperator", "MapOperator", "ReduceOperator"]

_MISSING = object()

# The per-record loops below are plain ``for`` loops rather than comprehensions: when a
# user function raises, the loop variable still holds the record, so the error can
# name it at no cost on the normal path. (Map runs its loop in C and finds the record
# from the length of its partial output.)


class MapOperator(Operator):
    """``fn(record)`` per record."""

    def open(self) -> None:
        super().open()
        fn = self.function
        self._fn = self._per_record(fn.map if isinstance(fn, MapFunction) else fn)

    def process_batch(self, records: list[Any], timestamps: list[Any] | None) -> None:
        out: list[Any] = []
        try:
            # The loop runs in C; ``extend`` keeps the results before a failing record,
            # so their count is the failing record's position.
            out.extend(map(self._fn, records))
        except Exception as exc:
            raise UserFunctionError(self.ctx.task_name, records[len(out)], exc) from exc
        self.output.collect(out, timestamps)


class FlatMapOperator(Operator):
    """Every element of ``fn(record)``, each with the input record's timestamp."""

    def open(self) -> None:
        super().open()
        fn = self.function
        self._fn = self._per_record(fn.flat_map if isinstance(fn, FlatMapFunction) else fn)

    def process_batch(self, records: list[Any], timestamps: list[Any] | None) -> None:
        fn = self._fn
        out: list[Any] = []
        extend = out.extend
        x = None
        try:
            if timestamps is None:
                for x in records:
                    extend(fn(x))
            else:
                out_ts: list[Any] = []
                for x, ts in zip(records, timestamps, strict=True):
                    before = len(out)
                    extend(fn(x))
                    out_ts.extend([ts] * (len(out) - before))
        except Exception as exc:
            raise UserFunctionError(self.ctx.task_name, x, exc) from exc
        if out:
            self.output.collect(out, None if timestamps is None else out_ts)


class FilterOperator(Operator):
    """The records for which ``fn(record)`` is true."""

    def open(self) -> None:
        super().open()
        fn = self.function
        self._fn = self._per_record(fn.filter if isinstance(fn, FilterFunction) else fn)

    def process_batch(self, records: list[Any], timestamps: list[Any] | None) -> None:
        fn = self._fn
        out: list[Any] = []
        append = out.append
        out_ts: list[Any] | None = None
        x = None
        try:
            if timestamps is None:
                for x in records:
                    if fn(x):
                        append(x)
            else:
                out_ts = []
                keep_ts = out_ts.append
                for x, ts in zip(records, timestamps, strict=True):
                    if fn(x):
                        append(x)
                        keep_ts(ts)
        except Exception as exc:
            raise UserFunctionError(self.ctx.task_name, x, exc) from exc
        # Emitting outside the try: an error downstream is not this filter's.
        if out:
            self.output.collect(out, out_ts)


class ReduceOperator(Operator):
    """Rolling reduce: one value per key, the updated value emitted per record.

    The per-key values live in a backend value table; the keys written are declared
    to it once per batch (``touched``: the batch's keys list), which keeps the loop to
    one lookup and one store per record. Each output has its input record's timestamp.
    """

    STATE = ValueStateDescriptor("_reduce")

    def open(self) -> None:
        super().open()
        assert self.keyed is not None
        self._table = self.keyed.value_table(self.STATE)
        fn = self.function
        self._fn = fn.reduce if isinstance(fn, ReduceFunction) else fn

    def process_batch(self, records: list[Any], timestamps: list[Any] | None) -> None:
        self.process_keyed(records, self.keys_of(records), timestamps)

    def process_keyed(
        self, records: list[Any], keys: list[Any], timestamps: list[Any] | None
    ) -> None:
        table = self._table
        get = table.get
        fn = self._fn
        out: list[Any] = []
        append = out.append
        x = None
        try:
            for x, k in zip(records, keys, strict=True):
                cur = get(k, _MISSING)
                if cur is not _MISSING:
                    table[k] = cur = fn(cur, x)
                    append(cur)
                else:
                    table[k] = x
                    append(x)
        except Exception as exc:
            raise UserFunctionError(self.ctx.task_name, x, exc) from exc
        finally:
            table.touched(keys)
        self.output.collect(out, timestamps)
