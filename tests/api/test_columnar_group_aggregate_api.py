"""The group aggregation's API: ``key_by(...).aggregate(es.agg...)`` gives a changelog,
``to_changelog()``/``from_changelog()`` turn it into plain rows and back; local jobs
with checkpoints against a dict."""

from __future__ import annotations

import collections
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import epochstream as es
from epochstream.exceptions import ConfigurationError
from epochstream.graph.specs import MiniBatch


def _final(rows: list[dict]) -> dict:
    """A changelog of {op, k, ...} rows applied by key ``k``."""
    table: dict = {}
    for row in rows:
        op, key = row.pop("op"), row["k"]
        if op in ("-U", "-D"):
            assert table.pop(key) == row, (op, row)
        else:
            assert key not in table, (op, row)
            table[key] = row
    return table


@pytest.mark.parametrize("mini_batch", [None, MiniBatch(latency_ms=50, size=1_200)])
def test_key_by_aggregate_is_a_changelog_and_to_changelog_names_the_kinds(
    tmp_path: Path, mini_batch: MiniBatch | None
) -> None:
    """With a mini-batch too: held rows are folded before each checkpoint barrier, so
    the committed changelog still leaves every row counted once."""
    rng = random.Random(1)
    n = 5_000
    table = pa.table({"k": [rng.randint(0, 30) for _ in range(n)], "v": list(range(n))})
    pq.write_table(table, tmp_path / "in.parquet", row_group_size=500)
    env = es.Environment(parallelism=2, runner="local")
    env.enable_checkpointing(0.2, storage=str(tmp_path / "ck"))
    counts = (
        env.from_parquet(str(tmp_path / "in.parquet"), batch_size=500)
        .key_by("k")
        .aggregate(es.agg.count_star("n"), es.agg.sum("v", "total"), mini_batch=mini_batch)
    )
    assert counts._t.kind == "columnar_group_aggregate"
    counts.to_changelog("op").to_rows().sink_to(es.sinks.FileSink(str(tmp_path / "out")))
    env.execute("group-aggregate")
    expected: dict = collections.defaultdict(lambda: {"n": 0, "total": 0})
    for k, v in zip(table["k"].to_pylist(), table["v"].to_pylist(), strict=True):
        expected[k]["n"] += 1
        expected[k]["total"] += v
    got = _final(list(es.testing.read_committed(tmp_path / "out")))
    assert got == {k: {"k": k, **e} for k, e in expected.items()}


def test_from_changelog_feeds_retractions_to_an_aggregation(tmp_path: Path) -> None:
    ops = ["+I", "+I", "+I", "-U", "+U", "-D"]
    rows = pa.table({"op": ops, "k": ["a", "a", "b", "a", "a", "b"], "v": [1, 2, 5, 2, 7, 5]})
    pq.write_table(rows, tmp_path / "changes.parquet")
    env = es.Environment(parallelism=1, runner="local")
    sums = (
        env.from_parquet(str(tmp_path / "changes.parquet"))
        .from_changelog("op")
        .key_by("k")
        .aggregate(es.agg.sum("v", "total"), es.agg.count_star("n"), updating_input=True)
    )
    sums.to_changelog("op").to_rows().sink_to(es.sinks.FileSink(str(tmp_path / "out")))
    env.execute("retract")
    got = _final(list(es.testing.read_committed(tmp_path / "out")))
    assert got == {"a": {"k": "a", "total": 8, "n": 2}}  # b's one row was deleted


def test_misuse_is_refused_when_the_job_is_built() -> None:
    env = es.Environment(parallelism=1, runner="local")
    stream = env.from_sequence(0, 9, batch_size=4)
    with pytest.raises(ConfigurationError, match=r"takes es\.agg calls"):
        stream.key_by("value").aggregate(len)
    with pytest.raises(ConfigurationError, match="the stream is rows"):
        env.from_collection([1]).to_changelog()
