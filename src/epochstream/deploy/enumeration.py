"""The job master's side of every source: enumerators, split assignment, their state.

One :class:`SourceEnumerators` lives per attempt. It builds each source's
:class:`~epochstream.connectors.enumerators.SplitEnumerator` from the restored
checkpoint's enumerator state (or fresh), hands out the initial splits of sources that
restore nothing, and turns what enumerators discover into :class:`AddSplits` messages,
round-robin over the subtasks. Its :meth:`SourceEnumerators.snapshot` travels with each
checkpoint trigger; source subtask 0 stores it as union-list state ``enumerator`` of the
source operator, so it lands in the checkpoint next to the readers' split positions.

Example::

    enums = SourceEnumerators(graph, restored, clock.now())
    deployments = task_deployments(graph, restored, enums.initial_assignment(restored))
    for msg in enums.discover(clock.now()):
        slots[msg.subtask].send(msg)
"""

from __future__ import annotations

from typing import Any

from epochstream.checkpoint.pending import CompletedCheckpoint
from epochstream.connectors.enumerators import SplitEnumerator
from epochstream.graph.jobgraph import JobGraph
from epochstream.runtime.messages import AddSplits
from epochstream.runtime.operators.connectors import ENUMERATOR

__all__ = ["SourceEnumerators", "restored_enumerator_state"]


def restored_enumerator_state(restored: CompletedCheckpoint | None, source_uid: str) -> Any:
    """The enumerator state checkpoint ``restored`` holds for ``source_uid`` (else None).

    Example: ``restored_enumerator_state(coordinator.latest_completed, "files")``
    """
    if restored is None:
        return None
    for state in restored.metadata.operators.get(source_uid, {}).values():
        entries = state.union_lists.get(ENUMERATOR)
        if entries:
            return entries[0]
    return None


class SourceEnumerators:
    """Every source's enumerator for one attempt, with round-robin assignment.

    Example::

        enums = SourceEnumerators(graph, restored=None)
        per_subtask = enums.initial_assignment()[chain_id]
    """

    def __init__(self, graph: JobGraph, restored: CompletedCheckpoint | None) -> None:
        self._parallelism = graph.parallelism
        self._enumerators: dict[str, SplitEnumerator] = {}
        self._next_subtask: dict[str, int] = {}
        self._restored_heads: set[str] = set()
        for chain in graph.chains:
            if not chain.is_source:
                continue
            uid = chain.head.uid
            state = restored_enumerator_state(restored, uid)
            self._enumerators[chain.chain_id] = chain.head.payload.create_enumerator(
                graph.parallelism, state
            )
            self._next_subtask[chain.chain_id] = 0
            if restored is not None and uid in restored.metadata.operators:
                self._restored_heads.add(chain.chain_id)

    def initial_assignment(self) -> dict[str, list[list[Any]]]:
        """Per source chain that restores no positions, each subtask's initial splits."""
        p = self._parallelism
        out: dict[str, list[list[Any]]] = {}
        for chain_id, enumerator in self._enumerators.items():
            if chain_id in self._restored_heads:
                continue
            per_subtask: list[list[Any]] = [[] for _ in range(p)]
            splits = enumerator.initial_splits()
            for k, split in enumerate(splits):
                per_subtask[k % p].append(split)
            self._next_subtask[chain_id] = len(splits) % p
            out[chain_id] = per_subtask
        return out

    def next_discovery(self) -> float | None:
        """The earliest clock time some enumerator wants :meth:`discover` called."""
        due = [d for e in self._enumerators.values() if (d := e.next_discovery()) is not None]
        return min(due) if due else None

    def discover(self, now: float) -> list[AddSplits]:
        """New splits of every enumerator that is due, as messages to their subtasks."""
        out: list[AddSplits] = []
        p = self._parallelism
        for chain_id, enumerator in self._enumerators.items():
            due = enumerator.next_discovery()
            if due is None or due > now:
                continue
            per_subtask: dict[int, list[Any]] = {}
            nxt = self._next_subtask[chain_id]
            for split in enumerator.discover(now):
                per_subtask.setdefault(nxt, []).append(split)
                nxt = (nxt + 1) % p
            self._next_subtask[chain_id] = nxt
            out += [AddSplits(chain_id, i, splits) for i, splits in sorted(per_subtask.items())]
        return out

    def snapshot(self) -> dict[str, Any]:
        """Each enumerator's state by source chain id (None states are left out)."""
        states = {cid: e.snapshot() for cid, e in self._enumerators.items()}
        return {cid: s for cid, s in states.items() if s is not None}
