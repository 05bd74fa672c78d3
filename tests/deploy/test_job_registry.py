"""The job registry on a shared host: nothing read from it is trusted as is.

Entries are planted as another local user would (symlinks, FIFOs, ``/dev/zero``,
``../`` job ids, ``file:``/``data:`` endpoints, foreign owners); the CLI's HTTP client
is pointed at loopback servers that redirect and record whether the token came along.
Listings that could hang or exhaust memory on a careless reader run in a child process
with a timeout and a memory limit.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from epochstream.cli.jobs import call_endpoint
from epochstream.deploy import job_registry
from epochstream.deploy.job_registry import (
    InvalidJobEntry,
    JobEntry,
    find_job,
    register,
    registry_dir,
    running_jobs,
    unregister,
)
from epochstream.exceptions import ConfigurationError, EpochstreamError

NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
TOKEN = "s3cr3t-token_AbC"
JOB_ID = "0123456789abcdef0123456789abcdef"


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``XDG_STATE_HOME`` in ``tmp_path``; returns the registry directory (made by us)."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return Path(registry_dir())


def _entry(**fields: object) -> dict[str, object]:
    data: dict[str, object] = {
        "job_id": JOB_ID,
        "name": "wc",
        "endpoint": "http://127.0.0.1:9",
        "token": TOKEN,
        "pid": os.getpid(),
        "started_at": 1.0,
    }
    data.update(fields)
    return data


def _plant(directory: Path, data: dict[str, object], name: str | None = None) -> Path:
    path = directory / (name or f"{data['job_id']}.json")
    path.write_text(json.dumps(data))
    os.chmod(path, 0o600)
    return path


def _list_in_child(state_home: Path) -> subprocess.CompletedProcess[str]:
    """``running_jobs()`` in a child with 20 s and 1 GiB: a hang or a read of /dev/zero
    shows as a timeout or a failure instead of stalling the suite."""
    code = (
        "import resource; resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n"
        "from epochstream.deploy.job_registry import running_jobs\n"
        "print([e.job_id for e in running_jobs()])\n"
    )
    env = {**os.environ, "XDG_STATE_HOME": str(state_home)}
    try:
        return subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=20, env=env
        )
    except subprocess.TimeoutExpired:
        pytest.fail("listing the registry hung")


def test_a_valid_entry_round_trips_and_a_stale_one_is_removed(state: Path) -> None:
    entry = register(JobEntry(**_entry()))  # type: ignore[arg-type]
    path = state / f"{JOB_ID}.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert running_jobs() == [entry] and find_job("0123") == entry
    unregister(JOB_ID)
    assert not path.exists()
    _plant(state, _entry(pid=2**22 + 7))  # no such process: stale, ours, removed
    assert running_jobs() == [] and not (state / f"{JOB_ID}.json").exists()


def test_an_entry_of_an_ipv6_endpoint_is_listed(state: Path) -> None:
    entry = register(JobEntry(**_entry(endpoint="http://[::1]:8081")))  # type: ignore[arg-type]
    assert running_jobs() == [entry] and entry.endpoint == "http://[::1]:8081"


def test_a_fifo_or_a_symlink_to_one_does_not_hang_the_listing(state: Path) -> None:
    fifo = state.parent / "fifo"
    os.mkfifo(fifo)
    (state / "link.json").symlink_to(fifo)
    os.mkfifo(state / "pipe.json")
    proc = _list_in_child(state.parent.parent)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stderr
    assert "link.json: it is a symlink" in proc.stderr
    assert "pipe.json: it is not a regular file" in proc.stderr


def test_a_symlink_to_dev_zero_is_not_read(state: Path) -> None:
    (state / "zero.json").symlink_to("/dev/zero")
    proc = _list_in_child(state.parent.parent)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stderr
    assert "zero.json: it is a symlink" in proc.stderr


def test_an_oversized_entry_is_skipped(state: Path, caplog: pytest.LogCaptureFixture) -> None:
    _plant(state, _entry(name="x" * (job_registry.MAX_ENTRY_BYTES + 1)))
    with caplog.at_level(logging.WARNING, "epochstream.deploy.job_registry"):
        assert running_jobs() == []
    assert "larger than" in caplog.text


def test_a_dotdot_job_id_is_never_used_in_a_path(
    state: Path, caplog: pytest.LogCaptureFixture
) -> None:
    victim = state.parent / "victim.json"  # outside the registry
    victim.write_text("precious")
    planted = _plant(state, _entry(job_id="../victim", pid=2**22 + 7), name="evil.json")
    with caplog.at_level(logging.WARNING, "epochstream.deploy.job_registry"):
        assert running_jobs() == []
    assert victim.read_text() == "precious"
    assert planted.exists(), "an invalid entry is reported, not deleted"
    assert str(planted) in caplog.text and "is not a job id" in caplog.text
    with pytest.raises(InvalidJobEntry):
        unregister("../victim")
    assert victim.exists()


@pytest.mark.parametrize(
    "endpoint",
    [
        "file:///etc/passwd",
        "data:application/json,{}",
        "ftp://127.0.0.1:21",
        "http://user:pw@127.0.0.1:80",
        "http://127.0.0.1:80/elsewhere",
        "http://127.0.0.1",
        "http://127.0.0.1:80\r\nX-Evil: 1",
    ],
)
def test_entries_with_endpoints_that_are_not_plain_http_are_skipped(
    state: Path, endpoint: str
) -> None:
    _plant(state, _entry(endpoint=endpoint))
    assert running_jobs() == []
    with pytest.raises(ConfigurationError, match="no running job"):
        find_job(JOB_ID[:4])
    with pytest.raises(InvalidJobEntry):  # however the entry was made
        call_endpoint(JobEntry(**_entry(endpoint=endpoint)), "GET", "/v1/job")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"token": "a b\r\nX: y"}, "token"),
        ({"pid": -1}, "not a process id"),
        ({"pid": True}, "must be int"),
        ({"extra": 1}, "exactly the fields"),
        ({"started_at": "now"}, "must be float"),
    ],
)
def test_entries_with_bad_fields_are_skipped(
    state: Path, caplog: pytest.LogCaptureFixture, fields: dict[str, object], reason: str
) -> None:
    _plant(state, _entry(**fields))
    with caplog.at_level(logging.WARNING, "epochstream.deploy.job_registry"):
        assert running_jobs() == []
    assert reason in caplog.text


def test_an_entry_whose_name_is_not_its_job_id_is_skipped(state: Path) -> None:
    _plant(state, _entry(), name="ffff.json")
    assert running_jobs() == []


@needs_root
def test_entries_others_own_or_can_write_are_skipped(state: Path) -> None:
    theirs = _plant(state, _entry())
    os.chown(theirs, NOBODY, -1)
    assert running_jobs() == []
    os.chown(theirs, os.geteuid(), -1)
    os.chmod(theirs, 0o666)
    assert running_jobs() == []


@needs_root
def test_a_registry_dir_others_can_write_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    jobs = tmp_path / "state" / "epochstream" / "jobs"
    jobs.mkdir(parents=True)
    os.chmod(jobs, 0o777)
    with pytest.raises(ConfigurationError, match=r"job registry .* is not private to you.*0777"):
        running_jobs()
    os.chmod(jobs, 0o700)
    os.chown(jobs, NOBODY, -1)
    with pytest.raises(ConfigurationError, match="owned by another user"):
        registry_dir()


def test_a_readable_registry_dir_is_closed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    jobs = tmp_path / "state" / "epochstream" / "jobs"
    jobs.mkdir(parents=True)
    os.chmod(jobs, 0o755)
    assert stat.S_IMODE(os.stat(registry_dir()).st_mode) == 0o700


def test_register_does_not_follow_a_symlink_planted_at_its_temporary_name(
    state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    victim = state.parent / "victim"
    victim.write_text("precious")
    # Where today's register() writes first: predictable from the pid.
    (state / f"{JOB_ID}.json.{os.getpid()}.tmp").symlink_to(victim)
    register(JobEntry(**_entry()))  # type: ignore[arg-type]
    assert victim.read_text() == "precious"
    # Even a planted symlink at the (random) name itself is not followed.
    monkeypatch.setattr(job_registry.secrets, "token_hex", lambda n: "fixed")
    (state / f".{JOB_ID}.fixed.tmp").symlink_to(victim)
    with pytest.raises(FileExistsError):
        register(JobEntry(**_entry()))  # type: ignore[arg-type]
    assert victim.read_text() == "precious"


def test_register_refuses_an_entry_it_could_not_read_back(state: Path) -> None:
    with pytest.raises(InvalidJobEntry):
        register(JobEntry(**_entry(job_id="../x")))  # type: ignore[arg-type]
    with pytest.raises(InvalidJobEntry):
        register(JobEntry(**_entry(endpoint="file:///tmp/x")))  # type: ignore[arg-type]


class _Recorder(BaseHTTPRequestHandler):
    """Answers 302 to ``server.location`` when set, else ``{"state": "RUNNING"}``; records
    each request's Authorization header."""

    def do_GET(self) -> None:
        server = self.server
        server.seen.append(self.headers.get("Authorization"))  # type: ignore[attr-defined]
        location = server.location  # type: ignore[attr-defined]
        if location:
            self.send_response(302)
            self.send_header("Location", location)
            self.end_headers()
            return
        body = b'{"state": "RUNNING"}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        return  # keep test output clean


@pytest.fixture
def servers() -> Iterator[list[ThreadingHTTPServer]]:
    """The loopback servers a test starts with :func:`_serve`, shut down after it."""
    started: list[ThreadingHTTPServer] = []
    yield started
    for server in started:
        server.shutdown()
        server.server_close()


def _serve(started: list[ThreadingHTTPServer], location: str | None = None) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    server.seen = []  # type: ignore[attr-defined]
    server.location = location  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    started.append(server)
    return server


def _url(server: ThreadingHTTPServer) -> str:
    host, port = server.server_address[:2]
    return f"http://{host!s}:{port}"


def test_a_redirect_is_not_followed_and_the_token_not_resent(
    servers: list[ThreadingHTTPServer],
) -> None:
    thief = _serve(servers)
    job = _serve(servers, location=_url(thief) + "/v1/job")
    entry = JobEntry(**_entry(endpoint=_url(job)))  # type: ignore[arg-type]
    with pytest.raises(EpochstreamError, match="302"):
        call_endpoint(entry, "GET", "/v1/job")
    assert job.seen == [f"Bearer {TOKEN}"]  # type: ignore[attr-defined]
    assert thief.seen == []  # type: ignore[attr-defined]


def test_a_proxy_from_the_environment_never_sees_the_token(
    servers: list[ThreadingHTTPServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy, job = _serve(servers), _serve(servers)
    for name in ("http_proxy", "HTTP_PROXY"):
        monkeypatch.setenv(name, _url(proxy))
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    # urlopen() caches its opener (and the proxies of that moment): start afresh.
    monkeypatch.setattr(urllib.request, "_opener", None)
    entry = JobEntry(**_entry(endpoint=_url(job)))  # type: ignore[arg-type]
    assert call_endpoint(entry, "GET", "/v1/job") == {"state": "RUNNING"}
    assert proxy.seen == [] and job.seen == [f"Bearer {TOKEN}"]  # type: ignore[attr-defined]


def test_list_reports_an_open_registry_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from epochstream.cli import main

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    jobs = tmp_path / "state" / "epochstream" / "jobs"
    jobs.mkdir(parents=True)
    os.chmod(jobs, 0o777)
    assert main(["list"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("epochstream list: job registry ") and "not private" in err
    assert len(err.strip().splitlines()) == 1
