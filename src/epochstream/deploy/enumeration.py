"""The job master's side of every source: enumerators, split assignment, their state.

One :class:`SourceEnumerators` lives per attempt. It builds each source's
:class:`~epochstream.connectors.enumerators.SplitEnumerator` from the restored
checkpoint's enumerator state (or fresh) and assigns splits in one of two ways:

- A source whose enumerator discovers nothing (every bounded source) gets its initial
  splits round-robin at deployment, as before. Its splits are all known up front, so
  a subtask is exhausted exactly when its reader is: nothing is pending in the job
  master and nothing will be discovered. A bounded source whose enumerator discovers
  is refused (its subtasks could end before a discovered split reached them).
- A source whose enumerator discovers (a monitored directory) is by default assigned
  *on demand*: its initial and discovered splits wait here as *pending*, and each
  :class:`RequestSplit` of a subtask whose reader ran out of splits gets the next
  pending split (:class:`AddSplits` to that subtask). A request with nothing pending
  is remembered and served when discovery finds something. A fast subtask asks more
  often and so reads more splits than a slow one: the load balances.
- A discovering enumerator with ``assign_on_demand = False`` (splits read forever,
  like Kafka partitions) gets its initial splits round-robin at deployment and its
  discovered splits pushed round-robin as :class:`AddSplits` when found; nothing waits.

:meth:`SourceEnumerators.snapshot` travels with each checkpoint trigger; source subtask 0
stores it as union-list state ``enumerator`` of the source operator, so it lands in the
checkpoint next to the readers' split positions. It holds each enumerator's state and
its pending splits, not the outstanding requests: a restored reader without a split
asks again. Consistency: the snapshot is taken in the event-loop step that sends the
trigger, so a split sent before the trigger reaches its reader before the trigger does
(one ordered connection per slot) and is in the reader's positions, while a split sent
after the trigger is in the snapshot as pending. No split is read twice or skipped.

Example::

    enums = SourceEnumerators(graph, restored)
    deployments = task_deployments(graph, restored, enums.initial_assignment())
    for msg in enums.discover(clock.now()) + enums.request(chain_id, subtask=1):
        slots[msg.subtask].send(msg)
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from epochstream.checkpoint.pending import CompletedCheckpoint
from epochstream.connectors.enumerators import SplitEnumerator
from epochstream.exceptions import ConfigurationError
from epochstream.graph.jobgraph import JobGraph
from epochstream.runtime.messages import AddSplits
from epochstream.runtime.operators.connectors import ENUMERATOR

__all__ = ["EnumeratorCheckpoint", "SourceEnumerators", "restored_enumerator_state"]


@dataclass(frozen=True)
class EnumeratorCheckpoint:
    """What a checkpoint holds of one source's enumeration: the enumerator's own state
    and the splits it discovered that no reader had asked for yet.

    Example: ``EnumeratorCheckpoint(state=["/in/a.txt"], pending=(split_b,))``
    """

    state: Any
    pending: tuple[Any, ...] = ()


def restored_enumerator_state(restored: CompletedCheckpoint | None, source_uid: str) -> Any:
    """The enumerator state checkpoint ``restored`` holds for ``source_uid`` (else None):
    an :class:`EnumeratorCheckpoint`, or a bare enumerator state (checkpoints taken before
    splits were assigned on demand).

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
    """Every source's enumerator for one attempt, with pending splits and requests.

    Example::

        enums = SourceEnumerators(graph, restored=None)
        per_subtask = enums.initial_assignment()[chain_id]
        enums.request(chain_id, 0)   # [AddSplits(chain_id, 0, [split])] if one is pending
    """

    def __init__(self, graph: JobGraph, restored: CompletedCheckpoint | None) -> None:
        self._parallelism = graph.parallelism
        self._enumerators: dict[str, SplitEnumerator] = {}
        #: Sources assigned on demand, with their splits no reader asked for yet.
        self._pending: dict[str, deque[Any]] = {}
        #: Subtasks that asked for a split and got none yet, in request order.
        self._waiting: dict[str, list[int]] = {}
        #: Sources whose discovered splits are pushed: the subtask the next one goes to.
        self._next_subtask: dict[str, int] = {}
        self._restored_heads: set[str] = set()
        for chain in graph.chains:
            if not chain.is_source:
                continue
            uid = chain.head.uid
            stored = restored_enumerator_state(restored, uid)
            if isinstance(stored, EnumeratorCheckpoint):
                state, pending = stored.state, stored.pending
            else:
                state, pending = stored, ()
            enumerator = chain.head.payload.create_enumerator(graph.parallelism, state)
            self._enumerators[chain.chain_id] = enumerator
            if enumerator.next_discovery() is not None:
                if chain.head.payload.bounded:
                    raise ConfigurationError(
                        f"source {chain.head.name!r} ({uid}) is bounded but its enumerator "
                        f"{type(enumerator).__qualname__} discovers splits: a bounded source "
                        "ends when its readers are exhausted and would miss later splits"
                    )
                if enumerator.assign_on_demand:
                    self._pending[chain.chain_id] = deque(pending)
                    self._waiting[chain.chain_id] = []
                else:
                    self._next_subtask[chain.chain_id] = 0
            if restored is not None and uid in restored.metadata.operators:
                self._restored_heads.add(chain.chain_id)

    def initial_assignment(self) -> dict[str, list[list[Any]]]:
        """Per source chain that restores no positions, each subtask's initial splits:
        round-robin for sources assigned at deployment; none (they become pending) for
        sources assigned on demand."""
        p = self._parallelism
        out: dict[str, list[list[Any]]] = {}
        for chain_id, enumerator in self._enumerators.items():
            if chain_id in self._restored_heads:
                continue
            per_subtask: list[list[Any]] = [[] for _ in range(p)]
            splits = enumerator.initial_splits()
            if chain_id in self._pending:
                self._pending[chain_id].extend(splits)
            else:
                for k, split in enumerate(splits):
                    per_subtask[k % p].append(split)
                if chain_id in self._next_subtask:
                    self._next_subtask[chain_id] = len(splits) % p
            out[chain_id] = per_subtask
        return out

    def next_discovery(self) -> float | None:
        """The earliest clock time some enumerator wants :meth:`discover` called."""
        due = [d for e in self._enumerators.values() if (d := e.next_discovery()) is not None]
        return min(due) if due else None

    def discover(self, now: float) -> list[AddSplits]:
        """Let every due enumerator discover; new splits become pending and serve the
        requests waiting for them, or are pushed round-robin (the messages to send)."""
        out: list[AddSplits] = []
        for chain_id, enumerator in self._enumerators.items():
            due = enumerator.next_discovery()
            if due is None or due > now:
                continue
            found = enumerator.discover(now)
            if chain_id in self._pending:
                self._pending[chain_id].extend(found)
                out += self._serve(chain_id)
            else:
                out += self._push(chain_id, found)
        return out

    def _push(self, chain_id: str, splits: list[Any]) -> list[AddSplits]:
        per_subtask: dict[int, list[Any]] = {}
        nxt = self._next_subtask[chain_id]
        for split in splits:
            per_subtask.setdefault(nxt, []).append(split)
            nxt = (nxt + 1) % self._parallelism
        self._next_subtask[chain_id] = nxt
        return [AddSplits(chain_id, i, group) for i, group in sorted(per_subtask.items())]

    def request(self, chain_id: str, subtask: int) -> list[AddSplits]:
        """Subtask ``subtask`` of source ``chain_id`` has no split left: the next pending
        split for it, or nothing now and the split discovery finds for it later."""
        waiting = self._waiting.get(chain_id)
        if waiting is None:
            if chain_id not in self._enumerators:
                raise ValueError(
                    f"split request of subtask {subtask} for unknown source {chain_id!r}"
                )
            return []  # splits of this source are not assigned on request
        if subtask not in waiting:
            waiting.append(subtask)
        return self._serve(chain_id)

    def _serve(self, chain_id: str) -> list[AddSplits]:
        pending, waiting = self._pending[chain_id], self._waiting[chain_id]
        out: list[AddSplits] = []
        while pending and waiting:
            out.append(AddSplits(chain_id, waiting.pop(0), [pending.popleft()]))
        return out

    def snapshot(self) -> dict[str, Any]:
        """By source chain id: on-demand sources' :class:`EnumeratorCheckpoint`, other
        enumerators' state (None states are left out)."""
        out: dict[str, Any] = {}
        for chain_id, enumerator in self._enumerators.items():
            state = enumerator.snapshot()
            if chain_id in self._pending:
                out[chain_id] = EnumeratorCheckpoint(state, tuple(self._pending[chain_id]))
            elif state is not None:
                out[chain_id] = state
        return out
