"""How the job master describes a failed attempt, and a job that cannot go on.

Example::

    failure = Failure.of_task(msg)          # a task's exception with its traceback
    failure = Failure.lost_slot(conn, err)  # a slot's control connection closed
    raise give_up(job_id, failures, failure, "fixed_delay: 3 of 3 restarts used")
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass

from epochstream.checkpoint.pending import CompletedCheckpoint
from epochstream.deploy.control import SlotConnection
from epochstream.exceptions import CorruptStateError, JobExecutionError
from epochstream.runtime.messages import TaskFailed

__all__ = ["Failure", "give_up", "runner_lost"]


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

    @property
    def corrupt_checkpoint(self) -> CorruptStateError | None:
        """The restore error, when the attempt failed restoring a corrupt checkpoint."""
        error = self.error
        if isinstance(error, CorruptStateError) and error.checkpoint_id is not None:
            return error
        return None


def give_up(
    job_id: str, failures: list[str], failure: Failure, reason: str
) -> JobExecutionError:
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
