"""Turning a fetch's messages of one partition into records or an Arrow batch.

A decoder takes the messages of one partition (in offset order) and returns the
records, and the error of the first bad message if there is one: the records before
it are kept, the bad message is dead-lettered (``dead_letter`` set; decoding goes on)
or ends the batch (the reader raises :class:`SourceDecodeError` on its next poll).
The fast path decodes the whole batch in one go (a list comprehension; in columnar
mode one ``pyarrow.json`` call, :mod:`epochstream.connectors.jsoncolumns`); only a
batch that fails is decoded message by message, to find the bad one.

Example::

    decoder = RowDecoder("json")
    records, error = decoder.decode("bids", 0, messages, dead_letter=None)
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from epochstream.connectors.jsoncolumns import JsonColumns, excerpt
from epochstream.exceptions import ConfigurationError, SourceDecodeError

__all__ = ["ColumnarDecoder", "DeadLetter", "RowDecoder", "decode_error", "value_decoder"]

DeadLetter = Callable[[dict[str, Any]], None]
_FORMATS = ("bytes", "text", "json")


def value_decoder(value_format: str | Callable[[bytes | None], Any]) -> Callable[[Any], Any]:
    """The function decoding one message value for ``value_format``.

    A callable gets a null value (a tombstone) as ``None`` and decides; the built-in
    ones fail on it, and :class:`RowDecoder` makes it the record ``None`` off the fast
    path (no per-record check).

    Example: ``value_decoder("json")(b'{"a": 1}') == {"a": 1}``
    """
    if callable(value_format):
        return value_format
    if value_format == "bytes":
        return _raw
    if value_format == "text":
        return _utf8
    if value_format == "json":
        return json.loads
    raise ConfigurationError(
        f"KafkaSource value_format must be one of {', '.join(_FORMATS)} or a callable, got {value_format!r}"
    )


def _raw(value: bytes | None) -> bytes | None:
    return value


def _utf8(value: bytes) -> str:
    return value.decode("utf-8")


def decode_error(
    topic: str, partition: int, offset: int, fmt: str, reason: str, value: Any
) -> SourceDecodeError:
    """The error naming the message that did not decode (``path`` is ``"<topic>/<partition>"``)."""
    return SourceDecodeError(
        f"cannot decode Kafka message {topic}/{partition} at offset {offset} as {fmt}: "
        f"{reason}: {excerpt(value)}",
        path=f"{topic}/{partition}",
        offset=offset,
    )


def _dead(topic: str, partition: int, offset: int, reason: str, value: Any) -> dict[str, Any]:
    return {
        "topic": topic,
        "partition": partition,
        "offset": offset,
        "error": reason,
        "value": value,
    }


class RowDecoder:
    """Decodes message values to records (``value_format``; a null value is ``None``).

    Example: ``RowDecoder("json").decode("t", 0, msgs, None)  # ([{...}, ...], None)``
    """

    def __init__(self, value_format: str | Callable[[bytes | None], Any]) -> None:
        self._decode = value_decoder(value_format)
        # A tombstone in a built-in format is the record None (a callable decides itself).
        self._none_for_null = isinstance(value_format, str)
        self._name = (
            value_format
            if isinstance(value_format, str)
            else getattr(value_format, "__qualname__", "a callable")
        )

    def decode(
        self, topic: str, partition: int, messages: list[Any], dead_letter: DeadLetter | None
    ) -> tuple[list[Any], list[Any], SourceDecodeError | None]:
        """``(records, their messages, error)``: the messages give offsets and timestamps."""
        decode = self._decode
        try:
            return [decode(m.value()) for m in messages], messages, None
        except Exception:  # some value is bad: _one_by_one finds it and reports it
            return self._one_by_one(topic, partition, messages, dead_letter)

    def _one_by_one(
        self, topic: str, partition: int, messages: list[Any], dead_letter: DeadLetter | None
    ) -> tuple[list[Any], list[Any], SourceDecodeError | None]:
        decode = self._decode
        records: list[Any] = []
        kept: list[Any] = []
        for m in messages:
            value = m.value()
            try:
                record = None if value is None and self._none_for_null else decode(value)
            except Exception as exc:  # reported below: dead-lettered or raised
                reason = f"{type(exc).__name__}: {exc}"
                if dead_letter is None:
                    error = decode_error(
                        topic, partition, m.offset(), str(self._name), reason, value
                    )
                    return records, kept, error
                dead_letter(_dead(topic, partition, m.offset(), reason, value))
                continue
            records.append(record)
            kept.append(m)
        return records, kept, None


class ColumnarDecoder:
    """Decodes a partition's messages into one ``pyarrow.RecordBatch``.

    Columns: the value (``value``: binary for ``"bytes"``, string for ``"text"``; for
    ``"json"`` the declared ``schema``'s fields, decoded by ``pyarrow.json``), then
    ``key`` (binary), ``topic``, ``partition``, ``offset`` and ``timestamp`` (int64 ms).

    Example::

        ColumnarDecoder("json", pa.schema([("user", pa.string()), ("amount", pa.int64())]))
    """

    def __init__(self, value_format: str, schema: Any) -> None:
        import pyarrow as pa

        if value_format not in _FORMATS:
            raise ConfigurationError(
                f"KafkaSource(columnar=True) needs value_format 'bytes', 'text' or 'json', got {value_format!r}"
            )
        if value_format == "json" and schema is None:
            raise ConfigurationError(
                "KafkaSource(columnar=True, value_format='json') needs schema=pa.schema([...]) "
                "(the columns decoded from each JSON object)"
            )
        self._format = value_format
        # Only the JSON format has value columns (bytes and text: one ``value`` column).
        self._json = JsonColumns(schema if schema is not None else [])
        self._meta = [
            ("key", pa.binary()),
            ("topic", pa.string()),
            ("partition", pa.int32()),
            ("offset", pa.int64()),
            ("timestamp", pa.int64()),
        ]

    @property
    def schema(self) -> Any:
        """The schema of every batch this decoder makes."""
        import pyarrow as pa

        if self._format == "json":
            fields = list(self._json.schema)
        else:
            fields = [pa.field("value", pa.binary() if self._format == "bytes" else pa.string())]
        return pa.schema([*fields, *(pa.field(n, t) for n, t in self._meta)])

    def decode(
        self, topic: str, partition: int, messages: list[Any], dead_letter: DeadLetter | None
    ) -> tuple[Any, list[Any], SourceDecodeError | None]:
        """``(batch, the messages in it, error)``."""
        values = [m.value() for m in messages]
        kept = messages
        error = None
        if self._format == "json":
            columns, indices, bad = self._json.decode(values, keep_going=dead_letter is not None)
            for index, reason in bad:
                m = messages[index]
                if dead_letter is None:
                    error = decode_error(topic, partition, m.offset(), "json", reason, m.value())
                else:
                    dead_letter(_dead(topic, partition, m.offset(), reason, m.value()))
            if bad:
                kept = [messages[i] for i in indices]
        else:
            columns, kept, error = self._value_column(
                topic, partition, messages, values, dead_letter
            )
        return self._batch(topic, partition, columns, kept), kept, error

    def _batch(self, topic: str, partition: int, columns: list[Any], messages: list[Any]) -> Any:
        import pyarrow as pa

        n = len(messages)
        meta = [
            pa.array([m.key() for m in messages], pa.binary()),
            pa.array([topic] * n, pa.string()),
            pa.array([partition] * n, pa.int32()),
            pa.array([m.offset() for m in messages], pa.int64()),
            pa.array([m.timestamp()[1] for m in messages], pa.int64()),
        ]
        return pa.RecordBatch.from_arrays([*columns, *meta], schema=self.schema)

    def _value_column(
        self,
        topic: str,
        partition: int,
        messages: list[Any],
        values: list[bytes | None],
        dead_letter: DeadLetter | None,
    ) -> tuple[list[Any], list[Any], SourceDecodeError | None]:
        import pyarrow as pa

        if self._format == "bytes":
            return [pa.array(values, pa.binary())], messages, None
        binary = pa.array(values, pa.binary())
        try:
            return [binary.cast(pa.string())], messages, None
        except pa.ArrowInvalid:  # not UTF-8 somewhere: find where
            records, kept, error = RowDecoder("text")._one_by_one(
                topic, partition, messages, dead_letter
            )
            return [pa.array(records, pa.string())], kept, error
