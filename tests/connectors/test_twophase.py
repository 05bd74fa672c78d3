from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import pytest

from epochstream.connectors.base import SinkContext
from epochstream.connectors.twophase import ManagedTxn, TwoPhaseCommitSinkWriter, TxnState
from epochstream.exceptions import ConfigurationError, SinkError


@dataclass
class MemTxn:
    name: str
    records: list[Any] = field(default_factory=list)
    durable: bool = False


class MemoryWriter(TwoPhaseCommitSinkWriter[MemTxn]):
    """Publishes transactions into ``published``; logs every hook call in ``log``."""

    def __init__(self, ctx: SinkContext, roll_records: int | None = None) -> None:
        super().__init__(ctx, roll_records=roll_records)
        self.published: dict[str, list[Any]] = {}
        self.prepared: dict[str, list[Any]] = {}  # pre-committed, as a durable store would
        self.log: list[tuple[str, str]] = []
        self._n = 0

    def begin_transaction(self) -> MemTxn:
        self._n += 1
        txn = MemTxn(f"t{self._n}")
        self.log.append(("begin", txn.name))
        return txn

    def write(self, txn: MemTxn, records: list[Any]) -> None:
        assert not txn.durable, "write after pre-commit"
        txn.records.extend(records)

    def pre_commit(self, txn: MemTxn) -> None:
        txn.durable = True
        self.prepared[txn.name] = list(txn.records)
        self.log.append(("pre_commit", txn.name))

    def commit(self, txn: MemTxn) -> None:
        self.log.append(("commit", txn.name))
        self._publish(txn.name)

    def abort(self, txn: MemTxn) -> None:
        self.log.append(("abort", txn.name))
        self.prepared.pop(txn.name, None)

    def recover(self, entries: list[Any]) -> None:
        self.log.append(("recover", ",".join(entries)))
        for name in entries:
            self._publish(name)

    def txn_handle(self, txn: MemTxn) -> str:
        return txn.name

    def _publish(self, name: str) -> None:
        if name in self.published:
            return  # idempotent
        self.published[name] = self.prepared.pop(name)


def make(checkpointing: bool = True, roll_records: int | None = None) -> MemoryWriter:
    ctx = SinkContext(0, 1, attempt=0, job_id="job", checkpointing=checkpointing)
    writer = MemoryWriter(ctx, roll_records=roll_records)
    writer.restore([])
    return writer


def published_records(writer: MemoryWriter) -> list[Any]:
    return [
        r
        for name in sorted(writer.published, key=lambda n: int(n[1:]))
        for r in writer.published[name]
    ]


def test_state_machine_allows_only_forward_transitions() -> None:
    legal = {
        (TxnState.OPEN, TxnState.PRE_COMMITTED),
        (TxnState.OPEN, TxnState.ABORTED),
        (TxnState.PRE_COMMITTED, TxnState.COMMITTED),
        (TxnState.PRE_COMMITTED, TxnState.ABORTED),
    }
    for source in TxnState:
        for target in TxnState:
            assert source.can_become(target) == ((source, target) in legal)
    t = ManagedTxn(txn="x", label="txn 1 of test")
    assert t.state is TxnState.OPEN
    with pytest.raises(SinkError, match=r"OPEN -> COMMITTED of txn 1 of test"):
        t.advance(TxnState.COMMITTED)
    t.advance(TxnState.PRE_COMMITTED)
    with pytest.raises(SinkError, match="PRE_COMMITTED -> OPEN"):
        t.advance(TxnState.OPEN)
    t.advance(TxnState.COMMITTED)
    for target in TxnState:
        with pytest.raises(SinkError, match="COMMITTED ->"):
            t.advance(target)


def test_transaction_begins_lazily_and_snapshot_pre_commits() -> None:
    w = make()
    assert w.snapshot(1) == []  # no data, no transaction
    assert w.log == [("recover", "")]
    w.write_batch([])
    assert w.current_transaction is None
    w.write_batch([1, 2])
    w.write_batch([3])
    current = w.current_transaction
    assert current is not None and current.state is TxnState.OPEN and current.records == 3
    assert w.snapshot(2) == ["t1"]
    assert current.state is TxnState.PRE_COMMITTED
    assert w.current_transaction is None
    assert w.published == {}
    assert w.pending_checkpoint_ids == [2]
    w.notify_checkpoint_complete(2)
    assert current.state is TxnState.COMMITTED
    assert w.published == {"t1": [1, 2, 3]}
    assert w.pending_checkpoint_ids == []


def test_snapshot_returns_all_pending_and_complete_commits_up_to_id_in_order() -> None:
    w = make()
    for cid, batch in enumerate([[1], [2], [3]], start=1):
        w.write_batch(batch)
        assert w.snapshot(cid) == [f"t{i}" for i in range(1, cid + 1)]
    w.notify_checkpoint_complete(2)
    assert [e for e in w.log if e[0] == "commit"] == [("commit", "t1"), ("commit", "t2")]
    assert w.pending_checkpoint_ids == [3]
    w.write_batch([4])
    assert w.snapshot(4) == ["t3", "t4"]
    w.notify_checkpoint_complete(4)
    assert published_records(w) == [1, 2, 3, 4]


def test_aborted_checkpoint_commits_nothing_and_next_completion_commits_it() -> None:
    w = make()
    w.write_batch(["a"])
    w.snapshot(1)
    w.notify_checkpoint_aborted(1)
    assert w.published == {}
    assert w.pending_checkpoint_ids == [1]
    w.write_batch(["b"])
    assert w.snapshot(2) == ["t1", "t2"]
    w.notify_checkpoint_complete(2)
    assert published_records(w) == ["a", "b"]


def test_late_or_repeated_notifications_are_harmless() -> None:
    w = make()
    w.write_batch(["a"])
    w.snapshot(5)
    w.notify_checkpoint_complete(5)
    w.notify_checkpoint_complete(5)
    w.notify_checkpoint_complete(3)
    assert [e for e in w.log if e[0] == "commit"] == [("commit", "t1")]


def test_snapshot_ids_must_increase() -> None:
    w = make()
    w.write_batch(["a"])
    w.snapshot(3)
    w.write_batch(["b"])
    with pytest.raises(SinkError, match=r"snapshot\(2\) after snapshot\(3\)"):
        w.snapshot(2)


def test_close_aborts_open_transaction_but_keeps_pending_ones() -> None:
    w = make()
    w.write_batch(["pending"])
    w.snapshot(1)
    w.write_batch(["open"])
    open_txn = w.current_transaction
    w.close()
    assert open_txn is not None and open_txn.state is TxnState.ABORTED
    assert ("abort", "t2") in w.log and ("abort", "t1") not in w.log
    assert w.prepared == {"t1": ["pending"]}  # a restore from checkpoint 1 can commit it


def test_a_cancelled_attempt_aborts_what_only_checkpoints_that_never_complete_hold() -> None:
    # Checkpoint 1 may have completed (the job master began writing its metadata):
    # t1 stays for a restore. Checkpoint 2 was aborted and 3 was in flight when the
    # attempt failed for good: t2 and t3 are in no checkpoint that will ever complete.
    w = make()
    w.write_batch(["a"])
    w.snapshot(1)
    w.write_batch(["b"])
    w.snapshot(2)
    w.notify_checkpoint_aborted(2)
    w.write_batch(["c"])
    w.snapshot(3)
    w.write_batch(["open"])
    w.abandon_checkpoints_above(1)
    w.close()
    assert w.prepared == {"t1": ["a"]}
    assert [e for e in w.log if e[0] == "abort"] == [
        ("abort", "t2"),
        ("abort", "t3"),
        ("abort", "t4"),
    ]
    assert w.pending_checkpoint_ids == [1]


def test_nothing_completed_yet_aborts_every_pending_transaction() -> None:
    w = make()
    w.write_batch(["a"])
    w.snapshot(1)
    w.abandon_checkpoints_above(0)
    w.close()
    assert w.prepared == {} and w.published == {}


def test_restore_hands_entries_to_recover_once_before_writes() -> None:
    ctx = SinkContext(0, 1, attempt=1, job_id="job", checkpointing=True)
    w = MemoryWriter(ctx)
    w.prepared["old"] = ["x"]
    w.restore(["old"])
    assert w.published == {"old": ["x"]}
    with pytest.raises(SinkError, match="twice"):
        w.restore([])
    fresh = MemoryWriter(ctx)
    fresh.write_batch([1])
    with pytest.raises(SinkError, match="after write_batch"):
        fresh.restore([])


def test_roll_records_splits_transactions_and_rolled_ones_join_next_checkpoint() -> None:
    w = make(roll_records=3)
    w.write_batch(list(range(7)))
    assert [e for e in w.log if e[0] == "pre_commit"] == [
        ("pre_commit", "t1"),
        ("pre_commit", "t2"),
    ]
    assert w.published == {}  # checkpointing on: rolling only pre-commits
    w.write_batch([7, 8])
    assert w.snapshot(1) == ["t1", "t2", "t3"]
    w.notify_checkpoint_complete(1)
    assert {k: len(v) for k, v in w.published.items()} == {"t1": 3, "t2": 3, "t3": 3}
    assert published_records(w) == list(range(9))


def test_rolled_transactions_not_in_a_checkpoint_are_aborted_on_close() -> None:
    w = make(roll_records=2)
    w.write_batch([1, 2, 3])
    w.close()
    assert [e for e in w.log if e[0] == "abort"] == [("abort", "t1"), ("abort", "t2")]
    assert w.prepared == {}


def test_checkpointing_off_commits_on_roll_and_end_input_and_warns_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="epochstream.connectors.twophase"):
        w = make(checkpointing=False, roll_records=2)
        w.write_batch([1, 2, 3])
        assert published_records(w) == [1, 2]  # rolled: committed at once
        w.write_batch([4])
        assert published_records(w) == [1, 2, 3, 4]
        w.write_batch([5])
        w.end_input()
        assert published_records(w) == [1, 2, 3, 4, 5]
        w.close()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "at-least-once" in warnings[0].getMessage()


def test_checkpointing_on_end_input_leaves_commit_to_final_checkpoint(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="epochstream.connectors.twophase"):
        w = make()
    assert caplog.records == []
    w.write_batch(["a"])
    w.end_input()
    assert w.published == {}
    w.snapshot(9)
    w.notify_checkpoint_complete(9)
    assert w.published == {"t1": ["a"]}


def test_invalid_roll_records() -> None:
    ctx = SinkContext(0, 1, attempt=0, job_id="job", checkpointing=True)
    with pytest.raises(ConfigurationError, match="roll_records"):
        MemoryWriter(ctx, roll_records=0)


def test_failed_commit_is_retried_by_a_later_notification() -> None:
    w = make()
    w.write_batch(["a"])
    w.snapshot(1)
    w.write_batch(["b"])
    w.snapshot(2)
    real_publish = w._publish
    calls = 0

    def flaky(name: str) -> None:
        nonlocal calls
        calls += 1
        if name == "t2" and calls == 2:
            raise SinkError("store unavailable")
        real_publish(name)

    w._publish = flaky  # type: ignore[method-assign]
    with pytest.raises(SinkError, match="unavailable"):
        w.notify_checkpoint_complete(2)
    assert w.published == {"t1": ["a"]}
    w.notify_checkpoint_complete(2)
    assert published_records(w) == ["a", "b"]
    assert [e for e in w.log if e[0] == "commit"].count(("commit", "t1")) == 1
