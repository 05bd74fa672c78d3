"""``SET`` options: Flink's keys and duration syntax, refusals naming the statement."""

from __future__ import annotations

import pytest

import epochstream as es
from epochstream.sql.options import SqlOptions, parse_duration_ms


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("500", 500),
        ("500 ms", 500),
        ("10s", 10_000),
        ("2 min", 120_000),
        ("1 h", 3_600_000),
        ("3 days", 259_200_000),
        ("0", 0),
    ],
)
def test_durations_follow_flinks_units(text: str, ms: int) -> None:
    assert parse_duration_ms(text) == ms


@pytest.mark.parametrize("text", ["", "1.5 s", "-1 s", "10 fortnights", "s"])
def test_a_bad_duration_says_what_is_accepted(text: str) -> None:
    with pytest.raises(ValueError, match="expected a duration"):
        parse_duration_ms(text)


def test_options_are_typed_with_flinks_defaults() -> None:
    options = SqlOptions()
    assert (options.state_ttl_ms, options.mini_batch_enabled, options.mini_batch_size) == (
        0,
        False,
        0,
    )
    options = (
        options.with_option("table.exec.state.ttl", "1 h")
        .with_option("table.exec.mini-batch.enabled", "TRUE")
        .with_option("table.exec.mini-batch.size", "5000")
    )
    assert (options.state_ttl_ms, options.mini_batch_enabled, options.mini_batch_size) == (
        3_600_000,
        True,
        5000,
    )


def test_set_refuses_an_unknown_key_and_a_bad_value_at_the_statement() -> None:
    env = es.Environment(parallelism=1, runner="local")
    env.execute_sql("SET 'table.exec.state.ttl' = '10 min'")
    with pytest.raises(es.SqlError, match=r"line 1.*unknown option 'table.exec.nope'"):
        env.execute_sql("SET 'table.exec.nope' = '1'")
    with pytest.raises(es.SqlError, match=r"option 'table.exec.mini-batch.size'.*above 0"):
        env.execute_sql("SET 'table.exec.mini-batch.size' = '-3'")
