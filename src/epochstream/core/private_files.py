"""Small filesystem helpers shared by checkpoint storage, state files and file sinks.

Checkpoints hold pickles, so whoever can write them can run code in the job: every
directory epochstream creates for checkpoints is ``0700`` and every file ``0600``.

Example::

    makedirs_private("/ckpt/job-1/chk-3")
    with create_private("/ckpt/job-1/chk-3/state.kst") as f:
        f.write(data)
    fsync_directory("/ckpt/job-1/chk-3")   # the new name itself is now durable
    trust_problem("/tmp/ckpt")   # "/tmp/ckpt is owned by uid 65534 (nobody) ..." or None
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
from typing import BinaryIO

__all__ = ["create_private", "fsync_directory", "makedirs_private", "trust_problem"]

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


def _owner(uid: int) -> str:
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def _describe(path: str, st: os.stat_result) -> str:
    return f"{path} (owner {_owner(st.st_uid)}, mode {stat.S_IMODE(st.st_mode):04o})"


def _prefixes(path: str) -> list[str]:
    """``/a/b/c`` -> ``["/a/b/c", "/a/b", "/a", "/"]``."""
    out = [path]
    while (parent := os.path.dirname(out[-1])) != out[-1]:
        out.append(parent)
    return out


def _trusted_owner(uid: int) -> bool:
    # Root can do anything as this user anyway; nobody else may own what we trust.
    return uid in (os.geteuid(), 0)


def _private_group(gid: int, uid: int) -> bool:
    """Whether group ``gid`` has no member but user ``uid`` (a user private group, as
    Debian and Fedora make one per user; with umask 002 their directories are group
    writable, which lets nobody else in). Like Debian's ssh StrictModes."""
    try:
        group = grp.getgrgid(gid)
        owner = pwd.getpwuid(uid).pw_name
    except KeyError:
        return False
    members = set(group.gr_mem) | {u.pw_name for u in pwd.getpwall() if u.pw_gid == gid}
    return members == {owner}


def _writable_by_others(st: os.stat_result) -> bool:
    if st.st_mode & 0o002:
        return True
    return bool(st.st_mode & 0o020) and not _private_group(st.st_gid, st.st_uid)


def _leaf_problem(path: str, st: os.stat_result) -> str | None:
    if not _trusted_owner(st.st_uid):
        return f"{_describe(path, st)} is owned by another user"
    if _writable_by_others(st):
        # No sticky-bit exception here: whoever can create entries inside it can plant
        # a checkpoint (or a job entry) next to ours.
        return f"{_describe(path, st)} is writable by group or others"
    return None


def _ancestor_problem(path: str, st: os.stat_result) -> str | None:
    if not _trusted_owner(st.st_uid):
        return f"its parent {_describe(path, st)} is owned by another user"
    # A sticky directory (/tmp) lets others add entries but not rename or remove ours,
    # and the next component down is checked to be ours.
    if _writable_by_others(st) and not st.st_mode & stat.S_ISVTX:
        return f"its parent {_describe(path, st)} is writable by group or others (and not sticky)"
    return None


def _chain_problem(path: str) -> str | None:
    """The first problem of ``path`` or a directory above it, as spelled (symlinks are
    judged by their owner here; what they point to is another chain)."""
    for index, prefix in enumerate(_prefixes(path)):
        try:
            st = os.lstat(prefix)
        except (FileNotFoundError, NotADirectoryError):
            continue  # not there (yet): nothing to plant in it
        except OSError as err:
            return f"{prefix} cannot be checked: {err.strerror}"
        if stat.S_ISLNK(st.st_mode):
            if not _trusted_owner(st.st_uid):
                return f"{prefix} is a symlink owned by another user ({_owner(st.st_uid)})"
            continue
        problem = _leaf_problem(prefix, st) if index == 0 else _ancestor_problem(prefix, st)
        if problem is not None:
            return problem
    return None


def trust_problem(path: str) -> str | None:
    """Why another local user could change what ``path`` holds; ``None`` when none can.

    Like ssh's ``StrictModes``: ``path`` itself must be owned by this user or root and
    not be writable by group (unless the group is its owner's private group) or others;
    each directory above it must be owned by this user or root and not be writable by
    group or others unless it is sticky (as
    ``/tmp`` is); a symlink on the way must be owned by this user or root. Both the
    path as spelled and the path its symlinks lead to are checked. A path that does
    not exist has no problem of its own (its existing parents are still checked).
    ``path`` may be a directory or a file.

    Example::

        trust_problem("/tmp")         # "/tmp (owner uid 0 (root), mode 1777) is writable ..."
        trust_problem(os.path.expanduser("~/.cache"))   # None
    """
    absolute = os.path.abspath(path)
    return _chain_problem(absolute) or _chain_problem(os.path.realpath(absolute))
