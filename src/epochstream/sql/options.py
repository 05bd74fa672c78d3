"""The ``SET`` options of a SQL session (Flink's table configuration keys this SQL layer
takes), and Flink's duration syntax, shared by options and ``WITH`` clauses.

A statement's planner reads them as one typed :class:`SqlOptions`; an unknown key or a
value that does not parse is refused at the ``SET`` that names it.

Example::

    options = SqlOptions().with_option("table.exec.state.ttl", "1 h")
    options.state_ttl_ms == 3_600_000
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["SQL_OPTION_KEYS", "SqlOptions", "parse_duration_ms"]

#: Flink's ``TimeUtils`` units, in milliseconds; a number without a unit is milliseconds.
_UNITS = {
    "ms": 1,
    "milli": 1,
    "millis": 1,
    "millisecond": 1,
    "milliseconds": 1,
    "s": 1_000,
    "sec": 1_000,
    "secs": 1_000,
    "second": 1_000,
    "seconds": 1_000,
    "min": 60_000,
    "m": 60_000,
    "minute": 60_000,
    "minutes": 60_000,
    "h": 3_600_000,
    "hour": 3_600_000,
    "hours": 3_600_000,
    "d": 86_400_000,
    "day": 86_400_000,
    "days": 86_400_000,
}
_DURATION = re.compile(r"\s*(\d+)\s*([a-zA-Z]*)\s*")


def parse_duration_ms(text: str) -> int:
    """Milliseconds of a duration in Flink's syntax: a whole number and a unit (``ms``,
    ``s``, ``min``, ``h``, ``d`` or their long names), milliseconds without one.

    Raises ``ValueError`` naming what is accepted.

    Example: ``parse_duration_ms("10 min") == 600_000``; ``parse_duration_ms("500") == 500``
    """
    match = _DURATION.fullmatch(text)
    unit = match.group(2).lower() if match else None
    if match is None or (unit not in _UNITS and unit != ""):
        raise ValueError(
            f"expected a duration such as '500 ms', '10 s', '1 h' or '1 d', got {text!r}"
        )
    return int(match.group(1)) * _UNITS.get(unit or "ms", 1)


def _flag(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered not in ("true", "false"):
        raise ValueError(f"expected 'true' or 'false', got {text!r}")
    return lowered == "true"


def _positive(text: str) -> int:
    if not text.strip().isdigit() or int(text) <= 0:
        raise ValueError(f"expected a whole number above 0, got {text!r}")
    return int(text)


@dataclass(frozen=True, kw_only=True)
class SqlOptions:
    """The session's table options, typed, with Flink's defaults.

    - ``pipeline_name`` (``pipeline.name``): the job's name, else one from its INSERTs.
    - ``state_ttl_ms`` (``table.exec.state.ttl``): how long the stateful operators
      without a window keep state after it was written (Flink's ``OnCreateAndWrite``,
      processing time): a regular join each row, a ``GROUP BY`` each group, a Top-N
      each partition's rows; ``0`` (Flink's default) keeps it forever.
    - ``mini_batch_enabled``, ``mini_batch_allow_latency_ms``, ``mini_batch_size``
      (``table.exec.mini-batch.enabled``, ``.allow-latency``, ``.size``): buffer an
      updating aggregation's input up to that latency or that many rows before
      folding it, so a key's updates come out once per buffer.

    Example: ``SqlOptions(state_ttl_ms=60_000)``
    """

    pipeline_name: str | None = None
    state_ttl_ms: int = 0
    mini_batch_enabled: bool = False
    mini_batch_allow_latency_ms: int = 0
    mini_batch_size: int = 0

    def with_option(self, key: str, value: str) -> SqlOptions:
        """These options with ``key`` set from its text; ``ValueError`` for an unknown
        key or a value that does not parse (the caller names the statement).

        Example: ``SqlOptions().with_option("table.exec.mini-batch.size", "5000")``
        """
        if key not in _PARSERS:
            raise ValueError(f"unknown option '{key}' (known: {', '.join(SQL_OPTION_KEYS)})")
        field, parse = _PARSERS[key]
        try:
            parsed = parse(value)
        except ValueError as e:
            raise ValueError(f"option '{key}': {e}") from None
        return dataclasses.replace(self, **{field: parsed})


_PARSERS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "pipeline.name": ("pipeline_name", str),
    "table.exec.state.ttl": ("state_ttl_ms", parse_duration_ms),
    "table.exec.mini-batch.enabled": ("mini_batch_enabled", _flag),
    "table.exec.mini-batch.allow-latency": ("mini_batch_allow_latency_ms", parse_duration_ms),
    "table.exec.mini-batch.size": ("mini_batch_size", _positive),
}
#: The keys ``SET`` takes.
SQL_OPTION_KEYS = tuple(_PARSERS)
