"""A reference for seam's event-time features, written independently of ``tables.features``.

Brute force over the whole event log: no eviction, no sorted lists, no bisection, nothing shared with
the production code but the feature names. It replays events in arrival order (per partition, as
Kafka delivers them) with the documented rules:

* an event whose id was already applied is scored again with the features it got the first time, if
  it lies within the replay horizon (``ts >= the card's highest applied ts - lateness - the replay
  allowance``, 10 minutes in the example spec);
* otherwise it is late when its ``ts`` is below its partition's watermark (the highest ``ts`` of
  the partition's earlier on-time events minus the allowed lateness): not applied, not scored;
* otherwise it is applied, and its features cover the card's applied events (itself included,
  none that arrived later) with ``ts`` in ``(e.ts - W, e.ts]``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction
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


def replay(events: Iterable[Mapping[str, Any]], allowed_lateness_ms: int,
           replay_allowance_ms: int = 600_000) -> list[Scored | Late]:
    """The outcome of every event (each needs ``partition``, ``id``, ``card_id``, ``ts``, ``amount``,
    ``merchant_id``), in arrival order."""
    highest: dict[int, int] = {}
    card_highest: dict[str, int] = {}
    applied: dict[str, list[Mapping[str, Any]]] = {}
    first: dict[str, dict[str, float]] = {}
    outcomes: list[Scored | Late] = []
    for event in events:
        horizon = card_highest.get(event["card_id"], event["ts"]) - allowed_lateness_ms - replay_allowance_ms
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


# --- any spec ------------------------------------------------------------------------------------------------


def spec_features_of(spec: Any, event: Mapping[str, Any], applied: list[Mapping[str, Any]]) -> dict[str, float]:
    """Brute-force features of ``event`` for the features of ``spec`` (a ``tables.spec.FeatureSpec``), given the
    key's applied events so far in arrival order (including it). Exact arithmetic (fractions) throughout,
    rounded once at the end; only the spec's declarations are read from production code."""
    time = spec.event_time
    ts = event[time]
    visible = [x for x in applied if x[time] <= ts]
    earlier = [x for x in visible if x is not event]
    previous = max(reversed(earlier), key=lambda x: x[time]) if earlier else None  # ties: the latest arrival
    out: dict[str, float] = {}
    for feature in spec.features:
        if feature.op == "since_prev":
            out[feature.name] = feature.default if previous is None else (ts - previous[time]) / 1000.0
            continue
        if feature.op == "last":
            out[feature.name] = feature.default if previous is None else float(previous[feature.field])
            continue
        window = [x for x in visible if ts - feature.window_ms < x[time]]
        if feature.op == "count":
            out[feature.name] = float(len(window))
            continue
        values = [x[feature.field] for x in window]
        if feature.op == "distinct":
            out[feature.name] = float(len(set(values)))
            continue
        exact = [Fraction(float(v)) for v in values]
        mean = sum(exact) / len(exact)
        if feature.op == "sum":
            out[feature.name] = float(sum(exact))
        elif feature.op == "mean":
            out[feature.name] = float(mean)
        elif feature.op == "min":
            out[feature.name] = float(min(exact))
        elif feature.op == "max":
            out[feature.name] = float(max(exact))
        elif feature.op == "std":
            out[feature.name] = math.sqrt(float(sum((v - mean) ** 2 for v in exact) / len(exact)))
        elif feature.op == "ratio_to_mean":
            out[feature.name] = float(Fraction(float(event[feature.field])) / mean) if mean else 0.0
        else:
            raise AssertionError(f"the reference does not know op {feature.op!r}")
    return out


def replay_spec(spec: Any, events: Iterable[Mapping[str, Any]]) -> list[Scored | Late]:
    """:func:`replay` for any spec: each event has ``partition`` and the spec's fields (key, id, time, values)."""
    key, event_id, time = spec.key, spec.event_id, spec.event_time
    lateness, horizon_ms = spec.allowed_lateness_ms, spec.replay_allowance_ms
    highest: dict[int, int] = {}
    key_highest: dict[str, int] = {}
    applied: dict[str, list[Mapping[str, Any]]] = {}
    first: dict[str, dict[str, float]] = {}
    outcomes: list[Scored | Late] = []
    for event in events:
        ts, partition = event[time], event["partition"]
        if event[event_id] in first and ts >= key_highest.get(event[key], ts) - lateness - horizon_ms:
            outcomes.append(Scored(first[event[event_id]]))
            continue
        if partition in highest and ts < highest[partition] - lateness:
            outcomes.append(Late(highest[partition] - lateness))
            continue
        highest[partition] = max(highest.get(partition, ts), ts)
        key_highest[event[key]] = max(key_highest.get(event[key], ts), ts)
        log = applied.setdefault(event[key], [])
        log.append(event)
        first[event[event_id]] = spec_features_of(spec, event, log)
        outcomes.append(Scored(first[event[event_id]]))
    return outcomes
