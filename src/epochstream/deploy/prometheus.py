"""The job's metrics in the Prometheus text format (``GET /metrics``), via ``prometheus_client``.

A collector reads the job master's status and per-vertex metrics at scrape time; the
format is ``prometheus_client``'s own. Families (labels ``job_id`` on all; ``vertex``
and ``subtask`` on task families, plus ``operator`` on operator families)::

    epochstream_job_info{job_name,state}                 1
    epochstream_job_uptime_seconds                       gauge
    epochstream_job_restarts_total                       counter
    epochstream_job_checkpoints_total{status}            counter (completed, failed)
    epochstream_job_checkpoints_in_progress              gauge
    epochstream_job_last_checkpoint_size_bytes           gauge
    epochstream_job_last_checkpoint_duration_seconds     gauge
    epochstream_operator_records_in_total                counter
    epochstream_operator_records_out_total               counter
    epochstream_operator_records_in_per_second           gauge
    epochstream_operator_records_out_per_second          gauge
    epochstream_operator_late_records_dropped_total      counter
    epochstream_task_busy_time_ms_per_second             gauge
    epochstream_task_idle_time_ms_per_second             gauge
    epochstream_task_backpressured_time_ms_per_second    gauge
    epochstream_task_input_queue_fill_ratio              gauge
    epochstream_task_current_watermark_milliseconds      gauge (tasks with a watermark)
    epochstream_task_watermark_lag_milliseconds          gauge (tasks with a watermark)
    epochstream_task_state_size_bytes                    gauge
    epochstream_task_last_checkpoint_alignment_seconds   gauge (after a checkpoint)
    epochstream_task_last_checkpoint_sync_seconds        gauge
    epochstream_task_last_checkpoint_async_seconds       gauge
    epochstream_task_last_checkpoint_channel_state_bytes gauge (unaligned checkpoints)

Example::

    body = PrometheusExporter(master).render()   # bytes, text format 0.0.4
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

__all__ = ["CONTENT_TYPE", "FAMILIES", "PrometheusExporter"]

CONTENT_TYPE = CONTENT_TYPE_LATEST
_TASK = ["job_id", "vertex", "subtask"]
_OPERATOR = [*_TASK, "operator"]

#: Task gauges: (family suffix, key of the subtask dict, help).
_TASK_GAUGES = [
    ("busy_time_ms_per_second", "busy_ms_per_s", "Milliseconds per second the task worked"),
    ("idle_time_ms_per_second", "idle_ms_per_s", "Milliseconds per second it waited for input"),
    (
        "backpressured_time_ms_per_second",
        "backpressured_ms_per_s",
        "Milliseconds per second it waited for room downstream",
    ),
    ("input_queue_fill_ratio", "queue_fill", "Share of the input queues' capacity in use"),
    ("current_watermark_milliseconds", "watermark", "The task's current event-time watermark"),
    ("watermark_lag_milliseconds", "watermark_lag_ms", "Wall-clock time minus the watermark"),
    ("state_size_bytes", "state_size", "State size of the task at its last checkpoint"),
    (
        "last_checkpoint_alignment_seconds",
        "checkpoint_alignment_s",
        "Barrier alignment of the last checkpoint",
    ),
    (
        "last_checkpoint_sync_seconds",
        "checkpoint_sync_s",
        "Synchronous part of the last checkpoint",
    ),
    (
        "last_checkpoint_async_seconds",
        "checkpoint_async_s",
        "Asynchronous part of the last checkpoint",
    ),
    (
        "last_checkpoint_channel_state_bytes",
        "checkpoint_channel_state_bytes",
        "In-flight records the last checkpoint kept (unaligned; 0 when aligned)",
    ),
]

#: Every family name as a scrape shows it (without the ``_total`` of counters' samples).
FAMILIES = [
    "epochstream_job_info",
    "epochstream_job_uptime_seconds",
    "epochstream_job_restarts",
    "epochstream_job_checkpoints",
    "epochstream_job_checkpoints_in_progress",
    "epochstream_job_last_checkpoint_size_bytes",
    "epochstream_job_last_checkpoint_duration_seconds",
    "epochstream_operator_records_in",
    "epochstream_operator_records_out",
    "epochstream_operator_records_in_per_second",
    "epochstream_operator_records_out_per_second",
    "epochstream_operator_late_records_dropped",
    *(f"epochstream_task_{name}" for name, _, _ in _TASK_GAUGES),
]


class _JobCollector(Collector):
    def __init__(self, master: Any) -> None:
        self.master = master

    def collect(self) -> Iterator[Metric]:
        status = self.master.status()
        job = status["job_id"]
        yield from self._job(status, job)
        vertices = self.master.metrics.vertices()
        yield from self._operators(vertices, job)
        yield from self._tasks(vertices, job)

    def _job(self, status: dict[str, Any], job: str) -> Iterator[Metric]:
        info = GaugeMetricFamily(
            "epochstream_job_info",
            "The job's name and state",
            labels=["job_id", "job_name", "state"],
        )
        info.add_metric([job, status["name"], status["state"]], 1)
        yield info
        yield _one(
            GaugeMetricFamily,
            "job_uptime_seconds",
            "Seconds since the job started",
            job,
            status["uptime_s"],
        )
        yield _one(
            CounterMetricFamily, "job_restarts", "Restarts of the job", job, status["restarts"]
        )
        checkpoints = CounterMetricFamily(
            "epochstream_job_checkpoints", "Checkpoints by outcome", labels=["job_id", "status"]
        )
        checkpoints.add_metric([job, "completed"], status["checkpoints_completed"])
        checkpoints.add_metric([job, "failed"], status["checkpoints_failed"])
        yield checkpoints
        yield _one(
            GaugeMetricFamily,
            "job_checkpoints_in_progress",
            "Checkpoints triggered and not yet completed or aborted",
            job,
            status["checkpoints_in_progress"],
        )
        for name, key, doc in (
            (
                "job_last_checkpoint_size_bytes",
                "last_checkpoint_size",
                "State size of the last checkpoint",
            ),
            (
                "job_last_checkpoint_duration_seconds",
                "last_checkpoint_duration_s",
                "Duration of the last checkpoint",
            ),
        ):
            family = GaugeMetricFamily(f"epochstream_{name}", doc, labels=["job_id"])
            if status[key] is not None:
                family.add_metric([job], status[key])
            yield family

    def _operators(self, vertices: list[dict[str, Any]], job: str) -> Iterator[Metric]:
        families: dict[str, Any] = {
            "records_in": CounterMetricFamily(
                "epochstream_operator_records_in", "Records into the operator", labels=_OPERATOR
            ),
            "records_out": CounterMetricFamily(
                "epochstream_operator_records_out", "Records the operator emitted", labels=_OPERATOR
            ),
            "records_in_per_s": GaugeMetricFamily(
                "epochstream_operator_records_in_per_second",
                "Records in per second",
                labels=_OPERATOR,
            ),
            "records_out_per_s": GaugeMetricFamily(
                "epochstream_operator_records_out_per_second",
                "Records out per second",
                labels=_OPERATOR,
            ),
            "late_records_dropped": CounterMetricFamily(
                "epochstream_operator_late_records_dropped",
                "Late records dropped: their windows had fired, and no late side output took them",
                labels=_OPERATOR,
            ),
        }
        for vertex in vertices:
            for sub in vertex["subtasks"]:
                for op in sub["operators"]:
                    labels = [job, vertex["id"], str(sub["subtask"]), op["uid"]]
                    for key, family in families.items():
                        family.add_metric(labels, op[key])
        yield from families.values()

    def _tasks(self, vertices: list[dict[str, Any]], job: str) -> Iterator[Metric]:
        for name, key, doc in _TASK_GAUGES:
            family = GaugeMetricFamily(f"epochstream_task_{name}", doc, labels=_TASK)
            for vertex in vertices:
                for sub in vertex["subtasks"]:
                    if sub[key] is not None:
                        family.add_metric([job, vertex["id"], str(sub["subtask"])], sub[key])
            yield family


def _one(kind: Any, name: str, doc: str, job: str, value: float) -> Metric:
    family: Any = kind(f"epochstream_{name}", doc, labels=["job_id"])
    family.add_metric([job], value)
    return family


class PrometheusExporter:
    """Renders one job master's metrics for a scrape.

    Example: ``PrometheusExporter(master).render().decode().startswith("# HELP")``
    """

    def __init__(self, master: Any) -> None:
        self._registry = CollectorRegistry(auto_describe=False)
        self._registry.register(_JobCollector(master))

    def render(self) -> bytes:
        """The current metrics in the Prometheus text format."""
        return generate_latest(self._registry)
