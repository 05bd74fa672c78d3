"""Statistics of checkpoints: what a task reports of its part, what a completed
checkpoint sums up, and the task keys both are filed under.

On the ground floor because a finished job's :class:`~epochstream.graph.launch.JobResult`
returns them to the API, the runtime measures them and the checkpoint layer stores them
in ``_metadata``; none of those layers may import another's. :class:`MetadataReader`
decodes them (and the rest of ``_metadata``) field by field.

Example::

    stats = CheckpointStats(checkpoint_id=1, trigger_time=0.0, duration=0.2, state_size=10,
                            tasks={task_key_str(("c", 0)): TaskCheckpointStats(state_size=10)})
    stats.largest_task == "c/0"
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeVar

from epochstream.exceptions import CheckpointError

__all__ = [
    "KINDS",
    "KIND_CHECKPOINT",
    "KIND_SAVEPOINT",
    "CheckpointStats",
    "MetadataReader",
    "TaskCheckpointStats",
    "TaskKey",
    "parse_task_key",
    "task_key_str",
]

#: A task: ``(chain_id, subtask_index)``.
TaskKey = tuple[str, int]

KIND_CHECKPOINT = "checkpoint"
KIND_SAVEPOINT = "savepoint"
KINDS = (KIND_CHECKPOINT, KIND_SAVEPOINT)

_T = TypeVar("_T")


@dataclass(frozen=True)
class TaskCheckpointStats:
    """Timings and size of one task's part of a checkpoint (seconds, bytes).

    Example: ``result.checkpoints[-1].tasks["counts/0"].alignment_s``
    """

    alignment_s: float = 0.0
    sync_s: float = 0.0
    async_s: float = 0.0
    state_size: int = 0
    #: Bytes this checkpoint wrote (an incremental one reuses earlier files).
    bytes_written: int = 0
    #: The task's snapshot did not wait for alignment (an unaligned checkpoint, or an
    #: aligned one whose aligned timeout passed).
    unaligned: bool = False
    #: Bytes of in-flight records the task kept (its channel state; unaligned only).
    channel_state_bytes: int = 0


def task_key_str(task: TaskKey) -> str:
    """The stats key of a task: ``"chain_id/subtask"``.

    Example::

        task_key_str(("src-map", 2)) == "src-map/2"
    """
    return f"{task[0]}/{task[1]}"


def parse_task_key(text: str) -> TaskKey:
    """Inverse of :func:`task_key_str`; the chain id may itself contain ``/``.

    Example::

        parse_task_key("src-map/2") == ("src-map", 2)
    """
    chain, sep, index = text.rpartition("/")
    if not sep or not chain or not index.isdigit():
        raise ValueError(f"task key {text!r} is not of the form 'chain_id/subtask'")
    return chain, int(index)


@dataclass(frozen=True, kw_only=True)
class CheckpointStats:
    """Statistics of one completed checkpoint.

    ``trigger_time`` is wall-clock epoch seconds, ``duration`` seconds from trigger to
    completion, ``state_size`` the sum of the tasks' state sizes in bytes; ``tasks`` is
    keyed by :func:`task_key_str`.

    Example::

        s = CheckpointStats(checkpoint_id=1, trigger_time=0.0, duration=0.2, state_size=10,
                            tasks={"c/0": TaskCheckpointStats(alignment_s=0.1, state_size=10)})
        s.max_alignment_s == 0.1
    """

    checkpoint_id: int
    trigger_time: float
    duration: float
    state_size: int
    tasks: dict[str, TaskCheckpointStats] = field(default_factory=dict)
    kind: str = KIND_CHECKPOINT

    @property
    def id(self) -> int:
        """Alias of ``checkpoint_id``."""
        return self.checkpoint_id

    @property
    def alignment_s(self) -> dict[str, float]:
        """Alignment time of each task ("chain/subtask" -> seconds)."""
        return {task: t.alignment_s for task, t in self.tasks.items()}

    @property
    def max_alignment_s(self) -> float:
        """Longest barrier alignment of any task (0.0 without tasks)."""
        return max((t.alignment_s for t in self.tasks.values()), default=0.0)

    @property
    def max_sync_s(self) -> float:
        """Longest synchronous snapshot part of any task."""
        return max((t.sync_s for t in self.tasks.values()), default=0.0)

    @property
    def max_async_s(self) -> float:
        """Longest asynchronous snapshot part of any task."""
        return max((t.async_s for t in self.tasks.values()), default=0.0)

    @property
    def unaligned(self) -> bool:
        """True when any task's snapshot went unaligned."""
        return any(t.unaligned for t in self.tasks.values())

    @property
    def channel_state_bytes(self) -> int:
        """Bytes of in-flight records kept by all tasks (0 for an aligned checkpoint)."""
        return sum(t.channel_state_bytes for t in self.tasks.values())

    @property
    def largest_task(self) -> str | None:
        """Key of the task with the largest state, ``None`` without tasks."""
        if not self.tasks:
            return None
        return max(self.tasks, key=lambda k: self.tasks[k].state_size)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (see :meth:`from_dict`)."""
        return {
            "checkpoint_id": self.checkpoint_id,
            "kind": self.kind,
            "trigger_time": self.trigger_time,
            "duration": self.duration,
            "state_size": self.state_size,
            "tasks": {
                key: {
                    "alignment_s": t.alignment_s,
                    "sync_s": t.sync_s,
                    "async_s": t.async_s,
                    "state_size": t.state_size,
                    "unaligned": t.unaligned,
                    "channel_state_bytes": t.channel_state_bytes,
                }
                for key, t in self.tasks.items()
            },
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, source: str = "<dict>") -> CheckpointStats:
        """Rebuild stats written by :meth:`to_dict`; raises :class:`CheckpointError`."""
        r = MetadataReader(source)
        tasks_in = r.get(data, "tasks", dict, "stats")
        tasks: dict[str, TaskCheckpointStats] = {}
        for key, t in tasks_in.items():
            where = f"stats.tasks[{key!r}]"
            r.check(isinstance(t, dict), where, "an object")
            tasks[key] = TaskCheckpointStats(
                alignment_s=r.number(t, "alignment_s", where),
                sync_s=r.number(t, "sync_s", where),
                async_s=r.number(t, "async_s", where),
                state_size=r.integer(t, "state_size", where),
                # Absent in metadata written before unaligned checkpoints existed.
                unaligned=r.flag(t, "unaligned", where) if "unaligned" in t else False,
                channel_state_bytes=r.integer(t, "channel_state_bytes", where)
                if "channel_state_bytes" in t
                else 0,
            )
        return cls(
            checkpoint_id=r.integer(data, "checkpoint_id", "stats"),
            kind=r.kind(data, "stats"),
            trigger_time=r.number(data, "trigger_time", "stats"),
            duration=r.number(data, "duration", "stats"),
            state_size=r.integer(data, "state_size", "stats"),
            tasks=tasks,
        )


class MetadataReader:
    """Typed field access to decoded ``_metadata`` JSON that turns every malformation
    into a CheckpointError naming ``source`` and the field.

    Example::

        r = MetadataReader("/ck/j/chk-3/_metadata")
        r.integer({"checkpoint_id": 3}, "checkpoint_id", "top level") == 3
    """

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, where: str, expected: str, got: object = None) -> CheckpointError:
        shown = "" if got is None else f", got {got!r}"
        return CheckpointError(
            f"{self.source}: malformed checkpoint metadata: {where} must be {expected}{shown}"
        )

    def check(self, ok: bool, where: str, expected: str) -> None:
        if not ok:
            raise self.fail(where, expected)

    def get(self, doc: dict[str, Any], key: str, kind: type[_T], where: str) -> _T:
        if key not in doc:
            raise CheckpointError(
                f"{self.source}: malformed checkpoint metadata: {where} lacks field {key!r}"
            )
        value = doc[key]
        if not isinstance(value, kind):
            raise self.fail(f"{where}.{key}", f"of type {kind.__name__}", value)
        return value

    def integer(self, doc: dict[str, Any], key: str, where: str) -> int:
        value = self.get(doc, key, int, where)
        if isinstance(value, bool):
            raise self.fail(f"{where}.{key}", "an integer", value)
        return value

    def flag(self, doc: dict[str, Any], key: str, where: str) -> bool:
        return self.get(doc, key, bool, where)

    def number(self, doc: dict[str, Any], key: str, where: str) -> float:
        value = self.get(doc, key, object, where)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(f"{where}.{key}", "a number", value)
        return value

    def kind(self, doc: dict[str, Any], where: str) -> str:
        value = self.get(doc, "kind", str, where)
        if value not in KINDS:
            raise self.fail(f"{where}.kind", f"one of {KINDS}", value)
        return value

    def index(self, text: str, where: str) -> int:
        # JSON object keys are strings; only canonical non-negative decimals round-trip.
        if not (text.isascii() and text.isdigit()) or (len(text) > 1 and text[0] == "0"):
            raise self.fail(where, "a non-negative decimal integer", text)
        return int(text)
