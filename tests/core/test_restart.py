"""Restart strategies driven by a ManualClock."""

from __future__ import annotations

import math
import pickle

import pytest

import epochstream.restart as public
from epochstream.core.clock import ManualClock
from epochstream.core.restart import (
    RestartDecision,
    RestartStrategy,
    exponential_delay,
    failure_rate,
    fixed_delay,
    none,
)
from epochstream.exceptions import ConfigurationError

# ---------------------------------------------------------------- public module


def test_public_module_re_exports_the_factories() -> None:
    assert set(public.__all__) == {
        "RestartDecision",
        "RestartStrategy",
        "exponential_delay",
        "failure_rate",
        "fixed_delay",
        "none",
    }
    assert public.fixed_delay is fixed_delay
    assert public.__doc__ is not None and "es.restart.fixed_delay" in public.__doc__
    strategy = public.fixed_delay(attempts=3, delay=1.0)
    assert isinstance(strategy, public.RestartStrategy)


# ---------------------------------------------------------------- none


def test_none_never_restarts() -> None:
    tracker = none().create_tracker(ManualClock())
    for _ in range(3):
        decision = tracker.on_failure()
        assert decision == RestartDecision(False, 0.0, "none: restarts are disabled")
    assert none().describe() == "none"


# ---------------------------------------------------------------- fixed delay


def test_fixed_delay_allows_exactly_n_restarts_then_refuses() -> None:
    tracker = fixed_delay(attempts=3, delay=2.5).create_tracker(ManualClock())
    decisions = [tracker.on_failure() for _ in range(5)]
    assert [d.restart for d in decisions] == [True, True, True, False, False]
    assert [d.delay for d in decisions[:3]] == [2.5, 2.5, 2.5]
    assert decisions[0].reason == "fixed_delay: restart 1 of 3"
    assert decisions[2].reason == "fixed_delay: restart 3 of 3"
    assert decisions[3].reason == "fixed_delay: 3 of 3 restarts used"


def test_fixed_delay_with_zero_attempts_refuses_the_first_failure() -> None:
    decision = fixed_delay(attempts=0).create_tracker(ManualClock()).on_failure()
    assert decision == RestartDecision(False, 0.0, "fixed_delay: 0 of 0 restarts used")


def test_fixed_delay_trackers_are_independent() -> None:
    strategy = fixed_delay(attempts=1, delay=0.0)
    first = strategy.create_tracker(ManualClock())
    assert first.on_failure().restart
    assert not first.on_failure().restart
    assert strategy.create_tracker(ManualClock()).on_failure().restart


# ---------------------------------------------------------------- failure rate


def test_failure_rate_spread_out_failures_keep_restarting() -> None:
    clock = ManualClock(start=1000.0)
    tracker = failure_rate(max_failures=2, interval=10.0, delay=0.5).create_tracker(clock)
    for _ in range(20):
        decision = tracker.on_failure()
        assert decision.restart, decision.reason
        assert decision.delay == 0.5
        clock.advance(6.0)  # at most two failures in any 10 s window


def test_failure_rate_burst_refuses() -> None:
    clock = ManualClock()
    tracker = failure_rate(max_failures=3, interval=60.0).create_tracker(clock)
    for _ in range(3):
        assert tracker.on_failure().restart
        clock.advance(1.0)
    decision = tracker.on_failure()
    assert not decision.restart
    assert decision.reason == "failure_rate: 4 failures within 60.0s exceed max_failures=3"


def test_failure_rate_window_slides() -> None:
    clock = ManualClock()
    tracker = failure_rate(max_failures=2, interval=10.0).create_tracker(clock)
    assert tracker.on_failure().restart  # t=0
    clock.advance(5.0)
    assert tracker.on_failure().restart  # t=5: two in window
    clock.advance(5.0)
    # t=10: the failure at t=0 is exactly `interval` old and still counts
    assert not tracker.on_failure().restart
    clock.advance(0.5)
    # t=10.5: window (0.5, 10.5] holds t=5, t=10, t=10.5 -> three
    assert not tracker.on_failure().restart
    clock.advance(10.0)
    # t=20.5: holds t=10.5, t=20.5 -> two
    decision = tracker.on_failure()
    assert decision.restart
    assert decision.reason == "failure_rate: 2 of at most 2 failures within 10.0s"


def test_failure_rate_zero_max_failures_never_restarts() -> None:
    tracker = failure_rate(max_failures=0, interval=1.0).create_tracker(ManualClock())
    assert not tracker.on_failure().restart


# ---------------------------------------------------------------- exponential delay


def test_exponential_delay_grows_by_multiplier_up_to_the_cap() -> None:
    clock = ManualClock()
    tracker = exponential_delay(initial=1.0, max_delay=10.0, multiplier=2.0).create_tracker(clock)
    delays = []
    for _ in range(7):
        decision = tracker.on_failure()
        assert decision.restart
        delays.append(decision.delay)
        clock.advance(decision.delay + 1.0)
    assert delays == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0, 10.0]


def test_exponential_delay_resets_after_quiet_time() -> None:
    clock = ManualClock()
    strategy = exponential_delay(initial=0.5, max_delay=100.0, multiplier=3.0, reset_after=60.0)
    tracker = strategy.create_tracker(clock)
    assert [tracker.on_failure().delay for _ in range(3)] == [0.5, 1.5, 4.5]
    clock.advance(59.0)
    assert tracker.on_failure().delay == 13.5  # not quiet long enough
    clock.advance(60.0)
    assert tracker.on_failure().delay == 0.5
    assert tracker.on_failure().delay == 1.5


def test_exponential_delay_attempts_cap_and_reset_with_the_backoff() -> None:
    clock = ManualClock()
    tracker = exponential_delay(attempts=2, reset_after=100.0).create_tracker(clock)
    first, second, third = (tracker.on_failure() for _ in range(3))
    assert first.restart and second.restart
    assert first.reason == "exponential_delay: restart 1 of 2 after 1.000s"
    assert not third.restart
    assert third.reason.startswith("exponential_delay: 2 of 2 restarts used")
    clock.advance(100.0)
    decision = tracker.on_failure()
    assert decision.restart
    assert decision.delay == 1.0


def test_exponential_delay_jitter_stays_within_bounds_and_is_seeded() -> None:
    strategy = exponential_delay(initial=4.0, max_delay=1000.0, multiplier=1.0, jitter=0.25, seed=3)
    tracker = strategy.create_tracker(ManualClock())
    delays = [tracker.on_failure().delay for _ in range(200)]
    assert all(3.0 <= d <= 5.0 for d in delays)
    assert min(delays) < 3.5 and max(delays) > 4.5  # actually spread, not constant
    again = strategy.create_tracker(ManualClock())
    assert [again.on_failure().delay for _ in range(200)] == delays


def test_exponential_delay_jitter_never_exceeds_max_delay() -> None:
    strategy = exponential_delay(initial=8.0, max_delay=10.0, jitter=1.0, seed=11)
    tracker = strategy.create_tracker(ManualClock())
    delays = [tracker.on_failure().delay for _ in range(100)]
    assert all(0.0 <= d <= 10.0 for d in delays)
    assert max(delays) == 10.0  # the cap was reached and clamped


# ---------------------------------------------------------------- config objects


@pytest.mark.parametrize(
    "strategy",
    [
        none(),
        fixed_delay(attempts=2, delay=0.1),
        failure_rate(max_failures=1, interval=5.0),
        exponential_delay(jitter=0.5, seed=9, attempts=4, reset_after=math.inf),
    ],
)
def test_strategies_are_immutable_picklable_and_described(strategy: RestartStrategy) -> None:
    restored = pickle.loads(pickle.dumps(strategy))
    assert restored == strategy
    assert restored.describe() == strategy.describe()
    assert strategy.describe().split("(")[0] in {
        "none",
        "fixed_delay",
        "failure_rate",
        "exponential_delay",
    }
    with pytest.raises(AttributeError):
        strategy.delay = 5.0  # type: ignore[attr-defined]


def test_describe_shows_settings() -> None:
    assert fixed_delay(attempts=3, delay=1).describe() == "fixed_delay(attempts=3, delay=1.0s)"
    assert (
        failure_rate(max_failures=3, interval=60, delay=2).describe()
        == "failure_rate(max_failures=3, interval=60.0s, delay=2.0s)"
    )
    assert "attempts=unlimited" in exponential_delay().describe()


@pytest.mark.parametrize(
    ("build", "name"),
    [
        (lambda: fixed_delay(attempts=-1), "attempts"),
        (lambda: fixed_delay(attempts=1.5), "attempts"),  # type: ignore[arg-type]
        (lambda: fixed_delay(attempts=True), "attempts"),
        (lambda: fixed_delay(attempts=1, delay=-0.1), "delay"),
        (lambda: fixed_delay(attempts=1, delay=math.nan), "delay"),
        (lambda: fixed_delay(attempts=1, delay="1"), "delay"),  # type: ignore[arg-type]
        (lambda: failure_rate(max_failures=-1, interval=1.0), "max_failures"),
        (lambda: failure_rate(max_failures=1, interval=0.0), "interval"),
        (lambda: failure_rate(max_failures=1, interval=math.inf), "interval"),
        (lambda: failure_rate(max_failures=1, interval=1.0, delay=-1), "delay"),
        (lambda: exponential_delay(initial=0.0), "initial"),
        (lambda: exponential_delay(initial=5.0, max_delay=1.0), "max_delay"),
        (lambda: exponential_delay(multiplier=0.5), "multiplier"),
        (lambda: exponential_delay(multiplier=math.inf), "multiplier"),
        (lambda: exponential_delay(reset_after=0.0), "reset_after"),
        (lambda: exponential_delay(jitter=1.5), "jitter"),
        (lambda: exponential_delay(jitter=math.nan), "jitter"),
        (lambda: exponential_delay(attempts=-2), "attempts"),
        (lambda: exponential_delay(seed=1.5), "seed"),  # type: ignore[arg-type]
    ],
)
def test_invalid_arguments_name_the_offending_parameter(build, name: str) -> None:
    with pytest.raises(ConfigurationError, match=rf"^\w+: {name} "):
        build()
