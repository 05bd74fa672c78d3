"""The job master: control plane, checkpoint coordinator, split enumerators, failover.

It runs in the driver on one event thread. Each *attempt* deploys every slot:

    REGISTERING -> DEPLOYING -> CONNECTING -> RUNNING -> FINISHING -> done
         \\____________\\____________\\___________\\______ any failure -> FAILING

The attempt's progress (which slots got how far) is an
:class:`~epochstream.deploy.attempt.AttemptProgress` that says when the next phase starts.
On a failure (a task's exception, a slot's lost connection or heartbeat, the
Spark job failing) the job master cancels every slot of the attempt, asks the
restart strategy, and deploys a new attempt that restores the latest completed
checkpoint (global failover). Restarts exhausted: ``JobExecutionError`` naming
the first cause and the history.

Example::

    master = JobMaster(env.job_description("job"), runner=LocalRunner(parallelism=2))
    result = master.run()
"""

from __future__ import annotations

import logging
import queue
import secrets
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import cloudpickle

from epochstream.checkpoint.coordinator import CheckpointCoordinator
from epochstream.checkpoint.metadata import CheckpointMetadata
from epochstream.checkpoint.outage import StorageOutage
from epochstream.checkpoint.pending import CompletedCheckpoint
from epochstream.checkpoint.storage import CheckpointStorage
from epochstream.core.clock import Clock, SystemClock
from epochstream.core.events import CheckpointOptions
from epochstream.core.filesystems import ensure_private_location
from epochstream.deploy.assignment import task_deployments
from epochstream.deploy.attempt import AttemptProgress, Ended, Phase
from epochstream.deploy.committers import GlobalCommits
from epochstream.deploy.control import ControlServer, SlotConnection
from epochstream.deploy.endpoint import JobEndpoint
from epochstream.deploy.enumeration import SourceEnumerators
from epochstream.deploy.failures import Failure, FailureHandler, runner_lost
from epochstream.deploy.inbox import Inbox
from epochstream.deploy.job_registry import unregister
from epochstream.deploy.metrics import JobMetrics, job_status
from epochstream.deploy.runners import Runner, RunnerLost
from epochstream.deploy.savepoints import SavepointRequest, SavepointRequests
from epochstream.deploy.storage_io import StorageWorker
from epochstream.deploy.storage_wait import StorageWaiter
from epochstream.exceptions import ConfigurationError, JobCancelled, JobExecutionError
from epochstream.graph.launch import JobDescription, JobResult
from epochstream.runtime.auth import new_secret
from epochstream.runtime.messages import (
    AcknowledgeCheckpoint,
    CancelSlot,
    ConnectPeers,
    ConsoleOutput,
    DeclineCheckpoint,
    DeploySlot,
    FinishSlot,
    Heartbeat,
    NotifyCheckpointAborted,
    NotifyCheckpointComplete,
    RegisterSlot,
    RequestSplit,
    SlotClosed,
    SlotMetrics,
    SlotReady,
    SlotRunning,
    SourceExhausted,
    TaskDeployment,
    TaskFailed,
    TaskFinished,
    TaskKey,
    TriggerCheckpoint,
)
from epochstream.runtime.slot import SlotLaunch
from epochstream.runtime.slotlogs import SlotLog, log_slot_record

__all__ = ["JobMaster", "Phase"]

log = logging.getLogger(__name__)

REGISTRATION_TIMEOUT = 180.0
CANCEL_TIMEOUT = 60.0
#: Seconds cancelled slots get to close their tasks (sinks abort transactions) before
#: the runner kills them.
CANCEL_GRACE = 5.0
#: What each slot of an attempt runs, by slot index.
Deployments = dict[int, list[TaskDeployment]]


class JobMaster:
    """Runs one job to completion across attempts."""

    def __init__(
        self,
        description: JobDescription,
        *,
        runner: Runner,
        clock: Clock | None = None,
        restore: list[CompletedCheckpoint] | None = None,
    ) -> None:
        self.description = description
        self.graph = graph = description.graph
        self.runner = runner
        self.clock = clock or SystemClock()
        self.job_id = uuid.uuid4().hex
        self.secret = new_secret()
        self.events: queue.Queue[Any] = queue.Queue()
        self.attempt = 0
        self.phase = Phase.REGISTERING
        self.failures: list[str] = []
        self.slot_pids: dict[int, int] = {}
        self.running = threading.Event()
        self.started_at = time.time()
        #: When the job ended and how (FINISHED, FAILED, CANCELED); None while it runs.
        self.finished_at: float | None = None
        self.outcome: str | None = None
        self.metrics = JobMetrics(graph)
        self.inbox = Inbox(self.events, self.clock, self.job_id, self.metrics)
        self._slots: dict[int, Any] = {}
        self._savepoints = SavepointRequests(self.job_id)
        try:
            self._graph_bytes = cloudpickle.dumps(graph)
        except Exception as exc:
            raise ConfigurationError(
                f"job {graph.name!r} cannot be shipped to the slots: a function or object in it "
                f"does not pickle ({type(exc).__name__}: {exc})"
            ) from exc
        self._enumerators: SourceEnumerators | None = None  # per attempt
        self._commits = GlobalCommits(graph, self.job_id)
        self._tasks: set[TaskKey] = {
            (c.chain_id, i) for c in graph.chains for i in range(graph.parallelism)
        }
        self._sources: set[TaskKey] = {
            (c.chain_id, i) for c in graph.chains if c.is_source for i in range(graph.parallelism)
        }
        self._fail_request: Failure | None = None
        self._restoring = False
        config = description.checkpoint_config
        self.checkpoint_config = config
        self.storage: CheckpointStorage | None = None
        self.coordinator: CheckpointCoordinator | None = None
        self.io = StorageWorker(self.events)
        #: Whether checkpoint storage is reachable (shown by /v1/job and the dashboard).
        self.storage_outage = StorageOutage(self.job_id)
        if config is not None:
            self.storage = CheckpointStorage(
                config.storage_location,
                self.job_id,
                config.storage_options,
                trust_shared=config.trust_shared_storage,
            )
            # Checkpoints hold pickles: a root other local users can change is refused.
            self.storage.check_trusted()
            if config.savepoint_dir is not None:
                ensure_private_location(
                    config.savepoint_location,
                    what="savepoint directory",
                    trust_shared=config.trust_shared_storage,
                )
            # Before any record is read: an unusable storage would otherwise show only at
            # the first checkpoint, after the input was processed once per restart.
            self.storage.check_writable()
            self.coordinator = CheckpointCoordinator(
                config=config,
                storage=self.storage,
                clock=self.clock,
                job_id=self.job_id,
                job_name=graph.name,
                parallelism=graph.parallelism,
                max_parallelism=graph.max_parallelism,
                operator_parallelism={uid: graph.parallelism for uid in graph.operator_uids},
                callbacks=self,
                outage=self.storage_outage,
                # Above what the sinks committed before (another job on the same table).
                first_checkpoint_id=self._commits.last_committed() + 1,
            )
        # An attempt that failed with storage unavailable waits here for it, restarts unspent.
        self._storage_wait = StorageWaiter(
            self.storage_outage,
            probe=self._probe_storage if self.storage is not None else None,
            sleep=self.inbox.sleep,
            wall=self.clock.wall,
        )
        # Where attempt 1 starts from when this job resumes an earlier job's checkpoint
        # (newest first; the others are fallbacks if it proves corrupt). With
        # checkpointing on, the coordinator takes them over.
        self._restore = list(restore or [])
        if self._restore and self.coordinator is not None:
            self.coordinator.restore_from(self._restore)
        # The endpoint first: a bad endpoint_host fails here, before anything else binds.
        host = description.endpoint_host
        self.endpoint = (
            JobEndpoint(self, host=host, token=secrets.token_urlsafe(32)) if host else None
        )
        self.server = ControlServer(runner.control_host(), self.secret, self.events)

    # ------------------------------------------------------------------ coordinator callbacks

    def trigger_sources(
        self, checkpoint_id: int, timestamp: float, final: bool, options: CheckpointOptions
    ) -> None:
        # The enumerators' state is taken now, with the trigger: every split sent before
        # reaches its reader before the trigger does, so both halves of the checkpoint agree.
        states = self._enumerators.snapshot() if self._enumerators is not None else {}
        self._broadcast(TriggerCheckpoint(checkpoint_id, timestamp, final, options, states))

    def run_io(
        self, work: Callable[[], None], done: Callable[[BaseException | None], None] | None
    ) -> None:
        self.io.submit(work, done)

    def savepoint_done(self, checkpoint_id: int, path: str | None, error: str | None) -> None:
        if self._savepoints.done(checkpoint_id, path, error) is not None:
            # Stop-with-savepoint: sinks were notified first; now finish the slots.
            self.phase = Phase.FINISHING
            self._broadcast(FinishSlot(stopped=True))

    @property
    def _stop_with(self) -> SavepointRequest | None:
        return self._savepoints.stopping

    def notify_complete(self, checkpoint_id: int, metadata: CheckpointMetadata) -> None:
        log.info("job %s: checkpoint %d complete", self.job_id[:8], checkpoint_id)
        try:
            # On the event thread: the checkpoint counts as committed only once this ran.
            self._commits.commit(checkpoint_id, metadata)
        except Exception as exc:  # a restart commits it again from the restored checkpoint
            log.error("job %s: %s", self.job_id[:8], exc)
            self.fail_job(str(exc))
        self._broadcast(NotifyCheckpointComplete(checkpoint_id))

    def notify_aborted(self, checkpoint_id: int, reason: str) -> None:
        log.info("job %s: checkpoint %d aborted: %s", self.job_id[:8], checkpoint_id, reason)
        self.metrics.record_checkpoint_failure(checkpoint_id, reason, wall=self.clock.wall())
        self._broadcast(NotifyCheckpointAborted(checkpoint_id, reason))

    def fail_job(self, reason: str, error: BaseException | None = None) -> None:
        self._fail_request = Failure(reason, error=error)

    def _broadcast(self, msg: Any) -> None:
        for conn in self._slots.values():
            conn.send(msg)

    # ------------------------------------------------------------------ public

    def cancel(self) -> None:
        """Ask the job to stop (thread-safe)."""
        self.events.put(("cancel", None, None))

    def request_savepoint(self, directory: str | None, *, terminate: bool) -> SavepointRequest:
        """Ask for a savepoint into ``directory`` (default: the configured savepoint
        directory); ``terminate`` stops the job after it (thread-safe)."""
        request = SavepointRequest(directory, terminate=terminate)
        self.events.put(("savepoint", None, request))
        return request

    def status(self) -> dict[str, Any]:
        """A snapshot of the job's state for the endpoint and the CLI (any thread)."""
        return job_status(self)

    def completed_checkpoint_ids(self) -> list[int]:
        if self.coordinator is None:
            return []
        return [s.checkpoint_id for s in self.coordinator.completed_stats]

    def run(self) -> JobResult:
        """Run attempts until the job finishes, is cancelled, or restarts run out."""
        started = time.monotonic()
        tracker = self.description.restart_strategy.create_tracker(self.clock)
        handler = FailureHandler(self.job_id, tracker, self.coordinator, self._storage_wait)
        self.server.start()
        self.io.start()
        if self.endpoint is not None:
            self.endpoint.announce(self.job_id, self.graph.name, self.started_at)
        try:
            while True:
                self.attempt += 1
                failure = self._run_attempt()
                if failure is not None:
                    # Recorded before the attempt is torn down: that may raise RunnerLost,
                    # whose report must still name what ended the attempt.
                    self.failures.append(failure.cause)
                    self.metrics.record_failure(
                        attempt=self.attempt, cause=failure.cause, wall=self.clock.wall()
                    )
                self._end_attempt(failure)
                if failure is None and self._stop_with is not None:
                    raise JobCancelled(
                        f"job {self.job_id} stopped with a savepoint at {self._stop_with.path}"
                    )
                if failure is None:
                    self.outcome = "FINISHED"
                    return self._result(started)
                log.warning(
                    "job %s attempt %d failed: %s", self.job_id[:8], self.attempt, failure.cause
                )
                self.inbox.sleep(handler.restart_delay(failure, self.failures))
        except JobCancelled:
            self.outcome = "CANCELED"
            if self.coordinator is not None:
                self.coordinator.shutdown(cancelled=True)
            raise
        except RunnerLost as lost:
            raise self._runner_lost(lost) from lost
        finally:
            self.outcome = self.outcome or "FAILED"
            self.finished_at = time.time()
            self.server.close()
            if self.endpoint is not None:
                # The final state stays visible (dashboard, REST) for a while; the
                # endpoint's threads are daemons, so it never holds the driver up.
                self.endpoint.close_after(self.description.endpoint_linger)
                unregister(self.job_id)
            if self.coordinator is not None:
                self.coordinator.stop_attempt("job ended")
            self.io.stop()
            self._commits.close()
            self.runner.close()
            self._savepoints.fail_all("the job ended")

    # ------------------------------------------------------------------ attempts

    def _probe_storage(self) -> None:
        """Read what the next attempt restores first (raises while storage is down)."""
        assert self.storage is not None
        latest = self.coordinator.latest_completed if self.coordinator else None
        if latest is not None and latest.directory.startswith(self.storage.job_dir):
            self.storage.probe(latest.checkpoint_id)
        else:
            self.storage.probe(None)

    def _launch(self) -> SlotLaunch:
        host, port = self.server.address
        return SlotLaunch(
            job_id=self.job_id,
            attempt=self.attempt,
            master=(host, port),
            secret=self.secret,
            heartbeat_interval=self.description.heartbeat_interval,
            log_level=logging.getLogger("epochstream.slots").getEffectiveLevel(),
        )

    def _run_attempt(self) -> Failure | None:
        self.phase = Phase.REGISTERING
        self.metrics.new_attempt()
        self._slots = {}
        self._fail_request = None
        attempt = self.attempt
        if self.coordinator is not None:
            restored = self.coordinator.latest_completed
        else:
            restored = self._restore[0] if self._restore else None
        # Whether reaching RUNNING proves storage answers (the tasks read a checkpoint).
        self._restoring = restored is not None
        if restored is not None and self._commits:
            try:
                self._commits.commit(restored.checkpoint_id, restored.metadata)
            except Exception as exc:
                return Failure(str(exc))
        try:
            self._enumerators = SourceEnumerators(self.graph, restored)
            initial = self._enumerators.initial_assignment()
        except ConfigurationError:
            raise
        except Exception as exc:  # a source's broker or store not answering yet
            return Failure.enumeration_failed(attempt, exc)
        deployments = task_deployments(self.graph, restored, initial)
        progress = AttemptProgress(
            attempt=attempt,
            parallelism=self.graph.parallelism,
            tasks=self._tasks,
            sources=self._sources,
            started=self.clock.now(),
            registration_timeout=REGISTRATION_TIMEOUT,
            heartbeat_timeout=self.description.heartbeat_timeout,
        )
        if restored is not None:
            log.warning(
                "job %s attempt %d: restoring checkpoint %d",
                self.job_id[:8],
                attempt,
                restored.checkpoint_id,
            )
        try:
            self.runner.start(
                self._launch(), lambda err: self.events.put(("runner-exit", attempt, err))
            )
        except Exception as exc:  # EMFILE, ENOMEM, EAGAIN...: the restart strategy decides
            return Failure.start_failed(attempt, exc)
        while True:
            timeout = 1.0
            if self.phase == Phase.RUNNING and self.coordinator is not None:
                due = self.coordinator.tick()
                if due is not None:
                    timeout = min(timeout, max(due, 0.0))
            if self.phase == Phase.RUNNING:
                timeout = min(timeout, self._discover_splits())
            if self._fail_request is not None:
                return self._fail_request
            try:
                kind, conn, msg = self.events.get(timeout=timeout)
            except queue.Empty:
                kind, conn, msg = "idle", None, None
            ended = self._on_event(progress, deployments, kind, conn, msg)
            if ended is not None:
                return ended.failure

    def _on_event(
        self, progress: AttemptProgress, deployments: Deployments, kind: str, conn: Any, msg: Any
    ) -> Ended | None:
        """Handle one event of the running attempt; ``Ended`` when that ended it."""
        now = self.clock.now()
        if kind == "cancel":
            self._end_attempt(Failure("cancelled"))
            raise JobCancelled(f"job {self.job_id} was cancelled")
        if kind == "io-done":
            conn(msg)  # a storage callback (conn), with its error (msg)
            self._maybe_finish(progress)
            return None
        if kind == "savepoint":
            self._savepoints.start(
                msg, self.coordinator, self.checkpoint_config, running=self.phase is Phase.RUNNING
            )
            return None
        if kind == "runner-exit":
            return self._on_runner_exit(progress, conn, msg)
        if kind == "closed":
            if not progress.lost(conn.attempt, conn.slot):
                return None
            # While stopping after the savepoint, nothing is lost.
            return Ended(None if self._stop_with is not None else Failure.lost_slot(conn, msg))
        overdue = progress.registration_overdue(now, self.phase)
        if overdue is not None:
            return Ended(Failure(overdue))
        silent = progress.silent_slot(now)
        if silent is not None:
            return Ended(None if self._stop_with is not None else Failure(silent))
        if kind == "idle":
            return None
        assert kind == "message"
        if isinstance(msg, RegisterSlot):
            self._register(progress, deployments, conn, msg, now)
            return None
        if conn.attempt != progress.attempt:
            return None
        progress.heard_from(conn.slot, now)
        return self._on_message(progress, conn, msg)

    def _on_message(
        self, progress: AttemptProgress, conn: SlotConnection, msg: Any
    ) -> Ended | None:
        """A message of a registered slot of the running attempt."""
        if isinstance(msg, (Heartbeat, SlotLog, SlotMetrics, ConsoleOutput)):
            self._report(msg)
            return None
        if isinstance(msg, TaskFailed):
            if self._stop_with is not None:
                # The job stops after a savepoint whose transactions sinks committed:
                # restarting from an older checkpoint would write them again.
                log.info(
                    "job %s: ignoring a failure while stopping: %s",
                    self.job_id[:8],
                    msg.description,
                )
                return None
            failure = Failure.of_task(msg)
            if msg.secondary:
                failure = self.inbox.root_cause(failure, progress.attempt, progress.closed)
            return Ended(failure)
        if isinstance(msg, SlotReady):
            if progress.ready(msg.slot, (msg.host, msg.port)) is Phase.CONNECTING:
                self.phase = Phase.CONNECTING
                self._broadcast(ConnectPeers(progress.addresses))
        elif isinstance(msg, SlotRunning):
            if progress.slot_running(msg.slot) is Phase.RUNNING:
                self.phase = Phase.RUNNING
                self.running.set()
                if self._restoring:
                    # Not yet restored (tasks read their state after this): the outage,
                    # if any, ends with the next completed checkpoint.
                    self._storage_wait.restored()
                if self.coordinator is not None:
                    self.coordinator.start_attempt(set(self._tasks))
        elif isinstance(msg, AcknowledgeCheckpoint):
            if self.coordinator is not None:
                self.coordinator.receive_ack(msg)
        elif isinstance(msg, DeclineCheckpoint):
            if self.coordinator is not None:
                self.coordinator.receive_decline(msg)
        elif isinstance(msg, SourceExhausted):
            if progress.source_exhausted(msg.task) and self.coordinator is not None:
                self.coordinator.trigger_final()
        elif isinstance(msg, RequestSplit):
            assert self._enumerators is not None
            for split_msg in self._enumerators.request(msg.chain_id, msg.subtask):
                conn.send(split_msg)
        elif isinstance(msg, TaskFinished):
            progress.task_finished(msg.task)
        elif isinstance(msg, SlotClosed):
            if progress.slot_closed(msg.slot, self.phase) is Phase.DONE:
                return Ended(None)
        else:
            log.warning("job %s: unexpected message %r", self.job_id[:8], msg)
        self._maybe_finish(progress)
        return None

    def _on_runner_exit(
        self, progress: AttemptProgress, attempt: int, error: BaseException | None
    ) -> Ended | None:
        if attempt != progress.attempt:
            return None
        # In FINISHING every task ended and the final checkpoint committed; a clean
        # exit may simply come before the last SlotClosed message.
        if self.phase == Phase.FINISHING and (error is None or self._stop_with):
            self.inbox.take_final_reports(self._slots, attempt, progress.closed)
            return Ended(None)
        if error is None:
            return Ended(Failure(f"slots of attempt {attempt} exited before the job finished"))
        text, fatal = self.runner.describe_exit_error(error)
        cause = f"slots of attempt {attempt} ended: {text}"
        return Ended(Failure(cause, suppress_restarts=fatal, error=error))

    def _register(
        self,
        progress: AttemptProgress,
        deployments: Deployments,
        conn: SlotConnection,
        msg: RegisterSlot,
        now: float,
    ) -> None:
        if not progress.accepts(msg, self.phase):
            reason = f"stale registration (attempt {msg.attempt}, current {progress.attempt})"
            conn.send(CancelSlot(reason))
            conn.close()
            return
        conn.slot, conn.attempt, conn.pid = msg.slot, msg.attempt, msg.pid
        self._slots[msg.slot] = conn
        self.slot_pids[msg.slot] = msg.pid
        if progress.registered(msg.slot, now) is Phase.DEPLOYING:
            self.phase = Phase.DEPLOYING
            for slot, c in self._slots.items():
                c.send(self._deploy_message(slot, deployments[slot]))

    def _report(self, msg: Heartbeat | SlotLog | SlotMetrics | ConsoleOutput) -> None:
        """A slot's heartbeat (nothing more to do), log record, metrics or console output."""
        if isinstance(msg, SlotLog):
            log_slot_record(msg)
        elif isinstance(msg, SlotMetrics):
            self.metrics.record(msg.samples, wall=self.clock.wall())
        elif isinstance(msg, ConsoleOutput):
            sys.stdout.write(msg.text)
            sys.stdout.flush()

    def _discover_splits(self) -> float:
        """Let enumerators discover; send new splits to the subtasks waiting for one.
        Seconds until the next discovery."""
        enumerators = self._enumerators
        assert enumerators is not None
        now = self.clock.now()
        for msg in enumerators.discover(now):
            self._slots[msg.subtask].send(msg)
        due = enumerators.next_discovery()
        return 1.0 if due is None else max(due - self.clock.now(), 0.0)

    def _maybe_finish(self, progress: AttemptProgress) -> None:
        """Every task ended its input and the final checkpoint committed: close the slots."""
        final_committed = self.coordinator is None or self.coordinator.final_completed
        if progress.finishing(self.phase, final_committed) is Phase.FINISHING:
            self.phase = Phase.FINISHING
            self._broadcast(FinishSlot())

    def _deploy_message(self, slot: int, tasks: list[Any]) -> DeploySlot:
        config = self.checkpoint_config
        return DeploySlot(
            job_id=self.job_id,
            attempt=self.attempt,
            graph_bytes=self._graph_bytes,
            tasks=tasks,
            sys_path=[p for p in sys.path if p],
            checkpoint_dir=self.storage.job_dir if self.storage else None,
            checkpointing=self.coordinator is not None,
            exactly_once=bool(config and config.exactly_once),
            unaligned=bool(config and config.unaligned),
            storage_options=config.storage_options if config else None,
            state_backend=self.description.state_backend,
            metrics_interval=self.description.metrics_interval,
        )

    def _end_attempt(self, failure: Failure | None) -> None:
        if failure is None:
            self.phase = Phase.DONE
            for conn in self._slots.values():
                conn.close()
            self.runner.wait(CANCEL_TIMEOUT)
            return
        self.phase = Phase.FAILING
        self.running.clear()
        abandon_above: int | None = None
        if self.coordinator is not None:
            self.coordinator.stop_attempt(failure.cause.splitlines()[0])
            abandon_above = self.coordinator.maybe_completed_id
        for conn in self._slots.values():
            conn.send(CancelSlot(failure.cause.splitlines()[0], abandon_above))
            conn.close()
        # Slots abort their sinks' transactions on CancelSlot (a job failing for good
        # leaves none open); killing them at once could cut that short. Slots that are
        # still there after the grace (a task hanging) are cancelled by the runner.
        self.runner.wait(CANCEL_GRACE)
        self.runner.cancel()
        if not self._wait_for_slots(CANCEL_TIMEOUT):
            log.error(
                "job %s: slots of attempt %d did not stop within %.0fs",
                self.job_id[:8],
                self.attempt,
                CANCEL_TIMEOUT,
            )
        self.inbox.drain_stale()

    def _wait_for_slots(self, timeout: float) -> bool:
        """Wait until the ended attempt's slots are gone, sending away any that registers
        only now (it was still starting); False if some are still there at ``timeout``."""
        deadline = self.clock.now() + timeout
        while not self.runner.wait(0.1):
            if self.clock.now() >= deadline:
                return False
            self.inbox.drain_stale()
        return True

    def _runner_lost(self, lost: RunnerLost) -> JobExecutionError:
        latest = self.coordinator.latest_completed if self.coordinator else None
        job_dir = self.storage.job_dir if self.storage else None
        return runner_lost(self.job_id, self.failures, lost, latest, job_dir)

    def _result(self, started: float) -> JobResult:
        stats = list(self.coordinator.completed_stats) if self.coordinator else []
        return JobResult(
            job_id=self.job_id,
            restarts=self.attempt - 1,
            checkpoints=stats,
            failures=list(self.failures),
            restored_from=self._restore[0].directory if self._restore else None,
            duration=time.monotonic() - started,
        )
