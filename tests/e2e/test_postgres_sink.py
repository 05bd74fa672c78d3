"""PostgreSQL two-phase-commit sink end to end on Spark, with real crashes.

1. A monitored JSON-lines directory (files added while running, and while recovering)
   -> keyed running counts -> PostgresSink; a slot is SIGKILLed mid-run. The table holds
   exactly the failure-free updates and no prepared transaction is left over.
2. A crash injected between pre-commit and commit (the writer SIGKILLs its own slot
   process right before ``COMMIT PREPARED``): recovery commits the prepared transaction,
   exactly once.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from e2e_support import is_python_process

import epochstream as es
from epochstream.connectors.base import SinkContext
from epochstream.connectors.postgres import PgTxn, PostgresTwoPhaseWriter

psycopg = pytest.importorskip("psycopg")

pytestmark = [pytest.mark.slow, pytest.mark.spark]

KEYS = 5


def _query(dsn: str, sql: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(sql).fetchall()


@pytest.fixture
def dsn(postgres_dsn: str) -> str:
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE counts (user_id text, n bigint)")
    return postgres_dsn


def _drop_file(directory: Path, no: int, count: int, expected: collections.Counter[str]) -> None:
    rows = [{"user": f"u{(no * 7 + i) % KEYS}"} for i in range(count)]
    expected.update(r["user"] for r in rows)
    hidden = directory / f".f{no}.jsonl"
    hidden.write_text("".join(json.dumps(r) + "\n" for r in rows))
    os.replace(hidden, directory / f"f{no}.jsonl")


def _counts_to(env: es.Environment, source: es.DataStream, sink: es.sinks.Sink) -> None:
    (
        source.map(lambda r: (r["user"], 1))
        .uid("ones")
        .key_by(lambda t: t[0])
        .reduce(lambda a, b: (a[0], a[1] + b[1]))
        .uid("counts")
        .sink_to(sink)
        .uid("pg")
    )


def _exact(dsn: str, expected: collections.Counter[str]) -> None:
    got: dict[str, list[int]] = collections.defaultdict(list)
    for user, n in _query(dsn, "SELECT user_id, n FROM counts"):
        got[user].append(n)
    assert {u: sorted(ns) for u, ns in got.items()} == {
        u: list(range(1, c + 1)) for u, c in expected.items()
    }, "every update exactly once"
    assert _query(dsn, "SELECT gid FROM pg_prepared_xacts") == [], "no prepared transaction left"


def _wait_for_rows(dsn: str, count: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while (have := _query(dsn, "SELECT count(*) FROM counts")[0][0]) < count:
        assert time.monotonic() < deadline, f"{have} of {count} rows committed"
        time.sleep(0.2)


def test_monitored_files_to_postgres_survive_sigkill_of_a_slot(
    spark: Any, tmp_path: Path, dsn: str
) -> None:
    inbox = tmp_path / "in"
    inbox.mkdir()
    expected: collections.Counter[str] = collections.Counter()
    for no in range(2):
        _drop_file(inbox, no, 30, expected)
    env = es.Environment(parallelism=2, spark=spark)
    env.enable_checkpointing(0.3, storage=str(tmp_path / "ckpt"))
    env.set_restart_strategy(es.restart.fixed_delay(attempts=3, delay=0.2))
    source = env.from_files(str(inbox), format="jsonl", monitor_interval=0.2).uid("files")
    _counts_to(env, source, es.sinks.PostgresSink(dsn, "counts"))

    client = env.execute_async("files-to-postgres")
    try:
        client.wait_for_checkpoint(1)
        _drop_file(inbox, 2, 25, expected)
        _wait_for_rows(dsn, 20)  # mid-run: some, not all, updates committed
        pid = client.slot_pids()[1]
        assert is_python_process(pid)
        os.kill(pid, signal.SIGKILL)
        _drop_file(inbox, 3, 40, expected)  # arrives while the job recovers
        deadline = time.monotonic() + 60
        while client.status()["restarts"] < 1:
            assert time.monotonic() < deadline, "the SIGKILL caused no restart"
            time.sleep(0.1)
        _drop_file(inbox, 4, 15, expected)
        _wait_for_rows(dsn, sum(expected.values()))
        time.sleep(1.0)  # a duplicate would be committed by now
        client.cancel(savepoint=str(tmp_path / "sp"))
    finally:
        if not client.done:
            client.cancel()
    _exact(dsn, expected)


class _CrashBeforeCommit(PostgresTwoPhaseWriter):
    """SIGKILLs its own slot process right before its first ``COMMIT PREPARED``."""

    marker = ""

    def commit(self, txn: PgTxn) -> None:
        try:
            fd = os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            super().commit(txn)
            return
        os.write(fd, f"{txn.gid}\n".encode())
        os.close(fd)
        os.kill(os.getpid(), signal.SIGKILL)


class CrashingPostgresSink(es.sinks.PostgresSink):
    def __init__(self, dsn: str, table: str, marker: str) -> None:
        super().__init__(dsn, table)
        self.marker = marker

    def create_writer(self, ctx: SinkContext) -> PostgresTwoPhaseWriter:
        writer = _CrashBeforeCommit(self, ctx)
        writer.marker = self.marker
        return writer


def test_crash_between_prepare_and_commit_commits_exactly_once(
    spark: Any, tmp_path: Path, dsn: str
) -> None:
    inbox = tmp_path / "in"
    inbox.mkdir()
    expected: collections.Counter[str] = collections.Counter()
    for no in range(3):
        _drop_file(inbox, no, 40, expected)
    marker = tmp_path / "crashed"
    env = es.Environment(parallelism=2, spark=spark)
    env.enable_checkpointing(0.3, storage=str(tmp_path / "ckpt"))
    env.set_restart_strategy(es.restart.fixed_delay(attempts=3, delay=0.2))
    source = env.from_files(str(inbox), format="jsonl").uid("files")
    _counts_to(env, source, CrashingPostgresSink(dsn, "counts", str(marker)))

    result = env.execute("prepare-crash-commit")

    assert result.restarts >= 1
    crashed_gid = marker.read_text().strip()
    assert crashed_gid.startswith("es-counts-"), crashed_gid
    _exact(dsn, expected)
