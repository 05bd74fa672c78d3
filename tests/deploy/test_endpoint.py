"""The job endpoint's REST API and /metrics, against a real job on the local runner.

One job runs for the module: checkpoints every 0.3 s, and its map fails once after the
first checkpoint, so the exception history and a restart are there to see.
"""

from __future__ import annotations

import json
import operator
import os
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

import epochstream as es
from epochstream.deploy.prometheus import FAMILIES

pytestmark = pytest.mark.slow

API_ROUTES = [
    "/v1/jobs",
    "/v1/job",
    "/v1/job/vertices",
    "/v1/job/history",
    "/v1/checkpoints",
    "/v1/exceptions",
    "/v1/config",
    "/metrics",
]


def _call(
    url: str, token: str | None, method: str = "GET", body: bytes | None = None
) -> tuple[int, bytes, str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(url, headers=headers, method=method, data=body)
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, reply.read(), reply.headers.get("Content-Type", "")
    except urllib.error.HTTPError as err:
        return err.code, err.read(), err.headers.get("Content-Type", "")


class _Job:
    def __init__(self, client: es.JobClient) -> None:
        self.client = client
        master = client._master  # the token lives in the registry entry; same object
        assert master.endpoint is not None
        self.url = master.endpoint.url
        self.token = master.endpoint.token

    def get(self, path: str) -> Any:
        status, body, kind = _call(self.url + path, self.token)
        assert status == 200, (path, status, body[:300])
        assert kind == "application/json"
        return json.loads(body)


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Job]:
    tmp: Path = tmp_path_factory.mktemp("endpoint")
    env = es.Environment(parallelism=2, runner="local", metrics_interval=0.2)
    env.enable_checkpointing(0.3, storage=str(tmp / "ckpt"))
    env.set_restart_strategy(es.restart.fixed_delay(attempts=3, delay=0.1))
    injector = es.testing.FailOnce(after_records=200, after_checkpoints=1, marker_dir=str(tmp))
    (
        env.from_sequence(0, 10**8, rate=2_000)
        .name("numbers")
        .map(injector)
        .name("fail-once")
        .key_by(operator.methodcaller("__mod__", 7))
        .reduce(operator.add)
        .name("sum")
        .sink_to(es.sinks.DiscardSink())
        .name("drop")
    )
    client = env.execute_async("endpoint-api")
    try:
        deadline = time.monotonic() + 120
        while client.attempt < 2 or len(client.completed_checkpoints()) < 3:
            assert time.monotonic() < deadline, client.status()
            assert not client.done, client.status()
            time.sleep(0.1)
        while not any(v["records_in"] for v in client.metrics() if not v["is_source"]):
            assert time.monotonic() < deadline, client.metrics()
            time.sleep(0.1)
        yield _Job(client)
    finally:
        if not client.done:
            client.cancel()
            with pytest.raises(es.JobCancelled):
                client.result(timeout=60)


@pytest.mark.parametrize("path", API_ROUTES)
def test_refuses_requests_without_the_right_token(job: _Job, path: str) -> None:
    for token in (None, "wrong-" + job.token):
        status, body, _ = _call(job.url + path, token)
        assert status == 401, (path, status)
        assert json.loads(body) == {"error": "missing or wrong bearer token"}
    assert _call(job.url + "/v1/cancel", None, method="POST")[0] == 401
    assert not job.client.done


def test_jobs_and_job_with_its_graph(job: _Job) -> None:
    jobs = job.get("/v1/jobs")["jobs"]
    assert [j["job_id"] for j in jobs] == [job.client.job_id]
    assert set(jobs[0]) == {"job_id", "name", "state", "started_at", "finished_at", "restarts"}
    detail = job.get("/v1/job")
    assert detail == {**detail, "name": "endpoint-api", "state": "RUNNING", "parallelism": 2}
    assert detail["restarts"] >= 1 and detail["uptime_s"] > 0
    assert detail["checkpoints_completed"] >= 3
    for key in ("checkpoints_failed", "checkpoints_in_progress", "last_checkpoint_size"):
        assert isinstance(detail[key], int)
    assert detail["last_checkpoint_duration_s"] > 0
    graph = detail["graph"]
    names = [v["name"] for v in graph["vertices"]]
    assert names == ["numbers -> fail-once", "sum -> drop"]
    assert all(v["parallelism"] == 2 for v in graph["vertices"])
    source, keyed = graph["vertices"]
    assert graph["edges"] == [
        {"source": source["id"], "target": keyed["id"], "partitioning": "hash"}
    ]
    assert [op["name"] for op in source["operators"]] == ["numbers", "fail-once"]
    assert job.get(f"/v1/jobs/{job.client.job_id}")["job_id"] == job.client.job_id
    assert _call(job.url + "/v1/jobs/nope", job.token)[0] == 404


def test_vertex_metrics(job: _Job) -> None:
    vertices = job.get("/v1/job/vertices")["vertices"]
    source, keyed = vertices
    assert source["records_out"] > 0 and source["rate"] > 0
    assert keyed["records_in"] > 0
    for vertex in vertices:
        assert {
            "busy_ms_per_s",
            "idle_ms_per_s",
            "backpressured_ms_per_s",
            "backpressured",
            "queue_fill",
            "watermark",
            "watermark_lag_ms",
            "state_size",
        } <= set(vertex)
        assert len(vertex["subtasks"]) == 2
        sub = vertex["subtasks"][0]
        assert 0 <= sub["busy_ms_per_s"] <= 1000 and 0 <= sub["queue_fill"] <= 1
        assert {op["uid"] for op in sub["operators"]} == {op["uid"] for op in vertex["operators"]}
    assert keyed["state_size"] > 0  # the reduce's keyed state, as of the last checkpoint
    assert keyed["subtasks"][0]["checkpoint_sync_s"] is not None
    one = job.get(f"/v1/job/vertices/{keyed['id']}")
    assert one["id"] == keyed["id"] and one["name"] == "sum -> drop"
    assert _call(job.url + "/v1/job/vertices/nope", job.token)[0] == 404
    points = job.get("/v1/job/history")["points"]
    assert points and set(points[-1]) == {"time", "rates", "watermark_lag_ms"}
    assert set(points[-1]["rates"]) == {source["id"], keyed["id"]}


def test_checkpoint_history_with_per_task_details(job: _Job) -> None:
    reply = job.get("/v1/checkpoints")
    assert set(reply["counts"]) == {"completed", "failed", "in_progress", "savepoints"}
    assert reply["counts"]["completed"] >= 3
    last = reply["checkpoints"][-1]
    assert {"checkpoint_id", "trigger_time", "duration", "state_size", "tasks"} <= set(last)
    assert len(last["tasks"]) == 4  # 2 vertices x parallelism 2
    task = next(iter(last["tasks"].values()))
    assert set(task) == {
        "alignment_s",
        "sync_s",
        "async_s",
        "state_size",
        "unaligned",
        "channel_state_bytes",
    }
    assert isinstance(reply["failed"], list) and isinstance(reply["in_progress"], list)


def test_exception_history_has_the_traceback(job: _Job) -> None:
    exceptions = job.get("/v1/exceptions")["exceptions"]
    assert len(exceptions) >= 1
    first = exceptions[0]
    assert first["attempt"] == 1 and first["time"] > 0
    assert "injected failure" in first["message"]
    assert "Traceback" in first["traceback"]


def test_config_names_the_settings_and_hides_credentials(job: _Job) -> None:
    config = job.get("/v1/config")
    assert config["parallelism"] == 2 and config["runner"] == "local"
    assert config["metrics_interval_s"] == 0.2
    assert config["checkpointing"]["interval_s"] == 0.3
    assert config["checkpointing"]["storage_options"] is None
    assert config["checkpointing"]["unaligned"] is False
    assert config["endpoint_savepoints_anywhere"] is False
    assert "fixed_delay" in config["restart_strategy"]


def test_metrics_parse_and_hold_the_documented_families(job: _Job) -> None:
    status, body, kind = _call(job.url + "/metrics", job.token)
    assert status == 200 and kind.startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    assert set(FAMILIES) <= set(families), set(FAMILIES) - set(families)
    records_in = families["epochstream_operator_records_in"]
    assert records_in.type == "counter"
    sums = {}
    for sample in records_in.samples:
        if sample.name.endswith("_total"):
            uid = sample.labels["operator"]
            sums[uid] = sums.get(uid, 0) + sample.value
            assert sample.labels["job_id"] == job.client.job_id
    assert sums and max(sums.values()) > 0
    restarts = families["epochstream_job_restarts"].samples[0]
    assert restarts.name == "epochstream_job_restarts_total" and restarts.value >= 1
    done = {
        s.labels["status"]: s.value
        for s in families["epochstream_job_checkpoints"].samples
        if s.name.endswith("_total")
    }
    assert done["completed"] >= 3


def test_unknown_routes_are_404(job: _Job) -> None:
    status, body, _ = _call(job.url + "/v1/nothing", job.token)
    assert status == 404 and "no route" in json.loads(body)["error"]


def _raw(job: _Job, request: bytes) -> bytes:
    host, port = job.url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(request)
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    return reply


def test_bad_bodies_answer_400_or_413_with_the_connection_intact(job: _Job) -> None:
    for body, error in (
        (b"{not json", "body is not JSON"),
        (b"[1, 2]", "body must be a JSON object"),
        (b"\xff\xfe", "body is not JSON"),
    ):
        status, reply, _ = _call(job.url + "/v1/savepoints", job.token, "POST", body)
        assert status == 400 and error in json.loads(reply)["error"], (body, reply)
    status, reply, _ = _call(job.url + "/v1/savepoints", job.token, "POST", b" " * (65 * 1024))
    assert status == 413, reply
    head = f"POST /v1/savepoints HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {job.token}\r\n"
    reply = _raw(job, (head + "Content-Length: -1\r\n\r\n").encode())
    assert reply.startswith(b"HTTP/1.1 400 ") and b"bad Content-Length" in reply, reply
    # A body announced over the limit is refused before the server reads any of it.
    reply = _raw(job, (head + "Content-Length: 100000000\r\n\r\n").encode())
    assert reply.startswith(b"HTTP/1.1 413 "), reply
    assert not job.client.done


def test_savepoint_targets_are_confined_to_the_savepoint_root(job: _Job) -> None:
    for outside in ("../escape", "/tmp/elsewhere", "s3://other-bucket/sp", "~/sp"):
        body = json.dumps({"directory": outside}).encode()
        status, reply, _ = _call(job.url + "/v1/savepoints", job.token, "POST", body)
        assert status == 403 and "outside the savepoint root" in json.loads(reply)["error"], reply
    body = json.dumps({"directory": "nightly"}).encode()
    status, reply, _ = _call(job.url + "/v1/savepoints", job.token, "POST", body)
    assert status == 200, reply
    root = job.client._master.checkpoint_config.savepoint_location
    assert json.loads(reply)["path"].startswith(os.path.join(root, "nightly", "savepoint-"))


def test_the_final_state_stays_served_after_the_job_ends(job: _Job) -> None:
    job.client.cancel()
    with pytest.raises(es.JobCancelled):
        job.client.result(timeout=60)
    detail = job.get("/v1/job")
    assert detail["state"] == "CANCELED" and detail["finished_at"] is not None
    assert job.get("/v1/job/vertices")["vertices"][0]["records_out"] > 0
    # Control answers at once that the job has ended (no 600 s wait, no false "cancelled").
    started = time.monotonic()
    for path, body in (
        ("/v1/savepoints", {}),
        ("/v1/cancel", {}),
        ("/v1/cancel", {"savepoint": "x"}),
    ):
        status, reply, _ = _call(job.url + path, job.token, "POST", json.dumps(body).encode())
        assert status == 409, (path, reply)
        assert json.loads(reply) == {"error": f"job {job.client.job_id} has ended (CANCELED)"}
    assert time.monotonic() - started < 5
