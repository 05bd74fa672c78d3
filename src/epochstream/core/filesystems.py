"""Checkpoint storage locations: local paths and object stores behind one interface.

A location is a string: an absolute local path (or ``file://`` URL) or an
``s3://bucket/prefix`` URI. :func:`storage_fs` returns the :class:`StorageFS` that
reads and writes it; every checkpoint and savepoint byte goes through one.

- Local: plain ``os`` calls. Files are created ``0600`` and directories ``0700``
  (checkpoints hold pickles); :meth:`StorageFS.write_atomic` writes a temporary file,
  fsyncs and renames it, then fsyncs the directory.
- S3 (through ``pyarrow.fs.S3FileSystem``, never hand-written HTTP): there is no
  rename, so state files are written under unique names first and ``_metadata`` is
  put last; a single PUT is atomic, which is the commit. Endpoint and credentials come
  from ``storage_options`` (``endpoint_url``, ``access_key``, ``secret_key``,
  ``region``, ``session_token``) or the standard AWS environment variables
  (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
  ``AWS_REGION`` / ``AWS_DEFAULT_REGION``, ``AWS_SESSION_TOKEN``). Credentials are
  taken as one set: keys given in ``storage_options`` are never completed from the
  environment (``access_key`` and ``secret_key`` go together).

Example::

    fs = storage_fs("s3://ckpt/jobs", {"endpoint_url": "http://127.0.0.1:8333"})
    fs.write_atomic(fs.join("s3://ckpt/jobs", "j", "chk-1", "_metadata"), data)
"""

from __future__ import annotations

import errno
import io
import os
import posixpath
import re
import shutil
import tempfile
import threading
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, BinaryIO
from urllib.parse import unquote, urlparse

from epochstream.core.private_files import (
    PRIVATE_FILE_MODE,
    fsync_directory,
    makedirs_private,
    trust_problem,
)
from epochstream.core.storage_faults import local_store_gone
from epochstream.exceptions import CheckpointError, ConfigurationError, UntrustedStorageError

__all__ = [
    "S3FS",
    "TRUST_OPT_OUT",
    "LocalFS",
    "StorageFS",
    "check_trusted_location",
    "ensure_private_location",
    "is_remote",
    "normalize_location",
    "storage_fs",
]

#: How to opt out of the shared-storage check, for error messages.
TRUST_OPT_OUT = (
    "if every user who can write there may run code as you, opt out with "
    "trust_shared_storage=True (enable_checkpointing, es.savepoint.read) or "
    "--trust-shared-storage (epochstream run, checkpoints, inspect)"
)

_SCHEMES = ("file", "s3")
_S3_OPTION_KEYS = frozenset({"endpoint_url", "access_key", "secret_key", "region", "session_token"})
_S3_CREDENTIAL_KEYS = ("access_key", "secret_key", "session_token")


def is_remote(location: str) -> bool:
    """True for object-store URIs (``s3://...``)."""
    return location.startswith("s3://")


def normalize_location(location: str) -> str:
    """An absolute local path, or a normalized ``s3://bucket/key`` URI.

    Example::

        normalize_location("file:///data/ck") == "/data/ck"
        normalize_location("s3://b/p/../q/") == "s3://b/q"
    """
    if not isinstance(location, str) or not location.strip():
        raise ConfigurationError(f"storage location must be a non-empty string, got {location!r}")
    if "://" not in location:
        return os.path.abspath(location)
    parsed = urlparse(location)
    if parsed.scheme not in _SCHEMES:
        raise ConfigurationError(
            f"storage location {location!r}: unsupported scheme {parsed.scheme!r} "
            "(use a local path, file:///path or s3://bucket/prefix)"
        )
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise ConfigurationError(
                f"storage location {location!r}: file URLs must not name a host "
                f"(got {parsed.netloc!r}); use file:///absolute/path"
            )
        path = unquote(parsed.path)
        if not path:
            raise ConfigurationError(f"storage location {location!r} has an empty path")
        return os.path.abspath(path)
    if not parsed.netloc:
        raise ConfigurationError(f"storage location {location!r} names no bucket")
    key = posixpath.normpath("/" + parsed.path).lstrip("/")
    return f"s3://{parsed.netloc}/{key}".rstrip("/") if key else f"s3://{parsed.netloc}"


def check_trusted_location(location: str, *, what: str, trust_shared: bool = False) -> None:
    """Refuse a local ``location`` another local user could change (ssh's StrictModes).

    Checkpoints and savepoints hold pickles: restoring one runs code as this user, so
    a location other users can write is code they can run as you. Raises
    :class:`~epochstream.exceptions.UntrustedStorageError` naming the offending path,
    its owner and mode, and the opt-out; no-op for ``s3://`` or when ``trust_shared``.
    See :func:`epochstream.core.private_files.trust_problem` for the rules.

    Example::

        check_trusted_location("/tmp/shared-ckpt", what="checkpoint storage")  # raises if 0777
    """
    if trust_shared or is_remote(location):
        return
    problem = trust_problem(normalize_location(location))
    if problem is not None:
        raise UntrustedStorageError(
            f"{what} {location} is not private to you: {problem}. Another local user could "
            f"plant a checkpoint there that runs code as you when restored; use a directory "
            f"you own that only you can write (chmod 700), or, {TRUST_OPT_OUT}"
        )


def ensure_private_location(location: str, *, what: str, trust_shared: bool = False) -> None:
    """Create a missing local ``location`` (``0700``), then :func:`check_trusted_location`.

    The check runs after the creation, so it sees what is really there (a directory
    another user created first is refused, not used).

    Example::

        ensure_private_location("./checkpoints", what="checkpoint storage")
    """
    if is_remote(location):
        return
    path = normalize_location(location)
    try:
        makedirs_private(path)
    except OSError as err:
        raise CheckpointError(f"{what} {path}: cannot create it: {err}") from err
    check_trusted_location(path, what=what, trust_shared=trust_shared)


class StorageFS(ABC):
    """Reads and writes one kind of location; paths are full locations (see module doc)."""

    @abstractmethod
    def join(self, base: str, *parts: str) -> str:
        """``base`` joined with relative ``parts`` (``..`` allowed), normalized."""

    @abstractmethod
    def makedirs(self, path: str) -> None:
        """Create a directory and its parents (no-op on object stores)."""

    @abstractmethod
    def open_write(self, path: str) -> BinaryIO:
        """A new file for writing; durable once closed (local files are fsynced)."""

    @abstractmethod
    def write_atomic(self, path: str, data: bytes) -> None:
        """Write ``path`` so that readers see either nothing or all of ``data``."""

    @abstractmethod
    def open_read(self, path: str) -> BinaryIO:
        """A seekable binary reader."""

    @abstractmethod
    def exists(self, path: str) -> bool:
        """Whether a file exists at ``path``."""

    @abstractmethod
    def isdir(self, path: str) -> bool:
        """Whether ``path`` holds files (a directory, or a prefix with objects under it)."""

    @abstractmethod
    def listdir(self, path: str, *, dirs_only: bool = False) -> list[str]:
        """Names directly inside ``path`` (``[]`` if it does not exist); with
        ``dirs_only`` only directories (object stores: prefixes)."""

    @abstractmethod
    def delete_file(self, path: str) -> None:
        """Delete a file; a missing one is fine."""

    @abstractmethod
    def delete_dir(self, path: str) -> None:
        """Delete ``path`` and everything under it; a missing one is fine."""

    @abstractmethod
    def upload(self, local_path: str, path: str) -> None:
        """Copy a local file to ``path``."""

    @abstractmethod
    def download(self, path: str, local_path: str) -> None:
        """Copy ``path`` to a local file."""

    def write_bytes(self, path: str, data: bytes) -> None:
        """Write a new file holding ``data``."""
        with self.open_write(path) as f:
            f.write(data)

    def read_bytes(self, path: str) -> bytes:
        """The whole content of ``path``."""
        with self.open_read(path) as f:
            return f.read()

    def read_range(self, path: str, offset: int, length: int) -> bytes:
        """``length`` bytes of ``path`` from ``offset``."""
        with self.open_read(path) as f:
            f.seek(offset)
            return f.read(length)

    def relative(self, base: str, path: str) -> str:
        """``path`` relative to ``base`` (may start with ``..``)."""
        return posixpath.relpath(_key_part(path), _key_part(base))


def _key_part(location: str) -> str:
    if is_remote(location):
        return "/" + location[len("s3://") :]
    return location


class _SyncedWriter(io.BufferedWriter):
    """A local file that is flushed and fsynced when closed."""

    def close(self) -> None:
        if not self.closed:
            self.flush()
            os.fsync(self.fileno())
        super().close()


#: Directories of the checkpoint layout that live directly in a job directory.
_IN_JOB_DIR = re.compile(r"^(chk-[1-9][0-9]*|shared)$")


def _makedirs_in_layout(directory: str, *, writing: str) -> None:
    """:func:`makedirs_private`, except that a job directory (above a ``chk-<n>`` or
    ``shared`` directory) that is missing under an empty directory is not created: the
    job made it when it started, so its file system went away (unmounted, leaving the
    empty mount point). Recreating it on the bare mount point would complete checkpoints
    whose earlier files are on the real file system, out of sight, and turn an outage
    into corruption. ``FileNotFoundError`` naming ``writing`` instead, which
    :func:`~epochstream.core.storage_faults.local_store_gone` calls an outage.
    """
    current = os.path.abspath(directory)
    while not os.path.isdir(current):
        above = os.path.dirname(current)
        if _IN_JOB_DIR.match(os.path.basename(current)) and local_store_gone(current):
            raise FileNotFoundError(
                errno.ENOENT,
                f"job directory {above} is gone (its file system unmounted?); not creating it again",
                writing,
            )
        if above == current:
            break
        current = above
    makedirs_private(directory)


class LocalFS(StorageFS):
    """A local (or POSIX-mounted) filesystem; private modes, fsync, atomic rename.

    Example::

        fs = LocalFS()
        fs.write_atomic("/ck/j/chk-1/_metadata", b"{}")
    """

    def join(self, base: str, *parts: str) -> str:
        return os.path.normpath(os.path.join(base, *parts))

    def makedirs(self, path: str) -> None:
        _makedirs_in_layout(path, writing=path)

    def open_write(self, path: str) -> BinaryIO:
        _makedirs_in_layout(os.path.dirname(path), writing=path)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE_MODE)
        return _SyncedWriter(io.FileIO(fd, "wb"), buffer_size=1 << 20)

    def write_atomic(self, path: str, data: bytes) -> None:
        directory = os.path.dirname(path)
        _makedirs_in_layout(directory, writing=path)
        # mkstemp creates the file 0600: checkpoints are private to their user.
        fd, tmp = tempfile.mkstemp(
            prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory
        )
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            tmp = ""
            fsync_directory(directory)
        finally:
            if tmp:
                try:
                    os.unlink(tmp)
                except FileNotFoundError:
                    pass

    def open_read(self, path: str) -> BinaryIO:
        return open(path, "rb")

    def exists(self, path: str) -> bool:
        return os.path.isfile(path)

    def isdir(self, path: str) -> bool:
        return os.path.isdir(path)

    def listdir(self, path: str, *, dirs_only: bool = False) -> list[str]:
        try:
            with os.scandir(path) as entries:
                return sorted(e.name for e in entries if not dirs_only or e.is_dir())
        except FileNotFoundError:
            return []

    def delete_file(self, path: str) -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass

    def delete_dir(self, path: str) -> None:
        try:
            shutil.rmtree(path)
        except FileNotFoundError:
            pass

    def upload(self, local_path: str, path: str) -> None:
        with open(local_path, "rb") as src, self.open_write(path) as dst:
            shutil.copyfileobj(src, dst, 1 << 20)

    def download(self, path: str, local_path: str) -> None:
        shutil.copyfile(path, local_path)


class S3FS(StorageFS):
    """An S3-compatible object store through ``pyarrow.fs.S3FileSystem``.

    Example::

        fs = S3FS({"endpoint_url": "http://127.0.0.1:8333", "access_key": "k", "secret_key": "s"})
        fs.write_bytes("s3://bucket/a/b", b"x")
    """

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        from pyarrow import fs as pafs

        opts = _s3_options(options)
        kwargs: dict[str, Any] = {"region": opts.get("region") or "us-east-1"}
        endpoint = opts.get("endpoint_url")
        if endpoint:
            parsed = urlparse(endpoint if "://" in endpoint else f"https://{endpoint}")
            kwargs["endpoint_override"] = parsed.netloc
            kwargs["scheme"] = parsed.scheme or "https"
        if opts.get("access_key"):
            kwargs["access_key"] = opts["access_key"]
            kwargs["secret_key"] = opts.get("secret_key") or ""
            if opts.get("session_token"):
                kwargs["session_token"] = opts["session_token"]
        self._fs = pafs.S3FileSystem(**kwargs)
        self._pafs = pafs

    @staticmethod
    def _key(path: str) -> str:
        if not is_remote(path):
            raise CheckpointError(f"{path!r} is not an s3:// location")
        return path[len("s3://") :].rstrip("/")

    def join(self, base: str, *parts: str) -> str:
        key = posixpath.normpath(posixpath.join("/" + self._key(base), *parts)).lstrip("/")
        return f"s3://{key}"

    def makedirs(self, path: str) -> None:
        """Object stores have no directories: nothing to create."""

    def open_write(self, path: str) -> BinaryIO:
        return self._fs.open_output_stream(self._key(path))

    def write_atomic(self, path: str, data: bytes) -> None:
        # One PUT of the whole object: readers see all of it or nothing.
        with self._fs.open_output_stream(self._key(path)) as f:
            f.write(data)

    def open_read(self, path: str) -> BinaryIO:
        return self._fs.open_input_file(self._key(path))

    def exists(self, path: str) -> bool:
        info = self._fs.get_file_info(self._key(path))
        return bool(info.type == self._pafs.FileType.File)

    def isdir(self, path: str) -> bool:
        key = self._key(path)
        if "/" not in key:
            return bool(self._fs.get_file_info(key).type == self._pafs.FileType.Directory)
        return bool(self.listdir(path))

    def listdir(self, path: str, *, dirs_only: bool = False) -> list[str]:
        selector = self._pafs.FileSelector(self._key(path), allow_not_found=True, recursive=False)
        directory = self._pafs.FileType.Directory
        return sorted(
            info.base_name
            for info in self._fs.get_file_info(selector)
            if not dirs_only or info.type == directory
        )

    def delete_file(self, path: str) -> None:
        try:
            self._fs.delete_file(self._key(path))
        except FileNotFoundError:
            pass

    def delete_dir(self, path: str) -> None:
        try:
            self._fs.delete_dir(self._key(path))
        except FileNotFoundError:
            pass

    def upload(self, local_path: str, path: str) -> None:
        with open(local_path, "rb") as src, self._fs.open_output_stream(self._key(path)) as dst:
            shutil.copyfileobj(src, dst, 1 << 20)

    def download(self, path: str, local_path: str) -> None:
        with self._fs.open_input_stream(self._key(path)) as src, open(local_path, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)


def _s3_options(options: Mapping[str, Any] | None) -> dict[str, Any]:
    given = dict(options or {})
    unknown = set(given) - _S3_OPTION_KEYS
    if unknown:
        raise ConfigurationError(
            f"unknown storage option(s) {sorted(unknown)}; known: {sorted(_S3_OPTION_KEYS)}"
        )
    env = os.environ
    resolved = {
        "endpoint_url": given.get("endpoint_url")
        or env.get("AWS_ENDPOINT_URL_S3")
        or env.get("AWS_ENDPOINT_URL"),
        "region": given.get("region") or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION"),
    }
    if any(given.get(k) for k in _S3_CREDENTIAL_KEYS):
        # Credentials are one set: never complete given keys from the environment (a
        # session token there belongs to other keys, and every request would be refused).
        if not given.get("access_key") or not given.get("secret_key"):
            raise ConfigurationError(
                "storage options: give access_key and secret_key together "
                "(session_token is optional), or none of them to use the AWS_* environment"
            )
        credentials = {k: given.get(k) or None for k in _S3_CREDENTIAL_KEYS}
    else:
        credentials = {
            "access_key": env.get("AWS_ACCESS_KEY_ID"),
            "secret_key": env.get("AWS_SECRET_ACCESS_KEY"),
            "session_token": env.get("AWS_SESSION_TOKEN"),
        }
    return {**resolved, **credentials}


_CACHE: dict[tuple[str, tuple[tuple[str, str], ...]], StorageFS] = {}
_CACHE_LOCK = threading.Lock()
_LOCAL = LocalFS()


def storage_fs(location: str, options: Mapping[str, Any] | None = None) -> StorageFS:
    """The filesystem of ``location`` (one shared instance per scheme and options).

    S3 instances are shared per *effective* options: ``options`` merged with the
    ``AWS_*`` environment variables as they are now, so setting or changing those
    variables later in the process is seen by the next call.

    Example::

        storage_fs("/data/ck")                # LocalFS
        storage_fs("s3://bucket/ck", opts)    # S3FS
    """
    if not is_remote(location):
        return _LOCAL
    effective = _s3_options(options)
    key = ("s3", tuple(sorted((k, str(v)) for k, v in effective.items() if v)))
    with _CACHE_LOCK:
        found = _CACHE.get(key)
        if found is None:
            found = _CACHE[key] = S3FS(options)
        return found
