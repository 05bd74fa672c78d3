"""Small filesystem helpers shared by checkpoint storage, state files and file sinks.

Checkpoints hold pickles, so whoever can write them can run code in the job: every
directory epochstream creates for checkpoints is ``0700`` and every file ``0600``.

Example::

    makedirs_private("/ckpt/job-1/chk-3")
    with create_private("/ckpt/job-1/chk-3/state.kst") as f:
        f.write(data)
    fsync_directory("/ckpt/job-1/chk-3")   # the new name itself is now durable
"""

from __future__ import annotations

import os
from typing import BinaryIO

__all__ = ["create_private", "fsync_directory", "makedirs_private"]

PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600


def fsync_directory(directory: str) -> None:
    """Make directory entries (new files, renames) durable: POSIX needs an fsync of the directory."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def makedirs_private(path: str) -> None:
    """``os.makedirs(path, exist_ok=True)``, creating every missing directory as ``0700``.

    (``os.makedirs`` applies its mode to the last directory only.)
    """
    missing: list[str] = []
    current = os.path.abspath(path)
    while not os.path.isdir(current):
        missing.append(current)
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, PRIVATE_DIR_MODE)
        except FileExistsError:
            if not os.path.isdir(directory):
                raise NotADirectoryError(f"{directory} exists and is not a directory") from None


def create_private(path: str) -> BinaryIO:
    """Create ``path`` (which must not exist) for writing, readable by this user only."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE_MODE)
    return os.fdopen(fd, "wb")
