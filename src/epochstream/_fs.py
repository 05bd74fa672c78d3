"""Small filesystem helpers shared by checkpoint storage, state files and file sinks.

Example::

    os.replace(tmp, final)
    fsync_directory(os.path.dirname(final))   # the rename itself is now durable
"""

from __future__ import annotations

import os

__all__ = ["fsync_directory"]


def fsync_directory(directory: str) -> None:
    """Make directory entries (new files, renames) durable: POSIX needs an fsync of the directory."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
