"""Columnar batches in the writer: routing by key group, buffering, widening."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from epochstream.core.arrow import KG as KG_COLUMN
from epochstream.core.arrow import plain_types
from epochstream.exceptions import ConfigurationError, DataError
from epochstream.graph.transformations import ColumnKey, ColumnKeys, Partitioning
from epochstream.runtime.batches import RowBatch
from epochstream.runtime.columnar_routing import ColumnarRouter, with_key_groups
from epochstream.runtime.outputs import Channel, RecordWriter
from epochstream.state.keygroups import key_group_for_key

MAX_P = 128


class Recorded(Channel):
    def __init__(self) -> None:
        self.items: list[Any] = []

    def send(self, item: Any) -> None:
        self.items.append(item)


def _batch(keys: list[Any], values: list[int] | None = None) -> pa.RecordBatch:
    values = values if values is not None else list(range(len(keys)))
    return pa.record_batch([pa.array(keys), pa.array(values)], names=["k", "v"])


def test_hash_routing_sends_each_row_to_the_owner_of_its_key_group() -> None:
    keys = [f"user-{i % 50}" for i in range(1_000)]
    channels = [Recorded() for _ in range(3)]
    writer = RecordWriter(
        channels,
        partitioning=Partitioning("hash", ColumnKey("k")),
        max_parallelism=MAX_P,
        batch_size=10_000,
        edge="src -> sums (hash)",
    )
    writer.write(_batch(keys))
    writer.flush()
    seen = 0
    for ch, channel in enumerate(channels):
        for batch in channel.items:
            rows = batch.to_pylist()
            seen += len(rows)
            for row in rows:
                kg = key_group_for_key(row["k"], MAX_P)
                assert row[KG_COLUMN] == kg
                assert kg * 3 // MAX_P == ch
    assert seen == 1_000
    assert writer.records_out == 1_000


def test_small_parts_wait_for_batch_size_and_leave_on_flush() -> None:
    shipped: list[tuple[int, int]] = []
    router = ColumnarRouter(
        2,
        kind="rebalance",
        key=None,
        max_parallelism=MAX_P,
        batch_size=5,
        subtask_index=0,
        ship=lambda ch, b: shipped.append((ch, b.num_rows)),
        edge="e",
    )
    router.write(_batch([1, 2]))
    router.write(_batch([3, 4]))
    router.write(_batch([5, 6, 7, 8]))
    assert shipped == [(0, 6)]  # channel 0 reached 5 rows; channel 1 holds 2
    router.flush_channel(1)
    assert shipped == [(0, 6), (1, 2)]


def test_forward_and_broadcast() -> None:
    got: list[tuple[int, int]] = []
    forward = ColumnarRouter(
        3,
        kind="forward",
        key=None,
        max_parallelism=MAX_P,
        batch_size=1,
        subtask_index=2,
        ship=lambda ch, b: got.append((ch, b.num_rows)),
        edge="e",
    )
    forward.write(_batch([1]))
    broadcast = ColumnarRouter(
        2,
        kind="broadcast",
        key=None,
        max_parallelism=MAX_P,
        batch_size=1,
        subtask_index=0,
        ship=lambda ch, b: got.append((ch, b.num_rows)),
        edge="e",
    )
    broadcast.write(_batch([1, 2]))
    assert got == [(2, 1), (0, 2), (1, 2)]


def test_keying_by_a_missing_column_names_it() -> None:
    with pytest.raises(ConfigurationError, match=r"no column 'user'.*columns: k, v"):
        with_key_groups(_batch([1]), ColumnKey("user"), MAX_P)


@pytest.mark.parametrize("keys", [pa.array([[1, 2]]), pa.array([{"a": 1}])], ids=["list", "struct"])
def test_keying_by_a_nested_column_is_refused_naming_it(keys: pa.Array) -> None:
    """It was a raw ArrowNotImplementedError from dictionary_encode, retried by restarts."""
    batch = pa.record_batch([keys], names=["user"])
    with pytest.raises(
        ConfigurationError, match=r"key_by\('user'\): column 'user' is (list|struct)<.*to_rows\(\)"
    ):
        with_key_groups(batch, ColumnKey("user"), MAX_P)


def test_a_users_kg_column_is_refused_and_the_edges_own_is_replaced() -> None:
    """A user's column named _kg was overwritten with key groups: silently wrong keys or
    sums. The edge's own (a keyed stream's map_batches carries it) is recomputed."""
    users = pa.record_batch([pa.array([1, 2]), pa.array([30, 40])], names=["k", "_kg"])
    with pytest.raises(
        DataError, match=r"key_by\('k'\): the batch has a column named '_kg'.*rename it"
    ):
        with_key_groups(users, ColumnKey("k"), MAX_P)
    keyed = with_key_groups(_batch([1, 2]), ColumnKey("k"), MAX_P)
    rekeyed = with_key_groups(keyed, ColumnKey("v"), MAX_P)
    assert rekeyed.schema.names == ["k", "v", KG_COLUMN]
    assert rekeyed.column(KG_COLUMN).to_pylist() == [key_group_for_key(v, MAX_P) for v in [0, 1]]
    # Error messages list the user's columns only.
    with pytest.raises(ConfigurationError, match=r"no column 'x' \(columns: k, v\)$"):
        with_key_groups(keyed, ColumnKey("x"), MAX_P)


def test_view_columns_become_plain_strings_and_route() -> None:
    """string_view (Polars' strings) failed in Arrow's take kernel at the edge."""
    views = pa.record_batch(
        [
            pa.array(["a", "b", None], pa.string_view()),
            pa.array([b"x", b"y", b"z"], pa.binary_view()),
            pa.array([1, 2, 3]),
        ],
        names=["s", "b", "v"],
    )
    plain = plain_types(views)
    assert plain.schema.types == [pa.string(), pa.binary(), pa.int64()]
    assert plain.to_pydict() == views.to_pydict()
    untouched = _batch([1])
    assert plain_types(untouched) is untouched
    shipped: list[tuple[int, pa.RecordBatch]] = []
    router = ColumnarRouter(
        2,
        kind="hash",
        key=ColumnKey("s"),
        max_parallelism=MAX_P,
        batch_size=1,
        subtask_index=0,
        ship=lambda ch, b: shipped.append((ch, b)),
        edge="e",
    )
    router.write(plain)
    assert sorted(v for _, b in shipped for v in b.column("v").to_pylist()) == [1, 2, 3]


def test_a_function_key_on_a_columnar_edge_is_refused() -> None:
    writer = RecordWriter(
        [Recorded()],
        partitioning=Partitioning("hash", lambda r: r[0]),
        max_parallelism=MAX_P,
        batch_size=10,
        edge="a -> b (hash)",
    )
    with pytest.raises(ConfigurationError, match="keyed by a column name"):
        writer.write(_batch([1]))


def test_rows_buffered_before_a_columnar_batch_leave_first() -> None:
    channel = Recorded()
    writer = RecordWriter(
        [channel], partitioning=Partitioning(), max_parallelism=MAX_P, batch_size=100, edge="e"
    )
    writer.write([1, 2])
    writer.write(_batch([3]))
    writer.flush()
    assert channel.items[0] == RowBatch([1, 2])
    assert isinstance(channel.items[1], pa.RecordBatch)


def test_batches_of_different_schemas_on_one_channel_are_bad_data() -> None:
    router = ColumnarRouter(
        1,
        kind="forward",
        key=None,
        max_parallelism=MAX_P,
        batch_size=100,
        subtask_index=0,
        ship=lambda ch, b: None,
        edge="parse -> sums (forward)",
    )
    router.write(_batch([1]))
    router.write(pa.record_batch([pa.array(["x"])], names=["other"]))
    only_some = (
        r"parse -> sums .*must share a schema .*: columns 'k', 'other', 'v' in some batches only$"
    )
    with pytest.raises(DataError, match=only_some):
        router.flush_channel(0)
    # A column of another type is named with both types.
    router.write(_batch(["a"]))
    router.write(_batch(pa.array(["b"], pa.large_string())))
    with pytest.raises(
        DataError, match=r": column 'k' is large_string in one batch and string in another$"
    ):
        router.flush_channel(0)


def test_batches_differing_in_integer_widths_or_nullability_are_widened() -> None:
    """Integer widths that change between batches are accepted downstream (keys come
    out as int64), but two such batches meeting in one send buffer failed the job."""
    shipped: list[pa.RecordBatch] = []
    router = ColumnarRouter(
        1,
        kind="forward",
        key=None,
        max_parallelism=MAX_P,
        batch_size=100,
        subtask_index=0,
        ship=lambda ch, b: shipped.append(b),
        edge="parse -> sums (forward)",
    )
    router.write(pa.record_batch([pa.array([1], pa.int32()), pa.array([5])], names=["k", "v"]))
    strict = pa.schema([("k", pa.int64()), pa.field("v", pa.int64(), nullable=False)])
    router.write(pa.record_batch([pa.array([2**40]), pa.array([6])], schema=strict))
    router.flush_channel(0)
    (batch,) = shipped
    assert batch.schema == pa.schema([("k", pa.int64()), ("v", pa.int64())])
    assert batch.to_pydict() == {"k": [1, 2**40], "v": [5, 6]}
    # An integer column beside a float one is not a width: still bad data.
    router.write(pa.record_batch([pa.array([1]), pa.array([5])], names=["k", "v"]))
    router.write(pa.record_batch([pa.array([1.5]), pa.array([5])], names=["k", "v"]))
    with pytest.raises(DataError, match=r"parse -> sums .*must share a schema"):
        router.flush_channel(0)
    # A uint64 above the int64 range does not widen.
    router.write(pa.record_batch([pa.array([2**63], pa.uint64())], names=["k"]))
    router.write(pa.record_batch([pa.array([1], pa.int8())], names=["k"]))
    with pytest.raises(DataError, match=r"must share a schema"):
        router.flush_channel(0)


def test_batches_with_the_same_columns_in_another_order_are_concatenated() -> None:
    """A union of streams whose columns come in different orders: the job failed or not
    depending on whether two such batches met in one send buffer."""
    shipped: list[pa.RecordBatch] = []
    router = ColumnarRouter(
        1,
        kind="forward",
        key=None,
        max_parallelism=MAX_P,
        batch_size=100,
        subtask_index=0,
        ship=lambda ch, b: shipped.append(b),
        edge="union -> sums (forward)",
    )
    router.write(pa.record_batch([pa.array([1]), pa.array(["a"])], names=["k", "v"]))
    router.write(pa.record_batch([pa.array(["b"]), pa.array([2])], names=["v", "k"]))
    router.flush_channel(0)
    assert [b.to_pydict() for b in shipped] == [{"k": [1, 2], "v": ["a", "b"]}]


def test_several_key_columns_route_by_the_tuple_key_group() -> None:
    batch = pa.record_batch({"a": [1, 2, None], "b": ["x", None, "y"], "v": [0, 0, 0]})
    routed = with_key_groups(batch, ColumnKeys(("a", "b")), 128)
    expected = [key_group_for_key(k, 128) for k in [(1, "x"), (2, None), (None, "y")]]
    assert routed.column(KG_COLUMN).to_pylist() == expected
    everything = with_key_groups(batch, ColumnKeys(()), 128)  # a global aggregation's key
    assert set(everything.column(KG_COLUMN).to_pylist()) == {key_group_for_key((), 128)}
    with pytest.raises(
        ConfigurationError, match=r"key_by\(\['a', 'c'\]\): the batch has no column 'c'"
    ):
        with_key_groups(batch, ColumnKeys(("a", "c")), 128)
