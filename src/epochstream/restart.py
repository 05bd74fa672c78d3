"""Restart strategies for :meth:`StreamExecutionEnvironment.execute` (``es.restart``).

When a task fails, the job master asks the job's restart strategy whether to restart from
the latest completed checkpoint, and after how long. ``none()`` fails the job at once;
``fixed_delay`` allows a fixed number of restarts; ``failure_rate`` restarts unless failures
come too fast; ``exponential_delay`` backs off further after each failure.

Example::

    import epochstream as es

    env.set_restart_strategy(es.restart.fixed_delay(attempts=3, delay=1.0))
    env.set_restart_strategy(es.restart.failure_rate(max_failures=5, interval=300.0))
    env.set_restart_strategy(es.restart.exponential_delay(initial=1.0, max_delay=60.0))
    print(es.restart.none().describe())   # "none"
"""

from __future__ import annotations

from epochstream.core.restart import (
    RestartDecision,
    RestartStrategy,
    exponential_delay,
    failure_rate,
    fixed_delay,
    none,
)

__all__ = [
    "RestartDecision",
    "RestartStrategy",
    "exponential_delay",
    "failure_rate",
    "fixed_delay",
    "none",
]
