"""Control-plane messages between the job master and the slots.

Every message is a small frozen dataclass, pickled only after the connection has
passed the HMAC handshake (see :mod:`epochstream.runtime.auth`). A task is named by
``TaskKey = (chain_id, subtask_index)``.

Flow of one attempt::

    slot -> JM   RegisterSlot(index, attempt, pid)
    JM -> slot   DeploySlot(graph, per-task restore, splits)
    slot -> JM   SlotReady(data-plane address)
    JM -> slot   ConnectPeers(addresses)          once every slot is ready
    slot -> JM   SlotRunning
    JM -> slot   TriggerCheckpoint / NotifyCheckpointComplete / NotifyCheckpointAborted
    slot -> JM   RequestSplit                     a source reader ran out of splits
    JM -> slot   AddSplits                        a pending split for a request (or pushed)
    slot -> JM   AcknowledgeCheckpoint / DeclineCheckpoint / SourceExhausted / TaskFinished
    slot -> JM   SlotMetrics                      every metrics interval while running
    JM -> slot   FinishSlot  (after the final checkpoint committed)  or CancelSlot
    slot -> JM   SlotClosed

The messages of the checkpoint protocol that ``checkpoint/`` reads too are defined
below it and listed here with the rest: the acknowledgement and decline beside the
state handles they carry (:mod:`epochstream.state.acknowledgements`), task keys and
checkpoint statistics on the ground floor (:mod:`epochstream.core.checkpoint_stats`).

Example::

    TriggerCheckpoint(checkpoint_id=7, timestamp=1700000000.0, final=False)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from epochstream.core.checkpoint_stats import TaskCheckpointStats, TaskKey
from epochstream.core.events import CheckpointOptions
from epochstream.runtime.metrics import TaskMetricsSample
from epochstream.state.acknowledgements import AcknowledgeCheckpoint, DeclineCheckpoint
from epochstream.state.channel_state import ChannelRestore
from epochstream.state.handles import OperatorRestore

__all__ = [
    "AcknowledgeCheckpoint",
    "AddSplits",
    "CancelSlot",
    "ConnectPeers",
    "ConsoleOutput",
    "DeclineCheckpoint",
    "DeploySlot",
    "FinishSlot",
    "Heartbeat",
    "NotifyCheckpointAborted",
    "NotifyCheckpointComplete",
    "RegisterSlot",
    "RequestSplit",
    "SlotClosed",
    "SlotMetrics",
    "SlotReady",
    "SlotRunning",
    "SourceExhausted",
    "TaskCheckpointStats",
    "TaskDeployment",
    "TaskFailed",
    "TaskFinished",
    "TaskKey",
    "TriggerCheckpoint",
]


# ---------------------------------------------------------------- slot -> job master


@dataclass(frozen=True)
class RegisterSlot:
    """First message of a slot: who it is and which deployment attempt it belongs to."""

    slot: int
    attempt: int
    pid: int
    host: str


@dataclass(frozen=True)
class SlotReady:
    """The slot built its tasks and listens for data-plane connections at host:port."""

    slot: int
    host: str
    port: int


@dataclass(frozen=True)
class SlotRunning:
    """All outgoing data-plane channels are connected; tasks are running."""

    slot: int


@dataclass(frozen=True)
class SourceExhausted:
    """A bounded source subtask read all its splits (it waits for the final barrier)."""

    task: TaskKey


@dataclass(frozen=True)
class RequestSplit:
    """Subtask ``subtask`` of source chain ``chain_id`` has no unfinished split: it asks
    the job master for one (sent once each time its reader runs out, and again after a
    restore; the job master answers with AddSplits when a split is pending).

    Example: ``RequestSplit("files-1a2b", subtask=1)``
    """

    chain_id: str
    subtask: int


@dataclass(frozen=True)
class TaskFinished:
    """A task saw end-of-input on every input and flushed; it waits for FinishSlot."""

    task: TaskKey


@dataclass(frozen=True)
class TaskFailed:
    """A task raised. ``error`` is the exception if it pickles, else ``None``.

    ``secondary`` marks a symptom of another failure (a data channel broken because
    the peer died): the job master prefers a primary cause reported shortly after.
    """

    task: TaskKey
    description: str
    traceback: str
    error: BaseException | None = None
    suppress_restarts: bool = False
    secondary: bool = False


@dataclass(frozen=True)
class SlotClosed:
    """The slot closed every operator and is about to return."""

    slot: int


@dataclass(frozen=True)
class ConsoleOutput:
    """Lines a print sink wrote in a slot; the job master writes them to the driver's stdout."""

    text: str


@dataclass(frozen=True)
class SlotMetrics:
    """One sample of every task of a slot (sent every metrics interval).

    Example: ``SlotMetrics(slot=0, samples=[sampler.sample(now=t, wall_ms=ms)])``
    """

    slot: int
    samples: list[TaskMetricsSample]


@dataclass(frozen=True)
class Heartbeat:
    """Sent every heartbeat interval by each slot."""

    slot: int


# ---------------------------------------------------------------- job master -> slot


@dataclass(frozen=True)
class TaskDeployment:
    """One task of a slot: its chain, restore state per operator uid, source splits."""

    chain_id: str
    subtask: int
    restore: dict[str, OperatorRestore] = field(default_factory=dict)
    splits: list[object] | None = None
    restored_checkpoint: int | None = None
    #: In-flight records of an unaligned checkpoint: outputs to send again and inputs
    #: to process again, before anything new.
    channel_state: list[ChannelRestore] = field(default_factory=list)


@dataclass(frozen=True)
class DeploySlot:
    """The job graph (cloudpickled) and the tasks this slot runs."""

    job_id: str
    attempt: int
    graph_bytes: bytes
    tasks: list[TaskDeployment]
    sys_path: list[str]
    checkpoint_dir: str | None
    checkpointing: bool
    exactly_once: bool
    #: Unaligned checkpoints: overtaking gates and queued, credited output channels.
    unaligned: bool = False
    #: Endpoint and credentials of object-store checkpoint storage.
    storage_options: dict[str, Any] | None = None
    #: The keyed-state backend configuration (a picklable ``StateBackend``).
    state_backend: Any = None
    #: Seconds between SlotMetrics reports (0: none).
    metrics_interval: float = 1.0


@dataclass(frozen=True)
class ConnectPeers:
    """Data-plane addresses of every slot, by slot index."""

    addresses: dict[int, tuple[str, int]]


@dataclass(frozen=True)
class TriggerCheckpoint:
    """Sources snapshot and emit barrier ``checkpoint_id``; ``final`` ends the input after it.

    ``options`` travel with the barrier (savepoint target, base checkpoint, terminate).
    ``enumerators``: the split enumerators' states by source chain id, taken when the
    trigger was sent; subtask 0 of each source stores its chain's in the checkpoint.
    """

    checkpoint_id: int
    timestamp: float
    final: bool = False
    options: CheckpointOptions = field(default_factory=CheckpointOptions)
    enumerators: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class AddSplits:
    """Splits for subtask ``subtask`` of source chain ``chain_id``: the answer to its
    RequestSplit, or discovered splits pushed round-robin (``assign_on_demand = False``)."""

    chain_id: str
    subtask: int
    splits: list[Any]


@dataclass(frozen=True)
class NotifyCheckpointComplete:
    """``checkpoint_id`` is complete: two-phase-commit sinks commit up to it."""

    checkpoint_id: int


@dataclass(frozen=True)
class NotifyCheckpointAborted:
    """``checkpoint_id`` was aborted: stop aligning for it, drop its snapshot."""

    checkpoint_id: int
    reason: str


@dataclass(frozen=True)
class FinishSlot:
    """The job is done: close operators and return.

    ``stopped``: the job stopped with a savepoint before its input ended (no warning).
    """

    stopped: bool = False


@dataclass(frozen=True)
class CancelSlot:
    """Stop at once (failover or cancellation).

    ``abandon_above``: no checkpoint above this id completed or ever will (the job
    master stopped the attempt's checkpoints first), so sinks abort the transactions
    only those checkpoints hold; None when the sender does not know (leave them).
    """

    reason: str
    abandon_above: int | None = None
