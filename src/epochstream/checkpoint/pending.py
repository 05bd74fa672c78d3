"""Checkpoints on their way to completion, and completed ones.

A :class:`PendingCheckpoint` is a small state machine (:class:`PendingState`): it waits
for every task's acknowledgement, then for its ``_metadata`` to be written; it ends
completed (a :class:`CompletedCheckpoint`) or aborted.

Example::

    pending = PendingCheckpoint(checkpoint_id=3, directory="/ck/j/chk-3", final=False,
                                options=CheckpointOptions(), trigger_now=0.0,
                                trigger_wall=1.7e9, awaiting={("src", 0)})
    pending.state is PendingState.AWAITING_ACKS
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from epochstream.checkpoint.metadata import CheckpointMetadata
from epochstream.core.checkpoint_stats import (
    KIND_CHECKPOINT,
    KIND_SAVEPOINT,
    CheckpointStats,
    TaskCheckpointStats,
    TaskKey,
    task_key_str,
)
from epochstream.core.clock import Clock
from epochstream.core.events import CheckpointOptions
from epochstream.exceptions import CheckpointError
from epochstream.state.acknowledgements import AcknowledgeCheckpoint
from epochstream.state.handles import OperatorSubtaskState

__all__ = ["CompletedCheckpoint", "PendingCheckpoint", "PendingState"]


@dataclass(frozen=True)
class CompletedCheckpoint:
    """A checkpoint (or savepoint) whose ``_metadata`` is written: restorable.

    ``owned``: it belongs to this job's own storage (a failover may keep building
    incremental snapshots on its files).

    Example::

        cp = coord.latest_completed
        restore_tasks(cp.directory, cp.metadata) if cp else start_fresh()
    """

    checkpoint_id: int
    directory: str
    metadata: CheckpointMetadata
    owned: bool = True


class PendingState(enum.Enum):
    """Where a pending checkpoint is; each state says what comes next."""

    AWAITING_ACKS = "waiting for every task's acknowledgement (or a decline / timeout)"
    PERSISTING = "writing _metadata off the event thread (then completed, or aborted)"


@dataclass
class PendingCheckpoint:
    """A triggered checkpoint on its way to completion."""

    checkpoint_id: int
    directory: str
    final: bool
    options: CheckpointOptions
    trigger_now: float  # monotonic, for duration and timeout
    trigger_wall: float  # epoch seconds, for metadata
    awaiting: set[TaskKey]
    acks: dict[TaskKey, AcknowledgeCheckpoint] = field(default_factory=dict)
    state: PendingState = PendingState.AWAITING_ACKS
    metadata: CheckpointMetadata | None = None

    @property
    def is_savepoint(self) -> bool:
        return self.options.is_savepoint

    def shared_files(self) -> set[str]:
        return {
            path
            for ack in self.acks.values()
            for s in ack.states.values()
            if s.keyed is not None
            for path in s.keyed.shared_files()
        }

    def build_metadata(
        self,
        *,
        job_id: str,
        job_name: str,
        parallelism: int,
        max_parallelism: int,
        operator_parallelism: dict[str, int],
        clock: Clock,
    ) -> CheckpointMetadata:
        """The ``_metadata`` of this checkpoint from its acknowledgements."""
        pending = self
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
        kind = KIND_SAVEPOINT if pending.is_savepoint else KIND_CHECKPOINT
        stats = CheckpointStats(
            checkpoint_id=pending.checkpoint_id,
            trigger_time=pending.trigger_wall,
            duration=clock.now() - pending.trigger_now,
            state_size=sum(t.state_size for t in tasks.values()),
            tasks=tasks,
            kind=kind,
        )
        return CheckpointMetadata(
            job_id=job_id,
            job_name=job_name,
            checkpoint_id=pending.checkpoint_id,
            kind=kind,
            trigger_time=pending.trigger_wall,
            completion_time=clock.wall(),
            parallelism=parallelism,
            max_parallelism=max_parallelism,
            operators=operators,
            operator_parallelism=dict(operator_parallelism),
            stats=stats,
        )
