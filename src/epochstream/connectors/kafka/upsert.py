"""Upsert records for Kafka (Flink's ``upsert-kafka``): a changelog written as a
compacted topic's records, keyed by the key columns.

Each change becomes one record whose key is the JSON object of the row's key columns
(``{"bidder":1001}``, Flink's ``key.format`` json) and whose value is the JSON object of
the row (``value.format`` json; without the key columns when ``value_except_key``, as
Flink's ``'value.fields-include' = 'EXCEPT_KEY'``). An insert or an update's new value
(``+I``, ``+U``) is the key's value; a delete (``-D``) is a tombstone, a record with a
null value; an update's old value (``-U``) is dropped: the ``+U`` that follows
replaces it by key. Reading the topic as a compacted view (the last record per key,
a tombstone deleting the key) gives the changelog applied. Records of one key go to
one partition (the key's bytes choose it), so their order is kept.

A batch without an ``_op`` column and plain rows (dicts) are all upserts.

Example::

    enc = UpsertEncoder("counts", ["word"])
    enc.encode_batch(changelog_batch)   # [("counts", b'{"word":"a"}', b'{"word":"a","n":2}', row), ...]
"""

from __future__ import annotations

import json
from typing import Any

from epochstream.connectors.batchform import json_default, json_rows, row_dicts, user_columns
from epochstream.connectors.kafka.sink import RecordEncoder
from epochstream.core.changelog import OP, RowKind
from epochstream.exceptions import ConfigurationError, SinkError, short_repr

__all__ = ["UpsertEncoder"]


class UpsertEncoder(RecordEncoder):
    """Encodes changes as upsert records keyed by ``key_columns`` (module docstring).

    Example: ``UpsertEncoder("out", ["k"]).encode({"k": "a", "n": 1})`` gives
    ``("out", b'{"k":"a"}', b'{"k":"a","n":1}')``
    """

    def __init__(self, topic: str, key_columns: list[str], *, value_except_key: bool = False):
        if not key_columns:
            raise ConfigurationError("KafkaSink upsert: key_columns must name a column")
        if OP in key_columns:
            raise ConfigurationError(f"KafkaSink upsert: {OP!r} is the row kind, not a key")
        super().__init__(topic, None, None, "json")
        self.key_columns = list(key_columns)
        self.value_except_key = value_except_key

    def encode(self, record: Any) -> tuple[str, bytes | None, bytes | None]:
        """A row (a dict of column to value) as an upsert of its key."""
        if not isinstance(record, dict) or any(k not in record for k in self.key_columns):
            raise SinkError(
                f"KafkaSink upsert: record {short_repr(record)} is not a dict with the key "
                f"columns {self.key_columns}",
                retryable=False,
            )
        key = {k: record[k] for k in self.key_columns}
        value = (
            {k: v for k, v in record.items() if k not in key} if self.value_except_key else record
        )
        try:
            return str(self.topic), _json(key), _json(value)
        except (TypeError, ValueError) as exc:
            raise SinkError(
                f"KafkaSink upsert: cannot encode record {short_repr(record)} as JSON: {exc}",
                retryable=False,
            ) from exc

    def encode_batch(
        self, batch: Any
    ) -> list[tuple[str, bytes | None, bytes | None, dict[str, Any]]]:
        """``(topic, key, value, row)`` per change of ``batch`` that writes a record:
        ``value`` is None for a ``-D`` (a tombstone); ``-U`` rows give none."""
        import pyarrow.compute as pc

        batch = user_columns(batch)
        names = batch.schema.names
        missing = [k for k in self.key_columns if k not in names]
        if missing:
            raise SinkError(
                f"KafkaSink upsert: a batch with the columns {names} lacks the key columns "
                f"{missing}",
                retryable=False,
            )
        deletes = [False] * batch.num_rows
        if OP in names:
            kinds = batch.column(OP)
            batch = batch.filter(pc.not_equal(kinds, RowKind.UPDATE_BEFORE.value))
            deletes = pc.equal(batch.column(OP), RowKind.DELETE.value).to_pylist()
            batch = batch.drop_columns([OP])
        values = batch.drop_columns(self.key_columns) if self.value_except_key else batch
        keys = json_rows(batch.select(self.key_columns), separators=(",", ":"))
        try:
            texts = json_rows(values, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise SinkError(
                f"KafkaSink upsert: cannot encode a batch of {names} as JSON: {exc}",
                retryable=False,
            ) from exc
        topic = str(self.topic)
        return [
            (topic, key.encode(), None if delete else text.encode(), row)
            for key, text, delete, row in zip(keys, texts, deletes, row_dicts(batch), strict=True)
        ]


def _json(value: Any) -> bytes:
    # NaN and Infinity are not JSON: a consumer's parser would reject the record.
    return json.dumps(value, separators=(",", ":"), allow_nan=False, default=json_default).encode()
