"""A broker that goes away while a job runs (D10): the job master's partition
discovery never blocks its event loop, and a reader fails naming Kafka instead of
polling nothing until a checkpoint expires. No broker: fakes and a closed port."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import pytest

from epochstream.connectors.kafka import KafkaSource
from epochstream.connectors.kafka.client import BrokerWatch, ConfluentFetcher, KafkaClientError
from epochstream.connectors.kafka.enumerator import KafkaPartitionEnumerator


class HangingMetadata:
    """Lists ``bids/0..n-1`` once ``release`` is set: a broker that does not answer."""

    def __init__(self, release: threading.Event, partitions: int) -> None:
        self.release = release
        self.n = partitions

    def partitions(self, topics: list[str] | None) -> dict[str, int]:
        self.release.wait(10.0)
        return {"bids": self.n}

    def close(self) -> None:
        pass


def test_discovery_returns_at_once_while_the_broker_does_not_answer() -> None:
    release = threading.Event()
    src = KafkaSource("127.0.0.1:1", ["bids"], discovery_interval=5.0)
    enum = KafkaPartitionEnumerator(
        src,
        1,
        [("bids", 0)],
        lambda: HangingMetadata(release, 1),
        lambda: HangingMetadata(release, 2),
    )
    t0 = time.monotonic()
    assert enum.discover(100.0) == []
    assert time.monotonic() - t0 < 0.5, "discovery blocked the job master's event loop"
    # Looked at again soon, not after a whole interval.
    assert enum.next_discovery() == pytest.approx(100.2)
    assert enum.discover(100.2) == []
    release.set()
    deadline = time.monotonic() + 5.0
    found: list[Any] = []
    while not found and time.monotonic() < deadline:
        found = enum.discover(101.0)
        time.sleep(0.01)
    assert [s.split_id for s in found] == ["bids/1"]
    # The next listing is due an interval after this one ended, not after it started.
    assert enum.next_discovery() == pytest.approx(106.0)
    assert enum.snapshot() == [("bids", 0), ("bids", 1)]


def test_broker_watch_counts_from_the_first_connection_error_until_an_answer() -> None:
    now = [0.0]
    watch = BrokerWatch(15.0, clock=lambda: now[0])
    watch.on_error(13, "not a connection error")
    now[0] = 100.0
    assert not watch.overdue()
    watch.on_error(-195, "Connect to 127.0.0.1:9092 failed")
    now[0] = 110.0
    watch.on_error(-187, "1/1 brokers are down")
    assert not watch.overdue() and watch.down_for() == 10.0
    now[0] = 115.0
    assert watch.overdue() and watch.last_error == "1/1 brokers are down"
    watch.reached()
    assert not watch.overdue()


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return int(port)


def test_a_reader_whose_broker_is_gone_fails_naming_kafka_and_its_partitions() -> None:
    bootstrap = f"127.0.0.1:{_closed_port()}"
    fetcher = ConfluentFetcher(
        {"bootstrap.servers": bootstrap, "log_level": 0}, "g", unreachable_after=1.0
    )
    try:
        fetcher.assign([("bids", 0, 0), ("bids", 1, 5)])
        t0 = time.monotonic()
        with pytest.raises(
            KafkaClientError, match=rf"Kafka broker unreachable: {bootstrap} .* bids/0, bids/1"
        ):
            while time.monotonic() - t0 < 10.0:
                assert fetcher.fetch(100, 0.05) == []
        assert time.monotonic() - t0 < 6.0
        # The group commit (monitoring only) does not wait ~45 s for a coordinator.
        with pytest.raises(KafkaClientError, match="skipped while the broker is unreachable"):
            fetcher.commit([("bids", 0, 3)])
    finally:
        fetcher.close()


def test_a_producer_whose_broker_is_gone_fails_within_the_sink_timeout(monkeypatch: Any) -> None:
    from epochstream.connectors.kafka import producer
    from epochstream.exceptions import SinkError

    monkeypatch.setattr(producer, "TIMEOUT", 1.0)
    bootstrap = f"127.0.0.1:{_closed_port()}"
    t0 = time.monotonic()
    with pytest.raises(SinkError, match=rf"cannot create a producer \(out-0-0\).*{bootstrap}"):
        producer.KafkaPythonProducer({"bootstrap_servers": bootstrap}, "out-0-0")
    # kafka-python's own default would wait 30 s.
    assert time.monotonic() - t0 < 6.0
