"""The stored key format: golden bytes for every tag and layout, and round trips.

The golden bytes were captured from the encoder before the format moved into one module
(``keygroups.py`` encoded, ``keycodec.py`` decoded): RocksDB databases, checkpoints and
savepoints hold these bytes, and key groups are their hash, so they must never change.
"""

from __future__ import annotations

import datetime as dt
import enum
import math
import struct
import uuid
from collections import namedtuple
from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from epochstream.exceptions import KeyEncodingError, StateError
from epochstream.state.keyformat import KeyTag, canonical_nan, decode_key, encode_key

_PLUS_2 = dt.timezone(dt.timedelta(hours=2))
_MINUS_5 = dt.timezone(dt.timedelta(hours=-5))

# (name, key, stored bytes in hex). Every tag appears at least once.
GOLDEN: list[tuple[str, object, str]] = [
    ("none", None, "4e"),
    ("int_zero", 0, "492b00000000"),
    ("int_pos", 1, "492b0000000101"),
    ("int_big", 2**64, "492b00000009010000000000000000"),
    ("int_neg", -256, "492d000000020100"),
    ("bool", True, "492b0000000101"),
    ("float", 0.5, "463fe0000000000000"),
    ("float_neg", -1.5, "46bff8000000000000"),
    ("float_inf", float("inf"), "467ff0000000000000"),
    ("float_nan", float("nan"), "467ff8000000000000"),
    ("float_integral", -0.0, "492b00000000"),
    ("rational", Fraction(1, 3), "5100000007492b0000000101492b0000000103"),
    ("rational_neg", Fraction(-5, 3), "5100000007492d0000000105492b0000000103"),
    ("decimal", Decimal("0.1"), "5100000007492b0000000101492b000000010a"),
    ("complex", complex(1, -2), "433ff0000000000000c000000000000000"),
    ("str", "é", "53c3a9"),
    ("str_empty", "", "53"),
    ("str_surrogate", "\ud800", "53eda080"),
    ("bytes", b"\x00x", "420078"),
    ("tuple", ("a", 2), "4c0000000200000002536100000007492b0000000102"),
    ("list", ["a", 2.0], "4c0000000200000002536100000007492b0000000102"),
    ("tuple_empty", (), "4c00000000"),
    (
        "tuple_nested",
        ((1,), None),
        "4c00000002000000104c0000000100000007492b0000000101000000014e",
    ),
    ("frozenset", frozenset({1, "x"}), "520000000200000002537800000007492b0000000101"),
    ("frozenset_empty", frozenset(), "5200000000"),
    ("date", dt.date(2024, 2, 29), "6407e8021d"),
    ("naive_datetime", dt.datetime(2024, 2, 29, 13, 45, 7, 123456), "6e07e8021d0d2d070001e240"),
    (
        "aware_datetime",
        dt.datetime(2024, 2, 29, 13, 45, 7, 123456, tzinfo=_PLUS_2),
        "7a492b00000007061283ca77b900",
    ),
    (
        "aware_datetime_before_epoch",
        dt.datetime(1969, 12, 31, 23, 59, 59, tzinfo=dt.UTC),
        "7a492d000000030f4240",
    ),
    ("naive_time", dt.time(13, 45, 7, 123456), "740d2d070001e240"),
    ("aware_time", dt.time(13, 45, 7, 123456, tzinfo=_MINUS_5), "54492b000000050fb7bcf500"),
    ("timedelta", dt.timedelta(days=-1, microseconds=5), "44492d00000005141dd75ffb"),
    (
        "uuid",
        uuid.UUID("12345678-1234-5678-1234-567812345678"),
        "5512345678123456781234567812345678",
    ),
    ("enum", uuid.SafeUUID.safe, "450000000e53757569642e53616665555549445373616665"),
]


class Side(enum.Enum):
    """A plain Enum the decoder can import back (it lives at module level)."""

    LEFT = 1
    RIGHT = 2


def _representative(key: object) -> object:
    """What a key decodes to: lists and bytearrays as tuples and bytes, recursively."""
    if isinstance(key, list | tuple):
        return tuple(_representative(item) for item in key)
    if isinstance(key, bytearray):
        return bytes(key)
    return key


def _same_key(a: object, b: object) -> bool:
    """Equal as keys: ``==``, except that every NaN is the same key (also in a tuple)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, tuple | list) and isinstance(b, tuple | list) and len(a) == len(b):
        return type(a) is type(b) and all(_same_key(x, y) for x, y in zip(a, b, strict=True))
    return a == b


@pytest.mark.parametrize(
    ("key", "stored"), [(k, h) for _, k, h in GOLDEN], ids=[n for n, _, _ in GOLDEN]
)
def test_golden_bytes(key: object, stored: str) -> None:
    data = bytes.fromhex(stored)
    assert encode_key(key).hex() == stored
    decoded = decode_key(data)
    assert _same_key(decoded, _representative(key))
    assert encode_key(decoded) == data


def test_every_tag_has_a_golden_layout_and_a_one_byte_value() -> None:
    golden_tags = {bytes.fromhex(stored)[:1] for _, _, stored in GOLDEN}
    assert {tag.value for tag in KeyTag} == golden_tags
    assert all(len(tag.value) == 1 for tag in KeyTag)
    assert encode_key("a")[:1] == KeyTag.STR


def test_decode_returns_the_canonical_representative() -> None:
    assert decode_key(encode_key(["a", 2.0])) == ("a", 2)
    assert type(decode_key(encode_key(["a", 2.0]))) is tuple
    assert type(decode_key(encode_key(True))) is int
    assert decode_key(encode_key({1, 2})) == frozenset({1, 2})
    assert decode_key(encode_key(Side.LEFT)) is Side.LEFT
    assert decode_key(encode_key(float("nan"))) is canonical_nan(float("nan"))
    assert decode_key(memoryview(encode_key("x"))) == "x"


def test_enum_whose_class_cannot_be_imported_decodes_as_its_names() -> None:
    class Local(enum.Enum):
        ONLY = 1

    decoded = decode_key(encode_key(Local.ONLY))
    assert decoded == (f"{__name__}.{Local.__qualname__}", "ONLY")


def test_aware_times_and_datetimes_outside_one_utc_day_or_range_round_trip() -> None:
    # An aware time compares by (local time - offset) without wrapping at midnight,
    # and an aware datetime near either end of the calendar has no UTC datetime.
    east = dt.timezone(dt.timedelta(hours=14))
    west = dt.timezone(dt.timedelta(hours=-12))
    for key in (
        dt.time(0, 30, tzinfo=east),
        dt.time(23, 30, tzinfo=west),
        dt.datetime.min.replace(tzinfo=east),
        dt.datetime.max.replace(tzinfo=west),
    ):
        decoded = decode_key(encode_key(key))
        assert decoded == key
        assert encode_key(decoded) == encode_key(key)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"?",
        b"Nx",
        b"I+\x00\x00\x00\x02\x01",
        b"F\x00",
        b"L\x00\x00\x00\x01\x00\x00\x00\x09N",
        b"L\x00\x00\x00\x00N",
        b"S\xff",
        b"U\x00",
        b"E\x00\x00\x00\x01NSx",
    ],
)
def test_bytes_that_are_not_one_key_raise_state_error(data: bytes) -> None:
    with pytest.raises(StateError, match="cannot decode key bytes"):
        decode_key(data)


@pytest.mark.parametrize(
    "equal_keys",
    [
        [1, 1.0, True, Decimal(1), Decimal("1.000"), Fraction(3, 3), complex(1, 0)],
        [0, 0.0, -0.0, False, Decimal("-0")],
        [0.5, Decimal("0.5"), Fraction(1, 2)],
        [Decimal("0.1"), Fraction(1, 10)],
        [2**100, float(2**100), Decimal(2**100)],
        [-(2**70) - 1, Decimal(-(2**70) - 1)],
        [("a", 1), ("a", 1.0), ("a", True)],
        [b"xy", bytearray(b"xy"), memoryview(b"xy")],
        [frozenset({1, 2, "x"}), {2.0, "x", 1}],
        [
            dt.datetime(2024, 1, 1, 12, tzinfo=dt.UTC),
            dt.datetime(2024, 1, 1, 14, tzinfo=dt.timezone(dt.timedelta(hours=2))),
        ],
        [dt.datetime(2024, 1, 1, 1, 30), dt.datetime(2024, 1, 1, 1, 30, fold=1)],
        [dt.timedelta(days=1), dt.timedelta(hours=24)],
        [float("inf"), Decimal("Infinity")],
    ],
)
def test_equal_keys_encode_identically(equal_keys: list[object]) -> None:
    for a in equal_keys:
        for b in equal_keys:
            assert a == b, (a, b)  # the premise: Python considers them the same key
    encodings = {encode_key(k) for k in equal_keys}
    assert len(encodings) == 1


def test_subclasses_encode_like_their_base() -> None:
    class Color(enum.IntEnum):
        RED = 3

    class Mode(enum.StrEnum):
        FAST = "fast"

    Point = namedtuple("Point", "x y")
    assert encode_key(Color.RED) == encode_key(3)
    assert encode_key(Mode.FAST) == encode_key("fast")
    assert encode_key(Point(1, "y")) == encode_key((1, "y"))


def test_nan_is_canonical() -> None:
    nan_a = float("nan")
    nan_b = struct.unpack(">d", b"\x7f\xf8\x00\x00\x00\x00\x00\x01")[0]
    assert encode_key(nan_a) == encode_key(nan_b)
    assert encode_key(-nan_a) == encode_key(Decimal("NaN"))


def test_distinct_keys_encode_differently() -> None:
    keys: list[object] = [
        None,
        1,
        -1,
        "1",
        b"1",
        1.5,
        -1.5,
        Decimal("0.1"),
        0.1,
        complex(1, 2),
        ("1",),
        (1,),
        ((1,),),
        (),
        frozenset(),
        "",
        b"",
        dt.date(2024, 1, 1),
        dt.datetime(2024, 1, 1),
        dt.datetime(2024, 1, 1, tzinfo=dt.UTC),
        dt.time(1, 2),
        dt.timedelta(1),
        uuid.UUID(int=1),
        ("a", "bc"),
        ("ab", "c"),
    ]
    encodings = [encode_key(k) for k in keys]
    assert len(set(encodings)) == len(keys)


def test_plain_enum_members_encode_by_class_and_name() -> None:
    class Side(enum.Enum):
        LEFT = 1
        RIGHT = 2

    assert encode_key(Side.LEFT) != encode_key(Side.RIGHT)
    assert encode_key(Side.LEFT) != encode_key(1)
    assert encode_key(Side.LEFT) == encode_key(Side(1))


def test_unsupported_key_raises_with_type_and_repr() -> None:
    class Opaque:
        def __repr__(self) -> str:
            return "Opaque(" + "z" * 500 + ")"

    with pytest.raises(KeyEncodingError) as info:
        encode_key(Opaque())
    message = str(info.value)
    assert "Opaque" in message
    assert len(message) < 400  # the repr is truncated
    assert isinstance(info.value, StateError)

    with pytest.raises(KeyEncodingError, match=r"builtins\.object.*inside \('k', "):
        encode_key(("k", object()))


def test_every_float_nan_key_is_one_object_and_other_keys_pass_through() -> None:
    nan = canonical_nan(float("nan"))
    assert canonical_nan(-float("nan")) is nan and canonical_nan(nan) is nan
    for key in (1.5, -0.0, 3, "nan", (float("nan"),), None):
        assert canonical_nan(key) is key
    assert encode_key(nan) == encode_key(-float("nan"))


# --- round-trip properties ---------------------------------------------------------

_offsets = st.integers(-86_399, 86_399).map(lambda s: dt.timezone(dt.timedelta(seconds=s)))
_text = st.text(
    st.one_of(st.characters(), st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF))
)
_decimals = st.integers(0, 12).flatmap(
    lambda places: st.decimals(
        min_value=-(10**20), max_value=10**20, places=places, allow_nan=False
    )
)


class Mode(enum.IntEnum):
    SLOW = 1


# Hashable leaves without NaN: NaN equals nothing, so a set holding one cannot be
# compared with the set decoded from it (NaN keys have their own properties below).
_hashable_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(2**200), max_value=2**200),
    st.floats(allow_nan=False),
    st.fractions(max_denominator=10**12),
    _decimals,
    st.complex_numbers(allow_nan=False),
    _text,
    st.binary(),
    st.dates(),
    st.datetimes(),
    st.datetimes(timezones=_offsets),
    st.times(),
    st.times(timezones=_offsets),
    st.timedeltas(),
    st.uuids(),
    st.sampled_from([*Side, *Mode, uuid.SafeUUID.safe]),
)
_hashable = st.recursive(
    _hashable_leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4).map(tuple), st.frozensets(inner, max_size=4)
    ),
    max_leaves=12,
)
# Any key: lists, bytearrays and NaNs too, at the top or inside a sequence.
_keys = st.recursive(
    st.one_of(_hashable, st.just(float("nan")), st.binary().map(bytearray)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.lists(inner, max_size=4).map(tuple)),
    max_leaves=12,
)


@settings(max_examples=600, deadline=None)
@given(_keys)
def test_decode_inverts_encode(key: object) -> None:
    data = encode_key(key)
    decoded = decode_key(data)
    assert _same_key(decoded, _representative(key))
    assert encode_key(decoded) == data  # the representative is a fixed point


@settings(max_examples=400, deadline=None)
@given(_keys, _keys)
def test_equal_bytes_if_and_only_if_equal_representatives(a: object, b: object) -> None:
    same_bytes = encode_key(a) == encode_key(b)
    assert same_bytes == _same_key(decode_key(encode_key(a)), decode_key(encode_key(b)))


@settings(max_examples=200, deadline=None)
@given(st.lists(_hashable, max_size=6))
def test_a_sequence_is_its_items_length_prefixed(items: list[object]) -> None:
    # Items are self-delimiting inside a key, so a tuple key can never be confused with
    # another tuple whose items split the same bytes differently.
    expected = b"L" + struct.pack(">I", len(items))
    for item in items:
        encoded = encode_key(item)
        expected += struct.pack(">I", len(encoded)) + encoded
    assert encode_key(items) == encode_key(tuple(items)) == expected


@settings(max_examples=200, deadline=None)
@given(st.floats(allow_nan=True).filter(math.isnan), st.floats(allow_nan=True).filter(math.isnan))
def test_every_nan_is_one_key(a: float, b: float) -> None:
    assert encode_key(a) == encode_key(b) == encode_key(Decimal("NaN"))
    assert decode_key(encode_key(a)) is canonical_nan(b)
