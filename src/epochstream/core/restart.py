"""Restart strategies: whether, and after how long, the job master restarts a failed job.

A :class:`RestartStrategy` is immutable, picklable configuration. The job master creates one
:class:`RestartTracker` per job run with an injected clock and calls
:meth:`RestartTracker.on_failure` once per failure; it answers with a :class:`RestartDecision`.
The semantics follow Flink's restart strategies (none, fixed-delay, failure-rate,
exponential-delay).

Example::

    tracker = fixed_delay(attempts=2, delay=0.5).create_tracker(ManualClock())
    assert tracker.on_failure() == RestartDecision(True, 0.5, "fixed_delay: restart 1 of 2")
    tracker.on_failure()
    assert not tracker.on_failure().restart    # "fixed_delay: 2 of 2 restarts used"
"""

from __future__ import annotations

import math
import random
from abc import ABC, abstractmethod
from collections import deque
from dataclasses import dataclass

from epochstream.core.clock import Clock
from epochstream.exceptions import ConfigurationError

__all__ = [
    "ExponentialDelayRestart",
    "FailureRateRestart",
    "FixedDelayRestart",
    "NoRestart",
    "RestartDecision",
    "RestartStrategy",
    "RestartTracker",
    "exponential_delay",
    "failure_rate",
    "fixed_delay",
    "none",
]


@dataclass(frozen=True)
class RestartDecision:
    """Answer to one failure: restart after ``delay`` seconds, or give up; ``reason`` says why.

    Example::

        RestartDecision(restart=True, delay=1.0, reason="fixed_delay: restart 1 of 3")
    """

    restart: bool
    delay: float
    reason: str


class RestartTracker(ABC):
    """Mutable per-run bookkeeping of a :class:`RestartStrategy`.

    Example::

        tracker = none().create_tracker(SystemClock())
        decision = tracker.on_failure()
    """

    @abstractmethod
    def on_failure(self) -> RestartDecision:
        """Record one failure (at ``clock.now()``) and decide whether to restart."""


class RestartStrategy(ABC):
    """Immutable, picklable restart configuration; build instances with the factories.

    Example::

        strategy: RestartStrategy = failure_rate(max_failures=3, interval=60.0)
        print(strategy.describe())   # failure_rate(max_failures=3, interval=60.0s, delay=1.0s)
    """

    @abstractmethod
    def create_tracker(self, clock: Clock) -> RestartTracker:
        """A fresh tracker that reads time from ``clock``."""

    @abstractmethod
    def describe(self) -> str:
        """One line naming the strategy and its settings, for logs and error messages."""


# ---------------------------------------------------------------- validation helpers


def _int(strategy: str, name: str, value: object, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigurationError(f"{strategy}: {name} must be an int, got {value!r}")
    if value < minimum:
        raise ConfigurationError(f"{strategy}: {name} must be >= {minimum}, got {value}")
    return value


def _seconds(
    strategy: str, name: str, value: object, *, positive: bool = False, infinite: bool = False
) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigurationError(f"{strategy}: {name} must be a number, got {value!r}")
    number = float(value)
    if math.isnan(number) or (math.isinf(number) and not infinite):
        raise ConfigurationError(f"{strategy}: {name} must be finite, got {value!r}")
    if number < 0 or (positive and number == 0):
        bound = "> 0" if positive else ">= 0"
        raise ConfigurationError(f"{strategy}: {name} must be {bound}, got {value!r}")
    return number


# ---------------------------------------------------------------- none


@dataclass(frozen=True)
class NoRestart(RestartStrategy):
    """Never restart: the first failure fails the job. Built by :func:`none`.

    Example::

        assert not NoRestart().create_tracker(SystemClock()).on_failure().restart
    """

    def create_tracker(self, clock: Clock) -> RestartTracker:
        return _NoRestartTracker()

    def describe(self) -> str:
        return "none"


class _NoRestartTracker(RestartTracker):
    def on_failure(self) -> RestartDecision:
        return RestartDecision(False, 0.0, "none: restarts are disabled")


def none() -> RestartStrategy:
    """A strategy that never restarts.

    Example::

        env.set_restart_strategy(es.restart.none())
    """
    return NoRestart()


# ---------------------------------------------------------------- fixed delay


@dataclass(frozen=True)
class FixedDelayRestart(RestartStrategy):
    """At most ``attempts`` restarts per run, each after ``delay`` seconds.

    Built by :func:`fixed_delay`, which validates the arguments.

    Example::

        FixedDelayRestart(attempts=3, delay=1.0).describe()
    """

    attempts: int
    delay: float

    def create_tracker(self, clock: Clock) -> RestartTracker:
        return _FixedDelayTracker(self)

    def describe(self) -> str:
        return f"fixed_delay(attempts={self.attempts}, delay={self.delay}s)"


class _FixedDelayTracker(RestartTracker):
    def __init__(self, config: FixedDelayRestart) -> None:
        self._config = config
        self._used = 0

    def on_failure(self) -> RestartDecision:
        attempts = self._config.attempts
        if self._used >= attempts:
            return RestartDecision(
                False, 0.0, f"fixed_delay: {self._used} of {attempts} restarts used"
            )
        self._used += 1
        return RestartDecision(
            True, self._config.delay, f"fixed_delay: restart {self._used} of {attempts}"
        )


def fixed_delay(attempts: int, delay: float = 1.0) -> RestartStrategy:
    """Restart at most ``attempts`` times, waiting ``delay`` seconds before each restart.

    Example::

        env.set_restart_strategy(es.restart.fixed_delay(attempts=3, delay=1.0))
    """
    name = "fixed_delay"
    return FixedDelayRestart(
        attempts=_int(name, "attempts", attempts, minimum=0),
        delay=_seconds(name, "delay", delay),
    )


# ---------------------------------------------------------------- failure rate


@dataclass(frozen=True)
class FailureRateRestart(RestartStrategy):
    """Restart after ``delay`` unless more than ``max_failures`` failures fall in ``interval``.

    A failure ``interval`` seconds old or younger is inside the window. Built by
    :func:`failure_rate`, which validates the arguments.

    Example::

        FailureRateRestart(max_failures=3, interval=60.0, delay=1.0).describe()
    """

    max_failures: int
    interval: float
    delay: float

    def create_tracker(self, clock: Clock) -> RestartTracker:
        return _FailureRateTracker(self, clock)

    def describe(self) -> str:
        return (
            f"failure_rate(max_failures={self.max_failures}, interval={self.interval}s, "
            f"delay={self.delay}s)"
        )


class _FailureRateTracker(RestartTracker):
    def __init__(self, config: FailureRateRestart, clock: Clock) -> None:
        self._config = config
        self._clock = clock
        # Only whether the count exceeds max_failures matters, so older entries can go.
        self._failures: deque[float] = deque(maxlen=config.max_failures + 1)

    def on_failure(self) -> RestartDecision:
        config = self._config
        now = self._clock.now()
        failures = self._failures
        failures.append(now)
        while now - failures[0] > config.interval:
            failures.popleft()
        count = len(failures)
        if count > config.max_failures:
            return RestartDecision(
                False,
                0.0,
                f"failure_rate: {count} failures within {config.interval}s exceed "
                f"max_failures={config.max_failures}",
            )
        return RestartDecision(
            True,
            config.delay,
            f"failure_rate: {count} of at most {config.max_failures} failures "
            f"within {config.interval}s",
        )


def failure_rate(max_failures: int, interval: float, delay: float = 1.0) -> RestartStrategy:
    """Restart after ``delay`` seconds unless the failure rate is too high.

    The job fails for good when the number of failures in the last ``interval`` seconds
    (the current one included) exceeds ``max_failures``.

    Example::

        env.set_restart_strategy(es.restart.failure_rate(max_failures=3, interval=300.0))
    """
    name = "failure_rate"
    return FailureRateRestart(
        max_failures=_int(name, "max_failures", max_failures, minimum=0),
        interval=_seconds(name, "interval", interval, positive=True),
        delay=_seconds(name, "delay", delay),
    )


# ---------------------------------------------------------------- exponential delay


@dataclass(frozen=True)
class ExponentialDelayRestart(RestartStrategy):
    """Restart with a delay growing by ``multiplier`` per failure, capped at ``max_delay``.

    After ``reset_after`` seconds without a failure the delay, and the count of restarts
    checked against ``attempts``, start over (Flink's attempts-before-reset-backoff).
    ``jitter`` spreads each delay uniformly over ``base * (1 +- jitter)``, still capped at
    ``max_delay``, drawn from ``random.Random(seed)``. Built by :func:`exponential_delay`.

    Example::

        ExponentialDelayRestart(1.0, 60.0, 2.0, 3600.0, 0.0, None, None).describe()
    """

    initial: float
    max_delay: float
    multiplier: float
    reset_after: float
    jitter: float
    attempts: int | None
    seed: int | None

    def create_tracker(self, clock: Clock) -> RestartTracker:
        return _ExponentialDelayTracker(self, clock)

    def describe(self) -> str:
        attempts = "unlimited" if self.attempts is None else str(self.attempts)
        return (
            f"exponential_delay(initial={self.initial}s, max_delay={self.max_delay}s, "
            f"multiplier={self.multiplier}, reset_after={self.reset_after}s, "
            f"jitter={self.jitter}, attempts={attempts})"
        )


class _ExponentialDelayTracker(RestartTracker):
    def __init__(self, config: ExponentialDelayRestart, clock: Clock) -> None:
        self._config = config
        self._clock = clock
        self._random = random.Random(config.seed)
        self._base = 0.0  # 0 means "no failure since the last reset"
        self._last_failure = -math.inf
        self._used = 0

    def on_failure(self) -> RestartDecision:
        config = self._config
        now = self._clock.now()
        if now - self._last_failure >= config.reset_after:
            self._base = 0.0
            self._used = 0
        self._last_failure = now
        if config.attempts is not None and self._used >= config.attempts:
            return RestartDecision(
                False,
                0.0,
                f"exponential_delay: {self._used} of {config.attempts} restarts used "
                f"since the last {config.reset_after}s without failure",
            )
        if self._base == 0.0:
            self._base = config.initial
        else:
            self._base = min(self._base * config.multiplier, config.max_delay)
        self._used += 1
        delay = self._base
        if config.jitter > 0.0:
            spread = self._random.uniform(-config.jitter, config.jitter)
            delay = min(config.max_delay, max(0.0, delay * (1.0 + spread)))
        limit = "" if config.attempts is None else f" of {config.attempts}"
        return RestartDecision(
            True, delay, f"exponential_delay: restart {self._used}{limit} after {delay:.3f}s"
        )


def exponential_delay(
    initial: float = 1.0,
    max_delay: float = 60.0,
    multiplier: float = 2.0,
    *,
    reset_after: float = 3600.0,
    jitter: float = 0.0,
    attempts: int | None = None,
    seed: int | None = None,
) -> RestartStrategy:
    """Restart with exponentially growing delays: ``initial``, ``initial * multiplier``, ...

    The delay is capped at ``max_delay`` and returns to ``initial`` once no failure happened
    for ``reset_after`` seconds (``math.inf``: never). ``jitter`` (0..1) randomizes each
    delay by up to that fraction, from ``random.Random(seed)``. ``attempts`` caps the
    restarts between two resets (``None``: unlimited).

    Example::

        env.set_restart_strategy(
            es.restart.exponential_delay(initial=0.5, max_delay=30.0, jitter=0.1, seed=7)
        )
    """
    name = "exponential_delay"
    initial_s = _seconds(name, "initial", initial, positive=True)
    max_delay_s = _seconds(name, "max_delay", max_delay, positive=True)
    if max_delay_s < initial_s:
        raise ConfigurationError(
            f"{name}: max_delay ({max_delay!r}) must be >= initial ({initial!r})"
        )
    if isinstance(multiplier, bool) or not isinstance(multiplier, int | float):
        raise ConfigurationError(f"{name}: multiplier must be a number, got {multiplier!r}")
    if not math.isfinite(multiplier) or multiplier < 1.0:
        raise ConfigurationError(f"{name}: multiplier must be finite and >= 1, got {multiplier!r}")
    if isinstance(jitter, bool) or not isinstance(jitter, int | float):
        raise ConfigurationError(f"{name}: jitter must be a number, got {jitter!r}")
    if not 0.0 <= jitter <= 1.0:  # also rejects NaN
        raise ConfigurationError(f"{name}: jitter must be within 0..1, got {jitter!r}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ConfigurationError(f"{name}: seed must be an int or None, got {seed!r}")
    return ExponentialDelayRestart(
        initial=initial_s,
        max_delay=max_delay_s,
        multiplier=float(multiplier),
        reset_after=_seconds(name, "reset_after", reset_after, positive=True, infinite=True),
        jitter=float(jitter),
        attempts=None if attempts is None else _int(name, "attempts", attempts, minimum=0),
        seed=seed,
    )
