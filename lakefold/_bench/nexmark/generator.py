"""Nexmark's events, generated as the Beam/Flink Nexmark generator does, seeded: the same
``--events``, ``--seed``, ``--rate`` and ``--disorder`` give the same events, byte for byte.

The model (``nexmark-flink``'s ``NexmarkGenerator``, ``GeneratorConfig`` and the
``Person``/``Auction``/``Bid`` generators; Beam's ``sdks/java/testing/nexmark`` has the same):

- Event number ``i`` (0-based, in log order) has the id ``adjusted(i)``: within each group of
  ``disorder`` events the ids (and so the event times and kinds) are permuted by
  ``(i * 953) % disorder``, Nexmark's ``outOfOrderGroupSize``; 1 keeps them in order.
- Its event time is ``BASE_TIME + adjusted(i) * 1e6 / rate`` µs, truncated to the millisecond:
  the nominal rate sets how fast event time moves (10,000 events/s: 100k events span 10 s).
  So an event is at most ``(disorder - 1) / rate`` seconds behind an earlier one: the bound
  the engines' watermarks allow for (``DISORDER_BOUND_MS``).
- Of every 50 ids, 1 is a person, 3 are auctions, 46 are bids (id % 50: 0, 1-3, 4-49).
- Persons and auctions get increasing ids from 1000. An auction's seller is, 3 times in 4, a
  "hot" seller (the last person id rounded down to a multiple of 100), else one of the last
  1,000 persons (or up to 10 beyond). A bid's auction is, 1 time in 2, a hot auction (the
  last auction id rounded down to a multiple of 100), else one of the last 100 auctions (or up
  to 10 ahead); its bidder 3 times in 4 a hot bidder (the last person id rounded down to a
  multiple of 100, plus 1), else an active person. (nexmark-flink adds 1000 to a bidder twice,
  so its bidders never match a person; Beam adds it once, as here.)
- Prices are ``round(10 ** (6u) * 100)`` for u uniform in [0, 1); an auction's reserve is its
  initial bid plus a price; it expires a random time up to twice the time 100 auctions take
  to be created later; category 10 to 14; half of the bids come from 4 hot channels (Google,
  Facebook, Baidu, Apple), the rest from ``channel-0`` … ``channel-9999`` with their URLs.
- Strings (names, e-mail addresses, item names, descriptions) are random letters with spaces;
  ``extra`` pads each event to Nexmark's average sizes (person 200, auction 500, bid 100
  bytes) from one reusable string, as Nexmark does.

Java's ``SplittableRandom`` is replaced by numpy's PCG64: the distributions are Nexmark's, the
draws are not the Java generator's.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lakefold._bench.report import BenchmarkError

PERSON, AUCTION, BID = 0, 1, 2
PERSON_PROPORTION, AUCTION_PROPORTION, BID_PROPORTION = 1, 3, 46
TOTAL_PROPORTION = PERSON_PROPORTION + AUCTION_PROPORTION + BID_PROPORTION
FIRST_PERSON_ID = 1000
FIRST_AUCTION_ID = 1000
FIRST_CATEGORY_ID = 10
NUM_CATEGORIES = 5
HOT_AUCTION_RATIO, HOT_SELLERS_RATIO, HOT_BIDDERS_RATIO = 2, 4, 4
IN_FLIGHT_AUCTIONS = 100
ACTIVE_PEOPLE = 1000
ID_LEAD = 10
#: Event time of event id 0 (fixed, so the events do not depend on the clock).
BASE_TIME = datetime(2026, 11, 28, tzinfo=UTC)
BASE_TIME_MS = int(BASE_TIME.timestamp() * 1000)
US_STATES = ("AZ", "CA", "ID", "OR", "WA", "WY")
US_CITIES = ("Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland", "Bend", "Redmond",
             "Seattle", "Kent", "Cheyenne")
FIRST_NAMES = ("Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah",
               "Deiter", "Walter")
LAST_NAMES = ("Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones",
              "Noris")
HOT_CHANNELS = ("Google", "Facebook", "Baidu", "Apple")
CHANNELS = 10_000

#: The flat table every engine reads: one row per event in log order, the kind in
#: ``event_type`` and each kind's fields prefixed ``p_``, ``a_``, ``b_`` (null for the others).
SCHEMA = pa.schema([
    ("position", pa.int64()), ("event_type", pa.int8()),
    ("dateTime", pa.timestamp("ms", tz="UTC")),
    ("p_id", pa.int64()), ("p_name", pa.string()), ("p_emailAddress", pa.string()),
    ("p_creditCard", pa.string()), ("p_city", pa.string()), ("p_state", pa.string()),
    ("p_extra", pa.string()),
    ("a_id", pa.int64()), ("a_itemName", pa.string()), ("a_description", pa.string()),
    ("a_initialBid", pa.int64()), ("a_reserve", pa.int64()),
    ("a_expires", pa.timestamp("ms", tz="UTC")), ("a_seller", pa.int64()),
    ("a_category", pa.int64()), ("a_extra", pa.string()),
    ("b_auction", pa.int64()), ("b_bidder", pa.int64()), ("b_price", pa.int64()),
    ("b_channel", pa.string()), ("b_url", pa.string()), ("b_extra", pa.string()),
])


@dataclass(frozen=True)
class Config:
    """What the events depend on: their number, the seed, the nominal rate (events per second
    of event time) and the out-of-order group size."""

    events: int
    seed: int = 42
    rate: int = 10_000
    disorder: int = 10_000

    @property
    def disorder_bound_ms(self) -> int:
        """The most an event's time can be behind an earlier event's (ms, rounded up)."""
        return -(-(self.disorder - 1) * 1000 // self.rate) + 1

    def time_ms(self, ids: np.ndarray) -> np.ndarray:
        """Event time (ms since the epoch) of event ids, as ``timestampForEvent``."""
        return BASE_TIME_MS + (ids * (1_000_000 / self.rate)).astype(np.int64) // 1000


def adjusted_ids(config: Config) -> np.ndarray:
    """The id of each event number (``nextAdjustedEventNumber``)."""
    i = np.arange(config.events, dtype=np.int64)
    n = config.disorder
    return (i // n) * n + (i * 953) % n


def last_person(ids: np.ndarray) -> np.ndarray:
    """``lastBase0PersonId``: the newest person id (0-based) at event id ``ids``."""
    return ids // TOTAL_PROPORTION  # one person per 50 ids, at offset 0


def last_auction(ids: np.ndarray) -> np.ndarray:
    """``lastBase0AuctionId``: the newest auction id (0-based) at event id ``ids``."""
    epoch, offset = ids // TOTAL_PROPORTION, ids % TOTAL_PROPORTION
    before = offset < PERSON_PROPORTION
    epoch = np.where(before, epoch - 1, epoch)
    offset = np.where(before | (offset >= PERSON_PROPORTION + AUCTION_PROPORTION),
                      AUCTION_PROPORTION - 1, offset - PERSON_PROPORTION)
    out: np.ndarray = epoch * AUCTION_PROPORTION + offset
    return out


def _next_person(rng: np.random.Generator, ids: np.ndarray) -> np.ndarray:
    people = last_person(ids) + 1
    active = np.minimum(people, ACTIVE_PEOPLE)
    out: np.ndarray = people - active + (rng.random(len(ids)) * (active + ID_LEAD)).astype(
        np.int64)
    return out


def _next_auction(rng: np.random.Generator, ids: np.ndarray) -> np.ndarray:
    newest = last_auction(ids)
    oldest = np.maximum(newest - IN_FLIGHT_AUCTIONS, 0)
    out: np.ndarray = oldest + (rng.random(len(ids)) * (newest - oldest + 1 + ID_LEAD)).astype(
        np.int64)
    return out


def _prices(rng: np.random.Generator, n: int) -> np.ndarray:
    return np.round(10.0 ** (rng.random(n) * 6.0) * 100.0).astype(np.int64)


class _Strings:
    """Random strings cut from two pools drawn once: letters with one space in 13 (names,
    e-mails, descriptions) and letters only (``extra``, Nexmark's reusable string)."""

    POOL = 1 << 20

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        letters = rng.integers(0, 26, self.POOL).astype(np.uint8) + ord("a")
        self.extra = letters.tobytes().decode("ascii")
        spaced = letters.copy()
        spaced[rng.integers(0, 13, self.POOL) == 0] = ord(" ")
        self.spaced = spaced.tobytes().decode("ascii")

    def words(self, n: int, max_length: int) -> list[str]:
        """``nextString(max_length)``: 3 to ``max_length - 1`` characters, trimmed."""
        lengths = self.rng.integers(3, max_length, n)
        starts = self.rng.integers(0, self.POOL - max_length, n)
        pool = self.spaced
        return [pool[s:s + k].strip() for s, k in zip(starts.tolist(), lengths.tolist(),
                                                       strict=True)]

    def extras(self, n: int, average: int, used: np.ndarray) -> list[str]:
        """``nextExtra``: pads an event of ``used`` bytes to ``average`` ± 20 %."""
        want = np.maximum(average - used, 0)
        delta = np.round(want * 0.2).astype(np.int64)
        sizes = want - delta + (self.rng.random(n) * 2 * delta).astype(np.int64)
        starts = self.rng.integers(0, self.POOL // 2, n)
        pool = self.extra
        return [pool[s:s + k] for s, k in zip(starts.tolist(), sizes.tolist(), strict=True)]


def _pick(rng: np.random.Generator, choices: tuple[str, ...], n: int) -> pa.Array:
    return pa.DictionaryArray.from_arrays(
        pa.array(rng.integers(0, len(choices), n), pa.int32()), pa.array(choices)).cast(
        pa.string())


def _persons(rng: np.random.Generator, strings: _Strings, ids: np.ndarray) -> dict[str, pa.Array]:
    n = len(ids)
    first = np.array(FIRST_NAMES, dtype=object)[rng.integers(0, len(FIRST_NAMES), n)]
    last = np.array(LAST_NAMES, dtype=object)[rng.integers(0, len(LAST_NAMES), n)]
    names = [f"{a} {b}" for a, b in zip(first.tolist(), last.tolist(), strict=True)]
    emails = [f"{a}@{b}.com" for a, b in zip(strings.words(n, 7), strings.words(n, 5),
                                             strict=True)]
    digits = rng.integers(0, 10_000, (n, 4)).tolist()
    cards = [f"{a:04d} {b:04d} {c:04d} {d:04d}" for a, b, c, d in digits]
    cities, states = _pick(rng, US_CITIES, n), _pick(rng, US_STATES, n)
    used = (8 + np.array([len(s) for s in names]) + np.array([len(s) for s in emails]) + 19
            + pc.utf8_length(cities).to_numpy() + pc.utf8_length(states).to_numpy())
    return {"p_id": pa.array(last_person(ids) + FIRST_PERSON_ID), "p_name": pa.array(names),
            "p_emailAddress": pa.array(emails), "p_creditCard": pa.array(cards),
            "p_city": cities, "p_state": states,
            "p_extra": pa.array(strings.extras(n, 200, used))}


def _auctions(rng: np.random.Generator, strings: _Strings, config: Config, ids: np.ndarray,
              times: np.ndarray) -> dict[str, pa.Array]:
    n = len(ids)
    hot = rng.integers(0, HOT_SELLERS_RATIO, n) > 0
    seller = np.where(hot, last_person(ids) // 100 * 100, _next_person(rng, ids))
    initial = _prices(rng, n)
    # an auction lasts up to twice the time IN_FLIGHT_AUCTIONS auctions take to be created
    ahead = IN_FLIGHT_AUCTIONS * TOTAL_PROPORTION // AUCTION_PROPORTION
    horizon = config.time_ms(ids + ahead) - times
    expires = times + 1 + (rng.random(n) * np.maximum(horizon * 2, 1)).astype(np.int64)
    names, descriptions = strings.words(n, 20), strings.words(n, 100)
    used = 48 + np.array([len(s) for s in names]) + np.array([len(s) for s in descriptions])
    return {"a_id": pa.array(last_auction(ids) + FIRST_AUCTION_ID),
            "a_itemName": pa.array(names), "a_description": pa.array(descriptions),
            "a_initialBid": pa.array(initial), "a_reserve": pa.array(initial + _prices(rng, n)),
            "a_expires": pa.array(expires, pa.timestamp("ms", tz="UTC")),
            "a_seller": pa.array(seller + FIRST_PERSON_ID),
            "a_category": pa.array(FIRST_CATEGORY_ID + rng.integers(0, NUM_CATEGORIES, n)),
            "a_extra": pa.array(strings.extras(n, 500, used))}


def _channels(rng: np.random.Generator, strings: _Strings) -> tuple[list[str], list[str]]:
    """The channel names and URLs: the 4 hot ones, then ``channel-<i>`` (nine in ten of
    their URLs carry ``&channel_id=``)."""

    def url() -> str:
        parts = [w.replace(" ", "_") or "x" for w in strings.words(3, 5)]
        return f"https://www.nexmark.com/{parts[0]}/{parts[1]}/{parts[2]}/item.htm?query=1"

    names, urls = list(HOT_CHANNELS), [url() for _ in HOT_CHANNELS]
    for i in range(CHANNELS):
        base = url()
        if rng.integers(0, 10) > 0:
            base += f"&channel_id={_reversed_bits(i)}"
        names.append(f"channel-{i}")
        urls.append(base)
    return names, urls


def _reversed_bits(i: int) -> int:
    """Java's ``Math.abs(Integer.reverse(i))``."""
    reverse = int(f"{i:032b}"[::-1], 2)
    return abs(reverse - (1 << 32) if reverse >= 1 << 31 else reverse)


def _bids(rng: np.random.Generator, strings: _Strings, ids: np.ndarray) -> dict[str, pa.Array]:
    n = len(ids)
    hot_auction = rng.integers(0, HOT_AUCTION_RATIO, n) > 0
    auction = np.where(hot_auction, last_auction(ids) // 100 * 100, _next_auction(rng, ids))
    hot_bidder = rng.integers(0, HOT_BIDDERS_RATIO, n) > 0
    bidder = np.where(hot_bidder, last_person(ids) // 100 * 100 + 1, _next_person(rng, ids))
    names, urls = _channels(rng, strings)
    hot_channel = rng.integers(0, 2, n) > 0
    channel = np.where(hot_channel, rng.integers(0, len(HOT_CHANNELS), n),
                       len(HOT_CHANNELS) + rng.integers(0, CHANNELS, n)).astype(np.int32)
    return {"b_auction": pa.array(auction + FIRST_AUCTION_ID),
            "b_bidder": pa.array(bidder + FIRST_PERSON_ID), "b_price": pa.array(_prices(rng, n)),
            "b_channel": pa.DictionaryArray.from_arrays(channel, pa.array(names)).cast(
                pa.string()),
            "b_url": pa.DictionaryArray.from_arrays(channel, pa.array(urls)).cast(pa.string()),
            "b_extra": pa.array(strings.extras(n, 100, np.full(n, 32)))}


def generate(config: Config) -> pa.Table:
    """The events of ``config`` in log order, as a table of ``SCHEMA`` (see the module
    docstring); the same config gives the same table."""
    if config.events < 1 or config.rate < 1 or config.disorder < 1 or config.disorder % 953 == 0:
        raise BenchmarkError(
            f"nexmark: --events {config.events}, rate {config.rate}, disorder "
            f"{config.disorder}: give events >= 1, a rate >= 1 and a disorder >= 1 that 953 "
            "does not divide")
    rng = np.random.default_rng(config.seed)
    strings = _Strings(rng)
    ids = adjusted_ids(config)
    times = config.time_ms(ids)
    rem = ids % TOTAL_PROPORTION
    kind = np.where(rem < PERSON_PROPORTION, PERSON,
                    np.where(rem < PERSON_PROPORTION + AUCTION_PROPORTION, AUCTION, BID))
    n = config.events
    columns: dict[str, pa.Array] = {
        "position": pa.array(np.arange(1, n + 1, dtype=np.int64)),
        "event_type": pa.array(kind.astype(np.int8)),
        "dateTime": pa.array(times, pa.timestamp("ms", tz="UTC")),
    }
    for kind_number in (PERSON, AUCTION, BID):
        where = np.flatnonzero(kind == kind_number)
        made = _persons(rng, strings, ids[where]) if kind_number == PERSON else \
            _auctions(rng, strings, config, ids[where], times[where]) \
            if kind_number == AUCTION else _bids(rng, strings, ids[where])
        for name, values in made.items():
            columns[name] = _scatter(values, where, n)
    return pa.table([columns[f.name] for f in SCHEMA], schema=SCHEMA)


def _scatter(values: pa.Array, where: np.ndarray, n: int) -> pa.Array:
    """An array of ``n`` rows holding ``values`` at the rows ``where``, null elsewhere."""
    index = np.full(n, -1, dtype=np.int64)
    index[where] = np.arange(len(where))
    taken = pa.array(index, mask=index < 0)
    return values.take(taken)
