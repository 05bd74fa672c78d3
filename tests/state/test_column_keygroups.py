"""Golden test: columnar key groups equal the row path's for the same keys."""

from __future__ import annotations

import datetime as dt
import random

import numpy as np
import pyarrow as pa
import pytest

from epochstream.state.column_keygroups import (
    key_groups_by_columns,
    key_groups_of_column,
    key_groups_of_columns,
    murmur3_32_rows,
)
from epochstream.state.keygroups import key_group_for_key, murmur3_32


def _row_path(values: list[object], max_parallelism: int) -> list[int]:
    return [key_group_for_key(v, max_parallelism) for v in values]


INT_EDGES = [0, 1, -1, 255, 256, -256, 65535, 65536, 2**31 - 1, -(2**31), 2**63 - 1, -(2**63)]


@pytest.mark.parametrize("max_parallelism", [1, 7, 128, 32768])
@pytest.mark.parametrize("arrow_type", [pa.int8(), pa.int16(), pa.int32(), pa.int64()])
def test_signed_integers_match_the_row_path(arrow_type: pa.DataType, max_parallelism: int) -> None:
    rng = random.Random(7)
    bits = arrow_type.bit_width
    lo, hi = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    values = [v for v in INT_EDGES if lo <= v <= hi] + [rng.randint(lo, hi) for _ in range(3000)]
    got = key_groups_of_column(pa.array(values, type=arrow_type), max_parallelism)
    assert got.dtype == np.int32
    assert got.tolist() == _row_path(values, max_parallelism)


def test_unsigned_integers_match_the_row_path() -> None:
    values = [0, 1, 255, 2**32, 2**64 - 1, *random.Random(1).sample(range(2**40), 2000)]
    got = key_groups_of_column(pa.array(values, type=pa.uint64()), 128)
    assert got.tolist() == _row_path(values, 128)


def test_the_w1_keys_match_the_row_path() -> None:
    values = [i * 7919 % 100_000 for i in range(50_000)]
    assert key_groups_of_column(pa.array(values), 128).tolist() == _row_path(values, 128)


@pytest.mark.parametrize("arrow_type", [pa.string(), pa.large_string()])
def test_strings_match_the_row_path(arrow_type: pa.DataType) -> None:
    rng = random.Random(3)
    alphabet = "abcxyzé日本🙂 -_0123456789"
    values = ["", "a", "user-7", "日本語", "🙂" * 9] + [
        "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40))) for _ in range(3000)
    ]
    got = key_groups_of_column(pa.array(values, type=arrow_type), 128)
    assert got.tolist() == _row_path(values, 128)


def test_sliced_string_column_and_nulls_match_the_row_path() -> None:
    values = ["x", None, "yy", "", None, "zzz", "a" * 100]
    column = pa.array(["pad", "pad", *values])[2:]
    assert key_groups_of_column(column, 128).tolist() == _row_path(values, 128)


def test_binary_matches_the_row_path() -> None:
    values = [b"", b"\x00", b"abc", bytes(range(200))]
    assert key_groups_of_column(pa.array(values), 64).tolist() == _row_path(values, 64)


def test_other_types_match_the_row_path_per_value() -> None:
    floats = [1.0, 1.5, -0.0, float("nan"), 2.0**70, None]
    assert key_groups_of_column(pa.array(floats), 128).tolist() == _row_path(floats, 128)
    dates = [dt.date(2024, 1, d) for d in range(1, 20)]
    assert key_groups_of_column(pa.array(dates), 128).tolist() == _row_path(dates, 128)
    ints_with_null = [1, None, 3]
    got = key_groups_of_column(pa.array(ints_with_null), 128)
    assert got.tolist() == _row_path(ints_with_null, 128)


def test_chunked_and_dictionary_columns() -> None:
    chunked = pa.chunked_array([["a", "b"], ["c"]])
    assert key_groups_of_column(chunked, 128).tolist() == _row_path(["a", "b", "c"], 128)
    dictionary = pa.array(["u", "v", "u"]).dictionary_encode()
    assert key_groups_of_column(dictionary, 128).tolist() == _row_path(["u", "v", "u"], 128)


@pytest.mark.parametrize("length", [0, 1, 3, 4, 5, 8, 13, 64])
def test_murmur_rows_equals_mmh3(length: int) -> None:
    rng = np.random.default_rng(length)
    rows = rng.integers(0, 256, size=(50, length), dtype=np.uint8)
    expected = [murmur3_32(bytes(row)) for row in rows]
    assert murmur3_32_rows(rows).tolist() == expected


def test_dense_table_grows_and_matches_the_row_path() -> None:
    small = list(range(0, 70_000, 7))
    assert key_groups_of_column(pa.array(small), 128).tolist() == _row_path(small, 128)
    larger = [0, 1, 200_000, 3_000_000, (1 << 22) - 1, 1 << 22, 5]
    assert key_groups_of_column(pa.array(larger), 128).tolist() == _row_path(larger, 128)
    unsigned = [0, 9, 60_000]
    got = key_groups_of_column(pa.array(unsigned, pa.uint16()), 32768)
    assert got.tolist() == _row_path(unsigned, 32768)


def _random_column(rng: random.Random, kind: str, n: int) -> pa.Array:
    if kind == "int":
        pool = [*INT_EDGES, None]
        return pa.array([rng.choice([*pool, rng.randint(-(2**40), 2**40)]) for _ in range(n)])
    if kind == "int_dense":  # no nulls: the vectorized integer encoding
        return pa.array([rng.choice([*INT_EDGES, rng.randint(-999, 999)]) for _ in range(n)])
    if kind == "uint":
        return pa.array([rng.choice([0, 7, 2**64 - 1, 2**40]) for _ in range(n)], pa.uint64())
    if kind == "string":
        return pa.array([rng.choice([None, "", "a", "é€", "x" * 70, "S"]) for _ in range(n)])
    if kind == "binary":
        return pa.array([rng.choice([None, b"", b"\x00", b"bytes"]) for _ in range(n)])
    if kind == "float":
        pool = [None, 0.0, -0.0, 1.0, 2.5, -3.25, float("nan"), float("inf"), 1e300]
        return pa.array([rng.choice(pool) for _ in range(n)], pa.float64())
    if kind == "bool":
        return pa.array([rng.choice([None, True, False]) for _ in range(n)])
    return pa.array([None] * n, pa.null())


@pytest.mark.parametrize("seed", range(8))
def test_tuples_of_columns_match_the_row_path_tuple_keys(seed: int) -> None:
    kinds = ["int", "int_dense", "uint", "string", "binary", "float", "bool", "null"]
    rng = random.Random(seed)
    chosen = [rng.choice(kinds) for _ in range(rng.randint(1, 4))]
    columns = [_random_column(rng, kind, 500) for kind in chosen]
    tuples = list(zip(*(c.to_pylist() for c in columns), strict=True))
    for max_parallelism in (1, 128, 32768):
        got = key_groups_of_columns(columns, max_parallelism)
        assert got.dtype == np.int32
        assert got.tolist() == _row_path(tuples, max_parallelism), chosen


def test_no_columns_is_the_empty_tuple_and_one_column_by_its_value() -> None:
    assert key_groups_of_columns([], 128, rows=3).tolist() == [key_group_for_key((), 128)] * 3
    column = pa.array(["a", None, "b"])
    assert key_groups_by_columns([column], 128, rows=3).tolist() == _row_path(["a", None, "b"], 128)
    pairs = [column, pa.array([1, 2, 3])]
    assert key_groups_by_columns(pairs, 128, rows=3).tolist() == _row_path(
        [("a", 1), (None, 2), ("b", 3)], 128
    )
