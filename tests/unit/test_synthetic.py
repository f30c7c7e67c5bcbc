"""Unit tests for app.synthetic.TransactionGenerator: determinism, fraud, ids, valid records."""

from __future__ import annotations

from collections import Counter, defaultdict
from itertools import islice
from typing import Any

import orjson
import pytest

from agents.formats.codec import DEFAULT_CONTRACT, Event, JsonInput
from app.synthetic import TransactionGenerator
from tables.features import Watermark

Record = tuple[dict[str, Any], bool]


def take(n: int, **kwargs: Any) -> list[Record]:
    """The first ``n`` (record, is_fraud) pairs of a generator built with ``kwargs``."""
    return list(islice(TransactionGenerator(**kwargs), n))


@pytest.fixture(scope="module")
def sample() -> list[Record]:
    """20,000 records of the default generator (seed 7, 1000 cards), shared read-only."""
    return take(20_000)


def test_same_seed_same_records() -> None:
    """Two generators with the same seed yield identical first 500 records and labels."""
    assert take(500, seed=123, cards=50) == take(500, seed=123, cards=50)


def test_different_seeds_differ() -> None:
    """Different seeds give different streams."""
    a, b = take(500, seed=1, cards=50), take(500, seed=2, cards=50)
    assert a != b
    assert sum(x != y for x, y in zip(a, b, strict=True)) > 250


def test_cards_are_part_of_the_seeded_state() -> None:
    """Card habits are seeded too: same seed, same cards."""
    assert (
        TransactionGenerator(seed=5, cards=20).cards == TransactionGenerator(seed=5, cards=20).cards
    )


def test_iterator_protocol() -> None:
    """The generator is its own iterator and endless."""
    gen = TransactionGenerator(cards=3, seed=1)
    assert iter(gen) is gen
    assert len(list(islice(gen, 5000))) == 5000


def test_rejects_zero_cards() -> None:
    """At least one card is required."""
    with pytest.raises(ValueError, match="cards"):
        TransactionGenerator(cards=0)


def test_fraud_present_at_a_low_share(sample: list[Record]) -> None:
    """Fraud bursts occur, but fraud stays a small minority (< 10 %)."""
    frauds = sum(fraud for _, fraud in sample)
    assert frauds > 0
    assert frauds / len(sample) < 0.10


def test_fraud_comes_in_bursts(sample: list[Record]) -> None:
    """A card's fraudulent events come several in a row (bursts of 3 to 8)."""
    per_card: dict[str, list[Record]] = defaultdict(list)
    for tx, fraud in sample:
        per_card[tx["card_id"]].append((tx, fraud))
    runs: list[int] = []
    for events in per_card.values():
        run = 0
        for _, fraud in events:
            if fraud:
                run += 1
            elif run:
                runs.append(run)
                run = 0
    assert runs, "no completed fraud burst in the sample"
    assert max(runs) >= 3
    assert sum(runs) / len(runs) >= 2


def test_no_fraud_without_bursts() -> None:
    """With fraud_burst_rate=0 nothing is labelled fraud."""
    assert not any(fraud for _, fraud in take(3000, fraud_burst_rate=0.0, cards=20))


def test_ids_unique_with_prefix() -> None:
    """Ids are unique and carry the configured prefix."""
    records = take(5000, id_prefix="load", cards=100)
    ids = [tx["id"] for tx, _ in records]
    assert len(set(ids)) == len(ids)
    assert all(i.startswith("load-") for i in ids)
    assert ids[:3] == ["load-1", "load-2", "load-3"]


def test_records_pass_the_codec(sample: list[Record]) -> None:
    """Every generated record, serialised as JSON, decodes by the example spec to the same event."""
    decode = JsonInput(DEFAULT_CONTRACT).decode
    for tx, _ in sample[:5000]:
        decoded = decode(orjson.dumps(tx))
        assert isinstance(decoded, Event), (tx, decoded)
        assert decoded == Event(tx["id"], tx["card_id"], tx["ts"], (tx["amount"], tx["merchant_id"]))


def test_records_have_the_documented_fields(sample: list[Record]) -> None:
    """Each record has exactly the transaction fields, with card ids among the configured cards."""
    keys = {"id", "card_id", "ts", "amount", "merchant_id", "country"}
    cards = {f"c-{i}" for i in range(1000)}
    for tx, fraud in sample[:2000]:
        assert set(tx) == keys
        assert tx["card_id"] in cards
        assert isinstance(fraud, bool)
        assert tx["amount"] > 0


def test_cards_restricted_to_count() -> None:
    """Only the configured number of cards appears, and all of them eventually do."""
    seen = Counter(tx["card_id"] for tx, _ in take(2000, cards=5))
    assert set(seen) == {f"c-{i}" for i in range(5)}


def test_starts_near_start_ms() -> None:
    """Event times begin at start_ms (minus at most the late-event offset) and advance."""
    start = 1_800_000_000_000
    records = take(2000, start_ms=start, cards=50)
    ts = [tx["ts"] for tx, _ in records]
    assert min(ts) >= start - 900_000
    assert max(ts) > start


def test_mostly_on_time_for_the_default_lateness(sample: list[Record]) -> None:
    """Only a small share of events is late for a 60 s allowed lateness (documented: ~0.1 %)."""
    watermark = Watermark(60_000)
    late = 0
    for tx, _ in sample:
        if watermark.is_late(tx["ts"]):
            late += 1
        else:
            watermark.observe(tx["ts"])
    assert 0 < late / len(sample) < 0.01


def test_no_disorder_when_rates_are_zero() -> None:
    """Without out-of-order and late events, event time never goes backwards."""
    records = take(3000, out_of_order_rate=0.0, late_rate=0.0, cards=30)
    ts = [tx["ts"] for tx, _ in records]
    assert ts == sorted(ts)
