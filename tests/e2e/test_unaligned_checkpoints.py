"""Unaligned checkpoints end to end: real slot processes, real backpressure, real crashes.

Every job here has a deliberately slow end (a :class:`~e2e_support.Throttle` after the
operator under test) and a fast, bounded input sent in small batches, so the input does
not all fit in flight: the queues between the tasks stay full for the whole run. An
aligned checkpoint would wait for those queues to drain; an unaligned one lets its
barrier overtake them and stores the records it overtook as the checkpoint's *channel
state*. Each test proves that this really happened, without timing anything: several
completed checkpoints are unaligned with ``channel_state_bytes > 0``, completed while the
job was still mid-run, and the exactly-once output after a SIGKILL (or a rescale) then
depends on that channel state being replayed.

1. Word count, unaligned from the start, a slot SIGKILLed.
2. The same with an aligned timeout: checkpoints start aligned and switch to unaligned
   once their barrier waited ``aligned_timeout``; with a timeout longer than the job
   they all stay aligned, so the switch is the timeout's doing. Across two exchanges
   (counts -> rebalance -> slow map), one checkpoint's barriers reach a task both in
   line and overtaking.
3. Rescale through retained unaligned checkpoints (heap and RocksDB): parallelism 2,
   cancelled; its checkpoint (with channel state) restored at 3, cancelled again; that
   one restored at 1.
4. Channel state of a broadcast edge: a restore at another parallelism, or into a job
   without that edge, is refused; at its own parallelism it restores exactly. A
   stop-with-savepoint of that job is aligned (no channel state) and rescales it.
5. A two-input keyed join (connected streams, state on both sides) behind a slow sink,
   its large side backpressured while the small side trickles in, a slot SIGKILLed.
6. A union of two streams into a keyed count, a slot SIGKILLed.
7. Event-time tumbling windows behind a slow sink, a slot SIGKILLed.
8. The columnar path (Arrow batches into a keyed sum): a slot SIGKILLed, and a rescale
   from 2 to 3 through a retained checkpoint.
"""

from __future__ import annotations

import collections
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from e2e_support import (
    CountPerKey,
    Throttle,
    _add_counts,
    _first,
    _one,
    _split_words,
    build_wordcount,
    exactly_once_problems,
    run_with_slot_killed,
    write_corpus,
)

import epochstream as es
from epochstream.checkpoint.storage import load_metadata

pytestmark = pytest.mark.slow

# Small batches, so the input does not fit in the queues between the tasks at once.
BATCH_SIZE = 32
INTERVAL = 0.5


def _env(parallelism: int, ckpt: Path, **checkpointing: Any) -> es.Environment:
    env = es.Environment(parallelism=parallelism, runner="local", batch_size=BATCH_SIZE)
    env.enable_checkpointing(INTERVAL, storage=str(ckpt), **checkpointing)
    env.set_restart_strategy(es.restart.fixed_delay(attempts=3, delay=0.2))
    return env


def _with_channel_state(checkpoints: list[es.CheckpointStats]) -> list[es.CheckpointStats]:
    """The unaligned checkpoints that kept records in flight."""
    return [c for c in checkpoints if c.unaligned and c.channel_state_bytes > 0]


def _channel_state_of(checkpoint: es.CheckpointStats, chain_prefix: str) -> int:
    """Channel state bytes of the tasks of the chain whose id starts with ``chain_prefix``."""
    return sum(
        t.channel_state_bytes for key, t in checkpoint.tasks.items() if key.startswith(chain_prefix)
    )


def _assert_backpressured_run(result: es.JobResult, chain_prefix: str) -> None:
    """Several unaligned checkpoints kept records in flight into ``chain_prefix``'s
    tasks; the final checkpoint (end of input) is aligned and keeps nothing."""
    kept = _with_channel_state(result.checkpoints)
    assert len(kept) >= 2, [
        (c.checkpoint_id, c.unaligned, c.channel_state_bytes) for c in result.checkpoints
    ]
    assert any(_channel_state_of(c, chain_prefix) > 0 for c in kept), [c.tasks for c in kept]
    final = result.checkpoints[-1]
    assert not final.unaligned and final.channel_state_bytes == 0


@pytest.mark.parametrize("aligned_timeout", [0.0, 0.2], ids=["unaligned", "aligned-timeout"])
def test_wordcount_with_unaligned_checkpoints_survives_sigkill(
    tmp_path: Path, aligned_timeout: float
) -> None:
    text, out = tmp_path / "words.txt", tmp_path / "out"
    expected = write_corpus(text, lines=6_000, seed=3)
    env = _env(2, tmp_path / "ckpt", unaligned=True, aligned_timeout=aligned_timeout)
    build_wordcount(env, text, out, counts_per_second=5_000)

    result = run_with_slot_killed(env, "ua-wordcount", slot=1, after_checkpoints=3)

    assert result.restarts >= 1
    _assert_backpressured_run(result, "word-counts")
    # Checkpoint 3 completed before the kill, so checkpoints 1..3 were taken mid-run.
    assert [c.checkpoint_id for c in result.checkpoints[:3]] == [1, 2, 3]
    if aligned_timeout == 0.0:
        # Every checkpoint but the final one, so also the one the restart restored,
        # kept records in flight.
        assert _with_channel_state(result.checkpoints) == result.checkpoints[:-1]
    assert exactly_once_problems(es.testing.read_committed(out), expected) == []


def test_aligned_timeout_across_two_exchanges_survives_sigkill(tmp_path: Path) -> None:
    """Word count -> rebalance -> slow map, at parallelism 3 with an aligned timeout: the
    counts' subtasks forward a barrier in line while its timeout has not passed and
    overtaking once it has, so the slow map gets both kinds of one checkpoint's barrier
    on its channels, and its own in-line copies time out too."""
    text, out = tmp_path / "words.txt", tmp_path / "out"
    expected = write_corpus(text, lines=6_000, seed=4)
    env = _env(3, tmp_path / "ckpt", unaligned=True, aligned_timeout=0.2)
    (
        env.from_text_file(str(text))
        .uid("lines")
        .flat_map(_split_words)
        .map(_one)
        .key_by(_first)
        .reduce(_add_counts)
        .uid("word-counts")
        .rebalance()
        .map(Throttle(4_000))
        .uid("slow")
        .sink_to(es.sinks.FileSink(str(out)))
        .uid("files")
    )

    result = run_with_slot_killed(env, "ua-two-exchanges", slot=2, after_checkpoints=3)

    assert result.restarts >= 1
    _assert_backpressured_run(result, "slow")
    assert exactly_once_problems(es.testing.read_committed(out), expected) == []


def test_aligned_timeout_longer_than_the_job_keeps_checkpoints_aligned(tmp_path: Path) -> None:
    """The control of the aligned-timeout case above: same job and backpressure, a timeout
    no checkpoint reaches, so every checkpoint aligns and keeps nothing in flight."""
    text, out = tmp_path / "words.txt", tmp_path / "out"
    expected = write_corpus(text, lines=4_000, seed=5)
    env = _env(2, tmp_path / "ckpt", unaligned=True, aligned_timeout=50.0)
    build_wordcount(env, text, out, counts_per_second=5_000)

    result = env.execute("ua-aligned-timeout-not-reached")

    assert result.checkpoints
    assert [(c.unaligned, c.channel_state_bytes) for c in result.checkpoints] == [(False, 0)] * len(
        result.checkpoints
    )
    assert exactly_once_problems(es.testing.read_committed(out), expected) == []


def _wait_for_channel_state(client: es.JobClient, timeout: float = 120.0) -> None:
    """Block until a checkpoint that kept records in flight completed (the job running)."""
    deadline = time.monotonic() + timeout
    while not _with_channel_state(client.checkpoint_stats()):
        assert not client.done, "the job ended before an unaligned checkpoint kept channel state"
        assert time.monotonic() < deadline, "no checkpoint with channel state"
        time.sleep(0.05)


def _cancel_after_channel_state(client: es.JobClient) -> int:
    """Cancel the job once a checkpoint that kept records in flight completed (it ends
    cancelled, not finished: it was mid-run); return the id of its last completed
    checkpoint, the one a restore must use (the FileSink's output up to it is committed,
    or pending and committed by the restore)."""
    _wait_for_channel_state(client)
    client.cancel()
    with pytest.raises(es.JobCancelled):
        client.result(timeout=120)
    return client.completed_checkpoints()[-1]


def _retained_with_channel_state(ckpt: Path, job_id: str, checkpoint_id: int) -> Path:
    """The retained ``chk-<id>`` of ``job_id``; asserts its metadata holds channel state
    (files that exist, with the size the stats say)."""
    chk = ckpt / job_id / f"chk-{checkpoint_id}"
    assert _channel_state_directions(chk), f"{chk}: no subtask has channel state"
    return chk


def _channel_state_directions(chk: Path) -> set[str]:
    """Which directions (``"input"``: records queued at a task's input, ``"output"``:
    records an upstream task's barrier overtook in its output queue) the channel state
    of checkpoint ``chk`` holds; asserts every file is there with its recorded size."""
    _, md = load_metadata(str(chk))
    assert md.stats.unaligned and md.stats.channel_state_bytes > 0, md.stats
    handles = [s.channel for subtasks in md.operators.values() for s in subtasks.values()]
    directions = set()
    for handle in handles:
        if handle is not None:
            assert Path(handle.path).stat().st_size == handle.size
            directions.update(entry.direction for entry in handle.entries)
    return directions


@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
def test_rescale_through_retained_unaligned_checkpoints(tmp_path: Path, backend: str) -> None:
    """2 -> 3 -> 1: each restore replays channel state kept at another parallelism (the
    in-flight records rerouted by key group) next to keyed state moved by key group."""
    text, out, ckpt = tmp_path / "words.txt", tmp_path / "out", tmp_path / "ckpt"
    expected = write_corpus(text, lines=8_000, seed=11)
    total = sum(expected.values())
    retain = {"unaligned": True, "retained": 3, "retain_on_cancel": True}

    def env_at(parallelism: int, **checkpointing: Any) -> es.Environment:
        env = _env(parallelism, ckpt, **checkpointing)
        if backend == "rocksdb":
            env.set_state_backend(es.state.RocksDBStateBackend())
        return env

    first = env_at(2, **retain)
    build_wordcount(first, text, out, counts_per_second=3_000)
    one = first.execute_async("ua-rescale-p2")
    chk_one = _retained_with_channel_state(ckpt, one.job_id, _cancel_after_channel_state(one))
    assert len(es.testing.read_committed(out)) < total

    second = env_at(3, **retain)
    build_wordcount(second, text, out, counts_per_second=3_000)
    two = second.execute_async("ua-rescale-p3", restore_from=str(chk_one))
    chk_two = _retained_with_channel_state(ckpt, two.job_id, _cancel_after_channel_state(two))
    assert len(es.testing.read_committed(out)) < total, "the second job must stop mid-run"

    third = env_at(1, unaligned=True)
    build_wordcount(third, text, out, counts_per_second=20_000)
    result = third.execute("ua-rescale-p1", restore_from=str(chk_two))

    assert result.restored_from is not None and two.job_id in result.restored_from
    # Both kinds were replayed: inputs (rerouted by key group) and outputs (re-sent).
    assert _channel_state_directions(chk_one) | _channel_state_directions(chk_two) == {
        "input",
        "output",
    }
    assert exactly_once_problems(es.testing.read_committed(out), expected) == []


BROADCAST_N = 12_000


def _identity(value: Any) -> Any:
    return value


def _broadcast_job(env: es.Environment, out: Path, *, insert_map: bool = False) -> None:
    """Every subtask of the slow map gets every number (a broadcast edge);
    ``insert_map``: a new operator at the head of the edge's target (another edge)."""
    numbers = env.from_sequence(0, BROADCAST_N).uid("numbers").broadcast()
    if insert_map:
        numbers = numbers.map(_identity).uid("inserted")
    slow = numbers.map(Throttle(4_000)).uid("slow")
    slow.sink_to(es.sinks.FileSink(str(out))).uid("files")


def test_channel_state_of_a_broadcast_edge_restores_at_its_parallelism_only(
    tmp_path: Path,
) -> None:
    """Records in flight on a broadcast edge went to every subtask; at another
    parallelism they cannot be split, so that restore is refused with a clear error, as
    is a restore into a job without that edge (its records would be lost); nothing is
    committed by either, and the same checkpoint restores at its own parallelism."""
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    first = _env(2, ckpt, unaligned=True, retained=3, retain_on_cancel=True)
    _broadcast_job(first, out)
    client = first.execute_async("ua-broadcast")
    chk = _retained_with_channel_state(ckpt, client.job_id, _cancel_after_channel_state(client))
    committed = Counter(es.testing.read_committed(out))
    assert sum(committed.values()) < 2 * BROADCAST_N

    rescaled = _env(3, ckpt, unaligned=True)
    _broadcast_job(rescaled, out)
    with pytest.raises(es.StateError, match="broadcast edge"):
        rescaled.execute("ua-broadcast-p3", restore_from=str(chk))
    changed = _env(2, ckpt, unaligned=True)
    _broadcast_job(changed, out, insert_map=True)
    with pytest.raises(es.StateError, match="which this job does not have"):
        changed.execute("ua-broadcast-changed", restore_from=str(chk))
    assert Counter(es.testing.read_committed(out)) == committed

    again = _env(2, ckpt, unaligned=True)
    _broadcast_job(again, out)
    again.execute("ua-broadcast-p2", restore_from=str(chk))
    assert Counter(es.testing.read_committed(out)) == Counter({i: 2 for i in range(BROADCAST_N)})


def test_savepoint_of_an_unaligned_job_is_aligned_and_rescales_a_broadcast_edge(
    tmp_path: Path,
) -> None:
    """Stop-with-savepoint of the broadcast job while its checkpoints keep channel
    state: the savepoint waits for the queues instead (no channel state), so it restores
    at parallelism 3, where the retained checkpoint could not. Numbers before the
    savepoint reached the 2 old subtasks, the rest all 3 new ones, each exactly once."""
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    first = _env(2, ckpt, unaligned=True)
    _broadcast_job(first, out)
    client = first.execute_async("ua-broadcast-savepoint")
    _wait_for_channel_state(client)
    path = client.cancel(savepoint=str(tmp_path / "savepoints"))
    with pytest.raises(es.JobCancelled, match="stopped with a savepoint"):
        client.result(timeout=120)
    assert path is not None
    _, md = load_metadata(path)
    assert md.kind == "savepoint" and not md.stats.unaligned and md.stats.channel_state_bytes == 0
    assert all(s.channel is None for subtasks in md.operators.values() for s in subtasks.values())
    before = Counter(es.testing.read_committed(out))
    assert 0 < len(before) < BROADCAST_N, "the first job must stop mid-run"
    assert set(before.values()) == {2}, "each number before the savepoint, to both subtasks"

    rescaled = _env(3, ckpt, unaligned=True)
    _broadcast_job(rescaled, out)
    result = rescaled.execute("ua-broadcast-p3", from_savepoint=path)

    assert result.restored_from == path
    assert _with_channel_state(result.checkpoints), "the resumed job is backpressured too"
    assert Counter(es.testing.read_committed(out)) == Counter(
        {i: 2 if i in before else 3 for i in range(BROADCAST_N)}
    )


# ------------------------------------------------------------------ two-input join

JOIN_KEYS = 300
LEFT = 12_000
# Two right records per key: every left record joins exactly two.
RIGHT = 2 * JOIN_KEYS
# The right side trickles in over about the whole run, so both inputs are live while
# the left one (fast, large) is backpressured.
RIGHT_PER_SECOND = 200


def _keyed_pair(i: int) -> tuple[int, int]:
    return (i, i % JOIN_KEYS)


def _join_key(record: tuple[int, int]) -> int:
    return record[1]


class PairJoin(es.KeyedCoProcessFunction):
    """A regular inner join of (id, key) records: both sides kept in keyed list state,
    each arrival joined with the other side's records so far; emits [left id, right id]."""

    def open(self, ctx: Any) -> None:
        self.lefts = ctx.get_list_state(es.state.ListStateDescriptor("lefts"))
        self.rights = ctx.get_list_state(es.state.ListStateDescriptor("rights"))

    def process_element1(self, left: Any, ctx: Any, out: es.Collector) -> None:
        for right_id in self.rights.get():
            out.collect([left[0], right_id])
        self.lefts.add(left[0])

    def process_element2(self, right: Any, ctx: Any, out: es.Collector) -> None:
        for left_id in self.lefts.get():
            out.collect([left_id, right[0]])
        self.rights.add(right[0])


def test_two_input_join_under_backpressure_survives_sigkill(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = _env(2, tmp_path / "ckpt", unaligned=True)
    lefts = env.from_sequence(0, LEFT).uid("lefts").map(_keyed_pair).key_by(_join_key)
    rights = (
        env.from_sequence(0, RIGHT, rate=RIGHT_PER_SECOND)
        .uid("rights")
        .map(_keyed_pair)
        .key_by(_join_key)
    )
    (
        lefts.connect(rights)
        .process(PairJoin())
        .uid("pair-join")
        .map(Throttle(4_000))
        .uid("slow")
        .sink_to(es.sinks.FileSink(str(out)))
        .uid("files")
    )

    result = run_with_slot_killed(env, "ua-join", slot=1, after_checkpoints=2)

    assert result.restarts >= 1
    _assert_backpressured_run(result, "pair-join")
    got = Counter(tuple(row) for row in es.testing.read_committed(out))
    oracle = Counter((i, j) for i in range(LEFT) for j in range(i % JOIN_KEYS, RIGHT, JOIN_KEYS))
    assert got == oracle


# ------------------------------------------------------------------ union

UNION_KEYS = 37


def _key_of(i: int) -> tuple[int, int]:
    return (i % UNION_KEYS, i)


def _union_key(record: tuple[int, int]) -> int:
    return record[0]


def test_union_into_a_keyed_count_survives_sigkill(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = _env(2, tmp_path / "ckpt", unaligned=True)
    low = env.from_sequence(0, 20_000).uid("low").map(_key_of)
    # A rebalance: the union's second input comes over another kind of edge.
    high = env.from_sequence(50_000, 65_000).uid("high").rebalance().map(_key_of)
    (
        low.union(high)
        .key_by(_union_key)
        .process(CountPerKey())
        .uid("counts")
        .map(Throttle(5_000))
        .uid("slow")
        .sink_to(es.sinks.FileSink(str(out)))
        .uid("files")
    )

    result = run_with_slot_killed(env, "ua-union", slot=1, after_checkpoints=2)

    assert result.restarts >= 1
    _assert_backpressured_run(result, "counts")
    expected = Counter(i % UNION_KEYS for i in (*range(20_000), *range(50_000, 65_000)))
    assert exactly_once_problems(es.testing.read_committed(out), expected) == []


# ------------------------------------------------------------------ event-time windows

EVENTS = 40_000
WINDOW_KEYS = 50
WINDOW_MS = 10


def _event(i: int) -> tuple[int, int]:
    """(key, event time in ms): 1 ms apart, up to 200 ms out of order."""
    return (i % WINDOW_KEYS, 1_000 + i - (i * 7919) % 200)


def _event_time(event: tuple[int, int], _previous: Any) -> int:
    return event[1]


def _event_key(event: tuple[int, int]) -> int:
    return event[0]


class WindowCount(es.ProcessWindowFunction):
    """Emits [key, window start, records in the window]."""

    def process(self, key: Any, ctx: Any, elements: Any, out: es.Collector) -> None:
        out.collect([key, ctx.window.start, sum(1 for _ in elements)])


def test_event_time_windows_survive_sigkill(tmp_path: Path) -> None:
    """Watermarks are not channel state (a restored task starts event time from its
    inputs again): the records replayed from it still land in their windows, none late,
    and every window fires once with its exact count."""
    out = tmp_path / "out"
    env = _env(2, tmp_path / "ckpt", unaligned=True)
    (
        env.from_sequence(0, EVENTS)
        .uid("numbers")
        # Reading lasts a few checkpoint intervals: the windows take their input faster
        # than they emit, so without it the sources would end (and the final, aligned,
        # checkpoint start) before a periodic one.
        .map(Throttle(8_000))
        .map(_event)
        .uid("events")
        .assign_timestamps_and_watermarks(
            # Bounded by more than the disorder: no record is late.
            es.WatermarkStrategy.bounded_out_of_orderness(300).with_timestamp_assigner(_event_time)
        )
        .key_by(_event_key)
        .window(es.TumblingEventTimeWindows.of(timedelta(milliseconds=WINDOW_MS)))
        .process(WindowCount())
        .uid("windows")
        .map(Throttle(3_000))
        .uid("slow")
        .sink_to(es.sinks.FileSink(str(out)))
        .uid("files")
    )

    result = run_with_slot_killed(env, "ua-windows", slot=1, after_checkpoints=2)

    assert result.restarts >= 1
    _assert_backpressured_run(result, "windows")
    per_window: Counter[tuple[int, int]] = Counter()
    for i in range(EVENTS):
        key, ts = _event(i)
        per_window[(key, ts - ts % WINDOW_MS)] += 1
    got = Counter(tuple(row) for row in es.testing.read_committed(out))
    assert got == Counter((key, start, n) for (key, start), n in per_window.items())


# ------------------------------------------------------------------ columnar

COLUMNAR_N = 30_000
COLUMNAR_KEYS = 211


def _to_kv(batch: pa.RecordBatch) -> pa.RecordBatch:
    v = batch["value"]
    # Positive values: every update of a key has its own running sum.
    return pa.record_batch(
        [pc.remainder(pc.multiply(v, 7919), COLUMNAR_KEYS), pc.add(pc.remainder(v, 1000), 1)],
        names=["k", "v"],
    )


def _running_sum_problems(rows: list[dict[str, int]]) -> list[str]:
    """The keyed sum emits one running sum per key and input batch (batches differ
    between attempts), so check what exactly-once gives for any batching: each key's
    committed sums are distinct (a sum committed twice is a replay committed twice) and
    the largest is the key's total (nothing lost)."""
    totals: dict[int, int] = collections.defaultdict(int)
    for i in range(COLUMNAR_N):
        totals[i * 7919 % COLUMNAR_KEYS] += i % 1000 + 1
    sums: dict[int, list[int]] = collections.defaultdict(list)
    for row in rows:
        sums[row["k"]].append(row["v"])
    problems = []
    if set(sums) != set(totals):
        problems.append(f"keys differ: {sorted(set(sums) ^ set(totals))[:5]}")
    for key, total in totals.items():
        got = sums.get(key, [])
        if len(set(got)) != len(got):
            problems.append(f"key {key}: a running sum was committed twice")
        if max(got, default=None) != total:
            problems.append(f"key {key}: last sum {max(got, default=None)}, expected {total}")
    return problems[:5]


def _columnar_sums(env: es.Environment, out: Path) -> None:
    """Arrow batches -> keyed running sum (columnar) -> rows -> a slow map -> FileSink."""
    (
        env.from_sequence(0, COLUMNAR_N, batch_size=256)
        .uid("numbers")
        .map_batches(_to_kv)
        .uid("kv")
        .key_by("k")
        .sum("v")
        .uid("sums")
        .to_rows()
        .map(Throttle(5_000))
        .uid("slow")
        .sink_to(es.sinks.FileSink(str(out)))
        .uid("files")
    )


def test_columnar_keyed_sum_survives_sigkill(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = _env(2, tmp_path / "ckpt", unaligned=True)
    _columnar_sums(env, out)

    result = run_with_slot_killed(env, "ua-columnar", slot=1, after_checkpoints=2)

    assert result.restarts >= 1
    _assert_backpressured_run(result, "sums")
    assert _running_sum_problems(es.testing.read_committed(out)) == []


def test_columnar_rescale_through_a_retained_unaligned_checkpoint(tmp_path: Path) -> None:
    """Record batches in flight, kept at parallelism 2, are split by key group when
    restored at 3 (inputs) or re-partitioned as they are sent again (outputs)."""
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    first = _env(2, ckpt, unaligned=True, retained=3, retain_on_cancel=True)
    _columnar_sums(first, out)
    client = first.execute_async("ua-columnar-p2")
    chk = _retained_with_channel_state(ckpt, client.job_id, _cancel_after_channel_state(client))

    rescaled = _env(3, ckpt, unaligned=True)
    _columnar_sums(rescaled, out)
    result = rescaled.execute("ua-columnar-p3", restore_from=str(chk))

    assert result.restored_from is not None and client.job_id in result.restored_from
    assert _running_sum_problems(es.testing.read_committed(out)) == []
