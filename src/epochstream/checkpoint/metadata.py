"""The checkpoint metadata (``_metadata``) and its portable JSON encoding.

A completed checkpoint is described by one :class:`CheckpointMetadata`: which job and
checkpoint it is, the parallelism it was taken at, every operator's state per subtask
(keyed state as file handles, operator list state inline) and the statistics of the
checkpoint. File locations in handles are written relative to the directory holding
``_metadata`` (shared files of incremental checkpoints as ``../shared/...``), so a
savepoint directory can be moved or copied to another bucket and still restore. The
encoding is UTF-8 JSON so that a checkpoint can be inspected with any tool; operator
list state holds arbitrary Python objects, so each list is stored as base64 of a pickle
(protocol 5, written with cloudpickle so that classes defined in a job's ``__main__``
load in other processes too).

Example::

    md = CheckpointMetadata(job_id="j", checkpoint_id=3, kind="checkpoint",
                            trigger_time=1.0, completion_time=2.0, parallelism=2,
                            max_parallelism=128, operators={}, operator_parallelism={},
                            stats=CheckpointStats(checkpoint_id=3, trigger_time=1.0,
                                                  duration=1.0, state_size=0, tasks={}))
    CheckpointMetadata.from_json(md.to_json("/ck/j/chk-3"), base="/ck/j/chk-3") == md
"""

from __future__ import annotations

import base64
import binascii
import json
import pickle
from dataclasses import dataclass, field
from typing import Any, TypeVar

import cloudpickle

from epochstream.core.filesystems import storage_fs
from epochstream.exceptions import CheckpointError
from epochstream.runtime.messages import TaskCheckpointStats, TaskKey
from epochstream.state.handles import (
    OperatorSubtaskState,
    Relativize,
    Resolve,
    handle_from_json,
)

__all__ = [
    "KIND_CHECKPOINT",
    "KIND_SAVEPOINT",
    "METADATA_VERSION",
    "CheckpointMetadata",
    "CheckpointStats",
    "parse_task_key",
    "task_key_str",
]

METADATA_VERSION = 2
KIND_CHECKPOINT = "checkpoint"
KIND_SAVEPOINT = "savepoint"
_KINDS = (KIND_CHECKPOINT, KIND_SAVEPOINT)
_FORMAT = "epochstream-checkpoint"

_T = TypeVar("_T")


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
                }
                for key, t in self.tasks.items()
            },
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, source: str = "<dict>") -> CheckpointStats:
        """Rebuild stats written by :meth:`to_dict`; raises :class:`CheckpointError`."""
        r = _Reader(source)
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
            )
        return cls(
            checkpoint_id=r.integer(data, "checkpoint_id", "stats"),
            kind=r.kind(data, "stats"),
            trigger_time=r.number(data, "trigger_time", "stats"),
            duration=r.number(data, "duration", "stats"),
            state_size=r.integer(data, "state_size", "stats"),
            tasks=tasks,
        )


@dataclass(kw_only=True)
class CheckpointMetadata:
    """Everything needed to restore a job from one checkpoint or savepoint.

    ``operators[uid][subtask]`` is that operator subtask's state; keyed handle paths
    are relative to the checkpoint directory. ``operator_parallelism[uid]`` is the
    operator's parallelism when the checkpoint was taken.

    Example::

        data = md.to_json()
        CheckpointMetadata.from_json(data, source="/ck/job/chk-3/_metadata") == md
    """

    version: int = METADATA_VERSION
    job_id: str
    job_name: str = ""
    checkpoint_id: int
    kind: str = KIND_CHECKPOINT
    trigger_time: float
    completion_time: float
    parallelism: int
    max_parallelism: int
    operators: dict[str, dict[int, OperatorSubtaskState]]
    operator_parallelism: dict[str, int]
    stats: CheckpointStats

    @property
    def state_size(self) -> int:
        """Total state size in bytes, as reported by the tasks."""
        return self.stats.state_size

    def to_json(self, base: str) -> bytes:
        """Encode as UTF-8 JSON, paths relative to ``base`` (the ``_metadata`` directory).

        Raises :class:`CheckpointError` on unpicklable operator state.
        """
        fs = storage_fs(base)

        def relativize(path: str) -> str:
            return fs.relative(base, path)

        doc = {
            "format": _FORMAT,
            "version": self.version,
            "job_id": self.job_id,
            "job_name": self.job_name,
            "checkpoint_id": self.checkpoint_id,
            "kind": self.kind,
            "trigger_time": self.trigger_time,
            "completion_time": self.completion_time,
            "parallelism": self.parallelism,
            "max_parallelism": self.max_parallelism,
            "operator_parallelism": dict(self.operator_parallelism),
            "operators": {
                uid: {
                    str(subtask): _encode_subtask(
                        state, f"operators[{uid!r}][{subtask}]", relativize
                    )
                    for subtask, state in sorted(subtasks.items())
                }
                for uid, subtasks in self.operators.items()
            },
            "stats": self.stats.to_dict(),
        }
        try:
            return json.dumps(doc, indent=1, allow_nan=False).encode("utf-8")
        except ValueError as err:
            raise CheckpointError(
                f"checkpoint {self.checkpoint_id} of job {self.job_id!r}: metadata is not "
                f"encodable as JSON: {err}"
            ) from err

    @classmethod
    def from_json(
        cls, data: bytes, *, base: str, source: str = "<bytes>", options: Any = None
    ) -> CheckpointMetadata:
        """Decode :meth:`to_json` output, resolving paths against ``base``.

        Malformed input raises :class:`CheckpointError` naming ``source`` and the field.
        """
        fs = storage_fs(base, options)

        def resolve(path: str) -> str:
            return fs.join(base, path)

        try:
            doc = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise CheckpointError(f"{source}: not valid checkpoint metadata JSON: {err}") from err
        r = _Reader(source)
        r.check(isinstance(doc, dict), "top level", "an object")
        r.check(doc.get("format") == _FORMAT, "format", repr(_FORMAT))
        version = r.integer(doc, "version", "top level")
        if version != METADATA_VERSION:
            raise CheckpointError(
                f"{source}: unsupported metadata version {version} "
                f"(this epochstream reads version {METADATA_VERSION})"
            )
        operators: dict[str, dict[int, OperatorSubtaskState]] = {}
        for uid, subtasks in r.get(doc, "operators", dict, "top level").items():
            where = f"operators[{uid!r}]"
            r.check(isinstance(subtasks, dict), where, "an object")
            decoded: dict[int, OperatorSubtaskState] = {}
            for subtask_text, state in subtasks.items():
                subtask = r.index(subtask_text, f"{where} subtask key {subtask_text!r}")
                decoded[subtask] = _decode_subtask(r, state, f"{where}[{subtask}]", resolve)
            operators[uid] = decoded
        op_par_in = r.get(doc, "operator_parallelism", dict, "top level")
        operator_parallelism = {
            uid: r.integer(op_par_in, uid, "operator_parallelism") for uid in op_par_in
        }
        return cls(
            version=version,
            job_id=r.get(doc, "job_id", str, "top level"),
            job_name=str(doc.get("job_name") or ""),
            checkpoint_id=r.integer(doc, "checkpoint_id", "top level"),
            kind=r.kind(doc, "top level"),
            trigger_time=r.number(doc, "trigger_time", "top level"),
            completion_time=r.number(doc, "completion_time", "top level"),
            parallelism=r.integer(doc, "parallelism", "top level"),
            max_parallelism=r.integer(doc, "max_parallelism", "top level"),
            operators=operators,
            operator_parallelism=operator_parallelism,
            stats=CheckpointStats.from_dict(r.get(doc, "stats", dict, "top level"), source=source),
        )


# ---------------------------------------------------------------- encoding helpers


def _encode_lists(lists: dict[str, list[object]], where: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, values in lists.items():
        try:
            blob = cloudpickle.dumps(values, protocol=5)
        except Exception as err:  # any pickling failure: name the state, keep the cause
            raise CheckpointError(
                f"{where} list state {name!r} cannot be pickled: {type(err).__name__}: {err}"
            ) from err
        out[name] = base64.b64encode(blob).decode("ascii")
    return out


def _encode_subtask(
    state: OperatorSubtaskState, where: str, relativize: Relativize
) -> dict[str, Any]:
    return {
        "keyed": None if state.keyed is None else state.keyed.to_json(relativize),
        "operator_lists": _encode_lists(state.operator_lists, where),
        "union_lists": _encode_lists(state.union_lists, where),
    }


def _decode_subtask(r: _Reader, doc: object, where: str, resolve: Resolve) -> OperatorSubtaskState:
    r.check(isinstance(doc, dict), where, "an object")
    assert isinstance(doc, dict)
    keyed_doc = doc.get("keyed")
    keyed = None
    if keyed_doc is not None:
        try:
            keyed = handle_from_json(keyed_doc, resolve, f"{r.source}: {where}.keyed")
        except CheckpointError:
            raise
        except Exception as err:  # a malformed handle of any shape
            raise CheckpointError(f"{r.source}: {where}.keyed is malformed: {err!r}") from err
    return OperatorSubtaskState(
        keyed=keyed,
        operator_lists=_decode_lists(r, doc, "operator_lists", where),
        union_lists=_decode_lists(r, doc, "union_lists", where),
    )


def _decode_lists(r: _Reader, doc: dict[str, Any], key: str, where: str) -> dict[str, list[object]]:
    out: dict[str, list[object]] = {}
    for name, text in r.get(doc, key, dict, where).items():
        swhere = f"{where}.{key}[{name!r}]"
        r.check(isinstance(text, str), swhere, "a base64 string")
        try:
            values = pickle.loads(base64.b64decode(text, validate=True))
        except (binascii.Error, ValueError) as err:
            raise CheckpointError(f"{r.source}: {swhere} is not valid base64: {err}") from err
        except Exception as err:  # unpickling can raise anything a user class raises
            raise CheckpointError(
                f"{r.source}: {swhere} cannot be unpickled: {type(err).__name__}: {err}"
            ) from err
        r.check(isinstance(values, list), swhere, "a pickled list")
        out[name] = values
    return out


class _Reader:
    """Typed field access that turns every malformation into a CheckpointError."""

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

    def number(self, doc: dict[str, Any], key: str, where: str) -> float:
        value = self.get(doc, key, object, where)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(f"{where}.{key}", "a number", value)
        return value

    def kind(self, doc: dict[str, Any], where: str) -> str:
        value = self.get(doc, "kind", str, where)
        if value not in _KINDS:
            raise self.fail(f"{where}.kind", f"one of {_KINDS}", value)
        return value

    def index(self, text: str, where: str) -> int:
        # JSON object keys are strings; only canonical non-negative decimals round-trip.
        if not (text.isascii() and text.isdigit()) or (len(text) > 1 and text[0] == "0"):
            raise self.fail(where, "a non-negative decimal integer", text)
        return int(text)
