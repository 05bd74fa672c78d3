"""Global committers: one commit per completed checkpoint, in the job master.

Sinks with a :class:`~epochstream.connectors.base.GlobalCommitter` (Delta tables) have
writers that only pre-commit: their snapshot entries (union-list state ``txns`` of the
sink operator) name the files they wrote. When a checkpoint completes, the job master
hands the union of a sink's entries in that checkpoint to its committer; when an
attempt restores a checkpoint, it hands them over again before the slots deploy, so a
commit the last attempt missed happens now (committers skip what they committed).

Example::

    commits = GlobalCommits(graph, job_id)
    commits.commit(7, completed.metadata)
"""

from __future__ import annotations

from typing import Any

from epochstream.checkpoint.metadata import CheckpointMetadata
from epochstream.connectors.base import GlobalCommitter
from epochstream.exceptions import SinkError
from epochstream.graph.jobgraph import JobGraph
from epochstream.runtime.operators.connectors import TXNS

__all__ = ["GlobalCommits"]


class GlobalCommits:
    """The global committers of a job's sinks, by sink operator uid.

    Example::

        commits = GlobalCommits(graph, job_id)
        if commits:
            commits.commit(n, completed.metadata)
    """

    def __init__(self, graph: JobGraph, job_id: str) -> None:
        self._committers: dict[str, GlobalCommitter] = {}
        for chain in graph.chains:
            for op in chain.operators:
                if op.kind != "sink":
                    continue
                committer = op.payload.create_committer(job_id)
                if committer is not None:
                    self._committers[op.uid] = committer

    def __bool__(self) -> bool:
        return bool(self._committers)

    def last_committed(self) -> int:
        """The newest checkpoint id any of the sinks committed (0: none): a job's
        checkpoint ids start above it, so its commits are never taken for replays.
        SinkError naming the sink that cannot tell."""
        last = 0
        for uid, committer in self._committers.items():
            try:
                last = max(last, committer.last_committed())
            except Exception as exc:
                raise SinkError(
                    f"global committer of sink {uid!r} cannot read its last commit: "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
        return last

    def commit(self, checkpoint_id: int, metadata: CheckpointMetadata) -> None:
        """Commit each sink's entries of checkpoint ``checkpoint_id``; SinkError naming the sink."""
        for uid, committer in self._committers.items():
            entries: list[Any] = [
                entry
                for state in metadata.operators.get(uid, {}).values()
                for entry in state.union_lists.get(TXNS, [])
            ]
            try:
                committer.commit(checkpoint_id, entries)
            except Exception as exc:
                raise SinkError(
                    f"global committer of sink {uid!r} failed to commit checkpoint "
                    f"{checkpoint_id} ({len(entries)} entries): {type(exc).__name__}: {exc}"
                ) from exc

    def close(self) -> None:
        """Close every committer."""
        for committer in self._committers.values():
            committer.close()
