"""The checkpoint coordinator: trigger, collect acks, persist, complete, abort, time out.

It runs on the job master's single event thread, holds no locks and never blocks:
the job master feeds it messages (:meth:`CheckpointCoordinator.receive_ack`,
:meth:`~CheckpointCoordinator.receive_decline`), calls
:meth:`~CheckpointCoordinator.tick` after every event and waits at most the number of
seconds ``tick`` returns before calling it again. Storage I/O (writing ``_metadata``,
deleting discarded checkpoints and unreferenced shared files) runs off the event
thread through ``callbacks.run_io``; its completion comes back as an event
(:meth:`~CheckpointCoordinator.on_persisted`). Completed checkpoints go to a
:class:`~epochstream.checkpoint.completed.CompletedCheckpointStore`, which knows the
latest, its fallbacks and which checkpoints stay on storage.

Each pending checkpoint is a small state machine::

    AWAITING_ACKS --last ack--> PERSISTING --metadata written--> completed
          |                          |
          +--- decline / timeout ----+---- write failed ----> aborted

A checkpoint is complete only once its ``_metadata`` is durably written (docs/architecture.md,
Checkpoint protocol, step 5); only then are tasks told to commit. Savepoints are checkpoints
triggered by the user into their own directory in the canonical format: they are
never pruned, never used for failover, not subsumed, and (unless they stop the job)
commit nothing; periodic checkpoints pause while one is pending.

Example::

    coord = CheckpointCoordinator(config=cfg, storage=storage, clock=SystemClock(),
                                  job_id="j", parallelism=2, max_parallelism=128,
                                  operator_parallelism={"sum": 2}, callbacks=master)
    coord.start_attempt(tasks={("c", 0), ("c", 1)})
    while running:
        wait_for_message(timeout=coord.tick())
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from epochstream.checkpoint.cleanup import StorageCleaner
from epochstream.checkpoint.completed import CompletedCheckpointStore
from epochstream.checkpoint.metadata import CheckpointMetadata
from epochstream.checkpoint.outage import StorageOutage
from epochstream.checkpoint.pending import CompletedCheckpoint, PendingCheckpoint, PendingState
from epochstream.checkpoint.shared_registry import SharedStateRegistry
from epochstream.checkpoint.storage import CheckpointStorage, write_metadata_file
from epochstream.core.checkpoint_config import CheckpointConfig
from epochstream.core.checkpoint_stats import CheckpointStats, TaskKey, task_key_str
from epochstream.core.clock import Clock
from epochstream.core.events import CheckpointOptions
from epochstream.core.filesystems import storage_fs
from epochstream.core.storage_faults import is_unavailable
from epochstream.exceptions import CheckpointError, ConfigurationError, StorageUnavailableError
from epochstream.state.acknowledgements import AcknowledgeCheckpoint, DeclineCheckpoint

__all__ = ["CheckpointCoordinator", "CompletedCheckpoint", "CoordinatorCallbacks", "PendingState"]

log = logging.getLogger(__name__)
#: Completed checkpoints between two sweeps of the shared directory for orphans.
_SWEEP_EVERY = 10


class CoordinatorCallbacks(Protocol):
    """What the coordinator asks of the job master.

    Example::

        class Master:
            def trigger_sources(self, checkpoint_id, timestamp, final, options): ...
            def notify_complete(self, checkpoint_id, metadata): ...
            def notify_aborted(self, checkpoint_id, reason): ...
            def fail_job(self, reason, error=None): ...
            def run_io(self, work, done): io_thread.submit(work, then=done)
            def savepoint_done(self, checkpoint_id, path, error): ...
    """

    def trigger_sources(
        self, checkpoint_id: int, timestamp: float, final: bool, options: CheckpointOptions
    ) -> None:
        """Send ``TriggerCheckpoint`` to every source task."""

    def notify_complete(self, checkpoint_id: int, metadata: CheckpointMetadata) -> None:
        """Commit global committers' entries of ``metadata``; send ``NotifyCheckpointComplete``."""

    def notify_aborted(self, checkpoint_id: int, reason: str) -> None:
        """Send ``NotifyCheckpointAborted`` to every task."""

    def fail_job(self, reason: str, error: BaseException | None = None) -> None:
        """Fail the current attempt (the restart strategy decides what follows);
        ``error``: a :class:`StorageUnavailableError` when checkpoint storage could not
        take the checkpoints (the job master then waits for it instead)."""

    def run_io(
        self, work: Callable[[], None], done: Callable[[BaseException | None], None] | None
    ) -> None:
        """Run ``work`` off the event thread; then ``done(error)`` back on it."""

    def savepoint_done(self, checkpoint_id: int, path: str | None, error: str | None) -> None:
        """A savepoint completed at ``path`` or failed with ``error``."""


class CheckpointCoordinator:
    """Triggers checkpoints and savepoints and turns complete sets of acks into them.

    Ids are strictly increasing and never reused, also across attempts and job
    master restarts: the counter starts above every ``chk-<n>`` directory in
    ``storage`` and above ``first_checkpoint_id - 1``.

    Example::

        coord.start_attempt(tasks)
        coord.tick()                      # triggers when the interval has elapsed
        coord.receive_ack(ack)            # the last ack persists _metadata ...
        coord.on_persisted(n, None)       # ... and this completes the checkpoint
    """

    def __init__(
        self,
        *,
        config: CheckpointConfig,
        storage: CheckpointStorage,
        clock: Clock,
        job_id: str,
        parallelism: int,
        max_parallelism: int,
        operator_parallelism: dict[str, int],
        callbacks: CoordinatorCallbacks,
        job_name: str = "",
        first_checkpoint_id: int | None = None,
        outage: StorageOutage | None = None,
    ) -> None:
        self._config = config
        self._storage = storage
        self._clock = clock
        self._job_id = job_id
        self._job_name = job_name
        self._parallelism = parallelism
        self._max_parallelism = max_parallelism
        self._operator_parallelism = dict(operator_parallelism)
        self._callbacks = callbacks
        # Checkpoints failing because storage cannot be reached open an outage there;
        # the next completed checkpoint closes it.
        self._outage = outage
        floor = first_checkpoint_id if first_checkpoint_id is not None else 1
        self._next_id = max(storage.max_checkpoint_id() + 1, floor, 1)
        self.registry = SharedStateRegistry()
        self._cleaner = StorageCleaner(storage, callbacks.run_io)
        self._store = CompletedCheckpointStore(
            retained=config.retained, registry=self.registry, cleaner=self._cleaner, job_id=job_id
        )

        self._tasks: frozenset[TaskKey] = frozenset()
        self._armed = False
        self._pending: dict[int, PendingCheckpoint] = {}  # insertion order == id order
        self._next_periodic: float = 0.0
        self._last_completion: float | None = None
        self._consecutive_failures = 0

        self._final_requested = False
        self._final_id: int | None = None
        self._final_completed = False
        self._completed_stats: list[CheckpointStats] = []
        # The highest id whose _metadata write began: no checkpoint above it completed,
        # and none can once the attempt is stopped (what cancelled sinks may abort).
        self._maybe_completed = 0

    # ------------------------------------------------------------ queries

    @property
    def latest_completed(self) -> CompletedCheckpoint | None:
        """The newest completed (or restored-from) checkpoint, ``None`` before any."""
        return self._store.latest

    @property
    def completed_stats(self) -> list[CheckpointStats]:
        """Stats of every checkpoint and savepoint this coordinator completed, oldest first."""
        return list(self._completed_stats)

    @property
    def final_checkpoint_id(self) -> int | None:
        """Id of this attempt's final checkpoint once triggered, else ``None``."""
        return self._final_id

    @property
    def final_completed(self) -> bool:
        """True once this attempt's final checkpoint completed (sinks committed all)."""
        return self._final_completed

    @property
    def maybe_completed_id(self) -> int:
        """The highest checkpoint or savepoint id that may have completed (its
        ``_metadata`` write began), 0 if none: after :meth:`stop_attempt` no higher id
        completes, so what only higher ids hold is never committed."""
        return self._maybe_completed

    @property
    def pending_ids(self) -> list[int]:
        """Ids of the checkpoints triggered and not yet completed or aborted, ascending."""
        return list(self._pending)

    @property
    def next_checkpoint_id(self) -> int:
        """The id the next trigger will use."""
        return self._next_id

    @property
    def retained_ids(self) -> list[int]:
        """Completed checkpoints of this job still on storage, oldest first."""
        return self._store.retained_ids

    # ------------------------------------------------------------ lifecycle

    def start_attempt(self, tasks: set[TaskKey]) -> None:
        """(Re)arm for a new deployment attempt; the first trigger is one interval away.

        ``tasks`` must all acknowledge a checkpoint. Resets the final-checkpoint state.
        """
        if not tasks:
            raise ConfigurationError("start_attempt: a job needs at least one task")
        if self._pending:
            self.stop_attempt("new attempt started")
        self._tasks = frozenset(tasks)
        self._armed = True
        self._next_periodic = self._clock.now() + self._config.interval
        self._final_requested = False
        self._final_id = None
        self._final_completed = False
        log.debug(
            "job %s: checkpointing armed for %d tasks, next id %d",
            self._job_id,
            len(tasks),
            self._next_id,
        )

    def stop_attempt(self, reason: str) -> None:
        """Failover: forget pending checkpoints and discard what they wrote.

        Tasks are not notified: they are being cancelled.
        """
        for pending in list(self._pending.values()):
            log.info(
                "job %s: dropping pending checkpoint %d (%s)",
                self._job_id,
                pending.checkpoint_id,
                reason,
            )
            self._drop(pending, reason, notify=False)
        self._armed = False

    def shutdown(self, *, cancelled: bool) -> None:
        """The job ended: drop pending checkpoints; when ``cancelled`` and not
        ``retain_on_cancel``, also delete this job's checkpoints."""
        self.stop_attempt("job cancelled" if cancelled else "job finished")
        if cancelled and not self._config.retain_on_cancel:
            self._cleaner.delete_dir(self._storage.job_dir)
            self._store.forget()

    def restore_from(self, candidates: list[CompletedCheckpoint]) -> None:
        """Start from ``candidates[0]`` (a checkpoint or savepoint of an earlier job),
        falling back to the later ones if it proves corrupt; ids continue after it."""
        if self._pending:
            raise CheckpointError(
                f"job {self._job_id}: cannot restore while checkpoints {list(self._pending)} "
                "are pending"
            )
        if not candidates:
            raise CheckpointError(f"job {self._job_id}: restore needs a checkpoint")
        self._store.restore_from(candidates)
        self._next_id = max(self._next_id, max(c.checkpoint_id for c in candidates) + 1)

    def discard_corrupt(self, checkpoint_id: int, reason: str) -> CompletedCheckpoint | None:
        """Checkpoint ``checkpoint_id`` could not be restored: fall back to the previous
        restorable one (returned; ``None`` when there is none left)."""
        return self._store.discard_corrupt(checkpoint_id, reason, pending=set(self._pending))

    # ------------------------------------------------------------ time

    def tick(self) -> float | None:
        """Do what is due now (time out, trigger); seconds until the next due event.

        ``None`` means nothing is scheduled (only a message can make progress).
        """
        if not self._armed:
            return None
        now = self._clock.now()
        self._expire(now)
        due = self._periodic_due_at()
        if due is not None and now >= due:
            self._trigger(now, final=False, options=self._checkpoint_options())
            due = self._periodic_due_at()
        waits = [
            p.trigger_now + self._config.timeout - now
            for p in self._pending.values()
            if p.state is PendingState.AWAITING_ACKS
        ]
        if due is not None:
            waits.append(due - now)
        if not waits:
            return None
        return max(0.0, min(waits))

    def trigger_final(self) -> None:
        """All sources are exhausted: take a final checkpoint as soon as none is pending.

        No periodic checkpoint is triggered afterwards. Idempotent.
        """
        if not self._armed:
            log.warning("job %s: final checkpoint requested while not armed", self._job_id)
            return
        if self._final_requested:
            return
        self._final_requested = True
        self._maybe_trigger_final()

    def trigger_savepoint(self, directory: str, *, terminate: bool = False) -> int:
        """Start a savepoint into ``directory`` now; returns its checkpoint id.

        ``terminate``: stop-with-savepoint (sources end after it, sinks commit it).
        Raises :class:`CheckpointError` when the job cannot take one now.
        """
        if not self._armed:
            raise CheckpointError(f"job {self._job_id} is not running: no savepoint now")
        if self._final_requested:
            raise CheckpointError(f"job {self._job_id} is finishing: no savepoint now")
        if any(p.is_savepoint for p in self._pending.values()):
            raise CheckpointError(f"job {self._job_id}: a savepoint is already in progress")
        options = CheckpointOptions(
            savepoint_dir=directory,
            base_checkpoint_id=self._base_id(),
            terminate=terminate,
        )
        return self._trigger(self._clock.now(), final=False, options=options)

    def _base_id(self) -> int | None:
        latest = self._store.latest
        return None if latest is None else latest.checkpoint_id

    def _checkpoint_options(self) -> CheckpointOptions:
        # Savepoints (trigger_savepoint) stay aligned, as in Flink: a savepoint is the
        # portable image of the job's state, with nothing in flight.
        return CheckpointOptions(
            base_checkpoint_id=self._base_id(),
            unaligned=self._config.unaligned,
            aligned_timeout=self._config.aligned_timeout,
        )

    def _periodic_due_at(self) -> float | None:
        if not self._armed or self._final_requested:
            return None
        if any(p.is_savepoint for p in self._pending.values()):
            return None  # a savepoint barrier must not be subsumed by a newer checkpoint
        if len(self._pending) >= self._config.max_concurrent:
            return None
        due = self._next_periodic
        if self._last_completion is not None:
            due = max(due, self._last_completion + self._config.min_pause)
        return due

    def _maybe_trigger_final(self) -> None:
        if self._armed and self._final_requested and self._final_id is None and not self._pending:
            # Aligned: the final checkpoint commits the job's last output, so it must
            # take every record in flight with it, not leave them behind its barrier.
            self._trigger(
                self._clock.now(),
                final=True,
                options=CheckpointOptions(base_checkpoint_id=self._base_id()),
            )

    def _trigger(self, now: float, *, final: bool, options: CheckpointOptions) -> int:
        checkpoint_id = self._next_id
        self._next_id += 1
        if not options.is_savepoint:
            self._next_periodic = now + self._config.interval
        if final:
            self._final_id = checkpoint_id
        if options.savepoint_dir is None:
            directory = self._storage.checkpoint_path(checkpoint_id)
            # Created now: it also records that the id was used (ids seed from storage).
            self._cleaner.make_checkpoint_dir(checkpoint_id)
        else:
            directory = options.savepoint_dir
        self._pending[checkpoint_id] = PendingCheckpoint(
            checkpoint_id=checkpoint_id,
            directory=directory,
            final=final,
            options=options,
            trigger_now=now,
            trigger_wall=self._clock.wall(),
            awaiting=set(self._tasks),
        )
        log.debug(
            "job %s: triggering %s %d",
            self._job_id,
            "savepoint"
            if options.is_savepoint
            else ("final checkpoint" if final else "checkpoint"),
            checkpoint_id,
        )
        self._callbacks.trigger_sources(
            checkpoint_id, self._pending[checkpoint_id].trigger_wall, final, options
        )
        return checkpoint_id

    def _expire(self, now: float) -> None:
        timeout = self._config.timeout
        for pending in list(self._pending.values()):
            # A failure may disarm us (fail_job) midway; the rest is left to stop_attempt.
            if not self._armed:
                return
            if pending.state is PendingState.AWAITING_ACKS and now - pending.trigger_now >= timeout:
                missing = ", ".join(task_key_str(t) for t in sorted(pending.awaiting))
                self._fail(
                    pending,
                    f"expired after {timeout:g} s before all tasks acknowledged "
                    f"(missing: {missing})",
                )

    # ------------------------------------------------------------ messages

    def receive_ack(self, msg: AcknowledgeCheckpoint) -> None:
        """Record a task's acknowledgement; the last one persists the checkpoint."""
        pending = self._pending.get(msg.checkpoint_id) if self._armed else None
        if pending is None or pending.state is not PendingState.AWAITING_ACKS:
            log.debug(
                "job %s: ignoring ack of unknown or finished checkpoint %d from %s",
                self._job_id,
                msg.checkpoint_id,
                task_key_str(msg.task),
            )
            return
        if msg.task not in pending.awaiting:
            log.debug(
                "job %s: ignoring %s ack of checkpoint %d from %s",
                self._job_id,
                "duplicate" if msg.task in pending.acks else "unexpected",
                msg.checkpoint_id,
                task_key_str(msg.task),
            )
            return
        pending.awaiting.discard(msg.task)
        pending.acks[msg.task] = msg
        if not pending.awaiting:
            self._persist(pending)

    def receive_decline(self, msg: DeclineCheckpoint) -> None:
        """A task cannot take part: abort the checkpoint and count a failure."""
        pending = self._pending.get(msg.checkpoint_id) if self._armed else None
        if (
            pending is None
            or pending.state is not PendingState.AWAITING_ACKS
            or msg.task not in self._tasks
        ):
            log.debug(
                "job %s: ignoring decline of checkpoint %d from %s: %s",
                self._job_id,
                msg.checkpoint_id,
                task_key_str(msg.task),
                msg.reason,
            )
            return
        self._fail(
            pending,
            f"declined by task {task_key_str(msg.task)}: {msg.reason}",
            storage_unavailable=msg.storage_unavailable,
        )

    # ------------------------------------------------------------ completion

    def _persist(self, pending: PendingCheckpoint) -> None:
        try:
            metadata = pending.build_metadata(
                job_id=self._job_id,
                job_name=self._job_name,
                parallelism=self._parallelism,
                max_parallelism=self._max_parallelism,
                operator_parallelism=self._operator_parallelism,
                clock=self._clock,
            )
        except CheckpointError as err:
            self._fail(pending, f"could not be finalized: {err}")
            return
        pending.state = PendingState.PERSISTING
        pending.metadata = metadata
        # Before the write: once it may land, a restore may commit what it holds.
        self._maybe_completed = max(self._maybe_completed, pending.checkpoint_id)
        fs = storage_fs(pending.directory, self._storage.options)
        directory, n = pending.directory, pending.checkpoint_id

        def write() -> None:
            write_metadata_file(fs, directory, metadata)

        self._callbacks.run_io(write, lambda error: self.on_persisted(n, error))

    def on_persisted(self, checkpoint_id: int, error: BaseException | None) -> None:
        """The ``_metadata`` of ``checkpoint_id`` was written (``error`` is None) or not."""
        pending = self._pending.get(checkpoint_id)
        if pending is None or pending.state is not PendingState.PERSISTING:
            return  # dropped meanwhile (failover); its files were discarded
        if error is not None:
            self._fail(
                pending,
                f"could not be finalized: {error}",
                storage_unavailable=is_unavailable(error),
            )
            return
        self._complete(pending)

    def _complete(self, pending: PendingCheckpoint) -> None:
        n = pending.checkpoint_id
        metadata = pending.metadata
        assert metadata is not None
        del self._pending[n]
        now = self._clock.now()
        if self._outage is not None:
            self._outage.recovered(now=self._clock.wall())
        self._completed_stats.append(metadata.stats)
        freed: list[str] = []
        if pending.is_savepoint:
            log.info("job %s: completed savepoint %d at %s", self._job_id, n, pending.directory)
            if pending.options.terminate:
                # Sinks commit what the savepoint covers before the job stops.
                self._callbacks.notify_complete(n, metadata)
            self._callbacks.savepoint_done(n, pending.directory, None)
        else:
            self._last_completion = now
            checkpoint = CompletedCheckpoint(n, pending.directory, metadata)
            self._store.add(checkpoint, pending.shared_files())
            if pending.final:
                self._final_completed = True
            log.info(
                "job %s: completed %scheckpoint %d (%d bytes, %d tasks) in %.3f s",
                self._job_id,
                "final " if pending.final else "",
                n,
                metadata.stats.state_size,
                len(pending.acks),
                metadata.stats.duration,
            )
            self._callbacks.notify_complete(n, metadata)
            for older in [
                p for p in self._pending.values() if p.checkpoint_id < n and not p.is_savepoint
            ]:
                self._drop(older, f"subsumed by completed checkpoint {n}", notify=True)
            freed += self._store.prune(pending=set(self._pending))
            self._consecutive_failures = 0
            if len(self._completed_stats) % _SWEEP_EVERY == 0:
                self._cleaner.sweep_orphans(below=n, keep=self.registry.protected())
        freed += self.registry.checkpoint_ended(n)
        self._cleaner.delete_files(freed)
        self._maybe_trigger_final()

    # ------------------------------------------------------------ failure

    def _fail(
        self, pending: PendingCheckpoint, why: str, *, storage_unavailable: bool = False
    ) -> None:
        """Abort ``pending``; a checkpoint (not a savepoint) counts against
        ``tolerable_failures``. ``storage_unavailable``: it failed because storage could
        not be reached, which the outage records (the count is the same)."""
        if storage_unavailable and self._outage is not None:
            self._outage.failed(f"checkpoint {pending.checkpoint_id} {why}", now=self._clock.wall())
        self._drop(pending, why, notify=True)
        if pending.is_savepoint:
            # A failed savepoint is the user's error to see, not a job failure.
            self._maybe_trigger_final()
            return
        self._count_failure(
            pending.checkpoint_id, why, final=pending.final, storage_unavailable=storage_unavailable
        )

    def _drop(self, pending: PendingCheckpoint, reason: str, *, notify: bool) -> None:
        n = pending.checkpoint_id
        self._pending.pop(n, None)
        written = self.registry.abandon(pending.shared_files())
        if pending.is_savepoint:
            self._cleaner.delete_dir(pending.directory)
            self._callbacks.savepoint_done(n, None, reason)
        else:
            self._cleaner.discard(n)
        self._cleaner.delete_files(written + self.registry.checkpoint_ended(n))
        log.info("job %s: aborted checkpoint %d: %s", self._job_id, n, reason)
        if notify:
            self._callbacks.notify_aborted(n, reason)

    def _count_failure(
        self, checkpoint_id: int, why: str, *, final: bool, storage_unavailable: bool = False
    ) -> None:
        self._consecutive_failures += 1
        reason = f"checkpoint {checkpoint_id} {why}"
        tolerable = self._config.tolerable_failures
        if final or self._consecutive_failures > tolerable:
            count = self._consecutive_failures
            # The attempt is over: no triggers, timeouts or acks until start_attempt,
            # and the next attempt starts with a fresh failure budget.
            self._armed = False
            self._consecutive_failures = 0
            if final:
                message = f"final {reason}"
            else:
                message = (
                    f"{reason}; {count} consecutive checkpoint failures exceed the "
                    f"{tolerable} tolerated"
                )
            # Storage that takes no writes (a full disk, a read-only mount) is an outage:
            # restarting cannot fix it, so the job master waits for it without using
            # the restart strategy, as for a restore that met the outage.
            error = (
                StorageUnavailableError(message, path=self._storage.job_dir)
                if storage_unavailable
                else None
            )
            self._callbacks.fail_job(message, error)
            return
        log.warning(
            "job %s: %s (%d of %d tolerated consecutive failures)",
            self._job_id,
            reason,
            self._consecutive_failures,
            tolerable,
        )
        self._maybe_trigger_final()
