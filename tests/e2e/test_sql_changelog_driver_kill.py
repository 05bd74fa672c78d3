"""A regular JOIN + GROUP BY upserted into PostgreSQL through a slot SIGKILL and a driver
SIGKILL under ``epochstream run --supervise``, with every snapshot a reader can take on
the way checked against DuckDB over a prefix of the input.

The job (jobs/sql_join_upsert_job.py) writes, per seller, ``COUNT(*)``, ``SUM(price)`` and
``MAX(price)`` of the bids on its auctions (``auction JOIN bid``) into ``per_seller``
(PRIMARY KEY seller, ``transactional_upsert``), at parallelism 2 over rate-limited
Nexmark tables. A slot is killed after the first commit, then the driver's whole
process group; the supervisor restarts the driver with ``--resume``.

What is checked:

1. At the end ``per_seller`` equals DuckDB's answer over all the input.
2. Prefix consistency (strict form). With fewer events than one split block, each
   Nexmark table is ONE split read in position order, so a checkpoint's source state
   is a pair of cuts ``(a, b)``: auctions at positions ``< a`` and bids at positions
   ``< b``. The join and the aggregation are deterministic functions of what they
   have read, so after checkpoint ``c`` the table is exactly the answer over the cuts
   of ``c``. The job master applies a checkpoint's changes of every sink subtask in ONE
   transaction, so a REPEATABLE READ snapshot shows the table at one completed
   checkpoint: the check is that there are cuts ``(a, b)`` whose answer equals the
   snapshot's rows (no extra, missing or different row). The search is exact: for an
   auction cut (every one is tried), the rows included by a bid cut are a prefix, in
   bid position order, of the join rows whose auction is included, so the snapshot's
   count names the only candidate bid cut.
3. Nothing committed is lost: across snapshots, the sink's checkpoint in
   ``epochstream_sink_checkpoints`` and the total count never go down.
"""

from __future__ import annotations

import itertools
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from e2e_support import is_python_process
from sql_join_upsert_job import QUERY

import epochstream as es
from epochstream.connectors.nexmark import NexmarkConfig, nexmark_columns

sys.path.insert(0, str(Path(__file__).parents[1] / "sql"))

from duckdb_oracle import run_duckdb
from nexmark_tables import nexmark_arrow_tables

psycopg = pytest.importorskip("psycopg")

pytestmark = pytest.mark.slow

JOB = Path(__file__).parent / "jobs" / "sql_join_upsert_job.py"
EVENTS = 8_000  # under one split block (8,192 positions): one split per Nexmark table
RATE = 600  # positions/s in total; the one reading subtask gets half: about 27 s of input
PARALLELISM = 2
#: The groups of sellers a snapshot is checked by: one, the whole table (each checkpoint
#: is applied in one transaction).
GROUPS = 1
WAIT = 120.0

Sample = dict[int, tuple[int, int, int]]  # seller -> (bids, total, top)


@dataclass(frozen=True)
class JoinRows:
    """The join's rows for one group's sellers, in bid position order:
    ``auction_rank`` (the auction's rank among auctions by position), the seller's
    dense index and the bid's price."""

    auction_rank: np.ndarray
    seller: np.ndarray
    price: np.ndarray


class PrefixOracle:
    """The answers over every pair of cuts ``(auctions < a, bids < b)``, split by
    group of sellers (``GROUPS``).

    Example: ``oracle.is_prefix(0, oracle.answer(0, 200, 1_500))`` is True; a sample
    with one seller's total changed, or half its sellers from an earlier cut, is not.
    """

    def __init__(self, events: int) -> None:
        batches, where = nexmark_columns(NexmarkConfig(events=events, seed=7), 0, events)
        auction, bid = batches["auction"], batches["bid"]
        auction_ids = auction.column("id").to_numpy()
        order = np.argsort(where["auction"])
        rank_of_id = dict(zip(auction_ids[order].tolist(), range(len(order)), strict=True))
        self.auctions = len(order)
        seller_of_id = dict(
            zip(auction_ids.tolist(), auction.column("seller").to_numpy().tolist(), strict=True)
        )
        by_position = np.argsort(where["bid"])
        bid_auction = bid.column("auction").to_numpy()[by_position].tolist()
        bid_price = bid.column("price").to_numpy()[by_position]
        joined = np.array([a in rank_of_id for a in bid_auction])
        ranks = np.array([rank_of_id[a] for a in bid_auction if a in rank_of_id])
        sellers = np.array([seller_of_id[a] for a in bid_auction if a in rank_of_id])
        self.sellers = np.unique(sellers)
        dense = np.searchsorted(self.sellers, sellers)
        self.owner = np.zeros(len(self.sellers), dtype=np.int64)
        row_owner = self.owner[dense]
        self.rows = [
            JoinRows(
                ranks[row_owner == s], dense[row_owner == s], bid_price[joined][row_owner == s]
            )
            for s in range(GROUPS)
        ]

    def answer(self, group: int, auctions: int, bids: int | None) -> Sample:
        """The rows of ``group``'s sellers over the auctions of rank ``< auctions`` and
        the first ``bids`` join rows among theirs (None: all)."""
        rows = self.rows[group]
        included = np.flatnonzero(rows.auction_rank < auctions)[:bids]
        n = len(self.sellers)
        seller = rows.seller[included]
        count = np.bincount(seller, minlength=n)
        total = np.zeros(n, dtype=np.int64)
        np.add.at(total, seller, rows.price[included])
        top = np.full(n, np.iinfo(np.int64).min, dtype=np.int64)
        np.maximum.at(top, seller, rows.price[included])
        return {
            int(self.sellers[i]): (int(count[i]), int(total[i]), int(top[i]))
            for i in np.flatnonzero(count)
        }

    def split(self, sample: Sample) -> list[Sample]:
        """``sample``'s rows by their seller's group."""
        parts: list[Sample] = [{} for _ in range(GROUPS)]
        for seller, values in sample.items():
            index = int(np.searchsorted(self.sellers, seller))
            assert index < len(self.sellers) and self.sellers[index] == seller, seller
            parts[int(self.owner[index])][seller] = values
        return parts

    def is_prefix(self, group: int, part: Sample) -> bool:
        """Whether some cuts give exactly ``part`` on ``group``'s sellers."""
        count = sum(bids for bids, _, _ in part.values())
        return any(
            self.answer(group, auctions, count) == part
            for auctions in range(self.auctions + 1)
            if np.count_nonzero(self.rows[group].auction_rank < auctions) >= count
        )


@dataclass(frozen=True)
class Snapshot:
    """One REPEATABLE READ read of the result table and of the commits table."""

    rows: Sample
    latest: tuple[int, ...]  # the sink's applied checkpoint (0: none)


class Sampler(threading.Thread):
    """Reads ``per_seller`` and the commits table in one REPEATABLE READ transaction,
    again and again until stopped; keeps each distinct snapshot in order."""

    def __init__(self, dsn: str) -> None:
        super().__init__(name="per-seller-sampler", daemon=True)
        self._dsn = dsn
        self.stop = threading.Event()
        self.snapshots: list[Snapshot] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with psycopg.connect(self._dsn) as conn:
                conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
                while not self.stop.is_set():
                    self._take(conn)
                    time.sleep(0.02)
                self._take(conn)
        except BaseException as exc:  # reported by the test's assertion
            self.error = exc

    def _take(self, conn: Any) -> None:
        with conn.transaction():
            rows = conn.execute("SELECT seller, bids, total, top FROM per_seller").fetchall()
            has_commits = conn.execute(
                "SELECT to_regclass('epochstream_sink_checkpoints') IS NOT NULL"
            ).fetchone()[0]
            applied = (
                conn.execute(
                    "SELECT checkpoint FROM epochstream_sink_checkpoints WHERE sink = 'per_seller'"
                ).fetchone()
                if has_commits
                else None
            )
        latest = [applied[0] if applied is not None else 0]
        snapshot = Snapshot({r[0]: tuple(r[1:]) for r in rows}, tuple(latest))
        if not self.snapshots or self.snapshots[-1] != snapshot:
            self.snapshots.append(snapshot)


def _slot_pid(driver: int, index: int) -> int:
    """The PID of local slot ``index`` (a child of ``driver`` of any of its threads)."""
    children = " ".join(p.read_text() for p in Path(f"/proc/{driver}/task").glob("*/children"))
    for child in children.split():
        argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        module = b"epochstream.deploy.localslot"
        if module in argv and argv[argv.index(module) + 1] == str(index).encode():
            return int(child)
    raise AssertionError(f"driver {driver} has no slot {index}")


def _wait(predicate: Any, what: str, supervisor: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + WAIT
    while not predicate():
        assert supervisor.poll() is None, f"the job ended before {what}"
        assert time.monotonic() < deadline, f"{what} did not happen within {WAIT} s"
        time.sleep(0.05)


def test_join_aggregate_upserts_are_prefix_consistent_through_slot_and_driver_sigkills(
    tmp_path: Path, postgres_dsn: str
) -> None:
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE per_seller (seller BIGINT PRIMARY KEY, bids BIGINT, total BIGINT, "
            "top BIGINT)"
        )
    sampler = Sampler(postgres_dsn)
    sampler.start()
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
            str(tmp_path / "ckpt"),
            str(JOB),
            postgres_dsn,
            str(EVENTS),
            str(RATE),
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
        driver = int(match.group(1))

        def committed() -> int:
            return len(sampler.snapshots)

        _wait(lambda: committed() >= 2, "a first commit", supervisor)
        slot = _slot_pid(driver, 1)
        assert is_python_process(slot)
        os.kill(slot, signal.SIGKILL)
        at_slot_kill = sampler.snapshots[-1].rows
        after_slot_kill = committed()
        _wait(lambda: committed() >= after_slot_kill + 3, "commits after the slot kill", supervisor)
        os.killpg(driver, signal.SIGKILL)  # the driver and its slot processes at once
        _out, err = supervisor.communicate(timeout=WAIT)
    finally:
        sampler.stop.set()
        if supervisor.poll() is None:
            os.killpg(supervisor.pid, signal.SIGKILL)
            supervisor.wait(30)
    sampler.join(30)
    assert sampler.error is None, sampler.error
    assert supervisor.returncode == 0, (line + err)[-3000:]
    assert "(fixed_delay: restart 1 of 3)" in err, "the slot kill did not restart the job"
    assert "driver killed by SIGKILL; restarting it with --resume" in err

    expected = {r[0]: tuple(r[1:]) for r in run_duckdb(QUERY, nexmark_arrow_tables(events=EVENTS))}
    assert len(expected) > 50
    assert at_slot_kill != expected, "the input ended before the slot kill: lower RATE"
    assert sampler.snapshots[-1].rows == expected

    # The model's premise: each Nexmark table is one split, read in position order.
    source = es.sources.NexmarkSource(NexmarkConfig(events=EVENTS, seed=7), kind="bid")
    assert len(source.create_splits(PARALLELISM)) == 1
    oracle = PrefixOracle(EVENTS)
    full = {}
    for group in range(GROUPS):
        full.update(oracle.answer(group, oracle.auctions, None))
    assert full == expected, "the prefix oracle disagrees with DuckDB over all the input"

    snapshots = sampler.snapshots
    assert len(snapshots) > 10, "too few distinct committed states were sampled"
    checked: set[tuple[int, tuple[tuple[int, tuple[int, int, int]], ...]]] = set()
    for number, snapshot in enumerate(snapshots):
        for subtask, part in enumerate(oracle.split(snapshot.rows)):
            key = (subtask, tuple(sorted(part.items())))
            if key not in checked:
                assert oracle.is_prefix(subtask, part), (
                    f"snapshot {number}: group {subtask}'s rows are no prefix's answer"
                )
                checked.add(key)
    for before, after in itertools.pairwise(snapshots):
        assert all(a >= b for a, b in zip(after.latest, before.latest, strict=True))
        for subtask in range(GROUPS):
            counts = [
                sum(v[0] for v in oracle.split(s.rows)[subtask].values()) for s in (before, after)
            ]
            assert counts[1] >= counts[0], f"group {subtask} lost committed rows"
