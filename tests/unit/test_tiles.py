"""Tiled keys (tables.tiles): every feature of any spec as the brute-force reference and the untiled state give it.

A key whose store reads its events back tiles those below its raw band; here every key is hot from its first
event and tiles as soon as one event is due, over tiles a fifth of the largest window wide, so that windows
cut through tiles, tiles are read back, dropped at the horizon, and a key below its raw band is held raw again.
"""

from __future__ import annotations

import math
import random
from bisect import bisect_left, insort
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from specs import EXAMPLE_SPEC
from tables import features
from tables.features import KeyState, Watermark, apply_event, has_event, latest_features, new_state, replayable
from tables.spec import FeatureSpec, load_spec
from tables.tiles import Events
from tests.reference import Late, Scored, replay_spec
from tests.unit.test_spec_reference import Generated, specs, streams

PROPERTY = hsettings(max_examples=150, deadline=None, derandomize=True, database=None)
S = 1_000


@pytest.fixture(autouse=True)
def tiled_from_the_start(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(features, "HOT_EVENTS", 1)
    monkeypatch.setattr(features, "INDEX_AFTER", 0)
    monkeypatch.setattr(features, "SPILL_EVENTS", 1)
    monkeypatch.setattr(features, "TILES_PER_WINDOW", 5)
    yield


class Log:
    """A key's store: every event it applied, read back by time range (as tables.key_store's chunks hold them)."""

    def __init__(self) -> None:
        self.events: list[tuple[int, int, str, tuple[Any, ...]]] = []
        self.reads = 0

    def add(self, state: KeyState, event_id: str, ts: int, values: tuple[Any, ...]) -> None:
        insort(self.events, (ts, state["n"], event_id, values))

    def cut(self, below: int) -> int:
        return below  # every event is logged as it is applied

    def applied(self, ts: int) -> None:
        pass

    def read(self, lo: int, hi: int) -> Events:
        self.reads += 1
        rows = self.events[bisect_left(self.events, (lo,)):bisect_left(self.events, (hi,))]
        width = len(rows[0][3]) if rows else 0
        return Events([row[0] for row in rows], [row[1] for row in rows], [row[2] for row in rows],
                      tuple([row[3][col] for row in rows] for col in range(width)))


def run(spec: FeatureSpec, events: list[dict[str, Any]], tiled: bool,
        forget: frozenset[int] = frozenset()) -> tuple[list[Scored | Late], dict[str, KeyState]]:
    """What a worker does per event (watermark, replay rule, apply_event), each key in memory; the watermarks
    are lost before the events at ``forget``."""
    states: dict[str, KeyState] = {}
    logs: dict[str, Log] = {}
    watermarks: dict[int, Watermark] = {}
    lateness = spec.allowed_lateness_ms
    out: list[Scored | Late] = []
    for index, event in enumerate(events):
        if index in forget:
            watermarks.clear()
        key, event_id, ts = event[spec.key], event[spec.event_id], event[spec.event_time]
        state = states.get(key)
        if state is None:
            state = states[key] = new_state(spec)
            logs[key] = Log()
            if tiled:
                state.store = logs[key]
        watermark = watermarks.setdefault(event["partition"], Watermark(lateness))
        if watermark.is_late(ts) and not (
                has_event(state, event_id) and replayable(state, ts, allowed_lateness_ms=lateness, spec=spec)):
            assert watermark.value is not None
            out.append(Late(watermark.value))
            continue
        watermark.observe(ts)
        values = tuple(event[name] if spec.field(name).type == "string" else float(event[name])
                       for name in spec.stored)
        applied = apply_event(state, event_id, ts, values, allowed_lateness_ms=lateness, spec=spec)
        if not applied.duplicate:
            logs[key].add(state, event_id, ts, values)
        out.append(Scored(dict(zip(spec.names, applied.features, strict=True))))
    return out, states


def same(a: float, b: float) -> bool:
    return a == b and math.copysign(1.0, a) == math.copysign(1.0, b) or (math.isnan(a) and math.isnan(b))


@PROPERTY
@given(st.data(), specs(), st.sampled_from((0, 1, 5_000, 30_000)))
def test_tiled_keys_match_the_reference_and_the_untiled_state(data: st.DataObject, generated: Generated,
                                                              replay_ms: int) -> None:
    """Bit for bit the untiled state's features (signed zeros included), and the reference's."""
    spec = replace(generated.spec, replay_allowance_ms=replay_ms)
    events = data.draw(streams(spec))
    tiled, states = run(spec, events, tiled=True)
    plain, untiled = run(spec, events, tiled=False)
    for index, (event, got, want, exact) in enumerate(zip(events, tiled, replay_spec(spec, events), plain,
                                                          strict=True)):
        where = f"arrival #{index} {event} of spec (replay allowance {replay_ms} ms)\n{generated.text}"
        assert type(got) is type(want) is type(exact), where
        if isinstance(got, Scored):
            assert isinstance(want, Scored) and isinstance(exact, Scored)
            wrong = {name: (got.features[name], want.features[name]) for name in spec.names
                     if not math.isclose(got.features[name], want.features[name], rel_tol=1e-9)}
            assert not wrong, f"{where}: (tiled, reference) = {wrong}"
            apart = {name: (got.features[name], exact.features[name]) for name in spec.names
                     if not same(got.features[name], exact.features[name])}
            assert not apart, f"{where}: (tiled, untiled) = {apart}"
        else:
            assert got == want, where
    for key, state in states.items():  # what a key's page shows: its newest event, read back through its tiles
        assert latest_features(state, spec) == latest_features(untiled[key], spec)


@PROPERTY
@given(st.data(), specs(), st.sampled_from((0, 5_000)))
def test_a_tiled_key_given_events_below_its_raw_band_holds_them_raw_again(data: st.DataObject, generated: Generated,
                                                                          replay_ms: int) -> None:
    """With its watermark lost, a worker applies events below a key's raw band (and replays older redeliveries):
    the tiled key reads its tiles back and goes on exactly as the untiled one, as far as their outcomes are
    defined: up to the first event that reaches what a key may have evicted (events at or below its newest
    minus the lateness, the replay allowance and the largest window), which each evicts at its own pace."""
    spec = replace(generated.spec, replay_allowance_ms=replay_ms)
    events = data.draw(streams(spec))
    forget = frozenset(data.draw(st.sets(st.integers(0, len(events) - 1), max_size=4)))
    tiled, _ = run(spec, events, tiled=True, forget=forget)
    plain, _ = run(spec, events, tiled=False, forget=forget)
    applied: dict[str, list[int]] = {}
    for index, (got, exact) in enumerate(zip(tiled, plain, strict=True)):
        event = events[index]
        key, ts = event[spec.key], event[spec.event_time]
        held = applied.setdefault(key, [])
        cutoff = max(held, default=ts) - spec.allowed_lateness_ms - replay_ms - spec.max_window_ms
        if ts <= cutoff or any(ts - spec.max_window_ms < other <= cutoff for other in held):
            break
        assert type(got) is type(exact), index
        if isinstance(got, Scored):
            assert isinstance(exact, Scored)
            apart = {name: (got.features[name], exact.features[name]) for name in spec.names
                     if not same(got.features[name], exact.features[name])}
            assert not apart, f"arrival #{index} {event}: (tiled, untiled) = {apart}\n{generated.text}"
            held.append(ts)
        else:
            assert got == exact, index


def example_stream(rate: float, seconds: int, seed: int) -> Iterator[tuple[str, int, float, str]]:
    """One card's events at ``rate`` a second, jittered back up to 2 s: (id, ts, amount, merchant)."""
    rng = random.Random(seed)
    start = 1_764_500_000_000
    for n in range(int(rate * seconds)):
        ts = start + int(n * 1000 / rate) - rng.randrange(0, 2 * S)
        yield f"e{n}", ts, float(rng.randrange(1, 100_000)) / 100, f"m{rng.randrange(50)}"


def test_a_key_for_an_hour_holds_its_raw_band_and_tiles(monkeypatch: pytest.MonkeyPatch) -> None:
    """The example spec at 20 events a second: what a key holds raw stays at its raw band (lateness and replay
    allowance, 11 minutes) and its tiles at the horizon over their width, however long it runs; every feature
    is the untiled state's, bit for bit."""
    monkeypatch.setattr(features, "HOT_EVENTS", 256)
    monkeypatch.setattr(features, "SPILL_EVENTS", 256)
    monkeypatch.setattr(features, "TILES_PER_WINDOW", 64)
    spec = load_spec(EXAMPLE_SPEC)
    lateness, rate = spec.allowed_lateness_ms, 20
    tiled, plain, log = new_state(spec), new_state(spec), Log()
    tiled.store = log
    band = (lateness + spec.replay_allowance_ms) * rate // 1000
    most_raw = most_tiles = 0
    start = 1_764_500_000_000
    for event_id, ts, amount, merchant in example_stream(rate, 3_600, seed=7):
        values = (amount, merchant)
        got = apply_event(tiled, event_id, ts, values, allowed_lateness_ms=lateness, spec=spec)
        want = apply_event(plain, event_id, ts, values, allowed_lateness_ms=lateness, spec=spec)
        log.add(tiled, event_id, ts, values)
        assert all(same(a, b) for a, b in zip(got.features, want.features, strict=True)), (event_id, got, want)
        if ts > start + 20 * 60 * S:
            assert tiled.tiles is not None
            most_raw, most_tiles = max(most_raw, len(tiled["ts"])), max(most_tiles, len(tiled.tiles.numbers))
    assert tiled.tiles is not None
    horizon = lateness + spec.replay_allowance_ms + spec.max_window_ms
    assert most_raw <= band * 33 // 32 + 20 * rate + features.SPILL_EVENTS  # before a spill, and the jitter
    assert most_tiles <= horizon // tiled.tiles.width_ms + 2
    assert len(tiled.tiles) > 3 * band and len(plain["ts"]) > 5 * band  # most of what the key holds is tiled
    assert log.reads <= 3 * 3_600 * 1000 // tiled.tiles.width_ms  # a tile read about once per window edge
    assert latest_features(tiled, spec) == latest_features(plain, spec)
