"""The job master's view of a job's metrics: latest task samples, history, exceptions.

Slots report a :class:`~epochstream.runtime.metrics.TaskMetricsSample` per task each
metrics interval (``SlotMetrics``). The job master's event thread records them here;
the endpoint's threads read snapshots (one lock, held only to copy). Per *vertex* (an
operator chain, as in Flink's job graph) the subtasks are aggregated: rates and
counts add up, busy/backpressured time and queue fill take the worst subtask, the
watermark the lowest and its lag the largest. A short history of per-vertex rates and
the job's watermark lag feeds the dashboard's charts.

Example::

    metrics = JobMetrics(graph, history_points=600)
    metrics.record(samples, wall=time.time())
    metrics.vertices()[0]["records_out_per_s"]
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any

from epochstream.graph.jobgraph import ChainSpec, JobGraph
from epochstream.runtime.metrics import TaskMetricsSample

__all__ = ["JobMetrics", "job_status"]

#: A vertex this many ms per second backpressured (or more) is shown as backpressured.
BACKPRESSURED_MS = 500.0


class JobMetrics:
    """Latest samples by task, a bounded history of rates, and the exception history.

    Example: ``JobMetrics(graph).record_failure(attempt=1, cause="boom", wall=time.time())``
    """

    def __init__(self, graph: JobGraph, *, history_points: int = 600) -> None:
        self.graph = graph
        self._lock = threading.Lock()
        self._latest: dict[tuple[str, int], TaskMetricsSample] = {}
        self._history: deque[dict[str, Any]] = deque(maxlen=history_points)
        self._exceptions: list[dict[str, Any]] = []
        self._failed_checkpoints: list[dict[str, Any]] = []
        # Operators whose output leaves the chain (their records_out is the vertex's).
        self._leaving = {
            c.chain_id: [
                op.uid for op in c.operators if any(o.edge_id is not None for o in op.outputs)
            ]
            for c in graph.chains
        }

    # ------------------------------------------------------------------ writers (event thread)

    def record(self, samples: list[TaskMetricsSample], *, wall: float) -> None:
        """Keep the newest sample of each task; add a history point at most once a second."""
        with self._lock:
            for sample in samples:
                self._latest[sample.task] = sample
            if not self._history or wall - self._history[-1]["time"] >= 0.95:
                vertices = self._aggregate()
                lags = [
                    v["watermark_lag_ms"] for v in vertices if v["watermark_lag_ms"] is not None
                ]
                self._history.append(
                    {
                        "time": wall,
                        "rates": {v["id"]: v["rate"] for v in vertices},
                        "watermark_lag_ms": max(lags) if lags else None,
                    }
                )

    def new_attempt(self) -> None:
        """Tasks of the previous attempt are gone: forget their samples (counts restart)."""
        with self._lock:
            self._latest.clear()

    def record_failure(self, *, attempt: int, cause: str, wall: float) -> None:
        """An attempt failed with ``cause`` (first line: the message; the rest: traceback)."""
        message, _, trace = cause.partition("\n")
        with self._lock:
            self._exceptions.append(
                {"time": wall, "attempt": attempt, "message": message, "traceback": trace}
            )

    def record_checkpoint_failure(self, checkpoint_id: int, reason: str, *, wall: float) -> None:
        """A checkpoint was aborted (declined, expired, failed to write)."""
        with self._lock:
            self._failed_checkpoints.append(
                {"checkpoint_id": checkpoint_id, "time": wall, "reason": reason}
            )

    # ------------------------------------------------------------------ readers (any thread)

    def vertices(self) -> list[dict[str, Any]]:
        """Every vertex with its aggregated metrics and its subtasks' samples."""
        with self._lock:
            return self._aggregate()

    def history(self) -> list[dict[str, Any]]:
        """Points ``{"time", "rates": {vertex: records/s}, "watermark_lag_ms"}``, oldest first."""
        with self._lock:
            return list(self._history)

    def exceptions(self) -> list[dict[str, Any]]:
        """Failed attempts, oldest first: time, attempt, message, traceback."""
        with self._lock:
            return list(self._exceptions)

    def failed_checkpoints(self) -> list[dict[str, Any]]:
        """Aborted checkpoints, oldest first: id, time, reason."""
        with self._lock:
            return list(self._failed_checkpoints)

    def _aggregate(self) -> list[dict[str, Any]]:
        return [self._vertex(chain) for chain in self.graph.chains]

    def _vertex(self, chain: ChainSpec) -> dict[str, Any]:
        p = self.graph.parallelism
        samples = [s for i in range(p) if (s := self._latest.get((chain.chain_id, i)))]
        operators: list[dict[str, Any]] = []
        for spec in chain.operators:
            ops = [op for s in samples for op in s.operators if op.uid == spec.uid]
            marks = [op.watermark for op in ops if op.watermark is not None]
            operators.append(
                {
                    "uid": spec.uid,
                    "name": spec.name,
                    "kind": spec.kind,
                    "records_in": sum(op.records_in for op in ops),
                    "records_out": sum(op.records_out for op in ops),
                    "records_in_per_s": sum(op.records_in_per_s for op in ops),
                    "records_out_per_s": sum(op.records_out_per_s for op in ops),
                    "watermark": min(marks) if len(marks) == len(ops) and marks else None,
                    "late_records_dropped": sum(op.late_records_dropped for op in ops),
                }
            )
        by_uid = {op["uid"]: op for op in operators}
        head = by_uid[chain.head.uid]
        leaving = [by_uid[uid] for uid in self._leaving[chain.chain_id]]
        records_out = sum(op["records_out"] for op in leaving)
        out_rate = sum(op["records_out_per_s"] for op in leaving)
        lags = [s.watermark_lag_ms for s in samples if s.watermark_lag_ms is not None]
        marks = [s.watermark for s in samples if s.watermark is not None]
        pressure = max((s.backpressured_ms_per_s for s in samples), default=0.0)
        return {
            "id": chain.chain_id,
            "name": chain.name,
            "parallelism": p,
            "is_source": chain.is_source,
            "inputs": sorted({e.source_chain for e in chain.inputs}),
            "operators": operators,
            "records_in": head["records_in"],
            "records_out": records_out,
            "records_in_per_s": head["records_in_per_s"],
            "records_out_per_s": out_rate,
            # What the vertex processes: what it reads, or for a source what it emits.
            "rate": out_rate if chain.is_source else head["records_in_per_s"],
            "busy_ms_per_s": max((s.busy_ms_per_s for s in samples), default=0.0),
            "idle_ms_per_s": min((s.idle_ms_per_s for s in samples), default=0.0),
            "backpressured_ms_per_s": pressure,
            "backpressured": pressure >= BACKPRESSURED_MS,
            "queue_fill": max((s.queue_fill for s in samples), default=0.0),
            "watermark": min(marks) if marks and len(marks) == len(samples) else None,
            "watermark_lag_ms": max(lags) if lags else None,
            "state_size": sum(s.state_size for s in samples),
            "subtasks": [s.to_dict() for s in samples],
        }


def job_status(master: Any) -> dict[str, Any]:
    """The job's state, attempt, restarts, uptime and checkpoint figures (``GET /v1/job``).

    Example: ``job_status(master)["checkpoints_completed"]``
    """
    coordinator = master.coordinator
    stats = coordinator.completed_stats if coordinator else []
    latest = coordinator.latest_completed if coordinator else None
    checkpoints = [s for s in stats if s.kind == "checkpoint"]
    last = checkpoints[-1] if checkpoints else None
    end = master.finished_at if master.finished_at is not None else time.time()
    return {
        "job_id": master.job_id,
        "name": master.graph.name,
        "state": master.outcome or master.phase.name,
        "attempt": master.attempt,
        "restarts": max(master.attempt - 1, 0),
        "started_at": master.started_at,
        "finished_at": master.finished_at,
        "uptime_s": end - master.started_at,
        "parallelism": master.graph.parallelism,
        "max_parallelism": master.graph.max_parallelism,
        "checkpoints_completed": len(checkpoints),
        "checkpoints_failed": len(master.metrics.failed_checkpoints()),
        "checkpoints_in_progress": len(coordinator.pending_ids) if coordinator else 0,
        "savepoints_completed": sum(1 for s in stats if s.kind == "savepoint"),
        "last_checkpoint_id": last.checkpoint_id if last else None,
        "last_checkpoint_size": last.state_size if last else None,
        "last_checkpoint_duration_s": last.duration if last else None,
        "last_checkpoint_time": (last.trigger_time + last.duration) if last else None,
        "latest_checkpoint": latest.directory if latest else None,
        "checkpoint_storage": master.storage.job_dir if master.storage else None,
        "failures": [f.splitlines()[0] for f in master.failures],
        # storage_state, storage_unavailable_since, storage_last_error, storage_failures,
        # storage_message (see checkpoint.outage.StorageOutage.status).
        **master.storage_outage.status(),
    }
