"""Any spec, any stream: generated specs and out-of-order streams agree with the brute-force reference.

Specs are generated as TOML text (parsed by tables.spec), with every operation over float, int, bool and
string fields and windows from a second to two minutes; streams have several keys and partitions,
jittered, borderline and late event times, and redeliveries. Events go through what a worker runs per
record: the real StateCache over tables in the stored layout (tables.key_store), with flushes and
restarts at random points, the watermark, the replay rule and apply_event.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from tables.cache import StateCache
from tables.features import KeyState, apply_event, has_event, memory_bytes, new_state, replayable
from tables.key_store import Packed, Stored, changes, decode, decode_many, events_between
from tables.spec import OPERATIONS, FeatureSpec, parse_spec
from tables.tiles import Events
from tests.reference import Late, Scored, replay_spec

pytestmark = pytest.mark.usefixtures("state_paths")  # every test: sliced, indexed and tiled windows

T = 1_764_500_000_000
S = 1_000
PROPERTY = hsettings(max_examples=120, deadline=None, derandomize=True, database=None)
WINDOWS = ("1s", "5s", "30s", "90s", "2m")
NUMERIC_TYPES = ("float", "int", "bool")
# Values whose sums cancel, repeat, need many binary digits, or are tiny beside others.
FLOATS = st.one_of(st.sampled_from((0.0, 1.0, -1.0, 0.1, 0.2, 0.3, 1e-3, 2.5e6)),
                   st.integers(-500_000, 500_000).map(lambda cents: cents / 100))
STRINGS = ("a", "b", "c", "d")


@dataclass(frozen=True, slots=True)
class Generated:
    spec: FeatureSpec
    text: str


@st.composite
def specs(draw: st.DrawFn) -> Generated:
    """A spec over 1-3 numeric fields and 0-2 string fields, with 1-10 features of any operation."""
    numeric = [(f"x{i}", draw(st.sampled_from(NUMERIC_TYPES))) for i in range(draw(st.integers(1, 3)))]
    strings = [f"s{i}" for i in range(draw(st.integers(0, 2)))]
    lines = ['name = "generated"', 'key = "k"', 'event_id = "eid"', 'event_time = "t"',
             f'allowed_lateness = "{draw(st.sampled_from(("0s", "5s", "30s")))}"']
    allowance = draw(st.sampled_from((None, "0s", "5s", "1m")))  # None: the longest window
    if allowance is not None:
        lines.append(f'replay_allowance = "{allowance}"')
    lines += ["", "[fields]"]
    lines += [f'{name} = {{ type = "{kind}" }}' for name, kind in numeric]
    lines += [f'{name} = {{ type = "string" }}' for name in strings]
    for index in range(draw(st.integers(1, 10))):
        op = OPERATIONS[draw(st.sampled_from(sorted(OPERATIONS)))]
        lines += ["", "[[features]]", f'name = "f{index}_{op.name}"', f'op = "{op.name}"']
        if op.field_types is not None:
            choices = [name for name, _ in numeric] + (strings if "string" in op.field_types else [])
            lines.append(f'field = "{draw(st.sampled_from(choices))}"')
        if op.windowed:
            lines.append(f'window = "{draw(st.sampled_from(WINDOWS))}"')
        if op.default is not None and draw(st.booleans()):
            lines.append(f"default = {draw(st.sampled_from((-1.0, 0.0, 7.5)))}")
    text = "\n".join(lines) + "\n"
    return Generated(parse_spec(text, source="generated"), text)


def value_of(kind: str) -> st.SearchStrategy[Any]:
    if kind == "float":
        return FLOATS
    if kind == "int":
        return st.integers(-1000, 1000)
    if kind == "bool":
        return st.booleans()
    return st.sampled_from(STRINGS)


@st.composite
def streams(draw: st.DrawFn, spec: FeatureSpec) -> list[dict[str, Any]]:
    """Events of up to 4 keys on up to 3 partitions: on time, jittered, at the lateness bound, late; redelivered."""
    partitions = draw(st.integers(1, 3))
    keys = draw(st.integers(1, 4))
    partition_of = [draw(st.integers(0, partitions - 1)) for _ in range(keys)]
    lateness = spec.allowed_lateness_ms
    base, highest = T, {}
    events: list[dict[str, Any]] = []
    for index in range(draw(st.integers(1, 60))):
        base += draw(st.integers(0, 20)) * S
        key = draw(st.integers(0, keys - 1))
        partition = partition_of[key]
        kind = draw(st.sampled_from(("on_time", "on_time", "jitter", "jitter", "borderline", "late")))
        top = highest.get(partition, base)
        if kind == "on_time":
            ts = base
        elif kind == "jitter":
            ts = base - draw(st.integers(0, 40_000))
        elif kind == "borderline":
            ts = top - lateness + draw(st.sampled_from((-S, -1, 0, 1, S)))
        else:
            ts = top - lateness - draw(st.integers(1, 200)) * S
        highest[partition] = max(top, ts)
        event = {"eid": f"e{index}", "k": f"k{key}", "t": ts, "partition": partition}
        for name in (f.name for f in spec.fields):
            event[name] = draw(value_of(spec.field(name).type))
        events.append(event)
    resent = draw(st.lists(st.tuples(st.integers(0, len(events) - 1), st.integers(1, 15)), max_size=8))
    keyed = [((index, 0, 0), event) for index, event in enumerate(events)]
    keyed += [((source + delay, 1, n), events[source]) for n, (source, delay) in enumerate(resent)]
    return [event for _, event in sorted(keyed, key=lambda pair: pair[0])]


class Tables:
    """Dict-backed key-state and watermark tables, partitioned like the Faust tables, in the stored layout."""

    def __init__(self) -> None:
        self.states: dict[tuple[int, bytes], bytes] = {}
        self.watermarks: dict[int, int] = {}
        self.current: int | None = None

    @contextmanager
    def scope(self, partition: int) -> Iterator[None]:
        self.current = partition
        try:
            yield
        finally:
            self.current = None

    def load(self, key: str) -> tuple[KeyState, Stored] | None:
        partition, raw = self.current, key.encode()
        assert partition is not None
        header = self.states.get((partition, raw))
        return None if header is None else decode(header, lambda k: self.states.get((partition, k)), raw)

    def load_many(self, keys: list[str]) -> list[tuple[KeyState, Stored] | None]:
        partition = self.current
        return decode_many([key.encode() for key in keys], lambda raw: [self.states.get((partition, k)) for k in raw])

    def read_events(self, key: str, stored: Packed, lo: int, hi: int) -> Events:
        partition = self.current
        return events_between(key.encode(), stored, lo, hi, lambda raw: [self.states.get((partition, k)) for k in raw])

    def store(self, key: str, state: KeyState, stored: Stored, touched: set[int]) -> int:
        assert self.current is not None
        writes = changes(key.encode(), state, stored, touched)
        for raw, value in writes:
            if value is None:
                del self.states[(self.current, raw)]
            else:
                self.states[(self.current, raw)] = value
        return len(writes)

    def cache(self, spec: FeatureSpec, max_clean_keys: int) -> StateCache:
        def load_watermark() -> int | None:
            assert self.current is not None
            return self.watermarks.get(self.current)

        def store_watermark(max_ts: int) -> None:
            assert self.current is not None
            self.watermarks[self.current] = max_ts

        return StateCache(load_state=self.load, load_states=self.load_many, store_state=self.store,
                          load_watermark=load_watermark, store_watermark=store_watermark, scope=self.scope,
                          allowed_lateness_ms=spec.allowed_lateness_ms, spec=spec, read_events=self.read_events,
                          max_clean_bytes=max_clean_keys * memory_bytes(0))


def handle(cache: StateCache, spec: FeatureSpec, event: dict[str, Any]) -> Scored | Late:
    """What Pipeline.handle does with one decoded event."""
    partition, key, event_id, ts = event["partition"], event[spec.key], event[spec.event_id], event[spec.event_time]
    lateness = spec.allowed_lateness_ms
    watermark = cache.watermark(partition)
    state = cache.state(partition, key)
    if watermark.is_late(ts) and not (
            has_event(state, event_id) and replayable(state, ts, allowed_lateness_ms=lateness, spec=spec)):
        assert watermark.value is not None
        return Late(watermark.value)
    if watermark.max_ts is None or ts > watermark.max_ts:
        watermark.observe(ts)
        cache.touch_watermark(partition)
    values = tuple(event[name] if spec.field(name).type == "string" else float(event[name]) for name in spec.stored)
    applied = apply_event(state, event_id, ts, values, allowed_lateness_ms=lateness, spec=spec)
    if not applied.duplicate:
        cache.touch(partition, key, ts)
    return Scored(dict(zip(spec.names, applied.features, strict=True)))


@PROPERTY
@given(st.data(), specs(), st.sampled_from((0, 1, 100_000)))
def test_generated_specs_match_the_reference(data: st.DataObject, generated: Generated, max_clean_keys: int) -> None:
    """Every outcome (scored with its features, or late with its watermark) is the reference's, through
    writes behind, and restarts that rebuild the cache from the stored layout."""
    spec = generated.spec
    events = data.draw(streams(spec))
    cuts = data.draw(st.sets(st.integers(0, len(events) - 1), max_size=max(1, len(events) // 5)))
    writes = data.draw(st.sets(st.integers(0, len(events) - 1), max_size=max(1, len(events) // 3)))
    tables = Tables()
    cache = tables.cache(spec, max_clean_keys)
    outcomes = []
    for index, event in enumerate(events):
        if index in cuts:
            cache.flush()
            cache = tables.cache(spec, max_clean_keys)
        elif index in writes:  # a write behind: what the cache holds stays
            cache.flush()
        outcomes.append(handle(cache, spec, event))
    expected = replay_spec(spec, events)
    for index, (event, got, want) in enumerate(zip(events, outcomes, expected, strict=True)):
        where = f"arrival #{index} {event} of spec\n{generated.text}"
        assert type(got) is type(want), f"{where}: got {got}, the reference says {want}"
        if isinstance(got, Scored):
            assert isinstance(want, Scored)
            wrong = {name: (got.features[name], want.features[name]) for name in spec.names
                     if not math.isclose(got.features[name], want.features[name], rel_tol=1e-9)}
            assert not wrong, f"{where}: (production, reference) = {wrong}"
        else:
            assert got == want, where


def test_every_operation_is_generated() -> None:
    """The generator above can name every operation (a new one must be added to the reference too)."""
    assert set(OPERATIONS) == {"count", "sum", "mean", "min", "max", "std", "distinct", "last", "since_prev",
                               "ratio_to_mean"}


NESTED = parse_spec("\n".join(
    ['name = "nested"', 'key = "k"', 'event_id = "eid"', 'event_time = "t"', 'allowed_lateness = "0s"', "",
     "[fields]", 'x = { type = "float" }']
    + [line for window in ("1m", "10m", "1h") for op in ("max", "min", "sum") for line in
       ("", "[[features]]", f'name = "{op}_{window}"', f'op = "{op}"', 'field = "x"', f'window = "{window}"')]) + "\n")


@hsettings(max_examples=200, deadline=None)
@given(events=st.lists(st.tuples(st.integers(0, 5400), st.sampled_from((-0.0, 0.0, 1.5, -2.0, 0.1))), min_size=1,
                max_size=40))
def test_nested_windows_give_what_their_whole_slices_give(events: list[tuple[int, float]], state_paths: str) -> None:
    """A longer window's maximum and minimum start from a shorter one's (the sliced path): the same element the
    whole window gives, a signed zero included, wherever an event falls between the windows' starts. (A window
    index gives the same values, but may give 0.0 where a tie with -0.0 came first.)"""
    state = KeyState(new_state(NESTED))
    held: list[tuple[int, float]] = []
    for number, (second, value) in enumerate(sorted(events, key=lambda event: event[0])):
        ts = T + second * S
        features = apply_event(state, f"e{number}", ts, (value,), allowed_lateness_ms=0, spec=NESTED).features
        held.append((ts, value))
        expected = []
        for window_ms in (60_000, 600_000, 3_600_000):
            window = [held_value for held_ts, held_value in held if ts - window_ms < held_ts <= ts]
            expected += [max(window), min(window), math.fsum(window)]
        assert list(features) == expected
        if state_paths == "slices":
            assert [math.copysign(1.0, f) for f in features] == [math.copysign(1.0, f) for f in expected]


def test_a_key_tiles_only_what_its_table_holds(state_paths: str) -> None:
    """An event applied after a key's last write, below that write's tail (here at the time of events already
    sealed into a chunk), is not in the table until the next write: no tile takes it before then. Found by the
    generated specs, with every key tiled: the tile read back one event short."""
    spec = parse_spec('name = "g"\nkey = "k"\nevent_id = "eid"\nevent_time = "t"\nallowed_lateness = "0s"\n'
                      'replay_allowance = "0s"\n\n[fields]\nx0 = { type = "float" }\n\n'
                      '[[features]]\nname = "d"\nop = "distinct"\nfield = "x0"\nwindow = "30s"\n\n'
                      '[[features]]\nname = "c"\nop = "count"\nwindow = "1s"\n', source="test")
    offsets_s = [0, 0, 0, *[11] * 11, 19, 21, 28, 28, 28, 28, 40, 45]
    events = [{"eid": f"e{i}", "k": "k0", "t": T + s * S, "partition": 0, "x0": float(i % 3)}
              for i, s in enumerate(offsets_s)]
    tables = Tables()
    cache = tables.cache(spec, 100_000)
    outcomes = []
    for index, event in enumerate(events):
        if index in (2, 16):
            cache.flush()
        outcomes.append(handle(cache, spec, event))
    assert outcomes == replay_spec(spec, events)
