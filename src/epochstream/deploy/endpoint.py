"""The job master's HTTP endpoint: status, checkpoints, savepoints, cancel.

Served by the driver on loopback by default (``Environment(endpoint_host=...)``).
Every request must carry ``Authorization: Bearer <token>``, the job's random token,
which only the user running the job can read (the job registry, ``0600``). Routes::

    GET  /v1/job                           status: id, name, state, attempt, restarts...
    GET  /v1/checkpoints                   statistics of every completed checkpoint
    POST /v1/savepoints  {"directory": D}  take a savepoint (waits); {"path": ...}
    POST /v1/cancel      {"savepoint": D}  cancel, or stop with a savepoint; {"path": ...}

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
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from epochstream.exceptions import CheckpointError

__all__ = ["JobEndpoint"]

log = logging.getLogger(__name__)
_MAX_BODY = 1 << 16
_SAVEPOINT_TIMEOUT = 600.0


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("endpoint: " + format, *args)

    def _reply(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body, default=str).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
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
        if not self._authorized():
            return
        master = self.server.master
        if self.path == "/v1/job":
            self._reply(200, master.status())
        elif self.path == "/v1/checkpoints":
            stats = master.coordinator.completed_stats if master.coordinator else []
            self._reply(200, {"checkpoints": [s.to_dict() for s in stats]})
        else:
            self._reply(404, {"error": f"no route GET {self.path}"})

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


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], master: Any, token: str) -> None:
        super().__init__(address, _Handler)
        self.master = master
        self.token = token


class JobEndpoint:
    """Serves one job master over HTTP on its own thread."""

    def __init__(self, master: Any, *, host: str, token: str, port: int = 0) -> None:
        self._server = _Server((host, port), master, token)
        self.token = token
        bound_host, bound_port = self._server.server_address[:2]
        shown = bound_host.decode() if isinstance(bound_host, bytes) else bound_host
        self.url = f"http://{shown}:{bound_port}"
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
