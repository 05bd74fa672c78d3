"""A throwaway PostgreSQL server on loopback for the tests (Debian package ``postgresql``).

``initdb`` into a fresh directory with trust auth, ``max_prepared_transactions`` on (the
two-phase-commit sink needs it), a random free port and the unix socket in the data
directory; started with ``pg_ctl``. PostgreSQL refuses to run as root, so as root the
server runs as the ``postgres`` system user (the directory is created outside the
root-only pytest temp tree and handed to that user).

Example::

    server = PostgresServer().start()
    psycopg.connect(server.dsn)
    server.stop()
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile

__all__ = ["PostgresServer", "pg_bin_dir"]


def pg_bin_dir() -> str | None:
    """The directory of ``initdb`` and ``pg_ctl`` (newest installed major version), or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=_major)
    if found:
        return os.path.dirname(found[-1])
    initdb = shutil.which("initdb")
    return os.path.dirname(initdb) if initdb else None


def _major(path: str) -> int:
    try:
        return int(path.split("/")[4])
    except (IndexError, ValueError):
        return 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresServer:
    """One PostgreSQL cluster in a temporary directory."""

    def __init__(self) -> None:
        bindir = pg_bin_dir()
        if bindir is None:
            raise RuntimeError("PostgreSQL server binaries not found (apt-get install postgresql)")
        self.bindir = bindir
        self.port = _free_port()
        self.root = tempfile.mkdtemp(prefix="es-pg-")
        self.data = os.path.join(self.root, "data")
        self._user: pwd.struct_passwd | None = (
            pwd.getpwnam("postgres") if os.geteuid() == 0 else None
        )

    @property
    def dsn(self) -> str:
        """A libpq connection string for the ``postgres`` database as superuser ``postgres``."""
        return f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres"

    def _run(self, *args: str) -> None:
        def demote() -> None:
            assert self._user is not None
            os.setgid(self._user.pw_gid)
            os.setuid(self._user.pw_uid)

        subprocess.run(
            [os.path.join(self.bindir, args[0]), *args[1:]],
            check=True,
            capture_output=True,
            preexec_fn=demote if self._user is not None else None,
            cwd=self.root,
        )

    def start(self) -> PostgresServer:
        if self._user is not None:
            os.chown(self.root, self._user.pw_uid, self._user.pw_gid)
        self._run("initdb", "-D", self.data, "-U", "postgres", "--auth=trust", "-E", "UTF8")
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={self.data} "
            "-c max_prepared_transactions=50 -c max_connections=100 -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off"
        )
        log = os.path.join(self.root, "server.log")
        self._run("pg_ctl", "-D", self.data, "-o", options, "-l", log, "-w", "-t", "60", "start")
        return self

    def stop(self) -> None:
        try:
            self._run("pg_ctl", "-D", self.data, "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
