"""Savepoints written offline, restored by real jobs (issue 26's acceptance tests).

1. Word counts bootstrapped from a Parquet file into a savepoint; the word-count job
   starts from it, a slot is SIGKILLed mid-run: final counts are bootstrap + stream,
   every update exactly once (heap and RocksDB).
2. A running job's savepoint transformed (every count doubled) and restored at another
   parallelism on the other backend (heap -> RocksDB, RocksDB -> heap): exact.
"""

from __future__ import annotations

import collections
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest
from e2e_support import (
    VOCABULARY,
    CountPerKey,
    build_wordcount,
    final_values,
    is_python_process,
    write_corpus,
)

import epochstream as es

pytestmark = pytest.mark.slow


def _backend(name: str) -> es.state.StateBackend:
    if name == "rocksdb":
        return es.state.RocksDBStateBackend(incremental=True, block_cache_mb=8)
    return es.state.HeapStateBackend()


def _update_problems(rows: list[Any], start: dict[Any, int], added: dict[Any, int]) -> list[str]:
    """Why ``rows`` are not exactly the updates ``(k, start[k] + 1 .. start[k] + added[k])``."""
    updates = collections.Counter((row[0], row[1]) for row in rows)
    problems = []
    dups = sorted(u for u, n in updates.items() if n > 1)
    if dups:
        problems.append(f"duplicated updates, e.g. {dups[:5]}")
    expected = {(k, start.get(k, 0) + i) for k, n in added.items() for i in range(1, n + 1)}
    if set(updates) != expected:
        missing = sorted(expected - set(updates))[:5]
        extra = sorted(set(updates) - expected)[:5]
        problems.append(f"missing updates {missing}, unexpected updates {extra}")
    return problems


@pytest.mark.parametrize("backend", ["heap", "rocksdb"])
def test_bootstrapped_word_counts_survive_a_crash(tmp_path: Path, backend: str) -> None:
    rng = random.Random(26)
    # Every vocabulary word but a few starts with a count; the few start from zero.
    boot = {w: rng.randint(1, 10_000) for w in VOCABULARY[:-3]}
    parquet = tmp_path / "counts.parquet"
    pq.write_table(pa.table({"word": list(boot), "n": list(boot.values())}), parquet)

    new = es.savepoint.new(max_parallelism=128, parallelism=2)
    # A dataset is read batch by batch, as a file larger than memory would be.
    words = pads.dataset(parquet)
    new.with_keyed_state("word-counts", "_reduce", words, key="word", value=["word", "n"])
    path = new.write(str(tmp_path / "bootstrapped"))
    assert es.savepoint.load(path).operators["word-counts"].keyed_states == {"_reduce": "value"}

    text, out = tmp_path / "words.txt", tmp_path / "out"
    stream = write_corpus(text, lines=16_000, seed=2026)
    env = es.Environment(parallelism=2, runner="local")
    env.enable_checkpointing(0.3, storage=str(tmp_path / "ckpt"))
    env.set_restart_strategy(es.restart.fixed_delay(attempts=3, delay=0.2))
    env.set_state_backend(_backend(backend))
    build_wordcount(env, text, out, lines_per_second=3_000)

    client = env.execute_async("bootstrapped-wordcount", from_savepoint=path)
    try:
        client.wait_for_checkpoint(2, timeout=120)
        pid = client.slot_pids()[1]
        assert is_python_process(pid)
        assert not client.done, "the job finished before the kill"
        es.testing.kill_slot(client, 1)
        result = client.result(timeout=240)
    finally:
        if not client.done:
            client.cancel()

    assert result.restored_from == path
    assert result.restarts >= 1
    rows = es.testing.read_committed(out)
    assert _update_problems(rows, boot, dict(stream)) == []
    finals: dict[str, int] = {}
    for word, count in rows:
        finals[word] = max(finals.get(word, 0), count)
    assert finals == {w: boot.get(w, 0) + n for w, n in stream.items()}


KEYS = 13


def _key(i: int) -> str:
    return f"k{i % KEYS}"


def _counting_job(env: es.Environment, out: Path, n: int, *, rate: float | None) -> None:
    (
        env.from_sequence(0, n, rate=rate)
        .uid("numbers")
        .key_by(_key)
        .process(CountPerKey())
        .uid("count-per-key")
        .sink_to(es.sinks.FileSink(str(out)))
        .uid("files")
    )


@pytest.mark.parametrize(("first", "second"), [("heap", "rocksdb"), ("rocksdb", "heap")])
def test_doubled_counts_restore_at_another_parallelism_on_the_other_backend(
    tmp_path: Path, first: str, second: str
) -> None:
    env = es.Environment(parallelism=2, runner="local")
    env.enable_checkpointing(0.3, storage=str(tmp_path / "ckpt"))
    env.set_state_backend(_backend(first))
    _counting_job(env, tmp_path / "out-1", 200_000, rate=20_000)
    client = env.execute_async("counts")
    client.wait_for_checkpoint(1, timeout=120)
    saved = client.cancel(savepoint=str(tmp_path / "sp"))
    with pytest.raises(es.JobCancelled):
        client.result(timeout=60)

    sp = es.savepoint.load(saved)
    before = sp.read_keyed_state("count-per-key", "n").to_pydict()
    counts = dict(zip(before["key"], before["value"], strict=True))
    assert counts and all(v > 0 for v in counts.values())
    doubled = str(tmp_path / "doubled")
    sp.transform(
        "count-per-key", "n", lambda b: b.set_column(1, "value", pc.multiply(b["value"], 2))
    )
    for uid in set(sp.operators) - {"count-per-key"}:  # the new run reads its input anew
        sp.drop_operator(uid)
    sp.write(doubled)

    env = es.Environment(parallelism=3, runner="local")
    env.enable_checkpointing(0.3, storage=str(tmp_path / "ckpt"))
    env.set_state_backend(_backend(second))
    more = 5_000
    _counting_job(env, tmp_path / "out-2", more, rate=None)
    result = env.execute("counts-doubled", from_savepoint=doubled)

    assert result.restored_from == doubled
    start = {k: 2 * v for k, v in counts.items()}
    added = collections.Counter(_key(i) for i in range(more))
    rows = es.testing.read_committed(tmp_path / "out-2")
    assert _update_problems(rows, start, dict(added)) == []
    after = es.savepoint.load(doubled).read_keyed_state("count-per-key", "n").to_pydict()
    assert dict(zip(after["key"], after["value"], strict=True)) == start


def test_bootstrap_from_a_bounded_job_through_its_final_checkpoint(tmp_path: Path) -> None:
    """A bounded job's state at the end of its input (its final checkpoint, kept when a
    job finishes) becomes a savepoint the streaming job starts from: per key, the
    bounded job's count plus the stream's."""
    env = es.Environment(parallelism=2, runner="local")
    env.enable_checkpointing(0.5, storage=str(tmp_path / "bootstrap-ckpt"))
    _counting_job(env, tmp_path / "history", 5_000, rate=None)
    bounded = env.execute("history")

    sp = es.savepoint.load(str(tmp_path / "bootstrap-ckpt" / bounded.job_id))
    history = sp.read_keyed_state("count-per-key", "n").to_pydict()
    assert sum(history["value"]) == 5_000  # every input record, not a prefix
    # The bounded job's source ended at its last position and its sink committed: only
    # the counts go on (kept, the new job's source would resume past its end).
    path = sp.drop_operator("numbers").drop_operator("files").write(str(tmp_path / "boot"))

    env = es.Environment(parallelism=3, runner="local")
    env.enable_checkpointing(0.5, storage=str(tmp_path / "ckpt"))
    env.set_state_backend(es.state.RocksDBStateBackend())
    _counting_job(env, tmp_path / "live", 1_300, rate=None)
    assert env.execute("live", from_savepoint=path).restored_from == path
    final = final_values(es.testing.read_committed(str(tmp_path / "live")))
    per_key = dict(zip(history["key"], history["value"], strict=True))
    assert final == {k: per_key[k] + 100 for k in per_key}  # 1,300 records over 13 keys
