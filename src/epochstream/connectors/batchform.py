"""What the sinks that take Arrow record batches share: telling a batch from a list of
rows, a batch's own columns (without the runtime's ``_ts`` and ``_kg``) and its rows
as JSON.

A sink writer's ``write_batch`` gets a list of rows from a row stream and a
``pyarrow.RecordBatch`` from a columnar one; a job that unions both forms gives one
writer both, so every call is checked on its own.

JSON of a batch row (:func:`json_rows`): one object per row, keyed by column name, in
column order. Integers, floats, strings, booleans and nulls as JSON's own; timestamps,
dates and times as ISO-8601 strings with the column's precision, converted by Arrow
(``"2026-11-28T10:00:00.123"`` for milliseconds, ``"...00.000005000"`` for
nanoseconds, ``Z`` after a UTC column's and the offset, ``+0100``, after another
zone's); decimals as strings (exact: ``"1.50"``); durations as seconds (a number);
binaries as base64 strings; lists and structs as arrays and objects (timestamps and
decimals inside them as Python's ``isoformat()`` and ``str()``).

Example::

    rows = user_columns(batch)          # without _ts/_kg
    json_rows(rows)                     # ['{"k":"a","n":1}', ...]
"""

from __future__ import annotations

import base64
import datetime
import decimal
import json
from collections.abc import Callable
from typing import Any

from epochstream.core.arrow import KG, TS, rows_of

__all__ = ["is_batch", "json_default", "json_rows", "row_dicts", "user_columns"]

_RUNTIME_COLUMNS = (TS, KG)


def is_batch(records: Any) -> bool:
    """Whether a ``write_batch`` argument is a columnar batch (else a list of rows).

    Example: ``is_batch(pa.record_batch({"k": [1]})) and not is_batch([{"k": 1}])``
    """
    # The runtime hands rows over as a list, always; anything else is a RecordBatch.
    return type(records) is not list


def user_columns(batch: Any) -> Any:
    """``batch`` without the runtime's event-time (``_ts``) and key-group (``_kg``)
    columns: what a sink writes (zero-copy).

    Example: ``user_columns(pa.record_batch({"k": [1], "_ts": [5]})).schema.names == ["k"]``
    """
    names = batch.schema.names
    if not any(name in _RUNTIME_COLUMNS for name in names):
        return batch
    keep = [i for i, name in enumerate(names) if name not in _RUNTIME_COLUMNS]
    return batch.select(keep)


def row_dicts(batch: Any) -> list[dict[str, Any]]:
    """The rows of ``batch``'s own columns as dicts, as ``to_rows()`` gives them.

    Example: ``row_dicts(pa.record_batch({"k": [1], "_ts": [5]})) == [{"k": 1}]``
    """
    return rows_of(user_columns(batch))


def json_default(value: Any) -> Any:
    """``json.dumps``'s ``default`` for the Python values of Arrow types that JSON lacks
    (module docstring); TypeError for any other.

    Example: ``json.dumps(decimal.Decimal("1.5"), default=json_default) == '"1.5"'``
    """
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def json_rows(
    batch: Any, *, separators: tuple[str, str] | None = None, allow_nan: bool = True
) -> list[str]:
    """One JSON object per row of ``batch``'s own columns (module docstring for the
    types); ``separators`` and ``allow_nan`` as ``json.dumps`` takes them.

    Example: ``json_rows(pa.record_batch({"k": ["a"]})) == ['{"k": "a"}']``
    """
    encode: Callable[[Any], str] = json.JSONEncoder(
        separators=separators, allow_nan=allow_nan, default=json_default
    ).encode
    return list(map(encode, rows_of(_as_text(user_columns(batch)))))


def _as_text(batch: Any) -> Any:
    """``batch`` with its timestamp, date, time and decimal columns as strings, converted
    by Arrow: a Python datetime or Decimal per value, formatted one by one, costs about
    twice the rest of a row's encoding (and a datetime drops nanoseconds)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    texts = (pa.types.is_timestamp, pa.types.is_date, pa.types.is_time, pa.types.is_decimal)
    columns = list(batch.columns)
    changed = False
    for i, field in enumerate(batch.schema):
        if not any(test(field.type) for test in texts):
            continue
        text = pc.cast(columns[i], pa.string())
        if pa.types.is_timestamp(field.type):  # Arrow writes "date time": ISO's "T"
            text = pc.replace_substring(text, " ", "T", max_replacements=1)
        columns[i] = text
        changed = True
    if not changed:
        return batch
    return pa.RecordBatch.from_arrays(columns, names=batch.schema.names)
