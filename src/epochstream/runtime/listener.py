"""The accept loop both planes share: authenticate, cap, back off, log without flooding.

An :class:`AuthenticatedListener` accepts TCP connections and runs the HMAC handshake
(:mod:`epochstream.runtime.auth`) on a thread per connection; only a peer that proved
the job secret reaches the handler. It is built to survive a hostile network:

- At most ``max_unauthenticated`` connections may be mid-handshake at once (and never
  more than an eighth of the process's file-descriptor limit). A connection beyond the
  cap drops a pending one: the oldest that has not answered yet, else the oldest. An
  honest peer answers within one round trip, so a flood of silent connections never
  locks honest peers out; they also retry (see ``connect``).
- The whole handshake has one deadline, so trickling bytes buys nothing.
- ``accept`` errors never end the loop. Out of file descriptors (EMFILE, ENFILE) it
  drops a pending handshake to free one, or backs off (up to one second) when none
  is pending; a connection aborted before it was accepted is skipped.
- Refusals are logged at most once per ``log_interval`` seconds with a count of the
  ones not shown, so a probe cannot flood the log.

Example::

    listener = AuthenticatedListener("127.0.0.1", secret, "data", serve)
    listener.start(); listener.address
"""

from __future__ import annotations

import errno
import logging
import resource
import socket
import threading
import time
from collections.abc import Callable

from epochstream.exceptions import AuthenticationError
from epochstream.runtime.auth import HANDSHAKE_TIMEOUT, FramedConnection, accept_handshake, listen

__all__ = ["AuthenticatedListener", "RateLimitedLog", "handshake_cap"]

log = logging.getLogger(__name__)

#: accept() errors that mean "out of a resource for now": free one or wait, then retry.
_EXHAUSTED = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
#: accept() errors of a peer that left before it was accepted: just accept the next one.
_PEER_GONE = frozenset({errno.ECONNABORTED, errno.EPROTO, errno.EINTR, errno.EAGAIN})
_MAX_BACKOFF = 1.0


def handshake_cap(requested: int) -> int:
    """``requested``, but at most an eighth of this process's file-descriptor limit.

    Example::

        handshake_cap(64)   # 64 with the usual 1024 descriptors, 8 with 64
    """
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return requested
    return max(2, min(requested, soft // 8))


class RateLimitedLog:
    """Logs a kind of event at most once per ``interval`` seconds, counting the rest.

    Example::

        refusals = RateLimitedLog(log, interval=10.0)
        refusals.warning("refused %s", peer)   # first one logged, later ones counted
    """

    def __init__(
        self,
        logger: logging.Logger,
        *,
        interval: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._log = logger
        self._interval = interval
        self._clock = clock
        self._lock = threading.Lock()
        self._window_start: float | None = None
        self._suppressed = 0
        self.total = 0

    def warning(self, message: str, *args: object) -> None:
        """Log ``message`` unless one was logged within the interval; then only count it."""
        with self._lock:
            self.total += 1
            now = self._clock()
            if self._window_start is not None and now - self._window_start < self._interval:
                self._suppressed += 1
                return
            suppressed, self._suppressed = self._suppressed, 0
            self._window_start = now
        if suppressed:
            self._log.warning(
                message + " (and %d more like it in the last %g s)",
                *args,
                suppressed,
                self._interval,
            )
        else:
            self._log.warning(message, *args)

    def flush(self) -> None:
        """Log the count of events suppressed since the last line, if any."""
        with self._lock:
            suppressed, self._suppressed = self._suppressed, 0
        if suppressed:
            self._log.warning("%d more refused connections were not logged", suppressed)


class _Pending:
    """A connection in its handshake; ``answered`` once the peer sent reply bytes."""

    __slots__ = ("answered", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.answered = False


class AuthenticatedListener:
    """Accepts connections on ``host``; each one that proves the secret goes to ``handler``.

    The handshake and ``handler`` run on a thread per connection, so a silent or slow
    peer never holds up the others.

    Example::

        listener = AuthenticatedListener("127.0.0.1", secret, "control", serve)
        listener.start()
        ...
        listener.close()
    """

    def __init__(
        self,
        host: str,
        secret: bytes,
        plane: str,
        handler: Callable[[FramedConnection], None],
        *,
        max_unauthenticated: int = 64,
        handshake_timeout: float = HANDSHAKE_TIMEOUT,
        log_interval: float = 10.0,
    ) -> None:
        self._secret = secret
        self._plane = plane
        self._handler = handler
        self._max_pending = handshake_cap(max_unauthenticated)
        self._handshake_timeout = handshake_timeout
        self._sock = listen(host)
        self.address: tuple[str, int] = self._sock.getsockname()[:2]
        self.closed = threading.Event()
        self.refusals = RateLimitedLog(log, interval=log_interval)
        self._pending: dict[int, _Pending] = {}  # insertion order == age
        self._pending_lock = threading.Lock()
        self._next_id = 0
        self._thread = threading.Thread(
            target=self._accept_loop, name=f"{plane}-accept", daemon=True
        )

    def start(self) -> None:
        """Start the accept thread."""
        self._thread.start()

    @property
    def pending_handshakes(self) -> int:
        """Connections accepted and not yet authenticated or refused."""
        with self._pending_lock:
            return len(self._pending)

    def _accept_loop(self) -> None:
        backoff = 0.0
        while not self.closed.is_set():
            try:
                sock, _ = self._sock.accept()
            except OSError as exc:
                if self.closed.is_set():
                    return
                if isinstance(exc, ConnectionAbortedError) or exc.errno in _PEER_GONE:
                    continue
                if exc.errno in _EXHAUSTED and self._drop_one("out of file descriptors"):
                    self.closed.wait(0.005)  # let the dropped handshake's thread close it
                    continue
                # Nothing of ours to free (or an unexpected error): wait, the plane must
                # keep serving once the resource is back.
                backoff = min(max(backoff * 2, 0.01), _MAX_BACKOFF)
                self.refusals.warning(
                    "%s plane: cannot accept connections (%s); retrying in %.2f s",
                    self._plane,
                    exc.strerror or exc,
                    backoff,
                )
                self.closed.wait(backoff)
                continue
            backoff = 0.0
            self._admit(sock)

    def _drop_one(self, why: str) -> bool:
        """Shut down one pending handshake: the oldest silent one, else the oldest."""
        with self._pending_lock:
            if not self._pending:
                return False
            victim_id = next(
                (cid for cid, p in self._pending.items() if not p.answered),
                next(iter(self._pending)),
            )
            victim = self._pending.pop(victim_id)
        self.refusals.warning(
            "%s plane: dropped a connection still authenticating (%s)", self._plane, why
        )
        _shut(victim.sock)  # its handshake thread sees the connection end and closes it
        return True

    def _admit(self, sock: socket.socket) -> None:
        pending = _Pending(sock)
        with self._pending_lock:
            self._next_id += 1
            conn_id = self._next_id
            self._pending[conn_id] = pending
            full = len(self._pending) > self._max_pending
        if full:
            self._drop_one(f"{self._max_pending} connections waiting to authenticate")
        try:
            threading.Thread(
                target=self._serve,
                args=(conn_id, pending),
                name=f"{self._plane}-in",
                daemon=True,
            ).start()
        except RuntimeError as exc:  # cannot start a thread: treat like an exhausted resource
            self._forget(conn_id)
            sock.close()
            self.refusals.warning("%s plane: dropped a connection: %s", self._plane, exc)

    def _forget(self, conn_id: int) -> bool:
        with self._pending_lock:
            return self._pending.pop(conn_id, None) is not None

    def _serve(self, conn_id: int, pending: _Pending) -> None:
        sock = pending.sock

        def answered() -> None:
            pending.answered = True

        try:
            accept_handshake(
                sock,
                self._secret,
                plane=self._plane,
                timeout=self._handshake_timeout,
                on_reply=answered,
            )
        except AuthenticationError as exc:
            self._forget(conn_id)
            sock.close()
            self.refusals.warning("%s plane: refused connection: %s", self._plane, exc)
            return
        if not self._forget(conn_id):
            sock.close()  # dropped while it authenticated: the peer retries
            return
        self._handler(FramedConnection(sock))

    def close(self) -> None:
        """Stop accepting and drop connections still authenticating."""
        self.closed.set()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in accept()
        except OSError as exc:  # some systems refuse shutdown on a listening socket
            log.debug("%s plane: shutdown of the listening socket: %r", self._plane, exc)
        self._sock.close()
        with self._pending_lock:
            pending = list(self._pending.values())
            self._pending.clear()
        for p in pending:
            _shut(p.sock)
        self.refusals.flush()


def _shut(sock: socket.socket) -> None:
    """Shut a socket down so a thread blocked on it wakes up; the thread closes it."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        sock.close()  # not connected any more: nothing to wake, just release it
