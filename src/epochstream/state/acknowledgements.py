"""A task's answer to a checkpoint barrier, sent to the checkpoint coordinator: its
state handles (:class:`AcknowledgeCheckpoint`) or why it cannot take part
(:class:`DeclineCheckpoint`).

Here, beside the handles an acknowledgement carries, because the state layer is the
lowest one both the runtime (which sends these) and ``checkpoint/`` (which receives
them) may import. :mod:`epochstream.runtime.messages` lists them with the rest of the
control protocol.

Example::

    AcknowledgeCheckpoint(checkpoint_id=7, task=("sum", 0), states={"sum": subtask_state},
                          stats=TaskCheckpointStats(sync_s=0.01, state_size=120))
"""

from __future__ import annotations

from dataclasses import dataclass

from epochstream.core.checkpoint_stats import TaskCheckpointStats, TaskKey
from epochstream.state.handles import OperatorSubtaskState

__all__ = ["AcknowledgeCheckpoint", "DeclineCheckpoint"]


@dataclass(frozen=True)
class AcknowledgeCheckpoint:
    """A task finished its snapshot for ``checkpoint_id``; ``states`` by operator uid."""

    checkpoint_id: int
    task: TaskKey
    states: dict[str, OperatorSubtaskState]
    stats: TaskCheckpointStats


@dataclass(frozen=True)
class DeclineCheckpoint:
    """A task cannot take part in ``checkpoint_id`` (subsumed, failed snapshot...);
    ``storage_unavailable`` when its snapshot could not be written because checkpoint
    storage could not be reached."""

    checkpoint_id: int
    task: TaskKey
    reason: str
    storage_unavailable: bool = False
