"""Unit tests for tables.features: windows, arrival order, duplicates, eviction, watermark."""

from __future__ import annotations

import gc
import hashlib
import json
import random
import struct
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from tables import features
from tables.features import (
    DEFAULT_SPEC,
    Applied,
    FeatureSpec,
    IdColumn,
    KeyState,
    Watermark,
    apply_event,
    as_plain,
    compact,
    has_event,
    new_state,
    replayable,
    upgrade_state,
)
from tests.specs import fraud_like

pytestmark = pytest.mark.usefixtures("window_paths")  # every test: sliced and indexed windows


def rows(state: KeyState) -> list[list[object]]:
    """The state's events as [seq, ts, amount, merchant, id] rows in arrival order."""
    return sorted([list(r) for r in zip(state["seq"], state["ts"], state["values"][0], state["values"][1], state["id"],
                                        strict=True)])

T = 1_764_500_000_000  # an arbitrary epoch-ms origin
S = 1_000  # one second in ms
LATENESS_MS = 60 * S
PROPERTY = hsettings(max_examples=150, derandomize=True, database=None, deadline=None)

Apply = Callable[..., Applied]


@dataclass(frozen=True, slots=True)
class Ev:
    """One test event."""

    id: str
    ts: int
    amount: float
    merchant: str


@pytest.fixture
def card() -> Callable[..., tuple[KeyState, Apply]]:
    """Factory: a fresh card state and an ``apply(id, ts, amount, merchant)`` bound to it."""

    def make(
        lateness_ms: int = LATENESS_MS, spec: FeatureSpec = DEFAULT_SPEC
    ) -> tuple[KeyState, Apply]:
        state = new_state()

        def apply(event_id: str, ts: int, amount: float = 1.0, merchant: str = "m") -> Applied:
            return apply_event(
                state, event_id, ts, (amount, merchant), allowed_lateness_ms=lateness_ms, spec=spec
            )

        return state, apply

    return make


def feat(applied: Applied, name: str, spec: FeatureSpec = DEFAULT_SPEC) -> float:
    """One named feature of an applied event."""
    return applied.features[spec.names.index(name)]


def window(applied: Applied, w: int) -> tuple[float, float, float, float]:
    """(count, sum, mean, max) of one window."""
    return (
        feat(applied, f"count_{w}"),
        feat(applied, f"amount_sum_{w}"),
        feat(applied, f"amount_mean_{w}"),
        feat(applied, f"amount_max_{w}"),
    )


# --- FeatureSpec ----------------------------------------------------------------------------------


def test_default_spec_names_and_order() -> None:
    """The default spec has 15 names in model order."""
    expected = (
        "count_60",
        "amount_sum_60",
        "amount_mean_60",
        "amount_max_60",
        "count_600",
        "amount_sum_600",
        "amount_mean_600",
        "amount_max_600",
        "count_3600",
        "amount_sum_3600",
        "amount_mean_3600",
        "amount_max_3600",
        "secs_since_prev",
        "distinct_merchants_3600",
        "amount_to_mean_3600",
    )
    assert DEFAULT_SPEC.names == expected
    assert len(DEFAULT_SPEC.names) == 15
    assert DEFAULT_SPEC.max_window_ms == 3_600_000


def test_custom_spec_names_follow_windows() -> None:
    """Names follow the windows given, in their order."""
    spec = fraud_like((30, 120), 30, 120)
    assert spec.names == (
        "count_30",
        "amount_sum_30",
        "amount_mean_30",
        "amount_max_30",
        "count_120",
        "amount_sum_120",
        "amount_mean_120",
        "amount_max_120",
        "secs_since_prev",
        "distinct_merchants_30",
        "amount_to_mean_120",
    )
    assert spec.max_window_ms == 120_000


def test_spec_is_frozen() -> None:
    """A spec cannot be changed after creation."""
    with pytest.raises(AttributeError):
        DEFAULT_SPEC.names = ()  # type: ignore[misc]


def test_custom_spec_feature_vector_length(card: Callable[..., tuple[KeyState, Apply]]) -> None:
    """apply_event returns one value per spec name, computed over the spec's windows."""
    spec = fraud_like((10,), 10, 10)
    _, apply = card(spec=spec)
    apply("a", T, 2.0, "m1")
    b = apply("b", T + 5 * S, 4.0, "m2")
    c = apply("c", T + 12 * S, 6.0, "m1")
    assert len(b.features) == len(spec.names) == 7
    assert b.features == (2.0, 6.0, 3.0, 4.0, 5.0, 2.0, 4.0 / 3.0)
    # (T+2s, T+12s]: only b and c.
    assert c.features == (2.0, 10.0, 5.0, 6.0, 7.0, 2.0, 6.0 / 5.0)


# --- hand-computed cases --------------------------------------------------------------------------


def test_first_event_of_a_card(card: Callable[..., tuple[KeyState, Apply]]) -> None:
    """A card's first event: counts 1, its own amount everywhere, no previous event."""
    state, apply = card()
    a = apply("a", T, 10.0, "m1")
    assert a.duplicate is False
    assert a.features == (
        1.0,
        10.0,
        10.0,
        10.0,
        1.0,
        10.0,
        10.0,
        10.0,
        1.0,
        10.0,
        10.0,
        10.0,
        -1.0,
        1.0,
        1.0,
    )
    assert state["n"] == 1
    assert state["prev"] is None
    assert rows(state) == [[1, T, 10.0, "m1", "a"]]


def test_hand_computed_sequence_with_out_of_order_event(
    card: Callable[..., tuple[KeyState, Apply]],
) -> None:
    """Four events, one arriving out of order, checked against values computed by hand."""
    _, apply = card()
    apply("a", T, 10.0, "m1")
    b = apply("b", T + 30 * S, 20.0, "m2")
    assert window(b, 60) == (2.0, 30.0, 15.0, 20.0)
    assert window(b, 600) == (2.0, 30.0, 15.0, 20.0)
    assert window(b, 3600) == (2.0, 30.0, 15.0, 20.0)
    assert feat(b, "secs_since_prev") == 30.0
    assert feat(b, "distinct_merchants_3600") == 2.0
    assert feat(b, "amount_to_mean_3600") == pytest.approx(20.0 / 15.0)

    c = apply("c", T + 90 * S, 40.0, "m1")
    # 60 s window is (T+30s, T+90s]: b sits exactly 60 s back and is excluded.
    assert window(c, 60) == (1.0, 40.0, 40.0, 40.0)
    assert window(c, 600) == (3.0, 70.0, pytest.approx(70.0 / 3), 40.0)
    assert feat(c, "secs_since_prev") == 60.0
    assert feat(c, "distinct_merchants_3600") == 2.0
    assert feat(c, "amount_to_mean_3600") == pytest.approx(40.0 / (70.0 / 3))

    # d arrives after c but happened before it: c (later ts) is not visible to d.
    d = apply("d", T + 60 * S, 5.0, "m3")
    # (T, T+60s]: a is exactly 60 s back (excluded), b included, c is in d's future.
    assert window(d, 60) == (2.0, 25.0, 12.5, 20.0)
    assert window(d, 3600) == (3.0, 35.0, pytest.approx(35.0 / 3), 20.0)
    assert feat(d, "secs_since_prev") == 30.0  # latest ts <= d.ts is b, not c
    assert feat(d, "distinct_merchants_3600") == 3.0
    assert feat(d, "amount_to_mean_3600") == pytest.approx(5.0 / (35.0 / 3))


def test_window_lower_bound_excluded_upper_bound_included(
    card: Callable[..., tuple[KeyState, Apply]],
) -> None:
    """An event exactly W ago is out; 1 ms later it is in; one at the same ts is in."""
    _, apply = card()
    apply("old", T, 100.0, "m1")
    apply("just-in", T + 1, 7.0, "m2")
    e = apply("e", T + 60 * S, 1.0, "m3")
    assert window(e, 60) == (2.0, 8.0, 4.0, 7.0)
    assert window(e, 600) == (3.0, 108.0, 36.0, 100.0)

    _, apply2 = card()
    apply2("x", T, 3.0, "m1")
    same = apply2("y", T, 5.0, "m2")
    assert window(same, 60) == (2.0, 8.0, 4.0, 5.0)
    assert feat(same, "secs_since_prev") == 0.0


@pytest.mark.parametrize("w", [60, 600, 3600])
def test_each_window_boundary(card: Callable[..., tuple[KeyState, Apply]], w: int) -> None:
    """For every window, the event exactly W seconds back is excluded and W-1ms back included."""
    _, apply = card()
    apply("edge", T, 1000.0, "m1")
    apply("inside", T + 1, 10.0, "m2")
    e = apply("e", T + w * S, 1.0, "m3")
    count, total, _, biggest = window(e, w)
    assert (count, total, biggest) == (2.0, 11.0, 10.0)


def test_later_ts_event_that_arrived_earlier_is_excluded(
    card: Callable[..., tuple[KeyState, Apply]],
) -> None:
    """An event with a later ts that arrived first is not in an earlier event's windows."""
    _, apply = card()
    apply("future", T + 10 * S, 500.0, "m9")
    e = apply("e", T, 4.0, "m1")
    assert e.features == (
        1.0,
        4.0,
        4.0,
        4.0,
        1.0,
        4.0,
        4.0,
        4.0,
        1.0,
        4.0,
        4.0,
        4.0,
        -1.0,
        1.0,
        1.0,
    )


def test_events_arriving_later_are_never_seen_by_earlier_ones(
    card: Callable[..., tuple[KeyState, Apply]],
) -> None:
    """Re-scoring an earlier event (redelivery) ignores everything that arrived after it."""
    _, apply = card()
    first = apply("a", T + 100 * S, 10.0, "m1")
    apply("b", T + 90 * S, 20.0, "m2")  # earlier ts, arrived later
    apply("c", T + 100 * S, 30.0, "m3")  # same ts, arrived later
    again = apply("a", T + 100 * S, 10.0, "m1")
    assert again.duplicate is True
    assert again.features == first.features
    assert feat(again, "count_60") == 1.0
    assert feat(again, "secs_since_prev") == -1.0


def test_secs_since_prev_first_is_minus_one_then_gap(
    card: Callable[..., tuple[KeyState, Apply]],
) -> None:
    """-1 for the first event, then the gap in seconds to the latest earlier ts."""
    _, apply = card()
    assert feat(apply("a", T, 1.0), "secs_since_prev") == -1.0
    assert feat(apply("b", T + 2_500, 1.0), "secs_since_prev") == 2.5
    assert feat(apply("c", T + 1_000, 1.0), "secs_since_prev") == 1.0  # prev is a, not b
    assert feat(apply("d", T + 2_750, 1.0), "secs_since_prev") == 0.25


def test_secs_since_prev_spans_beyond_all_windows(
    card: Callable[..., tuple[KeyState, Apply]],
) -> None:
    """The previous event counts even if it is outside every window (but not yet evicted)."""
    _, apply = card(lateness_ms=10 * 60 * S)
    apply("a", T, 1.0)
    b = apply("b", T + 3605 * S, 2.0)
    assert feat(b, "count_3600") == 1.0
    assert feat(b, "secs_since_prev") == 3605.0


def test_secs_since_prev_survives_eviction(card: Callable[..., tuple[KeyState, Apply]]) -> None:
    """After the previous event is evicted, state["prev"] still provides the gap."""
    state, apply = card(lateness_ms=LATENESS_MS)
    apply("a", T, 1.0)
    horizon = DEFAULT_SPEC.horizon_ms
    b = apply("b", T + horizon + 1, 2.0)
    assert [row[4] for row in rows(state)] == ["b"]  # a was evicted
    assert state["prev"] == T
    assert feat(b, "secs_since_prev") == pytest.approx((horizon + 1) / 1000)
    assert window(b, 3600) == (1.0, 2.0, 2.0, 2.0)
    c = apply("c", T + horizon + 501, 3.0)
    assert feat(c, "secs_since_prev") == 0.5


def test_eviction_boundary_is_inclusive(card: Callable[..., tuple[KeyState, Apply]]) -> None:
    """An event exactly at max_ts - the horizon (lateness, replay allowance, largest window) is evicted; 1 ms
    newer is kept."""
    state, apply = card(lateness_ms=LATENESS_MS)
    horizon = DEFAULT_SPEC.horizon_ms
    apply("a", T, 1.0)
    apply("b", T + 1, 1.0)
    apply("c", T + horizon, 1.0)
    assert [row[4] for row in rows(state)] == ["b", "c"]
    assert state["prev"] == T


def test_prev_keeps_the_max_evicted_ts(card: Callable[..., tuple[KeyState, Apply]]) -> None:
    """state["prev"] is the maximum evicted ts, not that of the last-arrived evicted event."""
    state, apply = card(lateness_ms=LATENESS_MS)
    horizon = DEFAULT_SPEC.horizon_ms
    apply("a", T + 50 * S, 1.0)
    apply("b", T, 1.0)  # on time: not below T+50s - 60s
    apply("c", T + 50 * S + horizon, 1.0)  # cutoff T+50s: evicts a and b together
    assert [row[4] for row in rows(state)] == ["c"]
    assert state["prev"] == T + 50 * S
    apply("d", T + 50 * S + 2 * horizon, 1.0)  # evicts c
    assert [row[4] for row in rows(state)] == ["d"]
    assert state["prev"] == T + 50 * S + horizon


def test_distinct_merchants_count_only_the_3600_window(
    card: Callable[..., tuple[KeyState, Apply]],
) -> None:
    """distinct_merchants_3600 counts distinct merchants of visible events in (ts-3600s, ts]."""
    _, apply = card(lateness_ms=3 * 3600 * S)
    apply("a", T, 1.0, "m-old")
    apply("b", T + 10 * S, 1.0, "m1")
    apply("c", T + 20 * S, 1.0, "m1")
    apply("d", T + 30 * S, 1.0, "m2")
    apply("future", T + 4000 * S, 1.0, "m-future")  # arrives now, happens later
    e = apply("e", T + 3600 * S, 1.0, "m2")  # a is exactly 3600 s back
    assert feat(e, "distinct_merchants_3600") == 2.0
    assert feat(e, "count_3600") == 4.0


def test_amount_to_mean_ratio(card: Callable[..., tuple[KeyState, Apply]]) -> None:
    """amount_to_mean_3600 is the amount over the 3600 s mean (including itself)."""
    _, apply = card()
    apply("a", T, 10.0)
    apply("b", T + S, 10.0)
    c = apply("c", T + 2 * S, 100.0)
    assert feat(c, "amount_mean_3600") == 40.0
    assert feat(c, "amount_to_mean_3600") == 2.5


def test_amount_to_mean_is_zero_when_mean_is_zero(
    card: Callable[..., tuple[KeyState, Apply]],
) -> None:
    """A zero mean (e.g. a refund cancelling a charge) gives ratio 0, not a division error."""
    _, apply = card()
    assert feat(apply("z", T, 0.0), "amount_to_mean_3600") == 0.0
    _, apply2 = card()
    apply2("charge", T, 10.0)
    refund = apply2("refund", T + S, -10.0)
    assert feat(refund, "amount_mean_3600") == 0.0
    assert feat(refund, "amount_to_mean_3600") == 0.0


def test_amount_max_with_negative_amounts(card: Callable[..., tuple[KeyState, Apply]]) -> None:
    """amount_max is the true maximum, also when every amount is negative."""
    _, apply = card()
    apply("a", T, -5.0)
    b = apply("b", T + S, -2.0)
    assert feat(b, "amount_max_60") == -2.0
    assert feat(b, "amount_sum_60") == -7.0


def test_features_are_floats(card: Callable[..., tuple[KeyState, Apply]]) -> None:
    """Every feature value is a Python float (model input and JSON friendly)."""
    _, apply = card()
    apply("a", T, 3)
    b = apply("b", T + S, 4)
    assert all(type(v) is float for v in b.features)


# --- duplicates -----------------------------------------------------------------------------------


def test_duplicate_returns_first_features_after_more_events(
    card: Callable[..., tuple[KeyState, Apply]],
) -> None:
    """A redelivered id is flagged and scored exactly as the first time, whatever came after."""
    state, apply = card()
    apply("a", T, 10.0, "m1")
    first = apply("b", T + 20 * S, 30.0, "m2")
    for i in range(5):
        apply(f"x{i}", T + (10 + i) * S, 7.0 + i, f"m{i}")  # earlier ts, arrive later
        apply(f"y{i}", T + (25 + i) * S, 9.0, "m1")
    n_before = state["n"]
    rows_before = [list(r) for r in rows(state)]
    again = apply("b", T + 20 * S, 30.0, "m2")
    assert again.duplicate is True
    assert again.features == first.features
    assert first.duplicate is False
    assert state["n"] == n_before
    assert rows(state) == rows_before


def test_duplicate_uses_stored_values_not_the_redelivered_ones(
    card: Callable[..., tuple[KeyState, Apply]],
) -> None:
    """A duplicate id with different ts/amount is still scored with the stored event's values."""
    _, apply = card()
    apply("a", T, 10.0, "m1")
    first = apply("b", T + 5 * S, 20.0, "m2")
    again = apply("b", T + 9_999 * S, 999.0, "m9")
    assert again.duplicate is True
    assert again.features == first.features


def test_duplicate_of_first_event(card: Callable[..., tuple[KeyState, Apply]]) -> None:
    """The very first event, replayed later, still has no previous event."""
    _, apply = card()
    first = apply("a", T + 50 * S, 1.0)
    apply("b", T, 2.0)
    again = apply("a", T + 50 * S, 1.0)
    assert again == Applied(first.features, True)
    assert feat(again, "secs_since_prev") == -1.0


# --- state ----------------------------------------------------------------------------------------


def test_new_state_shape() -> None:
    """A new state is empty: one column each (nothing shared that a change could reach)."""
    state, other = new_state(), new_state()
    assert state == {"n": 0, "prev": None, "pv": None, "ts": (), "id": (), "seq": (), "values": ((), ())}
    assert state["ts"] is not other["ts"] and state["seq"] is not other["seq"]


def test_a_cached_keys_columns_take_events_in_place(monkeypatch: pytest.MonkeyPatch) -> None:
    """Below HOT_EVENTS a state's columns are arrays of numbers (which hold no objects), its ids one
    string (IdColumn) and lists of other strings, and each takes a new event in place: once a young
    collection has seen a key, its later events make no new object that holds its values, so no collection
    walks them again (a worker freezes what each young collection leaves, app.scoring). A hot key keeps its
    numbers in lists too (its window index follows them in place) and gets arrays back once it is compacted
    without one."""
    monkeypatch.setattr(features, "HOT_EVENTS", 96)
    monkeypatch.setattr(features, "INDEX_AFTER", 0)
    rng = random.Random(8)
    state = new_state()
    for i in range(95):  # out of order, and over 2 h: eviction (and "pv") along the way
        ts = T + i * 90 * S - rng.randrange(0, LATENESS_MS)
        apply_event(state, f"e{i}", ts, (float(i), f"m{i % 3}"), allowed_lateness_ms=LATENESS_MS)
    assert state["prev"] is not None
    columns = [state[name] for name in ("ts", "id", "seq", "values")] + list(state["values"])
    assert [type(column) for column in columns] == [array, IdColumn, array, tuple, array, list]
    held = len(state["ts"])
    gc.collect(0)
    gc.freeze()
    try:
        apply_event(state, "e95", max(state["ts"]) - S, (95.0, "m2"), allowed_lateness_ms=LATENESS_MS)  # out of order
        young = gc.get_objects(0)
    finally:
        gc.unfreeze()
    assert len(state["ts"]) == held + 1
    assert all(now is before for now, before in zip([state[name] for name in ("ts", "id", "seq", "values")]
                                                    + list(state["values"]), columns, strict=True))
    assert not [obj for obj in young if isinstance(obj, (list, tuple)) and len(obj) > held // 2]
    hot = new_state()
    for i in range(97):
        apply_event(hot, f"e{i}", T + i * S, (float(i), "m"), allowed_lateness_ms=LATENESS_MS)
    assert hot.index is not None and type(hot["ts"]) is list and type(hot["values"][0]) is list
    hot.index = None
    compact(hot)
    assert [type(hot[name]) for name in ("ts", "id", "seq")] == [array, IdColumn, array]
    assert [type(column) for column in hot["values"]] == [array, list]


_ID_TEXT = st.text(alphabet="ab\x00\x01", max_size=4)  # the separator and the escape inside ids, and empty ids


@hsettings(max_examples=300, derandomize=True, database=None, deadline=None)
@given(st.lists(_ID_TEXT, max_size=8), st.lists(st.tuples(st.sampled_from(["insert", "drop"]), st.integers(0, 12),
                                                          _ID_TEXT), max_size=12))
def test_an_id_column_holds_any_ids_as_a_list_would(start: list[str], steps: list[tuple[str, int, str]]) -> None:
    """Whatever its ids hold (NUL, the escape, nothing), an IdColumn answers as the list of them would: its
    items, slices, membership, positions, and after inserts anywhere and drops of its oldest."""
    column, model = IdColumn(start), list(start)
    for step, number, event_id in steps:
        if step == "insert":
            pos = number % (len(model) + 1)
            column.insert(pos, event_id)
            model.insert(pos, event_id)
        else:
            count = number % (len(model) + 1)
            del column[:count]
            del model[:count]
        assert len(column) == len(model) and column == model and list(column) == model
        assert column[1:3] == model[1:3] and (not model or column[-1] == model[-1])
        for probe in {*model, "a", "\x00", "", "a\x00b", "\x01"}:
            assert (probe in column) == (probe in model)
            if probe in model:
                assert column.index(probe) == model.index(probe)
    assert IdColumn(model) == column and IdColumn(iter(model)) == model


@hsettings(max_examples=200, derandomize=True, database=None, deadline=None)
@given(st.lists(_ID_TEXT, min_size=30, max_size=80), st.lists(st.tuples(st.integers(-90, 90), st.integers(-90, 90),
                                                                         st.sampled_from([None, 1, 2, -1])),
                                                               min_size=1, max_size=20))
def test_slices_of_a_long_id_column_are_the_lists(ids: list[str], slices: list[tuple[int, int, int | None]]) -> None:
    """A column of 32 ids or more slices its newest ids off the end of its text (what a flush writes): every
    slice, escaped ids included, is the list's."""
    column = IdColumn(ids)
    for start, stop, step in slices:
        for part in (slice(start, stop, step), slice(start, None), slice(None, stop), slice(len(ids) - 16, None)):
            assert column[part] == ids[part]


def test_state_survives_a_json_round_trip() -> None:
    """State is JSON friendly: serialising it between events changes no feature."""
    rng = random.Random(5)
    # Events 40 s apart over ~2.2 hours (so eviction happens), jittered within the allowed lateness.
    events = [
        Ev(
            f"e{i}",
            T + i * 40 * S - rng.randrange(0, LATENESS_MS),
            float(rng.randrange(1, 500)),
            f"m{rng.randrange(4)}",
        )
        for i in range(200)
    ]
    plain, through_json = new_state(), new_state()
    for ev in events:
        a = apply_event(
            plain, ev.id, ev.ts, (ev.amount, ev.merchant), allowed_lateness_ms=LATENESS_MS
        )
        through_json = json.loads(json.dumps(as_plain(through_json)))
        b = apply_event(
            through_json, ev.id, ev.ts, (ev.amount, ev.merchant), allowed_lateness_ms=LATENESS_MS
        )
        assert a == b
    assert plain["prev"] is not None  # eviction happened along the way
    assert as_plain(plain) == json.loads(json.dumps(through_json))  # arrays and tuples (plain), lists (JSON)


def test_eviction_keeps_state_bounded() -> None:
    """10,000 events over ~83 hours keep only what on-time events and redeliveries can still need."""
    rng = random.Random(42)
    state = new_state()
    horizon = DEFAULT_SPEC.horizon_ms  # 4260 s: lateness, the replay allowance and the largest window
    spacing = 30 * S
    applied: list[int] = []
    max_ts = 0
    longest = 0
    for i in range(10_000):
        ts = T + i * spacing - rng.randrange(0, LATENESS_MS)  # jitter within the allowed lateness
        apply_event(state, f"e{i}", ts, (1.0, "m"), allowed_lateness_ms=LATENESS_MS)
        applied.append(ts)
        max_ts = max(max_ts, ts)
        longest = max(longest, len(rows(state)))
        if i % 997 == 0 or i == 9_999:
            # The events newer than max_ts - horizon are kept, and older ones only while they are
            # at most a 32nd of the state (eviction moves the columns, so it waits for a few).
            kept = sorted(row[1] for row in rows(state))
            needed = sorted(t for t in applied if t > max_ts - horizon)
            assert kept[len(kept) - len(needed):] == needed
            assert len(kept) - len(needed) <= len(kept) // 32
    # 4260 s of events 30 s apart (plus the jitter band) is far below 10,000.
    bound = horizon // spacing + LATENESS_MS // spacing + 2
    assert longest <= bound + bound // 31 + 1
    assert state["n"] == 10_000
    assert state["prev"] is not None and state["prev"] <= max_ts - horizon


def test_eviction_keeps_sequence_numbers_increasing(
    card: Callable[..., tuple[KeyState, Apply]],
) -> None:
    """Eviction removes rows but never renumbers: seq keeps growing with each new event."""
    state, apply = card(lateness_ms=0)
    for i in range(10):
        apply(f"e{i}", T + i * 3600 * S, 1.0)
    assert state["n"] == 10
    assert [row[0] for row in rows(state)] == [9, 10]  # 2 h retention (lateness 0): e8 and e9 remain


# --- watermark ------------------------------------------------------------------------------------


def test_watermark_none_before_first_event() -> None:
    """No event seen: no watermark, and nothing is late."""
    wm = Watermark(LATENESS_MS)
    assert wm.value is None
    assert wm.max_ts is None
    assert wm.is_late(0) is False
    assert wm.is_late(T) is False


def test_watermark_is_late_is_strict() -> None:
    """Late means strictly below max_ts - lateness."""
    wm = Watermark(LATENESS_MS)
    wm.observe(T)
    assert wm.value == T - LATENESS_MS
    assert wm.is_late(T - LATENESS_MS) is False
    assert wm.is_late(T - LATENESS_MS - 1) is True
    assert wm.is_late(T + 5 * S) is False


def test_watermark_only_advances() -> None:
    """Observing an older ts does not move the watermark back."""
    wm = Watermark(LATENESS_MS)
    wm.observe(T)
    wm.observe(T - 30 * S)
    assert wm.max_ts == T
    wm.observe(T + 10 * S)
    assert wm.max_ts == T + 10 * S
    assert wm.value == T + 10 * S - LATENESS_MS
    wm.observe(T + 10 * S)
    assert wm.max_ts == T + 10 * S


def test_watermark_with_zero_lateness_and_initial_max() -> None:
    """Zero lateness: anything below the max is late; an initial max_ts is honoured."""
    wm = Watermark(0, max_ts=T)
    assert wm.value == T
    assert wm.is_late(T - 1) is True
    assert wm.is_late(T) is False


@PROPERTY
@given(
    st.lists(st.integers(min_value=0, max_value=10**7), min_size=1, max_size=50),
    st.integers(min_value=0, max_value=10**6),
)
def test_watermark_property(times: list[int], lateness: int) -> None:
    """The watermark is always the running max minus lateness, and late is strictly below it."""
    wm = Watermark(lateness)
    running: int | None = None
    for t in times:
        expected_late = running is not None and t < running - lateness
        assert wm.is_late(t) is expected_late
        wm.observe(t)
        running = t if running is None else max(running, t)
        assert wm.value == running - lateness


# --- property: incremental == brute force ---------------------------------------------------------


def brute_force(history: Sequence[Ev], e: Ev) -> list[float]:
    """The example spec's features of ``e`` straight from the definition; ``history`` = events applied before ``e``."""
    seen = [*history, e]
    out: list[float] = []
    means: dict[int, float] = {}
    distinct: dict[int, int] = {}
    for w in (60, 600, 3600):
        s_w = [x for x in seen if e.ts - w * 1000 < x.ts <= e.ts]
        amounts = [x.amount for x in s_w]
        mean = sum(amounts) / len(amounts)
        means[w] = mean
        distinct[w] = len({x.merchant for x in s_w})
        out += [float(len(s_w)), float(sum(amounts)), mean, float(max(amounts))]
    earlier = [x.ts for x in history if x.ts <= e.ts]
    out.append((e.ts - max(earlier)) / 1000 if earlier else -1.0)
    out.append(float(distinct[3600]))
    ratio_mean = means[3600]
    out.append(e.amount / ratio_mean if ratio_mean else 0.0)
    return out


BOUNDARY_OFFSETS = [0, 1, 59_999, 60_000, 60_001, 599_999, 600_000, 600_001, 3_599_999]
ts_offsets = st.one_of(
    st.integers(min_value=0, max_value=3_599_999),  # anywhere within one hour
    st.integers(min_value=0, max_value=180_000),  # clustered: many share short windows
    st.sampled_from(BOUNDARY_OFFSETS),  # exact window boundaries against each other
)
amounts = st.integers(min_value=0, max_value=1_000_000).map(lambda cents: cents / 100)
merchants = st.sampled_from(["m1", "m2", "m3", "m4"])
event_lists = st.lists(st.tuples(ts_offsets, amounts, merchants), min_size=1, max_size=40)


@PROPERTY
@given(event_lists, st.integers(min_value=0, max_value=120_000))
def test_incremental_equals_brute_force(
    raw: list[tuple[int, float, str]], lateness_ms: int
) -> None:
    """Without eviction (span < 1 h), incremental features equal the definition (one at a time)."""
    state = new_state()
    history: list[Ev] = []
    for i, (offset, amount, merchant) in enumerate(raw):
        e = Ev(f"e{i}", T + offset, amount, merchant)
        applied = apply_event(
            state, e.id, e.ts, (e.amount, e.merchant), allowed_lateness_ms=lateness_ms
        )
        assert applied.duplicate is False
        assert list(applied.features) == pytest.approx(brute_force(history, e), rel=1e-9, abs=1e-9)
        history.append(e)
    assert state["prev"] is None  # nothing was evicted
    assert len(rows(state)) == len(raw)


replays = st.lists(
    st.tuples(st.integers(min_value=0, max_value=39), st.integers(min_value=0, max_value=39)),
    max_size=20,
)


@PROPERTY
@given(event_lists, replays)
def test_redeliveries_are_scored_like_the_first_time(
    raw: list[tuple[int, float, str]],
    redeliver: list[tuple[int, int]],
) -> None:
    """Interleaved redeliveries are flagged and reproduce the first features; state is unchanged."""
    state = new_state()
    events = [
        (f"e{i}", T + offset, amount, merchant) for i, (offset, amount, merchant) in enumerate(raw)
    ]
    order: list[tuple[str, int, float, str]] = []
    for i, event in enumerate(events):
        order.append(event)
        # (after, which): after event `after` arrived, event `which` (already seen) comes again.
        order += [events[which] for after, which in redeliver if after == i and which <= i]
    first: dict[str, tuple[float, ...]] = {}
    for event_id, ts, amount, merchant in order:
        n_before, rows_before = state["n"], [list(r) for r in rows(state)]
        applied = apply_event(
            state, event_id, ts, (amount, merchant), allowed_lateness_ms=LATENESS_MS
        )
        if event_id in first:
            assert applied.duplicate is True
            assert applied.features == first[event_id]
            assert (state["n"], rows(state)) == (n_before, rows_before)
        else:
            assert applied.duplicate is False
            first[event_id] = applied.features
    assert state["n"] == len(events)


def test_state_written_by_an_earlier_layout_is_upgraded_and_keeps_its_results() -> None:
    """A stored state with rows under "ev" ([seq, ts, amount, merchant, id]) becomes the sorted layout."""
    old = {"n": 3, "prev": T - 10 * S, "ev": [[1, T, 5.0, "m1", "a"], [2, T + 30 * S, 7.0, "m2", "b"],
                                              [3, T + 10 * S, 1.0, "m1", "c"]]}
    state = upgrade_state(json.loads(json.dumps(old)))
    assert list(state["ts"]) == [T, T + 10 * S, T + 30 * S] and list(state["seq"]) == [1, 3, 2]
    assert upgrade_state(state) is state  # current layout passes through
    fresh = new_state()
    fresh["prev"] = T - 10 * S
    for event_id, ts, amount, merchant in (("a", T, 5.0, "m1"), ("b", T + 30 * S, 7.0, "m2"),
                                           ("c", T + 10 * S, 1.0, "m1")):
        apply_event(fresh, event_id, ts, (amount, merchant), allowed_lateness_ms=LATENESS_MS)
    assert state == fresh
    after_old = apply_event(state, "d", T + 40 * S, (2.0, "m3"), allowed_lateness_ms=LATENESS_MS)
    after_fresh = apply_event(fresh, "d", T + 40 * S, (2.0, "m3"), allowed_lateness_ms=LATENESS_MS)
    assert after_old == after_fresh


def _outcomes(events: Sequence[tuple[str, int, float, str]], hot_events: int,
              monkeypatch: pytest.MonkeyPatch, index_after: int = 0) -> tuple[list[Applied | None], KeyState]:
    """Route and apply ``events`` (one card, one partition) as the pipeline does; None for a late one."""
    monkeypatch.setattr(features, "HOT_EVENTS", hot_events)
    monkeypatch.setattr(features, "INDEX_AFTER", index_after)
    state, watermark = new_state(), Watermark(LATENESS_MS)
    out: list[Applied | None] = []
    for event_id, ts, amount, merchant in events:
        if watermark.is_late(ts) and not (
                has_event(state, event_id) and replayable(state, ts, allowed_lateness_ms=LATENESS_MS)):
            out.append(None)
            continue
        watermark.observe(ts)
        out.append(apply_event(state, event_id, ts, (amount, merchant), allowed_lateness_ms=LATENESS_MS))
    return out, state


@pytest.mark.parametrize("seed", range(40))
def test_indexed_windows_give_exactly_the_sliced_features(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Bit for bit, whatever the spacing, disorder, amounts (any binary exponent) and redeliveries, and for a
    card that turns hot midway: the index changes no feature (sums are exact, so order cannot matter)."""
    rng = random.Random(seed)
    step = rng.choice([10, 1_000, 20 * S, 200 * S])
    jitter = rng.choice([0, 500, 5 * S, 90 * S])
    events: list[tuple[str, int, float, str]] = []
    for i in range(rng.randrange(50, 400)):
        amount = rng.choice([round(rng.uniform(0, 500), 2), rng.random() * 1e-3, float(rng.randrange(5)),
                             rng.uniform(1, 2) * 2.0 ** rng.randrange(-60, 40)])
        events.append((f"e{i}", T + i * step + int(rng.uniform(-jitter, jitter)), amount,
                       f"m{rng.randrange(rng.choice([1, 5, 100]))}"))
        if rng.random() < 0.1:
            events.append(rng.choice(events))
    sliced, sliced_state = _outcomes(events, 1 << 62, monkeypatch)
    for hot_events, index_after in ((1, 0), (2, 0), (48, 0), (1, 5), (48, 16)):
        indexed, indexed_state = _outcomes(events, hot_events, monkeypatch, index_after)
        assert indexed == sliced, f"HOT_EVENTS={hot_events}, INDEX_AFTER={index_after}"
        assert json.dumps(as_plain(indexed_state)) == json.dumps(as_plain(sliced_state))  # lists (hot) or arrays alike


def test_window_maximum_below_a_later_higher_event(monkeypatch: pytest.MonkeyPatch) -> None:
    """An event that arrives out of order, below a higher event of later time: its window's maximum is
    not the staircase's (that one lies after it), so the index scans; and a quieter one in order."""
    monkeypatch.setattr(features, "HOT_EVENTS", 1)
    monkeypatch.setattr(features, "INDEX_AFTER", 0)
    state = new_state()
    for i, amount in enumerate([5.0, 3.0, 9.0]):
        apply_event(state, f"e{i}", T + i * S, (amount, "m"), allowed_lateness_ms=LATENESS_MS)
    late = apply_event(state, "late", T + 1_500, (1.0, "m"), allowed_lateness_ms=LATENESS_MS)
    assert window(late, 60) == (3.0, 9.0, 3.0, 5.0)
    assert state.index is not None and has_event(state, "late") and not has_event(state, "nobody")
    again = apply_event(state, "late", T + 1_500, (1.0, "m"), allowed_lateness_ms=LATENESS_MS)
    assert again == Applied(late.features, True)


# --- the example spec, bit for bit -----------------------------------------------------------------------------


@pytest.mark.parametrize("hot_events", [1 << 62, 1, 96])
def test_the_example_spec_reproduces_the_features_seam_computed_before_specs(
        hot_events: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """30,000 events (out of order, 5 % redelivered, three hot cards, amounts with many binary digits): every
    feature and duplicate flag, as float bits, hashes to what the engine written for these fifteen features
    alone gave (commit 1c210a3), with every card sliced, every card indexed, and the default threshold."""
    monkeypatch.setattr(features, "HOT_EVENTS", hot_events)
    if hot_events == 1:
        monkeypatch.setattr(features, "INDEX_AFTER", 0)
    rng = random.Random(20261202)
    states: dict[str, KeyState] = {}
    digest = hashlib.sha256()
    sent: list[tuple[str, str, int, float, str]] = []
    t = T
    for i in range(30_000):
        t += rng.randrange(0, 4_000)
        card_id = f"c{rng.randrange(40) if rng.random() < 0.7 else rng.randrange(3)}"
        if sent and rng.random() < 0.05:
            ev = sent[rng.randrange(max(0, len(sent) - 200), len(sent))]
        else:
            ts = t - (rng.randrange(0, 50_000) if rng.random() < 0.3 else 0)
            amount = rng.choice((0.0, 1.5, rng.randrange(1, 10**6) / 100, 1e-3 * rng.random()))
            ev = (f"e{i}", card_id, ts, amount, f"m{rng.randrange(30)}")
            sent.append(ev)
        state = states.setdefault(ev[1], new_state())
        applied = apply_event(state, ev[0], ev[2], (ev[3], ev[4]), allowed_lateness_ms=60_000)
        digest.update(struct.pack(f"<{len(applied.features)}d?", *applied.features, applied.duplicate))
    assert digest.hexdigest() == "bac07f34f56bc3755a6a0cf61aacc0e2c666c742d7dea2cd569bfbc1266cf85b"


class _Counting(list):  # type: ignore[type-arg]
    """A column that counts the elements each access reads (a slice reads its length, a scan all of them)."""

    read = 0

    def __getitem__(self, index: Any) -> Any:
        _Counting.read += len(range(*index.indices(len(self)))) if isinstance(index, slice) else 1
        return super().__getitem__(index)

    def __contains__(self, value: object) -> bool:
        _Counting.read += len(self)
        return super().__contains__(value)

    def index(self, value: Any, *args: Any) -> int:
        _Counting.read += len(self)
        return super().index(value, *args)


def test_a_key_read_back_is_indexed_only_once_it_has_stayed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A key of HOT_EVENTS events or more read back from its table (a cache miss) is scored by slices for its
    first INDEX_AFTER events, then through its window index (which costs several sliced events to build, and
    is lost with the state if the key is dropped again): every feature as the sliced path gives it."""
    from tables.key_store import Stored, changes, decode

    monkeypatch.setattr(features, "HOT_EVENTS", 96)
    monkeypatch.setattr(features, "INDEX_AFTER", 4)
    state = new_state()
    for i in range(200):
        apply_event(state, f"e{i}", T + i * 20 * S, (float(i % 7) + 0.25, f"m{i % 11}"),
                    allowed_lateness_ms=LATENESS_MS)
    assert state.index is not None  # made in memory: it stayed for 100 events past HOT_EVENTS
    table = dict(changes(b"k", state, Stored(), set(state["ts"])))
    later = [(f"n{i}", T + (200 + i) * 20 * S - (30 * S if i % 3 else 0), float(i), f"m{i % 5}") for i in range(8)]

    def scored(loaded: KeyState) -> list[Applied]:
        return [apply_event(loaded, event_id, ts, (amount, merchant), allowed_lateness_ms=LATENESS_MS)
                for event_id, ts, amount, merchant in later]

    loaded = decode(table[b"k"], table.get, b"k")[0]
    assert loaded.index is None and type(loaded["ts"]) is array
    indexed_from = []
    for event_id, ts, amount, merchant in later:
        apply_event(loaded, event_id, ts, (amount, merchant), allowed_lateness_ms=LATENESS_MS)
        indexed_from.append(loaded.index is not None)
    assert indexed_from == [False] * 4 + [True] * 4
    with_index = scored(decode(table[b"k"], table.get, b"k")[0])
    monkeypatch.setattr(features, "HOT_EVENTS", 1 << 62)
    assert with_index == scored(decode(table[b"k"], table.get, b"k")[0])


@pytest.mark.parametrize("hot_events, most", [(96, 600), (1 << 62, None)])
def test_a_busy_keys_next_event_reads_a_few_of_its_events_not_all(hot_events: int, most: int | None,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """One key with 10,000 events in its largest window: its next event (in order, or a little out of it) reads
    a few hundred of its values through the window index, not the whole window (which the sliced path does, and
    every key of a worker would wait on that), whatever the key's volume."""
    monkeypatch.setattr(features, "HOT_EVENTS", hot_events)
    state = new_state()
    for i in range(10_000):
        apply_event(state, f"e{i}", T + i * 300, (float(i % 97), f"m{i % 13}"), allowed_lateness_ms=LATENESS_MS)
    reads = []
    for event_id, ts in (("next", T + 10_000 * 300), ("behind", T + 10_000 * 300 - 2_000)):
        if hot_events == 96:
            assert state.index is not None and state.index.fits(state)
        for name in ("ts", "id", "seq"):
            state[name] = _Counting(state[name])
        state["values"] = [_Counting(column) for column in state["values"]]
        _Counting.read = 0
        apply_event(state, event_id, ts, (3.0, "m1"), allowed_lateness_ms=LATENESS_MS)
        reads.append(_Counting.read)
    if most is None:
        assert min(reads) > 10_000  # sliced: the window, read per event
    else:
        assert max(reads) <= most, reads
