"""Event-time-correct per-card features, kept as compact state (pure code, no Faust).

The feature of a transaction ``e`` of card ``k`` is computed over ``S_W``: the transactions of ``k`` that
were applied to state before ``e`` or are ``e`` itself (arrival order), whose event time lies in the
window ``(e.ts - W, e.ts]``. Events that arrived earlier but carry a later ``ts`` are excluded, so a
feature describes the moment of the event it scores, whatever the arrival order.

State per card is one small JSON-friendly dict (a Faust table value) of parallel lists sorted by
event time (ties in arrival order)::

    {"n": <arrival counter>, "prev": <max ts evicted, or None>,
     "ts": [ms, ...], "amt": [amount, ...], "mer": [merchant_id, ...], "id": [event_id, ...],
     "seq": [arrival number, ...]}

A new event is inserted with ``bisect``; every event already in the state arrived before it, so its
windows are index ranges found by bisection and its aggregates are C-level ``sum``/``max``/``set``
over list slices. Only a redelivered event (its id is already in the state) takes the slow path that
also filters by arrival number, so it is scored with exactly the features it had the first time.

Eviction keeps the state bounded without changing any result. A future event of this card that is not
late has ``ts >= card_max_ts - allowed_lateness`` (the partition's watermark is at least that), so it
never needs anything at or below ``card_max_ts - allowed_lateness - W`` (``W`` the largest window). A
*redelivered* event is scored again from the state only while it lies within that same replay horizon
(:func:`replayable`); older redeliveries are below the watermark and go to the late topic like any
late event. Replaying an event at the horizon needs one more window of context, so the state keeps
events down to ``card_max_ts - allowed_lateness - 2·W`` and evicts the rest. ``prev`` keeps the
highest evicted time for ``secs_since_prev``.
"""

from __future__ import annotations

import hashlib
from bisect import bisect_right
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "DEFAULT_SPEC", "Applied", "CardState", "FeatureSpec", "Watermark", "apply_event", "event_ids",
    "feature_set_version",
    "latest_features", "new_state", "replayable", "upgrade_state",
]

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

    @property
    def version(self) -> str:
        """Names the feature set (its names in order): the feature log's records carry it."""
        return feature_set_version(self.names)


def feature_set_version(names: tuple[str, ...]) -> str:
    """``<count>-<first 12 hex digits of SHA-256 of the comma-joined names>``: equal iff the names are."""
    return f"{len(names)}-{hashlib.sha256(','.join(names).encode()).hexdigest()[:12]}"


DEFAULT_SPEC = FeatureSpec()


@dataclass(frozen=True, slots=True)
class Applied:
    """The result of applying one event: its features and whether it was new to the state."""

    features: tuple[float, ...]
    duplicate: bool


def new_state() -> CardState:
    """Return the state of a card that has seen nothing."""
    return {"n": 0, "prev": None, "ts": [], "amt": [], "mer": [], "id": [], "seq": []}


_COLUMNS = ("ts", "amt", "mer", "id", "seq")


def upgrade_state(state: CardState) -> CardState:
    """Bring a stored state written by an earlier seam (rows under ``"ev"``) to the current layout."""
    if "ev" not in state:
        return state
    rows = sorted(state["ev"], key=lambda row: (row[1], row[0]))  # [seq, ts, amount, merchant, id]
    upgraded = new_state()
    upgraded["n"], upgraded["prev"] = state["n"], state["prev"]
    for seq, ts, amount, merchant, event_id in rows:
        for column, value in zip(_COLUMNS, (ts, amount, merchant, event_id, seq), strict=True):
            upgraded[column].append(value)
    return upgraded


def event_ids(state: CardState) -> list[str]:
    """The ids of the events held in ``state``, in arrival order."""
    return [event_id for _, event_id in sorted(zip(state["seq"], state["id"], strict=True))]


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
    ids: list[str] = state["id"]
    if event_id in ids:
        return Applied(_replayed_features(state, ids.index(event_id), spec), True)
    times: list[int] = state["ts"]
    state["n"] += 1
    pos = bisect_right(times, ts_ms)
    times.insert(pos, ts_ms)
    state["amt"].insert(pos, amount)
    state["mer"].insert(pos, merchant_id)
    ids.insert(pos, event_id)
    state["seq"].insert(pos, state["n"])
    pos = _evict(state, pos, times[-1] - allowed_lateness_ms - 2 * spec.max_window_ms)
    return Applied(_features(state, pos, spec), False)


def latest_features(state: CardState, spec: FeatureSpec = DEFAULT_SPEC) -> tuple[str, tuple[float, ...]] | None:
    """The id and features of the card's most recently applied event still in state, if any."""
    if not state["seq"]:
        return None
    index = max(range(len(state["seq"])), key=state["seq"].__getitem__)
    return state["id"][index], _replayed_features(state, index, spec)


def replayable(state: CardState, ts_ms: int, *, allowed_lateness_ms: int, spec: FeatureSpec = DEFAULT_SPEC) -> bool:
    """Say whether an already-applied event at ``ts_ms`` can be scored again with its first features."""
    times: list[int] = state["ts"]
    return not times or ts_ms >= times[-1] - allowed_lateness_ms - spec.max_window_ms


def _evict(state: CardState, pos: int, cutoff: int) -> int:
    """Drop events at or below ``cutoff`` except the one at ``pos``; return its new index."""
    times: list[int] = state["ts"]
    count = bisect_right(times, cutoff)
    if count == 0:
        return pos
    if pos < count:
        # The event just applied is itself that old (replayed after its watermark was lost): it stays
        # until the next event, because its own windows must contain it.
        keep = [i for i in range(len(times)) if i >= count or i == pos]
        evicted_max = max(times[i] for i in range(count) if i != pos) if count > 1 else None
        for column in _COLUMNS:
            values = state[column]
            state[column] = [values[i] for i in keep]
        new_pos = 0
    else:
        evicted_max = times[count - 1]
        for column in _COLUMNS:
            del state[column][:count]
        new_pos = pos - count
    if evicted_max is not None:
        state["prev"] = evicted_max if state["prev"] is None else max(state["prev"], evicted_max)
    return new_pos


def _features(state: CardState, pos: int, spec: FeatureSpec) -> tuple[float, ...]:
    """Features of the newest-arrived event at index ``pos``: every other event arrived before it."""
    times: list[int] = state["ts"]
    amounts: list[float] = state["amt"]
    ts_ms, amount = times[pos], amounts[pos]
    hi = pos + 1  # later indices hold later event times
    out: list[float] = []
    means: dict[int, float] = {}
    lows: dict[int, int] = {}
    for w in spec.windows_s:
        lo = lows[w] = bisect_right(times, ts_ms - w * 1000, 0, hi)
        window = amounts[lo:hi]
        total = sum(window)
        mean = means[w] = total / (hi - lo)
        out += [float(hi - lo), float(total), mean, float(max(window))]
    prev = state["prev"]
    if pos:
        out.append((ts_ms - times[pos - 1]) / 1000.0)
    elif prev is not None and prev <= ts_ms:
        out.append((ts_ms - prev) / 1000.0)
    else:
        out.append(-1.0)
    out.append(float(len(set(state["mer"][lows[spec.distinct_window_s]:hi]))))
    mean = means[spec.ratio_window_s]
    out.append(amount / mean if mean else 0.0)
    return tuple(out)


def _replayed_features(state: CardState, index: int, spec: FeatureSpec) -> tuple[float, ...]:
    """Features of an already-applied event: only events that arrived no later than it count.

    Deliberately not shared with ``_features``: the hot path's slices and inlined aggregates are ~10 %
    faster than a common helper; the reference tests hold both to the same definition.
    """
    seq, ts_ms, amount = state["seq"][index], state["ts"][index], state["amt"][index]
    rows = [(t, a, m, s) for t, a, m, s in zip(state["ts"], state["amt"], state["mer"], state["seq"], strict=True)
            if s <= seq and t <= ts_ms]
    out: list[float] = []
    means: dict[int, float] = {}
    merchants: dict[int, int] = {}
    for w in spec.windows_s:
        lower = ts_ms - w * 1000
        window = [a for t, a, _, _ in rows if t > lower]
        total = sum(window)
        means[w] = total / len(window)
        merchants[w] = len({m for t, _, m, _ in rows if t > lower})
        out += [float(len(window)), float(total), means[w], float(max(window))]
    previous = [t for t, _, _, s in rows if s != seq]
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

    def observe(self, ts_ms: int) -> bool:
        """Advance the watermark with an on-time event; say whether it moved."""
        if self.max_ts is None or ts_ms > self.max_ts:
            self.max_ts = ts_ms
            return True
        return False
