from __future__ import annotations

import json
import os
import struct
import subprocess
import sys

import pytest

from epochstream.exceptions import ConfigurationError, KeyEncodingError
from epochstream.state.keygroups import (
    KeyGroupAssigner,
    default_max_parallelism,
    key_group_for_key,
    key_group_range_for_operator,
    murmur3_32,
    operator_index_for_key_group,
    validate_max_parallelism,
    validate_parallelism,
)


def reference_murmur3_32(data: bytes, seed: int = 0) -> int:
    """MurmurHash3_x86_32 written out from the algorithm, independent of mmh3."""
    c1, c2, mask = 0xCC9E2D51, 0x1B873593, 0xFFFFFFFF

    def rotl(x: int, r: int) -> int:
        return ((x << r) | (x >> (32 - r))) & mask

    h = seed & mask
    full = len(data) // 4 * 4
    for i in range(0, full, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = rotl((k * c1) & mask, 15)
        h ^= (k * c2) & mask
        h = (rotl(h, 13) * 5 + 0xE6546B64) & mask
    tail = data[full:]
    if tail:
        k = int.from_bytes(tail, "little")
        k = rotl((k * c1) & mask, 15)
        h ^= (k * c2) & mask
    h ^= len(data)
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & mask
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & mask
    h ^= h >> 16
    return h


def reference_range(max_p: int, p: int, i: int) -> range:
    start = -(-i * max_p // p)  # ceil
    end = ((i + 1) * max_p - 1) // p
    return range(start, end + 1)


@pytest.mark.parametrize(
    ("data", "seed"),
    [
        (b"", 0),
        (b"", 1),
        (b"a", 0),
        (b"ab", 0),
        (b"abc", 0),
        (b"abcd", 0),
        (b"abcde", 0x9747B28C),
        (b"hello", 0),
        (b"The quick brown fox jumps over the lazy dog", 0),
        (bytes(range(256)), 42),
    ],
)
def test_murmur3_matches_reference(data: bytes, seed: int) -> None:
    assert murmur3_32(data, seed) == reference_murmur3_32(data, seed)


def test_murmur3_known_vectors() -> None:
    assert murmur3_32(b"") == 0
    assert murmur3_32(b"", 1) == 0x514E28B7
    assert murmur3_32(b"The quick brown fox jumps over the lazy dog") == 0x2E4FF723
    assert murmur3_32(b"\xff\xff\xff\xff") == 0x76293B50  # unsigned, not negative


def test_key_group_golden_values_from_formula() -> None:
    for key, encoded in [
        ("user-7", b"Suser-7"),
        (12345, b"I+" + struct.pack(">I", 2) + (12345).to_bytes(2, "big")),
        (None, b"N"),
    ]:
        for max_p in (1, 7, 128, 32768):
            assert key_group_for_key(key, max_p) == reference_murmur3_32(encoded) % max_p


def test_ranges_partition_all_key_groups() -> None:
    pairs = [(1, 1), (7, 3), (128, 1), (128, 2), (128, 3), (128, 128), (100, 7), (32768, 5)]
    pairs += [(m, p) for m in (1, 2, 3, 16, 129, 1000) for p in range(1, min(m, 40) + 1)]
    for max_p, p in pairs:
        covered: list[int] = []
        for i in range(p):
            got = key_group_range_for_operator(max_p, p, i)
            assert got == reference_range(max_p, p, i)
            assert len(got) >= 1  # p <= maxP: every subtask owns at least one group
            covered.extend(got)
        assert covered == list(range(max_p)), (max_p, p)


def test_operator_index_agrees_with_ranges() -> None:
    for max_p, p in [(128, 3), (128, 128), (1000, 7), (129, 64), (32768, 11), (5, 5)]:
        owner = {kg: i for i in range(p) for kg in key_group_range_for_operator(max_p, p, i)}
        for kg in range(max_p):
            assert operator_index_for_key_group(max_p, p, kg) == owner[kg]


def test_default_max_parallelism() -> None:
    assert default_max_parallelism(1) == 128
    assert default_max_parallelism(85) == 128  # 85 + 42 = 127 -> 128
    assert default_max_parallelism(86) == 256  # 86 + 43 = 129 -> 256
    assert default_max_parallelism(1000) == 2048
    assert default_max_parallelism(30000) == 32768
    with pytest.raises(ConfigurationError):
        default_max_parallelism(0)


def test_validation() -> None:
    assert validate_max_parallelism(32768) == 32768
    assert validate_parallelism(128, 128) == 128
    for bad in (0, 32769, -1, True, 1.0):
        with pytest.raises(ConfigurationError):
            validate_max_parallelism(bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="parallelism"):
        validate_parallelism(129, 128)
    with pytest.raises(ConfigurationError):
        validate_parallelism(0, 128)
    with pytest.raises(ConfigurationError, match="operator index 3"):
        key_group_range_for_operator(128, 3, 3)
    with pytest.raises(ConfigurationError):
        KeyGroupAssigner(0)


def test_assigner_matches_functions_and_caches() -> None:
    assigner = KeyGroupAssigner(128)
    keys: list[object] = [f"k{i}" for i in range(300)] + list(range(300)) + [("t", 1)]
    for key in keys:
        kg = assigner.key_group(key)
        assert kg == key_group_for_key(key, 128)
        for p in (1, 3, 4):
            assert assigner.channel(key, p) == operator_index_for_key_group(128, p, kg)
    assert assigner.cache_size() == len(keys)
    assert assigner.key_group(1.0) == assigner.key_group(True) == assigner.key_group(1)
    assert assigner.channels_for_batch(keys, 3) == [assigner.channel(k, 3) for k in keys]


def test_assigner_cache_is_bounded() -> None:
    assigner = KeyGroupAssigner(64, cache_limit=10)
    for i in range(35):
        assert assigner.key_group(i) == key_group_for_key(i, 64)
        assert assigner.cache_size() <= 10
    assert assigner.cache_size() == 5  # cleared at 10, 20 and 30 entries


def test_shared_assigner_is_one_per_max_parallelism_and_threads_share_it() -> None:
    import threading

    shared = KeyGroupAssigner.shared(96)
    assert KeyGroupAssigner.shared(96) is shared
    assert KeyGroupAssigner.shared(97) is not shared
    keys = [f"shared-{i}" for i in range(2_000)]

    def route(part: list[str]) -> None:
        for key in part:
            assert shared.key_group(key) == key_group_for_key(key, 96)

    threads = [threading.Thread(target=route, args=(keys[i::4],)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    before = shared.cache_size()
    assert before >= len(keys)
    # A backend of the same process finds the keys a writer routed already hashed.
    assert shared.key_groups(keys) == [key_group_for_key(k, 96) for k in keys]
    assert shared.cache_size() == before


def test_key_group_set_is_the_distinct_key_groups_cached_or_not() -> None:
    assigner = KeyGroupAssigner(128)
    keys: list[object] = [f"k{i}" for i in range(500)] + [f"k{i}" for i in range(100)]
    expected = {key_group_for_key(k, 128) for k in keys}
    assigner.key_groups(keys[:200])  # some cached, the rest not
    assert assigner.key_group_set(keys) == expected
    assert assigner.key_group_set(keys) == expected  # all cached now
    assert assigner.key_group_set([]) == set()
    assert assigner.key_group_set(["a", ["a", 1]]) == {
        key_group_for_key("a", 128),
        key_group_for_key(("a", 1), 128),
    }


def test_assigner_handles_unhashable_keys() -> None:
    assigner = KeyGroupAssigner(128)
    assert assigner.key_group(["a", 1]) == assigner.key_group(("a", 1))
    batch: list[object] = ["x", ["a", 1], "y"]
    expected = [assigner.channel(k, 4) for k in batch]
    assert assigner.channels_for_batch(batch, 4) == expected
    with pytest.raises(KeyEncodingError):
        assigner.channels_for_batch(["x", object()], 4)


def test_key_groups_are_identical_across_processes_with_different_hash_seeds(
    tmp_path: os.PathLike[str],
) -> None:
    code = (
        "import json\n"
        "from epochstream.state.keygroups import key_group_for_key\n"
        "keys = ['', 'a', 'user-1', 'ünï', 0, 1, -7, 2**80, ('a', 1), ('x', ('y', 2.5)),"
        " frozenset({'a', 'b', 'c', 'd', 'e'}), None, b'raw']\n"
        "print(json.dumps([key_group_for_key(k, 32768) for k in keys]))\n"
    )
    outputs = []
    for seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        done = subprocess.run(
            [sys.executable, "-c", code],
            env=env,
            cwd=tmp_path,  # import the installed package, not a path-relative copy
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        outputs.append(json.loads(done.stdout))
    keys: list[object] = [
        "",
        "a",
        "user-1",
        "ünï",
        0,
        1,
        -7,
        2**80,
        ("a", 1),
        ("x", ("y", 2.5)),
        frozenset({"a", "b", "c", "d", "e"}),
        None,
        b"raw",
    ]
    assert outputs[0] == outputs[1] == [key_group_for_key(k, 32768) for k in keys]
    assert len(set(outputs[0])) > 5  # the keys really spread over key groups
