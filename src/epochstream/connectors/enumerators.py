"""Split enumerators: the job master's half of a source (docs/connectors.md, Interfaces).

A :class:`SplitEnumerator` runs in the job master, one per source. It produces the
initial splits and, for an unbounded source, *discovers* new ones while the job runs
(new files in a monitored directory; for a Kafka connector, new partitions of a topic).
The job master assigns what it discovers to the source's subtasks, by default *on
demand*: a split waits as pending until a subtask whose reader ran out of splits asks
for one (see :mod:`epochstream.deploy.enumeration`). An enumerator whose splits never
finish (Kafka partitions) sets ``assign_on_demand = False``: its discovered splits are
pushed round-robin as they are found. The job master snapshots the enumerator's state
(and the pending splits) at every checkpoint trigger, in the same event-loop step that
sends the trigger: a split sent before the trigger reaches its reader before the
trigger does (one ordered connection per slot), so the enumerator's state and the
readers' positions in one checkpoint agree; no split is read twice or skipped after a
restore.

A restore hands every split back: readers get the split positions the checkpoint holds
(redistributed round-robin at a new parallelism), the enumerator its checkpointed state,
so splits a failed reader held are read on from their checkpointed positions.

Example::

    enum = source.create_enumerator(parallelism=2, restored=None)
    first = enum.initial_splits()          # assigned at deployment
    later = enum.discover(clock.now())     # [] until something new appears
    state = enum.snapshot()                # stored with the checkpoint
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

__all__ = ["SplitEnumerator", "StaticSplitEnumerator"]


class SplitEnumerator(ABC):
    """Creates and discovers the splits of one source; lives in the job master.

    Example::

        class PartitionEnumerator(SplitEnumerator):   # a Kafka-style enumerator
            def initial_splits(self): return [PartitionSplit(p, 0) for p in self.list()]
            def discover(self, now): return [PartitionSplit(p, 0) for p in self.new_ones()]
            def next_discovery(self): return self.due
            def snapshot(self): return sorted(self.known)
            assign_on_demand = False   # a partition never finishes: push it

    ``assign_on_demand`` matters only for an enumerator that discovers splits: True (the
    default) hands each split to the next subtask that asks for one, so splits that end
    (files) balance over fast and slow subtasks; False pushes discovered splits to the
    subtasks round-robin, for splits that are read forever (a reader holding one would
    never ask again).
    """

    assign_on_demand: bool = True

    @abstractmethod
    def initial_splits(self) -> list[Any]:
        """The splits that exist when the job starts fresh (nothing to restore)."""

    @abstractmethod
    def discover(self, now: float) -> list[Any]:
        """Splits that appeared since the last call (``now``: the job master's clock)."""

    @abstractmethod
    def next_discovery(self) -> float | None:
        """The clock time :meth:`discover` is due next; None: it never finds anything."""

    @abstractmethod
    def snapshot(self) -> Any:
        """Picklable state from which ``create_enumerator(restored=...)`` carries on."""


class StaticSplitEnumerator(SplitEnumerator):
    """The enumerator of a source whose splits are all known up front.

    ``make_splits`` runs only when a fresh start needs the initial splits (a restore
    takes every position from the checkpoint, even if the input is gone by now).

    Example::

        StaticSplitEnumerator(lambda: source.create_splits(4)).discover(0.0)   # []
    """

    def __init__(self, make_splits: Callable[[], list[Any]]) -> None:
        self._make_splits = make_splits

    def initial_splits(self) -> list[Any]:
        return list(self._make_splits())

    def discover(self, now: float) -> list[Any]:
        """Nothing appears later: every split was known at the start."""
        return []

    def next_discovery(self) -> float | None:
        return None

    def snapshot(self) -> Any:
        """No state: a restore takes every position from the readers' split states."""
        return None
