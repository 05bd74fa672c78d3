"""Storage errors told apart: an outage (retry, wait) or corruption (fall back).

Every checkpoint and savepoint byte goes through a
:class:`~epochstream.core.filesystems.StorageFS`; when an operation on it fails,
:func:`classify` says what the error means:

- :attr:`StorageFault.TRANSIENT`: the storage cannot be reached or refuses service for
  now (connection refused or reset, a timeout, an HTTP 5xx, throttling, a local path
  that cannot be read or written for a reason an operator can clear: permissions, a
  read-only or full file system, an I/O error, a path component that is no longer a
  directory). Retrying may succeed; the checkpoint is not corrupt.
- :attr:`StorageFault.CORRUPT`: the storage answered and the data is wrong: a missing
  file in a reachable store (S3 answered 404, a local directory lacks it), a checksum
  mismatch, bytes that do not decode. Only this justifies falling back to an older
  checkpoint, which makes sinks write again what they committed after it.
- :attr:`StorageFault.OTHER`: anything else (a bug, bad credentials): neither retried
  here nor a reason to fall back.

:class:`StorageRetry` runs one read with bounded exponential back-off (:class:`Backoff`)
over transient faults and ends in :class:`~epochstream.exceptions.StorageUnavailableError`;
:func:`read_error` and :func:`unavailable_or` turn what is left into the error the caller
raises. Local files, S3, both state backends and ``_metadata`` reads use these, so there
is one notion of "storage is down" in the whole system. Sleep and clock are injected,
so the back-off is tested without sleeping.

Example::

    data = READ_RETRY.run(lambda: fs.read_bytes(path), what="read state file", path=path)
    # OSError left over after the retries (a missing file, ...): read_error(err, ...)
"""

from __future__ import annotations

import errno
import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import Enum
from typing import TypeVar

from epochstream.exceptions import (
    CorruptStateError,
    EpochstreamError,
    StateError,
    StorageUnavailableError,
)

__all__ = [
    "READ_RETRY",
    "Backoff",
    "StorageFault",
    "StorageRetry",
    "classify",
    "is_unavailable",
    "local_store_gone",
    "read_error",
    "unavailable_or",
]

T = TypeVar("T")


class StorageFault(Enum):
    """What a storage error means (see the module doc)."""

    TRANSIENT = "transient"
    CORRUPT = "corrupt"
    OTHER = "other"


#: errno values of an unreachable or refusing store, local or network-mounted.
_TRANSIENT_ERRNOS = frozenset(
    getattr(errno, name)
    for name in (
        "EACCES",
        "EPERM",
        "EROFS",
        "ENOSPC",
        "EDQUOT",
        "EIO",
        "ESTALE",
        "ETIMEDOUT",
        "ECONNREFUSED",
        "ECONNRESET",
        "ECONNABORTED",
        "EHOSTUNREACH",
        "ENETUNREACH",
        "ENETDOWN",
        "EAGAIN",
        "EBUSY",
        "ENOTCONN",
        "EPIPE",
        "EINTR",
        "ENOTDIR",
    )
    if hasattr(errno, name)
)

#: How pyarrow's S3 client words an unreachable, failing or throttling server (it raises
#: a plain ``OSError`` without errno, e.g. "AWS Error NETWORK_CONNECTION during HeadObject
#: operation: curlCode: 7, Could not connect to server").
_TRANSIENT_TEXT = re.compile(
    r"NETWORK_CONNECTION|curlCode|could not connect|couldn't connect|connection refused"
    r"|connection reset|timed out|timeout|SLOW_DOWN|SlowDown|throttl|TooManyRequests"
    r"|REQUEST_LIMIT_EXCEEDED|SERVICE_UNAVAILABLE|ServiceUnavailable|INTERNAL_FAILURE"
    r"|InternalError|HTTP status 5\d\d|response code:? 5\d\d|HTTP 5\d\d",
    re.IGNORECASE,
)


def classify(error: BaseException) -> StorageFault:
    """Whether ``error`` (or an error it was raised from) is an outage, corruption or
    neither. The first cause in the ``__cause__`` chain that is not OTHER decides.

    Example::

        classify(ConnectionRefusedError()) is StorageFault.TRANSIENT
        classify(FileNotFoundError()) is StorageFault.CORRUPT
    """
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        fault = _classify_one(current)
        if fault is not StorageFault.OTHER:
            return fault
        current = current.__cause__
    return StorageFault.OTHER


def _classify_one(error: BaseException) -> StorageFault:
    if isinstance(error, StorageUnavailableError):
        return StorageFault.TRANSIENT
    if isinstance(error, CorruptStateError):
        return StorageFault.CORRUPT
    if isinstance(error, FileNotFoundError):
        if isinstance(error.filename, str) and local_store_gone(error.filename):
            return StorageFault.TRANSIENT
        # The store answered that the file is not there (S3: 404; locally the store is
        # there, or ENOTDIR would have been raised).
        return StorageFault.CORRUPT
    if isinstance(error, (ConnectionError, TimeoutError)):
        return StorageFault.TRANSIENT
    if isinstance(error, OSError):
        if error.errno in _TRANSIENT_ERRNOS:
            return StorageFault.TRANSIENT
        if _TRANSIENT_TEXT.search(str(error)):
            return StorageFault.TRANSIENT
    return StorageFault.OTHER


def local_store_gone(path: str) -> bool:
    """True when a missing local file ``path`` means the store went away, not a file.

    An unmounted file system leaves its (empty) mount point behind: the file's directory
    is missing and the nearest directory above it that exists is empty. That is an
    outage to wait out (the checkpoints are intact on the file system, and falling back
    would write committed output again). A file missing from a directory that exists,
    or a directory missing from a non-empty one (a deleted ``chk-<n>``), is corruption.
    Object-store keys (not absolute paths) never match.

    Example: ``local_store_gone("/mnt/ckpt/job/shared/f")`` after ``umount /mnt/ckpt``
    """
    if not path.startswith("/"):
        return False
    parent = os.path.dirname(path)
    if os.path.isdir(parent):
        return False
    current = parent
    while not os.path.isdir(current):
        above = os.path.dirname(current)
        if above == current:
            return False
        current = above
    try:
        with os.scandir(current) as entries:
            return next(entries, None) is None
    except OSError:
        return False


def is_unavailable(error: BaseException) -> bool:
    """True when ``error`` means the storage is unreachable now (:attr:`StorageFault.TRANSIENT`)."""
    return classify(error) is StorageFault.TRANSIENT


@dataclass(frozen=True)
class Backoff:
    """Exponential back-off: ``initial`` seconds, times ``multiplier`` per retry, at most
    ``max_delay``; retries stop once ``deadline`` seconds have passed (``None``: never).

    Example: ``list(Backoff(0.5, 2, 2, None).delays())[:4] == [0.5, 1.0, 2.0, 2.0]``
    """

    initial: float = 0.25
    multiplier: float = 2.0
    max_delay: float = 4.0
    deadline: float | None = 10.0

    def __post_init__(self) -> None:
        if self.initial <= 0 or self.multiplier < 1 or self.max_delay < self.initial:
            raise ValueError(f"invalid back-off {self!r}")

    def delays(self) -> Iterator[float]:
        """The endless sequence of delays (the deadline is the caller's to enforce)."""
        delay = self.initial
        while True:
            yield delay
            delay = min(delay * self.multiplier, self.max_delay)


class StorageRetry:
    """Runs a storage operation again after transient faults, with bounded back-off.

    Errors that are not transient propagate at once, unchanged. When the back-off's
    deadline passes, :class:`StorageUnavailableError` is raised from the last error.
    ``sleep`` and ``clock`` are injected (tests pass fakes).

    Example::

        retry = StorageRetry(Backoff(deadline=10.0))
        data = retry.run(lambda: fs.read_bytes(p), what="read _metadata", path=p)
    """

    def __init__(
        self,
        backoff: Backoff | None = None,
        *,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.backoff = backoff or Backoff()
        self._sleep = sleep
        self._clock = clock

    def run(self, operation: Callable[[], T], *, what: str, path: str) -> T:
        """``operation()``'s result, retried while it fails transiently (see class doc)."""
        start = self._clock()
        delays = self.backoff.delays()
        attempts = 0
        while True:
            attempts += 1
            try:
                return operation()
            except Exception as err:  # classified: only transient faults are retried
                if not is_unavailable(err):
                    raise
                delay = next(delays)
                elapsed = self._clock() - start
                deadline = self.backoff.deadline
                if deadline is not None and elapsed + delay > deadline:
                    raise StorageUnavailableError(
                        f"cannot {what} {path}: storage unavailable "
                        f"({attempts} attempts in {elapsed:.1f} s): {_first_line(err)}",
                        path=path,
                    ) from err
                self._sleep(delay)


#: The retry of reads during a restore (and of ``_metadata``): about 10 s of back-off,
#: on top of the S3 client's own retries, before the attempt fails as unavailable.
READ_RETRY = StorageRetry()


def read_error(err: BaseException, *, what: str, path: str) -> EpochstreamError:
    """The error to raise for a read of ``path`` that failed with ``err`` after retries:
    unavailable storage, a corrupt file, or a plain :class:`StateError`.

    Example: ``raise read_error(err, what="read keyed state file", path=p) from err``
    """
    if isinstance(err, EpochstreamError):
        return err
    fault = classify(err)
    text = f"cannot {what} {path}: {_first_line(err)}"
    if fault is StorageFault.TRANSIENT:
        return StorageUnavailableError(f"{text} (storage unavailable)", path=path)
    if fault is StorageFault.CORRUPT:
        return CorruptStateError(text, path=path)
    return StateError(text)


def unavailable_or(
    err: BaseException, *, what: str, path: str, other: Callable[[str], EpochstreamError]
) -> EpochstreamError:
    """The error to raise for an operation on ``path`` that is not retried (a write, a
    listing): :class:`StorageUnavailableError` when the storage is down, else
    ``other(message)``. A failed checkpoint write fails that checkpoint; a later one
    writes again.

    Example: ``raise unavailable_or(err, what="write", path=p, other=StateError) from err``
    """
    text = f"cannot {what} {path}: {_first_line(err)}"
    if is_unavailable(err):
        return StorageUnavailableError(f"{text} (storage unavailable)", path=path)
    return other(text)


def _first_line(err: BaseException) -> str:
    text = str(err) or type(err).__name__
    return text.splitlines()[0] if text else type(err).__name__
