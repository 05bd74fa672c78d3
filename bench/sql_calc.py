"""CalcProgram against the same computation written by hand with ``pyarrow.compute``.

Three Nexmark-style programs over one 65,536-row bid batch:

- q1: ``auction, bidder, 0.908 * price, dateTime, extra`` (DECIMAL arithmetic);
- q2: ``auction, price WHERE MOD(auction, 123) = 0`` (a filter);
- q21: ``LOWER(channel)`` compared four times in a CASE whose ELSE is a REGEXP_EXTRACT,
  filtered by the same REGEXP_EXTRACT or an IN list (common subexpressions);
- q22: three ``SPLIT_INDEX(url, '/', i)`` of one URL (one split shared).

Each is timed as the best of ``--rounds`` (each round ``--repeat`` calls), compiled
program and hand-written code alternating, and the ratio (program / hand) printed: the
cost of the program's generality (per-step dispatch, type conversions, checked
arithmetic) over the kernels it calls.

Example::

    .venv/bin/python bench/sql_calc.py --rounds 7 --repeat 20
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from decimal import Decimal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import sqlglot

from epochstream.sql.dialect import Flink
from epochstream.sql.expressions import CalcProgram, Field
from epochstream.sql.functions import FunctionCatalog
from epochstream.sql.types import SqlType

ROWS = 65_536
CHANNELS = ["Apple", "Google", "Facebook", "Baidu", "channel-1", "channel-2"]


def bid_batch(rows: int = ROWS, seed: int = 7) -> pa.RecordBatch:
    """A bid batch shaped like the Nexmark generator's (prices in cents, urls with a
    channel_id on a third of the rows)."""
    rng = np.random.default_rng(seed)
    channel = rng.integers(0, len(CHANNELS), rows)
    url = [
        f"https://www.nexmark.com/a{i % 97}/b{i % 13}/item.htm?query=1"
        + (f"&channel_id={i % 1000}" if i % 3 == 0 else "")
        for i in range(rows)
    ]
    return pa.record_batch(
        {
            "auction": pa.array(rng.integers(1000, 100_000, rows), pa.int64()),
            "bidder": pa.array(rng.integers(1000, 100_000, rows), pa.int64()),
            "price": pa.array(rng.integers(1, 100_000_000, rows), pa.int64()),
            "channel": pa.array([CHANNELS[c] for c in channel]),
            "url": pa.array(url),
            "dateTime": pa.array(np.arange(rows, dtype=np.int64) * 10, pa.timestamp("ms")),
            "extra": pa.array(["x" * (i % 20) for i in range(rows)]),
        }
    )


def parse(text: str) -> sqlglot.exp.Expr:
    return sqlglot.parse_one(f"SELECT {text} FROM bid", dialect=Flink).expressions[0]


def program(
    batch: pa.RecordBatch, projections: list[tuple[str, str]], where: str | None
) -> CalcProgram:
    fields = [Field(f.name, SqlType.from_arrow(f.type)) for f in batch.schema]
    return CalcProgram.compile(
        [(name, parse(text)) for name, text in projections],
        parse(where) if where else None,
        fields,
        FunctionCatalog(),
    )


def q1_by_hand(batch: pa.RecordBatch) -> pa.RecordBatch:
    price = pc.cast(batch.column("price"), pa.decimal128(19, 0))
    euro = pc.multiply(pa.scalar(Decimal("0.908"), pa.decimal128(4, 3)), price)
    return pa.record_batch(
        [
            batch.column("auction"),
            batch.column("bidder"),
            euro,
            batch.column("dateTime"),
            batch.column("extra"),
        ],
        names=["auction", "bidder", "price", "dateTime", "extra"],
    )


def q2_by_hand(batch: pa.RecordBatch) -> pa.RecordBatch:
    keep = pc.equal(pc.remainder(batch.column("auction"), 123), 0)
    return batch.select(["auction", "price"]).filter(keep)


Q21_PATTERN = "(?P<g0>(?P<g1>&|^)channel_id=(?P<g2>[^&]*))"


def q21_by_hand(batch: pa.RecordBatch) -> pa.RecordBatch:
    lower = pc.utf8_lower(batch.column("channel"))
    extracted = pc.struct_field(pc.extract_regex(batch.column("url"), pattern=Q21_PATTERN), [2])
    keep = pc.or_kleene(
        pc.is_valid(extracted),
        pc.is_in(lower, value_set=pa.array(["apple", "google", "facebook", "baidu"])),
    )
    batch, lower, extracted = batch.filter(keep), lower.filter(keep), extracted.filter(keep)
    conditions = pc.make_struct(
        *(pc.equal(lower, name) for name in ["apple", "google", "facebook", "baidu"]),
        field_names=["0", "1", "2", "3"],
    )
    n = batch.num_rows
    ids = pc.case_when(conditions, *(pa.repeat(pa.scalar(v), n) for v in "0123"), extracted)
    return pa.record_batch(
        [
            batch.column("auction"),
            batch.column("bidder"),
            batch.column("price"),
            batch.column("channel"),
            ids,
        ],
        names=["auction", "bidder", "price", "channel", "channel_id"],
    )


def q22_by_hand(batch: pa.RecordBatch) -> pa.RecordBatch:
    parts = pc.split_pattern(batch.column("url"), "/")
    # SPLIT_INDEX is NULL past the last piece: a one-wide slice pads with null.
    dirs = [
        pc.list_element(pc.list_slice(parts, i, i + 1, return_fixed_size_list=True), 0)
        for i in (3, 4, 5)
    ]
    columns = [batch.column(c) for c in ("auction", "bidder", "price", "channel")]
    return pa.record_batch(
        [*columns, *dirs],
        names=["auction", "bidder", "price", "channel", "dir1", "dir2", "dir3"],
    )


Q21_CASE = """CASE
    WHEN lower(channel) = 'apple' THEN '0'
    WHEN lower(channel) = 'google' THEN '1'
    WHEN lower(channel) = 'facebook' THEN '2'
    WHEN lower(channel) = 'baidu' THEN '3'
    ELSE REGEXP_EXTRACT(url, '(&|^)channel_id=([^&]*)', 2)
    END"""
Q21_WHERE = """REGEXP_EXTRACT(url, '(&|^)channel_id=([^&]*)', 2) is not null or
    lower(channel) in ('apple', 'google', 'facebook', 'baidu')"""


def timed(fn: Callable[[pa.RecordBatch], object], batch: pa.RecordBatch, repeat: int) -> float:
    """Seconds per call of ``fn(batch)``, averaged over ``repeat`` calls."""
    start = time.perf_counter()
    for _ in range(repeat):
        fn(batch)
    return (time.perf_counter() - start) / repeat


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    batch = bid_batch()
    cases = {
        "q1": (
            program(
                batch,
                [
                    ("auction", "auction"),
                    ("bidder", "bidder"),
                    ("price", "0.908 * price"),
                    ("dateTime", "`dateTime`"),
                    ("extra", "extra"),
                ],
                None,
            ),
            q1_by_hand,
        ),
        "q2": (
            program(batch, [("auction", "auction"), ("price", "price")], "MOD(auction, 123) = 0"),
            q2_by_hand,
        ),
        "q21": (
            program(
                batch,
                [
                    ("auction", "auction"),
                    ("bidder", "bidder"),
                    ("price", "price"),
                    ("channel", "channel"),
                    ("channel_id", Q21_CASE),
                ],
                Q21_WHERE,
            ),
            q21_by_hand,
        ),
        "q22": (
            program(
                batch,
                [(c, c) for c in ("auction", "bidder", "price", "channel")]
                + [(f"dir{i - 2}", f"SPLIT_INDEX(url, '/', {i})") for i in (3, 4, 5)],
                None,
            ),
            q22_by_hand,
        ),
    }
    print(f"{ROWS:,} rows per batch; best of {args.rounds} rounds of {args.repeat} calls")
    print(f"{'query':6} {'program ms':>11} {'by hand ms':>11} {'ratio':>6}")
    for name, (compiled, by_hand) in cases.items():
        assert compiled(batch).to_pydict() == by_hand(batch).to_pydict(), name
        ours, theirs = [], []
        for _ in range(args.rounds):
            ours.append(timed(compiled, batch, args.repeat))
            theirs.append(timed(by_hand, batch, args.repeat))
        a, b = min(ours), min(theirs)
        print(f"{name:6} {a * 1e3:11.3f} {b * 1e3:11.3f} {a / b:6.2f}")


if __name__ == "__main__":
    main()
