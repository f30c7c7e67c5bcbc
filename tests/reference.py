"""A reference for seam's event-time features, written independently of ``tables.features``.

Brute force over the whole event log: no eviction, no sorted lists, no bisection, nothing shared with
the production code but the feature names. It replays events in arrival order (per partition, as
Kafka delivers them) with the documented rules:

* an event whose id was already applied is scored again with the features it got the first time, if
  it lies within the replay horizon (``ts >= the card's highest applied ts - lateness - 3600 s``);
* otherwise it is late when its ``ts`` is below its partition's watermark (the highest ``ts`` of
  the partition's earlier on-time events minus the allowed lateness): not applied, not scored;
* otherwise it is applied, and its features cover the card's applied events (itself included,
  none that arrived later) with ``ts`` in ``(e.ts - W, e.ts]``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

WINDOWS_S = (60, 600, 3600)


@dataclass(frozen=True)
class Scored:
    """The event was scored with these features (name -> value)."""

    features: dict[str, float]


@dataclass(frozen=True)
class Late:
    """The event was late: below this watermark."""

    watermark: int


def features_of(event: Mapping[str, Any], applied: list[Mapping[str, Any]]) -> dict[str, float]:
    """Brute-force features of ``event`` given the card's applied events so far (including it)."""
    ts = event["ts"]
    visible = [x for x in applied if x["ts"] <= ts]
    out: dict[str, float] = {}
    for w in WINDOWS_S:
        window = [x for x in visible if ts - w * 1000 < x["ts"]]
        amounts = [float(x["amount"]) for x in window]
        out[f"count_{w}"] = float(len(window))
        out[f"amount_sum_{w}"] = sum(amounts)
        out[f"amount_mean_{w}"] = sum(amounts) / len(amounts)
        out[f"amount_max_{w}"] = max(amounts)
    earlier = [x["ts"] for x in visible if x["id"] != event["id"]]
    out["secs_since_prev"] = (ts - max(earlier)) / 1000.0 if earlier else -1.0
    out["distinct_merchants_3600"] = float(len({x["merchant_id"] for x in visible if ts - 3_600_000 < x["ts"]}))
    mean = out["amount_mean_3600"]
    out["amount_to_mean_3600"] = float(event["amount"]) / mean if mean else 0.0
    return out


def replay(events: Iterable[Mapping[str, Any]], allowed_lateness_ms: int) -> list[Scored | Late]:
    """The outcome of every event (each needs ``partition``, ``id``, ``card_id``, ``ts``, ``amount``,
    ``merchant_id``), in arrival order."""
    highest: dict[int, int] = {}
    card_highest: dict[str, int] = {}
    applied: dict[str, list[Mapping[str, Any]]] = {}
    first: dict[str, dict[str, float]] = {}
    outcomes: list[Scored | Late] = []
    for event in events:
        horizon = card_highest.get(event["card_id"], event["ts"]) - allowed_lateness_ms - max(WINDOWS_S) * 1000
        if event["id"] in first and event["ts"] >= horizon:
            outcomes.append(Scored(first[event["id"]]))
            continue
        partition, ts = event["partition"], event["ts"]
        if partition in highest and ts < highest[partition] - allowed_lateness_ms:
            outcomes.append(Late(highest[partition] - allowed_lateness_ms))
            continue
        highest[partition] = max(highest.get(partition, ts), ts)
        card_highest[event["card_id"]] = max(card_highest.get(event["card_id"], ts), ts)
        log = applied.setdefault(event["card_id"], [])
        log.append(event)
        first[event["id"]] = features_of(event, log)
        outcomes.append(Scored(first[event["id"]]))
    return outcomes
