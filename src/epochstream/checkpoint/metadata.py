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
from dataclasses import dataclass
from typing import Any

import cloudpickle

from epochstream.core.checkpoint_stats import KIND_CHECKPOINT, CheckpointStats, MetadataReader
from epochstream.core.filesystems import storage_fs
from epochstream.exceptions import CheckpointError
from epochstream.state.channel_state import ChannelStateHandle
from epochstream.state.handles import (
    OperatorSubtaskState,
    Relativize,
    Resolve,
    handle_from_json,
)

__all__ = ["METADATA_VERSION", "CheckpointMetadata"]

METADATA_VERSION = 2
_FORMAT = "epochstream-checkpoint"


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
        r = MetadataReader(source)
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
    doc: dict[str, Any] = {
        "keyed": None if state.keyed is None else state.keyed.to_json(relativize),
        "operator_lists": _encode_lists(state.operator_lists, where),
        "union_lists": _encode_lists(state.union_lists, where),
    }
    if state.channel is not None:
        doc["channel"] = state.channel.to_json(relativize)
    return doc


def _decode_subtask(
    r: MetadataReader, doc: object, where: str, resolve: Resolve
) -> OperatorSubtaskState:
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
    channel_doc = doc.get("channel")
    channel = None
    if channel_doc is not None:
        channel = ChannelStateHandle.from_json(channel_doc, resolve, f"{r.source}: {where}.channel")
    return OperatorSubtaskState(
        keyed=keyed,
        operator_lists=_decode_lists(r, doc, "operator_lists", where),
        union_lists=_decode_lists(r, doc, "union_lists", where),
        channel=channel,
    )


def _decode_lists(
    r: MetadataReader, doc: dict[str, Any], key: str, where: str
) -> dict[str, list[object]]:
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
