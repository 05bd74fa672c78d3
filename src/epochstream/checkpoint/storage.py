"""Checkpoint directories on any storage (local path or ``s3://``), laid out like Flink's::

    <root>/<job_id>/chk-<n>/            files private to checkpoint n
    <root>/<job_id>/chk-<n>/_metadata   written last, atomically: its presence = completed
    <root>/<job_id>/shared/             files incremental checkpoints share (reference-counted)

A directory without ``_metadata`` is a pending, aborted or crashed checkpoint and is
never restored from. ``_metadata`` holds pickles, so a local one is read only when it
and every directory above it pass the shared-storage check
(:func:`~epochstream.core.filesystems.check_trusted_location`), unless the caller
passes ``trust_shared=True``. Directory ids also seed the coordinator's id counter, so ids stay
monotonic across restarts of the job master. Every read and write goes through a
:class:`~epochstream.core.filesystems.StorageFS`.

Example::

    storage = CheckpointStorage("/data/ck", "job-1")
    storage.write_metadata(1, metadata)      # "/data/ck/job-1/chk-1/_metadata"
    storage.completed_ids() == [1]
"""

from __future__ import annotations

import logging
import os
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from epochstream.checkpoint.metadata import CheckpointMetadata
from epochstream.core.filesystems import (
    StorageFS,
    check_trusted_location,
    ensure_private_location,
    normalize_location,
    storage_fs,
)
from epochstream.core.storage_faults import READ_RETRY, unavailable_or
from epochstream.exceptions import (
    CheckpointError,
    ConfigurationError,
    StorageUnavailableError,
    UntrustedStorageError,
)

__all__ = [
    "CHECKPOINT_PREFIX",
    "METADATA_FILE",
    "SHARED_DIR",
    "CheckpointEntry",
    "CheckpointStorage",
    "find_completed_checkpoints",
    "load_metadata",
    "scan_checkpoints",
]

log = logging.getLogger(__name__)

METADATA_FILE = "_metadata"
CHECKPOINT_PREFIX = "chk-"
SHARED_DIR = "shared"
_CHK_RE = re.compile(r"^chk-([1-9][0-9]*)$")


def _chk_ids(fs: StorageFS, directory: str) -> list[int]:
    """Ids of the ``chk-<n>`` entries directly inside ``directory``, ascending."""
    try:
        names = fs.listdir(directory, dirs_only=True)
    except OSError as err:  # e.g. a regular file where the directory should be
        # Not retried: listing happens at start (where a bad location must fail fast)
        # and in cleanups (which a later cleanup repeats).
        message = f"{directory}: cannot list checkpoints: {err.strerror or err}"
        raise unavailable_or(
            err,
            what="list checkpoints in",
            path=directory,
            other=lambda _text: CheckpointError(message),
        ) from err
    return sorted(int(m.group(1)) for m in map(_CHK_RE.match, names) if m)


def _read_metadata(
    fs: StorageFS, metadata_path: str, options: Any = None, *, trust_shared: bool = False
) -> CheckpointMetadata:
    """The parsed ``_metadata``; storage that cannot be reached is retried, then raises
    ``StorageUnavailableError`` (never ``CheckpointError``: the checkpoint is not bad)."""
    # Unpickling runs code: the file and every directory above it must be ours first.
    check_trusted_location(metadata_path, what="checkpoint metadata", trust_shared=trust_shared)
    try:
        data = READ_RETRY.run(
            lambda: fs.read_bytes(metadata_path),
            what="read checkpoint metadata",
            path=metadata_path,
        )
    except OSError as err:
        raise CheckpointError(f"{metadata_path}: cannot read checkpoint metadata: {err}") from err
    base = metadata_path.rsplit("/", 1)[0]
    return CheckpointMetadata.from_json(data, base=base, source=metadata_path, options=options)


def _exists(fs: StorageFS, path: str) -> bool:
    """Whether ``path`` exists; an outage is retried, then ``StorageUnavailableError``."""
    return READ_RETRY.run(lambda: fs.exists(path), what="look up", path=path)


class CheckpointStorage:
    """The checkpoint directories of one job under ``root`` (a path or URI).

    Example::

        s = CheckpointStorage("s3://bucket/ck", "job-1", {"endpoint_url": "http://127.0.0.1:8333"})
        s.job_dir == "s3://bucket/ck/job-1"

    ``trust_shared``: skip the shared-storage check of a local root (see
    :meth:`check_trusted`).
    """

    def __init__(
        self,
        root: str,
        job_id: str,
        options: Mapping[str, Any] | None = None,
        *,
        trust_shared: bool = False,
    ) -> None:
        if (
            not isinstance(job_id, str)
            or not job_id
            or job_id in (".", "..")
            or "/" in job_id
            or (os.sep != "/" and os.sep in job_id)
        ):
            raise ConfigurationError(
                f"job id {job_id!r} cannot name a checkpoint directory "
                "(it must be non-empty and contain no path separator)"
            )
        self.root = normalize_location(root)
        self.options = dict(options or {})
        self.fs = storage_fs(self.root, self.options)
        self.job_id = job_id
        self.trust_shared = trust_shared
        self._job_dir = self.fs.join(self.root, job_id)
        # The job directory is made once (by check_writable when the job starts, else
        # by the first write) and never again: if it vanishes, its file system went
        # away (see filesystems._makedirs_in_layout).
        self._job_dir_made = False

    def _make_job_dir_once(self) -> None:
        if not self._job_dir_made:
            self.fs.makedirs(self._job_dir)
            self._job_dir_made = True

    def __repr__(self) -> str:
        return f"CheckpointStorage(root={self.root!r}, job_id={self.job_id!r})"

    @property
    def job_dir(self) -> str:
        """``<root>/<job_id>``."""
        return self._job_dir

    @property
    def shared_dir(self) -> str:
        """``<root>/<job_id>/shared``: files incremental checkpoints share."""
        return self.fs.join(self._job_dir, SHARED_DIR)

    def check_trusted(self) -> None:
        """Create a missing local root ``0700``; refuse one other local users can change.

        Raises :class:`~epochstream.exceptions.UntrustedStorageError` (before anything is
        read from it) unless ``trust_shared``; object stores are not checked.

        Example: ``CheckpointStorage("/tmp/shared", "j").check_trusted()`` raises on a 0777 dir.
        """
        ensure_private_location(
            self.root, what="checkpoint storage", trust_shared=self.trust_shared
        )

    def check_writable(self) -> None:
        """Fail now, before any record is read, if checkpoints cannot be written here.

        Creates the job directory (``0700`` locally), writes, reads back and deletes a
        probe file. Raises :class:`CheckpointError` naming the location and the reason.
        """
        probe = self.fs.join(self._job_dir, f".probe-{uuid.uuid4().hex}")
        payload = b"epochstream storage probe\n"
        try:
            self._make_job_dir_once()
            self.fs.write_bytes(probe, payload)
            if self.fs.read_bytes(probe) != payload:
                raise OSError(f"read back different bytes from {probe}")
            self.fs.delete_file(probe)
        except OSError as err:
            where = getattr(err, "filename", None) or probe
            raise CheckpointError(
                f"checkpoint storage {self.root} is not usable: cannot write {where}: "
                f"{getattr(err, 'strerror', None) or err}"
            ) from err

    def checkpoint_path(self, checkpoint_id: int) -> str:
        """Location of ``chk-<checkpoint_id>``."""
        if isinstance(checkpoint_id, bool) or not isinstance(checkpoint_id, int):
            raise TypeError(f"checkpoint id must be an int, got {checkpoint_id!r}")
        if checkpoint_id < 1:
            raise ValueError(f"checkpoint ids start at 1, got {checkpoint_id}")
        return self.fs.join(self._job_dir, f"{CHECKPOINT_PREFIX}{checkpoint_id}")

    def checkpoint_dir(self, checkpoint_id: int) -> str:
        """Create (if needed) and return the directory of checkpoint ``checkpoint_id``."""
        path = self.checkpoint_path(checkpoint_id)
        try:
            self._make_job_dir_once()
            self.fs.makedirs(path)
        except OSError as err:
            raise CheckpointError(f"{path}: cannot create checkpoint directory: {err}") from err
        return path

    def metadata_path(self, checkpoint_id: int) -> str:
        """Location of the ``_metadata`` file of checkpoint ``checkpoint_id``."""
        return self.fs.join(self.checkpoint_path(checkpoint_id), METADATA_FILE)

    def write_metadata(self, checkpoint_id: int, metadata: CheckpointMetadata) -> str:
        """Atomically write ``_metadata``, making the checkpoint complete; returns its path."""
        if metadata.checkpoint_id != checkpoint_id:
            raise CheckpointError(
                f"metadata of checkpoint {metadata.checkpoint_id} cannot be written as "
                f"checkpoint {checkpoint_id}"
            )
        directory = self.checkpoint_path(checkpoint_id)
        try:
            self._make_job_dir_once()
        except OSError as err:
            raise unavailable_or(
                err,
                what="create job directory",
                path=self._job_dir,
                other=lambda text: CheckpointError(text),
            ) from err
        return write_metadata_file(self.fs, directory, metadata)

    def discard(self, checkpoint_id: int) -> None:
        """Delete checkpoint ``checkpoint_id``'s directory; a missing one is fine.

        ``_metadata`` goes first: a deletion cut short (or an object store deleting in
        any order) must never leave a checkpoint that lists as complete without its files.
        """
        path = self.checkpoint_path(checkpoint_id)
        try:
            self.fs.delete_file(self.metadata_path(checkpoint_id))
            self.fs.delete_dir(path)
        except OSError as err:
            raise CheckpointError(f"{path}: cannot discard checkpoint directory: {err}") from err

    def probe(self, checkpoint_id: int | None) -> None:
        """Raise what using checkpoint storage raises now: the ``_metadata`` of
        ``checkpoint_id`` is read (a listing of the job directory when ``None``), then a
        probe file is written and deleted (a full disk or a read-only mount still
        reads; the next attempt needs both).

        One attempt, no retry: the job master calls it to learn whether storage is back.
        """
        if checkpoint_id is None:
            self.fs.listdir(self._job_dir)
        else:
            self.fs.read_bytes(self.metadata_path(checkpoint_id))
        # In shared/: a local job directory whose file system went away is then not
        # made again on the bare mount point (see filesystems._makedirs_in_layout).
        probe = self.fs.join(self._job_dir, SHARED_DIR, f".probe-{uuid.uuid4().hex}")
        try:
            self.fs.write_bytes(probe, b"epochstream storage probe\n")
        except OSError:
            # A full disk may leave the file created but empty: remove it if we can;
            # the write's error is what the caller needs.
            try:
                self.fs.delete_file(probe)
            except OSError as err:
                log.debug("cannot remove storage probe %s: %s", probe, err)
            raise
        self.fs.delete_file(probe)

    def checkpoint_ids(self) -> list[int]:
        """Ids of every ``chk-<n>`` directory, completed or not, ascending."""
        return _chk_ids(self.fs, self._job_dir)

    def completed_ids(self) -> list[int]:
        """Ids of the completed checkpoints (those with ``_metadata``), ascending."""
        return [n for n in self.checkpoint_ids() if self.fs.exists(self.metadata_path(n))]

    def latest_completed_id(self) -> int | None:
        """The highest completed checkpoint id, ``None`` if there is none."""
        ids = self.completed_ids()
        return ids[-1] if ids else None

    def load(self, checkpoint_id: int) -> CheckpointMetadata:
        """Read the metadata of completed checkpoint ``checkpoint_id``."""
        return _read_metadata(
            self.fs, self.metadata_path(checkpoint_id), self.options, trust_shared=self.trust_shared
        )

    def max_checkpoint_id(self) -> int:
        """Highest ``chk-<n>`` present, completed or not; 0 if none (seeds the id counter)."""
        ids = self.checkpoint_ids()
        return ids[-1] if ids else 0

    def shared_files(self) -> list[str]:
        """Every file in the shared directory (for garbage collection and tests)."""
        shared = self.shared_dir
        return [self.fs.join(shared, name) for name in self.fs.listdir(shared)]


def write_metadata_file(fs: StorageFS, directory: str, metadata: CheckpointMetadata) -> str:
    """Write ``directory/_metadata`` atomically (paths in it relative to ``directory``)."""
    data = metadata.to_json(directory)
    final = fs.join(directory, METADATA_FILE)
    try:
        fs.write_atomic(final, data)
    except OSError as err:
        message = f"{final}: cannot write checkpoint metadata: {err}"
        raise unavailable_or(
            err,
            what="write checkpoint metadata",
            path=final,
            other=lambda _text: CheckpointError(message),
        ) from err
    return final


def load_metadata(
    path: str, options: Mapping[str, Any] | None = None, *, trust_shared: bool = False
) -> tuple[str, CheckpointMetadata]:
    """Load a checkpoint or savepoint from its directory or its ``_metadata`` file.

    Returns ``(directory, metadata)``; raises :class:`CheckpointError` if ``path`` is
    not a completed checkpoint, and
    :class:`~epochstream.exceptions.UntrustedStorageError` if another local user could
    have changed it (unless ``trust_shared``).

    Example::

        directory, md = load_metadata("/data/ck/job-1/chk-4")
    """
    path = normalize_location(path)
    check_trusted_location(path, what="checkpoint or savepoint", trust_shared=trust_shared)
    fs = storage_fs(path, options)
    if path.rstrip("/").endswith("/" + METADATA_FILE) and _exists(fs, path):
        directory, metadata_path = path.rsplit("/", 1)[0], path
    else:
        directory, metadata_path = path, fs.join(path, METADATA_FILE)
    if not _exists(fs, metadata_path):
        raise CheckpointError(
            f"{path}: not a completed checkpoint or savepoint (no {METADATA_FILE} at {metadata_path})"
        )
    return directory, _read_metadata(fs, metadata_path, options, trust_shared=trust_shared)


@dataclass(frozen=True)
class CheckpointEntry:
    """A completed checkpoint (or savepoint) found on storage: metadata, or why not readable.

    Example::

        for entry in scan_checkpoints("/data/ck"):
            print(entry.directory, entry.error or entry.metadata.checkpoint_id)
    """

    directory: str
    job: str
    checkpoint_id: int
    metadata: CheckpointMetadata | None = None
    error: str | None = None
    #: The entry was refused unread: another local user could have changed it.
    untrusted: bool = False

    @property
    def ok(self) -> bool:
        """True when the metadata was read and parsed."""
        return self.metadata is not None


def scan_checkpoints(
    path: str, options: Mapping[str, Any] | None = None, *, trust_shared: bool = False
) -> list[CheckpointEntry]:
    """Every completed checkpoint under ``path`` (a storage root, a job dir or a chk dir).

    Also finds savepoint directories (any sub-directory holding ``_metadata``). A
    ``_metadata`` that cannot be read or parsed does not raise: its entry carries the
    error. Sorted by (job, checkpoint id). A path that does not exist raises
    :class:`CheckpointError`; a local ``path`` other local users could change raises
    :class:`~epochstream.exceptions.UntrustedStorageError` before anything under it is
    read (unless ``trust_shared``), and such a checkpoint below it is an entry with an
    error.

    Example::

        bad = [e for e in scan_checkpoints("/data/ck") if not e.ok]
    """
    path = normalize_location(path)
    check_trusted_location(path, what="checkpoint storage", trust_shared=trust_shared)
    fs = storage_fs(path, options)
    if path.endswith("/" + METADATA_FILE) and fs.exists(path):
        candidates = [path.rsplit("/", 1)[0]]
    elif fs.exists(fs.join(path, METADATA_FILE)):
        candidates = [path]
    elif fs.isdir(path):
        candidates = []
        own = _chk_ids(fs, path)
        job_dirs = [path] if own else [fs.join(path, n) for n in fs.listdir(path, dirs_only=True)]
        for job_dir in job_dirs:
            if fs.exists(fs.join(job_dir, METADATA_FILE)):
                candidates.append(job_dir)  # a savepoint directory
                continue
            candidates.extend(
                fs.join(job_dir, f"{CHECKPOINT_PREFIX}{n}") for n in _chk_ids(fs, job_dir)
            )
    else:
        raise CheckpointError(f"{path}: no such checkpoint directory")
    entries = []
    for chk_dir in candidates:
        metadata_path = fs.join(chk_dir, METADATA_FILE)
        if not fs.exists(metadata_path):
            continue
        name = chk_dir.rstrip("/").rsplit("/", 1)[-1]
        match = _CHK_RE.match(name)
        job = chk_dir.rsplit("/", 2)[-2] if match else name
        number = int(match.group(1)) if match else 0
        try:
            md = _read_metadata(fs, metadata_path, options, trust_shared=trust_shared)
        except StorageUnavailableError:
            raise  # storage is down: no entry is unreadable, the whole listing failed
        except (CheckpointError, UntrustedStorageError) as err:
            untrusted = isinstance(err, UntrustedStorageError)
            entries.append(
                CheckpointEntry(chk_dir, job, number, error=str(err), untrusted=untrusted)
            )
        else:
            entries.append(CheckpointEntry(chk_dir, md.job_id, md.checkpoint_id, metadata=md))
    entries.sort(key=lambda e: (e.job, e.checkpoint_id))
    return entries


def find_completed_checkpoints(
    path: str, options: Mapping[str, Any] | None = None, *, trust_shared: bool = False
) -> list[tuple[str, CheckpointMetadata]]:
    """Every readable completed checkpoint under ``path`` (see :func:`scan_checkpoints`).

    Example::

        for directory, md in find_completed_checkpoints("/data/ck"):
            print(md.job_id, md.checkpoint_id, directory)
    """
    entries = scan_checkpoints(path, options, trust_shared=trust_shared)
    return [(e.directory, e.metadata) for e in entries if e.metadata]
