"""A job that fails for good leaves no Kafka transaction open (D5).

Kafka topic -> exactly-once ``KafkaSink`` at parallelism 2 with checkpoints every
0.3 s; subtask by subtask records are pre-committed at barriers while one subtask
meets a record the sink cannot encode (``SinkError(retryable=False)``): the job fails
at once. The other subtask's transaction, pre-committed for a checkpoint that the
failure aborted, used to stay open until the broker's ``transaction.timeout.ms``
(holding back read_committed consumers); the job master's cancel now says that no
checkpoint above the last one that may have completed ever will, and the writers
abort what only those hold. What a completed checkpoint holds is left for a restore.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

import epochstream as es

pytest.importorskip("confluent_kafka")
pytest.importorskip("kafka")

pytestmark = [pytest.mark.slow]


def _poison_at_300(r: dict[str, Any]) -> Any:
    # A set: KafkaSink's JSON encoding fails, SinkError(retryable=False).
    return {"bad": {1, 2}} if r["i"] == 300 else r


def _job(
    env: es.Environment, kafka_server: Any, source_topic: str, out_topic: str, poison: bool
) -> None:
    (
        env.from_source(
            es.sources.KafkaSource(
                kafka_server.bootstrap, [source_topic], bounded="latest", value_format="json"
            )
        )
        .uid("in")
        .map(lambda r: (time.sleep(0.005), r)[1])  # a few checkpoints before the poison
        .uid("slow")
        .map(_poison_at_300 if poison else (lambda r: r))
        .uid("poison")
        .sink_to(
            es.sinks.KafkaSink(
                kafka_server.bootstrap, out_topic, transactional_id_prefix=f"open-{out_topic}"
            )
        )
        .uid("out")
    )


def _env(ckpt: Path) -> es.Environment:
    env = es.Environment(parallelism=2, runner="local", batch_size=20)
    env.enable_checkpointing(0.3, storage=str(ckpt))
    env.set_restart_strategy(es.restart.fixed_delay(attempts=1, delay=0.2))
    return env


@pytest.mark.parametrize("run", [1, 2])
def test_a_non_retryable_sink_error_leaves_open_only_what_a_completed_checkpoint_holds(
    tmp_path: Path, kafka_server: Any, run: int
) -> None:
    source_topic = kafka_server.new_topic("in", partitions=2)
    out_topic = kafka_server.new_topic("out", partitions=2)
    kafka_server.produce_json(source_topic, ({"i": i} for i in range(400)), partitions=2)
    env = _env(tmp_path / "ckpt")
    _job(env, kafka_server, source_topic, out_topic, poison=True)
    client = env.execute_async("kafka-sink-poison")
    with pytest.raises(es.JobExecutionError, match="cannot encode record"):
        client.result(timeout=120)

    # Whatever is still open is a completed checkpoint's, pre-committed before the
    # failure reached its commit: the job resumed from that checkpoint (without the
    # poison) commits it -- not aborts it, as it aborts lingering transactions -- and
    # the output is then exact with nothing open. Without a completed checkpoint
    # nothing may be open: no restore could ever end it.
    job_dir = tmp_path / "ckpt" / client.job_id
    open_before = {(p, o) for p, o, _, _ in kafka_server.read_open(out_topic, 2)}
    if not list(job_dir.glob("chk-*/_metadata")):
        assert open_before == set()
        return
    again = _env(tmp_path / "ckpt2")
    _job(again, kafka_server, source_topic, out_topic, poison=False)
    again.execute("kafka-sink-resumed", restore_from=str(job_dir))
    assert kafka_server.read_open(out_topic, 2) == []
    committed = kafka_server.read_committed(out_topic, 2)
    assert open_before <= {(p, o) for p, o, _, _ in committed}
    assert sorted(json.loads(v)["i"] for _, _, _, v in committed) == list(range(400))
