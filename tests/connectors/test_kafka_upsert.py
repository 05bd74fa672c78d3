"""KafkaSink(upsert_key=...): a changelog as upsert records (Flink's upsert-kafka) —
the encoding, and a real Kafka-protocol broker (Tansu) whose committed records, read
as a compacted topic, equal the changelog applied by key."""

from __future__ import annotations

import datetime
import json
import random
from typing import Any

import pyarrow as pa
import pytest

from epochstream.connectors.base import SinkContext
from epochstream.connectors.kafka.sink import KafkaSink
from epochstream.connectors.kafka.upsert import UpsertEncoder
from epochstream.core.changelog import OP, RowKind
from epochstream.exceptions import ConfigurationError, SinkError

SCHEMA = pa.schema([("k", pa.string()), ("n", pa.int64()), (OP, pa.int8())])


def changes(*rows: tuple[str, int, RowKind]) -> pa.RecordBatch:
    return pa.record_batch(
        [
            pa.array([r[0] for r in rows], pa.string()),
            pa.array([r[1] for r in rows], pa.int64()),
            pa.array([r[2].value for r in rows], pa.int8()),
        ],
        schema=SCHEMA,
    )


def compacted(records: list[tuple[int, int, bytes | None, bytes | None]]) -> dict[str, Any]:
    """A compacted topic's view: per key its last value, a tombstone deleting it."""
    view: dict[str, Any] = {}
    for _, _, key, value in sorted(records, key=lambda r: (r[0], r[1])):
        assert key is not None, "every upsert record has a key"
        if value is None:
            view.pop(key.decode(), None)
        else:
            view[key.decode()] = json.loads(value)
    return view


def test_changes_become_keyed_records_and_deletes_tombstones() -> None:
    encoded = UpsertEncoder("out", ["k"]).encode_batch(
        changes(
            ("a", 1, RowKind.INSERT),
            ("a", 1, RowKind.UPDATE_BEFORE),
            ("a", 2, RowKind.UPDATE_AFTER),
            ("b", 5, RowKind.DELETE),
        )
    )
    assert [(t, k, v) for t, k, v, _ in encoded] == [
        ("out", b'{"k":"a"}', b'{"k":"a","n":1}'),
        ("out", b'{"k":"a"}', b'{"k":"a","n":2}'),
        ("out", b'{"k":"b"}', None),
    ]
    assert encoded[2][3] == {"k": "b", "n": 5}, "the row names the record in errors"
    when = datetime.datetime(2026, 11, 28, 10, 0)
    except_key = UpsertEncoder("out", ["k", "at"], value_except_key=True)
    batch = pa.record_batch({"k": ["a"], "at": pa.array([when], pa.timestamp("ms")), "n": [3]})
    assert [(k, v) for _, k, v, _ in except_key.encode_batch(batch)] == [
        (b'{"k":"a","at":"2026-11-28T10:00:00.000"}', b'{"n":3}')
    ]
    assert except_key.encode({"k": "a", "at": when, "n": 3}) == (
        "out",
        b'{"k":"a","at":"2026-11-28T10:00:00"}',
        b'{"n":3}',
    )


def test_bad_records_and_settings_fail_clearly() -> None:
    encoder = UpsertEncoder("out", ["k"])
    with pytest.raises(SinkError, match=r"lacks the key columns \['k'\]") as info:
        encoder.encode_batch(pa.record_batch({"n": [1]}))
    assert info.value.suppress_restarts
    with pytest.raises(SinkError, match="is not a dict with the key columns"):
        encoder.encode({"n": 1})
    with pytest.raises(SinkError, match=r"cannot encode .* as JSON"):
        encoder.encode({"k": "a", "n": float("nan")})
    with pytest.raises(ConfigurationError, match="row kind"):
        UpsertEncoder("out", [OP])
    with pytest.raises(ConfigurationError, match="no key_fn"):
        KafkaSink("h:9092", "out", upsert_key=["k"], key_fn=str, delivery="none")
    with pytest.raises(ConfigurationError, match="with upsert_key= only"):
        KafkaSink("h:9092", "out", value_except_key=True, delivery="none")


def test_committed_records_compact_to_the_changelog_applied(kafka_server: Any) -> None:
    pytest.importorskip("kafka")
    topic = kafka_server.new_topic("upsert", partitions=3)
    sink = KafkaSink(
        kafka_server.bootstrap, topic, upsert_key=["k"], transactional_id_prefix=f"p-{topic}"
    )
    w = sink.create_writer(SinkContext(0, 1, attempt=0, job_id="upsertjob", checkpointing=True))
    rng = random.Random(3)
    current: dict[str, int] = {}
    kinds: list[RowKind] = []
    try:
        w.restore([])
        for checkpoint in (1, 2, 3):
            rows: list[tuple[str, int, RowKind]] = []
            for _ in range(200):
                k = f"k{rng.randrange(30)}"
                if k in current and rng.random() < 0.25:
                    rows.append((k, current.pop(k), RowKind.DELETE))
                elif k in current:
                    rows.append((k, current[k], RowKind.UPDATE_BEFORE))
                    current[k] = rng.randrange(1000)
                    rows.append((k, current[k], RowKind.UPDATE_AFTER))
                else:
                    current[k] = rng.randrange(1000)
                    rows.append((k, current[k], RowKind.INSERT))
            w.write_batch(changes(*rows))
            kinds += [r[2] for r in rows]
            w.snapshot(checkpoint)
            w.notify_checkpoint_complete(checkpoint)
            expected = {
                json.dumps({"k": k}, separators=(",", ":")): {"k": k, "n": n}
                for k, n in current.items()
            }
            assert compacted(kafka_server.read_committed(topic, 3)) == expected
    finally:
        w.close()
    records = kafka_server.read_committed(topic, 3)
    assert sum(v is None for _, _, _, v in records) == kinds.count(RowKind.DELETE)
    assert len(records) == len(kinds) - kinds.count(RowKind.UPDATE_BEFORE), "-U writes none"
