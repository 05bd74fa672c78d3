"""A small HTTP/1.1 server for the job endpoint that survives hostile local users.

The protocol (request heads, ``Content-Length``, chunked bodies, keep-alive) is parsed
by `h11 <https://h11.readthedocs.io>`_, a maintained sans-I/O HTTP/1.1 library that
rejects malformed heads and negative or garbled lengths and bounds how much of an
incomplete head it buffers. Connections run as asyncio tasks on **one** thread with
its own event loop; request handlers run on a small thread pool. What keeps a flood
off the job's resources:

- **Descriptors.** At most ``max_connections`` connections are open at once, never
  more than an eighth of the process's ``RLIMIT_NOFILE`` (:func:`connection_cap`): the
  rest of the descriptors stay with the job (checkpoints, slots, storage). The server
  accepts itself, one connection at a time, and decides at once or (a silent newcomer
  over a cap) within 0.25 s, so it holds at most cap + 17 descriptors beyond the
  listening socket and its event loop's two.
- **Unauthenticated connections.** A connection is unauthenticated until one of its
  requests carried valid credentials (the handler says so). At most
  ``max_unauthenticated`` of them are open. Over either cap, a newcomer whose request
  is waiting, as an honest client's is, takes the place of the oldest silent
  unauthenticated connection, so a flood of silent connections cannot lock honest
  clients out; a newcomer that has sent nothing yet waits up to 0.25 s for its
  request (an honest request may reach a loaded host a little after its connection;
  at most 8 wait, a ninth refuses the oldest), then is refused (a best-effort ``503``,
  then closed).
- **Deadlines.** An unauthenticated connection must deliver its whole request (head
  and body) within ``head_timeout`` of connecting or of its last answer; trickling
  bytes buys nothing. Authenticated keep-alive connections get ``request_timeout``.
- **Memory.** A head may hold at most ``max_head`` bytes (h11 refuses more: ``431``),
  a body ``max_body`` (``413``, checked against ``Content-Length`` before reading and
  while reading chunks); sockets are read ``max_head`` bytes at a time.
- **Logs.** Bad connections (timeouts, malformed requests, resets, evictions) are
  logged one line at a time, at most once per ``log_interval`` seconds with a count
  of the rest, without tracebacks.
- **Backlog.** The listen backlog is ``min(SOMAXCONN, 128)``: queued connections cost
  the process no descriptors, so a deep queue rides out bursts of honest clients.

Example::

    server = HttpServer("127.0.0.1", 0, handler, HttpLimits())
    server.start(); server.url         # "http://127.0.0.1:40123"
    server.close()
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import resource
import socket
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlsplit

import h11

from epochstream.exceptions import ConfigurationError
from epochstream.runtime.listener import RateLimitedLog

__all__ = ["HttpLimits", "HttpServer", "Request", "Response", "connection_cap", "listen_socket"]

log = logging.getLogger(__name__)

#: accept() errors that mean "out of a resource for now": free one or wait, then retry.
_EXHAUSTED = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
#: accept() errors of a peer that left before it was accepted: accept the next one.
_PEER_GONE = frozenset({errno.ECONNABORTED, errno.EPROTO, errno.EINTR})
_ACCEPTS_PER_WAKEUP = 64
#: At most this many evicted connections wait to be closed (descriptors in flight).
_MAX_CLOSING = 8
#: Over a cap, at most this many silent newcomers wait up to _REQUEST_GRACE seconds for
#: their request before the server decides: an honest client's request can arrive a few
#: milliseconds after its connection is accepted (on a loaded host, always).
_MAX_WAITING = 8
_REQUEST_GRACE = 0.25
_BACKOFF = 0.2
_REASONS = {
    200: "OK",
    302: "Found",
    303: "See Other",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    409: "Conflict",
    413: "Content Too Large",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    501: "Not Implemented",
    503: "Service Unavailable",
}


def connection_cap(requested: int, soft_limit: int | None = None) -> int:
    """``requested``, but at most an eighth of the file-descriptor limit (at least 4).

    ``soft_limit`` defaults to this process's ``RLIMIT_NOFILE``; seven eighths of it
    stay with the job, whatever the endpoint is asked to hold.

    Example::

        connection_cap(256, 1024)   # 128
        connection_cap(256, 64)     # 8
    """
    if soft_limit is None:
        soft_limit, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft_limit == resource.RLIM_INFINITY:
        return requested
    return max(4, min(requested, soft_limit // 8))


@dataclass(frozen=True)
class HttpLimits:
    """What one endpoint may hold: connections, deadlines (seconds), sizes (bytes).

    ``max_connections`` and ``max_unauthenticated`` are capped further by
    :func:`connection_cap` when the server starts.

    Example: ``HttpLimits(max_connections=64, head_timeout=2.0)``
    """

    max_connections: int = 256
    max_unauthenticated: int = 32
    head_timeout: float = 5.0
    request_timeout: float = 60.0
    max_head: int = 16 * 1024
    max_body: int = 64 * 1024
    workers: int = 8
    log_interval: float = 10.0
    backlog: int = field(default_factory=lambda: min(socket.SOMAXCONN, 128))


@dataclass
class Request:
    """One parsed request: method, path (without the query), query, headers, body.

    Header names are lower case; repeated headers are joined with ``", "``.

    Example: ``Request("GET", "/v1/job", {}, {"authorization": "Bearer t"}, b"")``
    """

    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes
    peer: str = ""


@dataclass
class Response:
    """An answer; ``authenticated`` tells the server the request proved credentials.

    Example: ``Response.json(404, {"error": "no route"})``
    """

    status: int
    body: bytes = b""
    headers: list[tuple[str, str]] = field(default_factory=list)
    authenticated: bool = False

    @classmethod
    def json(cls, status: int, payload: object, *, authenticated: bool = False) -> Response:
        """A JSON answer (``default=str`` for odd values such as timestamps).

        Example: ``Response.json(200, {"path": "/sp/savepoint-1"})``
        """
        data = json.dumps(payload, default=str).encode("utf-8")
        return cls(status, data, [("Content-Type", "application/json")], authenticated)


Handler = Callable[[Request], Response]


class _Refusal(Exception):
    """A request the server answers itself (``status``) and then closes the connection."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _raw_error(status: int, message: str) -> bytes:
    """An error answer written without h11 (its state may be ERROR by then)."""
    body = json.dumps({"error": message}).encode("utf-8")
    head = (
        f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Cache-Control: no-store\r\nConnection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


def listen_socket(host: str, port: int, backlog: int) -> socket.socket:
    """A listening TCP socket on ``host`` (a name, IPv4 or IPv6 address) and ``port``.

    Raises :class:`ConfigurationError` naming ``endpoint_host`` when ``host`` does not
    resolve or cannot be bound.

    Example: ``listen_socket("::1", 0, 128)``
    """
    try:
        family, kind, proto, _name, address = socket.getaddrinfo(
            host, port, socket.AF_UNSPEC, socket.SOCK_STREAM, 0, socket.AI_PASSIVE
        )[0]
    except (socket.gaierror, UnicodeError) as exc:
        raise ConfigurationError(
            f"Environment(endpoint_host={host!r}): not an address or resolvable host name ({exc})"
        ) from exc
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(backlog)
    except OSError as exc:
        sock.close()
        raise ConfigurationError(
            f"Environment(endpoint_host={host!r}): cannot listen on {address[0]} port {port} ({exc})"
        ) from exc
    sock.setblocking(False)
    return sock


class _Connection:
    """One accepted connection: its socket, h11 state and whether it authenticated."""

    __slots__ = (
        "authenticated",
        "busy",
        "evicted",
        "peer",
        "protocol",
        "received",
        "served",
        "sock",
        "task",
    )

    def __init__(self, sock: socket.socket, peer: str, max_head: int) -> None:
        self.sock = sock
        self.peer = peer
        self.protocol = h11.Connection(h11.SERVER, max_incomplete_event_size=max_head)
        self.authenticated = False
        #: A handler is working on its request: not evicted (its answer is owed).
        self.busy = False
        self.evicted = False
        #: At least one request was answered (a quiet keep-alive is no misbehaviour).
        self.served = False
        #: It sent at least one byte (see _silent).
        self.received = False
        self.task: asyncio.Task[None] | None = None


@dataclass(frozen=True)
class _Waiting:
    """A newcomer over a cap that has not sent its request yet (see _wait_for_request)."""

    sock: socket.socket
    peer: str
    timer: asyncio.TimerHandle


class HttpServer:
    """Serves ``handler`` over HTTP/1.1 on its own thread, within :class:`HttpLimits`.

    Binds at construction (so a bad host fails early and ``url`` is known), serves
    after :meth:`start`, releases everything on :meth:`close`.

    Example::

        server = HttpServer("::1", 0, lambda r: Response.json(200, {"ok": True}), HttpLimits())
        server.start(); server.url         # "http://[::1]:40123"
    """

    def __init__(self, host: str, port: int, handler: Handler, limits: HttpLimits) -> None:
        self._handler = handler
        self.limits = limits
        self.max_connections = connection_cap(limits.max_connections)
        self.max_unauthenticated = max(
            1, min(limits.max_unauthenticated, self.max_connections // 2)
        )
        self._listener = listen_socket(host, port, limits.backlog)
        bound = self._listener.getsockname()
        shown = f"[{bound[0]}]" if self._listener.family == socket.AF_INET6 else bound[0]
        self.url = f"http://{shown}:{bound[1]}"
        self._connections: dict[int, _Connection] = {}  # by id(), in accept order
        self._bad = RateLimitedLog(log, interval=limits.log_interval)
        self._pool = ThreadPoolExecutor(limits.workers, thread_name_prefix="job-endpoint-handler")
        self._loop = asyncio.new_event_loop()
        self._stopped: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="job-endpoint", daemon=True)
        self._closed = threading.Event()
        self._paused = False
        #: Evicted connections whose sockets are not closed yet.
        self._closing = 0
        #: Newcomers over a cap waiting for their request (see _wait_for_request), by fd,
        #: oldest first.
        self._waiting: dict[int, _Waiting] = {}

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start serving on the server's thread."""
        self._thread.start()

    def close(self) -> None:
        """Stop serving: close the listening socket and every connection (idempotent)."""
        if self._closed.is_set():
            return
        self._closed.set()
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop)
            self._thread.join(10.0)
        else:
            self._listener.close()
            self._loop.close()
        self._pool.shutdown(wait=False, cancel_futures=True)

    @property
    def open_connections(self) -> int:
        """How many connections are open now (for tests and metrics)."""
        return len(self._connections)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._serve())
        finally:
            self._loop.close()

    async def _serve(self) -> None:
        self._stopped = asyncio.Event()
        if self._closed.is_set():
            self._stopped.set()
        self._loop.add_reader(self._listener.fileno(), self._accept)
        try:
            await self._stopped.wait()
        finally:
            self._loop.remove_reader(self._listener.fileno())
            self._listener.close()
            for fd, waiting in list(self._waiting.items()):
                self._loop.remove_reader(fd)
                waiting.timer.cancel()
                waiting.sock.close()
            self._waiting.clear()
            tasks = [c.task for c in self._connections.values() if c.task is not None]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._bad.flush()

    def _stop(self) -> None:
        if self._stopped is not None:
            self._stopped.set()

    # ------------------------------------------------------------------ accepting

    def _accept(self) -> None:
        for _ in range(_ACCEPTS_PER_WAKEUP):
            try:
                sock, address = self._listener.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno in _PEER_GONE:
                    continue
                if exc.errno in _EXHAUSTED:
                    self._exhausted(exc)
                    return
                raise
            self._admit(sock, _peer(address))

    def _exhausted(self, exc: OSError) -> None:
        """Out of descriptors: free one of ours if we can, else stop accepting a while."""
        self._bad.warning(
            "job endpoint: accept failed (%s); %d connections open", exc, len(self._connections)
        )
        if self._evict_one("out of file descriptors"):
            return
        if not self._paused:
            self._paused = True
            self._loop.remove_reader(self._listener.fileno())
            self._loop.call_later(_BACKOFF, self._resume)

    def _resume(self) -> None:
        self._paused = False
        if self._stopped is not None and not self._stopped.is_set():
            self._loop.add_reader(self._listener.fileno(), self._accept)

    def _over_cap(self) -> str | None:
        """Why a newcomer cannot simply be admitted now; ``None`` when it can."""
        if len(self._connections) >= self.max_connections:
            return f"{self.max_connections} connections open"
        unauthenticated = sum(1 for c in self._connections.values() if not c.authenticated)
        if unauthenticated >= self.max_unauthenticated:
            return f"{self.max_unauthenticated} connections not authenticated yet"
        return None

    def _admit(self, sock: socket.socket, peer: str) -> None:
        reason = self._over_cap()
        if reason is None:
            self._open(sock, peer)
        elif _has_data(sock):
            self._take_a_place(sock, peer, reason)
        else:
            if len(self._waiting) >= _MAX_WAITING:
                # The oldest waiter has had the longest to send its request.
                self._decide(next(iter(self._waiting)), f"{reason}; newer connections waiting")
            self._wait_for_request(sock, peer)

    def _take_a_place(self, sock: socket.socket, peer: str, reason: str) -> None:
        """A newcomer over a cap whose request is in its socket, as an honest client's
        is, takes the place of a silent connection, or is refused (closing it frees its
        descriptor at once). An evicted connection holds its descriptor until its task
        unwinds (next loop iteration), so at most _MAX_CLOSING are on their way out:
        never more than cap + _MAX_CLOSING + _MAX_WAITING + 1 descriptors."""
        if self._closing >= _MAX_CLOSING or not self._evict_one(reason):
            self._refuse(sock, peer, reason)
            return
        self._open(sock, peer)

    def _wait_for_request(self, sock: socket.socket, peer: str) -> None:
        """Decide about a silent newcomer over a cap once its request arrives or
        _REQUEST_GRACE has passed, whichever is first (a flood's silent sockets are
        refused then; an honest client's request has arrived by then)."""
        fd = sock.fileno()
        timer = self._loop.call_later(_REQUEST_GRACE, self._decide, fd, None)
        self._waiting[fd] = _Waiting(sock, peer, timer)
        self._loop.add_reader(fd, self._decide, fd, None)

    def _decide(self, fd: int, refusal: str | None) -> None:
        """Admit, place or refuse the waiting newcomer ``fd`` (refuse it: ``refusal``)."""
        waiting = self._waiting.pop(fd, None)
        if waiting is None:
            return  # decided already (readable and timed out in one iteration)
        self._loop.remove_reader(fd)
        waiting.timer.cancel()
        reason = self._over_cap()
        if refusal is not None:
            self._refuse(waiting.sock, waiting.peer, refusal)
        elif reason is None:
            self._open(waiting.sock, waiting.peer)
        elif _has_data(waiting.sock):
            self._take_a_place(waiting.sock, waiting.peer, reason)
        else:
            self._refuse(
                waiting.sock, waiting.peer, f"{reason}; no request within {_REQUEST_GRACE}s"
            )

    def _open(self, sock: socket.socket, peer: str) -> None:
        """Serve ``sock`` as a connection of its own task."""
        sock.setblocking(False)
        conn = _Connection(sock, peer, self.limits.max_head)
        self._connections[id(conn)] = conn
        conn.task = self._loop.create_task(self._connection(conn))
        # A done callback, not a ``finally``: a task cancelled before its first step
        # never runs its body, and its socket must still be closed.
        conn.task.add_done_callback(lambda _task: self._release(conn))

    def _release(self, conn: _Connection) -> None:
        self._connections.pop(id(conn), None)
        conn.sock.close()
        if conn.evicted:
            self._closing -= 1
        task = conn.task
        if task is not None and not task.cancelled() and task.exception() is not None:
            # A bug in this module, not a peer's doing: show it whole.
            log.error(
                "job endpoint: connection from %s failed", conn.peer, exc_info=task.exception()
            )

    def _evict_one(self, reason: str) -> bool:
        """Close one unauthenticated connection waiting for its request: the oldest that
        has sent nothing at all, else the oldest (an honest client's request is
        usually already in the socket when it is accepted, so silence marks a flood)."""
        idle = [c for c in self._connections.values() if not c.authenticated and not c.busy]
        victim = next((c for c in idle if _silent(c)), idle[0] if idle else None)
        if victim is None or victim.task is None:
            return False
        self._bad.warning("job endpoint: closed a connection from %s (%s)", victim.peer, reason)
        # Out of the count now; its task closes the socket as it unwinds (closing here
        # could hand its descriptor number to the next accept while the event loop
        # still watches it for the old connection).
        self._connections.pop(id(victim), None)
        self._closing += 1
        victim.evicted = True
        victim.task.cancel()
        return True

    def _refuse(self, sock: socket.socket, peer: str, reason: str) -> None:
        self._bad.warning("job endpoint: refused a connection from %s (%s)", peer, reason)
        try:
            # Best effort, never blocking: a client that cannot take 200 bytes now
            # is not one to wait for.
            sock.send(_raw_error(503, f"job endpoint busy: {reason}"), socket.MSG_DONTWAIT)
        except OSError as exc:
            log.debug("job endpoint: 503 to %s not sent: %s", peer, exc)
        finally:
            sock.close()

    # ------------------------------------------------------------------ one connection

    async def _connection(self, conn: _Connection) -> None:
        try:
            while True:
                timeout = (
                    self.limits.request_timeout if conn.authenticated else self.limits.head_timeout
                )
                async with asyncio.timeout(timeout):
                    request = await self._read_request(conn)
                if request is None:
                    return
                conn.busy = True
                try:
                    response = await self._loop.run_in_executor(self._pool, self._answer, request)
                finally:
                    conn.busy = False
                conn.authenticated = conn.authenticated or response.authenticated
                await self._send(conn, response, head_only=request.method == "HEAD")
                conn.served = True
                if (
                    conn.protocol.our_state is not h11.DONE
                    or conn.protocol.their_state is not h11.DONE
                ):
                    return
                conn.protocol.start_next_cycle()
        except TimeoutError:
            if conn.protocol.their_state is h11.IDLE and not conn.protocol.trailing_data[0]:
                if conn.served:
                    return  # a kept-alive connection that went quiet: an ordinary close
                self._bad.warning(
                    "job endpoint: %s sent no request within %g s",
                    conn.peer,
                    self.limits.head_timeout,
                )
            else:
                self._bad.warning("job endpoint: %s did not finish its request in time", conn.peer)
            await self._send_raw(conn, _raw_error(408, "request not received in time"))
        except _Refusal as refusal:
            self._bad.warning("job endpoint: bad request from %s: %s", conn.peer, refusal)
            await self._send_raw(conn, _raw_error(refusal.status, str(refusal)))
        except (ConnectionError, OSError) as exc:
            self._bad.warning("job endpoint: connection from %s failed: %s", conn.peer, exc)

    async def _read_request(self, conn: _Connection) -> Request | None:
        """The next request, or ``None`` when the peer closed between requests."""
        protocol = conn.protocol
        head: h11.Request | None = None
        body = bytearray()
        while True:
            try:
                event = protocol.next_event()
            except h11.RemoteProtocolError as exc:
                status = exc.error_status_hint
                if status == 431:
                    raise _Refusal(
                        431, f"request head larger than {self.limits.max_head} bytes"
                    ) from exc
                raise _Refusal(status, f"malformed request: {exc}") from exc
            if event is h11.NEED_DATA:
                if protocol.they_are_waiting_for_100_continue:
                    # curl sends "Expect: 100-continue" before a body over 1 KiB.
                    continued = protocol.send(
                        h11.InformationalResponse(status_code=100, headers=[])
                    )
                    await self._loop.sock_sendall(conn.sock, continued or b"")
                data = await self._loop.sock_recv(conn.sock, self.limits.max_head)
                conn.received = conn.received or bool(data)
                protocol.receive_data(data)
            elif isinstance(event, h11.Request):
                head = event
                length = _content_length(event.headers)
                if length is not None and length > self.limits.max_body:
                    raise _Refusal(413, f"request body larger than {self.limits.max_body} bytes")
            elif isinstance(event, h11.Data):
                body += event.data
                if len(body) > self.limits.max_body:
                    raise _Refusal(413, f"request body larger than {self.limits.max_body} bytes")
            elif isinstance(event, h11.EndOfMessage):
                assert head is not None
                return _request(head, bytes(body), conn.peer)
            elif isinstance(event, h11.ConnectionClosed):
                if head is None:
                    return None
                raise _Refusal(400, "connection closed in the middle of a request")
            else:  # h11.PAUSED cannot happen: start_next_cycle runs after each answer
                raise _Refusal(400, f"unexpected {type(event).__name__}")

    def _answer(self, request: Request) -> Response:
        """The handler's answer (pool thread); a handler bug answers 500 and is logged."""
        try:
            return self._handler(request)
        except Exception:
            log.exception("job endpoint: %s %s failed", request.method, request.path)
            return Response.json(500, {"error": "internal error (see the driver's log)"})

    async def _send(self, conn: _Connection, response: Response, *, head_only: bool) -> None:
        headers = [
            ("Content-Length", str(len(response.body))),
            ("X-Content-Type-Options", "nosniff"),
            *response.headers,
        ]
        if not any(name.lower() == "cache-control" for name, _ in response.headers):
            headers.append(("Cache-Control", "no-store"))
        protocol = conn.protocol
        data = (
            protocol.send(
                h11.Response(
                    status_code=response.status,
                    headers=headers,
                    reason=_REASONS.get(response.status, ""),
                )
            )
            or b""
        )
        if not head_only:  # a HEAD answer has the GET answer's headers and no body
            data += protocol.send(h11.Data(data=response.body)) or b""
        data += protocol.send(h11.EndOfMessage()) or b""
        async with asyncio.timeout(self.limits.request_timeout):
            await self._loop.sock_sendall(conn.sock, data)

    async def _send_raw(self, conn: _Connection, data: bytes) -> None:
        try:
            async with asyncio.timeout(1.0):
                await self._loop.sock_sendall(conn.sock, data)
        except (TimeoutError, OSError) as exc:
            # The peer is already misbehaving; it was logged above.
            log.debug("job endpoint: error answer to %s not sent: %s", conn.peer, exc)


def _has_data(sock: socket.socket) -> bool:
    """Whether bytes from the peer wait in ``sock`` (a fresh, still blocking socket)."""
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
    except BlockingIOError:
        return False
    except OSError as exc:
        log.debug("job endpoint: new connection is broken: %s", exc)
        return False


def _silent(conn: _Connection) -> bool:
    """Whether ``conn`` never sent a byte (nothing read, nothing waiting to be read)."""
    if conn.received:
        return False
    try:
        return conn.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""  # b"": it left
    except BlockingIOError:
        return True
    except OSError as exc:
        log.debug("job endpoint: connection from %s is broken: %s", conn.peer, exc)
        return True


def _peer(address: object) -> str:
    if isinstance(address, tuple) and len(address) >= 2:
        return f"{address[0]}:{address[1]}"
    return str(address)


def _content_length(headers: Sequence[tuple[bytes, bytes]]) -> int | None:
    for name, value in headers:
        if name == b"content-length":
            return int(value)  # h11 checked: digits only, at most 20 of them
    return None


def _request(head: h11.Request, body: bytes, peer: str) -> Request:
    target = head.target.decode("ascii", "replace")
    parts = urlsplit(target)
    headers: dict[str, str] = {}
    for name, value in head.headers:
        key = name.decode("ascii").lower()
        text = value.decode("latin-1")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    return Request(
        method=head.method.decode("ascii"),
        path=parts.path,
        query=parse_qs(parts.query),
        headers=headers,
        body=body,
        peer=peer,
    )
