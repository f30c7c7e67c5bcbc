"""Synthetic card transactions with learnable fraud patterns, deterministic for a seed.

Used by ``seam produce`` (the load generator) and ``scripts/train_model.py`` (labels for training).

Each card has a typical amount, a handful of usual merchants and a home country, and transacts at
random intervals (tens of minutes apart in event time). Fraud comes in bursts: several transactions
seconds apart, at unusual amounts, at merchants the card never used, sometimes abroad. Event time is
simulated: it advances as fast as the events are generated, so a short live run covers hours of card
activity. A small share of events arrive out of order (a few seconds to ~40 s behind, within the
default 60 s allowed lateness) and a smaller share arrive minutes late.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["Card", "TransactionGenerator"]

COUNTRIES = ("DE", "FR", "NL", "ES", "IT", "PL", "SE", "US", "GB", "BR", "IN", "NG")


@dataclass(slots=True)
class Card:
    """One card's habits."""

    card_id: str
    log_amount: float
    merchants: list[str]
    country: str
    mean_gap_s: float


class TransactionGenerator:
    """An endless, seeded stream of ``(transaction dict, is_fraud)`` in arrival order."""

    def __init__(
        self,
        *,
        cards: int = 1000,
        seed: int = 7,
        start_ms: int = 1_764_500_000_000,
        fraud_burst_rate: float = 0.004,
        out_of_order_rate: float = 0.02,
        late_rate: float = 0.001,
        merchants: int = 5000,
        id_prefix: str = "tx",
    ) -> None:
        if cards < 1:
            raise ValueError("cards must be >= 1")
        self._rng = random.Random(seed)
        self._fraud_burst_rate = fraud_burst_rate
        self._out_of_order_rate = out_of_order_rate
        self._late_rate = late_rate
        self._merchants = merchants
        self._id_prefix = id_prefix
        self.last_ts_ms = start_ms
        self._count = 0
        rng = self._rng
        self.cards = [
            Card(
                card_id=f"c-{i}",
                log_amount=rng.gauss(3.2, 0.8),
                merchants=[f"m-{rng.randrange(merchants)}" for _ in range(rng.randint(3, 8))],
                country=rng.choice(COUNTRIES[:8]),
                mean_gap_s=rng.uniform(600, 3600),
            )
            for i in range(cards)
        ]
        # (event time ms, tie-break, card index, fraud burst events left)
        self._heap: list[tuple[int, int, int, int]] = [
            (start_ms + int(rng.expovariate(1 / c.mean_gap_s) * 1000), i, i, 0)
            for i, c in enumerate(self.cards)
        ]
        heapq.heapify(self._heap)

    def __iter__(self) -> Iterator[tuple[dict[str, Any], bool]]:
        return self

    def __next__(self) -> tuple[dict[str, Any], bool]:
        rng = self._rng
        ts, _, index, burst_left = heapq.heappop(self._heap)
        card = self.cards[index]
        self._count += 1
        fraud = burst_left > 0
        if fraud:
            amount = round(rng.lognormvariate(card.log_amount + rng.uniform(1.0, 2.3), 0.4), 2)
            merchant = f"m-{rng.randrange(self._merchants)}"
            country = rng.choice(COUNTRIES) if rng.random() < 0.5 else card.country
            burst_left -= 1
            next_gap_s = rng.uniform(2, 25) if burst_left else rng.expovariate(1 / card.mean_gap_s)
        else:
            amount = round(rng.lognormvariate(card.log_amount, 0.45), 2)
            usual = rng.random() < 0.9
            merchant = rng.choice(card.merchants) if usual else f"m-{rng.randrange(self._merchants)}"
            country = card.country
            next_gap_s = rng.expovariate(1 / card.mean_gap_s)
            if rng.random() < self._fraud_burst_rate:
                burst_left = rng.randint(3, 8)
                next_gap_s = rng.uniform(5, 60)
        heapq.heappush(self._heap, (ts + max(1, int(next_gap_s * 1000)), self._count, index, burst_left))
        self.last_ts_ms = max(self.last_ts_ms, ts)
        event_ts = ts
        roll = rng.random()
        if roll < self._late_rate:
            event_ts -= rng.randint(120_000, 900_000)
        elif roll < self._late_rate + self._out_of_order_rate:
            event_ts -= rng.randint(1_000, 40_000)
        tx = {
            "id": f"{self._id_prefix}-{self._count}",
            "card_id": card.card_id,
            "ts": event_ts,
            "amount": amount,
            "merchant_id": merchant,
            "country": country,
        }
        return tx, fraud
