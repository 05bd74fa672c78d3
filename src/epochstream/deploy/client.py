"""JobClient: a handle on a running job (``env.execute_async``).

Example::

    client = env.execute_async("wordcount")
    client.wait_for_checkpoint(1)
    os.kill(client.slot_pids()[0], signal.SIGKILL)    # a real crash
    result = client.result()                          # recovered and finished
"""

from __future__ import annotations

import threading
import time
from typing import Any

from epochstream.api.result import JobResult
from epochstream.deploy.assignment import load_restore_point
from epochstream.deploy.jobmaster import JobMaster
from epochstream.deploy.runners import LocalRunner, Runner
from epochstream.exceptions import EpochstreamError
from epochstream.graph.jobgraph import JobGraph

__all__ = ["JobClient", "start_job"]


class JobClient:
    """Observe, wait for, or cancel a job started with ``execute_async``."""

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

    def checkpoint_stats(self) -> list[Any]:
        """Statistics of every checkpoint completed so far (CheckpointStats)."""
        coordinator = self._master.coordinator
        return list(coordinator.completed_stats) if coordinator is not None else []

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

    def cancel(self) -> None:
        """Stop the job; ``result()`` then raises JobCancelled."""
        self._master.cancel()

    def result(self, timeout: float | None = None) -> JobResult:
        """Wait for the job to end; return its JobResult or raise its error."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"job {self.job_id} still running after {timeout}s")
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result


def _runner_for(env: Any) -> Runner:
    if env.runner == "local":
        return LocalRunner(parallelism=env.parallelism)
    from epochstream.deploy.spark import SparkRunner

    return SparkRunner(parallelism=env.parallelism, master=env.spark_master, spark=env.spark)


def start_job(
    env: Any,
    graph: JobGraph,
    *,
    restore_from: str | None = None,
    allow_non_restored_state: bool = False,
) -> JobClient:
    """Create the job master for ``graph`` and run it in the background."""
    restore = (
        load_restore_point(restore_from, graph, env, allow_non_restored_state)
        if restore_from
        else None
    )
    return JobClient(JobMaster(env, graph, runner=_runner_for(env), restore=restore))
