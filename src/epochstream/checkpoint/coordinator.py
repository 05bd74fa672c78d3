"""The checkpoint coordinator: trigger, collect acks, complete, abort, time out.

It runs on the job master's single event thread, so it holds no locks and never
blocks: the job master feeds it messages (:meth:`CheckpointCoordinator.receive_ack`,
:meth:`~CheckpointCoordinator.receive_decline`), calls
:meth:`~CheckpointCoordinator.tick` after every event and waits at most the number of
seconds ``tick`` returns before calling it again. Everything the coordinator wants
done outside itself goes through :class:`CoordinatorCallbacks`.

A checkpoint is complete only once its ``_metadata`` is durably written (ARCHITECTURE
section 4, step 5); only then are tasks told to commit.

Example::

    coord = CheckpointCoordinator(config=cfg, storage=storage, clock=SystemClock(),
                                  job_id="j", parallelism=2, max_parallelism=128,
                                  operator_parallelism={"sum": 2}, callbacks=master)
    coord.start_attempt(tasks={("c", 0), ("c", 1)}, source_tasks={("c", 0), ("c", 1)})
    while running:
        wait_for_message(timeout=coord.tick())
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Protocol

from epochstream.checkpoint.config import CheckpointConfig
from epochstream.checkpoint.metadata import (
    KIND_CHECKPOINT,
    CheckpointMetadata,
    CheckpointStats,
    task_key_str,
)
from epochstream.checkpoint.storage import CheckpointStorage
from epochstream.exceptions import CheckpointError, ConfigurationError
from epochstream.runtime.clock import Clock
from epochstream.runtime.messages import (
    AcknowledgeCheckpoint,
    DeclineCheckpoint,
    TaskCheckpointStats,
    TaskKey,
)
from epochstream.state.handles import OperatorSubtaskState

__all__ = ["CheckpointCoordinator", "CompletedCheckpoint", "CoordinatorCallbacks"]

log = logging.getLogger(__name__)


class CoordinatorCallbacks(Protocol):
    """What the coordinator asks of the job master.

    Example::

        class Master:
            def trigger_sources(self, checkpoint_id, timestamp, final):
                for slot in slots: slot.send(TriggerCheckpoint(checkpoint_id, timestamp, final))
            def notify_complete(self, checkpoint_id): ...
            def notify_aborted(self, checkpoint_id, reason): ...
            def fail_job(self, reason): ...
    """

    def trigger_sources(self, checkpoint_id: int, timestamp: float, final: bool) -> None:
        """Send ``TriggerCheckpoint`` to every source task."""

    def notify_complete(self, checkpoint_id: int) -> None:
        """Send ``NotifyCheckpointComplete`` to every task."""

    def notify_aborted(self, checkpoint_id: int, reason: str) -> None:
        """Send ``NotifyCheckpointAborted`` to every task."""

    def fail_job(self, reason: str) -> None:
        """Fail the current attempt (the restart strategy decides what follows)."""


@dataclass(frozen=True)
class CompletedCheckpoint:
    """A checkpoint whose ``_metadata`` is written: restorable.

    Example::

        cp = coord.latest_completed
        restore_tasks(cp.directory, cp.metadata) if cp else start_fresh()
    """

    checkpoint_id: int
    directory: str
    metadata: CheckpointMetadata


@dataclass
class _Pending:
    """A triggered checkpoint waiting for acknowledgements."""

    checkpoint_id: int
    directory: str
    final: bool
    trigger_now: float  # monotonic, for duration and timeout
    trigger_wall: float  # epoch seconds, for metadata
    awaiting: set[TaskKey]
    acks: dict[TaskKey, AcknowledgeCheckpoint] = field(default_factory=dict)


class CheckpointCoordinator:
    """Triggers periodic checkpoints and turns complete sets of acks into checkpoints.

    Ids are strictly increasing and never reused, also across attempts and job
    master restarts: the counter starts above every ``chk-<n>`` directory in
    ``storage`` and above ``first_checkpoint_id - 1``.

    Example::

        coord.start_attempt(tasks, source_tasks)
        coord.tick()                      # triggers when the interval has elapsed
        coord.receive_ack(ack)            # the last ack writes _metadata and notifies
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
        first_checkpoint_id: int | None = None,
    ) -> None:
        self._config = config
        self._storage = storage
        self._clock = clock
        self._job_id = job_id
        self._parallelism = parallelism
        self._max_parallelism = max_parallelism
        self._operator_parallelism = dict(operator_parallelism)
        self._callbacks = callbacks
        floor = first_checkpoint_id if first_checkpoint_id is not None else 1
        self._next_id = max(storage.max_checkpoint_id() + 1, floor, 1)

        self._tasks: frozenset[TaskKey] = frozenset()
        self._source_tasks: frozenset[TaskKey] = frozenset()
        self._armed = False
        self._pending: dict[int, _Pending] = {}  # insertion order == id order
        self._next_periodic: float = 0.0
        self._last_completion: float | None = None
        self._consecutive_failures = 0

        self._final_requested = False
        self._final_id: int | None = None
        self._final_completed = False

        self._latest: CompletedCheckpoint | None = None
        self._completed_stats: list[CheckpointStats] = []

    # ------------------------------------------------------------ queries

    @property
    def latest_completed(self) -> CompletedCheckpoint | None:
        """The newest completed (or restored-from) checkpoint, ``None`` before any."""
        return self._latest

    @property
    def completed_stats(self) -> list[CheckpointStats]:
        """Stats of every checkpoint this coordinator completed, oldest first."""
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
    def pending_ids(self) -> list[int]:
        """Ids of the checkpoints triggered and not yet completed or aborted, ascending."""
        return list(self._pending)

    @property
    def next_checkpoint_id(self) -> int:
        """The id the next trigger will use."""
        return self._next_id

    # ------------------------------------------------------------ lifecycle

    def start_attempt(self, tasks: set[TaskKey], source_tasks: set[TaskKey]) -> None:
        """(Re)arm for a new deployment attempt; the first trigger is one interval away.

        ``tasks`` must all acknowledge a checkpoint; ``source_tasks`` (a subset) are
        the tasks the job master triggers. Resets the final-checkpoint state.
        """
        if not tasks:
            raise ConfigurationError("start_attempt: a job needs at least one task")
        if not source_tasks or not source_tasks <= tasks:
            raise ConfigurationError(
                f"start_attempt: source tasks {sorted(source_tasks)} must be a non-empty "
                f"subset of the tasks {sorted(tasks)}"
            )
        if self._pending:
            self.stop_attempt("new attempt started")
        self._tasks = frozenset(tasks)
        self._source_tasks = frozenset(source_tasks)
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
        """Failover: forget pending checkpoints and discard their directories.

        Tasks are not notified: they are being cancelled.
        """
        for pending in list(self._pending.values()):
            log.info(
                "job %s: dropping pending checkpoint %d (%s)",
                self._job_id,
                pending.checkpoint_id,
                reason,
            )
            self._discard(pending.checkpoint_id)
        self._pending.clear()
        self._armed = False

    def shutdown(self, *, cancelled: bool) -> None:
        """The job ended: drop pending checkpoints; when ``cancelled`` and not
        ``retain_on_cancel``, also delete the completed ones of this job.
        """
        self.stop_attempt("job cancelled" if cancelled else "job finished")
        if cancelled and not self._config.retain_on_cancel:
            for n in self._storage.completed_ids():
                self._discard(n)
            self._latest = None

    def restore_from(self, directory: str, metadata: CheckpointMetadata) -> None:
        """Declare ``metadata`` (a checkpoint or savepoint) as the latest completed one,
        e.g. when resuming a job; later ids continue after its id."""
        if self._pending:
            raise CheckpointError(
                f"job {self._job_id}: cannot restore from checkpoint {metadata.checkpoint_id} "
                f"while checkpoints {list(self._pending)} are pending"
            )
        self._latest = CompletedCheckpoint(metadata.checkpoint_id, directory, metadata)
        self._next_id = max(self._next_id, metadata.checkpoint_id + 1)

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
            self._trigger(now, final=False)
            due = self._periodic_due_at()
        waits = [p.trigger_now + self._config.timeout - now for p in self._pending.values()]
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

    def _periodic_due_at(self) -> float | None:
        if not self._armed or self._final_requested:
            return None
        if len(self._pending) >= self._config.max_concurrent:
            return None
        due = self._next_periodic
        if self._last_completion is not None:
            due = max(due, self._last_completion + self._config.min_pause)
        return due

    def _maybe_trigger_final(self) -> None:
        if self._armed and self._final_requested and self._final_id is None and not self._pending:
            self._trigger(self._clock.now(), final=True)

    def _trigger(self, now: float, *, final: bool) -> None:
        checkpoint_id = self._next_id
        self._next_id += 1
        self._next_periodic = now + self._config.interval
        if final:
            self._final_id = checkpoint_id
        try:
            directory = self._storage.checkpoint_dir(checkpoint_id)
        except CheckpointError as err:
            self._count_failure(checkpoint_id, f"could not be triggered: {err}", final=final)
            return
        self._pending[checkpoint_id] = _Pending(
            checkpoint_id=checkpoint_id,
            directory=directory,
            final=final,
            trigger_now=now,
            trigger_wall=self._clock.wall(),
            awaiting=set(self._tasks),
        )
        log.debug(
            "job %s: triggering %scheckpoint %d",
            self._job_id,
            "final " if final else "",
            checkpoint_id,
        )
        self._callbacks.trigger_sources(
            checkpoint_id, self._pending[checkpoint_id].trigger_wall, final
        )

    def _expire(self, now: float) -> None:
        timeout = self._config.timeout
        for pending in list(self._pending.values()):
            # A failure may disarm us (fail_job) midway; the rest is left to stop_attempt.
            if not self._armed:
                return
            if now - pending.trigger_now >= timeout:
                missing = ", ".join(task_key_str(t) for t in sorted(pending.awaiting))
                self._fail(
                    pending,
                    f"expired after {timeout:g} s before all tasks acknowledged "
                    f"(missing: {missing})",
                )

    # ------------------------------------------------------------ messages

    def receive_ack(self, msg: AcknowledgeCheckpoint) -> None:
        """Record a task's acknowledgement; the last one completes the checkpoint."""
        pending = self._pending.get(msg.checkpoint_id) if self._armed else None
        if pending is None:
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
            self._complete(pending)

    def receive_decline(self, msg: DeclineCheckpoint) -> None:
        """A task cannot take part: abort the checkpoint and count a failure."""
        pending = self._pending.get(msg.checkpoint_id) if self._armed else None
        if pending is None or msg.task not in self._tasks:
            log.debug(
                "job %s: ignoring decline of checkpoint %d from %s: %s",
                self._job_id,
                msg.checkpoint_id,
                task_key_str(msg.task),
                msg.reason,
            )
            return
        self._fail(pending, f"declined by task {task_key_str(msg.task)}: {msg.reason}")

    # ------------------------------------------------------------ completion

    def _complete(self, pending: _Pending) -> None:
        n = pending.checkpoint_id
        try:
            metadata = self._build_metadata(pending)
            self._storage.write_metadata(n, metadata)
        except CheckpointError as err:
            self._fail(pending, f"could not be finalized: {err}")
            return
        del self._pending[n]
        now = self._clock.now()
        self._last_completion = now
        self._latest = CompletedCheckpoint(n, pending.directory, metadata)
        self._completed_stats.append(metadata.stats)
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
        self._callbacks.notify_complete(n)
        for older in [p for p in self._pending.values() if p.checkpoint_id < n]:
            self._abort(older, f"subsumed by completed checkpoint {n}")
        self._consecutive_failures = 0
        self._prune(n)
        self._maybe_trigger_final()

    def _build_metadata(self, pending: _Pending) -> CheckpointMetadata:
        operators: dict[str, dict[int, OperatorSubtaskState]] = {}
        tasks: dict[str, TaskCheckpointStats] = {}
        for task in sorted(pending.acks):
            ack = pending.acks[task]
            tasks[task_key_str(task)] = ack.stats
            for uid, state in ack.states.items():
                by_subtask = operators.setdefault(uid, {})
                if task[1] in by_subtask:
                    raise CheckpointError(
                        f"operator {uid!r} subtask {task[1]} was acknowledged by two tasks "
                        f"(second: {task_key_str(task)})"
                    )
                by_subtask[task[1]] = state
        duration = self._clock.now() - pending.trigger_now
        stats = CheckpointStats(
            checkpoint_id=pending.checkpoint_id,
            trigger_time=pending.trigger_wall,
            duration=duration,
            state_size=sum(t.state_size for t in tasks.values()),
            tasks=tasks,
            kind=KIND_CHECKPOINT,
        )
        return CheckpointMetadata(
            job_id=self._job_id,
            checkpoint_id=pending.checkpoint_id,
            kind=KIND_CHECKPOINT,
            trigger_time=pending.trigger_wall,
            completion_time=self._clock.wall(),
            parallelism=self._parallelism,
            max_parallelism=self._max_parallelism,
            operators=operators,
            operator_parallelism=dict(self._operator_parallelism),
            stats=stats,
        )

    def _prune(self, latest: int) -> None:
        """Keep the newest ``retained`` completed checkpoints; also drop leftover
        directories older than ``latest`` (crashed attempts, tasks writing late)."""
        completed = self._storage.completed_ids()
        keep = set(completed[-self._config.retained :])
        for n in self._storage.checkpoint_ids():
            if n < latest and n not in keep and n not in self._pending:
                self._discard(n)

    # ------------------------------------------------------------ failure

    def _fail(self, pending: _Pending, why: str) -> None:
        self._abort(pending, why)
        self._count_failure(pending.checkpoint_id, why, final=pending.final)

    def _abort(self, pending: _Pending, reason: str) -> None:
        n = pending.checkpoint_id
        self._pending.pop(n, None)
        self._discard(n)
        log.info("job %s: aborted checkpoint %d: %s", self._job_id, n, reason)
        self._callbacks.notify_aborted(n, reason)

    def _count_failure(self, checkpoint_id: int, why: str, *, final: bool) -> None:
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
                self._callbacks.fail_job(f"final {reason}")
            else:
                self._callbacks.fail_job(
                    f"{reason}; {count} consecutive checkpoint failures exceed the "
                    f"{tolerable} tolerated"
                )
            return
        log.warning(
            "job %s: %s (%d of %d tolerated consecutive failures)",
            self._job_id,
            reason,
            self._consecutive_failures,
            tolerable,
        )
        self._maybe_trigger_final()

    def _discard(self, checkpoint_id: int) -> None:
        try:
            self._storage.discard(checkpoint_id)
        except CheckpointError as err:
            # Cleanup failure must not stop checkpointing; the directory has no
            # _metadata so it is never restored, and a later prune retries.
            log.warning("job %s: %s", self._job_id, err)
