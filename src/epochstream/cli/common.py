"""Small helpers the CLI commands share: one-line errors, sizes, times.

Example::

    return fail("savepoint", "no running job with id '3f2a'")
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
from collections.abc import Callable

__all__ = ["fail", "human_size", "int_at_least", "positive_int", "prepare_script", "utc"]


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


def int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: an int >= ``minimum``. Example: ``int_at_least(1)("4") == 4``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    return parse


#: An argparse type: an int >= 1. Example: ``positive_int("4") == 4``.
positive_int = int_at_least(1)


def prepare_script(script: str, args: list[str]) -> str | None:
    """Make this process look to ``script`` as ``python script args...`` would: its
    ``sys.argv`` and its directory first on ``sys.path``. A problem (no such script) is
    returned as a sentence, ``None`` when ready.

    Example: ``prepare_script("job.py", ["in.txt"])``
    """
    if not os.path.isfile(script):
        return f"no such job script: {script}"
    args = args[1:] if args[:1] == ["--"] else args
    sys.argv = [script, *args]
    script_dir = os.path.dirname(os.path.abspath(script))
    if script_dir not in sys.path:
        sys.path.insert(0, script_dir)
    return None
