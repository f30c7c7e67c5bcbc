"""Synthetic streams of the example specs, with learnable patterns, deterministic for a seed.

Used by ``seam produce`` (the load generator), ``make demo`` and ``scripts/train_model.py`` (labels for
training); :func:`generator_for` picks the one a spec's name asks for: card transactions with fraud
bursts (``specs/fraud.toml``), or sensor readings with device faults (``specs/sensors.toml``).

Card transactions (:class:`TransactionGenerator`).
Each card has a typical amount, a handful of usual merchants and a home country, and transacts at
random intervals (tens of minutes apart in event time). Fraud comes in bursts: several transactions
seconds apart, at unusual amounts, at merchants the card never used, sometimes abroad. Event time is
simulated: it advances as fast as the events are generated, so a short live run covers hours of card
activity. A small share of events arrive out of order (a few seconds to ~40 s behind, within the
default 60 s allowed lateness) and a smaller share arrive minutes late.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from tables.spec import FeatureSpec

__all__ = ["Card", "Device", "SensorGenerator", "Synthetic", "TransactionGenerator", "generator_for"]

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

    def events_per_s(self) -> float:
        """Events per second of event time, fraud bursts aside (each card's exponential gaps)."""
        return sum(1 / card.mean_gap_s for card in self.cards)

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


@dataclass(slots=True)
class Device:
    """One sensor's normal behaviour, and the fault it may be in."""

    device_id: str
    site: str
    base_temperature: float
    base_vibration: float
    period_s: float
    fault_left: int = 0  # readings left in the running fault
    drift: float = 0.0  # degrees added per reading while the fault lasts
    shaking: bool = False  # whether the running fault also shows in the vibration


class SensorGenerator:
    """An endless, seeded stream of ``(sensor reading dict, in_fault)`` in arrival order.

    Each device reports its temperature and vibration every few seconds of event time, with noise. A
    fault (a bearing running hot) comes on rarely and lasts 10-40 readings: the temperature drifts up
    by a fraction of a degree per reading, in most faults the vibration rises by a half to one and a
    half times, readings come faster, and the status says ``warn`` in some of them. Event times are
    ISO-8601 strings with a zone (``...Z``), some a few seconds out of order, a few minutes late; some
    readings carry no status (the spec's default, ok).
    """

    def __init__(
        self,
        *,
        devices: int = 500,
        seed: int = 7,
        start_ms: int = 1_764_500_000_000,
        fault_rate: float = 0.002,
        out_of_order_rate: float = 0.02,
        late_rate: float = 0.001,
        id_prefix: str = "r",
    ) -> None:
        if devices < 1:
            raise ValueError("devices must be >= 1")
        self._rng = rng = random.Random(seed)
        self._fault_rate = fault_rate
        self._out_of_order_rate = out_of_order_rate
        self._late_rate = late_rate
        self._id_prefix = id_prefix
        self._count = 0
        self.last_ts_ms = start_ms
        self.devices = [
            Device(f"dev-{i}", f"site-{rng.randrange(20)}", rng.uniform(25, 60), rng.uniform(0.5, 3.0),
                   rng.uniform(1.0, 5.0))
            for i in range(devices)
        ]
        self._heap = [(start_ms + int(rng.uniform(0, d.period_s) * 1000), i, i) for i, d in enumerate(self.devices)]
        heapq.heapify(self._heap)

    def __iter__(self) -> Iterator[tuple[dict[str, Any], bool]]:
        return self

    def events_per_s(self) -> float:
        """Events per second of event time, faults aside (each device's period)."""
        return sum(1 / device.period_s for device in self.devices)

    def __next__(self) -> tuple[dict[str, Any], bool]:
        rng = self._rng
        ts, _, index = heapq.heappop(self._heap)
        device = self.devices[index]
        self._count += 1
        fault = device.fault_left > 0
        if fault:
            device.fault_left -= 1
            device.drift += rng.uniform(0.2, 0.9)
            temperature = device.base_temperature + device.drift + rng.gauss(0, 0.6)
            vibration = device.base_vibration * (rng.uniform(1.3, 2.5) if device.shaking else rng.gauss(1.0, 0.15))
            gap_s = device.period_s * rng.uniform(0.3, 0.6)
        else:
            device.drift = 0.0
            temperature = device.base_temperature + rng.gauss(0, 0.6)
            vibration = max(0.0, device.base_vibration * rng.gauss(1.0, 0.15))
            gap_s = device.period_s * rng.uniform(0.8, 1.2)
            if rng.random() < self._fault_rate:
                device.fault_left = rng.randint(10, 40)
                device.shaking = rng.random() < 0.6
        heapq.heappush(self._heap, (ts + max(1, int(gap_s * 1000)), self._count, index))
        self.last_ts_ms = max(self.last_ts_ms, ts)
        event_ts = ts
        roll = rng.random()
        if roll < self._late_rate:
            event_ts -= rng.randint(120_000, 600_000)
        elif roll < self._late_rate + self._out_of_order_rate:
            event_ts -= rng.randint(500, 8_000)
        reading: dict[str, Any] = {
            "reading_id": f"{self._id_prefix}-{self._count}",
            "device_id": device.device_id,
            "ts": datetime.fromtimestamp(event_ts / 1000, UTC).isoformat(timespec="milliseconds").replace(
                "+00:00", "Z"),
            "temperature": round(min(temperature, 199.0), 2),
            "vibration": round(min(vibration, 99.0), 3),
            "site": device.site,
        }
        if rng.random() < 0.9:
            reading["status"] = "warn" if fault and rng.random() < 0.3 else "ok"
        return reading, fault


class Synthetic(Protocol):
    """A synthetic stream: ``(record, positive)`` pairs in arrival order; ``last_ts_ms`` its highest event time."""

    last_ts_ms: int

    def __iter__(self) -> Iterator[tuple[dict[str, Any], bool]]: ...

    def __next__(self) -> tuple[dict[str, Any], bool]: ...

    def events_per_s(self) -> float: ...


def span_ms(generator: Synthetic, events: int) -> int:
    """At least the event time a stream's first ``events`` events cover, with three standard deviations to
    spare (bursts and faults only add events): where to start a stream that must end before a given time."""
    mean_ms = events / generator.events_per_s() * 1000
    return int(mean_ms * (1 + 3 / math.sqrt(max(events, 1))))


def generator_for(spec: FeatureSpec, *, keys: int, seed: int, start_ms: int | None = None, late_rate: float = 0.001,
                  id_prefix: str = "e", end_ms: int | None = None, events: int = 0) -> Synthetic:
    """The synthetic stream of an example spec, by its name (``fraud``, ``sensors``): ``(record, positive)``.

    Synthetic event time runs far ahead of the wall clock (a short run covers hours of activity). With
    ``end_ms`` instead of ``start_ms``, the stream starts early enough that its first ``events`` events end
    by ``end_ms``: a live run that ends now is never ahead of its records' Kafka timestamps
    (``SEAM_MAX_FUTURE_S``).
    """
    kinds: dict[str, Callable[[int], Synthetic]] = {
        "fraud": lambda start: TransactionGenerator(cards=keys, seed=seed, start_ms=start, late_rate=late_rate,
                                                    id_prefix=id_prefix),
        "sensors": lambda start: SensorGenerator(devices=keys, seed=seed, start_ms=start, late_rate=late_rate,
                                                 id_prefix=id_prefix),
    }
    make = kinds.get(spec.name)
    if make is None:
        raise LookupError(f"no synthetic stream for spec {spec.name!r}: seam generates the example streams (fraud, "
                          "sensors); produce your own records for other specs")
    if end_ms is not None:
        return make(end_ms - span_ms(make(0), events))  # the same seed: the same keys, the same rates
    if start_ms is None:
        raise TypeError("generator_for needs start_ms or end_ms")
    return make(start_ms)
