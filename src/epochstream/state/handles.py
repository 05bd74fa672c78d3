"""What a snapshot leaves behind, and what a restoring subtask is handed.

A task's asynchronous snapshot writes keyed state to a file inside the checkpoint
directory and describes it with a :class:`KeyedStateHandle` (where each key group's
bytes are). Operator (non-keyed) list state is small and travels inline, inside the
acknowledgement and the checkpoint's ``_metadata``, as Flink does for small state.

On restore the job master turns the metadata into one :class:`OperatorRestore` per
operator and subtask: the keyed handles whose key groups intersect the subtask's new
key-group range, and the operator list state redistributed to the new parallelism.

Example::

    h = KeyedStateHandle(path="op-sum-0.kst", key_groups={3: (0, 120)}, size=120)
    h.resolve("/ckpt/job/chk-4").path == "/ckpt/job/chk-4/op-sum-0.kst"
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

__all__ = ["KeyedStateHandle", "OperatorRestore", "OperatorSubtaskState"]


@dataclass(frozen=True)
class KeyedStateHandle:
    """A keyed-state file and the byte range of each key group inside it.

    ``path`` is relative to the checkpoint directory holding ``_metadata`` until the
    job master resolves it to an absolute path for a restoring task.
    """

    path: str
    key_groups: dict[int, tuple[int, int]]
    size: int

    def resolve(self, checkpoint_dir: str) -> KeyedStateHandle:
        """Return a copy whose ``path`` is absolute, resolved against ``checkpoint_dir``."""
        if os.path.isabs(self.path):
            return self
        return KeyedStateHandle(
            path=os.path.join(checkpoint_dir, self.path),
            key_groups=dict(self.key_groups),
            size=self.size,
        )

    def restricted_to(self, key_groups: range) -> KeyedStateHandle | None:
        """The same file limited to ``key_groups``; ``None`` when nothing overlaps."""
        kept = {kg: span for kg, span in self.key_groups.items() if kg in key_groups}
        if not kept:
            return None
        return KeyedStateHandle(path=self.path, key_groups=kept, size=self.size)


@dataclass
class OperatorSubtaskState:
    """One operator's state in one subtask's snapshot (what a task acks per operator).

    ``operator_lists`` are split round-robin on rescale; ``union_lists`` are given
    whole to every subtask on restore (Flink's union list state).
    """

    keyed: KeyedStateHandle | None = None
    operator_lists: dict[str, list[object]] = field(default_factory=dict)
    union_lists: dict[str, list[object]] = field(default_factory=dict)

    @property
    def is_empty(self) -> bool:
        return self.keyed is None and not self.operator_lists and not self.union_lists


@dataclass
class OperatorRestore:
    """What one restoring subtask of one operator receives."""

    keyed: list[KeyedStateHandle] = field(default_factory=list)
    operator_lists: dict[str, list[object]] = field(default_factory=dict)
    union_lists: dict[str, list[object]] = field(default_factory=dict)
