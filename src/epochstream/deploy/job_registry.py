"""The per-user registry of running jobs: how the CLI finds a job's endpoint and token.

Each driver writes one file, ``$XDG_STATE_HOME/epochstream/jobs/<job id>.json``
(``~/.local/state/...`` when unset), readable by its user only (directory ``0700``,
file ``0600``): job id and name, endpoint URL, bearer token, driver pid, start time.
It is removed when the job ends; an entry whose driver process is gone (a crash) is
stale and skipped (and removed) by :func:`running_jobs`.

Nothing read from the registry is trusted as is: the CLI sends the token to the
endpoint an entry names, so on a shared host a planted entry would steal it. The
directory must pass the same ownership check as checkpoint storage
(:func:`epochstream.core.private_files.trust_problem`); each entry must be a regular file owned by
this user and not writable by group or others (opened without following symlinks or
blocking on FIFOs), at most :data:`MAX_ENTRY_BYTES`, with every field of the right
type: a job id of :data:`JOB_ID_PATTERN` (it names the file) and an ``http(s)`` endpoint
with a host and a port and nothing else. Invalid entries are skipped with a warning
naming the file, never deleted.

Example::

    entry = register(JobEntry(job_id=..., name="wc", endpoint="http://127.0.0.1:8081",
                              token=token, pid=os.getpid(), started_at=time.time()))
    [e.job_id for e in running_jobs()]
    unregister(entry.job_id)
"""

from __future__ import annotations

import errno
import json
import logging
import math
import os
import re
import secrets
import stat
from dataclasses import asdict, dataclass
from urllib.parse import urlsplit

from epochstream.core.private_files import PRIVATE_FILE_MODE, makedirs_private, trust_problem
from epochstream.exceptions import ConfigurationError

__all__ = [
    "JOB_ID_PATTERN",
    "MAX_ENTRY_BYTES",
    "InvalidJobEntry",
    "JobEntry",
    "check_endpoint_url",
    "find_job",
    "read_entry",
    "register",
    "registry_dir",
    "running_jobs",
    "unregister",
    "validate_entry",
]

log = logging.getLogger(__name__)

#: What a job id may look like: it names the entry's file, so no ``/``, no ``..``.
JOB_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}")
#: The largest entry read (a real one is ~300 bytes).
MAX_ENTRY_BYTES = 64 * 1024
# A bearer token goes into an HTTP header: no spaces, no line breaks.
_TOKEN_PATTERN = re.compile(r"[A-Za-z0-9._~+/=-]{1,512}")
_FIELDS = {
    "job_id": str,
    "name": str,
    "endpoint": str,
    "token": str,
    "pid": int,
    "started_at": float,
}
_MAX_NAME = 1024
_SUFFIX = ".json"


class InvalidJobEntry(ConfigurationError):
    """A registry entry (or one about to be written) that is not to be trusted.

    Example: ``read_entry(path)`` raises it for a symlink, a FIFO or a ``file://`` endpoint.
    """


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


def check_endpoint_url(url: str) -> str:
    """``url`` if it is ``http(s)://host:port`` (optionally ending in ``/``), else
    :class:`InvalidJobEntry`: the CLI sends the job's token there, so no other scheme
    (``file:``, ``data:``), no credentials, path, query or fragment.

    Example: ``check_endpoint_url("http://127.0.0.1:8081")``
    """
    if not isinstance(url, str) or not url.isprintable() or any(c.isspace() for c in url):
        raise InvalidJobEntry(f"endpoint {url!r} is not a plain URL")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as err:
        raise InvalidJobEntry(f"endpoint {url!r} is not a valid URL: {err}") from err
    if parts.scheme not in ("http", "https"):
        raise InvalidJobEntry(f"endpoint {url!r}: only http and https endpoints are used")
    if not parts.hostname or port is None:
        raise InvalidJobEntry(f"endpoint {url!r} must name a host and a port")
    if parts.username is not None or parts.password is not None:
        raise InvalidJobEntry(f"endpoint {url!r} must not carry credentials")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise InvalidJobEntry(f"endpoint {url!r} must be scheme://host:port only")
    return url


def _check_job_id(job_id: object) -> str:
    if not isinstance(job_id, str) or not JOB_ID_PATTERN.fullmatch(job_id):
        raise InvalidJobEntry(
            f"job id {job_id!r} is not a job id (it must match {JOB_ID_PATTERN.pattern})"
        )
    return job_id


def _check_fields(data: object) -> JobEntry:
    """The entry ``data`` (decoded JSON) describes, every field checked."""
    if not isinstance(data, dict) or set(data) != set(_FIELDS):
        keys = sorted(data) if isinstance(data, dict) else type(data).__name__
        raise InvalidJobEntry(f"expected exactly the fields {sorted(_FIELDS)}, got {keys}")
    for name, kind in _FIELDS.items():
        value = data[name]
        ok = isinstance(value, int | float) if kind is float else isinstance(value, kind)
        if not ok or isinstance(value, bool):
            raise InvalidJobEntry(f"field {name!r} must be {kind.__name__}, got {value!r}")
    entry = JobEntry(**data)
    validate_entry(entry)
    return entry


def validate_entry(entry: JobEntry) -> JobEntry:
    """``entry`` if every field is safe to use (see the module doc), else :class:`InvalidJobEntry`.

    Example: ``validate_entry(JobEntry("../x", ...))`` raises.
    """
    _check_job_id(entry.job_id)
    check_endpoint_url(entry.endpoint)
    if not _TOKEN_PATTERN.fullmatch(entry.token):
        raise InvalidJobEntry("token has characters a bearer token cannot have")
    if len(entry.name) > _MAX_NAME or not entry.name.isprintable():
        raise InvalidJobEntry(f"name {entry.name[:80]!r} is too long or not printable")
    if entry.pid <= 0:  # kill(0) and kill(-1) would mean process groups
        raise InvalidJobEntry(f"pid {entry.pid} is not a process id")
    if not math.isfinite(entry.started_at):
        raise InvalidJobEntry(f"started_at {entry.started_at!r} is not a time")
    return entry


def registry_dir() -> str:
    """The directory of this user's job entries (created ``0700``).

    Raises :class:`ConfigurationError` when another local user could change it (it
    or a parent owned by someone else, or writable by group or others): entries there
    decide where the CLI sends job tokens.

    Example: ``registry_dir()   # "/home/ada/.local/state/epochstream/jobs"``
    """
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "state"
    )
    path = os.path.join(base, "epochstream", "jobs")
    makedirs_private(path)
    problem = trust_problem(path)
    if problem is not None:
        raise ConfigurationError(
            f"job registry {path} is not private to you: {problem}. Entries there tell "
            f"epochstream where to send job tokens; make it yours and chmod 700 it "
            f"(or remove it: it is recreated empty)"
        )
    if stat.S_IMODE(os.stat(path).st_mode) & 0o077:
        # Readable by others (never writable: refused above) only shows job ids; close it.
        os.chmod(path, 0o700)
    return path


def _entry_path(directory: str, job_id: str) -> str:
    return os.path.join(directory, f"{_check_job_id(job_id)}{_SUFFIX}")


def register(entry: JobEntry) -> JobEntry:
    """Write ``entry`` atomically, ``0600``.

    The temporary file has a random name and is created exclusively without following
    symlinks, so a name planted in the directory cannot redirect the token.

    Example: ``register(JobEntry(job_id, "wc", url, token, os.getpid(), time.time()))``
    """
    validate_entry(entry)
    directory = registry_dir()
    final = _entry_path(directory, entry.job_id)
    tmp = os.path.join(directory, f".{entry.job_id}.{secrets.token_hex(8)}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, PRIVATE_FILE_MODE)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(asdict(entry), f)
        os.replace(tmp, final)
    except BaseException:
        os.unlink(tmp)
        raise
    return entry


def unregister(job_id: str) -> None:
    """Remove the entry of ``job_id`` (a missing one is fine).

    Example: ``unregister(client.job_id)``
    """
    try:
        os.unlink(_entry_path(registry_dir(), job_id))
    except FileNotFoundError:
        return


def read_entry(path: str) -> JobEntry:
    """The entry in file ``path``, checked; :class:`InvalidJobEntry` saying why not.

    It must be a regular file (a symlink is not followed, a FIFO not waited on) owned
    by this user, not writable by group or others, at most :data:`MAX_ENTRY_BYTES`,
    holding a valid entry whose job id is the file's name.

    Example: ``read_entry(os.path.join(registry_dir(), "3f2a....json"))``
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise InvalidJobEntry("it is a symlink") from err
        raise InvalidJobEntry(f"cannot open it: {err.strerror}") from err
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InvalidJobEntry("it is not a regular file")
        if st.st_uid != os.geteuid():
            raise InvalidJobEntry(f"it is owned by uid {st.st_uid}, not by you")
        if st.st_mode & 0o022:
            raise InvalidJobEntry(
                f"it is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
            )
        raw = f.read(MAX_ENTRY_BYTES + 1)
    if len(raw) > MAX_ENTRY_BYTES:
        raise InvalidJobEntry(f"it is larger than {MAX_ENTRY_BYTES} bytes")
    try:
        data = json.loads(raw)
    except ValueError as err:  # also bad UTF-8
        raise InvalidJobEntry(f"it is not JSON: {err}") from err
    entry = _check_fields(data)
    if os.path.basename(path) != f"{entry.job_id}{_SUFFIX}":
        raise InvalidJobEntry(f"its job id {entry.job_id!r} does not match its file name")
    return entry


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process reuses the pid: not ours to judge
    return True


# Files already warned about (name, reason): the progress reporter lists every second.
_WARNED: set[tuple[str, str]] = set()


def _warn_invalid(path: str, err: InvalidJobEntry) -> None:
    key = (path, str(err))
    if key not in _WARNED:
        _WARNED.add(key)
        log.warning("job registry: skipping %s: %s", path, err)


def running_jobs() -> list[JobEntry]:
    """Valid entries whose driver is alive, oldest first.

    Stale valid entries (driver gone) are removed; invalid ones are skipped with a
    warning naming the file and left alone.

    Example: ``[e.name for e in running_jobs()]``
    """
    entries: list[JobEntry] = []
    directory = registry_dir()
    for name in sorted(os.listdir(directory)):
        if not name.endswith(_SUFFIX):
            continue
        path = os.path.join(directory, name)
        try:
            entry = read_entry(path)
        except InvalidJobEntry as err:
            _warn_invalid(path, err)
            continue
        if _alive(entry.pid):
            entries.append(entry)
        else:
            unregister(entry.job_id)
    return sorted(entries, key=lambda e: e.started_at)


def find_job(prefix: str) -> JobEntry:
    """The running job whose id starts with ``prefix``; ConfigurationError otherwise.

    Example: ``find_job("3f2a").endpoint``
    """
    matches = [e for e in running_jobs() if e.job_id.startswith(prefix)]
    if not matches:
        raise ConfigurationError(f"no running job with id {prefix!r} (see `epochstream list`)")
    if len(matches) > 1:
        ids = ", ".join(e.job_id for e in matches)
        raise ConfigurationError(f"job id prefix {prefix!r} is ambiguous: {ids}")
    return matches[0]
