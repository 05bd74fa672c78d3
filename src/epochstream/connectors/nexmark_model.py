"""The Nexmark event model, vectorized: which event sits at each position of the stream.

Pure functions of ``(config, positions)``: every value an event holds comes from a
counter-based hash of ``(seed, event number, draw)`` (splitmix64), so event ``n`` is the
same whichever split, reader or process generates it, and a range is generated with a
few dozen numpy operations instead of a Python loop per event.

The semantics follow the reference generator (Beam's / Flink's nexmark ``NexmarkGenerator``):

- position ``p`` holds event number ``n``: positions are cut into groups of
  ``out_of_order_group_size`` and ``n = base + (p - base) * m % size`` within a group,
  ``m`` a prime coprime with the group's size (953, as the reference, unless the size is
  a multiple of it); so the stream is out of order by less than one group;
- ``n % 50``: 0 person, 1-3 auction, 4-49 bid; ids, hot sellers / bidders / auctions,
  active people, in-flight auctions, prices and auction lengths as in the reference;
- ``date_time = base_time_ms + n * delay_us // 1000``, ``delay_us = round(1e6 / events_per_second)``:
  event time follows the event number (not the position, unlike the reference, whose
  timestamps are in order and only its ids are shuffled), which makes ``date_time``
  really out of order by up to ``(group size - 1) * delay``.

Strings are slices of a seeded pool of lowercase letters and spaces (lengths as the
reference draws them, not trimmed); names, cities, states and channels come from the
reference's tables. Each kind is generated as an Arrow ``RecordBatch`` (strings are
built straight from offsets into the pool), which the row form and the Parquet files
both read.

Example::

    batches, positions = generate_columns(NexmarkConfig(events=1_000), 0, 1_000)
    batches["bid"].num_rows        # 920
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

if TYPE_CHECKING:
    from epochstream.connectors.nexmark import NexmarkConfig

__all__ = [
    "AUCTION_FIELDS",
    "BID_FIELDS",
    "FIRST_AUCTION_ID",
    "FIRST_CATEGORY_ID",
    "FIRST_PERSON_ID",
    "KINDS",
    "NUM_CATEGORIES",
    "PERSON_FIELDS",
    "event_numbers",
    "generate_columns",
]

PERSON_FIELDS = (
    "id",
    "name",
    "email_address",
    "credit_card",
    "city",
    "state",
    "date_time",
    "extra",
)
AUCTION_FIELDS = (
    "id",
    "item_name",
    "description",
    "initial_bid",
    "reserve",
    "date_time",
    "expires",
    "seller",
    "category",
    "extra",
)
BID_FIELDS = ("auction", "bidder", "price", "channel", "url", "date_time", "extra")
#: Kinds in ``event_type`` order (0 person, 1 auction, 2 bid).
KINDS = ("person", "auction", "bid")

FIRST_PERSON_ID = 1000
FIRST_AUCTION_ID = 1000
FIRST_CATEGORY_ID = 10
NUM_CATEGORIES = 5
_PERSON_PROPORTION, _AUCTION_PROPORTION, _TOTAL_PROPORTION = 1, 3, 50
_PERSON_ID_LEAD = 10
_AUCTION_ID_LEAD = 10
_AVG_BYTES = {"person": 200, "auction": 500, "bid": 100}
_HOT_CHANNELS_RATIO = 2
# The reference generators' hot auction, seller and bidder: the first of the last
# block of this many ids. The config's hot ratios are only the odds of picking it
# (1 - 1/ratio); rounding to the ratio itself (2 or 4) made a hot key 25-50 times
# less hot than Nexmark's (a hot auction got ~50 bids of 500 k events, not ~770).
_HOT_BLOCK = 100
_CHANNELS = 10_000
_HOT_CHANNELS = ("Google", "Facebook", "Baidu", "Apple")
_US_STATES = ("AZ", "CA", "ID", "OR", "WA", "WY")
_US_CITIES = (
    "Phoenix",
    "Los Angeles",
    "San Francisco",
    "Boise",
    "Portland",
    "Bend",
    "Redmond",
    "Seattle",
    "Kent",
    "Cheyenne",
)
_FIRST_NAMES = (
    "Peter",
    "Paul",
    "Luke",
    "John",
    "Saul",
    "Vicky",
    "Kate",
    "Julie",
    "Sarah",
    "Deiter",
    "Walter",
)
_LAST_NAMES = (
    "Shultz",
    "Abrams",
    "Spencer",
    "White",
    "Bartels",
    "Walton",
    "Smith",
    "Jones",
    "Noris",
)
_POOL_BYTES = 1 << 16
_MAX_SLICE = 512  # no string drawn from the pool is longer
_SHUFFLE_PRIMES = (953, 967, 971, 977, 983, 991, 997)

_M64 = (1 << 64) - 1
_C1 = np.uint64(0xBF58476D1CE4E5B9)
_C2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _splitmix(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finalizer on a uint64 array (wraps, as intended)."""
    x = x ^ (x >> np.uint64(30))
    x = x * _C1
    x = x ^ (x >> np.uint64(27))
    x = x * _C2
    return x ^ (x >> np.uint64(31))


class _Draws:
    """Independent uniform draws per event: draw ``k`` of event ``n`` hashes ``(seed, k, n)``."""

    def __init__(self, seed: int, numbers: np.ndarray) -> None:
        self._seed = seed
        self._n = numbers.astype(np.uint64) * _GOLDEN

    def uniform(self, k: int) -> np.ndarray:
        """Floats in [0, 1)."""
        salt = np.uint64((self._seed * 0x100000001B3 + (k + 1) * 0x9E3779B97F4A7C15) & _M64)
        bits = _splitmix(self._n ^ salt)
        return (bits >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))

    def below(self, k: int, bound: np.ndarray | int) -> np.ndarray:
        """Ints in [0, bound) (``bound`` >= 1, per event or one for all)."""
        return (self.uniform(k) * bound).astype(np.int64)

    def bits(self, k: int) -> np.ndarray:
        """Raw 64-bit draws."""
        salt = np.uint64((self._seed * 0x100000001B3 + (k + 1) * 0x9E3779B97F4A7C15) & _M64)
        return _splitmix(self._n ^ salt)


@functools.lru_cache(maxsize=8)
def _pool(seed: int) -> np.ndarray:
    """The seeded text every string is a slice of: lowercase letters, 1 in 13 a space."""
    draws = _Draws(seed ^ 0x5EED, np.arange(_POOL_BYTES, dtype=np.int64))
    letters = (draws.below(0, 26) + ord("a")).astype(np.uint8)
    return np.where(draws.below(1, 13) == 0, np.uint8(ord(" ")), letters)


@functools.lru_cache(maxsize=1)
def _tables() -> dict[str, pa.Array]:
    """Fixed vocabularies, as Arrow arrays to ``take`` from."""
    cold = range(_CHANNELS)
    channels = [*_HOT_CHANNELS, *(f"channel-{i}" for i in cold)]
    urls = [
        *(f"https://www.nexmark.com/{c.lower()}/item.htm?query=1" for c in _HOT_CHANNELS),
        *(f"https://www.nexmark.com/item.htm?query=1&channel_id={i}" for i in cold),
    ]
    return {
        "name": pa.array([f"{f} {last}" for f in _FIRST_NAMES for last in _LAST_NAMES]),
        "city": pa.array(_US_CITIES),
        "state": pa.array(_US_STATES),
        "channel": pa.array(channels),
        "url": pa.array(urls),
    }


def _shuffle_multiplier(size: int) -> int:
    """A prime coprime with ``size`` (so ``i -> i * m % size`` permutes a group)."""
    for p in _SHUFFLE_PRIMES:
        if size % p:
            return p
    return 1


def event_numbers(config: NexmarkConfig, start: int, stop: int) -> np.ndarray:
    """The event numbers at positions ``start..stop-1`` (a permutation within each group).

    Example: ``event_numbers(NexmarkConfig(events=10, out_of_order_group_size=1), 0, 3)`` is ``[0, 1, 2]``
    """
    positions = np.arange(start, stop, dtype=np.int64)
    group = config.out_of_order_group_size
    if group == 1:
        return positions
    base = positions // group * group
    offset = positions - base
    out = np.empty_like(positions)
    last_base = (config.events - 1) // group * group
    full = base < last_base if config.events % group else np.ones(len(positions), dtype=bool)
    out[full] = base[full] + offset[full] * _shuffle_multiplier(group) % group
    tail = ~full
    if tail.any():
        size = config.events - last_base
        out[tail] = base[tail] + offset[tail] * _shuffle_multiplier(size) % size
    return out


def _last_person(n: np.ndarray) -> np.ndarray:
    return n // _TOTAL_PROPORTION * _PERSON_PROPORTION


def _last_auction(n: np.ndarray) -> np.ndarray:
    epoch, offset = np.divmod(n, _TOTAL_PROPORTION)
    return np.where(
        offset < _PERSON_PROPORTION,
        (epoch - 1) * _AUCTION_PROPORTION + _AUCTION_PROPORTION - 1,
        epoch * _AUCTION_PROPORTION
        + np.minimum(offset - _PERSON_PROPORTION, _AUCTION_PROPORTION - 1),
    )


def _next_person(config: NexmarkConfig, n: np.ndarray, u: np.ndarray) -> np.ndarray:
    """A recent person (or one up to ``_PERSON_ID_LEAD`` ahead), base 0."""
    people = _last_person(n) + 1
    active = np.minimum(people, config.num_active_people)
    return people - active + (u * (active + _PERSON_ID_LEAD)).astype(np.int64)


def _next_auction(config: NexmarkConfig, n: np.ndarray, u: np.ndarray) -> np.ndarray:
    """An auction in flight (or one up to ``_AUCTION_ID_LEAD`` ahead), base 0."""
    newest = _last_auction(n)
    oldest = np.maximum(newest - config.num_in_flight_auctions, 0)
    return oldest + (u * (newest - oldest + 1 + _AUCTION_ID_LEAD)).astype(np.int64)


def _price(u: np.ndarray) -> np.ndarray:
    """Log-uniform cents from 100 to 10^8 (Java's ``Math.round``)."""
    return np.floor(np.power(10.0, u * 6.0) * 100.0 + 0.5).astype(np.int64)


def _timestamps(config: NexmarkConfig, n: np.ndarray) -> np.ndarray:
    return config.base_time_ms + n * config.inter_event_delay_us // 1000


def _pool_strings(seed: int, offsets: np.ndarray, lengths: np.ndarray) -> pa.Array:
    """A string array whose row ``i`` is ``pool[offsets[i]:offsets[i] + lengths[i]]``."""
    ends = np.cumsum(lengths, dtype=np.int64)
    total = int(ends[-1]) if len(ends) else 0
    starts = ends - lengths
    index = np.repeat(offsets - starts, lengths) + np.arange(total, dtype=np.int64)
    data = _pool(seed)[index]
    arrow_offsets = np.concatenate(([0], ends)).astype(np.int32)
    return pa.StringArray.from_buffers(
        len(lengths), pa.py_buffer(arrow_offsets), pa.py_buffer(data)
    )


def _random_strings(config: NexmarkConfig, draws: _Draws, k: int, lengths: np.ndarray) -> pa.Array:
    """Strings of the given lengths at random places of the pool (draw ``k``)."""
    offsets = draws.below(k, _POOL_BYTES - _MAX_SLICE)
    return _pool_strings(config.seed, offsets, lengths)


def _short_string(draws: _Draws, k: int, max_length: int) -> np.ndarray:
    """The reference's ``nextString`` length: 3 + a draw below ``max_length - 3``."""
    return 3 + draws.below(k, max_length - 3)


def _extra_lengths(draws: _Draws, k: int, kind: str, current: np.ndarray) -> np.ndarray:
    """Padding so the event averages the reference's byte size (``nextExtra``)."""
    desired = _AVG_BYTES[kind] - current
    delta = np.floor(desired * 0.2 + 0.5).astype(np.int64)
    extra = desired - delta + (draws.uniform(k) * (2 * delta)).astype(np.int64)
    return np.clip(np.where(current > _AVG_BYTES[kind], 0, extra), 0, _MAX_SLICE)


def _fixed_width(chars: np.ndarray) -> pa.Array:
    """One string per row of a uint8 matrix."""
    rows, width = chars.shape
    offsets = np.arange(0, (rows + 1) * width, width, dtype=np.int32)
    return pa.StringArray.from_buffers(
        rows, pa.py_buffer(offsets), pa.py_buffer(np.ascontiguousarray(chars))
    )


def _digits(bits: np.ndarray, count: int, alphabet: bytes) -> np.ndarray:
    """``count`` symbols of ``alphabet`` per row from one 64-bit draw per row."""
    base = np.uint64(len(alphabet))
    table = np.frombuffer(alphabet, dtype=np.uint8)
    out = np.empty((len(bits), count), dtype=np.uint8)
    rest = bits.copy()
    for i in range(count):
        out[:, i] = table[(rest % base).astype(np.int64)]
        rest //= base
    return out


def _persons(config: NexmarkConfig, n: np.ndarray) -> pa.RecordBatch:
    d = _Draws(config.seed, n)
    tables = _tables()
    letters = _digits(d.bits(2), 12, b"abcdefghijklmnopqrstuvwxyz")
    at = np.full((len(n), 1), ord("@"), dtype=np.uint8)
    dotcom = np.tile(np.frombuffer(b".com", dtype=np.uint8), (len(n), 1))
    email = np.hstack([letters[:, :7], at, letters[:, 7:], dotcom])
    digits = _digits(d.bits(3), 16, b"0123456789")
    space = np.full((len(n), 1), ord(" "), dtype=np.uint8)
    card = np.hstack(
        [digits[:, 0:4], space, digits[:, 4:8], space, digits[:, 8:12], space, digits[:, 12:16]]
    )
    name_index = d.below(0, len(tables["name"]))
    name = tables["name"].take(pa.array(name_index))
    name_lengths = np.diff(np.frombuffer(tables["name"].buffers()[1], dtype=np.int32))
    # Sizes as the reference counts them: 8 bytes per number plus the strings.
    current = 8 + 8 + name_lengths[name_index] + 17 + 19 + 16
    columns = {
        "id": _last_person(n) + FIRST_PERSON_ID,
        "name": name,
        "email_address": _fixed_width(email),
        "credit_card": _fixed_width(card),
        "city": tables["city"].take(pa.array(d.below(4, len(_US_CITIES)))),
        "state": tables["state"].take(pa.array(d.below(5, len(_US_STATES)))),
        "date_time": _timestamps(config, n),
        "extra": _random_strings(config, d, 7, _extra_lengths(d, 6, "person", current)),
    }
    return pa.RecordBatch.from_pydict(columns)


def _auctions(config: NexmarkConfig, n: np.ndarray) -> pa.RecordBatch:
    d = _Draws(config.seed, n)
    hot_seller = d.below(0, config.hot_seller_ratio) > 0
    seller = np.where(
        hot_seller,
        _last_person(n) // _HOT_BLOCK * _HOT_BLOCK,
        _next_person(config, n, d.uniform(1)),
    )
    initial_bid = _price(d.uniform(3))
    timestamp = _timestamps(config, n)
    # Auctions last up to twice the event time of ``num_in_flight_auctions`` auctions.
    ahead = config.num_in_flight_auctions * _TOTAL_PROPORTION // _AUCTION_PROPORTION
    horizon = _timestamps(config, n + ahead) - timestamp
    expires = timestamp + 1 + (d.uniform(4) * np.maximum(horizon * 2, 1)).astype(np.int64)
    name_len = _short_string(d, 5, 20)
    desc_len = _short_string(d, 7, 100)
    current = 8 + name_len + desc_len + 8 + 8 + 8 + 8 + 8
    columns = {
        "id": _last_auction(n) + FIRST_AUCTION_ID,
        "item_name": _random_strings(config, d, 6, name_len),
        "description": _random_strings(config, d, 8, desc_len),
        "initial_bid": initial_bid,
        "reserve": initial_bid + _price(d.uniform(9)),
        "date_time": timestamp,
        "expires": expires,
        "seller": seller + FIRST_PERSON_ID,
        "category": FIRST_CATEGORY_ID + d.below(2, NUM_CATEGORIES),
        "extra": _random_strings(config, d, 11, _extra_lengths(d, 10, "auction", current)),
    }
    return pa.RecordBatch.from_pydict(columns)


def _bids(config: NexmarkConfig, n: np.ndarray) -> pa.RecordBatch:
    d = _Draws(config.seed, n)
    tables = _tables()
    hot_auction = d.below(0, config.hot_auction_ratio) > 0
    auction = np.where(
        hot_auction,
        _last_auction(n) // _HOT_BLOCK * _HOT_BLOCK,
        _next_auction(config, n, d.uniform(1)),
    )
    hot_bidder = d.below(2, config.hot_bidder_ratio) > 0
    bidder = np.where(
        hot_bidder,
        # The second of the block: hot bidders and hot sellers do not collide.
        _last_person(n) // _HOT_BLOCK * _HOT_BLOCK + 1,
        _next_person(config, n, d.uniform(3)),
    )
    hot_channel = d.below(5, _HOT_CHANNELS_RATIO) > 0
    channel = np.where(
        hot_channel, d.below(6, len(_HOT_CHANNELS)), len(_HOT_CHANNELS) + d.below(7, _CHANNELS)
    )
    channel_index = pa.array(channel)
    columns = {
        "auction": auction + FIRST_AUCTION_ID,
        "bidder": bidder + FIRST_PERSON_ID,
        "price": _price(d.uniform(4)),
        "channel": tables["channel"].take(channel_index),
        "url": tables["url"].take(channel_index),
        "date_time": _timestamps(config, n),
        "extra": _random_strings(
            config, d, 9, _extra_lengths(d, 8, "bid", np.full(len(n), 8 * 4, dtype=np.int64))
        ),
    }
    return pa.RecordBatch.from_pydict(columns)


def generate_columns(
    config: NexmarkConfig, start: int, stop: int, kinds: tuple[str, ...] = KINDS
) -> tuple[dict[str, pa.RecordBatch], dict[str, np.ndarray]]:
    """The events of ``kinds`` at positions ``start..stop-1``, one Arrow batch per kind
    (rows in stream order), with the positions of each kind's rows (so callers can
    interleave them). Kinds not asked for are not generated.

    Example: ``batches, where = generate_columns(config, 0, 50)``; ``where["person"]`` is ``[p]``
    for the one position ``p`` holding a person.
    """
    numbers = event_numbers(config, start, stop)
    slot = numbers % _TOTAL_PROPORTION
    positions = np.arange(start, stop, dtype=np.int64)
    masks = {
        "person": slot < _PERSON_PROPORTION,
        "auction": (slot >= _PERSON_PROPORTION) & (slot < _PERSON_PROPORTION + _AUCTION_PROPORTION),
        "bid": slot >= _PERSON_PROPORTION + _AUCTION_PROPORTION,
    }
    makers = {"person": _persons, "auction": _auctions, "bid": _bids}
    batches = {kind: makers[kind](config, numbers[masks[kind]]) for kind in kinds}
    return batches, {kind: positions[masks[kind]] for kind in kinds}
