"""JobMetrics: per-vertex aggregation of task samples, history, exceptions (fake samples)."""

from __future__ import annotations

from epochstream.deploy.metrics import JobMetrics
from epochstream.graph.jobgraph import ChainSpec, JobEdge, JobGraph, OperatorSpec, OutputSpec
from epochstream.graph.transformations import Partitioning
from epochstream.runtime.metrics import OperatorSample, TaskMetricsSample


def _graph() -> JobGraph:
    edge = JobEdge(1, "src", "map", "main", "sink", Partitioning(kind="rebalance"))
    src = ChainSpec(
        "src",
        [
            OperatorSpec("numbers", "numbers", "source", None, outputs=[OutputSpec("main", "map")]),
            OperatorSpec("map", "map", "map", None, outputs=[OutputSpec("main", edge_id=1)]),
        ],
    )
    sink = ChainSpec("sink", [OperatorSpec("out", "out", "sink", None)], inputs=[edge])
    return JobGraph("g", [src, sink], [edge], parallelism=2, max_parallelism=128)


def _sample(
    chain: str,
    subtask: int,
    ops: list[tuple[str, int, int, float]],
    *,
    pressure: float = 0.0,
    watermark: int | None = None,
    lag: float | None = None,
) -> TaskMetricsSample:
    return TaskMetricsSample(
        task=(chain, subtask),
        operators=[
            OperatorSample(uid, uid, i, o, i / 2, rate, watermark) for uid, i, o, rate in ops
        ],
        busy_ms_per_s=1000.0 - pressure,
        idle_ms_per_s=0.0,
        backpressured_ms_per_s=pressure,
        queue_fill=0.5 * subtask,
        watermark=watermark,
        watermark_lag_ms=lag,
        state_size=100 * (subtask + 1),
    )


def test_vertices_add_counts_and_take_the_worst_subtask() -> None:
    metrics = JobMetrics(_graph())
    metrics.record(
        [
            _sample("src", 0, [("numbers", 0, 10, 5.0), ("map", 10, 10, 5.0)], pressure=800.0),
            _sample("src", 1, [("numbers", 0, 20, 7.0), ("map", 20, 20, 7.0)], pressure=100.0),
            _sample("sink", 0, [("out", 12, 0, 0.0)], watermark=1000, lag=50.0),
            _sample("sink", 1, [("out", 18, 0, 0.0)], watermark=900, lag=150.0),
        ],
        wall=10.0,
    )
    src, sink = metrics.vertices()
    assert src["name"] == "numbers -> map" and src["is_source"]
    assert (src["records_in"], src["records_out"]) == (0, 30)
    assert src["rate"] == 12.0  # a source's rate: what it emits
    assert src["backpressured_ms_per_s"] == 800.0 and src["backpressured"]
    assert [op["records_out"] for op in src["operators"]] == [30, 30]
    assert (sink["records_in"], sink["records_out"]) == (30, 0)
    assert sink["inputs"] == ["src"] and not sink["backpressured"]
    assert (sink["watermark"], sink["watermark_lag_ms"]) == (900, 150.0)
    assert sink["queue_fill"] == 0.5 and sink["state_size"] == 300
    assert len(sink["subtasks"]) == 2
    assert metrics.history()[0]["rates"] == {"src": 12.0, "sink": 15.0}
    assert metrics.history()[0]["watermark_lag_ms"] == 150.0


def test_history_takes_one_point_a_second_and_is_bounded() -> None:
    metrics = JobMetrics(_graph(), history_points=3)
    for t in (0.0, 0.5, 1.0, 2.0, 3.0, 4.0):
        metrics.record([], wall=t)
    assert [p["time"] for p in metrics.history()] == [2.0, 3.0, 4.0]


def test_a_new_attempt_forgets_the_old_tasks() -> None:
    metrics = JobMetrics(_graph())
    metrics.record([_sample("sink", 0, [("out", 5, 0, 0.0)])], wall=1.0)
    metrics.new_attempt()
    assert metrics.vertices()[1]["records_in"] == 0 and metrics.vertices()[1]["subtasks"] == []


def test_exception_and_failed_checkpoint_history() -> None:
    metrics = JobMetrics(_graph())
    metrics.record_failure(attempt=1, cause="map (1/2): ValueError: bad\nTraceback ...", wall=5.0)
    metrics.record_checkpoint_failure(3, "expired", wall=6.0)
    assert metrics.exceptions() == [
        {
            "time": 5.0,
            "attempt": 1,
            "message": "map (1/2): ValueError: bad",
            "traceback": "Traceback ...",
        }
    ]
    assert metrics.failed_checkpoints() == [{"checkpoint_id": 3, "time": 6.0, "reason": "expired"}]


def test_job_status_says_when_checkpoint_storage_is_unavailable() -> None:
    from types import SimpleNamespace

    from epochstream.checkpoint.outage import StorageOutage
    from epochstream.deploy.attempt import Phase
    from epochstream.deploy.metrics import job_status

    graph = _graph()
    outage = StorageOutage("job-1")
    master = SimpleNamespace(
        coordinator=None,
        storage=None,
        job_id="job-1",
        graph=graph,
        outcome=None,
        phase=Phase.REGISTERING,
        attempt=3,
        started_at=0.0,
        finished_at=None,
        metrics=JobMetrics(graph),
        failures=[],
        storage_outage=outage,
    )
    assert job_status(master)["storage_state"] == "AVAILABLE"
    outage.failed("Connection refused", now=60.0)
    status = job_status(master)
    assert status["storage_state"] == "UNAVAILABLE"
    assert status["storage_unavailable_since"] == 60.0
    assert status["storage_last_error"] == "Connection refused"
    assert (
        "storage unavailable, retrying (since 1970-01-01 00:01:00 UTC" in status["storage_message"]
    )
