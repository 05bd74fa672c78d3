"""The "seeds" example: even and odd running sums off one source, with a failure and recovery.

A source of increasing numbers feeds two filters (even, odd); each branch keeps a running
sum (key_by a constant + rolling reduce) written to its own FileSink. A failure is
injected after the first completed checkpoint. The final sums must equal the closed form
and a failure-free run's, and (exactly-once) every running sum is committed once.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import pytest

import epochstream as es

N = 200_000  # the numbers 1..N: all positive, so every running sum strictly increases
RATE = 100_000  # records/s in total: a run lasts about 2 s, so the failure lands mid-run


def _is_even(n: int) -> bool:
    return n % 2 == 0


def _is_odd(n: int) -> bool:
    return n % 2 == 1


def _tag(name: str, n: int) -> tuple[str, int]:
    return (name, n)


def _sum_pairs(a: tuple[str, int], b: tuple[str, int]) -> tuple[str, int]:
    return (a[0], a[1] + b[1])


def _run_seeds(
    tmp: Path, runner: str, spark: Any, inject: es.testing.FailOnce | None
) -> tuple[es.JobResult, dict[str, list[Any]]]:
    options: dict[str, Any] = {"runner": runner}
    if spark is not None:
        options["spark"] = spark
    env = es.Environment(parallelism=2, **options)
    env.enable_checkpointing(0.3, storage=str(tmp / "ckpt"))
    env.set_restart_strategy(es.restart.fixed_delay(attempts=3, delay=0.2))
    numbers = env.from_sequence(1, N + 1, rate=RATE)
    if inject is not None:
        numbers = numbers.map(inject)
    for name, keep in (("even", _is_even), ("odd", _is_odd)):
        (
            numbers.filter(keep)
            .map(functools.partial(_tag, name))
            .key_by(lambda t: t[0])
            .reduce(_sum_pairs)
            .uid(f"{name}-sum")
            .sink_to(es.sinks.FileSink(str(tmp / name)))
        )
    result = env.execute("seeds")
    return result, {name: es.testing.read_committed(tmp / name) for name in ("even", "odd")}


def _final_sum(rows: list[Any], name: str) -> int:
    assert rows, f"no committed {name} sums"
    assert {row[0] for row in rows} == {name}
    # All numbers are positive, so the running sum only grows: the final sum is the max.
    return max(row[1] for row in rows)


@pytest.mark.slow
@pytest.mark.parametrize("runner", ["local", pytest.param("spark", marks=pytest.mark.spark)])
def test_even_odd_running_sums_survive_failure_after_checkpoint(
    runner: str, tmp_path: Path, failure_markers: str, request: pytest.FixtureRequest
) -> None:
    spark = request.getfixturevalue("spark") if runner == "spark" else None
    evens, odds = N // 2, (N + 1) // 2
    closed_form = {"even": evens * (evens + 1), "odd": odds * odds}  # 2+4+..., 1+3+...

    baseline, baseline_rows = _run_seeds(tmp_path / "free", runner, spark, inject=None)
    inject = es.testing.FailOnce(
        after_records=20_000, after_checkpoints=1, subtask=1, marker_dir=failure_markers
    )
    result, rows = _run_seeds(tmp_path / "failing", runner, spark, inject=inject)

    assert baseline.restarts == 0
    assert result.restarts >= 1
    assert inject.failures_so_far() == 1
    fired = re.search(r"injected failure #1 .* and (\d+) completed checkpoints", result.failures[0])
    assert fired is not None, result.failures[0]
    assert int(fired.group(1)) >= 1, "the failure fired before the first completed checkpoint"
    for name, count in (("even", evens), ("odd", odds)):
        free = _final_sum(baseline_rows[name], name)
        recovered = _final_sum(rows[name], name)
        assert free == closed_form[name]
        assert recovered == closed_form[name]
        # One running-sum update per input number, each committed once: a replay after the
        # restore would repeat sums, a lost record would leave one out.
        for label, got in (("failure-free", baseline_rows[name]), ("recovered", rows[name])):
            sums = [row[1] for row in got]
            assert len(sums) == count, f"{label} {name}: {len(sums)} updates, expected {count}"
            # Running sums of positive numbers strictly increase, so no two updates are equal.
            assert len(set(sums)) == count, f"{label} {name}: duplicated running sums"
