"""The job master's HTTP endpoint: REST API, Prometheus metrics, dashboard, control.

Served by the driver on loopback by default (``Environment(endpoint_host=...)``).
Every API request must carry ``Authorization: Bearer <token>``, the job's random token,
which only the user running the job can read (the job registry, ``0600``). Routes::

    GET  /v1/jobs                          the jobs of this endpoint (one): id, name, state
    GET  /v1/job                           status (state, attempt, restarts, uptime,
    GET  /v1/jobs/<job id>                   checkpoint counts...) and the graph
    GET  /v1/job/vertices                  per-vertex metrics with their subtasks
    GET  /v1/job/vertices/<vertex id>      one vertex
    GET  /v1/job/history                   per-vertex rates and watermark lag over time
    GET  /v1/checkpoints                   counts, completed checkpoints (per-task
                                             details), failed ones, ids in progress
    GET  /v1/exceptions                    failed attempts: time, message, traceback
    GET  /v1/config                        the job's configuration (no credentials)
    GET  /metrics                          Prometheus text format (see deploy.prometheus)
    POST /v1/savepoints  {"directory": D}  take a savepoint (waits); {"path": ...}
    POST /v1/cancel      {"savepoint": D}  cancel, or stop with a savepoint; {"path": ...}
    GET  /dashboard/                       the web dashboard (static files, no token)

The dashboard's files hold no job data and are served without the token; the page
reads the token from its URL *fragment* (``/dashboard/#token=...``), which browsers
never send to the server, keeps it in the tab's ``sessionStorage`` and sends it as the
bearer token with every API call, so it never reaches a server log or a Referer.

Errors are JSON ``{"error": "..."}`` with 400 (bad request), 401 (no or wrong token),
404 (no such route) or 409 (the job cannot do it now).

Example::

    endpoint = JobEndpoint(master, host="127.0.0.1", token=secrets.token_urlsafe(32))
    endpoint.start(); endpoint.url          # "http://127.0.0.1:40123"
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any

from epochstream.deploy.registry import JobEntry, register
from epochstream.exceptions import CheckpointError

__all__ = ["JobEndpoint"]

log = logging.getLogger(__name__)
_MAX_BODY = 1 << 16
_SAVEPOINT_TIMEOUT = 600.0
_STATIC_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".txt": "text/plain; charset=utf-8",
}


def _static_files() -> dict[str, bytes]:
    """The dashboard's files (shipped in the package), by name."""
    root = resources.files("epochstream.dashboard")
    return {
        f.name: f.read_bytes()
        for f in root.iterdir()
        if f.is_file() and any(f.name.endswith(ext) for ext in _STATIC_TYPES)
    }


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("endpoint: " + format, *args)

    def _reply(self, status: int, body: dict[str, Any]) -> None:
        self._send(status, json.dumps(body, default=str).encode("utf-8"), "application/json")

    def _send(self, status: int, data: bytes, content_type: str, *, cache: bool = False) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "max-age=300" if cache else "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.end_headers()
        self.wfile.write(data)

    def _authorized(self) -> bool:
        given = self.headers.get("Authorization", "")
        expected = f"Bearer {self.server.token}"
        if hmac.compare_digest(given.encode(), expected.encode()):
            return True
        self._reply(401, {"error": "missing or wrong bearer token"})
        return False

    def _body(self) -> dict[str, Any] | None:
        length = int(self.headers.get("Content-Length") or 0)
        if length > _MAX_BODY:
            self._reply(400, {"error": "request body too large"})
            return None
        raw = self.rfile.read(length) if length else b"{}"
        try:
            body = json.loads(raw or b"{}")
        except ValueError as exc:
            self._reply(400, {"error": f"body is not JSON: {exc}"})
            return None
        if not isinstance(body, dict):
            self._reply(400, {"error": "body must be a JSON object"})
            return None
        return body

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path in ("/", "/dashboard"):
            self.send_response(302)
            self.send_header("Location", "/dashboard/")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if path.startswith("/dashboard/"):
            self._static(path.removeprefix("/dashboard/") or "index.html")
            return
        if not self._authorized():
            return
        views = self.server.views
        if path == "/metrics":
            body, content_type = self.server.scrape()
            self._send(200, body, content_type)
            return
        if path.startswith("/v1/job/vertices/"):
            vertex = views.vertex(path.removeprefix("/v1/job/vertices/"))
            if vertex is None:
                self._reply(404, {"error": f"no vertex {path.rsplit('/', 1)[-1]!r}"})
            else:
                self._reply(200, vertex)
            return
        if path.startswith("/v1/jobs/"):
            job = path.removeprefix("/v1/jobs/")
            if job != views.master.job_id:
                self._reply(404, {"error": f"no job {job!r} at this endpoint"})
                return
            path = "/v1/job"
        route = views.routes.get(path)
        if route is None:
            self._reply(404, {"error": f"no route GET {path}"})
        else:
            self._reply(200, route())

    def _static(self, name: str) -> None:
        files = self.server.static
        if name not in files:
            self._reply(404, {"error": f"no dashboard file {name!r}"})
            return
        suffix = name[name.rfind(".") :]
        self._send(200, files[name], _STATIC_TYPES[suffix], cache=name != "index.html")

    def do_POST(self) -> None:
        if not self._authorized():
            return
        body = self._body()
        if body is None:
            return
        master = self.server.master
        if self.path == "/v1/savepoints":
            directory = body.get("directory")
            self._savepoint(master, directory, terminate=False)
        elif self.path == "/v1/cancel":
            directory = body.get("savepoint")
            if directory is None:
                master.cancel()
                self._reply(200, {"cancelled": True})
            else:
                self._savepoint(master, directory, terminate=True)
        else:
            self._reply(404, {"error": f"no route POST {self.path}"})

    def _savepoint(self, master: Any, directory: Any, *, terminate: bool) -> None:
        if directory is not None and not isinstance(directory, str):
            self._reply(400, {"error": "directory must be a string"})
            return
        try:
            path = master.request_savepoint(directory, terminate=terminate).wait(_SAVEPOINT_TIMEOUT)
        except (CheckpointError, TimeoutError) as exc:
            self._reply(409, {"error": str(exc)})
            return
        self._reply(200, {"path": path})


_POLL_INTERVAL = 0.02


class _Views:
    """What each GET route answers (JSON-ready dicts) from the job master's state."""

    def __init__(self, master: Any) -> None:
        self.master = master
        self.routes = {
            "/v1/jobs": self.jobs,
            "/v1/job": self.job,
            "/v1/job/vertices": self.vertices,
            "/v1/job/history": self.history,
            "/v1/checkpoints": self.checkpoints,
            "/v1/exceptions": self.exceptions,
            "/v1/config": self.config,
        }

    def jobs(self) -> dict[str, Any]:
        status = self.master.status()
        keys = ("job_id", "name", "state", "started_at", "finished_at", "restarts")
        return {"jobs": [{k: status[k] for k in keys}]}

    def job(self) -> dict[str, Any]:
        graph = self.master.graph
        vertices = [
            {
                "id": c.chain_id,
                "name": c.name,
                "parallelism": graph.parallelism,
                "is_source": c.is_source,
                "operators": [{"uid": op.uid, "name": op.name, "kind": op.kind} for op in c.operators],
            }
            for c in graph.chains
        ]
        edges = [
            {"source": e.source_chain, "target": e.target_chain, "partitioning": e.partitioning.kind}
            for e in graph.edges
        ]
        return {**self.master.status(), "graph": {"vertices": vertices, "edges": edges}}

    def vertices(self) -> dict[str, Any]:
        return {"vertices": self.master.metrics.vertices()}

    def vertex(self, vertex_id: str) -> dict[str, Any] | None:
        return next((v for v in self.master.metrics.vertices() if v["id"] == vertex_id), None)

    def history(self) -> dict[str, Any]:
        return {"points": self.master.metrics.history()}

    def checkpoints(self) -> dict[str, Any]:
        master = self.master
        coordinator = master.coordinator
        stats = coordinator.completed_stats if coordinator else []
        status = master.status()
        return {
            "counts": {
                "completed": status["checkpoints_completed"],
                "failed": status["checkpoints_failed"],
                "in_progress": status["checkpoints_in_progress"],
                "savepoints": status["savepoints_completed"],
            },
            "checkpoints": [s.to_dict() for s in stats],
            "failed": master.metrics.failed_checkpoints(),
            "in_progress": coordinator.pending_ids if coordinator else [],
        }

    def exceptions(self) -> dict[str, Any]:
        return {"exceptions": self.master.metrics.exceptions()}

    def config(self) -> dict[str, Any]:
        env, graph = self.master.env, self.master.graph
        checkpointing = None
        config = self.master.checkpoint_config
        if config is not None:
            checkpointing = {
                "interval_s": config.interval,
                "mode": config.mode,
                "storage": config.storage_location,
                "timeout_s": config.timeout,
                "min_pause_s": config.min_pause,
                "max_concurrent": config.max_concurrent,
                "tolerable_failures": config.tolerable_failures,
                "retained": config.retained,
                "savepoint_dir": config.savepoint_dir,
                # Object-store credentials stay out of the API.
                "storage_options": "<set>" if config.storage_options else None,
            }
        return {
            "job_name": graph.name,
            "runner": env.runner,
            "parallelism": graph.parallelism,
            "max_parallelism": graph.max_parallelism,
            "batch_size": graph.batch_size,
            "buffer_timeout_s": graph.buffer_timeout,
            "auto_watermark_interval_ms": graph.auto_watermark_interval,
            "heartbeat_interval_s": env.heartbeat_interval,
            "heartbeat_timeout_s": env.heartbeat_timeout,
            "metrics_interval_s": env.metrics_interval,
            "endpoint_linger_s": env.endpoint_linger,
            "restart_strategy": env.restart_strategy.describe(),
            "state_backend": type(env.state_backend).__name__,
            "checkpointing": checkpointing,
        }


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], master: Any, token: str) -> None:
        super().__init__(address, _Handler)
        self.master = master
        self.token = token
        self.views = _Views(master)
        self._exporter: Any = None
        self._exporter_lock = threading.Lock()
        self.static = _static_files()


    def scrape(self) -> tuple[bytes, str]:
        """The Prometheus text and its content type."""
        # prometheus_client takes ~60 ms to import: only a job that is scraped pays it
        # (every process imports this module, slots included).
        from epochstream.deploy.prometheus import CONTENT_TYPE, PrometheusExporter

        with self._exporter_lock:
            if self._exporter is None:
                self._exporter = PrometheusExporter(self.master)
        return self._exporter.render(), CONTENT_TYPE


class JobEndpoint:
    """Serves one job master over HTTP on its own thread."""

    def __init__(self, master: Any, *, host: str, token: str, port: int = 0) -> None:
        self._server = _Server((host, port), master, token)
        self.token = token
        bound_host, bound_port = self._server.server_address[:2]
        shown = bound_host.decode() if isinstance(bound_host, bytes) else bound_host
        self.url = f"http://{shown}:{bound_port}"
        #: The dashboard with the token in the URL fragment (never sent to the server).
        self.dashboard_url = f"{self.url}/dashboard/#token={token}"
        # shutdown() waits for the serve loop's next poll: a short poll keeps
        # execute() from returning up to half a second late.
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": _POLL_INTERVAL},
            name="job-endpoint",
            daemon=True,
        )

    def start(self) -> None:
        """Start serving."""
        self._thread.start()

    def announce(self, job_id: str, name: str, started_at: float) -> None:
        """Start serving and list the job in this user's registry (for the CLI)."""
        self.start()
        register(
            JobEntry(
                job_id=job_id,
                name=name,
                endpoint=self.url,
                token=self.token,
                pid=os.getpid(),
                started_at=started_at,
            )
        )
        log.info("job %s (%s): endpoint %s", job_id, name, self.url)

    def close(self) -> None:
        """Stop serving and release the port."""
        self._server.shutdown()
        self._server.server_close()

    def close_after(self, seconds: float) -> None:
        """Keep serving (the job's final state) for ``seconds``, then close; the timer is
        a daemon thread, so a driver that exits sooner takes the endpoint with it."""
        if seconds <= 0:
            self.close()
            return
        timer = threading.Timer(seconds, self.close)
        timer.daemon = True
        timer.name = "job-endpoint-linger"
        timer.start()
