"""Copying a snapshot's keyed-state files into a new savepoint directory.

An operator a written savepoint keeps as it was (any handle type: canonical, heap and
RocksDB checkpoint files, columnar and row files) has its files copied next to the new
``_metadata`` and its handle rewritten to point at the copies, so the savepoint is
self-contained: it can be moved and its source deleted. Copies are never ``shared``
(no later checkpoint counts references to them). Files are streamed, not read whole.

Example::

    copies = SnapshotCopies(fs, "/sp/new", storage_options=None)
    handle = copies.copy(old_handle, prefix="000-counter-0")
"""

from __future__ import annotations

import posixpath
import shutil
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from epochstream.core.filesystems import storage_fs
from epochstream.exceptions import CheckpointError
from epochstream.state.handles import (
    CanonicalSnapshotHandle,
    HeapSnapshotHandle,
    KeyedStateHandle,
    RocksDBSnapshotHandle,
)

if TYPE_CHECKING:
    from epochstream.core.filesystems import StorageFS

__all__ = ["SnapshotCopies"]


class SnapshotCopies:
    """Copies files into ``directory`` once each (a file two handles share is copied
    once) and rewrites handles to the copies."""

    def __init__(self, fs: StorageFS, directory: str, *, storage_options: Any = None) -> None:
        self.fs = fs
        self.directory = directory
        self.options = storage_options
        self._copied: dict[str, str] = {}
        self.bytes_copied = 0

    def _copy_file(self, path: str, prefix: str) -> str:
        done = self._copied.get(path)
        if done is not None:
            return done
        target = self.fs.join(self.directory, f"{prefix}-{posixpath.basename(path)}")
        source_fs = storage_fs(path, self.options)
        try:
            with source_fs.open_read(path) as src, self.fs.open_write(target) as dst:
                shutil.copyfileobj(src, dst, 8 << 20)
                self.bytes_copied += src.tell()
        except OSError as err:
            raise CheckpointError(f"cannot copy state file {path} to {target}: {err}") from err
        self._copied[path] = target
        return target

    def copy(self, handle: KeyedStateHandle, *, prefix: str) -> KeyedStateHandle:
        """``handle`` pointing at copies of its files named ``<prefix>-<file name>``."""
        moved = {path: self._copy_file(path, prefix) for path in handle.files()}
        if isinstance(handle, HeapSnapshotHandle):
            chain = tuple(replace(f, path=moved[f.path], shared=False) for f in handle.chain)
            return replace(handle, chain=chain)
        if isinstance(handle, RocksDBSnapshotHandle):
            files = {
                name: replace(f, path=moved[f.path], shared=False)
                for name, f in handle.db_files.items()
            }
            return replace(handle, db_files=files)
        if isinstance(handle, CanonicalSnapshotHandle):  # columnar handles too
            return replace(handle, path=moved[handle.path])
        raise CheckpointError(f"cannot copy the files of a {type(handle).__name__}")
