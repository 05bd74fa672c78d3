"""The regular join on DataStreams: ``left.join(right).where(k).equal_to(k).select(...,
join_type=..., updating_input=..., output_schema=...)``; a local job with checkpoints
joining a group aggregation's changelog with a table, against DuckDB."""

from __future__ import annotations

import collections
import random
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import epochstream as es
from epochstream.exceptions import ConfigurationError

OUTPUT = pa.schema(
    [("k", pa.int64()), ("n", pa.int64()), ("rk", pa.int64()), ("name", pa.string())]
)


def test_a_full_join_of_a_changelog_and_a_table_equals_duckdb(tmp_path: Path) -> None:
    rng = random.Random(5)
    bids = pa.table({"k": [rng.randint(0, 40) for _ in range(3_000)]})
    names = pa.table({"k": list(range(20, 60)), "name": [f"n{i}" for i in range(20, 60)]})
    pq.write_table(bids, tmp_path / "bids.parquet", row_group_size=300)
    pq.write_table(names, tmp_path / "names.parquet", row_group_size=10)
    env = es.Environment(parallelism=2, runner="local")
    env.enable_checkpointing(0.2, storage=str(tmp_path / "ck"))
    counts = (
        env.from_parquet(str(tmp_path / "bids.parquet"), batch_size=300)
        .key_by("k")
        .aggregate(es.agg.count_star("n"))
    )
    people = env.from_parquet(str(tmp_path / "names.parquet"), batch_size=10)
    joined = (
        counts.join(people)
        .where("k")
        .equal_to("k")
        .select(
            ["k", "n"],
            [("k", "rk"), "name"],
            join_type="full",
            updating_input=True,
            output_schema=OUTPUT,
        )
    )
    assert joined._t.kind == "columnar_regular_join" and joined._t.name == "full-join(k=k)"
    joined.to_changelog("op").to_rows().sink_to(es.sinks.FileSink(str(tmp_path / "out")))
    env.execute("full-join")
    held: collections.Counter[tuple[object, ...]] = collections.Counter()
    for row in es.testing.read_committed(tmp_path / "out"):
        op = row.pop("op")
        held[tuple(row[n] for n in OUTPUT.names)] += 1 if op in ("+I", "+U") else -1
    assert all(n >= 0 for n in held.values())
    con = duckdb.connect()
    con.register("bids", bids)
    con.register("names", names)
    expected = con.execute(
        "SELECT c.k, c.n, p.k, p.name FROM (SELECT k, COUNT(*) AS n FROM bids GROUP BY k) c "
        "FULL JOIN names p ON c.k = p.k"
    ).fetchall()
    assert +held == collections.Counter(expected)


def test_an_outer_join_needs_the_output_types() -> None:
    env = es.Environment(parallelism=1, runner="local")
    rows = env.from_collection([1]).to_batches(pa.schema([("k", pa.int64())]))
    with pytest.raises(ConfigurationError, match="output_schema"):
        rows.join(rows).where("k").equal_to("k").select(["k"], [("k", "rk")], join_type="left")
