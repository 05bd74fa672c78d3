"""Both planes refuse peers without the job secret, before unpickling anything."""

from __future__ import annotations

import logging
import os
import pickle
import queue
import socket
import threading
import time

import pytest

from epochstream.deploy.control import ControlServer
from epochstream.exceptions import AuthenticationError, SerializationError
from epochstream.runtime.auth import MAGIC, FramedConnection, connect, new_secret
from epochstream.runtime.channels import InputGate
from epochstream.runtime.network import ChannelHello, DataPlaneServer, open_channel


class _Trap:
    """Unpickling this would create a marker file: proof that bytes were unpickled."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def _control_server(secret: bytes) -> tuple[ControlServer, queue.Queue]:
    events: queue.Queue = queue.Queue()
    server = ControlServer("127.0.0.1", secret, events)
    server.start()
    return server, events


def _data_server(secret: bytes, gate: InputGate) -> DataPlaneServer:
    broken: list[BaseException] = []
    server = DataPlaneServer(
        "127.0.0.1", secret, lambda hello: (gate, 0), lambda hello, exc: broken.append(exc)
    )
    server.start()
    return server


def _raw_attack(address: tuple[str, int], marker: str) -> bytes:
    """Skip the handshake: send a frame holding a malicious pickle, return what came back."""
    payload = pickle.dumps(_Trap(marker))
    with socket.create_connection(address, timeout=5) as sock:
        hello = sock.recv(len(MAGIC) + 32)
        frame = len(payload).to_bytes(4, "big") + payload
        sock.sendall(MAGIC + os.urandom(64) + frame)
        sock.settimeout(5)
        received = b""
        try:
            while chunk := sock.recv(4096):
                received += chunk
        except (ConnectionResetError, TimeoutError):
            pass
    assert hello.startswith(MAGIC)
    return received


@pytest.mark.parametrize("plane", ["control", "data"])
def test_wrong_secret_is_refused(plane: str, caplog: pytest.LogCaptureFixture) -> None:
    secret = new_secret()
    gate = InputGate(1)
    server = _control_server(secret)[0] if plane == "control" else _data_server(secret, gate)
    try:
        with caplog.at_level(logging.WARNING):
            with pytest.raises(AuthenticationError):
                connect(server.address, new_secret(), plane=plane)
            deadline = time.monotonic() + 5
            while "refused" not in caplog.text and time.monotonic() < deadline:
                time.sleep(0.01)
        assert f"{plane} plane: refused connection" in caplog.text
        assert "did not prove the job secret" in caplog.text
    finally:
        server.close()


@pytest.mark.parametrize("plane", ["control", "data"])
def test_unauthenticated_bytes_are_never_unpickled(plane: str, tmp_path) -> None:
    secret = new_secret()
    gate = InputGate(1)
    events: queue.Queue = queue.Queue()
    if plane == "control":
        server, events = _control_server(secret)
    else:
        server = _data_server(secret, gate)
    marker = str(tmp_path / "pwned")
    try:
        received = _raw_attack(server.address, marker)
        time.sleep(0.2)
        assert not os.path.exists(marker), "the server unpickled bytes from an unauthenticated peer"
        # The only answer to a peer without the secret is the fixed refusal marker.
        assert received == bytes(32), "the server answered an unauthenticated peer"
        assert events.empty(), "an unauthenticated connection produced a control event"
        assert gate.take(timeout=0.05) is None, "an unauthenticated connection fed a channel"
    finally:
        server.close()


def test_authenticated_peers_exchange_frames() -> None:
    secret = new_secret()
    gate = InputGate(1)
    server = _data_server(secret, gate)
    try:
        conn = open_channel(server.address, secret, ChannelHello(0, 1, 0))
        conn.send([1, 2, 3])
        assert gate.take(timeout=5) == (0, [1, 2, 3])
        conn.close()
        ctl, events = _control_server(secret)
        c = connect(ctl.address, secret, plane="control")
        c.send({"hello": 1})
        kind, _, msg = events.get(timeout=5)
        assert (kind, msg) == ("message", {"hello": 1})
        c.close()
        ctl.close()
    finally:
        server.close()


def test_client_refuses_server_without_secret() -> None:
    """Mutual authentication: a fake server that cannot prove the secret is refused."""
    secret = new_secret()
    fake = ControlServer("127.0.0.1", new_secret(), queue.Queue())
    fake.start()
    try:
        with pytest.raises(AuthenticationError):
            connect(fake.address, secret, plane="control")
    finally:
        fake.close()


def test_silent_peer_does_not_block_other_connections() -> None:
    secret = new_secret()
    server, _events = _control_server(secret)
    try:
        idle = socket.create_connection(server.address)  # never speaks
        done = threading.Event()

        def client() -> None:
            c = connect(server.address, secret, plane="control")
            c.send("ping")
            done.set()
            c.close()

        threading.Thread(target=client, daemon=True).start()
        assert done.wait(5)
        idle.close()
    finally:
        server.close()


def test_a_frame_that_does_not_unpickle_is_a_serialization_error() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    a = FramedConnection(socket.create_connection(listener.getsockname()))
    b = FramedConnection(listener.accept()[0])
    try:
        # A pickle naming a class the receiving process does not have.
        a.send_bytes(b"c__main__\nNoSuchThing_\n.")
        with pytest.raises(SerializationError, match="does not unpickle: AttributeError"):
            b.recv()
        a.send({"still": "usable"})  # the stream stays in step after a bad frame
        assert b.recv() == {"still": "usable"}
    finally:
        a.close()
        b.close()
        listener.close()
