"""Checkpoint directories on a local (or POSIX-mounted) filesystem, laid out like Flink's::

    <root>/<job_id>/chk-<n>/            state files written by the tasks
    <root>/<job_id>/chk-<n>/_metadata   written last, atomically: its presence = completed

A directory without ``_metadata`` is a pending, aborted or crashed checkpoint and is
never restored from. Directory ids also seed the coordinator's id counter, so ids stay
monotonic across restarts of the job master.

Example::

    storage = CheckpointStorage("/tmp/ck", "job-1")
    d = storage.checkpoint_dir(1)            # "/tmp/ck/job-1/chk-1"
    storage.write_metadata(1, metadata)      # "/tmp/ck/job-1/chk-1/_metadata"
    storage.completed_ids() == [1]
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import uuid
from dataclasses import dataclass

from epochstream._fs import create_private, fsync_directory, makedirs_private
from epochstream.checkpoint.config import resolve_storage_path
from epochstream.checkpoint.metadata import CheckpointMetadata
from epochstream.exceptions import CheckpointError, ConfigurationError

__all__ = [
    "CHECKPOINT_PREFIX",
    "METADATA_FILE",
    "CheckpointEntry",
    "CheckpointStorage",
    "find_completed_checkpoints",
    "load_metadata",
    "scan_checkpoints",
]

METADATA_FILE = "_metadata"
CHECKPOINT_PREFIX = "chk-"
_CHK_RE = re.compile(r"^chk-([1-9][0-9]*)$")


def _chk_ids(directory: str) -> list[int]:
    """Ids of the ``chk-<n>`` directories directly inside ``directory``, ascending."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    except OSError as err:  # e.g. a regular file where the directory should be
        raise CheckpointError(
            f"{directory}: cannot list checkpoints: {err.strerror or err}"
        ) from err
    ids = []
    for name in names:
        match = _CHK_RE.match(name)
        if match and os.path.isdir(os.path.join(directory, name)):
            ids.append(int(match.group(1)))
    return sorted(ids)


def _read_metadata(metadata_path: str) -> CheckpointMetadata:
    try:
        with open(metadata_path, "rb") as f:
            data = f.read()
    except OSError as err:
        raise CheckpointError(f"{metadata_path}: cannot read checkpoint metadata: {err}") from err
    return CheckpointMetadata.from_json(data, source=metadata_path)


class CheckpointStorage:
    """The checkpoint directories of one job under ``root`` (a path or ``file://`` URL).

    Example::

        s = CheckpointStorage("file:///tmp/ck", "job-1")
        s.job_dir == "/tmp/ck/job-1"
    """

    def __init__(self, root: str, job_id: str) -> None:
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
        self.root = os.path.abspath(resolve_storage_path(root))
        self.job_id = job_id
        self._job_dir = os.path.join(self.root, job_id)

    def __repr__(self) -> str:
        return f"CheckpointStorage(root={self.root!r}, job_id={self.job_id!r})"

    @property
    def job_dir(self) -> str:
        """``<root>/<job_id>`` (not created until the first checkpoint directory is)."""
        return self._job_dir

    def checkpoint_path(self, checkpoint_id: int) -> str:
        """Path of ``chk-<checkpoint_id>`` without creating it."""
        if isinstance(checkpoint_id, bool) or not isinstance(checkpoint_id, int):
            raise TypeError(f"checkpoint id must be an int, got {checkpoint_id!r}")
        if checkpoint_id < 1:
            raise ValueError(f"checkpoint ids start at 1, got {checkpoint_id}")
        return os.path.join(self._job_dir, f"{CHECKPOINT_PREFIX}{checkpoint_id}")

    def check_writable(self) -> None:
        """Fail now, before any record is read, if checkpoints cannot be written here.

        Creates the job directory (``0700``), writes, fsyncs and deletes a probe file.
        Raises :class:`CheckpointError` naming the path and the reason.
        """
        probe = os.path.join(self._job_dir, f".probe-{uuid.uuid4().hex}")
        try:
            makedirs_private(self._job_dir)
            with create_private(probe) as f:
                f.write(b"epochstream storage probe\n")
                f.flush()
                os.fsync(f.fileno())
            os.unlink(probe)
        except OSError as err:
            raise CheckpointError(
                f"checkpoint storage {self.root} is not usable: cannot write "
                f"{err.filename or probe}: {err.strerror or err}"
            ) from err

    def checkpoint_dir(self, checkpoint_id: int) -> str:
        """Create (if needed) and return the directory of checkpoint ``checkpoint_id``."""
        path = self.checkpoint_path(checkpoint_id)
        try:
            makedirs_private(path)
        except OSError as err:
            raise CheckpointError(f"{path}: cannot create checkpoint directory: {err}") from err
        return path

    def metadata_path(self, checkpoint_id: int) -> str:
        """Path of the ``_metadata`` file of checkpoint ``checkpoint_id``."""
        return os.path.join(self.checkpoint_path(checkpoint_id), METADATA_FILE)

    def write_metadata(self, checkpoint_id: int, metadata: CheckpointMetadata) -> str:
        """Atomically write ``_metadata``, making the checkpoint complete; returns its path.

        The bytes go to a temporary file in the same directory, are fsynced, renamed
        over ``_metadata`` and the directory is fsynced, so a crash leaves either no
        ``_metadata`` or a whole one.
        """
        if metadata.checkpoint_id != checkpoint_id:
            raise CheckpointError(
                f"metadata of checkpoint {metadata.checkpoint_id} cannot be written as "
                f"checkpoint {checkpoint_id}"
            )
        data = metadata.to_json()
        directory = self.checkpoint_dir(checkpoint_id)
        final = os.path.join(directory, METADATA_FILE)
        tmp = ""
        try:
            # mkstemp creates the file 0600: checkpoints are private to their user.
            fd, tmp = tempfile.mkstemp(prefix=f".{METADATA_FILE}.", suffix=".tmp", dir=directory)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, final)
            tmp = ""
            fsync_directory(directory)
        except OSError as err:
            raise CheckpointError(f"{final}: cannot write checkpoint metadata: {err}") from err
        finally:
            if tmp:
                # The rename never happened: leave no partial file behind.
                try:
                    os.unlink(tmp)
                except FileNotFoundError:
                    pass
        return final

    def discard(self, checkpoint_id: int) -> None:
        """Delete checkpoint ``checkpoint_id``'s directory; a missing one is fine."""
        path = self.checkpoint_path(checkpoint_id)
        try:
            shutil.rmtree(path)
        except FileNotFoundError:
            return
        except OSError as err:
            raise CheckpointError(f"{path}: cannot discard checkpoint directory: {err}") from err

    def checkpoint_ids(self) -> list[int]:
        """Ids of every ``chk-<n>`` directory, completed or not, ascending."""
        return _chk_ids(self._job_dir)

    def completed_ids(self) -> list[int]:
        """Ids of the completed checkpoints (those with ``_metadata``), ascending."""
        return [n for n in self.checkpoint_ids() if os.path.isfile(self.metadata_path(n))]

    def latest_completed_id(self) -> int | None:
        """The highest completed checkpoint id, ``None`` if there is none."""
        ids = self.completed_ids()
        return ids[-1] if ids else None

    def load(self, checkpoint_id: int) -> CheckpointMetadata:
        """Read the metadata of completed checkpoint ``checkpoint_id``."""
        return _read_metadata(self.metadata_path(checkpoint_id))

    def max_checkpoint_id(self) -> int:
        """Highest ``chk-<n>`` present, completed or not; 0 if none (seeds the id counter)."""
        ids = self.checkpoint_ids()
        return ids[-1] if ids else 0


def load_metadata(path: str) -> tuple[str, CheckpointMetadata]:
    """Load a checkpoint from its directory or its ``_metadata`` file.

    Returns ``(checkpoint_directory, metadata)``; raises :class:`CheckpointError` if
    ``path`` is not a completed checkpoint.

    Example::

        directory, md = load_metadata("/tmp/ck/job-1/chk-4")
    """
    path = os.path.abspath(resolve_storage_path(path))
    if os.path.isdir(path):
        directory, metadata_path = path, os.path.join(path, METADATA_FILE)
    else:
        directory, metadata_path = os.path.dirname(path), path
    if not os.path.isfile(metadata_path):
        raise CheckpointError(
            f"{path}: not a completed checkpoint (no {METADATA_FILE} file at {metadata_path})"
        )
    return directory, _read_metadata(metadata_path)


@dataclass(frozen=True)
class CheckpointEntry:
    """A completed checkpoint found on storage: its metadata, or why it cannot be read.

    Example::

        for entry in scan_checkpoints("/tmp/ck"):
            print(entry.directory, entry.error or entry.metadata.checkpoint_id)
    """

    directory: str
    job: str
    checkpoint_id: int
    metadata: CheckpointMetadata | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        """True when the metadata was read and parsed."""
        return self.metadata is not None


def scan_checkpoints(path: str) -> list[CheckpointEntry]:
    """Every completed checkpoint under ``path`` (a storage root, a job dir or a chk dir).

    Unlike :func:`find_completed_checkpoints`, a ``_metadata`` that cannot be read or
    parsed does not raise: its entry carries the error. Sorted by (job, checkpoint id).
    A path that does not exist raises :class:`CheckpointError`.

    Example::

        bad = [e for e in scan_checkpoints("/tmp/ck") if not e.ok]
    """
    path = os.path.abspath(resolve_storage_path(path))
    if os.path.isfile(path) or os.path.isfile(os.path.join(path, METADATA_FILE)):
        directory = path if os.path.isdir(path) else os.path.dirname(path)
        candidates = [directory]
    elif os.path.isdir(path):
        job_dirs = [path] if _chk_ids(path) else _subdirs(path)
        candidates = [
            os.path.join(job_dir, f"{CHECKPOINT_PREFIX}{n}")
            for job_dir in job_dirs
            for n in _chk_ids(job_dir)
        ]
    else:
        raise CheckpointError(f"{path}: no such checkpoint directory")
    entries = []
    for chk_dir in candidates:
        metadata_path = os.path.join(chk_dir, METADATA_FILE)
        if not os.path.isfile(metadata_path):
            continue
        match = _CHK_RE.match(os.path.basename(chk_dir))
        job = os.path.basename(os.path.dirname(chk_dir))
        number = int(match.group(1)) if match else 0
        try:
            md = _read_metadata(metadata_path)
        except CheckpointError as err:
            entries.append(CheckpointEntry(chk_dir, job, number, error=str(err)))
        else:
            entries.append(CheckpointEntry(chk_dir, md.job_id, md.checkpoint_id, metadata=md))
    entries.sort(key=lambda e: (e.job, e.checkpoint_id))
    return entries


def find_completed_checkpoints(path: str) -> list[tuple[str, CheckpointMetadata]]:
    """Every readable completed checkpoint under ``path``: a storage root, a job dir or a chk dir.

    Sorted by (job id, checkpoint id); checkpoints whose ``_metadata`` is corrupt are
    left out (:func:`scan_checkpoints` reports them). A storage root or job directory
    with no completed checkpoint gives ``[]``; a path that does not exist raises
    :class:`CheckpointError`.

    Example::

        for directory, md in find_completed_checkpoints("/tmp/ck"):
            print(md.job_id, md.checkpoint_id, directory)
    """
    return [(e.directory, e.metadata) for e in scan_checkpoints(path) if e.metadata is not None]


def _subdirs(path: str) -> list[str]:
    try:
        names = sorted(os.listdir(path))
    except OSError as err:
        raise CheckpointError(f"{path}: cannot list checkpoint storage: {err}") from err
    return [os.path.join(path, n) for n in names if os.path.isdir(os.path.join(path, n))]
