"""A generic two-phase-commit sink writer (docs/architecture.md, Two-phase commit).

Every transaction moves through an explicit state machine::

    OPEN --pre_commit--> PRE_COMMITTED --commit--> COMMITTED
      |                        |
      +--------abort-----------+-----abort-------> ABORTED

Flow: ``write_batch`` writes into the current transaction, begun lazily on the first
record. ``snapshot(n)`` pre-commits it (when it holds data) together with any
transactions rolled since the last snapshot, files them as ``pending[n]`` and returns
the handles of *all* pending transactions, so a restore from checkpoint ``n`` can
commit whatever checkpoint ``n`` covers but was not yet committed.
``notify_checkpoint_complete(n)`` commits every pending transaction with id <= n,
oldest first. An aborted checkpoint commits nothing: its transactions stay pending and
are committed by the next checkpoint that completes (their records precede that
checkpoint's barrier, so it covers them).

``close()`` aborts only transactions no checkpoint knows (the open one and rolled
ones); pending ones are left for a restore to commit, because the checkpoint holding
them may have completed without this writer hearing of it. When the job master
cancels the attempt it knows better: ``abandon_checkpoints_above(n)`` (before
``close``) aborts the pending transactions of checkpoints above ``n``, which never
completed and never will (aborted, or still in flight when the attempt failed). A
pending transaction is in every snapshot from the one that pre-committed it on, so
``pending[k]`` with ``k > n`` is in no checkpoint at or below ``n``. Otherwise a job
that fails for good would leave them open until the broker's transaction timeout
(Kafka: 15 min of read_committed consumers held back).

With checkpointing off the writer cannot be exactly-once: it commits when a
transaction rolls and at ``end_input``, and logs one warning saying so.

Example::

    class ListTxnWriter(TwoPhaseCommitSinkWriter[list]):
        def begin_transaction(self) -> list: return []
        def write(self, txn, records): txn.extend(records)
        def pre_commit(self, txn): ...   # make txn durable
        def commit(self, txn): ...       # publish txn; idempotent
        def abort(self, txn): txn.clear()
        def recover(self, entries): ...  # commit entries, clean up leftovers
        def txn_handle(self, txn): return tuple(txn)
"""

from __future__ import annotations

import logging
from abc import abstractmethod
from enum import Enum
from typing import Any, Generic, TypeVar

from epochstream.connectors.base import SinkContext, SinkWriter
from epochstream.exceptions import ConfigurationError, SinkError

__all__ = ["ManagedTxn", "TwoPhaseCommitSinkWriter", "TxnState"]

Txn = TypeVar("Txn")

logger = logging.getLogger(__name__)


class TxnState(Enum):
    """Where a transaction is in its life.

    Example::

        TxnState.OPEN.can_become(TxnState.PRE_COMMITTED)   # True
    """

    OPEN = "open"
    PRE_COMMITTED = "pre_committed"
    COMMITTED = "committed"
    ABORTED = "aborted"

    def can_become(self, target: TxnState) -> bool:
        """Whether the transition ``self -> target`` is legal."""
        return target in _TRANSITIONS[self]


_TRANSITIONS: dict[TxnState, frozenset[TxnState]] = {
    TxnState.OPEN: frozenset({TxnState.PRE_COMMITTED, TxnState.ABORTED}),
    TxnState.PRE_COMMITTED: frozenset({TxnState.COMMITTED, TxnState.ABORTED}),
    TxnState.COMMITTED: frozenset(),
    TxnState.ABORTED: frozenset(),
}


class ManagedTxn(Generic[Txn]):
    """A sink's transaction object with its state and record count.

    Example::

        t = ManagedTxn(txn=[], label="subtask 0 txn 1")
        t.advance(TxnState.PRE_COMMITTED)
        t.advance(TxnState.OPEN)   # raises SinkError: illegal transition
    """

    __slots__ = ("label", "records", "state", "txn")

    def __init__(self, txn: Txn, label: str) -> None:
        self.txn = txn
        self.label = label
        self.state = TxnState.OPEN
        self.records = 0

    def advance(self, target: TxnState) -> None:
        """Move to ``target``; SinkError if the state machine does not allow it."""
        if not self.state.can_become(target):
            raise SinkError(
                f"illegal transition {self.state.name} -> {target.name} of {self.label}"
            )
        self.state = target

    def __repr__(self) -> str:
        return f"ManagedTxn({self.label}, {self.state.name}, records={self.records})"


class TwoPhaseCommitSinkWriter(SinkWriter, Generic[Txn]):
    """Drives the transaction hooks of a sink; subclasses implement the hooks.

    ``roll_records`` caps the records per transaction: a full transaction is
    pre-committed at once and joins the next checkpoint's pending set (or is committed
    at once when checkpointing is off).

    Example::

        writer = MyFileWriter(SinkContext(0, 1, attempt=0, job_id="j", checkpointing=True))
        writer.restore([])
        writer.write_batch(["a", "b"])
        entries = writer.snapshot(1)       # pre-commits; store entries in checkpoint 1
        writer.notify_checkpoint_complete(1)   # commits
    """

    def __init__(self, ctx: SinkContext, *, roll_records: int | None = None) -> None:
        if roll_records is not None and roll_records < 1:
            raise ConfigurationError(f"roll_records must be >= 1, got {roll_records}")
        self.ctx = ctx
        self._roll_records = roll_records
        self._current: ManagedTxn[Txn] | None = None
        self._rolled: list[ManagedTxn[Txn]] = []  # pre-committed, in no checkpoint yet
        self._pending: dict[int, list[ManagedTxn[Txn]]] = {}  # ascending checkpoint ids
        self._txn_count = 0
        self._restored = False
        self._written = False
        if not ctx.checkpointing:
            logger.warning(
                "%s (subtask %d): checkpointing is off, so output is committed on roll and at "
                "end of input and is at-least-once, not exactly-once",
                type(self).__name__,
                ctx.subtask_index,
            )

    # -- hooks -------------------------------------------------------------------------

    @abstractmethod
    def begin_transaction(self) -> Txn:
        """Start a transaction to write into."""

    @abstractmethod
    def write(self, txn: Txn, records: list[Any]) -> None:
        """Write ``records`` into ``txn`` (an open transaction)."""

    @abstractmethod
    def pre_commit(self, txn: Txn) -> None:
        """Flush and make ``txn`` durable; it takes no more writes."""

    @abstractmethod
    def commit(self, txn: Txn) -> None:
        """Publish ``txn``. Must be idempotent: a restore may commit it again."""

    @abstractmethod
    def abort(self, txn: Txn) -> None:
        """Discard ``txn`` (open or pre-committed)."""

    @abstractmethod
    def recover(self, entries: list[Any]) -> None:
        """Commit the pending transactions in ``entries``, then remove leftovers."""

    @abstractmethod
    def txn_handle(self, txn: Txn) -> Any:
        """A picklable entry from which :meth:`recover` can commit ``txn``."""

    def is_full(self, txn: Txn) -> bool:
        """Whether ``txn`` should roll now (size or age), checked after each written batch.

        The default never rolls early: transactions roll at ``roll_records`` and at
        checkpoints only.
        """
        return False

    # -- SinkWriter --------------------------------------------------------------------

    def restore(self, entries: list[Any]) -> None:
        if self._restored:
            raise SinkError(f"{self._where()}: restore() called twice")
        if self._written:
            raise SinkError(f"{self._where()}: restore() called after write_batch()")
        self._restored = True
        self.recover(list(entries))

    def write_batch(self, records: list[Any]) -> None:
        if not records:
            return
        self._written = True
        limit = self._roll_records
        if limit is None:
            current = self._current or self._begin()
            self.write(current.txn, records)
            current.records += len(records)
            if self.is_full(current.txn):
                self._roll()
            return
        i, n = 0, len(records)
        while i < n:
            current = self._current or self._begin()
            take = min(limit - current.records, n - i)
            self.write(current.txn, records if take == n else records[i : i + take])
            current.records += take
            i += take
            if current.records >= limit or self.is_full(current.txn):
                self._roll()

    def snapshot(self, checkpoint_id: int) -> list[Any]:
        if self._pending and checkpoint_id <= next(reversed(self._pending)):
            raise SinkError(
                f"{self._where()}: snapshot({checkpoint_id}) after snapshot"
                f"({next(reversed(self._pending))}); checkpoint ids must increase"
            )
        self._close_current()
        if self._rolled:
            self._pending[checkpoint_id] = self._rolled
            self._rolled = []
        return [self.txn_handle(t.txn) for txns in self._pending.values() for t in txns]

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        for cid in [cid for cid in self._pending if cid <= checkpoint_id]:
            for t in self._pending[cid]:
                # Skip what an earlier, interrupted call committed already.
                if t.state is not TxnState.COMMITTED:
                    self._commit_managed(t)
            del self._pending[cid]

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        """Commit nothing; the next completed checkpoint commits these transactions."""
        logger.debug(
            "%s: checkpoint %d aborted; pending checkpoints %s wait for the next completed one",
            self._where(),
            checkpoint_id,
            list(self._pending),
        )

    def end_input(self) -> None:
        """With checkpointing off, commit now; otherwise the final checkpoint commits."""
        if self.ctx.checkpointing:
            return
        self._close_current()
        rolled, self._rolled = self._rolled, []
        for t in rolled:
            self._commit_managed(t)

    def abandon_checkpoints_above(self, checkpoint_id: int) -> None:
        """Abort the pending transactions of checkpoints above ``checkpoint_id``: they
        are in no checkpoint that completed or will (module docstring)."""
        doomed = [cid for cid in self._pending if cid > checkpoint_id]
        for cid in doomed:
            txns = self._pending.pop(cid)
            for t in txns:
                self.abort(t.txn)
                t.advance(TxnState.ABORTED)
        if doomed:
            logger.info(
                "%s: aborted the transactions of checkpoints %s (none above %d completed)",
                self._where(),
                doomed,
                checkpoint_id,
            )

    def close(self) -> None:
        """Abort what no checkpoint holds; leave pending transactions for a restore."""
        doomed = self._rolled + ([self._current] if self._current is not None else [])
        self._rolled = []
        self._current = None
        for t in doomed:
            self.abort(t.txn)
            t.advance(TxnState.ABORTED)

    # -- introspection -----------------------------------------------------------------

    @property
    def pending_checkpoint_ids(self) -> list[int]:
        """Ids of the checkpoints whose transactions are pre-committed, awaiting commit."""
        return list(self._pending)

    @property
    def current_transaction(self) -> ManagedTxn[Txn] | None:
        """The open transaction receiving writes, if one was begun."""
        return self._current

    # -- internals ---------------------------------------------------------------------

    def _where(self) -> str:
        return f"{type(self).__name__} (subtask {self.ctx.subtask_index})"

    def _begin(self) -> ManagedTxn[Txn]:
        self._txn_count += 1
        label = f"txn {self._txn_count} of {self._where()}"
        t: ManagedTxn[Txn] = ManagedTxn(self.begin_transaction(), label)
        self._current = t
        return t

    def _close_current(self) -> None:
        """Pre-commit the current transaction into the rolled list, if it holds data."""
        current = self._current
        if current is None or current.records == 0:
            return
        self.pre_commit(current.txn)
        current.advance(TxnState.PRE_COMMITTED)
        self._current = None
        self._rolled.append(current)

    def _roll(self) -> None:
        self._close_current()
        if not self.ctx.checkpointing:
            rolled, self._rolled = self._rolled, []
            for t in rolled:
                self._commit_managed(t)

    def _commit_managed(self, t: ManagedTxn[Txn]) -> None:
        if not t.state.can_become(TxnState.COMMITTED):
            raise SinkError(f"cannot commit {t.label}: it is {t.state.name}")
        self.commit(t.txn)
        t.advance(TxnState.COMMITTED)
