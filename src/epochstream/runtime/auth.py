"""Authenticated, framed connections for the control and data planes.

Every TCP connection between the job master and the slots, or between two slots,
starts with a mutual HMAC-SHA256 challenge over the per-job secret. Nothing is
unpickled before both sides proved they know the secret, so a stranger on the
network can neither inject records nor make a process unpickle attacker bytes.

Handshake (raw bytes, no pickle)::

    server -> client   MAGIC | server_nonce(32)
    client -> server   MAGIC | client_nonce(32) | HMAC(secret, "client" | server_nonce | client_nonce)
    server -> client   HMAC(secret, "server" | client_nonce | server_nonce)

After it, both sides exchange frames: a 4-byte big-endian length and a pickled payload.

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
from collections.abc import Callable
from typing import Any

from epochstream.exceptions import AuthenticationError

__all__ = [
    "MAX_FRAME",
    "AuthenticatedListener",
    "FramedConnection",
    "accept_handshake",
    "connect",
    "new_secret",
]

log = logging.getLogger(__name__)

MAGIC = b"EPOCHS01"
NONCE_LEN = 32
MAC_LEN = 32
#: Frames larger than this are refused: a corrupt length must not allocate gigabytes.
MAX_FRAME = 1 << 30
HANDSHAKE_TIMEOUT = 10.0
_HEADER = 4


def new_secret() -> bytes:
    """A fresh random per-job secret."""
    return secrets.token_bytes(32)


def _mac(secret: bytes, role: bytes, a: bytes, b: bytes) -> bytes:
    return hmac.new(secret, role + a + b, hashlib.sha256).digest()


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks = []
    remaining = n
    while remaining:
        chunk = sock.recv(remaining)
        if not chunk:
            raise ConnectionError(f"connection closed with {remaining} of {n} bytes unread")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def accept_handshake(sock: socket.socket, secret: bytes, *, plane: str) -> None:
    """Server side of the handshake; raises AuthenticationError (and logs) on a bad peer."""
    peer = _peer_name(sock)
    sock.settimeout(HANDSHAKE_TIMEOUT)
    server_nonce = secrets.token_bytes(NONCE_LEN)
    try:
        sock.sendall(MAGIC + server_nonce)
        reply = _recv_exact(sock, len(MAGIC) + NONCE_LEN + MAC_LEN)
    except (OSError, ConnectionError) as exc:
        log.warning("%s plane: refused connection from %s: handshake failed (%s)", plane, peer, exc)
        raise AuthenticationError(f"{plane} plane: handshake with {peer} failed: {exc}") from exc
    magic = reply[: len(MAGIC)]
    client_nonce = reply[len(MAGIC) : len(MAGIC) + NONCE_LEN]
    mac = reply[len(MAGIC) + NONCE_LEN :]
    expected = _mac(secret, b"client", server_nonce, client_nonce)
    if magic != MAGIC or not hmac.compare_digest(mac, expected):
        log.warning("%s plane: refused unauthenticated connection from %s", plane, peer)
        raise AuthenticationError(f"{plane} plane: peer {peer} did not prove the job secret")
    sock.sendall(_mac(secret, b"server", client_nonce, server_nonce))
    sock.settimeout(None)


def client_handshake(sock: socket.socket, secret: bytes, *, plane: str) -> None:
    """Client side of the handshake; also checks that the server knows the secret."""
    peer = _peer_name(sock)
    sock.settimeout(HANDSHAKE_TIMEOUT)
    try:
        hello = _recv_exact(sock, len(MAGIC) + NONCE_LEN)
        if hello[: len(MAGIC)] != MAGIC:
            raise AuthenticationError(f"{plane} plane: {peer} is not an epochstream endpoint")
        server_nonce = hello[len(MAGIC) :]
        client_nonce = secrets.token_bytes(NONCE_LEN)
        sock.sendall(MAGIC + client_nonce + _mac(secret, b"client", server_nonce, client_nonce))
        proof = _recv_exact(sock, MAC_LEN)
    except (OSError, ConnectionError) as exc:
        raise AuthenticationError(f"{plane} plane: handshake with {peer} failed: {exc}") from exc
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
        """Pickle ``obj`` and send it as one frame."""
        self.send_bytes(pickle.dumps(obj, protocol=5))

    def send_bytes(self, payload: bytes) -> None:
        """Send an already pickled payload as one frame."""
        header = len(payload).to_bytes(_HEADER, "big")
        with self._send_lock:
            self.sock.sendall(header + payload if len(payload) < 65536 else header)
            if len(payload) >= 65536:
                self.sock.sendall(payload)

    def recv(self) -> Any:
        """Block for the next frame and unpickle it; raises ConnectionError at end of stream."""
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
        return pickle.loads(payload)

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
    address: tuple[str, int], secret: bytes, *, plane: str, timeout: float = 10.0
) -> FramedConnection:
    """Open an authenticated framed connection to ``address``."""
    sock = socket.create_connection(address, timeout=timeout)
    try:
        client_handshake(sock, secret, plane=plane)
    except BaseException:
        sock.close()
        raise
    return FramedConnection(sock, name=f"{plane}:{address[0]}:{address[1]}")


def listen(host: str, *, backlog: int = 128) -> socket.socket:
    """A listening socket on ``host`` and an ephemeral port."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    sock.listen(backlog)
    return sock


class AuthenticatedListener:
    """Accepts connections on ``host``; each one that proves the secret goes to ``handler``.

    The handshake and ``handler`` run on a thread per connection, so a silent or slow
    peer never holds up the others. Refused peers are logged and closed.

    Example::

        listener = AuthenticatedListener("127.0.0.1", secret, "data", serve)
        listener.start(); listener.address
    """

    def __init__(
        self, host: str, secret: bytes, plane: str, handler: Callable[[FramedConnection], None]
    ) -> None:
        self._secret = secret
        self._plane = plane
        self._handler = handler
        self._sock = listen(host)
        self.address: tuple[str, int] = self._sock.getsockname()[:2]
        self.closed = threading.Event()
        self._thread = threading.Thread(
            target=self._accept_loop, name=f"{plane}-accept", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def _accept_loop(self) -> None:
        while not self.closed.is_set():
            try:
                sock, _ = self._sock.accept()
            except OSError:
                if self.closed.is_set():
                    return
                raise
            threading.Thread(
                target=self._serve, args=(sock,), name=f"{self._plane}-in", daemon=True
            ).start()

    def _serve(self, sock: socket.socket) -> None:
        try:
            accept_handshake(sock, self._secret, plane=self._plane)
        except AuthenticationError:
            sock.close()  # the handshake already logged the refusal
            return
        self._handler(FramedConnection(sock))

    def close(self) -> None:
        """Stop accepting new connections."""
        self.closed.set()
        self._sock.close()
