"""Authenticated, framed connections for the control and data planes.

Every TCP connection between the job master and the slots, or between two slots,
starts with a mutual HMAC-SHA256 challenge over the per-job secret. Nothing is
unpickled before both sides proved they know the secret, so a stranger on the
network can neither inject records nor make a process unpickle attacker bytes.

Handshake (raw bytes, no pickle)::

    server -> client   MAGIC | server_nonce(32)
    client -> server   MAGIC | client_nonce(32) | HMAC(secret, "client" | server_nonce | client_nonce)
    server -> client   HMAC(secret, "server" | client_nonce | server_nonce)   (or 32 zero bytes: refused)

The whole handshake is bounded by one deadline (``HANDSHAKE_TIMEOUT``), not each read,
so a peer trickling one byte at a time cannot hold a connection open. After it, both
sides exchange frames: a 4-byte big-endian length and a pickled payload.

A client retries while the server is unreachable or drops the connection before the
handshake ends (a listener at its cap of unauthenticated connections does that), until
its own deadline; an explicit refusal (wrong secret) fails at once.

Example::

    conn = connect(("127.0.0.1", port), secret, plane="data")
    conn.send({"hello": 1})
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import pickle
import secrets
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import cloudpickle

from epochstream.exceptions import AuthenticationError, SerializationError

__all__ = [
    "HANDSHAKE_TIMEOUT",
    "MAX_FRAME",
    "FramedConnection",
    "accept_handshake",
    "client_handshake",
    "connect",
    "listen",
    "new_secret",
]

log = logging.getLogger(__name__)

MAGIC = b"EPOCHS01"
NONCE_LEN = 32
MAC_LEN = 32
#: Frames larger than this are refused: a corrupt length must not allocate gigabytes.
MAX_FRAME = 1 << 30
#: Seconds the whole handshake may take, on either side.
HANDSHAKE_TIMEOUT = 10.0
_REFUSED = bytes(MAC_LEN)
_HEADER = 4


class HandshakeInterrupted(ConnectionError):
    """The peer went away or stalled before the handshake ended (worth retrying)."""


def new_secret() -> bytes:
    """A fresh random per-job secret."""
    return secrets.token_bytes(32)


def _mac(secret: bytes, role: bytes, a: bytes, b: bytes) -> bytes:
    return hmac.new(secret, role + a + b, hashlib.sha256).digest()


def _recv_exact(
    sock: socket.socket, n: int, deadline: float, on_first: Callable[[], None] | None = None
) -> bytes:
    chunks: list[bytes] = []
    remaining = n
    while remaining:
        left = deadline - time.monotonic()
        if left <= 0:
            raise HandshakeInterrupted(f"handshake not finished within {HANDSHAKE_TIMEOUT:g} s")
        sock.settimeout(left)
        try:
            chunk = sock.recv(remaining)
        except TimeoutError:
            raise HandshakeInterrupted(
                f"handshake not finished within {HANDSHAKE_TIMEOUT:g} s"
            ) from None
        if not chunk:
            raise HandshakeInterrupted(f"connection closed with {remaining} of {n} bytes unread")
        if on_first is not None and not chunks:
            on_first()
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def _send_all(sock: socket.socket, data: bytes, deadline: float) -> None:
    left = deadline - time.monotonic()
    if left <= 0:
        raise HandshakeInterrupted(f"handshake not finished within {HANDSHAKE_TIMEOUT:g} s")
    sock.settimeout(left)
    try:
        sock.sendall(data)
    except TimeoutError:
        raise HandshakeInterrupted(
            f"handshake not finished within {HANDSHAKE_TIMEOUT:g} s"
        ) from None


def accept_handshake(
    sock: socket.socket,
    secret: bytes,
    *,
    plane: str,
    timeout: float = HANDSHAKE_TIMEOUT,
    on_reply: Callable[[], None] | None = None,
) -> None:
    """Server side of the handshake; raises AuthenticationError on a bad or slow peer.

    ``on_reply`` is called when the peer's first reply bytes arrive (the listener
    spares such peers when it must drop a pending connection). The caller logs
    refusals (rate-limited, see :mod:`epochstream.runtime.listener`).
    """
    peer = _peer_name(sock)
    deadline = time.monotonic() + timeout
    server_nonce = secrets.token_bytes(NONCE_LEN)
    try:
        _send_all(sock, MAGIC + server_nonce, deadline)
        reply = _recv_exact(sock, len(MAGIC) + NONCE_LEN + MAC_LEN, deadline, on_reply)
    except OSError as exc:
        raise AuthenticationError(f"{plane} plane: handshake with {peer} failed: {exc}") from exc
    magic = reply[: len(MAGIC)]
    client_nonce = reply[len(MAGIC) : len(MAGIC) + NONCE_LEN]
    mac = reply[len(MAGIC) + NONCE_LEN :]
    expected = _mac(secret, b"client", server_nonce, client_nonce)
    if magic != MAGIC or not hmac.compare_digest(mac, expected):
        try:
            _send_all(sock, _REFUSED, deadline)
        except OSError:
            pass  # the peer left already; it is refused either way
        raise AuthenticationError(f"{plane} plane: peer {peer} did not prove the job secret")
    try:
        _send_all(sock, _mac(secret, b"server", client_nonce, server_nonce), deadline)
    except OSError as exc:
        raise AuthenticationError(f"{plane} plane: handshake with {peer} failed: {exc}") from exc
    sock.settimeout(None)


def client_handshake(
    sock: socket.socket, secret: bytes, *, plane: str, timeout: float = HANDSHAKE_TIMEOUT
) -> None:
    """Client side of the handshake; also checks that the server knows the secret.

    Raises :class:`AuthenticationError` when the server refuses or cannot prove the
    secret, :class:`HandshakeInterrupted` when the connection ends or stalls midway.
    """
    peer = _peer_name(sock)
    deadline = time.monotonic() + timeout
    hello = _recv_exact(sock, len(MAGIC) + NONCE_LEN, deadline)
    if hello[: len(MAGIC)] != MAGIC:
        raise AuthenticationError(f"{plane} plane: {peer} is not an epochstream endpoint")
    server_nonce = hello[len(MAGIC) :]
    client_nonce = secrets.token_bytes(NONCE_LEN)
    _send_all(
        sock, MAGIC + client_nonce + _mac(secret, b"client", server_nonce, client_nonce), deadline
    )
    proof = _recv_exact(sock, MAC_LEN, deadline)
    if proof == _REFUSED:
        raise AuthenticationError(f"{plane} plane: {peer} refused this job secret")
    if not hmac.compare_digest(proof, _mac(secret, b"server", client_nonce, server_nonce)):
        raise AuthenticationError(f"{plane} plane: server {peer} did not prove the job secret")
    sock.settimeout(None)


def _peer_name(sock: socket.socket) -> str:
    try:
        host, port = sock.getpeername()[:2]
        return f"{host}:{port}"
    except OSError:
        return "<unknown peer>"


class FramedConnection:
    """A socket that sends and receives length-prefixed pickled frames.

    ``send`` is safe from several threads (a lock per frame: frames are batches or
    control messages, never single records). ``recv`` is for one reader thread.
    """

    def __init__(self, sock: socket.socket, *, name: str = "") -> None:
        self.sock = sock
        self.name = name or _peer_name(sock)
        self._send_lock = threading.Lock()
        self._rfile = sock.makefile("rb", buffering=1 << 16)
        self._closed = False
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def send(self, obj: Any) -> None:
        """Pickle ``obj`` and send it as one frame.

        Control messages carry user objects (split states, source positions) whose
        classes may be known here only by value, or live in the job script's
        ``__main__``, which plain pickle would reference by a name no other process
        resolves: cloudpickle sends both by value, everything importable by name.
        """
        self.send_bytes(cloudpickle.dumps(obj, protocol=5))

    def send_bytes(self, payload: bytes) -> None:
        """Send an already pickled payload as one frame."""
        header = len(payload).to_bytes(_HEADER, "big")
        with self._send_lock:
            self.sock.sendall(header + payload if len(payload) < 65536 else header)
            if len(payload) >= 65536:
                self.sock.sendall(payload)

    def recv(self) -> Any:
        """Block for the next frame and unpickle it; raises ConnectionError at end of
        stream, ``SerializationError`` when the frame arrived but does not unpickle."""
        return self.unpickle(self.recv_bytes())

    def unpickle(self, payload: bytes) -> Any:
        """Unpickle a received frame's payload (``SerializationError`` when it does not)."""
        try:
            return pickle.loads(payload)
        except Exception as exc:
            raise SerializationError(
                f"connection {self.name}: a frame of {len(payload)} bytes does not unpickle: "
                f"{type(exc).__name__}: {exc}"
            ) from exc

    def recv_bytes(self) -> bytes:
        """Block for the next frame's payload; raises ConnectionError at end of stream."""
        header = self._rfile.read(_HEADER)
        if len(header) < _HEADER:
            raise ConnectionError(f"connection {self.name} closed")
        size = int.from_bytes(header, "big")
        if size > MAX_FRAME:
            raise ConnectionError(
                f"connection {self.name}: frame of {size} bytes exceeds the limit"
            )
        payload = self._rfile.read(size)
        if len(payload) < size:
            raise ConnectionError(f"connection {self.name} closed mid-frame")
        return payload

    def close(self) -> None:
        """Shut the socket down (unblocks a reader or writer in another thread) and close it."""
        if self._closed:
            return
        self._closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError as exc:  # already reset by the peer: nothing left to shut down
            log.debug("shutdown of %s: %s", self.name, exc)
        self.sock.close()
        self._rfile.close()


def connect(
    address: tuple[str, int], secret: bytes, *, plane: str, timeout: float = 30.0
) -> FramedConnection:
    """Open an authenticated framed connection to ``address``.

    Retries (with back-off) while the server is unreachable or drops the connection
    before the handshake ends, for up to ``timeout`` seconds; a refusal or a server
    that cannot prove the secret raises :class:`AuthenticationError` at once.
    """
    deadline = time.monotonic() + timeout
    delay = 0.02
    while True:
        left = deadline - time.monotonic()
        try:
            sock = socket.create_connection(
                address, timeout=max(min(left, HANDSHAKE_TIMEOUT), 0.01)
            )
        except OSError as exc:
            last: OSError = exc
        else:
            try:
                client_handshake(
                    sock, secret, plane=plane, timeout=min(HANDSHAKE_TIMEOUT, max(left, 0.01))
                )
            except HandshakeInterrupted as exc:
                sock.close()
                last = exc
            except BaseException:
                sock.close()
                raise
            else:
                return FramedConnection(sock, name=f"{plane}:{address[0]}:{address[1]}")
        if time.monotonic() + delay >= deadline:
            raise ConnectionError(
                f"{plane} plane: could not connect to {address[0]}:{address[1]} within "
                f"{timeout:g} s: {last}"
            ) from last
        time.sleep(delay)
        delay = min(delay * 2, 1.0)


def listen(host: str, *, backlog: int = 128) -> socket.socket:
    """A listening socket on ``host`` and an ephemeral port."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    sock.listen(backlog)
    return sock
