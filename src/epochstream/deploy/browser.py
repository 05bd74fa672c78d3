"""Open a secret URL in the user's browser without putting it on a command line.

``webbrowser.open(url)`` runs ``xdg-open URL`` or ``chromium URL``: the URL sits in a
process's argv, which every local user can read with ``ps``. :func:`open_in_browser`
writes a tiny HTML page that redirects to the URL into a fresh ``0700`` directory as a
``0600`` file and opens *that* file (as Jupyter does): argv holds only its path. The
URL it carries (a dashboard login) is good once and for two minutes, so the file is
harmless after use; it is removed once it is stale (the next call sweeps old ones).

Example::

    open_in_browser(endpoint.login_url())     # True when a browser was started
"""

from __future__ import annotations

import html
import logging
import os
import shutil
import tempfile
import time
import webbrowser
from collections.abc import Callable
from pathlib import Path

__all__ = ["open_in_browser", "redirect_file"]

log = logging.getLogger(__name__)
_PREFIX = "epochstream-open-"
#: Older redirect directories are removed (their login code expired long ago).
_STALE_AFTER = 600.0


def redirect_file(url: str, *, parent: str | None = None) -> Path:
    """A private HTML file that sends the browser to ``url``.

    The directory is new and ``0700`` (``tempfile.mkdtemp``), the file ``0600``,
    created exclusively.

    Example: ``redirect_file("http://127.0.0.1:8081/dashboard/login?code=x")``
    """
    directory = Path(tempfile.mkdtemp(prefix=_PREFIX, dir=parent))
    path = directory / "open-dashboard.html"
    quoted = html.escape(url, quote=True)
    page = (
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8">\n'
        f'<meta http-equiv="refresh" content="0;url={quoted}">\n'
        '<meta name="referrer" content="no-referrer">\n'
        "<title>epochstream dashboard</title></head>\n"
        f'<body><p>Opening the dashboard: <a href="{quoted}">continue</a>.</p></body></html>\n'
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(page)
    return path


def _sweep(parent: str | None, now: float) -> None:
    """Remove this user's stale redirect directories."""
    root = Path(parent or tempfile.gettempdir())
    for entry in root.glob(_PREFIX + "*"):
        try:
            info = entry.lstat()
            if info.st_uid == os.getuid() and now - info.st_mtime > _STALE_AFTER:
                shutil.rmtree(entry)
        except OSError as exc:
            log.debug("redirect directory %s left in place: %s", entry, exc)


def open_in_browser(
    url: str,
    *,
    opener: Callable[[str], bool] = webbrowser.open,
    parent: str | None = None,
) -> bool:
    """Open ``url`` through a private redirect file; whether a browser was started.

    Example: ``open_in_browser(login_url)``
    """
    _sweep(parent, time.time())
    path = redirect_file(url, parent=parent)
    return bool(opener(path.as_uri()))
