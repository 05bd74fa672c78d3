"""A task: one subtask of one operator chain, run by one thread as a mailbox loop.

Everything that touches operator state happens on the task thread, one item at a
time: input batches, in-band events (barriers, end-of-input) and mail from the
job master (checkpoint triggers for sources, completion and abort notifications,
finish and cancel). So operator state needs no locks. The synchronous part of a
snapshot runs here; writing keyed state to storage (checkpoint storage, or the
savepoint directory a savepoint barrier names) runs on the slot's snapshot thread,
which then acknowledges to the job master.

Example::

    task = Task(env, graph, chain, deployment)
    task.writers[edge_id] = RecordWriter(...)
    threading.Thread(target=task.run).start()
"""

from __future__ import annotations

import logging
import os
import pickle
import threading
import time
import traceback
from dataclasses import dataclass, field, replace
from typing import Any

from pyarrow import RecordBatch

from epochstream.core.clock import SystemClock, wall_ms
from epochstream.core.events import (
    END_OF_INPUT,
    CheckpointBarrier,
    CheckpointOptions,
    EndOfInput,
    Watermark,
    WatermarkStatus,
)
from epochstream.core.serializers import pickle_dumps
from epochstream.core.storage_faults import is_unavailable
from epochstream.exceptions import CorruptStateError, StorageUnavailableError
from epochstream.graph.jobgraph import ChainSpec, JobGraph
from epochstream.runtime.barriers import (
    AbortAlignment,
    BarrierHandler,
    ChannelStateComplete,
    EndOfAllInputs,
    TriggerSnapshot,
)
from epochstream.runtime.batches import RowBatch
from epochstream.runtime.chain import wire_chain
from epochstream.runtime.channel_replay import ChannelReplay
from epochstream.runtime.channels import MAIL, Cancelled, InputGate
from epochstream.runtime.messages import (
    AcknowledgeCheckpoint,
    AddSplits,
    CancelSlot,
    DeclineCheckpoint,
    FinishSlot,
    NotifyCheckpointAborted,
    NotifyCheckpointComplete,
    RequestSplit,
    SourceExhausted,
    TaskCheckpointStats,
    TaskDeployment,
    TaskFailed,
    TaskFinished,
    TaskKey,
    TriggerCheckpoint,
)
from epochstream.runtime.metrics import TaskMetrics
from epochstream.runtime.operators import (
    Operator,
    OperatorContext,
    SnapshotParts,
    create_operator,
)
from epochstream.runtime.operators.connectors import SinkOperator, SourceOperator
from epochstream.runtime.operators.twoinput import TwoInputOperator
from epochstream.runtime.outputs import RecordWriter
from epochstream.runtime.overtaking_gate import OvertakingInputGate
from epochstream.runtime.taskenv import TaskEnvironment
from epochstream.runtime.watermarks import WatermarkValve
from epochstream.state.backends.base import KeyedBackendContext, SnapshotTarget
from epochstream.state.channel_state import INPUT, OUTPUT, ChannelFrames, write_channel_state
from epochstream.state.handles import OperatorSubtaskState
from epochstream.state.keygroups import key_group_range_for_operator
from epochstream.state.operator import OperatorStateStore

__all__ = ["Task", "TaskEnvironment"]

log = logging.getLogger(__name__)


class _Stop(Exception):
    """Leaves the mailbox loop (finish or cancel)."""


#: Seconds a task whose outputs are full waits for mail, an overtaking barrier or a
#: wake-up from an output with room before it looks at its outputs again anyway (a
#: safety net: the outputs wake it; unaligned checkpoints: it never blocks in a send).
OUTPUT_POLL = 0.02
#: Seconds between looks at an aligned barrier still queued in an output (aligned
#: timeout): its snapshot is handed on once it left.
HELD_POLL = 0.01


@dataclass
class _SnapshotInFlight:
    """The synchronous part of one task snapshot, waiting for its asynchronous write
    (and, unaligned, for its input channel state to be complete)."""

    checkpoint_id: int
    options: CheckpointOptions
    parts: dict[str, SnapshotParts]
    alignment_s: float
    sync_s: float
    unaligned: bool
    #: Channel state: the output frames its barrier overtook, then (when recorded) inputs.
    channels: list[ChannelFrames] = field(default_factory=list)


#: Seconds a failed task with a sink waits for the job master's CancelSlot before it
#: closes its operators: the cancel says which pre-committed transactions to abort.
CANCEL_WAIT = 5.0


class AttemptCancel:
    """The job master's cancel of this attempt, as the slot relays it to a task.

    Example::

        notice = AttemptCancel()
        notice.cancelled(abandon_above=4)       # the slot, on CancelSlot(..., 4)
        notice.wait(5.0); notice.abandon_above   # True, 4
    """

    def __init__(self) -> None:
        self._event = threading.Event()
        #: No checkpoint above this id completed or will (None: not known).
        self.abandon_above: int | None = None

    def cancelled(self, abandon_above: int | None) -> None:
        self.abandon_above = abandon_above
        self._event.set()

    def wait(self, timeout: float) -> bool:
        return self._event.wait(timeout)


class Task:
    """One subtask of one chain."""

    def __init__(
        self, env: TaskEnvironment, graph: JobGraph, chain: ChainSpec, deployment: TaskDeployment
    ) -> None:
        self.env = env
        self.graph = graph
        self.chain = chain
        self.deployment = deployment
        self.subtask = deployment.subtask
        self.key: TaskKey = (chain.chain_id, deployment.subtask)
        self.name = f"{chain.name} ({deployment.subtask + 1}/{graph.parallelism})"
        p = graph.parallelism
        channels = len(chain.inputs) * p
        self.gate = OvertakingInputGate(channels) if env.unaligned else InputGate(channels)
        self.barriers = BarrierHandler(
            num_channels=max(1, self.gate.num_channels),
            exactly_once=env.exactly_once,
            clock=SystemClock(),
        )
        self.gate.blocked = self.barriers.blocked
        self.metrics = TaskMetrics(
            self.key, [(spec.uid, spec.name) for spec in chain.operators], self.gate
        )
        self.valve = WatermarkValve(max(1, self.gate.num_channels))
        self._clock_ms = lambda: wall_ms(env.clock)
        self._timed: list[Operator] = []
        self._keys_usable: list[bool] = []
        self._two_inputs = False
        self.writers: dict[int, RecordWriter] = {}
        self.operators: list[Operator] = []
        self._barriers_seen: dict[int, CheckpointBarrier] = {}
        # Unaligned snapshots taken whose input channel state is still being recorded.
        self._recording: dict[int, _SnapshotInFlight] = {}
        # Aligned snapshots whose barrier (with an aligned timeout) is still queued in an
        # output: by checkpoint id, with the deadline at which the barrier overtakes.
        self._held: dict[int, tuple[_SnapshotInFlight, float]] = {}
        # Channel state is filed under edge keys (stable across restarts).
        self._input_keys = [graph.edge_key(edge) for edge in chain.inputs]
        self._edge_keys = {e.edge_id: graph.edge_key(e) for e in graph.outgoing(chain.chain_id)}
        self._finished = False
        # The stop-with-savepoint this source stopped reading for; its abort resumes reading.
        self._stopping_for: int | None = None
        self._exhausted_reported = False
        self._last_flush = time.monotonic()
        #: Set by the slot when the job master cancels the attempt.
        self.cancel = AttemptCancel()

    def channel_index(self, edge_id: int, upstream_subtask: int) -> int:
        """Input channel index of (edge, upstream subtask) in this task's gate."""
        for pos, edge in enumerate(self.chain.inputs):
            if edge.edge_id == edge_id:
                return pos * self.graph.parallelism + upstream_subtask
        raise KeyError(f"{self.name}: no input edge {edge_id}")

    # ------------------------------------------------------------------ setup

    def _build(self) -> None:
        g = self.graph
        ops: dict[str, Operator] = {}
        for spec in self.chain.operators:
            keyed = None
            if spec.key_selector is not None:
                keyed = self.env.state_backend.create(
                    KeyedBackendContext(
                        operator_uid=spec.uid,
                        subtask=self.subtask,
                        max_parallelism=g.max_parallelism,
                        key_group_range=key_group_range_for_operator(
                            g.max_parallelism, g.parallelism, self.subtask
                        ),
                        clock=self.env.clock,
                        local_dir=os.path.join(
                            self.env.local_dir, f"{_safe(spec.uid)}-{self.subtask}"
                        ),
                        storage_options=self.env.storage_options,
                    )
                )
            ctx = OperatorContext(
                subtask_index=self.subtask,
                parallelism=g.parallelism,
                max_parallelism=g.max_parallelism,
                attempt=self.env.attempt,
                job_id=self.env.job_id,
                task_name=f"{spec.name} ({self.subtask + 1}/{g.parallelism})",
                operator_state=OperatorStateStore(),
                keyed_backend=keyed,
                checkpointing=self.env.checkpointing,
                clock=self.env.clock,
                watermark_interval_ms=g.auto_watermark_interval,
            )
            ctx.console = self.env.console
            ctx.storage_options = self.env.storage_options
            ops[spec.uid] = create_operator(spec, ctx)
        self.operators = wire_chain(self.chain, ops, self.writers, self.metrics.operators)
        restored = self.deployment.restored_checkpoint
        for op in self.operators:
            try:
                op.initialize_state(self.deployment.restore.get(op.uid), restored)
            except CorruptStateError as err:
                # Tell the job master which checkpoint is unusable: it falls back.
                raise CorruptStateError(
                    f"{self.name}: restoring checkpoint {restored} of operator {op.uid}: {err}",
                    path=err.path,
                    checkpoint_id=restored,
                ) from err
            except StorageUnavailableError as err:
                # Not corrupt: the job master waits for the storage and restores this
                # same checkpoint again (no fallback, no restart attempt used).
                raise StorageUnavailableError(
                    f"{self.name}: restoring checkpoint {restored} of operator {op.uid}: {err}",
                    path=err.path,
                ) from err
            op.open()
        head = self.operators[0]
        if isinstance(head, SourceOperator):
            head.assign_splits(self.deployment.splits)
        # Operators that act as processing time passes (timers, idleness, watermarks).
        self._timed = [op for op in self.operators if _follows_clock(op)]
        # Per input edge: its batches' keys are the head's keys (same selector), so the
        # head takes them as they came instead of computing them again.
        self._keys_usable = [
            edge.partitioning.kind == "hash"
            and edge.partitioning.key_selector is self.chain.head.key_selector
            for edge in self.chain.inputs
        ]
        self._two_inputs = isinstance(self.operators[0], TwoInputOperator)
        if self.deployment.channel_state:
            self._replay_channel_state()

    def _replay_channel_state(self) -> None:
        """Send the restored output frames again and process the restored input frames,
        before any new record (unaligned checkpoints)."""
        g = self.graph
        restored = self.deployment.restored_checkpoint
        try:
            ChannelReplay(
                self.env.fs,
                {self._edge_keys[edge_id]: w for edge_id, w in self.writers.items()},
                self._process_input,
                key_groups=key_group_range_for_operator(
                    g.max_parallelism, g.parallelism, self.subtask
                ),
                max_parallelism=g.max_parallelism,
                input_positions={key: i for i, key in enumerate(self._input_keys)},
            ).run(self.deployment.channel_state)
        except CorruptStateError as err:
            # As for operator state: the job master falls back to an older checkpoint.
            raise CorruptStateError(
                f"{self.name}: restoring the channel state of checkpoint {restored}: {err}",
                path=err.path,
                checkpoint_id=restored,
            ) from err
        except StorageUnavailableError as err:
            raise StorageUnavailableError(
                f"{self.name}: restoring the channel state of checkpoint {restored}: {err}",
                path=err.path,
            ) from err
        self._flush()

    def _process_input(self, position: int, item: Any) -> None:
        """Process one batch (rows or columns) taken from input ``position`` (an edge of
        the chain), or replayed from restored channel state. Two-input operators learn
        which input it came from; a keyed head takes the keys a hash edge shipped."""
        head = self.operators[0]
        two_inputs = self._two_inputs
        if type(item) is RecordBatch:
            self.metrics.head.records_in += item.num_rows
            if two_inputs:
                head.process_input(position, item, None)  # type: ignore[attr-defined]
            else:
                head.process_batch(item, None)
            return
        self.metrics.head.records_in += len(item.records)
        if two_inputs:
            head.process_input(position, item.records, item.timestamps)  # type: ignore[attr-defined]
        elif item.keys is not None and self._keys_usable[position]:
            head.process_keyed(item.records, item.keys, item.timestamps)
        else:
            head.process_batch(item.records, item.timestamps)

    # ------------------------------------------------------------------ main loop

    def run(self) -> None:
        """Thread target: build, restore, loop; report a failure to the job master."""
        try:
            self._build()
            if self.chain.is_source:
                self._run_source()
            else:
                self._run_stream()
        except (_Stop, Cancelled):
            log.debug("%s: stopped", self.name)
        except BaseException as exc:  # reported to the job master, which fails over
            if self.gate.cancelled:
                log.debug("%s: error after cancellation: %r", self.name, exc)
            else:
                log.error("%s failed: %r", self.name, exc)
                self._report_failure(exc)
                self.gate.cancel()
                self._await_cancel()
        finally:
            # Upstream tasks blocked on this task's full input (backpressure) must not
            # wait forever for a task that stopped reading: they get Cancelled.
            self.gate.cancel()
            self._close()

    def _report_failure(self, exc: BaseException) -> None:
        try:
            pickle.dumps(exc)
            error: BaseException | None = exc
        except Exception:  # not picklable: send its description only
            error = None
        try:
            self._send_failure(exc, error)
        except OSError as send_error:  # the job master is gone: it failed over already
            log.warning("%s: cannot report the failure (%r): %r", self.name, exc, send_error)

    def _send_failure(self, exc: BaseException, error: BaseException | None) -> None:
        self.env.send(
            TaskFailed(
                task=self.key,
                description=f"{self.name}: {type(exc).__name__}: {exc}",
                traceback="".join(traceback.format_exception(exc)),
                error=error,
                suppress_restarts=bool(getattr(exc, "suppress_restarts", False)),
                secondary=isinstance(exc, ConnectionError),
            )
        )

    def _await_cancel(self) -> None:
        """A failed task's sinks close after the job master's cancel, which says which
        of their pre-committed transactions no checkpoint will ever commit."""
        if any(isinstance(op, SinkOperator) for op in self.operators):
            if not self.cancel.wait(CANCEL_WAIT):
                log.warning(
                    "%s: no cancel from the job master within %.0f s; closing",
                    self.name,
                    CANCEL_WAIT,
                )

    def _close(self) -> None:
        abandon_above = self.cancel.abandon_above
        for op in self.operators:
            try:
                if abandon_above is not None and isinstance(op, SinkOperator):
                    op.abandon_checkpoints_above(abandon_above)
                op.close()
            except Exception as exc:  # one operator's close must not skip the others'
                log.warning("%s: closing %s failed: %r", self.name, op.uid, exc)

    def _run_stream(self) -> None:
        gate = self.gate
        head = self.operators[0]
        valve = self.valve
        p = self.graph.parallelism
        timeout = self.graph.buffer_timeout
        counters = self.metrics.head
        process = self._process_input
        take = self._take_overtaking if isinstance(gate, OvertakingInputGate) else gate.take
        while True:
            got = take(timeout)
            if self._timed:
                timeout = self._tick()
            if got is None:
                self._flush()
                continue
            ch, item = got
            kind = type(item)
            if kind is RowBatch or kind is RecordBatch:
                process(ch // p, item)
                self._maybe_flush()
            elif ch == MAIL:
                self._on_mail(item)
            elif kind is Watermark or kind is WatermarkStatus:
                if kind is Watermark:
                    mark, idle = valve.on_watermark(ch, item.timestamp)
                else:
                    mark, idle = valve.on_status(ch, item.idle)
                if idle is False:
                    head.process_status(False)  # active again before time moves on
                if mark is not None:
                    counters.watermark = mark
                    head.process_watermark(mark)
                if idle:
                    head.process_status(True)
            elif kind is CheckpointBarrier:
                self._barriers_seen.setdefault(item.checkpoint_id, item)
                self._execute(
                    self.barriers.on_barrier(ch, item.checkpoint_id, overtakes=item.overtakes)
                )
            elif kind is EndOfInput:
                mark = valve.on_end(ch)
                if mark is not None:
                    counters.watermark = mark
                    head.process_watermark(mark)
                self._execute(self.barriers.on_end_of_input(ch))
            else:
                raise TypeError(
                    f"{self.name}: unexpected item {type(item).__name__} on channel {ch}"
                )

    def _run_source(self) -> None:
        gate = self.gate
        src = self.operators[0]
        assert isinstance(src, SourceOperator)
        batch = self.graph.batch_size
        idle_wait: float | None = 0.0
        pressure = self.metrics.backpressure
        pressured = False
        while True:
            if self._held:
                wait = self._release_held()
                if wait is not None:
                    idle_wait = wait if idle_wait is None else min(idle_wait, wait)
            if pressured and isinstance(gate, OvertakingInputGate):
                # Woken by an output with room (or mail), not only by the timeout.
                pressure.begin()
                got = gate.take(idle_wait, data=False)
                pressure.end()
                pressured = False
            else:
                got = gate.take(idle_wait)
            # Not while the input has just run out: the final watermark follows at once,
            # and a tick before it would declare the subtask idle (no splits left); an
            # idle input lets a downstream stage pass ahead of results still on their way.
            if self._timed and not (src.exhausted and not self._exhausted_reported):
                self._tick()
            if got is not None:
                self._on_mail(got[1])
                idle_wait = 0.0  # the mail may have changed what to do (e.g. resume reading)
                continue
            if self._finished or self._stopping_for is not None:
                idle_wait = None
                continue
            if self.env.unaligned and not self._outputs_available():
                idle_wait = OUTPUT_POLL  # back-pressured: only mail until an output frees
                pressured = True
                continue
            if src.poll(batch):
                idle_wait = 0.0
                self._maybe_flush()
                continue
            self._flush()
            if src.exhausted:
                idle_wait = None
                if not self._exhausted_reported:
                    self._exhausted_reported = True
                    # Event time ends with the input, before the final checkpoint: what
                    # windows emit for it is part of that checkpoint.
                    src.end_of_input()
                    self._flush()
                    self.env.send(SourceExhausted(self.key))
                    if not self.env.checkpointing:
                        self._end_of_input()
                continue
            if src.should_request_split():
                self.env.send(RequestSplit(*self.key))
            nxt = src.next_available()
            wait = self.graph.buffer_timeout if nxt is None else nxt - time.monotonic()
            idle_wait = min(max(wait, 0.0005), 0.1)

    def _outputs_available(self) -> bool:
        return all(writer.available() for writer in self.writers.values())

    def _take_overtaking(self, timeout: float) -> tuple[int, Any] | None:
        """``gate.take`` for a job with unaligned checkpoints: aligned barriers whose
        timeout passed turn unaligned, and input is read only while the outputs have
        room (mail and overtaking barriers always)."""
        gate = self.gate
        assert isinstance(gate, OvertakingInputGate)
        if self._held:
            wait = self._release_held()
            if wait is not None:
                timeout = min(timeout, max(wait, 0.0005))
        deadline = gate.next_deadline()
        if deadline is not None:
            now = time.time()
            if deadline <= now:
                for checkpoint_id in gate.due(now):
                    gate.promote(checkpoint_id)
                    self._execute(self.barriers.on_alignment_timeout(checkpoint_id))
                deadline = gate.next_deadline()
            if deadline is not None:
                timeout = min(timeout, max(deadline - now, 0.0005))
        if self._outputs_available():
            return gate.take(timeout)
        pressure = self.metrics.backpressure
        until = time.monotonic() + timeout
        pressure.begin()
        try:
            # Mail and overtaking barriers only, until an output wakes the task with room
            # (or the timeout passes: then the caller flushes and ticks as usual).
            while True:
                remaining = until - time.monotonic()
                if remaining <= 0:
                    return None
                got = gate.take(min(remaining, OUTPUT_POLL), data=False)
                if got is not None:
                    return got
                if self._outputs_available():
                    break
        finally:
            pressure.end()
        return gate.take(max(until - time.monotonic(), 0.0))

    def _tick(self) -> float:
        """Let operators act on processing time; how long the task may wait for input."""
        now = self._clock_ms()
        wait = self.graph.buffer_timeout
        for op in self._timed:
            op.on_processing_time(now)
            deadline = op.next_processing_time()
            if deadline is not None:
                wait = min(wait, max(deadline - now, 0) / 1000)
        return wait

    def _maybe_flush(self) -> None:
        now = time.monotonic()
        if now - self._last_flush >= self.graph.buffer_timeout:
            self._flush()

    def _flush(self) -> None:
        self._last_flush = time.monotonic()
        for writer in self.writers.values():
            writer.flush()

    # ------------------------------------------------------------------ mail and events

    def _on_mail(self, mail: Any) -> None:
        if isinstance(mail, TriggerCheckpoint):
            if self._finished:
                self.env.send(
                    DeclineCheckpoint(mail.checkpoint_id, self.key, "task already finished")
                )
                return
            barrier = CheckpointBarrier(mail.checkpoint_id, mail.timestamp, mail.options)
            head = self.operators[0]
            if isinstance(head, SourceOperator) and self.subtask == 0:
                head.enumerator_state = mail.enumerators.get(self.chain.chain_id)
            self._checkpoint(barrier, alignment_s=0.0)
            if mail.final:
                self._end_of_input()
            elif mail.options.terminate:
                self._stopping_for = mail.checkpoint_id
        elif isinstance(mail, AddSplits):
            head = self.operators[0]
            assert isinstance(head, SourceOperator)
            head.add_splits(mail.splits)
        elif isinstance(mail, NotifyCheckpointComplete):
            for op in self.operators:
                op.notify_checkpoint_complete(mail.checkpoint_id)
        elif isinstance(mail, NotifyCheckpointAborted):
            self._held.pop(mail.checkpoint_id, None)
            if self._stopping_for == mail.checkpoint_id:
                log.warning("%s: stop-with-savepoint failed; reading on", self.name)
                self._stopping_for = None
            if not self.chain.is_source:
                self._execute(self.barriers.on_abort(mail.checkpoint_id))
            for op in self.operators:
                op.notify_checkpoint_aborted(mail.checkpoint_id)
        elif isinstance(mail, FinishSlot):
            if not self._finished and not mail.stopped:
                log.warning("%s: asked to finish before its input ended", self.name)
            raise _Stop()
        elif isinstance(mail, CancelSlot):
            raise _Stop()
        else:
            raise TypeError(f"{self.name}: unexpected mail {type(mail).__name__}")

    def _execute(self, actions: list[Any]) -> None:
        for action in actions:
            if isinstance(action, TriggerSnapshot):
                n = action.checkpoint_id
                barrier = self._barriers_seen.pop(n, None) or CheckpointBarrier(n, time.time())
                self._checkpoint(
                    barrier, alignment_s=action.alignment_s, unaligned=action.unaligned
                )
                for old in [c for c in self._barriers_seen if c < n]:
                    del self._barriers_seen[old]
            elif isinstance(action, ChannelStateComplete):
                self._channel_state_complete(action.checkpoint_id)
            elif isinstance(action, AbortAlignment):
                n = action.checkpoint_id
                self._barriers_seen.pop(n, None)
                if isinstance(self.gate, OvertakingInputGate):
                    self.gate.drop_capture(n)
                if self._recording.pop(n, None) is not None:
                    # Its snapshot was taken: the coordinator waits for an answer.
                    self.env.send(DeclineCheckpoint(n, self.key, action.reason))
                log.info("%s: checkpoint %d alignment dropped: %s", self.name, n, action.reason)
            elif isinstance(action, EndOfAllInputs):
                self._end_of_input()
            else:
                raise TypeError(f"{self.name}: unknown barrier action {action!r}")

    def _end_of_input(self) -> None:
        for op in self.operators:
            op.end_input()
        for writer in self.writers.values():
            writer.broadcast_event(END_OF_INPUT)
        self._finished = True
        self.env.send(TaskFinished(self.key))

    # ------------------------------------------------------------------ checkpoints

    def _target(self, uid: str, checkpoint_id: int, options: CheckpointOptions) -> SnapshotTarget:
        name = f"{_safe(uid)}-{self.subtask}"
        if options.savepoint_dir is not None:
            fs = self.env.fs(options.savepoint_dir)
            return SnapshotTarget(
                fs=fs,
                checkpoint_id=checkpoint_id,
                directory=options.savepoint_dir,
                shared_dir=None,
                name=name,
                savepoint=True,
                base_checkpoint_id=options.base_checkpoint_id,
            )
        job_dir = self.env.checkpoint_dir
        assert job_dir is not None
        fs = self.env.fs(job_dir)
        return SnapshotTarget(
            fs=fs,
            checkpoint_id=checkpoint_id,
            directory=fs.join(job_dir, f"chk-{checkpoint_id}"),
            shared_dir=fs.join(job_dir, "shared"),
            name=name,
            base_checkpoint_id=options.base_checkpoint_id,
        )

    def _checkpoint(
        self, barrier: CheckpointBarrier, *, alignment_s: float, unaligned: bool = False
    ) -> None:
        """Synchronous part: snapshot every operator, then forward the barrier.

        ``unaligned``: the snapshot did not wait for every input's barrier; the input
        gate records the in-flight records until they come (:class:`ChannelStateComplete`).
        """
        start = time.perf_counter()
        n = barrier.checkpoint_id
        gate = self.gate
        try:
            for op in self.operators:  # head first: what one emits reaches the next
                op.prepare_snapshot_pre_barrier(n)
            self._flush()
            parts = {
                op.uid: op.snapshot(self._target(op.uid, n, barrier.options))
                for op in self.operators
            }
        except Exception as exc:
            log.error("%s: snapshot %d failed: %r", self.name, n, exc)
            self.env.send(DeclineCheckpoint(n, self.key, f"snapshot failed: {exc!r}"))
            raise
        if unaligned:
            assert isinstance(gate, OvertakingInputGate)
            gate.start_capture(n)
        elif isinstance(gate, OvertakingInputGate):
            gate.settle(n)
        deadline = barrier.alignment_deadline
        if deadline is not None and (unaligned or deadline <= time.time()):
            barrier = barrier.unaligned_now()  # late already: overtake downstream too
        snapshot = _SnapshotInFlight(
            n, barrier.options, parts, alignment_s, 0.0, unaligned or barrier.overtakes
        )
        for edge_id, writer in self.writers.items():
            for channel, frames in writer.broadcast_barrier(barrier).items():
                snapshot.channels.append(
                    ChannelFrames(OUTPUT, self._edge_keys[edge_id], channel, frames)
                )
        snapshot.sync_s = time.perf_counter() - start
        if unaligned:
            self._recording[n] = snapshot
        elif deadline is not None and any(w.barrier_pending(n) for w in self.writers.values()):
            # Its barrier waits behind output: what it may yet overtake belongs to it.
            self._held[n] = (snapshot, deadline)
        else:
            self._submit(snapshot)

    def _submit(self, snapshot: _SnapshotInFlight) -> None:
        self.env.snapshots.submit(lambda: self._complete_snapshot(snapshot))

    def _release_held(self) -> float | None:
        """Hand on the held snapshots whose barriers left their output queues, and let
        the barriers overtake whose aligned timeout passed; returns the seconds until
        the next look is due (``None``: nothing held)."""
        now = time.time()
        due: float | None = None
        for n, (snapshot, deadline) in list(self._held.items()):
            writers = self.writers
            if deadline <= now:
                for edge_id, writer in writers.items():
                    for channel, frames in writer.promote_barrier(n).items():
                        snapshot.channels.append(
                            ChannelFrames(OUTPUT, self._edge_keys[edge_id], channel, frames)
                        )
                snapshot.unaligned = snapshot.unaligned or bool(snapshot.channels)
            elif any(w.barrier_pending(n) for w in writers.values()):
                # Sent in line soon, or overtaking at the deadline: look again shortly.
                wait = min(deadline - now, HELD_POLL)
                due = wait if due is None else min(due, wait)
                continue
            del self._held[n]
            self._submit(snapshot)
        return due

    def _channel_state_complete(self, checkpoint_id: int) -> None:
        """Every input delivered the barrier of unaligned ``checkpoint_id``: its
        recorded input channel state joins the snapshot, which is written now."""
        gate = self.gate
        assert isinstance(gate, OvertakingInputGate)
        capture = gate.finish_capture(checkpoint_id)
        snapshot = self._recording.pop(checkpoint_id)
        p = self.graph.parallelism
        for channel, frames in enumerate(capture.frames):
            if frames:
                key = self._input_keys[channel // p]
                snapshot.channels.append(ChannelFrames(INPUT, key, channel % p, frames))
        self._submit(snapshot)

    def _complete_snapshot(self, snapshot: _SnapshotInFlight) -> None:
        """Asynchronous part (snapshot thread): write keyed and channel state, then
        acknowledge."""
        start = time.perf_counter()
        checkpoint_id = snapshot.checkpoint_id
        try:
            states: dict[str, OperatorSubtaskState] = {}
            size = written = 0
            for uid, part in snapshot.parts.items():
                handle = part.keyed.run() if part.keyed is not None else None
                if handle is not None:
                    size += handle.size
                if part.keyed is not None:
                    written += part.keyed.bytes_written
                state = OperatorSubtaskState(
                    keyed=handle, operator_lists=part.operator_lists, union_lists=part.union_lists
                )
                if part.operator_lists or part.union_lists:
                    inline = len(pickle_dumps((part.operator_lists, part.union_lists)))
                    size += inline
                    written += inline
                if not state.is_empty:
                    states[uid] = state
            channel_bytes = self._write_channel_state(snapshot, states)
            stats = TaskCheckpointStats(
                alignment_s=snapshot.alignment_s,
                sync_s=snapshot.sync_s,
                async_s=time.perf_counter() - start,
                state_size=size + channel_bytes,
                bytes_written=written + channel_bytes,
                unaligned=snapshot.unaligned,
                channel_state_bytes=channel_bytes,
            )
        except Exception as exc:  # reported as a decline: the coordinator aborts the checkpoint
            if self.gate.cancelled:
                # The task was cancelled (failover): its scratch files are being removed
                # and nobody waits for this snapshot any more.
                log.debug("%s: snapshot %d abandoned: %r", self.name, checkpoint_id, exc)
                return
            log.error("%s: writing snapshot %d failed: %r", self.name, checkpoint_id, exc)
            self._tell_master(
                DeclineCheckpoint(
                    checkpoint_id,
                    self.key,
                    f"async snapshot failed: {exc!r}",
                    storage_unavailable=is_unavailable(exc),
                )
            )
            return
        self.metrics.last_checkpoint = stats
        self._tell_master(AcknowledgeCheckpoint(checkpoint_id, self.key, states, stats))

    def _write_channel_state(
        self, snapshot: _SnapshotInFlight, states: dict[str, OperatorSubtaskState]
    ) -> int:
        """Write ``snapshot``'s channel state next to its keyed state and file its handle
        with the head operator's state; returns its size in bytes."""
        if not snapshot.channels:
            return 0
        head = self.chain.head.uid
        target = self._target(head, snapshot.checkpoint_id, snapshot.options)
        path = target.fs.join(target.directory, f"channels-{target.name}")
        handle = write_channel_state(target.fs, path, snapshot.channels)
        if handle is None:
            return 0
        states[head] = replace(states.get(head, OperatorSubtaskState()), channel=handle)
        return handle.size

    def _tell_master(self, msg: Any) -> None:
        """Send from the snapshot thread; a job master that went away (failover) is not
        an error of this task."""
        try:
            self.env.send(msg)
        except OSError as exc:
            log.warning("%s: cannot send %s: %r", self.name, type(msg).__name__, exc)


def _safe(uid: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in uid)


def _follows_clock(op: Operator) -> bool:
    """True for operators that act on processing time (they override the hook)."""
    return type(op).on_processing_time is not Operator.on_processing_time or op.timers is not None
