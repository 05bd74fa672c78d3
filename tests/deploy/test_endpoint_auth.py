"""The job endpoint's sign-in, CSRF guard, savepoint targets and ended-job answers.

A fake job master stands in for the real one (no job runs): each class under test gets
injected fakes (a clock for login codes, an opener for the browser).
"""

from __future__ import annotations

import json
import os
import stat
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from epochstream.deploy.browser import open_in_browser, redirect_file
from epochstream.deploy.endpoint import Credentials, JobEndpoint, LoginCodes
from epochstream.deploy.http_server import Request
from epochstream.deploy.savepoints import SavepointRequest, SavepointTargets
from epochstream.exceptions import ConfigurationError

TOKEN = "the-token"


class _Config:
    def __init__(self, root: str) -> None:
        self.savepoint_location = root


class _Description:
    endpoint_savepoints_anywhere = False


class _Master:
    """Just what the endpoint's control routes touch."""

    job_id = "job-1"

    def __init__(self, root: str) -> None:
        self.finished_at: float | None = None
        self.outcome: str | None = None
        self.checkpoint_config = _Config(root)
        self.description = _Description()
        self.requests: list[SavepointRequest] = []
        self.cancelled = 0

    def status(self) -> dict[str, Any]:
        keys = ("job_id", "name", "state", "started_at", "finished_at", "restarts")
        return dict.fromkeys(keys, None)

    def cancel(self) -> None:
        self.cancelled += 1

    def request_savepoint(self, directory: str | None, *, terminate: bool) -> SavepointRequest:
        request = SavepointRequest(directory, terminate=terminate)
        self.requests.append(request)
        return request


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def master(tmp_path: Path) -> _Master:
    return _Master(str(tmp_path / "sp"))


@pytest.fixture
def endpoint(master: _Master) -> Iterator[JobEndpoint]:
    endpoint = JobEndpoint(master, host="127.0.0.1", token=TOKEN)
    endpoint.start()
    try:
        yield endpoint
    finally:
        endpoint.close()


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any) -> None:
        return None


def _call(
    url: str, method: str = "GET", body: Any = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        with opener.open(request, timeout=30) as reply:
            return reply.status, dict(reply.headers), reply.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


BEARER = {"Authorization": f"Bearer {TOKEN}"}


# ---------------------------------------------------------------------- LoginCodes


def test_login_codes_are_single_use_and_expire() -> None:
    clock = _Clock()
    codes = LoginCodes(ttl=60.0, clock=clock)
    first, second = codes.issue(), codes.issue()
    assert first != second and TOKEN not in first
    assert codes.redeem(first) and not codes.redeem(first)
    clock.now += 61
    assert not codes.redeem(second)
    assert not codes.redeem("guess")


def test_login_codes_forget_the_oldest_beyond_their_capacity() -> None:
    codes = LoginCodes(capacity=2, clock=_Clock())
    oldest, *rest = [codes.issue() for _ in range(3)]
    assert not codes.redeem(oldest)
    assert all(codes.redeem(code) for code in rest)


# ---------------------------------------------------------------------- Credentials


def _request(headers: dict[str, str]) -> Request:
    return Request("GET", "/v1/job", {}, headers, b"")


def test_credentials_accept_the_token_or_the_session_cookie() -> None:
    creds = Credentials(token=TOKEN, session="s3ss", cookie_name="epochstream-1")
    assert creds.check(_request({"authorization": f"Bearer {TOKEN}"})) == "token"
    assert creds.check(_request({"cookie": "other=1; epochstream-1=s3ss"})) == "cookie"
    assert creds.check(_request({"cookie": "epochstream-1=wrong"})) is None
    assert creds.check(_request({"cookie": "epochstream-2=s3ss"})) is None
    assert creds.check(_request({"authorization": "Bearer s3ss"})) is None
    assert creds.check(_request({"authorization": "Bearer \u00e9"})) is None
    cookie = creds.set_cookie()
    assert cookie.startswith("epochstream-1=s3ss;")
    assert {"HttpOnly", "SameSite=Strict", "Path=/v1/"} <= {p.strip() for p in cookie.split(";")}


# ---------------------------------------------------------------------- sign-in over HTTP


def test_a_login_code_signs_a_browser_in_once(endpoint: JobEndpoint) -> None:
    url = endpoint.login_url()
    assert TOKEN not in url
    status, headers, _ = _call(url)
    assert status == 303 and headers["Location"] == "/dashboard/"
    cookie = headers["Set-Cookie"].split(";", 1)[0]
    assert TOKEN not in cookie
    status, _, body = _call(endpoint.url + "/v1/jobs", headers={"Cookie": cookie})
    assert status == 200 and json.loads(body)["jobs"]
    again, _, body = _call(url)
    assert again == 401 and b"used up or expired" in body


def test_the_cli_mints_codes_with_the_token_only(endpoint: JobEndpoint) -> None:
    status, _, body = _call(endpoint.url + "/v1/dashboard/login", "POST", {}, BEARER)
    assert status == 200
    path = json.loads(body)["path"]
    assert path.startswith("/dashboard/login?code=")
    status, headers, _ = _call(endpoint.url + path)
    cookie = headers["Set-Cookie"].split(";", 1)[0]
    csrf = {"Cookie": cookie, "X-Requested-With": "epochstream-dashboard"}
    status, _, _ = _call(endpoint.url + "/v1/dashboard/login", "POST", {}, csrf)
    assert status == 403
    assert _call(endpoint.url + "/v1/dashboard/login", "POST", {})[0] == 401


def test_a_cookie_signed_post_needs_the_dashboard_header(
    endpoint: JobEndpoint, master: _Master
) -> None:
    _, headers, _ = _call(endpoint.login_url())
    cookie = headers["Set-Cookie"].split(";", 1)[0]
    status, _, body = _call(endpoint.url + "/v1/cancel", "POST", {}, {"Cookie": cookie})
    assert status == 403 and b"x-requested-with: epochstream-dashboard" in body
    assert master.cancelled == 0
    headers = {"Cookie": cookie, "X-Requested-With": "epochstream-dashboard"}
    assert _call(endpoint.url + "/v1/cancel", "POST", {}, headers)[0] == 200
    assert master.cancelled == 1


def test_a_dashboard_url_never_holds_the_token(endpoint: JobEndpoint) -> None:
    status, _, page = _call(endpoint.url + "/dashboard/")
    assert status == 200 and b"<html" in page.lower()
    status, _, script = _call(endpoint.url + "/dashboard/dashboard.js")
    assert b"#token" not in script and b"Authorization" not in script


# ---------------------------------------------------------------------- control after the end


def test_savepoint_and_cancel_answer_409_once_the_job_ended(
    endpoint: JobEndpoint, master: _Master
) -> None:
    master.finished_at, master.outcome = time.time(), "FINISHED"
    for path, body in (
        ("/v1/savepoints", {}),
        ("/v1/cancel", {}),
        ("/v1/cancel", {"savepoint": "x"}),
    ):
        status, _, reply = _call(endpoint.url + path, "POST", body, BEARER)
        assert status == 409 and json.loads(reply) == {"error": "job job-1 has ended (FINISHED)"}
    assert master.cancelled == 0 and master.requests == []


def test_a_savepoint_waiting_when_the_job_ends_answers_409(
    endpoint: JobEndpoint, master: _Master
) -> None:
    def end_the_job() -> None:
        deadline = time.monotonic() + 10
        while not master.requests and time.monotonic() < deadline:
            time.sleep(0.01)
        master.finished_at, master.outcome = time.time(), "CANCELED"

    threading.Thread(target=end_the_job, daemon=True).start()
    started = time.monotonic()
    status, _, reply = _call(endpoint.url + "/v1/savepoints", "POST", {}, BEARER)
    assert status == 409 and "has ended (CANCELED)" in json.loads(reply)["error"]
    assert time.monotonic() - started < 5


def test_api_savepoints_resolve_inside_the_root(
    endpoint: JobEndpoint, master: _Master, tmp_path: Path
) -> None:
    def answer() -> None:
        deadline = time.monotonic() + 10
        while not master.requests and time.monotonic() < deadline:
            time.sleep(0.01)
        request = master.requests[0]
        request.succeed(str(request.directory))

    threading.Thread(target=answer, daemon=True).start()
    status, _, reply = _call(
        endpoint.url + "/v1/savepoints", "POST", {"directory": "nightly"}, BEARER
    )
    assert status == 200 and json.loads(reply) == {"path": str(tmp_path / "sp" / "nightly")}
    status, _, reply = _call(endpoint.url + "/v1/savepoints", "POST", {"directory": "/etc"}, BEARER)
    assert status == 403 and "outside the savepoint root" in json.loads(reply)["error"]
    assert len(master.requests) == 1


# ---------------------------------------------------------------------- SavepointTargets


def test_savepoint_targets_resolve_like_the_user_means(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "sp"
    monkeypatch.setenv("HOME", str(root))
    targets = SavepointTargets(str(root), anywhere=False)
    assert targets.resolve(None) == str(root)
    assert targets.resolve("") == str(root)
    assert targets.resolve("a/b") == str(root / "a" / "b")
    assert targets.resolve("~/x") == str(root / "x")  # the home directory, not a "~" dir
    assert targets.resolve(f"file://{root}/y") == str(root / "y")
    for outside in ("..", "a/../../x", "/tmp", f"{root}-other", "s3://bucket/sp", "~/../x"):
        with pytest.raises(ConfigurationError, match="outside the savepoint root"):
            targets.resolve(outside)


def test_savepoint_targets_follow_symlinks_out_of_the_root(tmp_path: Path) -> None:
    root = tmp_path / "sp"
    root.mkdir()
    (root / "link").symlink_to(tmp_path)
    with pytest.raises(ConfigurationError, match="outside"):
        SavepointTargets(str(root), anywhere=False).resolve("link/x")


def test_savepoint_targets_in_a_bucket() -> None:
    targets = SavepointTargets("s3://bucket/sp", anywhere=False)
    assert targets.resolve("nightly") == "s3://bucket/sp/nightly"
    assert targets.resolve("s3://bucket/sp/x") == "s3://bucket/sp/x"
    for outside in ("s3://other/sp", "s3://bucket/spx", "../x", "/tmp/x"):
        with pytest.raises(ConfigurationError, match="outside"):
            targets.resolve(outside)


def test_anywhere_allows_other_targets_still_resolved(tmp_path: Path) -> None:
    targets = SavepointTargets(str(tmp_path / "sp"), anywhere=True)
    assert targets.resolve("/tmp/x") == "/tmp/x"
    assert targets.resolve("rel") == str(tmp_path / "sp" / "rel")
    assert targets.resolve("s3://other/p") == "s3://other/p"


# ---------------------------------------------------------------------- browser


def test_the_redirect_file_is_private(tmp_path: Path) -> None:
    url = "http://127.0.0.1:1/dashboard/login?code=abc&x=<y>"
    path = redirect_file(url, parent=str(tmp_path))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    page = path.read_text()
    assert "code=abc&amp;x=&lt;y&gt;" in page and "<y>" not in page


def test_the_browser_gets_only_the_file_on_its_command_line(tmp_path: Path) -> None:
    opened: list[str] = []
    url = "http://127.0.0.1:1/dashboard/login?code=secret-code"
    assert open_in_browser(url, opener=lambda u: opened.append(u) is None, parent=str(tmp_path))
    assert len(opened) == 1 and opened[0].startswith("file://") and "secret-code" not in opened[0]
    assert "secret-code" in Path(opened[0].removeprefix("file://")).read_text()


def test_stale_redirect_files_are_swept(tmp_path: Path) -> None:
    old = redirect_file("http://x/", parent=str(tmp_path))
    os.utime(old.parent, (0, 0))
    open_in_browser("http://y/", opener=lambda u: True, parent=str(tmp_path))
    assert not old.exists()
    assert len(list(tmp_path.iterdir())) == 1


# ---------------------------------------------------------------------- endpoint_host


def test_an_ipv6_endpoint_serves_the_api(master: _Master) -> None:
    endpoint = JobEndpoint(master, host="::1", token=TOKEN)
    endpoint.start()
    try:
        assert endpoint.url.startswith("http://[::1]:")
        status, _, body = _call(endpoint.url + "/v1/jobs", headers=BEARER)
        assert status == 200 and json.loads(body)["jobs"]
    finally:
        endpoint.close()


def test_a_bad_endpoint_host_fails_the_job_start_naming_the_option() -> None:
    import epochstream as es

    env = es.Environment(parallelism=1, runner="local", endpoint_host="no such host")
    env.from_sequence(0, 3).sink_to(es.sinks.DiscardSink())
    with pytest.raises(ConfigurationError, match=r"Environment\(endpoint_host='no such host'\)"):
        env.execute_async("bad-host")
