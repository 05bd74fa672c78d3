"""JSON objects, one per message, to the Arrow columns of a declared schema.

The one JSON-to-Arrow path of the message sources (Kafka and JetStream in columnar
mode, and so their SQL tables): a whole fetch goes through one ``pyarrow.json`` read;
only a fetch holding a bad value is decoded value by value, to find it. The caller
names the place of a bad value (topic/partition/offset, stream/sequence): this module
knows values only by their index.

Example::

    columns = JsonColumns(pa.schema([("user", pa.string()), ("amount", pa.int64())]))
    arrays, kept, bad = columns.decode([b'{"user": "a", "amount": 1}'], keep_going=False)
"""

from __future__ import annotations

import io
from typing import Any

__all__ = ["JsonColumns", "excerpt"]

_EXCERPT = 200


def excerpt(value: bytes | None) -> str:
    """A bad value as an error shows it: its first 200 bytes.

    Example: ``excerpt(b"{oops") == "b'{oops'"``
    """
    if value is None:
        return "null value (a tombstone)"
    return repr(value[:_EXCERPT]) + ("..." if len(value) > _EXCERPT else "")


class JsonColumns:
    """Decodes JSON object values to the columns of ``schema`` (a ``pyarrow.Schema`` or
    a list of fields).

    A field of another JSON type than the schema's (1.5 for an int64, ``"5"`` for a
    number, an int beyond int64) is an error, never a silent cast; fields the schema
    lacks are ignored, missing ones null.

    Example::

        JsonColumns([("k", pa.string())]).decode([b'{"k": "a"}'], keep_going=False)
    """

    def __init__(self, schema: Any) -> None:
        import pyarrow as pa

        self.schema: Any = pa.schema(schema)

    def decode(
        self, values: list[bytes | None], *, keep_going: bool
    ) -> tuple[list[Any], list[int], list[tuple[int, str]]]:
        """``(columns, indices of the values in them, (index, reason) of each bad value)``.

        Without ``keep_going`` decoding stops at the first bad value: the columns hold
        the values before it, and ``bad`` holds it alone.
        """
        columns = self._all_at_once(values)
        if columns is not None:
            return columns, list(range(len(values))), []
        return self._one_by_one(values, keep_going)

    def _parse_options(self) -> Any:
        import pyarrow.json as pj

        # One parser for the whole fetch and for a single value alike, so a value
        # decodes the same way on both paths.
        return pj.ParseOptions(
            explicit_schema=self.schema,
            unexpected_field_behavior="ignore",
            newlines_in_values=True,
        )

    def _empty(self) -> list[Any]:
        import pyarrow as pa

        return [pa.array([], f.type) for f in self.schema]

    def _all_at_once(self, values: list[bytes | None]) -> list[Any] | None:
        """The whole fetch through one ``pyarrow.json`` read; None if any value is bad."""
        import pyarrow as pa
        import pyarrow.json as pj

        if not values:
            return self._empty()
        if any(v is None for v in values):
            return None
        try:
            table = pj.read_json(
                io.BytesIO(b"\n".join(v for v in values if v is not None)),
                parse_options=self._parse_options(),
            )
        except pa.ArrowInvalid:
            return None
        if table.num_rows != len(values):  # a value held several objects, or none
            return None
        return [table.column(f.name).combine_chunks() for f in self.schema]

    def _one_by_one(
        self, values: list[bytes | None], keep_going: bool
    ) -> tuple[list[Any], list[int], list[tuple[int, str]]]:
        import pyarrow as pa
        import pyarrow.json as pj

        options = self._parse_options()
        tables: list[Any] = []
        kept: list[int] = []
        bad: list[tuple[int, str]] = []
        for index, value in enumerate(values):
            try:
                if value is None:
                    raise ValueError("a null value (a tombstone), not a JSON object")
                table = pj.read_json(io.BytesIO(value), parse_options=options)
                if table.num_rows != 1:
                    raise ValueError(f"{table.num_rows} JSON objects in one message, not 1")
            except (ValueError, pa.ArrowException) as exc:  # ArrowInvalid is a ValueError
                bad.append((index, f"{type(exc).__name__}: {exc}"))
                if not keep_going:
                    break
                continue
            tables.append(table)
            kept.append(index)
        if not tables:
            return self._empty(), kept, bad
        table = pa.concat_tables(tables)
        return [table.column(f.name).combine_chunks() for f in self.schema], kept, bad
