"""Row batches (runtime/batches.py): the row form of a batch on the wire."""

from __future__ import annotations

import pickle

import pytest

from epochstream.runtime.batches import RowBatch


def test_a_row_batch_without_timestamps_or_keys() -> None:
    batch = RowBatch([1, 2, 3])
    assert (batch.records, batch.timestamps, batch.keys) == ([1, 2, 3], None, None)
    assert len(batch) == 3


@pytest.mark.parametrize(
    "batch",
    [
        RowBatch(["a"]),
        RowBatch(["a", "b"], [1_000, None]),
        RowBatch([("k", 1), ("j", 2)], None, ["k", "j"]),
        RowBatch([("k", 1)], [5], ["k"]),
    ],
)
def test_row_batches_pickle_whole_with_protocol_5(batch: RowBatch) -> None:
    copy = pickle.loads(pickle.dumps(batch, protocol=5))
    assert type(copy) is RowBatch and copy == batch
    assert (copy.records, copy.timestamps, copy.keys) == (
        batch.records,
        batch.timestamps,
        batch.keys,
    )


def test_equality_compares_all_three_parts() -> None:
    assert RowBatch([1], [5]) != RowBatch([1])
    assert RowBatch([1], None, [1]) != RowBatch([1])
    assert RowBatch([1]) != [1]
    with pytest.raises(TypeError):
        hash(RowBatch([1]))
    assert repr(RowBatch([1], [2], [3])) == "RowBatch([1], [2], [3])"
