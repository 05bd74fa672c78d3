"""A plane server in its own process, under a small file-descriptor limit.

Run by ``tests/runtime/test_listener.py``: ``python flood_target.py PLANE NOFILE`` with
the job secret on stdin. Prints ``ADDR host port`` once listening, then waits for
``exhaust`` / ``release`` / ``check`` commands on stdin:

- ``exhaust``: open /dev/null until EMFILE, so ``accept`` itself fails (EMFILE);
- ``release``: close those descriptors again;
- ``check``: print whether the accept thread is alive and what authenticated peers sent.
"""

from __future__ import annotations

import errno
import os
import queue
import resource
import sys

from epochstream.deploy.control import ControlServer
from epochstream.runtime.channels import InputGate
from epochstream.runtime.network import DataPlaneServer


def main() -> None:
    plane, nofile = sys.argv[1], int(sys.argv[2])
    secret = bytes.fromhex(sys.stdin.readline().strip())
    resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
    events: queue.Queue = queue.Queue()
    gate = InputGate(1, capacity=1000)
    if plane == "control":
        server = ControlServer("127.0.0.1", secret, events)
    else:
        server = DataPlaneServer("127.0.0.1", secret, lambda hello: (gate, 0), lambda h, e: None)
    server.start()
    listener = server._listener
    print("ADDR", *server.address, flush=True)
    held: list[int] = []
    for line in sys.stdin:
        command = line.strip()
        if command == "exhaust":
            while True:
                try:
                    held.append(os.open(os.devnull, os.O_RDONLY))
                except OSError as exc:
                    assert exc.errno == errno.EMFILE, exc
                    break
            print("EXHAUSTED", len(held), flush=True)
        elif command == "release":
            for fd in held:
                os.close(fd)
            held.clear()
            print("RELEASED", flush=True)
        elif command == "check":
            received = []
            while True:
                try:
                    kind, _conn, msg = events.get_nowait()
                except queue.Empty:
                    break
                if kind == "message":
                    received.append(msg)
            while (item := gate.take(timeout=0.01)) is not None:
                received.append(item[1])
            print(
                "CHECK",
                "alive" if listener._thread.is_alive() else "dead",
                listener.pending_handshakes,
                repr(received),
                flush=True,
            )


if __name__ == "__main__":
    main()
