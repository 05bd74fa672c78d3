"""How the job master describes a failed attempt.

Example::

    failure = Failure.of_task(msg)          # a task's exception with its traceback
    failure = Failure.lost_slot(conn, err)  # a slot's control connection closed
"""

from __future__ import annotations

from dataclasses import dataclass

from epochstream.deploy.control import SlotConnection
from epochstream.exceptions import CorruptStateError
from epochstream.runtime.messages import TaskFailed

__all__ = ["Failure"]


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
