"""A slot: one long-running process-side container hosting subtask ``i`` of every chain.

``run_slot`` is the same code under every runner: a Spark barrier task calls it
with the address Spark gave the task, the local runner calls it in a subprocess.
It connects to the job master, registers, receives its deployment, opens its data
plane, wires channels to its peers, runs one thread per task, and relays control
messages (checkpoint triggers and notifications, finish, cancel) to the tasks'
mailboxes until the job master says finish or cancel, or disappears.

Example::

    run_slot(SlotLaunch(job_id="j", attempt=1, master=("127.0.0.1", 4000),
                        secret=secret, heartbeat_interval=1.0), index=0, host="127.0.0.1")
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any

import cloudpickle

from epochstream.core.clock import wall_ms
from epochstream.exceptions import SerializationError, TaskFailure
from epochstream.graph.jobgraph import JobGraph
from epochstream.runtime.auth import FramedConnection, connect
from epochstream.runtime.collector import slot_collector
from epochstream.runtime.messages import (
    AddSplits,
    CancelSlot,
    ConnectPeers,
    ConsoleOutput,
    DeploySlot,
    FinishSlot,
    Heartbeat,
    NotifyCheckpointAborted,
    NotifyCheckpointComplete,
    RegisterSlot,
    SlotClosed,
    SlotMetrics,
    SlotReady,
    SlotRunning,
    TaskFailed,
    TriggerCheckpoint,
)
from epochstream.runtime.metrics import TaskSampler
from epochstream.runtime.network import ChannelHello, DataPlaneServer, open_channel
from epochstream.runtime.outputs import Channel, LocalChannel, NetworkChannel, RecordWriter
from epochstream.runtime.overtaking_channels import CreditedNetworkChannel, OvertakingLocalChannel
from epochstream.runtime.overtaking_gate import OvertakingInputGate
from epochstream.runtime.slotlogs import ForwardLogs
from epochstream.runtime.snapshots import SnapshotExecutor
from epochstream.runtime.task import Task, TaskEnvironment

__all__ = ["SlotLaunch", "run_slot"]

log = logging.getLogger(__name__)
_JOIN_TIMEOUT = 10.0


@dataclass(frozen=True)
class SlotLaunch:
    """What a slot needs to find its job master (shipped inside the Spark closure)."""

    job_id: str
    attempt: int
    master: tuple[str, int]
    secret: bytes
    heartbeat_interval: float = 1.0
    #: Records at or above this level go to the driver's log (``SlotLog``).
    log_level: int = logging.WARNING


class _Slot:
    def __init__(self, launch: SlotLaunch, index: int, host: str) -> None:
        self.launch = launch
        self.index = index
        self.host = host
        self.control: FramedConnection = connect(launch.master, launch.secret, plane="control")
        self.tasks: list[Task] = []
        self.threads: list[threading.Thread] = []
        self.snapshots = SnapshotExecutor(name=f"slot{index}-snapshots")
        self.data: DataPlaneServer | None = None
        self._stop = threading.Event()
        self._metrics_stop = threading.Event()
        self._samplers: list[TaskSampler] = []
        # Scratch space of this slot's keyed-state backends (RocksDB databases).
        self.local_dir = tempfile.mkdtemp(prefix=f"epochstream-{launch.job_id[:8]}-slot{index}-")

    def send(self, msg: Any) -> None:
        self.control.send(msg)

    # ------------------------------------------------------------------ setup

    def deploy(self) -> bool:
        self.send(RegisterSlot(self.index, self.launch.attempt, os.getpid(), self.host))
        try:
            msg = self.control.recv()
            if isinstance(msg, CancelSlot):
                log.warning("slot %d: job master refused registration: %s", self.index, msg.reason)
                return False
            if not isinstance(msg, DeploySlot):
                raise TypeError(f"slot {self.index}: expected DeploySlot, got {type(msg).__name__}")
            for path in reversed(msg.sys_path):
                if path not in sys.path and os.path.isdir(path):
                    sys.path.insert(0, path)
            graph: JobGraph = self._load_graph(msg.graph_bytes)
        except SerializationError as exc:
            # The same bytes would fail on every restart: the master fails the job.
            self._report_deploy_failure(exc)
            return False
        env = TaskEnvironment(
            job_id=msg.job_id,
            attempt=msg.attempt,
            checkpoint_dir=msg.checkpoint_dir,
            checkpointing=msg.checkpointing,
            exactly_once=msg.exactly_once,
            unaligned=msg.unaligned,
            send=self.send,
            snapshots=self.snapshots,
            console=lambda text: self.send(ConsoleOutput(text)),
            state_backend=msg.state_backend,
            storage_options=msg.storage_options,
            local_dir=self.local_dir,
            clock=graph.clock,
        )
        self.graph = graph
        self.clock = env.clock
        self.metrics_interval = msg.metrics_interval
        self.tasks = [Task(env, graph, graph.chain(d.chain_id), d) for d in msg.tasks]
        self.data = DataPlaneServer(self.host, self.launch.secret, self._route, self._broken)
        self.data.start()
        self.send(SlotReady(self.index, *self.data.address))
        peers = self.control.recv()
        if isinstance(peers, CancelSlot):
            return False
        if not isinstance(peers, ConnectPeers):
            raise TypeError(f"slot {self.index}: expected ConnectPeers, got {type(peers).__name__}")
        self._wire(peers.addresses)
        self.send(SlotRunning(self.index))
        return True

    def _load_graph(self, graph_bytes: bytes) -> JobGraph:
        try:
            graph: JobGraph = cloudpickle.loads(graph_bytes)
        except Exception as exc:  # e.g. a module the job imports is missing on this host
            raise SerializationError(
                f"slot {self.index}: the job graph does not unpickle on host {self.host}: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        return graph

    def _report_deploy_failure(self, exc: SerializationError) -> None:
        log.error("slot %d cannot load its deployment: %s", self.index, exc)
        self.send(
            TaskFailed(
                task=("deploy", self.index),
                description=f"slot {self.index} cannot load its deployment: {exc}",
                traceback="".join(traceback.format_exception(exc)),
                suppress_restarts=True,
            )
        )

    def _route(self, hello: ChannelHello) -> tuple[Any, int]:
        edge = next(e for e in self.graph.edges if e.edge_id == hello.edge_id)
        task = next(t for t in self.tasks if t.chain.chain_id == edge.target_chain)
        return task.gate, task.channel_index(edge.edge_id, hello.upstream_subtask)

    def _broken(self, hello: ChannelHello, exc: BaseException) -> None:
        if self._stop.is_set():
            return
        edge = next(e for e in self.graph.edges if e.edge_id == hello.edge_id)
        failure = TaskFailed(
            task=(edge.target_chain, self.index),
            description=(
                f"input channel from {edge.source_chain} subtask "
                f"{hello.upstream_subtask} broke: {exc!r}"
            ),
            traceback="",
            secondary=True,
        )
        try:
            self.send(failure)
        except OSError as closed:
            # The job master closed the control connection first (the job is ending, as
            # in a stop with a savepoint, or failing over): nobody is left to tell, and
            # this slot is being torn down. Said here, not as a thread's traceback.
            log.info(
                "slot %d: %s, after the control connection closed (%r)",
                self.index,
                failure.description,
                closed,
            )

    def _wire(self, addresses: dict[int, tuple[str, int]]) -> None:
        g = self.graph
        by_chain = {t.chain.chain_id: t for t in self.tasks}
        for task in self.tasks:
            # Unaligned checkpoints: outputs that queue and wake their task with room.
            wake = task.gate.wake if isinstance(task.gate, OvertakingInputGate) else None
            for edge in g.outgoing(task.chain.chain_id):
                target_name = g.chain(edge.target_chain).name
                edge_name = f"{edge.source_uid} -> {target_name} ({edge.partitioning.kind})"
                channels: list[Channel] = []
                for j in range(g.parallelism):
                    if j == self.index:
                        target = by_chain[edge.target_chain]
                        index = target.channel_index(edge.edge_id, self.index)
                        if isinstance(target.gate, OvertakingInputGate):
                            channels.append(OvertakingLocalChannel(target.gate, index, wake))
                        else:
                            channels.append(
                                LocalChannel(target.gate, index, task.metrics.backpressure)
                            )
                    else:
                        hello = ChannelHello(edge.edge_id, self.index, j)
                        conn = open_channel(addresses[j], self.launch.secret, hello)
                        if wake is not None:
                            channels.append(CreditedNetworkChannel(conn, edge_name, wake))
                        else:
                            channels.append(
                                NetworkChannel(conn, edge_name, task.metrics.backpressure)
                            )
                task.writers[edge.edge_id] = RecordWriter(
                    channels,
                    partitioning=edge.partitioning,
                    max_parallelism=g.max_parallelism,
                    batch_size=g.batch_size,
                    subtask_index=self.index,
                    edge=edge_name,
                )

    # ------------------------------------------------------------------ running

    def run(self) -> None:
        self.snapshots.start()
        now = time.perf_counter()
        self._samplers = [TaskSampler(task.metrics, now=now) for task in self.tasks]
        for task in self.tasks:
            t = threading.Thread(target=task.run, name=f"task-{task.name}", daemon=True)
            self.threads.append(t)
            t.start()
        hb = threading.Thread(target=self._heartbeat, name="heartbeat", daemon=True)
        hb.start()
        reporter = threading.Thread(target=self._report_metrics, name="metrics", daemon=True)
        if self.metrics_interval > 0:
            reporter.start()
        sources = [t for t in self.tasks if t.chain.is_source]
        while True:
            msg = self.control.recv()
            if isinstance(msg, TriggerCheckpoint):
                for task in sources:
                    task.gate.put_mail(msg)
            elif isinstance(msg, AddSplits):
                for task in sources:
                    if task.chain.chain_id == msg.chain_id:
                        task.gate.put_mail(msg)
            elif isinstance(msg, NotifyCheckpointComplete | NotifyCheckpointAborted):
                for task in self.tasks:
                    task.gate.put_mail(msg)
            elif isinstance(msg, FinishSlot):
                for task in self.tasks:
                    task.gate.put_mail(msg)
                self._join()
                if reporter.is_alive():
                    self._metrics_stop.set()
                    reporter.join()
                    self._send_metrics()  # the final counts, after the last record
                self.snapshots.stop()
                self.send(SlotClosed(self.index))
                return
            elif isinstance(msg, CancelSlot):
                # Before the gates are cancelled: tasks close their sinks with this.
                for task in self.tasks:
                    task.cancel.cancelled(msg.abandon_above)
                log.info("slot %d cancelled: %s", self.index, msg.reason)
                return
            else:
                raise TypeError(
                    f"slot {self.index}: unexpected control message {type(msg).__name__}"
                )

    def _join(self) -> None:
        for t in self.threads:
            t.join(_JOIN_TIMEOUT)
            if t.is_alive():
                raise TaskFailure(f"slot {self.index}: task thread {t.name} did not finish")

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.launch.heartbeat_interval):
            try:
                self.send(Heartbeat(self.index))
            except OSError:
                return  # the control connection is gone; the main loop reports that

    def _report_metrics(self) -> None:
        """Sample every task each interval and send the samples to the job master."""
        while not self._metrics_stop.wait(self.metrics_interval):
            try:
                self._send_metrics()
            except OSError:
                return  # the control connection is gone; the main loop reports that

    def _send_metrics(self) -> None:
        now, wall = time.perf_counter(), wall_ms(self.clock)
        self.send(
            SlotMetrics(self.index, [s.sample(now=now, wall_ms=wall) for s in self._samplers])
        )

    def shutdown(self) -> None:
        """Stop everything: cancel gates, close sockets, let threads end."""
        self._stop.set()
        self._metrics_stop.set()
        for task in self.tasks:
            task.cancel.cancelled(task.cancel.abandon_above)  # a failed task waits no longer
            task.gate.cancel()
        if self.data is not None:
            self.data.close()
        for task in self.tasks:
            for writer in task.writers.values():
                writer.close()
        for t in self.threads:
            t.join(2.0)
        self.snapshots.cancel()  # before its scratch files (RocksDB snapshots) go
        self.control.close()
        try:
            shutil.rmtree(self.local_dir)
        except OSError as exc:  # scratch only (state lives in checkpoints): report, go on
            log.warning(
                "slot %d: cannot remove scratch dir %s: %r", self.index, self.local_dir, exc
            )


def run_slot(launch: SlotLaunch, *, index: int, host: str) -> None:
    """Run slot ``index`` of a job until the job master finishes or cancels it."""
    slot = _Slot(launch, index, host)
    forward = ForwardLogs(slot.send, slot=index, attempt=launch.attempt, level=launch.log_level)
    try:
        with forward, slot_collector():
            if slot.deploy():
                slot.run()
    except (ConnectionError, OSError) as exc:
        if slot._stop.is_set():
            return
        raise TaskFailure(f"slot {index}: lost the job master: {exc!r}") from exc
    finally:
        slot.shutdown()
