"""Bloom filters: no false negatives, the configured false-positive rate, merging, aging."""

from __future__ import annotations

import pickle

import pytest

from epochstream.exceptions import ConfigurationError
from epochstream.state.bloom import AgingBloomFilter, BloomFilter
from epochstream.state.keyformat import encode_key


def keys(start: int, stop: int) -> list[bytes]:
    return [encode_key(f"id-{i}") for i in range(start, stop)]


def test_no_false_negatives_and_about_the_configured_false_positive_rate() -> None:
    f = BloomFilter.sized(capacity=20_000, fp_rate=0.01)
    added = keys(0, 20_000)
    for k in added:
        f.add(k)
    assert all(f.might_contain(k) for k in added)
    others = keys(100_000, 150_000)
    rate = sum(f.might_contain(k) for k in others) / len(others)
    assert rate < 0.02, f"false-positive rate {rate:.4f} at capacity"


def test_positions_do_not_depend_on_the_process() -> None:
    f = BloomFilter.sized(capacity=100, fp_rate=0.01)
    f.add(encode_key(("user", 7)))
    # Pinned: the filter crosses processes and restarts, so its bits must not change.
    assert (f.bits, f.hashes) == (959, 7)
    set_bits = [p for p in range(f.bits) if f.data[p >> 3] & (1 << (p & 7))]
    assert set_bits == sorted([358, 257, 156, 543, 442, 829, 728])
    g = pickle.loads(pickle.dumps(f.data))
    assert BloomFilter(f.bits, f.hashes, g).might_contain(encode_key(("user", 7)))


def test_merge_is_a_union_and_refuses_other_sizes() -> None:
    a, b = BloomFilter.sized(1000, 0.01), BloomFilter.sized(1000, 0.01)
    for k in keys(0, 100):
        a.add(k)
    for k in keys(100, 200):
        b.add(k)
    a.merge(b)
    assert all(a.might_contain(k) for k in keys(0, 200))
    with pytest.raises(ConfigurationError, match="dedup settings changed"):
        a.merge(BloomFilter.sized(10, 0.01))


def test_sizes_are_validated() -> None:
    with pytest.raises(ConfigurationError, match="capacity"):
        BloomFilter.sized(0, 0.01)
    with pytest.raises(ConfigurationError, match="fp_rate"):
        BloomFilter.sized(10, 1.0)


def test_aging_filter_remembers_for_at_least_ttl_and_forgets_after_two() -> None:
    f = AgingBloomFilter(capacity=100, fp_rate=0.001, ttl=10.0, now=0.0)
    k = encode_key("a")
    f.add(k, now=9.0)
    f.rotate(10.0)  # "a" moves to the previous generation
    assert f.might_contain(k)
    f.rotate(18.9)
    assert f.might_contain(k), "still within ttl of its add"
    f.rotate(20.0)
    assert not f.might_contain(k), "both generations rotated out"
    f.add(k, now=21.0)
    f.rotate(45.0)  # idle for more than 2 * ttl: everything is older than ttl
    assert not f.might_contain(k)


def test_restore_merges_every_subtasks_filter() -> None:
    a = AgingBloomFilter(capacity=100, fp_rate=0.01, ttl=10.0, now=0.0)
    b = AgingBloomFilter(capacity=100, fp_rate=0.01, ttl=10.0, now=5.0)
    a.add(encode_key("x"), now=1.0)
    b.add(encode_key("y"), now=6.0)
    merged = AgingBloomFilter(capacity=100, fp_rate=0.01, ttl=10.0, now=7.0)
    merged.restore(pickle.loads(pickle.dumps([a.snapshot(), b.snapshot()])))
    assert merged.might_contain(encode_key("x"))
    assert merged.might_contain(encode_key("y"))
    merged.rotate(14.9)  # "y" was added at 6: it must survive until 16
    assert merged.might_contain(encode_key("y"))
