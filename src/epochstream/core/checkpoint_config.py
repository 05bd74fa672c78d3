"""Checkpointing settings (docs/architecture.md, Checkpoint protocol) and their validation.

On the ground floor because two layers that may not import each other use them: the
API builds them (``env.enable_checkpointing``) and the checkpoint coordinator follows them.

Example::

    cfg = CheckpointConfig(interval=5.0, storage="file:///data/ckpt", retained=3)
    cfg.storage_location == "/data/ckpt"
    cfg.exactly_once is True
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

from epochstream.core.filesystems import normalize_location
from epochstream.core.private_files import makedirs_private
from epochstream.exceptions import ConfigurationError

__all__ = [
    "AT_LEAST_ONCE",
    "EXACTLY_ONCE",
    "CheckpointConfig",
    "default_checkpoint_storage",
]

EXACTLY_ONCE = "exactly_once"
AT_LEAST_ONCE = "at_least_once"
_MODES = (EXACTLY_ONCE, AT_LEAST_ONCE)


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
    ``retain_on_cancel``: keep them when the job is cancelled. ``storage`` is a local
    path, ``file://`` URL or ``s3://bucket/prefix``; ``storage_options`` sets the object
    store's ``endpoint_url``, ``access_key``, ``secret_key``, ``region`` and
    ``session_token`` (default: the standard AWS environment variables).
    ``savepoint_dir``: where savepoints go when none is named (default
    ``<storage>/savepoints``). ``trust_shared_storage``: use a local storage, savepoint
    or restore path even when other local users could change it (they could then run
    code as you: checkpoints hold pickles); by default such a path is refused with
    :class:`~epochstream.exceptions.UntrustedStorageError`.

    ``unaligned``: barriers overtake the records queued between tasks, and those records
    become part of the checkpoint (its *channel state*), so a checkpoint completes in
    about the same time with or without backpressure (exactly-once mode only; savepoints
    stay aligned). ``aligned_timeout``: with ``unaligned``, a checkpoint starts aligned and
    switches to unaligned once its barrier is this many seconds old (0: unaligned from
    the start).

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
    storage_options: dict[str, Any] | None = None
    savepoint_dir: str | None = None
    trust_shared_storage: bool = False
    unaligned: bool = False
    aligned_timeout: float = 0.0

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
        _check_seconds("aligned_timeout", self.aligned_timeout, allow_zero=True)
        for flag in ("retain_on_cancel", "trust_shared_storage", "unaligned"):
            if not isinstance(getattr(self, flag), bool):
                raise ConfigurationError(
                    f"CheckpointConfig.{flag} must be a bool, got {getattr(self, flag)!r}"
                )
        if self.unaligned and self.mode != EXACTLY_ONCE:
            raise ConfigurationError(
                "CheckpointConfig.unaligned needs mode='exactly_once': at-least-once "
                "checkpoints never wait for alignment, so there is nothing to overtake"
            )
        if self.aligned_timeout and not self.unaligned:
            raise ConfigurationError(
                "CheckpointConfig.aligned_timeout switches a checkpoint to unaligned once "
                "alignment takes that long: it needs unaligned=True"
            )
        for name in ("storage", "savepoint_dir"):
            value = getattr(self, name)
            if value is None:
                continue
            try:
                normalize_location(value)
            except ConfigurationError as err:
                raise ConfigurationError(f"CheckpointConfig.{name}: {err}") from err
        if self.storage_options is not None and not isinstance(self.storage_options, dict):
            raise ConfigurationError(
                f"CheckpointConfig.storage_options must be a dict, got {self.storage_options!r}"
            )

    @property
    def exactly_once(self) -> bool:
        """True when tasks align barriers (``mode == "exactly_once"``)."""
        return self.mode == EXACTLY_ONCE

    @property
    def storage_location(self) -> str:
        """``storage`` as an absolute local path or a normalized ``s3://`` URI."""
        return normalize_location(self.storage)

    @property
    def savepoint_location(self) -> str:
        """Where savepoints go by default: ``savepoint_dir`` or ``<storage>/savepoints``."""
        if self.savepoint_dir is not None:
            return normalize_location(self.savepoint_dir)
        return normalize_location(self.storage.rstrip("/") + "/savepoints")
