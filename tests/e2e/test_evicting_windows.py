"""An evicting window with per-window and global state on Spark: a slot killed mid-run
gives exactly the output of a run without failures (evicted contents, their
timestamps and both kinds of state come back from the checkpoint).

Keys are blocks of consecutive numbers, and the sequence source reads contiguous
ranges in order, so each key's records arrive in order whatever the parallelism and
restarts: the sliding count window's output is a function of the input alone.
"""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import pytest

import epochstream as es

pytestmark = [pytest.mark.slow, pytest.mark.spark]

N = 20_000
BLOCK = 1_000  # a key's records: one block of consecutive numbers (never two splits)
SIZE, SLIDE = 5, 2

FIRING = es.state.ValueStateDescriptor("firing", default=0)
BEST = es.state.ReducingStateDescriptor("best", reduce_fn=max)


class Firings(es.ProcessWindowFunction):
    """Per firing: key, its number (per-window state), the sum of the records left after
    eviction, how many, and the best sum of the key so far (global state)."""

    def process(self, key: Any, ctx: Any, elements: Any, out: Any) -> None:
        values = [v for _, v in elements]
        firing = ctx.window_state().get_state(FIRING)
        firing.update(firing.value() + 1)
        best = ctx.global_state().get_reducing_state(BEST)
        best.add(sum(values))
        out.collect([key, firing.value(), sum(values), len(values), best.get()])


def _job(env: es.Environment, out: Path, rate: float | None) -> None:
    (
        env.from_sequence(0, N, rate=rate)
        .uid("numbers")
        .map(lambda i: (i // BLOCK, i))
        .key_by(lambda t: t[0])
        .count_window(SIZE, SLIDE)
        .process(Firings())
        .uid("sliding-counts")
        .sink_to(es.sinks.FileSink(str(out)))
        .uid("files")
    )


def _oracle() -> collections.Counter[tuple[Any, ...]]:
    rows = []
    for key in range(N // BLOCK):
        seen: list[int] = []
        best = None
        for n, i in enumerate(range(key * BLOCK, (key + 1) * BLOCK), start=1):
            seen.append(i)
            if n % SLIDE == 0:
                kept = seen[-SIZE:]
                best = sum(kept) if best is None else max(best, sum(kept))
                rows.append((key, n // SLIDE, sum(kept), len(kept), best))
    return collections.Counter(rows)


def _rows(out: Path) -> collections.Counter[tuple[Any, ...]]:
    return collections.Counter(tuple(r) for r in es.testing.read_committed(out))


def test_evicting_window_with_window_state_after_a_slot_crash(spark: Any, tmp_path: Path) -> None:
    calm = es.Environment(parallelism=2, spark=spark)
    calm.enable_checkpointing(0.3, storage=str(tmp_path / "ckpt-calm"))
    _job(calm, tmp_path / "calm", rate=None)
    calm.execute("evicting-calm")
    expected = _rows(tmp_path / "calm")
    assert expected == _oracle()

    env = es.Environment(parallelism=2, spark=spark)
    env.enable_checkpointing(0.3, storage=str(tmp_path / "ckpt"))
    env.set_restart_strategy(es.restart.fixed_delay(attempts=3, delay=0.2))
    _job(env, tmp_path / "out", rate=4_000)
    client = env.execute_async("evicting-crash")
    try:
        client.wait_for_checkpoint(2, timeout=120)
        assert not client.done, "the crash must come mid-run"
        es.testing.kill_slot(client, 1)
        result = client.result(timeout=240)
    finally:
        if not client.done:
            client.cancel()
    assert result.restarts >= 1
    assert _rows(tmp_path / "out") == expected, "every firing committed once, state restored"
