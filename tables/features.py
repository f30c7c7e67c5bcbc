"""Event-time-correct per-card features, kept as compact state (pure code, no Faust).

The feature of a transaction ``e`` of card ``k`` is computed over ``S_W``: the transactions of ``k`` that
were applied to state before ``e`` or are ``e`` itself (arrival order), whose event time lies in the
window ``(e.ts - W, e.ts]``. Events that arrived earlier but carry a later ``ts`` are excluded, so a
feature describes the moment of the event it scores, whatever the arrival order.

State per card is a small JSON-friendly dict (it is a Faust table value)::

    {"n": <arrival counter>, "prev": <max ts evicted, or None>,
     "ev": [[seq, ts_ms, amount, merchant_id, event_id], ...]}

Events older than any future on-time event can need are evicted: a future event of this card that is
not late has ``ts >= card_max_ts - allowed_lateness`` (the partition's watermark is at least that),
so anything at or below ``card_max_ts - allowed_lateness - max(window)`` can never be in its windows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["DEFAULT_SPEC", "Applied", "CardState", "FeatureSpec", "Watermark", "apply_event", "new_state"]

CardState = dict[str, Any]


@dataclass(frozen=True, slots=True)
class FeatureSpec:
    """The feature vector's definition: windows (seconds) and the resulting names, in model order."""

    windows_s: tuple[int, ...] = (60, 600, 3600)
    distinct_window_s: int = 3600
    ratio_window_s: int = 3600
    names: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        windows = set(self.windows_s)
        if self.distinct_window_s not in windows or self.ratio_window_s not in windows:
            raise ValueError("distinct_window_s and ratio_window_s must be among windows_s")
        names: list[str] = []
        for w in self.windows_s:
            names += [f"count_{w}", f"amount_sum_{w}", f"amount_mean_{w}", f"amount_max_{w}"]
        names += ["secs_since_prev", f"distinct_merchants_{self.distinct_window_s}",
                  f"amount_to_mean_{self.ratio_window_s}"]
        object.__setattr__(self, "names", tuple(names))

    @property
    def max_window_ms(self) -> int:
        return max(self.windows_s) * 1000


DEFAULT_SPEC = FeatureSpec()


@dataclass(frozen=True, slots=True)
class Applied:
    """The result of applying one event: its features and whether it was new to the state."""

    features: tuple[float, ...]
    duplicate: bool


def new_state() -> CardState:
    """Return the state of a card that has seen nothing."""
    return {"n": 0, "prev": None, "ev": []}


def apply_event(
    state: CardState,
    event_id: str,
    ts_ms: int,
    amount: float,
    merchant_id: str,
    *,
    allowed_lateness_ms: int,
    spec: FeatureSpec = DEFAULT_SPEC,
) -> Applied:
    """Apply one on-time event to ``state`` in place (once per id) and compute its features."""
    events: list[list[Any]] = state["ev"]
    seq = next((row[0] for row in events if row[4] == event_id), None)
    duplicate = seq is not None
    if seq is None:
        state["n"] += 1
        seq = state["n"]
        events.append([seq, ts_ms, amount, merchant_id, event_id])
        _evict(state, allowed_lateness_ms + spec.max_window_ms, keep_seq=seq)
    else:
        # A redelivered event is scored with the features it had: its own stored values, and only
        # the events applied before it.
        row = next(row for row in events if row[0] == seq)
        ts_ms, amount = row[1], row[2]
    return Applied(_features(state, seq, (ts_ms, amount), spec), duplicate)


def _evict(state: CardState, horizon_ms: int, keep_seq: int) -> None:
    events: list[list[Any]] = state["ev"]
    cutoff = max(row[1] for row in events) - horizon_ms
    # The event just applied stays until the next one even when it is already that old (an old event
    # replayed after the in-memory watermark was lost): its own windows must contain it.
    expired = [row for row in events if row[1] <= cutoff and row[0] != keep_seq]
    if not expired:
        return
    kept = [row for row in events if row[1] > cutoff or row[0] == keep_seq]
    evicted_max = max(row[1] for row in expired)
    state["prev"] = evicted_max if state["prev"] is None else max(state["prev"], evicted_max)
    state["ev"] = kept


def _features(state: CardState, seq: int, this: tuple[int, float], spec: FeatureSpec) -> tuple[float, ...]:
    ts_ms, amount = this
    # Events visible to this one: applied no later than it, not after it in event time.
    visible = [row for row in state["ev"] if row[0] <= seq and row[1] <= ts_ms]
    out: list[float] = []
    means: dict[int, float] = {}
    merchants: dict[int, int] = {}
    for w in spec.windows_s:
        lower = ts_ms - w * 1000
        amounts = [row[2] for row in visible if row[1] > lower]
        count = len(amounts)  # >= 1: the event itself is always in its windows
        total = float(sum(amounts))
        mean = total / count
        means[w] = mean
        merchants[w] = len({row[3] for row in visible if row[1] > lower})
        out += [float(count), total, mean, float(max(amounts))]
    previous = [row[1] for row in visible if row[0] != seq]
    if state["prev"] is not None and state["prev"] <= ts_ms:
        previous.append(state["prev"])
    out.append((ts_ms - max(previous)) / 1000.0 if previous else -1.0)
    out.append(float(merchants[spec.distinct_window_s]))
    mean = means[spec.ratio_window_s]
    out.append(amount / mean if mean else 0.0)
    return tuple(out)


class Watermark:
    """One input partition's event-time watermark: the highest ``ts`` seen minus allowed lateness."""

    __slots__ = ("allowed_lateness_ms", "max_ts")

    def __init__(self, allowed_lateness_ms: int, max_ts: int | None = None) -> None:
        self.allowed_lateness_ms = allowed_lateness_ms
        self.max_ts = max_ts

    @property
    def value(self) -> int | None:
        """The current watermark, or ``None`` before the first event."""
        return None if self.max_ts is None else self.max_ts - self.allowed_lateness_ms

    def is_late(self, ts_ms: int) -> bool:
        """Say whether ``ts_ms`` is below the watermark of the events seen before it."""
        watermark = self.value
        return watermark is not None and ts_ms < watermark

    def observe(self, ts_ms: int) -> None:
        """Advance the watermark with an on-time event."""
        if self.max_ts is None or ts_ms > self.max_ts:
            self.max_ts = ts_ms
