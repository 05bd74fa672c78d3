"""The RocksDB key layout: round trips and the byte order the backend's scans rely on."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from epochstream.state.backends.rocksdb.states import (
    decode_prefix,
    encode_prefix,
    key_group_bounds,
    prefix_end,
)
from epochstream.state.keyformat import encode_key

_key_groups = st.integers(0, 32767)
_keys = st.one_of(st.text(max_size=8), st.integers(), st.tuples(st.text(max_size=3), st.integers()))
_namespaces = st.one_of(st.just(None), st.integers(0, 5), st.text(max_size=3))
# (key group, key, namespace, rest): rest is a map user key's bytes or a list element's
# sequence number, or nothing (a value, or a list's counter).
_entries = st.tuples(
    _key_groups,
    _keys,
    _namespaces,
    st.one_of(
        st.just(b""), _keys.map(encode_key), st.integers(0, 9).map(lambda n: n.to_bytes(8, "big"))
    ),
)


def _db_key(kg: int, key: object, ns: object, rest: bytes) -> bytes:
    return encode_prefix(kg, encode_key(key), b"" if ns is None else encode_key(ns)) + rest


@settings(max_examples=300, deadline=None)
@given(_entries)
def test_decode_prefix_inverts_encode_prefix(entry: tuple[int, object, object, bytes]) -> None:
    kg, key, ns, rest = entry
    ns_bytes = b"" if ns is None else encode_key(ns)
    assert decode_prefix(_db_key(kg, key, ns, rest)) == (kg, encode_key(key), ns_bytes, rest)


@settings(max_examples=200, deadline=None)
@given(st.lists(_entries, min_size=1, max_size=30), _key_groups, _key_groups)
def test_key_groups_sort_together_and_bounds_select_a_range(
    entries: list[tuple[int, object, object, bytes]], a: int, b: int
) -> None:
    db_keys = sorted({_db_key(*e) for e in entries})
    groups = [decode_prefix(k)[0] for k in db_keys]
    assert groups == sorted(groups)  # key order is key-group order
    start, stop = min(a, b), max(a, b) + 1
    lo, hi = key_group_bounds(start, stop)
    assert [k for k in db_keys if lo <= k < hi] == [
        k for k, kg in zip(db_keys, groups, strict=True) if start <= kg < stop
    ]


@settings(max_examples=200, deadline=None)
@given(st.lists(_entries, min_size=1, max_size=30))
def test_a_prefix_scan_finds_exactly_the_entries_of_one_key_and_namespace(
    entries: list[tuple[int, object, object, bytes]],
) -> None:
    db_keys = {_db_key(*e): e for e in entries}
    for kg, key, ns, _rest in entries:
        prefix = _db_key(kg, key, ns, b"")
        end = prefix_end(prefix)
        found = {k for k in db_keys if prefix <= k < end}
        assert found == {k for k in db_keys if k.startswith(prefix)}
        assert found == {
            k
            for k, (kg2, key2, ns2, _) in db_keys.items()
            if _db_key(kg2, key2, ns2, b"") == prefix
        }


def test_key_group_bounds_of_the_last_key_groups() -> None:
    assert key_group_bounds(3, 5) == (b"\x00\x03", b"\x00\x05")
    assert key_group_bounds(32767, 32768) == (b"\x7f\xff", b"\x80\x00")
