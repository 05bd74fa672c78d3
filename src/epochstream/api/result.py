"""What a finished job returns.

Example::

    result = env.execute("wordcount")
    print(result.job_id, result.restarts, [c.checkpoint_id for c in result.checkpoints])
"""

from __future__ import annotations

from dataclasses import dataclass, field

from epochstream.core.checkpoint_stats import CheckpointStats

__all__ = ["JobResult"]


@dataclass(frozen=True)
class JobResult:
    """Outcome of ``Environment.execute``.

    ``checkpoints`` holds the statistics of every checkpoint completed during the
    run (id, trigger time, duration, state size, per-task alignment, synchronous and
    asynchronous durations); ``failures`` the description of each failure that led
    to a restart.

    Example: ``result = env.execute("job"); print(result.restarts, len(result.checkpoints))``
    """

    job_id: str
    restarts: int
    checkpoints: list[CheckpointStats] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    duration: float = 0.0
    restored_from: str | None = None
