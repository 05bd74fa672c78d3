"""The per-user registry of running jobs: how the CLI finds a job's endpoint and token.

Each driver writes one file, ``$XDG_STATE_HOME/epochstream/jobs/<job id>.json``
(``~/.local/state/...`` when unset), readable by its user only (directory ``0700``,
file ``0600``): job id and name, endpoint URL, bearer token, driver pid, start time.
It is removed when the job ends; an entry whose driver process is gone (a crash) is
stale and skipped (and removed) by :func:`running_jobs`.

Example::

    entry = register(JobEntry(job_id=..., name="wc", endpoint="http://127.0.0.1:8081",
                              token=token, pid=os.getpid(), started_at=time.time()))
    [e.job_id for e in running_jobs()]
    unregister(entry.job_id)
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass

from epochstream._fs import PRIVATE_FILE_MODE, makedirs_private
from epochstream.exceptions import ConfigurationError

__all__ = ["JobEntry", "find_job", "register", "registry_dir", "running_jobs", "unregister"]


@dataclass(frozen=True)
class JobEntry:
    """One running job as the CLI sees it.

    Example::

        JobEntry("3f2a...", "wc", "http://127.0.0.1:40123", "tok", 4242, 1700000000.0)
    """

    job_id: str
    name: str
    endpoint: str
    token: str
    pid: int
    started_at: float


def registry_dir() -> str:
    """The directory of this user's job entries (created ``0700``)."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    path = os.path.join(base, "epochstream", "jobs")
    makedirs_private(path)
    return path


def register(entry: JobEntry) -> JobEntry:
    """Write ``entry`` (atomically, ``0600``)."""
    directory = registry_dir()
    final = os.path.join(directory, f"{entry.job_id}.json")
    tmp = f"{final}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE_MODE)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(asdict(entry), f)
    os.replace(tmp, final)
    return entry


def unregister(job_id: str) -> None:
    """Remove the entry of ``job_id`` (a missing one is fine)."""
    try:
        os.unlink(os.path.join(registry_dir(), f"{job_id}.json"))
    except FileNotFoundError:
        return


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process reuses the pid: not ours to judge
    return True


def running_jobs() -> list[JobEntry]:
    """Entries whose driver is alive, oldest first; stale ones are removed."""
    entries: list[JobEntry] = []
    directory = registry_dir()
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".json"):
            continue
        path = os.path.join(directory, name)
        try:
            with open(path, encoding="utf-8") as f:
                entry = JobEntry(**json.load(f))
        except (OSError, ValueError, TypeError):
            continue  # being written, or not ours: skip it
        if _alive(entry.pid):
            entries.append(entry)
        else:
            unregister(entry.job_id)
    return sorted(entries, key=lambda e: e.started_at)


def find_job(prefix: str) -> JobEntry:
    """The running job whose id starts with ``prefix``; ConfigurationError otherwise."""
    matches = [e for e in running_jobs() if e.job_id.startswith(prefix)]
    if not matches:
        raise ConfigurationError(f"no running job with id {prefix!r} (see `epochstream list`)")
    if len(matches) > 1:
        ids = ", ".join(e.job_id for e in matches)
        raise ConfigurationError(f"job id prefix {prefix!r} is ambiguous: {ids}")
    return matches[0]
