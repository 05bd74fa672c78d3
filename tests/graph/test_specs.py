"""Operator specs (graph/specs.py): what each validates at build time, and the join rules
both the API (declared schemas) and the join operator (first batches) apply."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest

from epochstream.exceptions import ConfigurationError
from epochstream.graph.specs import (
    JOIN_WINDOW_COLUMN,
    DedupSpec,
    JoinSpec,
    SessionWindowSpec,
    join_key_type,
    reserved_join_columns,
)


def test_a_session_spec_needs_a_positive_gap_and_a_column_to_aggregate() -> None:
    assert SessionWindowSpec("count", "k", None, 1).gap == 1
    with pytest.raises(ConfigurationError, match="gap must be positive, got 0 ms"):
        SessionWindowSpec("count", "k", None, 0)
    with pytest.raises(ConfigurationError, match=r"sum\(\) needs the column"):
        SessionWindowSpec("sum", "k", None, 10)


def test_a_join_spec_names_its_state_by_whether_it_is_windowed() -> None:
    assert JoinSpec("a", "b").kind == "join"
    assert JoinSpec("a", "b", size=10, slide=10).kind == "window_join"


def test_integer_keys_of_any_width_join_as_int64_and_other_types_as_themselves() -> None:
    assert join_key_type(pa.int8()) == join_key_type(pa.uint32()) == pa.int64()
    assert join_key_type(pa.string()) == pa.string()
    assert join_key_type(pa.float64()) != join_key_type(pa.int64())


def test_a_window_join_reserves_its_output_columns_and_every_join_its_state_column() -> None:
    regular, windowed = reserved_join_columns(False), reserved_join_columns(True)
    assert set(regular) == {JOIN_WINDOW_COLUMN}
    assert set(windowed) == {JOIN_WINDOW_COLUMN, "window_start", "window_end"}
    assert all(reason.startswith("which") for reason in windowed.values())


def test_specs_are_frozen_payloads() -> None:
    spec = DedupSpec(ttl=dt.timedelta(hours=1), bloom_capacity=10, bloom_fp_rate=0.01)
    with pytest.raises(AttributeError):
        spec.bloom_capacity = 20  # type: ignore[misc]
