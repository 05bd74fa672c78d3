"""How the job master describes a failed attempt, and a job that cannot go on.

Example::

    failure = Failure.of_task(msg)          # a task's exception with its traceback
    failure = Failure.lost_slot(conn, err)  # a slot's control connection closed
    raise give_up(job_id, failures, failure, "fixed_delay: 3 of 3 restarts used")
    inbox.sleep(FailureHandler(job_id, tracker, coordinator).restart_delay(failure, failures))
"""

from __future__ import annotations

import logging
import shlex
import sys
from dataclasses import dataclass

from epochstream.checkpoint.coordinator import CheckpointCoordinator
from epochstream.checkpoint.pending import CompletedCheckpoint
from epochstream.core.restart import RestartTracker
from epochstream.deploy.control import SlotConnection
from epochstream.deploy.storage_wait import StorageWaiter
from epochstream.exceptions import CorruptStateError, JobExecutionError, StorageUnavailableError
from epochstream.runtime.messages import TaskFailed

__all__ = ["Failure", "FailureHandler", "give_up", "runner_lost"]

log = logging.getLogger(__name__)


@dataclass
class Failure:
    """Why an attempt ended; ``suppress_restarts`` when a restart cannot help."""

    cause: str
    suppress_restarts: bool = False
    error: BaseException | None = None

    @classmethod
    def of_task(cls, msg: TaskFailed) -> Failure:
        """A task's reported exception, with its traceback."""
        text = f"{msg.description}\n{msg.traceback}" if msg.traceback else msg.description
        return cls(text, suppress_restarts=msg.suppress_restarts, error=msg.error)

    @classmethod
    def lost_slot(cls, conn: SlotConnection, error: BaseException | None) -> Failure:
        """A slot whose control connection closed: its process most likely died."""
        return cls(
            f"slot {conn.slot} (pid {conn.pid}) lost its control connection"
            f" (process died?): {error!r}"
        )

    @classmethod
    def start_failed(cls, attempt: int, error: Exception) -> Failure:
        """The runner could not start the attempt's slots (``Popen``'s EMFILE, ENOMEM or
        EAGAIN, a Spark submission refused): most such causes pass, so the restart
        strategy decides, unless the error says restarting cannot help."""
        return cls(
            f"attempt {attempt} could not start its slots: {error!r}",
            suppress_restarts=bool(getattr(error, "suppress_restarts", False)),
            error=error,
        )

    @classmethod
    def enumeration_failed(cls, attempt: int, error: Exception) -> Failure:
        """A source's split enumerator could not list its splits (a Kafka broker not
        answering at the job's start, say): the restart strategy decides, as for a
        reader that loses its broker, unless the error says restarting cannot help."""
        return cls(
            f"attempt {attempt} could not list its sources' splits: {error!r}",
            suppress_restarts=bool(getattr(error, "suppress_restarts", False)),
            error=error,
        )

    @property
    def corrupt_checkpoint(self) -> CorruptStateError | None:
        """The restore error, when the attempt failed restoring a corrupt checkpoint."""
        error = self.error
        if isinstance(error, CorruptStateError) and error.checkpoint_id is not None:
            return error
        return None

    @property
    def storage_unavailable(self) -> bool:
        """True when the attempt failed because checkpoint storage could not be reached
        (the task's error, after its bounded retries): not corruption, not a job error."""
        return isinstance(self.error, StorageUnavailableError)


class FailureHandler:
    """What follows a failed attempt: the delay before the next one, or the end of the job.

    A checkpoint that failed to restore because it is corrupt is dropped first (the next
    attempt falls back to the one before it); an error that restarting cannot fix, or a
    restart strategy that says no, ends the job. An attempt that failed because
    checkpoint storage could not be reached neither drops a checkpoint nor uses a
    restart: the ``storage_wait`` waits until storage answers (see
    :mod:`epochstream.deploy.storage_wait`), then the same checkpoint is restored.

    Example::

        handler = FailureHandler(job_id, strategy.create_tracker(clock), coordinator)
        delay = handler.restart_delay(failure, failures)  # or raises JobExecutionError
    """

    def __init__(
        self,
        job_id: str,
        tracker: RestartTracker,
        coordinator: CheckpointCoordinator | None,
        storage_wait: StorageWaiter | None = None,
    ) -> None:
        self._job_id = job_id
        self._tracker = tracker
        self._coordinator = coordinator
        self._storage_wait = storage_wait

    def restart_delay(self, failure: Failure, failures: list[str]) -> float:
        """Seconds to wait before the next attempt; raises the ``JobExecutionError`` that
        ends the job instead when it must not restart (``failures``: every cause so far)."""
        if failure.storage_unavailable and self._storage_wait is not None:
            log.warning(
                "job %s: the attempt failed because checkpoint storage is unavailable; "
                "waiting for it (no restart attempt is used, no checkpoint is dropped)",
                self._job_id[:8],
            )
            self._storage_wait.wait(failure.error, failure.cause)
            return 0.0
        corrupt = failure.corrupt_checkpoint
        if corrupt is not None and self._coordinator is not None:
            assert corrupt.checkpoint_id is not None
            fallback = self._coordinator.discard_corrupt(corrupt.checkpoint_id, str(corrupt))
            if fallback is None:
                raise give_up(
                    self._job_id,
                    failures,
                    failure,
                    "the checkpoint or savepoint it restored is corrupt and no older checkpoint is left",
                )
            log.warning(
                "job %s: output that sinks committed after checkpoint %d may be written "
                "again, since the job now restarts from there",
                self._job_id[:8],
                fallback.checkpoint_id,
            )
        if failure.suppress_restarts:
            reason = "the error is not recoverable by restarting"
            raise give_up(self._job_id, failures, failure, reason)
        decision = self._tracker.on_failure()
        if not decision.restart:
            raise give_up(self._job_id, failures, failure, decision.reason)
        log.warning(
            "job %s: restarting in %.1fs (%s)", self._job_id[:8], decision.delay, decision.reason
        )
        return decision.delay


def give_up(job_id: str, failures: list[str], failure: Failure, reason: str) -> JobExecutionError:
    """The error of a job that stops restarting: first cause and the history of attempts."""
    first = failures[0]
    history = "\n".join(f"  attempt {i + 1}: {f.splitlines()[0]}" for i, f in enumerate(failures))
    restarts = len(failures) - 1
    err = JobExecutionError(
        f"job {job_id} failed after {restarts} restart(s) ({reason}).\n"
        f"first cause: {first}\nhistory:\n{history}",
        cause=first,
        history=failures,
        restarts=restarts,
    )
    if failure.error is not None:
        err.__cause__ = failure.error
    return err


def runner_lost(
    job_id: str,
    failures: list[str],
    lost: BaseException,
    latest: CompletedCheckpoint | None,
    job_dir: str | None,
) -> JobExecutionError:
    """No attempt can run any more (Spark is gone): keep the checkpoints, say how to resume."""
    if latest is not None and job_dir is not None:
        command = shlex.join(["epochstream", "run", "--restore-from", job_dir, *sys.argv])
        advice = (
            f"its checkpoints are kept (latest: {latest.directory}); resume from the latest "
            f"with:\n  {command}"
        )
    else:
        advice = "no checkpoint was completed, so run the job again from the start"
    ended = f" (the attempt ended with: {failures[-1].splitlines()[0]})" if failures else ""
    history = [*failures, str(lost)]
    return JobExecutionError(
        f"job {job_id} cannot continue: {lost}{ended}; {advice}",
        cause=history[0],
        history=history,
        restarts=max(len(failures) - 1, 0),
    )
