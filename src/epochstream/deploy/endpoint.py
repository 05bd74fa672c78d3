"""The job master's HTTP endpoint: REST API, Prometheus metrics, dashboard, control.

Served by the driver on loopback by default (``Environment(endpoint_host=...)``, an
IPv4 or IPv6 address or a host name) by :class:`~epochstream.deploy.http_server.HttpServer`,
which caps connections, deadlines and sizes so hostile local users cannot starve the
job (see that module). Every API request must carry ``Authorization: Bearer <token>``,
the job's random token, which only the user running the job can read (the job
registry, ``0600``), or the dashboard's session cookie. Routes::

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
    POST /v1/dashboard/login               a one-time dashboard login (token only):
                                             {"path": "/dashboard/login?code=...", ...}
    GET  /dashboard/login?code=C           trade the code for the session cookie
    GET  /dashboard/                       the web dashboard (static files, no token)

**Dashboard sign-in.** The token never goes into a URL. ``POST /v1/dashboard/login``
(or :meth:`JobEndpoint.login_url` in the driver) mints a code that is good for one
use within ``LOGIN_CODE_TTL`` seconds; ``GET /dashboard/login?code=...`` trades it for
a session cookie (``HttpOnly``, ``SameSite=Strict``, ``Path=/v1/``, named after the
port since cookies are not port-scoped) and redirects to the dashboard. The session
key is not the token and dies with the endpoint. A cookie-authenticated ``POST`` must
also send ``X-Requested-With: epochstream-dashboard``: another site's page cannot add
that header without a CORS preflight this endpoint never approves.

**Savepoint directories** given over the API resolve as :class:`SavepointTargets`
does: ``~`` expanded, relative to the savepoint root, confined to it unless
``Environment(endpoint_savepoints_anywhere=True)``.

Errors are JSON ``{"error": "..."}`` with 400 (malformed request or body), 401 (no or
wrong credentials), 403 (a savepoint directory outside the root, a cross-site POST),
404 (no such route), 405, 408 (request not received in time), 409 (the job cannot do it
now, or has ended), 413 (body over 64 KiB) or 431 (head over 16 KiB).

Example::

    endpoint = JobEndpoint(master, host="127.0.0.1", token=secrets.token_urlsafe(32))
    endpoint.start(); endpoint.url          # "http://127.0.0.1:40123"
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from importlib import resources
from typing import Any

from epochstream.deploy.http_server import HttpLimits, HttpServer, Request, Response
from epochstream.deploy.job_registry import JobEntry, register
from epochstream.deploy.savepoints import SavepointTargets
from epochstream.exceptions import CheckpointError, ConfigurationError

__all__ = ["Credentials", "JobEndpoint", "LoginCodes"]

log = logging.getLogger(__name__)
_SAVEPOINT_TIMEOUT = 600.0
#: How often a savepoint wait looks whether the job ended under it.
_SAVEPOINT_POLL = 0.25
#: Seconds a dashboard login code stays good (it is also single-use).
LOGIN_CODE_TTL = 120.0
_CSRF_HEADER = "x-requested-with"
_CSRF_VALUE = "epochstream-dashboard"
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


class LoginCodes:
    """Dashboard login codes: random, single-use, good for ``ttl`` seconds (thread-safe).

    At most ``capacity`` are outstanding; issuing more forgets the oldest.

    Example::

        codes = LoginCodes()
        code = codes.issue()
        codes.redeem(code), codes.redeem(code)     # (True, False)
    """

    def __init__(
        self,
        *,
        ttl: float = LOGIN_CODE_TTL,
        capacity: int = 16,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ttl = ttl
        self._capacity = capacity
        self._clock = clock
        self._lock = threading.Lock()
        self._codes: OrderedDict[str, float] = OrderedDict()  # code -> expiry

    def issue(self) -> str:
        """A fresh code."""
        code = secrets.token_urlsafe(24)
        with self._lock:
            self._codes[code] = self._clock() + self._ttl
            while len(self._codes) > self._capacity:
                self._codes.popitem(last=False)
        return code

    def redeem(self, code: str) -> bool:
        """Whether ``code`` is outstanding and unexpired; either way it is used up."""
        now = self._clock()
        with self._lock:
            # compare_digest over every code: how long this takes says nothing about
            # how much of a guess was right.
            match = None
            for known in self._codes:
                if hmac.compare_digest(known.encode(), code.encode("utf-8", "replace")):
                    match = known
            if match is None:
                return False
            expiry = self._codes.pop(match)
        return now < expiry


class Credentials:
    """Checks a request's credentials: the bearer token, or the dashboard's cookie.

    Example::

        creds = Credentials(token="t", session="s", cookie_name="epochstream-8081")
        creds.check(request)      # "token", "cookie" or None
        creds.set_cookie()        # the Set-Cookie value for a signed-in browser
    """

    def __init__(self, *, token: str, session: str, cookie_name: str) -> None:
        self._bearer = f"Bearer {token}".encode()
        self._session = session.encode()
        self.cookie_name = cookie_name

    def check(self, request: Request) -> str | None:
        """``"token"``, ``"cookie"`` or ``None`` (neither proved)."""
        given = request.headers.get("authorization", "")
        if given and hmac.compare_digest(given.encode("utf-8", "replace"), self._bearer):
            return "token"
        cookie = _cookie(request.headers.get("cookie", ""), self.cookie_name)
        if cookie is not None and hmac.compare_digest(
            cookie.encode("utf-8", "replace"), self._session
        ):
            return "cookie"
        return None

    def set_cookie(self) -> str:
        """The ``Set-Cookie`` header value that signs a browser in."""
        return f"{self.cookie_name}={self._session.decode()}; Path=/v1/; HttpOnly; SameSite=Strict"


def _cookie(header: str, name: str) -> str | None:
    # Parsed by hand: http.cookies rejects a whole header for one odd cookie that
    # another local service may have set on the same host.
    for part in header.split(";"):
        key, sep, value = part.strip().partition("=")
        if sep and key == name:
            return value
    return None


class _Refused(Exception):
    """An API answer other than 200, raised by a route."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _Api:
    """Routes one request to its answer (on a server pool thread)."""

    def __init__(
        self, master: Any, credentials: Credentials, codes: LoginCodes, static: dict[str, bytes]
    ) -> None:
        self.master = master
        self.credentials = credentials
        self.codes = codes
        self.static = static
        self.views = _Views(master)
        self._exporter: Any = None
        self._exporter_lock = threading.Lock()

    def handle(self, request: Request) -> Response:
        """The answer to ``request``."""
        path = request.path
        if request.method not in ("GET", "HEAD", "POST"):
            return Response.json(405, {"error": f"method {request.method} not allowed"})
        if request.method != "POST":
            if path in ("/", "/dashboard"):
                return Response(302, b"", [("Location", "/dashboard/")])
            if path == "/dashboard/login":
                return self._login(request)
            if path.startswith("/dashboard/"):
                return self._static(path.removeprefix("/dashboard/") or "index.html")
        how = self.credentials.check(request)
        if how is None:
            return Response.json(401, {"error": "missing or wrong bearer token"})
        try:
            if request.method == "POST":
                if how == "cookie" and request.headers.get(_CSRF_HEADER) != _CSRF_VALUE:
                    raise _Refused(
                        403, f"a POST signed in by cookie must send {_CSRF_HEADER}: {_CSRF_VALUE}"
                    )
                return Response.json(
                    200, self._post(path, _json_body(request), how), authenticated=True
                )
            if path == "/metrics":
                body, content_type = self.scrape()
                return Response(200, body, [("Content-Type", content_type)], authenticated=True)
            return Response.json(200, self._get(path), authenticated=True)
        except _Refused as refused:
            return Response.json(refused.status, {"error": str(refused)}, authenticated=True)

    # ------------------------------------------------------------------ GET

    def _get(self, path: str) -> dict[str, Any]:
        views = self.views
        if path.startswith("/v1/job/vertices/"):
            vertex = views.vertex(path.removeprefix("/v1/job/vertices/"))
            if vertex is None:
                raise _Refused(404, f"no vertex {path.rsplit('/', 1)[-1]!r}")
            return vertex
        if path.startswith("/v1/jobs/"):
            job = path.removeprefix("/v1/jobs/")
            if job != views.master.job_id:
                raise _Refused(404, f"no job {job!r} at this endpoint")
            path = "/v1/job"
        route = views.routes.get(path)
        if route is None:
            raise _Refused(404, f"no route GET {path}")
        return route()

    def _static(self, name: str) -> Response:
        if name not in self.static:
            return Response.json(404, {"error": f"no dashboard file {name!r}"})
        suffix = name[name.rfind(".") :]
        headers = [("Content-Type", _STATIC_TYPES[suffix])]
        if name != "index.html":
            headers.append(("Cache-Control", "max-age=300"))
        return Response(200, self.static[name], headers)

    def _login(self, request: Request) -> Response:
        code = (request.query.get("code") or [""])[0]
        if not code or not self.codes.redeem(code):
            return Response.json(
                401,
                {
                    "error": "this dashboard login is used up or expired: get a new one with "
                    "`epochstream status JOB_ID --open` (or --dashboard)"
                },
            )
        headers = [
            ("Location", "/dashboard/"),
            ("Set-Cookie", self.credentials.set_cookie()),
            ("Referrer-Policy", "no-referrer"),
        ]
        return Response(303, b"", headers, authenticated=True)

    # ------------------------------------------------------------------ POST

    def _post(self, path: str, body: dict[str, Any], how: str) -> dict[str, Any]:
        master = self.master
        if path == "/v1/dashboard/login":
            if how != "token":
                raise _Refused(403, "a dashboard login is minted with the bearer token only")
            return {
                "path": f"/dashboard/login?code={self.codes.issue()}",
                "expires_in_s": LOGIN_CODE_TTL,
            }
        if path not in ("/v1/savepoints", "/v1/cancel"):
            raise _Refused(404, f"no route POST {path}")
        self._check_running()
        if path == "/v1/savepoints":
            return self._savepoint(body.get("directory"), terminate=False)
        directory = body.get("savepoint")
        if directory is None:
            master.cancel()
            return {"cancelled": True}
        return self._savepoint(directory, terminate=True)

    def _check_running(self) -> None:
        master = self.master
        if master.finished_at is not None:
            raise _Refused(409, f"job {master.job_id} has ended ({master.outcome})")

    def _savepoint(self, directory: Any, *, terminate: bool) -> dict[str, Any]:
        if directory is not None and not isinstance(directory, str):
            raise _Refused(400, "directory must be a string")
        master = self.master
        config = master.checkpoint_config
        if config is not None:
            anywhere = master.description.endpoint_savepoints_anywhere
            try:
                directory = SavepointTargets(config.savepoint_location, anywhere=anywhere).resolve(
                    directory
                )
            except ConfigurationError as exc:
                raise _Refused(403, str(exc)) from exc
        request = master.request_savepoint(directory, terminate=terminate)
        deadline = time.monotonic() + _SAVEPOINT_TIMEOUT
        while True:
            try:
                return {"path": request.wait(_SAVEPOINT_POLL)}
            except CheckpointError as exc:
                raise _Refused(409, str(exc)) from exc
            except TimeoutError as exc:
                # A job that ends while the request waits in its queue never answers it.
                if master.finished_at is not None and not request.done:
                    raise _Refused(
                        409, f"job {master.job_id} has ended ({master.outcome})"
                    ) from exc
                if time.monotonic() > deadline:
                    raise _Refused(
                        409, f"savepoint not done after {_SAVEPOINT_TIMEOUT:g} s"
                    ) from exc

    def scrape(self) -> tuple[bytes, str]:
        """The Prometheus text and its content type."""
        # prometheus_client takes ~60 ms to import: only a job that is scraped pays it
        # (every process imports this module, slots included).
        from epochstream.deploy.prometheus import CONTENT_TYPE, PrometheusExporter

        with self._exporter_lock:
            if self._exporter is None:
                self._exporter = PrometheusExporter(self.master)
        return self._exporter.render(), CONTENT_TYPE


def _json_body(request: Request) -> dict[str, Any]:
    """The body as a JSON object (empty: ``{}``); 400 for anything else."""
    raw = request.body.strip()
    if not raw:
        return {}
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise _Refused(400, f"body is not JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise _Refused(400, "body must be a JSON object")
    return body


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
                "operators": [
                    {"uid": op.uid, "name": op.name, "kind": op.kind} for op in c.operators
                ],
            }
            for c in graph.chains
        ]
        edges = [
            {
                "source": e.source_chain,
                "target": e.target_chain,
                "partitioning": e.partitioning.kind,
            }
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
        description, graph = self.master.description, self.master.graph
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
                "unaligned": config.unaligned,
                "aligned_timeout_s": config.aligned_timeout,
                # Object-store credentials stay out of the API.
                "storage_options": "<set>" if config.storage_options else None,
            }
        return {
            "job_name": graph.name,
            "runner": description.runner,
            "parallelism": graph.parallelism,
            "max_parallelism": graph.max_parallelism,
            "batch_size": graph.batch_size,
            "buffer_timeout_s": graph.buffer_timeout,
            "auto_watermark_interval_ms": graph.auto_watermark_interval,
            "heartbeat_interval_s": description.heartbeat_interval,
            "heartbeat_timeout_s": description.heartbeat_timeout,
            "metrics_interval_s": description.metrics_interval,
            "endpoint_linger_s": description.endpoint_linger,
            "endpoint_savepoints_anywhere": description.endpoint_savepoints_anywhere,
            "restart_strategy": description.restart_strategy.describe(),
            "state_backend": type(description.state_backend).__name__,
            "checkpointing": checkpointing,
        }


class JobEndpoint:
    """Serves one job master over HTTP on its own thread.

    Example::

        endpoint = JobEndpoint(master, host="::1", token=secrets.token_urlsafe(32))
        endpoint.start(); endpoint.login_url()    # "http://[::1]:40123/dashboard/login?code=..."
    """

    def __init__(
        self,
        master: Any,
        *,
        host: str,
        token: str,
        port: int = 0,
        limits: HttpLimits | None = None,
        codes: LoginCodes | None = None,
    ) -> None:
        self.token = token
        self.codes = codes or LoginCodes()
        self._api: _Api | None = None
        self._server = HttpServer(host, port, self._handle, limits or HttpLimits())
        self.url = self._server.url
        port_number = self.url.rsplit(":", 1)[1]
        credentials = Credentials(
            token=token, session=secrets.token_urlsafe(32), cookie_name=f"epochstream-{port_number}"
        )
        self._api = _Api(master, credentials, self.codes, _static_files())

    def _handle(self, request: Request) -> Response:
        assert self._api is not None  # set before start(), the only way requests arrive
        return self._api.handle(request)

    @property
    def server(self) -> HttpServer:
        """The HTTP server (its limits and open connections)."""
        return self._server

    def login_url(self) -> str:
        """A dashboard URL with a fresh one-time login code (not the token).

        Example: ``webbrowser.open(endpoint.login_url())`` (or see deploy.browser)
        """
        return f"{self.url}/dashboard/login?code={self.codes.issue()}"

    def start(self) -> None:
        """Start serving."""
        self._server.start()

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
        self._server.close()

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
