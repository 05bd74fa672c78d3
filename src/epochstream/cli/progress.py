"""Progress of running jobs on the command line (``epochstream run`` and ``status``).

:func:`progress_line` turns the REST API's job and vertex replies into one line:
records/s read by the sources, the last checkpoint, restarts and backpressured
operators. :class:`ProgressReporter` runs beside ``epochstream run``: it finds the jobs
this driver process registered and polls their endpoints once a second. On a terminal
it redraws one status line on stderr; elsewhere (a log file, CI) it prints a plain line
every ``plain_every`` seconds and when the state changes. It names the dashboard and
how to sign in to it (``epochstream status JOB --open``), never a secret: neither the
token nor a login code lands in a terminal's scrollback or a log file.

Example::

    reporter = ProgressReporter(sys.stderr, clock=SystemClock())
    reporter.start(); ...; reporter.stop()
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, TextIO

from epochstream.cli.common import fail, human_size
from epochstream.cli.jobs import call_endpoint
from epochstream.core.clock import Clock
from epochstream.deploy.browser import open_in_browser
from epochstream.deploy.job_registry import JobEntry, find_job, running_jobs
from epochstream.exceptions import EpochstreamError

__all__ = ["ProgressReporter", "add_status_command", "login_url", "progress_line"]


def _rate(value: float) -> str:
    if value >= 1_000_000:
        return f"{value / 1_000_000:.1f}M"
    if value >= 1_000:
        return f"{value / 1_000:.1f}k"
    return f"{value:.0f}"


def progress_line(job: dict[str, Any], vertices: list[dict[str, Any]], *, now: float) -> str:
    """One line: state, records/s, last checkpoint, restarts, backpressured operators.

    Example: ``job 3f2a9c1b wordcount RUNNING | 12.3k records/s | checkpoint #5 2s ago
    (14 ms, 3.1 KiB) | restarts 0 | backpressured: tokenize (82%)``
    """
    rate = sum(v["rate"] for v in vertices if v["is_source"])
    parts = [f"job {job['job_id'][:8]} {job['name']} {job['state']}", f"{_rate(rate)} records/s"]
    if job["last_checkpoint_id"] is None:
        parts.append("no checkpoint yet")
    else:
        ago = max(now - job["last_checkpoint_time"], 0.0)
        parts.append(
            f"checkpoint #{job['last_checkpoint_id']} {ago:.0f}s ago "
            f"({job['last_checkpoint_duration_s'] * 1000:.0f} ms, "
            f"{human_size(job['last_checkpoint_size'])})"
        )
    parts.append(f"restarts {job['restarts']}")
    pressured = [v for v in vertices if v["backpressured"]]
    if pressured:
        parts.append(
            "backpressured: "
            + ", ".join(f"{v['name']} ({v['backpressured_ms_per_s'] / 10:.0f}%)" for v in pressured)
        )
    return " | ".join(parts)


class ProgressReporter:
    """Polls this process's jobs and writes their progress to ``out`` (a thread).

    Example: ``ProgressReporter(sys.stderr, clock=SystemClock()).start()``
    """

    def __init__(
        self, out: TextIO, *, clock: Clock, interval: float = 1.0, plain_every: float = 10.0
    ) -> None:
        self.out = out
        self.clock = clock
        self.interval = interval
        self.plain_every = plain_every
        self.tty = out.isatty()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="progress", daemon=True)
        self._announced: set[str] = set()
        self._last_plain: dict[str, tuple[float, str]] = {}
        self._drawn = False

    def start(self) -> None:
        """Start polling."""
        self._thread.start()

    def stop(self) -> None:
        """Stop polling and end the status line."""
        self._stop.set()
        self._thread.join(5.0)
        if self._drawn:
            self.out.write("\n")
            self.out.flush()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                entries = running_jobs()
            except EpochstreamError as exc:  # e.g. a registry other users could change
                self.out.write(f"epochstream run: no progress reports: {exc}\n")
                self.out.flush()
                return
            for entry in entries:
                if entry.pid == os.getpid():
                    self._report(entry)

    def _report(self, entry: JobEntry) -> None:
        try:
            job = call_endpoint(entry, "GET", "/v1/job")
            vertices = call_endpoint(entry, "GET", "/v1/job/vertices")["vertices"]
        except EpochstreamError:
            return  # the job just ended: its entry goes with it
        now = self.clock.wall()
        if entry.job_id not in self._announced:
            self._announced.add(entry.job_id)
            self._announce(entry)
        line = progress_line(job, vertices, now=now)
        if self.tty:
            self.out.write("\r\x1b[2K" + line)
            self._drawn = True
        else:
            last = self._last_plain.get(entry.job_id)
            if last is not None and now - last[0] < self.plain_every and last[1] == job["state"]:
                return
            self._last_plain[entry.job_id] = (now, job["state"])
            self.out.write(line + "\n")
        self.out.flush()

    def _announce(self, entry: JobEntry) -> None:
        redraw = "\r\x1b[2K" if self.tty else ""
        self.out.write(
            f"{redraw}job {entry.job_id} ({entry.name}): dashboard {entry.endpoint}/dashboard/ "
            f"(sign in: epochstream status {entry.job_id[:8]} --open)\n"
        )


def add_status_command(sub: Any) -> None:
    """Register ``status`` on the subcommand parser ``sub``.

    Example: ``add_status_command(parser.add_subparsers())``
    """
    status = sub.add_parser(
        "status",
        help="a running job's progress once: records/s, last checkpoint, restarts, backpressure",
        description="Print JOB_ID's progress line and one line per vertex; with --open, open "
        "the dashboard in a browser, signed in; with --dashboard, print a one-time sign-in URL "
        "(good once, for two minutes; it never holds the job's token).",
    )
    status.add_argument("job_id", metavar="JOB_ID", help="the job's id or a unique prefix of it")
    status.add_argument(
        "--dashboard", action="store_true", help="print a one-time dashboard sign-in URL"
    )
    status.add_argument(
        "--open", action="store_true", help="open the dashboard in a browser, signed in"
    )
    status.set_defaults(handler=_cmd_status)


def login_url(entry: JobEntry) -> str:
    """A one-time dashboard sign-in URL for ``entry``'s job (asks its endpoint).

    Example: ``login_url(find_job("3f2a"))   # ".../dashboard/login?code=..."``
    """
    reply = call_endpoint(entry, "POST", "/v1/dashboard/login", {})
    return f"{entry.endpoint}{reply['path']}"


def _dashboard(entry: JobEntry, open_browser: bool) -> int:
    url = login_url(entry)
    if not open_browser:
        print(url)
        return 0
    # Through a private redirect file: a URL on a browser's command line is readable
    # by every local user.
    if not open_in_browser(url):
        return fail("status", "no browser could be started; use --dashboard and open its URL")
    print(f"opened the dashboard of job {entry.job_id} in a browser")
    return 0


def _cmd_status(ns: Any) -> int:
    try:
        entry = find_job(ns.job_id)
        if ns.dashboard or ns.open:
            return _dashboard(entry, ns.open)
        job = call_endpoint(entry, "GET", "/v1/job")
        vertices = call_endpoint(entry, "GET", "/v1/job/vertices")["vertices"]
    except EpochstreamError as exc:
        return fail("status", str(exc))
    print(progress_line(job, vertices, now=time.time()))
    for v in vertices:
        print(
            f"  {v['name']}: p{v['parallelism']}, in {v['records_in']:,}, out {v['records_out']:,}, "
            f"{_rate(v['rate'])}/s, busy {v['busy_ms_per_s'] / 10:.0f}%, "
            f"backpressured {v['backpressured_ms_per_s'] / 10:.0f}%"
        )
    return 0
