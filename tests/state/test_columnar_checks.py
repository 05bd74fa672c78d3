"""The checks of columnar input on their own: null event times, uint64 values beyond
int64, and the guard of int64 sums (its cheap bound and its exact comparison)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from epochstream.exceptions import DataError
from epochstream.state.columnar_checks import (
    IntSumGuard,
    check_value_range,
    event_times,
    value_type_of,
    with_value_type,
)


def test_event_times_refuse_nulls_naming_the_operator() -> None:
    assert event_times(pa.record_batch([pa.array([5, 7])], names=["_ts"]), "op").tolist() == [5, 7]
    with pytest.raises(DataError, match=r"op \(1/1\): 1 of 2 rows have no event time"):
        event_times(pa.record_batch([pa.array([5, None], pa.int64())], names=["_ts"]), "op (1/1)")


def test_value_range_of_uint64_columns() -> None:
    check_value_range(pa.array([2**63 - 1, None], pa.uint64()), "op", "v")
    check_value_range(pa.array([None], pa.uint64()), "op", "v")
    with pytest.raises(DataError, match=r"op: column 'v' holds 9223372036854775808"):
        check_value_range(pa.array([2**63], pa.uint64()), "op", "v")


def test_the_sum_guard_stays_cheap_until_sums_near_the_limit() -> None:
    guard = IntSumGuard("sum(v) (1/1)", "v")
    asked: list[bool] = []

    def held() -> float:
        asked.append(True)
        return 0.0

    assert not guard.risky(pa.array([10**9, -(10**9), None]), held)
    assert asked == []  # the bound (2e9) is far from 2**62
    assert not guard.risky(pa.array([2**61]), held)
    assert guard.risky(pa.array([2**61, 2**61]), held) and asked == [True]
    guard.check(np.array([2**62], dtype=np.int64), np.array([2.0**62]), lambda i: "a")
    with pytest.raises(
        DataError, match=r"sum\(v\) \(1/1\): the sum of column 'v' overflows int64 for key 'b'"
    ):
        guard.check(
            np.array([5, -(2**63)], dtype=np.int64), np.array([5.0, 2.0**63]), lambda i: "ab"[i]
        )


def test_the_value_type_rides_in_the_state_tables_metadata() -> None:
    table = pa.table({"acc": pa.array([1])})
    assert value_type_of(table) is None and with_value_type(table, None) is table
    noted = with_value_type(table, pa.int32())
    assert value_type_of(noted) == pa.int32() and noted.column("acc").equals(table.column("acc"))
