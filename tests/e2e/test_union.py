"""union(): a task with several input edges aligns barriers across all of them."""

from __future__ import annotations

import pytest

import epochstream as es


@pytest.mark.slow
@pytest.mark.parametrize("crash", [False, True])
def test_union_of_three_streams_is_exactly_once(tmp_path, crash: bool) -> None:
    env = es.Environment(parallelism=2, runner="local")
    env.enable_checkpointing(0.2, storage=str(tmp_path / "ckpt"))
    env.set_restart_strategy(es.restart.fixed_delay(attempts=2, delay=0.1))
    a = env.from_sequence(0, 30_000, rate=30_000)
    b = env.from_sequence(100_000, 120_000, rate=20_000).rebalance().map(lambda i: i)
    c = env.from_collection(range(200_000, 200_500))
    merged = a.union(b, c)
    if crash:
        merged = merged.map(
            es.testing.FailOnce(after_records=8_000, after_checkpoints=1, crash=True)
        )
    (
        merged.map(lambda i: ("all", i + 1))
        .key_by(lambda t: t[0])
        .reduce(lambda x, y: (x[0], x[1] + y[1]))
        .sink_to(es.sinks.FileSink(str(tmp_path / "out")))
    )
    result = env.execute("union")
    assert result.restarts == (1 if crash else 0)
    # Arrival order across the inputs is nondeterministic, so check what every order gives:
    # the sorted running sums step by exactly the inputs (all distinct and positive), once each.
    sums = sorted(v for _, v in es.testing.read_committed(tmp_path / "out"))
    steps = [b - a for a, b in zip([0, *sums], sums, strict=False)]
    inputs = [*range(0, 30_000), *range(100_000, 120_000), *range(200_000, 200_500)]
    assert sorted(steps) == [i + 1 for i in inputs]
