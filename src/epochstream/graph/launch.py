"""What the API hands whoever runs a job, and what it gets back.

:class:`JobDescription` is everything a launcher needs to run a job, built by
``Environment.job_description``; a :class:`Launcher` starts it and returns a
:class:`JobHandle`, whose ``result()`` is the job's :class:`JobResult`. ``deploy/``
implements the launcher (a job master in the driver, slots on Spark or local
processes); the package root makes it the default, so the API never imports
``deploy/``. These types sit here, in the layer of the job graph they carry, because
both the API and ``deploy/`` import it.

Example::

    class Recording:                      # a Launcher
        def launch(self, description):
            print(description.graph.name, description.graph.parallelism)
            return FinishedHandle()       # a JobHandle

    env.execute("wordcount", launcher=Recording())
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from epochstream.core.checkpoint_config import CheckpointConfig
from epochstream.core.checkpoint_stats import CheckpointStats
from epochstream.core.restart import RestartStrategy
from epochstream.graph.jobgraph import JobGraph

__all__ = ["JobDescription", "JobHandle", "JobResult", "Launcher"]


@dataclass(frozen=True, kw_only=True)
class JobDescription:
    """A job and every setting its run needs, as ``env.execute`` hands it to a launcher.

    ``graph``: the job graph (its name, parallelism, max parallelism, chains).
    ``max_parallelism_explicit``: whether the user set the max parallelism (else a
    restored checkpoint's wins). ``runner``: ``"spark"`` or ``"local"``, with
    ``spark_master`` or an existing ``spark`` session. ``state_backend``: the picklable
    keyed-state backend (``es.state``) shipped to the slots as it is. ``trust_shared_storage``:
    use local checkpoint, savepoint and restore paths other users could change.
    ``restore_from``: a savepoint or retained checkpoint to start from; ``resume``:
    start from the newest checkpoint of the newest earlier run of this job.

    Example::

        description = env.job_description("wordcount")
        description.graph.parallelism, description.restart_strategy.describe()
    """

    graph: JobGraph
    max_parallelism_explicit: bool
    runner: str
    spark_master: str | None
    #: An existing ``SparkSession`` (pyspark is optional, so it is not typed here).
    spark: Any
    checkpoint_config: CheckpointConfig | None
    restart_strategy: RestartStrategy
    # The state layer is above graph/; the launcher only ships the backend to the slots.
    state_backend: object
    heartbeat_interval: float
    heartbeat_timeout: float
    endpoint_host: str | None
    endpoint_linger: float
    endpoint_savepoints_anywhere: bool
    metrics_interval: float
    trust_shared_storage: bool
    restore_from: str | None = None
    allow_non_restored_state: bool = False
    resume: bool = False

    @property
    def name(self) -> str:
        """The job's name (the job graph's)."""
        return self.graph.name

    @property
    def parallelism(self) -> int:
        """The job's parallelism (the job graph's)."""
        return self.graph.parallelism


@dataclass(frozen=True)
class JobResult:
    """Outcome of ``Environment.execute``.

    ``checkpoints`` holds the statistics of every checkpoint completed during the
    run (id, trigger time, duration, state size, per-task alignment, synchronous and
    asynchronous durations); ``failures`` the description of each failure that led
    to a restart.

    Example: ``result = env.execute("job"); print(result.restarts, len(result.checkpoints))``
    """

    job_id: str
    restarts: int
    checkpoints: list[CheckpointStats] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    duration: float = 0.0
    restored_from: str | None = None


class JobHandle(Protocol):
    """A running job, as ``env.execute_async`` returns it (``es.JobClient`` by default;
    see there for each member).

    Example::

        handle = env.execute_async("job")
        handle.wait_for_checkpoint(1)
        result = handle.result()
    """

    @property
    def job_id(self) -> str:
        """The job's id."""
        ...

    @property
    def attempt(self) -> int:
        """The current attempt number (1 before any restart)."""
        ...

    @property
    def endpoint(self) -> str | None:
        """URL of the job's HTTP endpoint (``None`` when turned off)."""
        ...

    @property
    def dashboard_url(self) -> str | None:
        """A fresh one-time sign-in URL of the web dashboard."""
        ...

    @property
    def control_address(self) -> tuple[str, int]:
        """``(host, port)`` of the job master's control plane."""
        ...

    @property
    def done(self) -> bool:
        """True once the job ended."""
        ...

    @property
    def failures(self) -> list[str]:
        """The failures seen so far, one per failed attempt."""
        ...

    def open_dashboard(self) -> bool:
        """Open the dashboard in the user's browser, signed in."""
        ...

    def status(self) -> dict[str, Any]:
        """The job's state, attempt, restarts and checkpoint counts."""
        ...

    def slot_pids(self) -> dict[int, int]:
        """PID of each slot's process in the current attempt."""
        ...

    def completed_checkpoints(self) -> list[int]:
        """Ids of the checkpoints completed so far."""
        ...

    def checkpoint_stats(self) -> list[CheckpointStats]:
        """Statistics of every checkpoint completed so far."""
        ...

    def metrics(self) -> list[dict[str, Any]]:
        """Per-vertex metrics."""
        ...

    def wait_until_running(self, timeout: float = 120.0) -> None:
        """Block until every slot of the current attempt is running."""
        ...

    def wait_for_checkpoint(self, count: int = 1, timeout: float = 120.0) -> int:
        """Block until ``count`` checkpoints completed; return the latest id."""
        ...

    def trigger_savepoint(self, directory: str | None = None, *, timeout: float = 600.0) -> str:
        """Take a savepoint while the job keeps running; return its path."""
        ...

    def cancel(self, savepoint: str | None = None, *, timeout: float = 600.0) -> str | None:
        """Stop the job, with a savepoint into ``savepoint`` if given (its path)."""
        ...

    def result(self, timeout: float | None = None) -> JobResult:
        """Wait for the job to end; return its JobResult or raise its error."""
        ...


class Launcher(Protocol):
    """Runs a described job: what ``env.execute(launcher=...)`` takes.

    The default is ``deploy/``'s :class:`~epochstream.deploy.client.DriverLauncher`.

    Example::

        class Recording:
            def __init__(self):
                self.descriptions = []

            def launch(self, description: JobDescription) -> JobHandle:
                self.descriptions.append(description)
                return DriverLauncher().launch(description)
    """

    def launch(self, description: JobDescription) -> JobHandle:
        """Start the job; return a handle on it at once."""
        ...
