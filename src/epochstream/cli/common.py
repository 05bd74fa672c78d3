"""Small helpers the CLI commands share: one-line errors, sizes, times.

Example::

    return fail("savepoint", "no running job with id '3f2a'")
"""

from __future__ import annotations

import datetime as dt
import sys

__all__ = ["fail", "human_size", "utc"]


def fail(command: str, message: str, code: int = 2) -> int:
    """Print ``epochstream COMMAND: message`` on stderr; return ``code``."""
    print(f"epochstream {command}: {message}", file=sys.stderr)
    return code


def human_size(size: int) -> str:
    """``1536`` -> ``"1.5 KiB"``."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"


def utc(timestamp: float) -> str:
    """Epoch seconds as ``YYYY-MM-DD HH:MM:SS`` UTC."""
    return dt.datetime.fromtimestamp(timestamp, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
