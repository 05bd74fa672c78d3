"""Checkpointing settings (ARCHITECTURE section 4) and their validation.

Example::

    cfg = CheckpointConfig(interval=5.0, storage="file:///data/ckpt", retained=3)
    cfg.storage_path == "/data/ckpt"
    cfg.exactly_once is True
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from urllib.parse import unquote, urlparse

from epochstream._fs import makedirs_private
from epochstream.exceptions import ConfigurationError

__all__ = [
    "AT_LEAST_ONCE",
    "EXACTLY_ONCE",
    "CheckpointConfig",
    "default_checkpoint_storage",
    "resolve_storage_path",
]

EXACTLY_ONCE = "exactly_once"
AT_LEAST_ONCE = "at_least_once"
_MODES = (EXACTLY_ONCE, AT_LEAST_ONCE)


def resolve_storage_path(location: str) -> str:
    """Turn a checkpoint location (a plain path or a ``file://`` URL) into a local path.

    Other URL schemes are rejected: the storage layer writes with ``os`` calls and
    relies on ``os.replace`` being atomic, which only a local (or POSIX-mounted)
    filesystem guarantees.

    Example::

        resolve_storage_path("file:///tmp/ck") == "/tmp/ck"
        resolve_storage_path("/tmp/ck") == "/tmp/ck"
    """
    if not isinstance(location, str) or not location.strip():
        raise ConfigurationError(f"checkpoint storage must be a non-empty path, got {location!r}")
    if "://" not in location:
        return location
    parsed = urlparse(location)
    if parsed.scheme != "file":
        raise ConfigurationError(
            f"checkpoint storage {location!r}: unsupported scheme {parsed.scheme!r} "
            "(use a local path or a file:// URL)"
        )
    if parsed.netloc not in ("", "localhost"):
        raise ConfigurationError(
            f"checkpoint storage {location!r}: file URLs must not name a host "
            f"(got {parsed.netloc!r}); use file:///absolute/path"
        )
    path = unquote(parsed.path)
    if not path:
        raise ConfigurationError(f"checkpoint storage {location!r} has an empty path")
    return path


def default_checkpoint_storage() -> str:
    """The default checkpoint storage: private to the user running the driver.

    ``$XDG_CACHE_HOME/epochstream/checkpoints`` (``~/.cache/...`` when unset), created
    ``0700``. Checkpoints contain pickles, so a directory other users can write would
    let them run code in the job; a shared ``/tmp`` path is never the default.

    Example::

        default_checkpoint_storage()   # "/home/ada/.cache/epochstream/checkpoints"
    """
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    path = os.path.join(cache, "epochstream", "checkpoints")
    makedirs_private(path)
    return path


def _check_seconds(name: str, value: object, *, allow_zero: bool) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigurationError(f"CheckpointConfig.{name} must be a number, got {value!r}")
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigurationError(
            f"CheckpointConfig.{name} must be a finite number of seconds {bound}, got {value!r}"
        )


def _check_int(name: str, value: object, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigurationError(f"CheckpointConfig.{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ConfigurationError(f"CheckpointConfig.{name} must be >= {minimum}, got {value!r}")


@dataclass(frozen=True, kw_only=True)
class CheckpointConfig:
    """How often and where checkpoints are taken, and how failures are tolerated.

    ``interval``: seconds between triggers; ``min_pause``: minimum seconds between the
    completion of one checkpoint and the next trigger; ``timeout``: a pending checkpoint
    older than this is aborted; ``tolerable_failures``: consecutive failed checkpoints
    tolerated before the job fails; ``retained``: completed checkpoints kept on disk;
    ``retain_on_cancel``: keep them when the job is cancelled.

    Example::

        CheckpointConfig(interval=0.5, mode="at_least_once").exactly_once is False
    """

    interval: float = 1.0
    storage: str = field(default_factory=default_checkpoint_storage)
    mode: str = EXACTLY_ONCE
    min_pause: float = 0.0
    max_concurrent: int = 1
    timeout: float = 60.0
    tolerable_failures: int = 0
    retained: int = 1
    retain_on_cancel: bool = False

    def __post_init__(self) -> None:
        _check_seconds("interval", self.interval, allow_zero=False)
        _check_seconds("min_pause", self.min_pause, allow_zero=True)
        _check_seconds("timeout", self.timeout, allow_zero=False)
        _check_int("max_concurrent", self.max_concurrent, minimum=1)
        _check_int("tolerable_failures", self.tolerable_failures, minimum=0)
        _check_int("retained", self.retained, minimum=1)
        if self.mode not in _MODES:
            raise ConfigurationError(
                f"CheckpointConfig.mode must be one of {', '.join(_MODES)}, got {self.mode!r}"
            )
        if not isinstance(self.retain_on_cancel, bool):
            raise ConfigurationError(
                f"CheckpointConfig.retain_on_cancel must be a bool, got {self.retain_on_cancel!r}"
            )
        try:
            resolve_storage_path(self.storage)
        except ConfigurationError as err:
            raise ConfigurationError(f"CheckpointConfig.storage: {err}") from err

    @property
    def exactly_once(self) -> bool:
        """True when tasks align barriers (``mode == "exactly_once"``)."""
        return self.mode == EXACTLY_ONCE

    @property
    def storage_path(self) -> str:
        """``storage`` as an absolute local path (a ``file://`` URL is converted)."""
        return os.path.abspath(resolve_storage_path(self.storage))
