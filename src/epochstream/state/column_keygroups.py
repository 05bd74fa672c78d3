"""Key groups of a whole Arrow column at once, equal to the per-record routing.

The row path hashes ``encode_key(key)`` (the stored key bytes) with MurmurHash3 (x86,
32 bit) per record. A columnar ``key_by("column")`` must send every row to the subtask the row
path would pick for the same key, or state restored from one path would be looked
up in the wrong key group by the other. This module computes the same function with
NumPy, a few vector operations per 4-byte block instead of a Python call per row:

- integer columns (any width, signed or not): the stored bytes (the ``KeyTag.INT``
  layout of :mod:`epochstream.state.keyformat`) are ``b"I+"`` or
  ``b"I-"``, the magnitude's byte length as 4 bytes big-endian, then the magnitude
  big-endian in that many bytes. Rows are grouped by that length (at most 9 groups),
  and each group is hashed as a fixed-width byte matrix.
- string and binary columns: ``b"S"`` + UTF-8 bytes (``b"B"`` + bytes); rows are
  grouped by length and each length hashed as a matrix gathered from the Arrow
  buffers. Null rows hash like ``None``.
- small non-negative integers (ids, the common key) are looked up in a table of the
  key groups of ``0..n`` built with the integer path above, grown as larger values
  arrive up to ``DENSE_LIMIT``: one gather per column;
- anything else (floats, timestamps, dictionaries, nested types) goes through
  :func:`key_group_for_key` per distinct value: correct, not vectorized.

Composite keys (``key_by(["a", "b"])``, the groups of a SQL window aggregation) are the
tuple ``(a, b)`` on the row path: ``KeyTag.SEQUENCE`` bytes, ``b"L"``, the item count,
then each item's ``encode_key`` bytes behind its 4-byte length.
:func:`key_groups_of_columns` builds those bytes for the whole batch (each column
encoded as above: integers and strings with vector operations, other types per
distinct value), joins them row-wise with Arrow and hashes them as the string path does.

``tests/state/test_column_keygroups.py`` is the golden test against the row path.

Example::

    kgs = key_groups_of_column(pa.array([1, 2, 3]), max_parallelism=128)
    list(kgs) == [key_group_for_key(k, 128) for k in (1, 2, 3)]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from epochstream.state.keyformat import KeyTag, encode_key
from epochstream.state.keygroups import key_group_for_key, validate_max_parallelism

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "DENSE_LIMIT",
    "key_groups_by_columns",
    "key_groups_of_column",
    "key_groups_of_columns",
    "murmur3_32_rows",
    "tuple_keys_of_columns",
]

#: Integer keys in ``0 <= key < DENSE_LIMIT`` use a lookup table (int16 per value).
DENSE_LIMIT = 1 << 22
# Per max_parallelism: key groups of 0..len-1 (a memo; equal whichever thread builds it).
_DENSE_TABLES: dict[int, np.ndarray] = {}

# The first two bytes of the INT layout (tag, sign), from the encoder itself.
_INT_POSITIVE, _INT_NEGATIVE = encode_key(1)[:2], encode_key(-1)[:2]

_C1 = np.uint32(0xCC9E2D51)
_C2 = np.uint32(0x1B873593)
_N = np.uint32(0xE6546B64)
_M1 = np.uint32(0x85EBCA6B)
_M2 = np.uint32(0xC2B2AE35)


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def murmur3_32_rows(rows: np.ndarray) -> np.ndarray:
    """MurmurHash3 x86 32-bit (seed 0) of each row of a ``uint8`` matrix ``(n, length)``.

    Example::

        murmur3_32_rows(np.frombuffer(b"hello", np.uint8).reshape(1, 5))[0] == murmur3_32(b"hello")
    """
    n, length = rows.shape
    h = np.zeros(n, dtype=np.uint32)
    nblocks = length // 4
    with np.errstate(over="ignore"):
        if nblocks:
            blocks = np.ascontiguousarray(rows[:, : nblocks * 4]).view("<u4")
            for i in range(nblocks):
                k1 = _rotl(blocks[:, i] * _C1, 15) * _C2
                h = _rotl(h ^ k1, 13) * np.uint32(5) + _N
        tail = length & 3
        if tail:
            k1 = np.zeros(n, dtype=np.uint32)
            base = nblocks * 4
            for j in range(tail):
                k1 ^= rows[:, base + j].astype(np.uint32) << np.uint32(8 * j)
            h ^= _rotl(k1 * _C1, 15) * _C2
        h ^= np.uint32(length)
        h ^= h >> np.uint32(16)
        h *= _M1
        h ^= h >> np.uint32(13)
        h *= _M2
        h ^= h >> np.uint32(16)
    return h


def _magnitudes(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each integer's sign, magnitude (uint64) and byte length (0-8): the parts of
    ``encode_key``'s integer layout."""
    negative = values < 0
    if values.dtype == np.uint64:
        magnitude = values
    else:
        # abs() of int64's minimum overflows; as uint64 its two's complement is its magnitude.
        magnitude = np.where(negative, -(values.astype(np.int64)), values).astype(np.uint64)
    size = np.zeros(len(values), dtype=np.int64)
    rest = magnitude.copy()
    for _ in range(8):
        size += rest > 0
        rest >>= np.uint64(8)
    return negative, magnitude, size


def _integer_key_groups(values: np.ndarray, max_parallelism: int) -> np.ndarray:
    negative, magnitude, size = _magnitudes(values)
    big_endian = magnitude.astype(">u8").view(np.uint8).reshape(-1, 8)
    out = np.empty(len(values), dtype=np.uint32)
    for s in np.unique(size).tolist():
        rows = np.flatnonzero(size == s)
        matrix = np.empty((len(rows), 6 + s), dtype=np.uint8)
        matrix[:, 0] = _INT_POSITIVE[0]
        matrix[:, 1] = np.where(negative[rows], _INT_NEGATIVE[1], _INT_POSITIVE[1])
        matrix[:, 2:6] = np.frombuffer(int(s).to_bytes(4, "big"), dtype=np.uint8)
        matrix[:, 6:] = big_endian[rows, 8 - s :]
        out[rows] = murmur3_32_rows(matrix)
    return (out % np.uint32(max_parallelism)).astype(np.int32)


def _dense_table(max_parallelism: int, upto: int) -> np.ndarray:
    """The key groups of ``0..n-1`` for some ``n > upto`` (built and grown in powers of two)."""
    table = _DENSE_TABLES.get(max_parallelism)
    if table is None or len(table) <= upto:
        size = max(1 << 16, 1 << int(upto).bit_length())
        have = 0 if table is None else len(table)
        grown = np.empty(size, dtype=np.int16)
        if table is not None:
            grown[:have] = table
        grown[have:] = _integer_key_groups(np.arange(have, size, dtype=np.int64), max_parallelism)
        _DENSE_TABLES[max_parallelism] = table = grown
    return table


def _binary_key_groups(column: pa.Array, tag: bytes, max_parallelism: int) -> np.ndarray:
    import pyarrow as pa
    import pyarrow.compute as pc

    large = pa.types.is_large_string(column.type) or pa.types.is_large_binary(column.type)
    offsets_type: type = np.int64 if large else np.int32
    column = column.cast(pa.large_binary() if large else pa.binary())
    n = len(column)
    buffers = column.buffers()
    offsets: np.ndarray = np.frombuffer(buffers[1], dtype=offsets_type)[
        column.offset : column.offset + n + 1
    ]
    data = (
        np.frombuffer(buffers[2], dtype=np.uint8)
        if buffers[2] is not None
        else np.empty(0, np.uint8)
    )
    starts = offsets[:-1].astype(np.int64)
    lengths = (offsets[1:] - offsets[:-1]).astype(np.int64)
    out = np.empty(n, dtype=np.uint32)
    valid = (
        np.ones(n, dtype=bool)
        if column.null_count == 0
        else pc.is_valid(column).to_numpy(zero_copy_only=False)
    )
    tag_bytes = np.frombuffer(tag, dtype=np.uint8)
    for length in np.unique(lengths[valid]).tolist():
        rows = np.flatnonzero(valid & (lengths == length))
        matrix = np.empty((len(rows), len(tag) + length), dtype=np.uint8)
        matrix[:, : len(tag)] = tag_bytes
        if length:
            matrix[:, len(tag) :] = data[starts[rows, None] + np.arange(length)]
        out[rows] = murmur3_32_rows(matrix)
    result = (out % np.uint32(max_parallelism)).astype(np.int32)
    if not valid.all():
        result[~valid] = key_group_for_key(None, max_parallelism)
    return result


def _generic_key_groups(column: pa.Array, max_parallelism: int) -> np.ndarray:
    import pyarrow.compute as pc

    encoded = column.dictionary_encode() if not hasattr(column, "indices") else column
    groups = np.array(
        [key_group_for_key(v, max_parallelism) for v in encoded.dictionary.to_pylist()],
        dtype=np.int32,
    )
    indices = pc.fill_null(encoded.indices, -1).to_numpy(zero_copy_only=False)
    out = groups[indices] if len(groups) else np.empty(len(column), dtype=np.int32)
    if encoded.null_count:
        out[indices < 0] = key_group_for_key(None, max_parallelism)
    return out


def key_groups_of_column(column: pa.Array | pa.ChunkedArray, max_parallelism: int) -> np.ndarray:
    """The key group (int32) of every value of ``column``, as the row path computes it
    for the same Python value (``column.to_pylist()``).

    Example::

        key_groups_of_column(pa.array(["a", "b"]), 128).tolist() == [
            key_group_for_key("a", 128), key_group_for_key("b", 128)]
    """
    import pyarrow as pa

    validate_max_parallelism(max_parallelism)
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    kind = column.type
    if pa.types.is_integer(kind) and column.null_count == 0:
        values = column.to_numpy()
        if pa.types.is_unsigned_integer(kind):
            values = values.astype(np.uint64)
        else:
            values = values.astype(np.int64)
        if len(values) and 0 <= values.min() and values.max() < DENSE_LIMIT:
            table = _dense_table(max_parallelism, int(values.max()))
            return table[values].astype(np.int32)
        return _integer_key_groups(values, max_parallelism)
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return _binary_key_groups(column, KeyTag.STR.value, max_parallelism)
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return _binary_key_groups(column, KeyTag.BYTES.value, max_parallelism)
    return _generic_key_groups(column, max_parallelism)


def _binary_of(rows: np.ndarray, lengths: np.ndarray) -> pa.Array:
    """A binary array of the first ``lengths[i]`` bytes of each row of ``rows``."""
    import pyarrow as pa

    data = rows[np.arange(rows.shape[1]) < lengths[:, None]]
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return pa.Array.from_buffers(
        pa.large_binary(), len(lengths), [None, pa.py_buffer(offsets), pa.py_buffer(data)]
    )


def _encoded_integers(values: np.ndarray) -> pa.Array:
    """``encode_key`` of each integer (the ``KeyTag.INT`` layout), as a binary array."""
    negative, magnitude, size = _magnitudes(values)
    rows = np.zeros((len(values), 14), dtype=np.uint8)
    rows[:, 0] = _INT_POSITIVE[0]
    rows[:, 1] = np.where(negative, _INT_NEGATIVE[1], _INT_POSITIVE[1])
    rows[:, 2:6] = size.astype(">u4").view(np.uint8).reshape(-1, 4)
    # The magnitude's ``size`` bytes shifted to the front of bytes 6..13 (0 has none:
    # its shift of 64 is taken as 0, and 0 shifted is 0).
    shift = (np.uint64(8) * (np.uint64(8) - size.astype(np.uint64))) % np.uint64(64)
    front = magnitude << shift
    rows[:, 6:] = front.astype(">u8").view(np.uint8).reshape(-1, 8)
    return _binary_of(rows, 6 + size)


def _encoded_column(column: pa.Array) -> pa.Array:
    """``encode_key`` of every value of ``column`` (``b"N"`` for nulls), as a binary array."""
    import pyarrow as pa
    import pyarrow.compute as pc

    kind = column.type
    if pa.types.is_integer(kind) and column.null_count == 0:
        unsigned = pa.types.is_unsigned_integer(kind)
        return _encoded_integers(column.to_numpy().astype(np.uint64 if unsigned else np.int64))
    tag = None
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        tag = KeyTag.STR.value
    elif pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        tag = KeyTag.BYTES.value
    if tag is not None:
        joined = pc.binary_join_element_wise(
            pa.scalar(tag, pa.large_binary()),
            column.cast(pa.large_binary()),
            pa.scalar(b"", pa.large_binary()),
        )
    else:
        encoded = column.dictionary_encode() if not hasattr(column, "indices") else column
        values = [encode_key(v) for v in encoded.dictionary.to_pylist()]
        joined = pa.array(values, pa.large_binary()).take(encoded.indices)
    if joined.null_count:
        joined = pc.fill_null(joined, pa.scalar(encode_key(None), pa.large_binary()))
    return joined


def _length_prefixes(encoded: pa.Array) -> pa.Array:
    """The 4-byte big-endian length of each value of ``encoded``, as a binary array."""
    import pyarrow.compute as pc

    lengths = pc.binary_length(encoded).to_numpy(zero_copy_only=False)
    rows = lengths.astype(">u4").view(np.uint8).reshape(-1, 4)
    return _binary_of(rows, np.full(len(lengths), 4, dtype=np.int64))


def key_groups_of_columns(
    columns: Sequence[pa.Array | pa.ChunkedArray], max_parallelism: int, *, rows: int = 0
) -> np.ndarray:
    """The key group (int32) of every row's tuple of ``columns``' values, as the row path
    computes it for the tuple key ``(a, b, ...)`` (``encode_key`` of the tuple, murmur).
    No columns: each of ``rows`` rows has the key ``()`` (a global aggregation's).

    Example::

        kgs = key_groups_of_columns([pa.array([1, 2]), pa.array(["x", None])], 128)
        kgs.tolist() == [key_group_for_key((1, "x"), 128), key_group_for_key((2, None), 128)]
    """

    validate_max_parallelism(max_parallelism)
    if not columns:
        return np.full(rows, key_group_for_key((), max_parallelism), dtype=np.int32)
    return _binary_key_groups(tuple_keys_of_columns(columns), b"", max_parallelism)


def tuple_keys_of_columns(columns: Sequence[pa.Array | pa.ChunkedArray]) -> pa.Array:
    """``encode_key`` of every row's tuple of ``columns``' values (at least one column),
    as a large binary array: equal tuples give equal bytes, so it is a composite key
    in one column (a columnar join's state files its rows under it).

    Example::

        tuple_keys_of_columns([pa.array([1]), pa.array(["x"])])[0].as_py() == encode_key((1, "x"))
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    parts: list[pa.Array | pa.Scalar] = [
        pa.scalar(encode_key(())[:1] + len(columns).to_bytes(4, "big"), pa.large_binary())
    ]
    for column in columns:
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks()
        encoded = _encoded_column(column)
        parts += [_length_prefixes(encoded), encoded]
    joined: pa.Array = pc.binary_join_element_wise(*parts, pa.scalar(b"", pa.large_binary()))
    return joined


def key_groups_by_columns(
    columns: Sequence[pa.Array | pa.ChunkedArray], max_parallelism: int, *, rows: int
) -> np.ndarray:
    """The key groups of ``key_by(names)``: one column keys by its value (as
    ``key_by("name")``), none or several by the tuple of their values.

    Example: ``key_groups_by_columns([pa.array(["a"])], 128, rows=1)[0] == key_group_for_key("a", 128)``
    """
    if len(columns) == 1:
        return key_groups_of_column(columns[0], max_parallelism)
    return key_groups_of_columns(columns, max_parallelism, rows=rows)
