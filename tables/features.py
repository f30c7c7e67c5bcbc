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
events down to ``card_max_ts - allowed_lateness - 2·W`` and evicts the rest (a large state, once they
are a 32nd of it). ``prev`` keeps the
highest evicted time for ``secs_since_prev``.

Sums are correctly rounded (the exact sum of the window's amounts, rounded once), so every way of
computing a window gives the same float: a redelivered event gets exactly its first features.

Hot keys. Slices cost what a window holds, so a card with thousands of events per window would pay
that on every event. Once a card holds ``HOT_EVENTS`` events it gets a :class:`_WindowIndex`, kept in
memory beside the state (never stored: it is rebuilt from the columns when a loaded card turns hot):
the set of its ids, exact prefix sums of its amounts (fixed-point integers), the staircase of
suffix maxima for ``max`` and, for distinct merchants, the merchant counts of the window that ends at
the card's highest time. A new event's windows then cost a bisection, two subtractions and a
staircase lookup each, and its distinct count is that anchored count corrected by the events between
the two windows' edges: work that grows with how far out of order it arrived, not with the window.
The index changes no result: the reference tests run with every card hot and with none.
"""

from __future__ import annotations

import hashlib
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from math import fsum
from typing import Any

__all__ = [
    "DEFAULT_SPEC", "HOT_EVENTS", "Applied", "CardState", "FeatureSpec", "Watermark", "apply_event", "event_ids",
    "feature_set_version", "has_event",
    "latest_features", "memory_bytes", "new_state", "replayable", "upgrade_state",
]

HOT_EVENTS = 96  # a card holding this many events gets a _WindowIndex (below, slices are as fast)
# What a card's state costs in memory, measured with tracemalloc on decoded states (synthetic cards:
# ids of about 20 characters, interned merchants): the dict, its lists and the cache's entries; each
# event held (five list slots, its id, time, amount and arrival number); an indexed event's share
# of the index (an id-set slot, a prefix sum). tests/unit/test_card_store.py holds them to the measure.
CARD_BYTES = 1_500
EVENT_BYTES = 190
INDEXED_EVENT_BYTES = 100


class CardState(dict[str, Any]):
    """A card's state: a plain dict of columns (what is stored), plus its in-memory window index."""

    __slots__ = ("index",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.index: _WindowIndex | None = None


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
    return CardState(n=0, prev=None, ts=[], amt=[], mer=[], id=[], seq=[])


_COLUMNS = ("ts", "amt", "mer", "id", "seq")


def upgrade_state(state: dict[str, Any]) -> CardState:
    """Bring a stored state written by an earlier seam (rows under ``"ev"``) to the current layout."""
    if "ev" not in state:
        return state if isinstance(state, CardState) else CardState(state)
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


def has_event(state: CardState, event_id: str) -> bool:
    """Say whether ``state`` holds the event ``event_id`` (applied and not yet evicted)."""
    index = state.index if isinstance(state, CardState) else None
    if index is not None and index.fits(state):
        return event_id in index.ids
    return event_id in state["id"]


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
    times: list[int] = state["ts"]
    index = _index_of(state, spec) if len(times) >= HOT_EVENTS and type(state) is CardState else None
    if event_id in (ids if index is None else index.ids):
        return Applied(_replayed_features(state, ids.index(event_id), spec), True)
    state["n"] += 1
    pos = bisect_right(times, ts_ms)
    times.insert(pos, ts_ms)
    state["amt"].insert(pos, amount)
    state["mer"].insert(pos, merchant_id)
    ids.insert(pos, event_id)
    state["seq"].insert(pos, state["n"])
    if index is not None:
        index.insert(state, pos)
    pos = _evict(state, pos, times[-1] - allowed_lateness_ms - 2 * spec.max_window_ms, index)
    if index is None or state.index is None:
        return Applied(_features(state, pos, spec), False)
    index.stamp = (state["n"], len(times))
    return Applied(_indexed_features(state, pos, spec, index), False)


def memory_bytes(events_held: int) -> int:
    """About how much memory a card state holding ``events_held`` events takes (what the cache is sized in)."""
    per_event = EVENT_BYTES + (INDEXED_EVENT_BYTES if events_held >= HOT_EVENTS else 0)
    return CARD_BYTES + events_held * per_event


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


def _index_of(state: CardState, spec: FeatureSpec) -> _WindowIndex | None:
    """The window index of a card holding ``HOT_EVENTS`` events or more: kept, or built from its columns."""
    index = state.index
    if index is not None and index.spec is spec and index.fits(state):
        return index
    state.index = index = _WindowIndex(state, spec) if state["ts"] else None
    return index


def _evict(state: CardState, pos: int, cutoff: int, index: _WindowIndex | None) -> int:
    """Drop events at or below ``cutoff`` except the one at ``pos``; return its new index.

    Removing from the front of the columns moves what they hold, so a large state evicts once a
    1/32 of it is due, not at every event: events below the cutoff are in no window and no replay.
    """
    times: list[int] = state["ts"]
    count = bisect_right(times, cutoff)
    if count <= len(times) >> 5:
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
        if index is not None:
            state.index = None  # rare: rebuilt at the card's next event
    else:
        evicted_max = times[count - 1]
        if index is not None:
            index.evict(state, count)
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
        total = fsum(window)
        mean = means[w] = total / (hi - lo)
        out += [float(hi - lo), total, mean, float(max(window))]
    prev = state["prev"]  # _secs_since_prev, inlined on the path most events take
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


def _indexed_features(state: CardState, pos: int, spec: FeatureSpec, index: _WindowIndex) -> tuple[float, ...]:
    """``_features`` for a hot card: the same values, from its window index instead of slices."""
    times: list[int] = state["ts"]
    amounts: list[float] = state["amt"]
    ts_ms, amount = times[pos], amounts[pos]
    hi = pos + 1
    sums, unit = index.sums, index.unit
    out: list[float] = []
    means: dict[int, float] = {}
    lows: dict[int, int] = {}
    for w in spec.windows_s:
        lo = lows[w] = bisect_right(times, ts_ms - w * 1000, 0, hi)
        total = (sums[hi] - sums[lo]) / unit  # int / int: the exact sum, correctly rounded, as fsum gives
        mean = means[w] = total / (hi - lo)
        out += [float(hi - lo), total, mean, index.maximum(amounts, lo, hi)]
    out.append(_secs_since_prev(state, pos))
    out.append(float(index.distinct(state, lows[spec.distinct_window_s], pos)))
    mean = means[spec.ratio_window_s]
    out.append(amount / mean if mean else 0.0)
    return tuple(out)


def _secs_since_prev(state: CardState, pos: int) -> float:
    """Seconds from the event at ``pos`` back to the latest earlier-arrived one at or before it (-1: none)."""
    ts_ms = state["ts"][pos]
    prev = state["prev"]
    if pos:
        return (ts_ms - state["ts"][pos - 1]) / 1000.0
    if prev is not None and prev <= ts_ms:
        return (ts_ms - prev) / 1000.0
    return -1.0


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
        total = fsum(window)
        means[w] = total / len(window)
        merchants[w] = len({m for t, _, m, _ in rows if t > lower})
        out += [float(len(window)), total, means[w], float(max(window))]
    previous = [t for t, _, _, s in rows if s != seq]
    if state["prev"] is not None and state["prev"] <= ts_ms:
        previous.append(state["prev"])
    out.append((ts_ms - max(previous)) / 1000.0 if previous else -1.0)
    out.append(float(merchants[spec.distinct_window_s]))
    mean = means[spec.ratio_window_s]
    out.append(amount / mean if mean else 0.0)
    return tuple(out)


def _fraction_bits(amount: float) -> int:
    """The binary digits after the point that ``amount`` needs to be held exactly."""
    return amount.as_integer_ratio()[1].bit_length() - 1


class _WindowIndex:
    """What makes a hot card's features cost the same whatever its windows hold (in memory only).

    * ``ids``: the card's event ids, for the duplicate check;
    * ``sums``: exact prefix sums of the amounts in event-time order, as integers in units of
      ``2**-bits`` (``bits`` grows when an amount needs more): a window's sum is one subtraction,
      exact, and rounded once;
    * ``stair``: the positions (plus ``base``, the events evicted since the index was built) whose
      amount exceeds every amount after them. The first of them at or after a window's start is the
      maximum from there to the end: the window's maximum, unless it lies after the window's end
      (an event that arrived out of order, below a higher later one), where the window is scanned;
    * ``merchants``: the merchant counts of the distinct window that ends at ``anchor``, the card's
      highest event time. Events arrive mostly in order, so a new event's distinct window is that one
      corrected by the few events between the two windows' edges.
    """

    __slots__ = ("anchor", "base", "bits", "ids", "merchants", "spec", "stair", "stamp", "sums", "unit",
                 "window_ms")

    def __init__(self, state: CardState, spec: FeatureSpec) -> None:
        self.spec = spec
        self.window_ms = spec.distinct_window_s * 1000
        self.ids = set(state["id"])
        amounts: list[float] = state["amt"]
        self.bits = max(map(_fraction_bits, amounts), default=0)
        self.unit = 1 << self.bits
        self.sums = sums = [0]
        total = 0
        for amount in amounts:
            numerator, denominator = amount.as_integer_ratio()
            total += numerator << (self.bits - denominator.bit_length() + 1)
            sums.append(total)
        stair: list[int] = []
        for position in range(len(amounts) - 1, -1, -1):
            if not stair or amounts[position] > amounts[stair[-1]]:
                stair.append(position)
        stair.reverse()
        self.stair, self.base = stair, 0
        times: list[int] = state["ts"]
        self.anchor = times[-1]
        self.merchants: dict[str, int] = {}
        for merchant in state["mer"][bisect_right(times, self.anchor - self.window_ms):]:
            self.merchants[merchant] = self.merchants.get(merchant, 0) + 1
        self.stamp = (state["n"], len(times))

    def fits(self, state: CardState) -> bool:
        """Whether the index is of ``state`` as it is now (every change went through :func:`apply_event`)."""
        return self.stamp == (state["n"], len(state["ts"]))

    def insert(self, state: CardState, pos: int) -> None:
        """Take in the event just inserted at ``pos``."""
        amounts: list[float] = state["amt"]
        amount = amounts[pos]
        self.ids.add(state["id"][pos])
        numerator, denominator = amount.as_integer_ratio()
        bits = denominator.bit_length() - 1
        if bits > self.bits:
            self.sums = [total << (bits - self.bits) for total in self.sums]
            self.bits, self.unit = bits, 1 << bits
        value = numerator << (self.bits - bits)
        sums = self.sums
        sums.insert(pos + 1, sums[pos] + value)
        for later in range(pos + 2, len(sums)):  # the events after it in event time: few, mostly none
            sums[later] += value
        stair, base = self.stair, self.base
        after = bisect_left(stair, pos + base)
        for later in range(after, len(stair)):
            stair[later] += 1
        if after == len(stair) or amounts[stair[after] - base] < amount:
            start = after
            while start and amounts[stair[start - 1] - base] <= amount:
                start -= 1
            stair[start:after] = [pos + base]
        times: list[int] = state["ts"]
        ts_ms, merchants, counts = times[pos], state["mer"], self.merchants
        if ts_ms > self.anchor:  # the anchored window moves up: drop what falls out of it
            for merchant in merchants[bisect_right(times, self.anchor - self.window_ms):
                                      bisect_right(times, ts_ms - self.window_ms)]:
                left = counts[merchant] - 1
                if left:
                    counts[merchant] = left
                else:
                    del counts[merchant]
            self.anchor = ts_ms
        if ts_ms > self.anchor - self.window_ms:
            counts[merchants[pos]] = counts.get(merchants[pos], 0) + 1

    def evict(self, state: CardState, count: int) -> None:
        """Forget the ``count`` oldest events, about to be removed (all below the anchored window)."""
        self.ids.difference_update(state["id"][:count])
        del self.sums[:count]
        del self.stair[:bisect_left(self.stair, self.base + count)]
        self.base += count

    def maximum(self, amounts: list[float], lo: int, hi: int) -> float:
        """``max(amounts[lo:hi])``."""
        stair = self.stair
        first = bisect_left(stair, lo + self.base)
        if first < len(stair) and stair[first] - self.base < hi:
            return float(amounts[stair[first] - self.base])
        return float(max(amounts[lo:hi]))

    def distinct(self, state: CardState, lo: int, pos: int) -> int:
        """``len(set(state["mer"][lo:pos + 1]))``, for the distinct window of the event at ``pos``."""
        times: list[int] = state["ts"]
        merchants: list[str] = state["mer"]
        if pos == len(times) - 1:  # the newest event time: the anchored window itself
            return len(self.merchants)
        start = bisect_right(times, self.anchor - self.window_ms)
        if start > pos + 1 or (len(times) - 1 - pos) + (start - lo) > pos + 1 - lo:
            return len(set(merchants[lo:pos + 1]))
        # Its window is the anchored one without the events after it and with those before the anchored start.
        delta: dict[str, int] = {}
        for merchant in merchants[pos + 1:]:
            delta[merchant] = delta.get(merchant, 0) - 1
        for merchant in merchants[lo:start]:
            delta[merchant] = delta.get(merchant, 0) + 1
        counts = self.merchants
        distinct = len(counts)
        for merchant, change in delta.items():
            held = counts.get(merchant, 0)
            if not held and change > 0:
                distinct += 1
            elif held and held + change == 0:
                distinct -= 1
        return distinct


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
