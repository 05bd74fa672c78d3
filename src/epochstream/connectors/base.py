"""The interfaces between connectors and the runtime (docs/architecture.md).

Sources are split-based: :meth:`Source.create_enumerator` (in the job master) makes
the initial splits and discovers new ones while the job runs (see
:mod:`epochstream.connectors.enumerators`); the default enumerator serves
:meth:`Source.create_splits`. Split ``k`` goes to subtask ``k % parallelism``, unless
the enumerator discovers splits: then, by default, a subtask gets the next split when
its reader asks (:attr:`SourceReader.needs_splits`). On restore, the split states
found in the checkpoint are redistributed. A
:class:`SourceReader` reads whatever splits it is given, reports their positions in
:meth:`SourceReader.snapshot`, so a re-settable source resumes exactly where the
checkpoint left it, and hears :meth:`SourceReader.notify_checkpoint_complete` to
acknowledge or commit upstream (JetStream acks, Kafka offsets).

Sinks write through a :class:`SinkWriter` per subtask. A transactional writer
pre-commits at :meth:`SinkWriter.snapshot`, returns entries the runtime stores in the
checkpoint, and commits on :meth:`SinkWriter.notify_checkpoint_complete`. A sink whose
commit must be one action per checkpoint (a Delta or Iceberg table) also has a
:class:`GlobalCommitter` (:meth:`Sink.create_committer`): its writers only pre-commit,
and the job master commits every writer's entries of a completed checkpoint at once.

Example::

    source = SequenceSource(0, 10)
    splits = source.create_splits(parallelism=2)
    ctx = SourceContext(subtask_index=0, parallelism=2, clock=SystemClock())
    reader = source.create_reader(ctx)
    reader.add_splits(splits[0::2])
    while not reader.exhausted:
        batch = reader.poll(1000)
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from epochstream.connectors.enumerators import SplitEnumerator, StaticSplitEnumerator
from epochstream.core.clock import Clock

__all__ = [
    "AtLeastOnceSinkWriter",
    "GlobalCommitter",
    "Sink",
    "SinkContext",
    "SinkWriter",
    "Source",
    "SourceContext",
    "SourceReader",
    "SourceSplit",
]


class SourceSplit(Protocol):
    """What every split state has: a stable id (unique within its source).

    Example::

        TextFileSplit(split_id="/in/a.txt:0", path="/in/a.txt", start=0, end=90, offset=0)
    """

    @property
    def split_id(self) -> str: ...


@dataclass(frozen=True)
class SourceContext:
    """What a source reader knows about where it runs.

    ``dead_letter``, when set, receives records a reader cannot decode (as a dict
    naming the place) instead of the reader failing.

    Example::

        SourceContext(subtask_index=0, parallelism=4, clock=ManualClock())
    """

    subtask_index: int
    parallelism: int
    clock: Clock
    dead_letter: Callable[[dict[str, Any]], None] | None = None


class Source(ABC):
    """A split-based source.

    ``bounded``: the input ends. ``replayable``: a reader restored from a snapshot
    re-reads from the snapshot's positions, which is what makes exactly-once possible.
    ``columnar``: readers' ``poll`` returns ``pyarrow.RecordBatch`` objects (event
    time, if any, in an int64 column ``_ts``) instead of lists of records.

    Example::

        splits = TextFileSource("/data/in").create_splits(parallelism=4)
    """

    bounded: bool = True
    replayable: bool = True
    columnar: bool = False

    @abstractmethod
    def create_splits(self, parallelism: int) -> list[Any]:
        """The initial split states (picklable, each with ``split_id``)."""

    @abstractmethod
    def create_reader(self, ctx: SourceContext) -> SourceReader:
        """A reader for one subtask; it receives splits through ``add_splits``."""

    def create_enumerator(self, parallelism: int, restored: Any) -> SplitEnumerator:
        """The job master's enumerator of this source's splits.

        ``restored`` is what the enumerator's ``snapshot()`` returned for the restored
        checkpoint (None on a fresh start). The default serves :meth:`create_splits`
        and discovers nothing; unbounded sources with changing inputs override it.
        """
        return StaticSplitEnumerator(lambda: self.create_splits(parallelism))


class SourceReader(ABC):
    """Reads the splits assigned to one subtask.

    Example::

        reader.add_splits(splits)
        batch = reader.poll(500)      # [] when nothing is available right now
        states = reader.snapshot(1)   # positioned after the last record of ``batch``
    """

    @abstractmethod
    def add_splits(self, splits: list[Any]) -> None:
        """Take over ``splits`` (initial states or states from a snapshot); any number."""

    @abstractmethod
    def poll(self, max_records: int) -> list[Any]:
        """Up to ``max_records`` records; ``[]`` if nothing is available right now."""

    def poll_splits(self, max_records: int) -> list[tuple[Any, list[Any], bool]]:
        """Like :meth:`poll`, grouped by split: ``(split_id, records, split_finished)``
        in read order. Event time uses it to keep one watermark per split.

        The default puts everything under one group (``split_id`` None): a reader that
        reads several splits at once should override it. A group may carry a fourth
        element, the records' own timestamps (a Kafka reader's): event time then uses
        them unless the watermark strategy has an assigner (which gets them as its
        second argument).
        """
        records = self.poll(max_records)
        return [(None, records, False)] if records else []

    @property
    @abstractmethod
    def exhausted(self) -> bool:
        """True when the source is bounded and every assigned split is fully read."""

    @property
    def needs_splits(self) -> bool:
        """True when the reader has no unfinished split: the runtime then asks the job
        master for one (once each time this turns True). Splits a source's enumerator
        discovers are handed out only on such requests (unless the enumerator sets
        ``assign_on_demand = False``), so the reader that finishes first reads the next one.

        The default is :attr:`exhausted`, right for readers of bounded sources. A reader
        of an unbounded source whose enumerator discovers splits (its ``exhausted``
        stays False) must override it, or it never receives a discovered split.
        """
        return self.exhausted

    def next_available(self) -> float | None:
        """The ``clock.now()`` time more data becomes available, or None if not rate-limited.

        Readers without a rate limit never make the runtime wait, hence None.
        """
        return None

    @abstractmethod
    def snapshot(self, checkpoint_id: int) -> list[Any]:
        """Split states positioned after the last record returned by :meth:`poll`, for
        checkpoint ``checkpoint_id`` (readers that acknowledge upstream remember what
        this checkpoint covers, for :meth:`notify_checkpoint_complete`). A reader that
        needs no id may define ``snapshot(self)``: it is called without one."""

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:  # noqa: B027 - optional hook
        """Checkpoint ``checkpoint_id`` is durable, and with it every snapshot this reader
        took for it or earlier checkpoints: acknowledge or commit those positions upstream.

        The default does nothing: files and generators need no upstream bookkeeping.
        Readers of brokers that redeliver unacknowledged messages override it.
        """

    @abstractmethod
    def close(self) -> None:
        """Release files and other resources; the reader is not used afterwards."""


@dataclass(frozen=True)
class SinkContext:
    """What a sink writer knows about where it runs.

    ``attempt`` counts the job's (re)starts; ``(job_id, attempt, subtask_index)`` is
    unique, so writers can derive collision-free names from it.

    Example::

        SinkContext(subtask_index=0, parallelism=2, attempt=0, job_id="3f2a...", checkpointing=True)
    """

    subtask_index: int
    parallelism: int
    attempt: int
    job_id: str
    checkpointing: bool
    #: Where console output goes: the runtime routes it to the driver's stdout (a slot
    #: running as a Spark task has no terminal of its own). ``None``: this process's stdout.
    console: Callable[[str], None] | None = None


class Sink(ABC):
    """A sink; ``transactional`` sinks give exactly-once output with checkpointing on.

    Example::

        writer = FileSink("/out").create_writer(ctx)
    """

    transactional: bool = False
    #: Its writers take ``pyarrow.RecordBatch`` objects from a columnar stream too (a
    #: sink without it needs ``to_rows()`` in front of it).
    accepts_batches: bool = False

    @abstractmethod
    def create_writer(self, ctx: SinkContext) -> SinkWriter:
        """A writer for one subtask."""

    def exclusive_target(self) -> str | None:
        """What only this sink of a job may write (e.g. ``"directory /out"``), or None.

        Two sinks of one job naming the same target are refused when the job is built:
        their writers would collide (part file names, recovery of each other's files).

        Example: ``FileSink("/out").exclusive_target() == "directory /out"``
        """
        return None

    def create_committer(self, job_id: str) -> GlobalCommitter | None:
        """The sink's global committer, or None (the default) when writers commit.

        With a committer, the entries every writer returns from ``snapshot`` for a
        completed checkpoint are handed to one :meth:`GlobalCommitter.commit` call.
        """
        return None


class GlobalCommitter(ABC):
    """Commits a whole checkpoint's pre-committed output as one action (job master).

    The job master calls :meth:`commit` once per completed checkpoint with the union
    of every writer's snapshot entries, and again for the restored checkpoint when an
    attempt starts: ``commit`` must recognise a checkpoint it committed already (a
    Delta application transaction id, for instance) and skip it. Checkpoint ids only
    grow, also from one job to the next one on the same target (they start above
    :meth:`last_committed`), so "committed already" is "at most the last committed".

    Example::

        class ManifestCommitter(GlobalCommitter):
            def commit(self, checkpoint_id, entries):
                if checkpoint_id <= self.last_committed():
                    return                            # replayed after a restore
                self.append_manifest(checkpoint_id, entries)
    """

    @abstractmethod
    def commit(self, checkpoint_id: int, entries: list[Any]) -> None:
        """Publish ``entries`` of completed checkpoint ``checkpoint_id``; idempotent."""

    @abstractmethod
    def last_committed(self) -> int:
        """The newest checkpoint id this sink committed (0: none). The job master
        numbers a job's checkpoints above it, so a fresh job writing to the same target
        is never taken for a replay of the one before (its commits would be skipped)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections; the default holds none."""


class SinkWriter(ABC):
    """Writes one subtask's records; the runtime calls the hooks in this order::

        restore(entries)          once, before any write ([] on a fresh start)
        write_batch(records)*     between checkpoints
        snapshot(n)               at barrier n; returned entries go into checkpoint n
        notify_checkpoint_complete(n) / notify_checkpoint_aborted(n)
        end_input()               bounded input ended
        abandon_checkpoints_above(n)   only when the attempt is cancelled: no checkpoint
                                  above n completed or ever will
        close()

    Non-transactional writers can extend :class:`AtLeastOnceSinkWriter` instead.

    Example::

        writer = sink.create_writer(ctx)
        writer.restore(entries_from_checkpoint)
        writer.write_batch(records)
        entries = writer.snapshot(7)
        writer.notify_checkpoint_complete(7)
    """

    @abstractmethod
    def restore(self, entries: list[Any]) -> None:
        """Recover from the union of every subtask's entries of the restored checkpoint."""

    @abstractmethod
    def write_batch(self, records: list[Any]) -> None:
        """Write ``records`` (in order)."""

    @abstractmethod
    def snapshot(self, checkpoint_id: int) -> list[Any]:
        """Pre-commit at barrier ``checkpoint_id`` and return the entries to store."""

    @abstractmethod
    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` is durable: commit what it covers."""

    @abstractmethod
    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` will never complete."""

    @abstractmethod
    def end_input(self) -> None:
        """The bounded input ended (with checkpointing off: commit now)."""

    @abstractmethod
    def close(self) -> None:
        """Release resources; output not committed by now is not committed."""

    def abandon_checkpoints_above(self, checkpoint_id: int) -> None:  # noqa: B027 - optional hook
        """The attempt is cancelled and no checkpoint (or savepoint) with a higher id
        completed or ever will (the job master says so). A transactional writer aborts
        what only those checkpoints hold: nothing will ever commit it, not even a
        restore. Called before :meth:`close`; writers without transactions ignore it."""


class AtLeastOnceSinkWriter(SinkWriter):
    """Base of writers that publish in ``write_batch``: every other hook is a no-op.

    Such writers store nothing in checkpoints, so records replayed after a restore are
    written again (at-least-once).

    Example::

        class ListWriter(AtLeastOnceSinkWriter):
            def __init__(self) -> None:
                self.out: list[object] = []

            def write_batch(self, records: list[object]) -> None:
                self.out.extend(records)
    """

    def restore(self, entries: list[Any]) -> None:
        """Nothing to recover: no entries are ever stored."""

    def snapshot(self, checkpoint_id: int) -> list[Any]:
        """Nothing to pre-commit: output is published already."""
        return []

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Nothing to commit: output is published already."""

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        """Nothing to roll back: published output stays."""

    def end_input(self) -> None:
        """Nothing buffered to flush."""

    def close(self) -> None:
        """No resources held."""
