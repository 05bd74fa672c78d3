"""``epochstream list``, ``savepoint`` and ``cancel``: talk to running jobs.

A running job is found in this user's job registry (see
:mod:`epochstream.deploy.job_registry`, which validates every entry) by a prefix of its id;
the command then calls the job's authenticated HTTP endpoint
(:mod:`epochstream.deploy.endpoint`). The bearer token goes to that endpoint only:
redirects are not followed and proxies from the environment are not used.

Example::

    epochstream list
    epochstream savepoint 3f2a /data/savepoints
    epochstream cancel 3f2a --savepoint /data/savepoints
"""

from __future__ import annotations

import argparse
import json
import urllib.error
import urllib.request
from typing import Any

from epochstream.cli.common import fail, utc
from epochstream.deploy.job_registry import JobEntry, check_endpoint_url, find_job, running_jobs
from epochstream.exceptions import EpochstreamError

__all__ = ["add_job_commands", "call_endpoint"]

_TIMEOUT = 660.0
#: The largest reply read from a job endpoint (a vertex listing is a few KiB).
MAX_REPLY_BYTES = 16 * 1024 * 1024


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """Turn every redirect into an error: following one would re-send the token."""

    def redirect_request(
        self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str
    ) -> None:
        reason = f"redirected to {newurl}; not followed (it would get the job's token)"
        raise urllib.error.HTTPError(req.full_url, code, reason, headers, fp)


# No proxies (an HTTP proxy would see the token), no redirects, http(s) only.
_OPENER = urllib.request.OpenerDirector()
for _handler in (
    urllib.request.ProxyHandler({}),
    urllib.request.HTTPHandler(),
    urllib.request.HTTPSHandler(),
    urllib.request.HTTPDefaultErrorHandler(),
    _NoRedirects(),
    urllib.request.HTTPErrorProcessor(),
):
    _OPENER.add_handler(_handler)


def add_job_commands(sub: Any) -> None:
    """Register ``list``, ``savepoint`` and ``cancel`` on the subcommand parser ``sub``."""
    listing = sub.add_parser("list", help="running jobs of this user: id, name, state, endpoint")
    listing.set_defaults(handler=_cmd_list)
    sp = sub.add_parser(
        "savepoint",
        help="take a savepoint of a running job (it keeps running)",
        description="Take a savepoint of JOB_ID into DIR (default: the job's savepoint root, "
        "its savepoint_dir, else <checkpoint storage>/savepoints); prints its path. A relative "
        "DIR is relative to that root, and DIR must lie inside it unless the job was started "
        "with Environment(endpoint_savepoints_anywhere=True).",
    )
    sp.add_argument("job_id", metavar="JOB_ID", help="the job's id or a unique prefix of it")
    sp.add_argument(
        "dir", metavar="DIR", nargs="?", help="where the savepoint goes (inside the savepoint root)"
    )
    sp.set_defaults(handler=_cmd_savepoint)
    cancel = sub.add_parser(
        "cancel",
        help="cancel a running job, or stop it with a savepoint",
        description="Cancel JOB_ID; with --savepoint, stop it with a savepoint into DIR "
        "(sinks commit what it covers) and print its path. DIR resolves as for "
        "`epochstream savepoint`: relative to the job's savepoint root and inside it.",
    )
    cancel.add_argument("job_id", metavar="JOB_ID", help="the job's id or a unique prefix of it")
    cancel.add_argument("--savepoint", metavar="DIR", help="stop with a savepoint into DIR")
    cancel.set_defaults(handler=_cmd_cancel)


def call_endpoint(
    entry: JobEntry, method: str, path: str, body: dict[str, Any] | None = None
) -> Any:
    """Call the job's endpoint; the decoded JSON reply, or :class:`EpochstreamError`.

    Example: ``call_endpoint(find_job("3f2a"), "GET", "/v1/job")["state"]``
    """
    check_endpoint_url(entry.endpoint)  # whoever built the entry, never file: or data:
    data = None if body is None else json.dumps(body).encode("utf-8")
    request = urllib.request.Request(
        entry.endpoint + path,
        data=data,
        method=method,
        headers={"Authorization": f"Bearer {entry.token}", "Content-Type": "application/json"},
    )
    try:
        with _OPENER.open(request, timeout=_TIMEOUT) as response:
            return json.loads(_read_capped(response))
    except urllib.error.HTTPError as exc:
        raise EpochstreamError(_error_message(exc)) from exc
    except (urllib.error.URLError, OSError) as exc:
        raise EpochstreamError(
            f"job {entry.job_id} at {entry.endpoint} does not answer: {exc}"
        ) from exc


def _read_capped(response: Any) -> bytes:
    body: bytes = response.read(MAX_REPLY_BYTES + 1)
    if len(body) > MAX_REPLY_BYTES:
        raise EpochstreamError(f"reply of {response.url} is larger than {MAX_REPLY_BYTES} bytes")
    return body


def _error_message(exc: urllib.error.HTTPError) -> str:
    if 300 <= exc.code < 400:
        return f"job endpoint {exc.url} answered {exc.code}: {exc.reason}"
    try:
        reply = json.loads(_read_capped(exc))
    except (ValueError, EpochstreamError):
        return str(exc)
    return str(reply.get("error", exc)) if isinstance(reply, dict) else str(exc)


def _cmd_list(ns: argparse.Namespace) -> int:
    try:
        jobs = running_jobs()
    except EpochstreamError as exc:
        return fail("list", str(exc))
    if not jobs:
        print("no running jobs")
        return 0
    print(f"{'job':<34} {'name':<20} {'state':<12} {'started (UTC)':<20} endpoint")
    for entry in jobs:
        try:
            state = call_endpoint(entry, "GET", "/v1/job")["state"]
        except EpochstreamError:
            state = "UNREACHABLE"
        print(
            f"{entry.job_id:<34} {entry.name[:20]:<20} {state:<12} {utc(entry.started_at):<20} "
            f"{entry.endpoint}"
        )
    return 0


def _cmd_savepoint(ns: argparse.Namespace) -> int:
    try:
        entry = find_job(ns.job_id)
        reply = call_endpoint(entry, "POST", "/v1/savepoints", {"directory": ns.dir})
    except EpochstreamError as exc:
        return fail("savepoint", str(exc))
    print(reply["path"])
    return 0


def _cmd_cancel(ns: argparse.Namespace) -> int:
    try:
        entry = find_job(ns.job_id)
        reply = call_endpoint(entry, "POST", "/v1/cancel", {"savepoint": ns.savepoint})
    except EpochstreamError as exc:
        return fail("cancel", str(exc))
    print(reply.get("path") or f"cancelled {entry.job_id}")
    return 0
