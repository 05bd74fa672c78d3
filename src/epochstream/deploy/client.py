"""JobClient: a handle on a running job (``env.execute_async``), and the launcher that
starts jobs with it (:class:`DriverLauncher`, the default of ``env.execute``).

Example::

    client = env.execute_async("wordcount")
    client.wait_for_checkpoint(1)
    os.kill(client.slot_pids()[0], signal.SIGKILL)    # a real crash
    result = client.result()                          # recovered and finished
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from epochstream.core.checkpoint_stats import CheckpointStats
from epochstream.core.filesystems import ensure_private_location
from epochstream.deploy.assignment import check_restore_point, load_restore_point
from epochstream.deploy.browser import open_in_browser
from epochstream.deploy.jobmaster import JobMaster
from epochstream.deploy.runners import LocalRunner, Runner
from epochstream.exceptions import EpochstreamError
from epochstream.graph.launch import JobDescription, JobResult

__all__ = ["DriverLauncher", "JobClient", "latest_run_checkpoints"]

log = logging.getLogger(__name__)


class JobClient:
    """Observe, wait for, or cancel a job started with ``execute_async``.

    Example::

        client = env.execute_async("job")
        client.wait_for_checkpoint()
        path = client.trigger_savepoint("/savepoints")
        client.cancel()"""

    def __init__(self, master: JobMaster) -> None:
        self._master = master
        self._result: JobResult | None = None
        self._error: BaseException | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"job-{master.job_id[:8]}", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        try:
            self._result = self._master.run()
        except BaseException as exc:  # re-raised by result() in the caller's thread
            self._error = exc
        finally:
            self._done.set()

    @property
    def job_id(self) -> str:
        """The job's id (also the name of its checkpoint directory)."""
        return self._master.job_id

    @property
    def attempt(self) -> int:
        """The current attempt number (1 before any restart)."""
        return self._master.attempt

    @property
    def endpoint(self) -> str | None:
        """URL of the job's HTTP endpoint (``None`` when turned off)."""
        return self._master.endpoint.url if self._master.endpoint else None

    @property
    def dashboard_url(self) -> str | None:
        """A fresh one-time sign-in URL of the web dashboard (``None``: no endpoint).

        Each read mints a new code, good once and for two minutes; it signs a browser in
        with a session cookie. The URL never holds the token. Open it with
        :meth:`open_dashboard` rather than a command line, which other users can read.

        Example: ``browser.get(client.dashboard_url)``
        """
        return self._master.endpoint.login_url() if self._master.endpoint else None

    def open_dashboard(self) -> bool:
        """Open the dashboard in the user's browser, signed in; False when it cannot.

        The browser gets a private redirect file (see :mod:`epochstream.deploy.browser`),
        so no secret lands in a process's command line.

        Example: ``client.open_dashboard()``
        """
        url = self.dashboard_url
        return url is not None and open_in_browser(url)

    def status(self) -> dict[str, Any]:
        """The job's state, attempt, restarts and checkpoint counts (as the endpoint serves)."""
        return self._master.status()

    @property
    def control_address(self) -> tuple[str, int]:
        """``(host, port)`` of the job master's control plane, where slots connect."""
        host, port = self._master.server.address
        return host, port

    @property
    def done(self) -> bool:
        """True once the job ended (finished, failed or cancelled)."""
        return self._done.is_set()

    def slot_pids(self) -> dict[int, int]:
        """PID of each slot's process in the current attempt, by slot index."""
        return dict(self._master.slot_pids)

    def completed_checkpoints(self) -> list[int]:
        """Ids of the checkpoints completed so far."""
        return self._master.completed_checkpoint_ids()

    def checkpoint_stats(self) -> list[CheckpointStats]:
        """Statistics of every checkpoint completed so far."""
        coordinator = self._master.coordinator
        return list(coordinator.completed_stats) if coordinator is not None else []

    def metrics(self) -> list[dict[str, Any]]:
        """Per-vertex metrics, as ``GET /v1/job/vertices`` serves them.

        One dict per operator chain: records in/out and rates, busy/idle/backpressured ms
        per second, queue fill, watermark and lag, state size, per-operator counts and the
        subtasks' samples (updated every ``metrics_interval``; final counts once the job ends).

        Example: ``{v["name"]: v["records_out"] for v in client.metrics()}``
        """
        return self._master.metrics.vertices()

    @property
    def failures(self) -> list[str]:
        """The failures seen so far, one per failed attempt."""
        return list(self._master.failures)

    def wait_until_running(self, timeout: float = 120.0) -> None:
        """Block until every slot of the current attempt is running."""
        if not self._master.running.wait(timeout):
            self._raise_if_done()
            raise TimeoutError(f"job {self.job_id} not running after {timeout}s")

    def wait_for_checkpoint(self, count: int = 1, timeout: float = 120.0) -> int:
        """Block until ``count`` checkpoints completed; return the latest id."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ids = self.completed_checkpoints()
            if len(ids) >= count:
                return ids[-1]
            self._raise_if_done()
            time.sleep(0.05)
        raise TimeoutError(f"job {self.job_id}: fewer than {count} checkpoints after {timeout}s")

    def _raise_if_done(self) -> None:
        if self._done.is_set():
            if self._error is not None:
                raise self._error
            raise EpochstreamError(f"job {self.job_id} already finished")

    def trigger_savepoint(self, directory: str | None = None, *, timeout: float = 600.0) -> str:
        """Take a savepoint while the job keeps running; returns its path.

        It goes to ``directory/savepoint-<job>-<random>`` (default directory: the
        checkpoint config's ``savepoint_dir``, else ``<storage>/savepoints``), in the
        canonical format any backend restores, self-contained and never deleted by
        epochstream. Raises :class:`~epochstream.exceptions.CheckpointError` when it fails.

        Example: ``path = client.trigger_savepoint("s3://bucket/sp")``
        """
        return self._master.request_savepoint(directory, terminate=False).wait(timeout)

    def cancel(self, savepoint: str | None = None, *, timeout: float = 600.0) -> str | None:
        """Stop the job; ``result()`` then raises JobCancelled.

        With ``savepoint`` (a directory), stop with a savepoint, as Flink's
        stop-with-savepoint: sources stop after its barrier, sinks commit everything it
        covers, and the job ends; returns the savepoint's path. If the savepoint fails
        the job keeps running and :class:`~epochstream.exceptions.CheckpointError` is raised.

        Example: ``path = client.cancel(savepoint="/data/sp")``
        """
        if savepoint is None:
            self._master.cancel()
            return None
        path = self._master.request_savepoint(savepoint, terminate=True).wait(timeout)
        self._done.wait(timeout)
        return path

    def result(self, timeout: float | None = None) -> JobResult:
        """Wait for the job to end; return its JobResult or raise its error."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"job {self.job_id} still running after {timeout}s")
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result


def _runner_for(description: JobDescription) -> Runner:
    if description.runner == "local":
        return LocalRunner(parallelism=description.parallelism)
    from epochstream.deploy.spark import SparkRunner

    return SparkRunner(
        parallelism=description.parallelism,
        master=description.spark_master,
        spark=description.spark,
    )


class DriverLauncher:
    """Runs jobs with a job master in this (the driver's) process and slots on Spark or
    in local subprocesses (``description.runner``): the default launcher of
    ``env.execute`` (see :class:`~epochstream.graph.launch.Launcher`).

    Example: ``client = DriverLauncher().launch(env.job_description("wordcount"))``
    """

    def launch(self, description: JobDescription) -> JobClient:
        """Create the job master and run it in the background.

        With ``description.restore_from`` the job starts from that savepoint or
        checkpoint; with ``description.resume`` from the newest completed checkpoint of
        the newest earlier run of a job with this name under the checkpoint storage
        (none: a fresh start).
        """
        config = description.checkpoint_config
        if config is not None:
            # Before anything is read from it (--resume unpickles what it finds there).
            ensure_private_location(
                config.storage_location,
                what="checkpoint storage",
                trust_shared=config.trust_shared_storage,
            )
        restore = None
        if description.restore_from:
            restore = load_restore_point(description.restore_from, description)
        elif description.resume:
            restore = latest_run_checkpoints(description)
            if restore:
                check_restore_point(restore[0], description)
        master = JobMaster(description, runner=_runner_for(description), restore=restore)
        return JobClient(master)


def latest_run_checkpoints(description: JobDescription) -> list[Any] | None:
    """The completed checkpoints of the newest earlier run of the described job (by
    name), newest first.

    Looks under the job's checkpoint storage (``epochstream run --resume``).
    """
    from epochstream.checkpoint.pending import CompletedCheckpoint
    from epochstream.checkpoint.storage import scan_checkpoints
    from epochstream.exceptions import CheckpointError, ConfigurationError, UntrustedStorageError

    job_name, config = description.name, description.checkpoint_config
    if config is None:
        raise ConfigurationError("--resume needs checkpointing: call env.enable_checkpointing()")
    try:
        entries = scan_checkpoints(
            config.storage_location,
            config.storage_options,
            trust_shared=config.trust_shared_storage,
        )
    except CheckpointError as err:  # no storage yet: nothing to resume (a refusal propagates)
        log.warning("resume: %s; starting from the beginning", err)
        return None
    refused = [e for e in entries if e.untrusted]
    if refused:
        # A refused run may be this job's newest: resuming an older one, or starting
        # from the beginning, would make sinks write again what that run committed.
        raise UntrustedStorageError(
            f"--resume cannot tell which run under {config.storage_location} is the newest: "
            f"{len(refused)} checkpoint(s) there are refused unread, e.g. {refused[0].error}"
        )
    runs: dict[str, list[Any]] = {}
    for e in entries:
        if (
            e.metadata is not None
            and e.metadata.job_name == job_name
            and e.metadata.kind == "checkpoint"
        ):
            runs.setdefault(e.metadata.job_id, []).append(e)
    if not runs:
        log.warning(
            "resume: no earlier checkpoint of job %r; starting from the beginning", job_name
        )
        return None
    newest_run = max(runs.values(), key=lambda es: max(e.metadata.completion_time for e in es))
    newest_run.sort(key=lambda e: e.checkpoint_id, reverse=True)
    log.warning(
        "resume: job %r continues from checkpoint %d of run %s",
        job_name,
        newest_run[0].checkpoint_id,
        newest_run[0].metadata.job_id,
    )
    return [
        CompletedCheckpoint(e.checkpoint_id, e.directory, e.metadata, owned=False)
        for e in newest_run
    ]
