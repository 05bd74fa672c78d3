"""KafkaSink exactly-once end to end on Spark against a real Kafka-protocol broker
(Tansu, tests/kafka_server.py), with real crashes (SIGKILL of a slot process):

1. Kafka -> keyed running counts -> KafkaSink, a slot killed mid-run: the committed
   records of the output topic hold every update exactly once, and no transaction is
   left open.
2. A crash between a checkpoint's completion and the sink's commit (the writer
   SIGKILLs its own slot process right before its first commit): the restored job
   commits that transaction; nothing lost, nothing twice.
3. The driver SIGKILLed (with its local slot processes) under ``epochstream run
   --supervise`` while transactions are open or pre-committed: the resumed driver
   commits and aborts as a restore does; the output is exact.

Committed output is read by control markers (``kafka_server.read_committed``): Tansu's
read_committed fetches also return records of aborted transactions.
"""

from __future__ import annotations

import collections
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from e2e_support import Throttle, exactly_once_problems, run_with_slot_killed

import epochstream as es
from epochstream.connectors.base import SinkContext
from epochstream.connectors.kafka.sink import KafkaSink, KafkaTransactionalWriter, KafkaTxn

pytest.importorskip("confluent_kafka")
pytest.importorskip("kafka")

pytestmark = [pytest.mark.slow, pytest.mark.spark]

KEYS = 7


def _produce(kafka_server: Any, topic: str, n: int, partitions: int) -> dict[str, int]:
    """``n`` JSON events ``{"k": key}`` over ``partitions``; returns the count per key."""
    events = [{"k": f"k{(i * 13) % KEYS}"} for i in range(n)]
    kafka_server.produce_json(topic, events, partitions=partitions)
    return dict(collections.Counter(e["k"] for e in events))


def _env(spark: Any, ckpt: Path) -> es.Environment:
    env = es.Environment(parallelism=2, spark=spark)
    env.enable_checkpointing(0.3, storage=str(ckpt))
    env.set_restart_strategy(es.restart.fixed_delay(attempts=3, delay=0.2))
    return env


def _running_counts(
    env: es.Environment, bootstrap: str, topic: str, sink: es.sinks.Sink, per_second: float
) -> None:
    source = es.sources.KafkaSource(bootstrap, [topic], bounded="latest", value_format="json")
    (
        env.from_source(source)
        .uid("kafka-in")
        .map(Throttle(per_second))
        .uid("throttle")
        .map(lambda e: (e["k"], 1))
        .uid("ones")
        .key_by(lambda t: t[0])
        .reduce(lambda a, b: (a[0], a[1] + b[1]))
        .uid("counts")
        .sink_to(sink)
        .uid("kafka-out")
    )


def test_running_counts_to_kafka_exactly_once_through_a_sigkill(
    spark: Any, tmp_path: Path, kafka_server: Any
) -> None:
    source_topic = kafka_server.new_topic("in", partitions=2)
    out_topic = kafka_server.new_topic("out", partitions=2)
    expected = _produce(kafka_server, source_topic, 6_000, 2)
    env = _env(spark, tmp_path / "ckpt")
    sink = es.sinks.KafkaSink(
        bootstrap_servers=kafka_server.bootstrap,
        topic=out_topic,
        key_fn=lambda r: r[0],
        transactional_id_prefix=f"counts-{out_topic}",
    )
    # ~3 s per subtask at 1000 records/s: the kill lands mid-run.
    _running_counts(env, kafka_server.bootstrap, source_topic, sink, 1_000)

    result = run_with_slot_killed(env, "kafka-sink-crash", slot=1, after_checkpoints=2)

    assert result.restarts >= 1
    assert exactly_once_problems(kafka_server.read_committed_json(out_topic, 2), expected) == []
    assert kafka_server.read_open(out_topic, 2) == []  # the failed attempt's were aborted


class _CrashBeforeCommit(KafkaTransactionalWriter):
    """SIGKILLs its own slot process right before its first commit (once, by marker)."""

    marker = ""

    def commit(self, txn: KafkaTxn) -> None:
        try:
            fd = os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            super().commit(txn)
            return
        os.write(fd, f"{txn.transactional_id}\n".encode())
        os.close(fd)
        os.kill(os.getpid(), signal.SIGKILL)


class CrashingKafkaSink(KafkaSink):
    def __init__(self, bootstrap: str, topic: str, marker: str) -> None:
        super().__init__(
            bootstrap, topic, key_fn=lambda r: r[0], transactional_id_prefix=f"crash-{topic}"
        )
        self.marker = marker

    def create_writer(self, ctx: SinkContext) -> KafkaTransactionalWriter:
        writer = _CrashBeforeCommit(self, ctx, self.producer_factory())
        writer.marker = self.marker
        return writer


def test_crash_between_checkpoint_completion_and_commit_commits_exactly_once(
    spark: Any, tmp_path: Path, kafka_server: Any
) -> None:
    source_topic = kafka_server.new_topic("in", partitions=2)
    out_topic = kafka_server.new_topic("out", partitions=2)
    expected = _produce(kafka_server, source_topic, 3_000, 2)
    marker = tmp_path / "crashed"
    env = _env(spark, tmp_path / "ckpt")
    sink = CrashingKafkaSink(kafka_server.bootstrap, out_topic, str(marker))
    _running_counts(env, kafka_server.bootstrap, source_topic, sink, 1_500)

    result = env.execute("kafka-commit-crash")

    assert result.restarts >= 1
    crashed_id = marker.read_text().strip()
    assert crashed_id.startswith(f"crash-{out_topic}-"), crashed_id
    assert exactly_once_problems(kafka_server.read_committed_json(out_topic, 2), expected) == []
    assert kafka_server.read_open(out_topic, 2) == []


SUPERVISED_JOB = Path(__file__).parent / "jobs" / "kafka_counting_job.py"
SUPERVISED_EVENTS = 20_000


def _completed_checkpoints(ckpt: Path) -> int:
    """The highest completed checkpoint id under ``ckpt`` (retention keeps only the last)."""
    return max((int(p.parent.name[4:]) for p in ckpt.glob("*/chk-*/_metadata")), default=0)


def test_supervised_driver_sigkilled_with_transactions_pending_output_is_exact(
    tmp_path: Path, kafka_server: Any
) -> None:
    out_topic = kafka_server.new_topic("out", partitions=2)
    ckpt = tmp_path / "ckpt"
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", XDG_STATE_HOME=str(tmp_path / "state"))
    supervisor = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "epochstream.cli",
            "run",
            "--supervise",
            "--runner",
            "local",
            "--checkpoint-dir",
            str(ckpt),
            str(SUPERVISED_JOB),
            kafka_server.bootstrap,
            out_topic,
            str(SUPERVISED_EVENTS),
        ],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert supervisor.stderr is not None
        line = supervisor.stderr.readline()
        match = re.search(r"supervising driver pid (\d+)", line)
        assert match, line
        deadline = time.monotonic() + 60
        while _completed_checkpoints(ckpt) < 2:
            assert time.monotonic() < deadline, "two checkpoints did not complete within 60 s"
            assert supervisor.poll() is None, "the job ended before the kill"
            time.sleep(0.1)
        # The driver and its slot processes die at once; a transaction is always open
        # (the input is rate-limited), and pre-committed ones may await their commit.
        os.killpg(int(match.group(1)), signal.SIGKILL)
        _out, err = supervisor.communicate(timeout=120)
    finally:
        if supervisor.poll() is None:
            os.killpg(supervisor.pid, signal.SIGKILL)
            supervisor.wait(30)
    assert supervisor.returncode == 0, (line + err)[-3000:]
    assert "driver killed by SIGKILL; restarting it with --resume" in err
    expected = {k: sum(1 for i in range(SUPERVISED_EVENTS) if i % 13 == k) for k in range(13)}
    assert exactly_once_problems(kafka_server.read_committed_json(out_topic, 2), expected) == []
    assert kafka_server.read_open(out_topic, 2) == []
