"""Property tests: production routing, features, state cache and Pipeline.handle agree with tests/reference.py."""

from __future__ import annotations

import asyncio
import json
import math
import random
import zlib
from collections.abc import Awaitable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import islice
from typing import Any, cast

import orjson
import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from agents.formats.codec import Invalid
from agents.ingest.records import RecordBatch
from agents.model.boundary import ModelBoundary
from agents.pipeline import Outputs, Pipeline, ScoringItem
from app.synthetic import TransactionGenerator
from tables.cache import StateCache
from tables.features import (
    DEFAULT_SPEC,
    KeyState,
    apply_event,
    as_plain,
    has_event,
    materialized,
    memory_bytes,
    new_state,
    replayable,
)
from tables.key_store import Packed, Stored, changes, decode, decode_many, events_between
from tables.tiles import Events
from tests.reference import Late, Scored, replay

pytestmark = pytest.mark.usefixtures("state_paths")  # every test: sliced, indexed and tiled windows

T = 1_764_500_000_000  # an arbitrary epoch-ms origin
S = 1_000  # one second in ms
LATENESS_MS = 60 * S
NAMES = DEFAULT_SPEC.names
REL = 1e-9
PROPERTY = hsettings(max_examples=150, deadline=None, derandomize=True, database=None)
MERCHANTS = tuple(f"m{i}" for i in range(5))
# Weighted kinds of event time: on the timeline, jittered back 0-50 s, right at the lateness bound, or late.
KINDS = ("on_time",) * 3 + ("jitter",) * 4 + ("borderline", "late")
GAP_MS = (LATENESS_MS + DEFAULT_SPEC.max_window_ms) + 60 * S
AMOUNTS = st.one_of(st.just(0.0), st.integers(1, 500_000).map(lambda cents: cents / 100))

Outcome = Scored | Late


@dataclass(frozen=True, slots=True)
class Event:
    """One decoded transaction as it arrives on its partition."""

    id: str
    card_id: str
    partition: int
    ts: int
    amount: float
    merchant_id: str

    def as_dict(self) -> dict[str, Any]:
        """The event in the shape tests.reference.replay expects."""
        return {"id": self.id, "card_id": self.card_id, "partition": self.partition, "ts": self.ts,
                "amount": self.amount, "merchant_id": self.merchant_id}


@dataclass(frozen=True, slots=True)
class Scenario:
    """An arrival sequence and where the worker flushes / restarts (before the event at that index)."""

    events: tuple[Event, ...]
    flush_before: frozenset[int]
    restart_before: frozenset[int]
    max_clean_cards: int
    forget_on_restart: bool


class Tables:
    """Dict-backed card-state and watermark tables, partitioned like the Faust tables (JSON values)."""

    def __init__(self) -> None:
        self.cards: dict[tuple[int, bytes], bytes] = {}
        self.watermarks: dict[int, int] = {}
        self.current: int | None = None

    @contextmanager
    def scope(self, partition: int) -> Iterator[None]:
        """Make ``partition`` current, like agents.ingest.table_partition (no nesting)."""
        assert self.current is None, "table scopes must not nest"
        self.current = partition
        try:
            yield
        finally:
            self.current = None

    def _partition(self) -> int:
        assert self.current is not None, "table access outside a partition scope"
        return self.current

    def load_state(self, card_id: str) -> tuple[KeyState, Stored] | None:
        """Through the real table layout (tables.key_store): a header with the tail, and sealed chunks."""
        partition, key = self._partition(), card_id.encode()
        header = self.cards.get((partition, key))
        return None if header is None else decode(header, lambda k: self.cards.get((partition, k)), key)

    def load_states(self, card_ids: list[str]) -> list[tuple[KeyState, Stored] | None]:
        """Several cards in two batched reads (tables.key_store.decode_many), as a worker's prefetch reads them."""
        partition = self._partition()
        return decode_many([card_id.encode() for card_id in card_ids],
                           lambda keys: [self.cards.get((partition, key)) for key in keys])

    def store_state(self, card_id: str, state: KeyState, stored: Stored, touched: set[int]) -> int:
        writes = changes(card_id.encode(), state, stored, touched)
        for key, value in writes:
            if value is None:
                del self.cards[(self._partition(), key)]
            else:
                self.cards[(self._partition(), key)] = value
        return len(writes)

    def read_events(self, card_id: str, stored: Packed, lo: int, hi: int) -> Events:
        partition = self._partition()
        return events_between(card_id.encode(), stored, lo, hi, lambda keys: [self.cards.get((partition, key))
                                                                              for key in keys])

    def load_watermark(self) -> int | None:
        return self.watermarks.get(self._partition())

    def store_watermark(self, max_ts: int) -> None:
        self.watermarks[self._partition()] = max_ts

    def new_cache(self, max_clean_cards: int = 100_000) -> StateCache:
        """A fresh StateCache over these tables: what a restarted worker builds after restoring them."""
        return StateCache(load_state=self.load_state, load_states=self.load_states, store_state=self.store_state,
                          load_watermark=self.load_watermark, read_events=self.read_events,
                          store_watermark=self.store_watermark, scope=self.scope, allowed_lateness_ms=LATENESS_MS,
                          max_clean_bytes=max_clean_cards * memory_bytes(0))  # about that many cards


@dataclass
class Worker:
    """Pipeline.handle's routing for decoded events, over a real StateCache that can flush and restart.

    Late iff below the watermark, unless it is a redelivery still in state and within the replay horizon.
    """

    tables: Tables
    max_clean_cards: int = 100_000
    forget_on_restart: bool = False
    cache: StateCache = field(init=False)
    seen: set[tuple[int, str]] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.cache = self.tables.new_cache(self.max_clean_cards)

    def handle(self, ev: Event) -> Outcome:
        cache, partition = self.cache, ev.partition
        self.seen.add((partition, ev.card_id))
        watermark = cache.watermark(partition)
        state = cache.state(partition, ev.card_id)
        if watermark.is_late(ev.ts) and not (
                has_event(state, ev.id) and replayable(state, ev.ts, allowed_lateness_ms=LATENESS_MS)):
            assert watermark.value is not None
            return Late(watermark.value)
        if watermark.max_ts is None or ev.ts > watermark.max_ts:
            watermark.observe(ev.ts)
            cache.touch_watermark(partition)
        applied = apply_event(state, ev.id, ev.ts, (ev.amount, ev.merchant_id), allowed_lateness_ms=LATENESS_MS)
        if not applied.duplicate:
            cache.touch(partition, ev.card_id, ev.ts)
        return Scored(dict(zip(NAMES, applied.features, strict=True)))

    def flush(self) -> None:
        """Flush, then check the tables hold exactly what the cache holds."""
        self.cache.flush()
        assert self.cache.dirty_keys() == 0
        for partition, card_id in self.seen:
            with self.tables.scope(partition):
                loaded = self.tables.load_state(card_id)
                stored = loaded[0] if loaded is not None else new_state()  # a card with only late events
            assert as_stored(stored, self.cache.peek(partition, card_id)), f"unflushed {card_id}"
        for partition in {p for p, _ in self.seen}:
            assert self.tables.watermarks.get(partition) == self.cache.watermark(partition).max_ts

    def restart(self) -> None:
        """Flush and continue with state and watermarks restored from the tables only."""
        self.flush()
        if self.forget_on_restart:
            self.cache.forget()
        else:
            self.cache = self.tables.new_cache(self.max_clean_cards)


def as_stored(stored: KeyState, cached: KeyState | None) -> bool:
    """Whether the table holds what the cache holds: a tiled key's events read back whole, and a chunk the
    eviction cut into holding a few evicted events besides (at or below ``prev``)."""
    if cached is None:
        return stored == new_state()
    if cached.tiles is None:
        return stored == cached
    whole = materialized(cached)
    kept = [i for i, ts in enumerate(stored["ts"]) if stored["prev"] is None or ts > stored["prev"]]
    trimmed = {**as_plain(stored), "ts": [stored["ts"][i] for i in kept], "id": [stored["id"][i] for i in kept],
               "seq": [stored["seq"][i] for i in kept], "values": [[column[i] for i in kept]
                                                                  for column in stored["values"]]}
    return trimmed == as_plain(whole)


def close(actual: float, expected: float) -> bool:
    return math.isclose(actual, expected, rel_tol=REL)


def check(events: Sequence[Event], outcomes: Sequence[Outcome]) -> tuple[int, int, int]:
    """Compare with the reference; return (scored, late, duplicates scored)."""
    expected = replay([ev.as_dict() for ev in events], LATENESS_MS)
    assert len(outcomes) == len(expected) == len(events)
    first: dict[str, Outcome] = {}
    applied_ts: dict[str, list[int]] = {}
    scored = late = duplicates = 0
    for index, (ev, got, want) in enumerate(zip(events, outcomes, expected, strict=True)):
        where = f"arrival #{index}: {ev}"
        assert type(got) is type(want), f"{where}: got {got}, the reference says {want}"
        if isinstance(got, Late):
            assert isinstance(want, Late)
            assert got.watermark == want.watermark, where
            assert ev.ts < got.watermark, where
            late += 1
        else:
            assert isinstance(want, Scored)
            scored += 1
            mismatched = {name: (got.features[name], want.features[name]) for name in NAMES
                          if not close(got.features[name], want.features[name])}
            assert not mismatched, f"{where}: (production, reference) = {mismatched}"
            previous = first.get(ev.id)
            if isinstance(previous, Scored):
                duplicates += 1
                assert all(close(got.features[n], previous.features[n]) for n in NAMES), (
                    f"{where}: a redelivery got {got.features}, the first delivery {previous.features}")
            else:
                applied_ts.setdefault(ev.card_id, []).append(ev.ts)
            visible = sum(1 for ts in applied_ts[ev.card_id] if ts <= ev.ts)
            assert got.features["count_3600"] <= visible, f"{where}: counts an event with a later ts"
            first.setdefault(ev.id, got)
    return scored, late, duplicates


@st.composite
def scenarios(draw: st.DrawFn, max_resent: int = 12) -> Scenario:
    """Several partitions and cards, jittered and late event times, nearby duplicates, flush/restart points."""
    partitions = draw(st.integers(1, 4))
    cards = draw(st.integers(1, 6))
    partition_of = [draw(st.integers(0, partitions - 1)) for _ in range(cards)]
    size = draw(st.integers(1, 96))  # up to 96 steps of 0-75 s plus one 62 min gap: about 3 h at most
    raw = draw(st.lists(st.tuples(st.integers(0, 75), st.integers(0, cards - 1), st.sampled_from(KINDS),
                                  st.integers(0, 10**6), AMOUNTS, st.sampled_from(MERCHANTS)),
                        min_size=size, max_size=size))
    gap_before = draw(st.one_of(st.none(), st.integers(1, size)))  # over an hour quiet: older events expire
    base = T
    highest: dict[int, int] = {}  # per partition: the highest ts generated so far
    originals: list[Event] = []
    for index, (step_s, card, kind, back, amount, merchant) in enumerate(raw):
        base += step_s * S + (GAP_MS if index == gap_before else 0)
        partition = partition_of[card]
        top = highest.get(partition, base)
        if kind == "on_time":
            ts = base
        elif kind == "jitter":
            ts = base - (back % 51) * S
        elif kind == "borderline":  # right at the watermark (ts == watermark is on time)
            ts = top - LATENESS_MS + (-S, -1, 0, 1, S)[back % 5]
        else:  # 2-20 minutes behind the partition
            ts = top - (120 + back % 1081) * S
        highest[partition] = max(highest.get(partition, ts), ts)
        originals.append(Event(f"e{index}", f"c{card}", partition, ts, amount, merchant))
    resent = draw(st.lists(st.tuples(st.integers(0, len(originals) - 1), st.integers(1, 20)), max_size=max_resent))
    keyed = [((index, 0, 0), ev) for index, ev in enumerate(originals)]
    # Re-sends 1-20 positions later; across the quiet hour they fall behind the replay horizon.
    keyed += [((source + delay, 1, k), originals[source]) for k, (source, delay) in enumerate(resent)]
    events = tuple(ev for _, ev in sorted(keyed, key=lambda pair: pair[0]))
    points = st.sets(st.integers(0, len(events) - 1), max_size=max(1, len(events) // 4))
    return Scenario(events, frozenset(draw(points)), frozenset(draw(points)),
                    draw(st.sampled_from((0, 2, 100_000))), draw(st.booleans()))


def run_worker(scenario: Scenario) -> list[Outcome]:
    worker = Worker(Tables(), scenario.max_clean_cards, scenario.forget_on_restart)
    outcomes: list[Outcome] = []
    for index, ev in enumerate(scenario.events):
        if index in scenario.flush_before:
            worker.flush()
        if index in scenario.restart_before:
            worker.restart()
        outcomes.append(worker.handle(ev))
    return outcomes


@PROPERTY
@given(scenarios())
def test_cache_driven_routing_and_features_match_the_reference(scenario: Scenario) -> None:
    """Flushes and restarts (new cache or forget()) at random points change no outcome and no feature."""
    check(scenario.events, run_worker(scenario))


@PROPERTY
@given(scenarios(), st.sets(st.integers(0, 119), max_size=3))
def test_crash_and_redelivery_from_the_last_flush_reproduce_every_outcome(
    scenario: Scenario, crash_before: set[int]
) -> None:
    """Unflushed changes are lost in a crash; re-handling the events since the last flush gives the same outcomes."""
    worker = Worker(Tables(), scenario.max_clean_cards)
    outcomes: list[Outcome] = []
    flushed = 0  # flushed: the first event whose change the tables may not hold
    for index, ev in enumerate(scenario.events):
        if index in scenario.flush_before:
            worker.flush()
            flushed = index
        if index in crash_before:
            worker.cache = worker.tables.new_cache(scenario.max_clean_cards)
            for again in range(flushed, index):
                assert worker.handle(scenario.events[again]) == outcomes[again], f"redelivered #{again}"
        outcomes.append(worker.handle(ev))
    check(scenario.events, outcomes)


# --- the real Pipeline.handle -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Record:
    """A fetched Kafka record (satisfies agents.ingest.RawRecord)."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()


class FakeBoundary:
    """Collects what Pipeline.handle submits for scoring."""

    def __init__(self) -> None:
        self.items: list[ScoringItem] = []

    async def submit_many(self, items: Iterable[tuple[Sequence[float], ScoringItem]]) -> None:
        for features, item in items:
            assert tuple(features) == item.features
            self.items.append(item)


class FakeBatch:
    """A RecordBatch stand-in that records acknowledged offsets."""

    def __init__(self, partition: int, records: Sequence[Record], acked: list[int]) -> None:
        self.topic, self.partition, self.records, self._acked = "tx", partition, records, acked

    def ack(self, offsets: Sequence[int]) -> None:
        self._acked.extend(offsets)


def batches_of(scenario: Scenario) -> list[tuple[int, list[tuple[int, Event]]]]:
    """Runs of one partition's consecutive events, also cut where the worker flushes or restarts."""
    cuts = scenario.flush_before | scenario.restart_before
    out: list[tuple[int, list[tuple[int, Event]]]] = []
    for index, ev in enumerate(scenario.events):
        if not out or out[-1][0] != ev.partition or index in cuts:
            out.append((ev.partition, []))
        out[-1][1].append((index, ev))
    return out


async def run_pipeline(scenario: Scenario, write_through: bool) -> tuple[list[Outcome], list[int], list[int]]:
    """Feed the scenario through Pipeline.handle; return outcomes by arrival, late offsets and acked offsets."""
    tables, boundary = Tables(), FakeBoundary()
    acked: list[int] = []
    sent: list[tuple[str, bytes]] = []
    loop = asyncio.get_running_loop()

    async def send(batch: RecordBatch, topic: str, key: bytes | None, value: bytes) -> Awaitable[object]:
        sent.append((topic, value))
        delivered: asyncio.Future[object] = loop.create_future()
        delivered.set_result(None)
        return delivered

    def failed(error: BaseException) -> None:
        raise AssertionError(f"delivery failed: {error!r}")

    def new_pipeline() -> Pipeline:
        return Pipeline(cast("ModelBoundary[ScoringItem]", boundary), Outputs("pred", "dlq", "late", send),
                        tables.new_cache(scenario.max_clean_cards), allowed_lateness_ms=LATENESS_MS,
                        on_delivery_failure=failed, write_through=write_through)

    pipeline = new_pipeline()
    for partition, run in batches_of(scenario):
        first = run[0][0]
        if first in scenario.flush_before:
            pipeline.cache.flush()
        if first in scenario.restart_before:
            pipeline.cache.flush()
            pipeline = new_pipeline()
        records = [Record("tx", partition, index, 0, ev.card_id.encode(),
                          orjson.dumps({"id": ev.id, "card_id": ev.card_id, "ts": ev.ts, "amount": ev.amount,
                                        "merchant_id": ev.merchant_id})) for index, ev in run]
        await pipeline.handle(cast(Any, FakeBatch(partition, records, acked)))
    await asyncio.sleep(0)  # let delivery callbacks run
    outcomes: dict[int, Outcome] = {}
    late_offsets: list[int] = []
    for topic, value in sent:
        assert topic == "late", f"unexpected output on {topic}: {value!r}"
        body = orjson.loads(value)
        outcomes[body["offset"]] = Late(body["watermark"])
        late_offsets.append(body["offset"])
    for item in boundary.items:
        assert item.record.offset not in outcomes
        outcomes[item.record.offset] = Scored(dict(zip(NAMES, item.features, strict=True)))
    assert sorted(outcomes) == list(range(len(scenario.events)))
    return [outcomes[index] for index in range(len(scenario.events))], late_offsets, acked


@PROPERTY
@given(scenarios(), st.booleans())
def test_pipeline_handle_matches_the_reference(scenario: Scenario, write_through: bool) -> None:
    """The real Pipeline.handle, fed per-partition batches with flushes and restarts between them."""
    outcomes, late_offsets, acked = asyncio.run(run_pipeline(scenario, write_through))
    check(scenario.events, outcomes)
    assert sorted(acked) == sorted(late_offsets)  # late records are acked once delivered (scored ones later)


# --- a long deterministic stream -----------------------------------------------------------------------------


def synthetic_events(count: int, resend_rate: float) -> list[Event]:
    """``count`` generated transactions on 4 partitions (crc32 of the card), plus re-sends 1-20 positions later."""
    generator = TransactionGenerator(cards=300, seed=5, late_rate=0.01)
    originals = [Event(tx["id"], tx["card_id"], zlib.crc32(tx["card_id"].encode()) % 4, tx["ts"], tx["amount"],
                       tx["merchant_id"]) for tx, _ in islice(generator, count)]
    rng = random.Random(5)
    keyed = [((index, 0), ev) for index, ev in enumerate(originals)]
    keyed += [((index + rng.randint(1, 20), 1), ev) for index, ev in enumerate(originals) if rng.random() < resend_rate]
    return [ev for _, ev in sorted(keyed, key=lambda pair: pair[0])]


def test_synthetic_stream_matches_the_reference() -> None:
    """20,000 generated events (1% minutes late) plus ~2% re-sends, flushing every 250 and restarting 3 times."""
    events = synthetic_events(20_000, 0.02)
    worker = Worker(Tables(), max_clean_cards=500)
    outcomes: list[Outcome] = []
    for index, ev in enumerate(events):
        if index and index % 250 == 0:
            worker.flush()
        if index in (5_000, 11_111, 17_003):
            worker.restart()
        outcomes.append(worker.handle(ev))
    scored, late, duplicates = check(events, outcomes)
    assert late > 50 and duplicates > 100 and scored + late == len(events)
    assert any(json.loads(raw)["prev"] is not None for raw in worker.tables.cards.values())  # eviction happened


# --- focused cases --------------------------------------------------------------------------------------------


def test_restart_does_not_readmit_a_late_event() -> None:
    """A late event re-sent after a restart is still late: the restored watermark is the flushed one."""
    worker = Worker(Tables())
    events = [Event("a", "c", 0, T + 10 * 60 * S, 1.0, "m"), Event("late", "c", 0, T, 2.0, "m"),
              Event("late", "c", 0, T, 2.0, "m")]
    outcomes = [worker.handle(events[0]), worker.handle(events[1])]
    worker.restart()
    outcomes.append(worker.handle(events[2]))
    assert outcomes[1] == outcomes[2] == Late(T + 10 * 60 * S - LATENESS_MS)
    check(events, outcomes)


def test_redelivery_behind_the_watermark_keeps_its_whole_window() -> None:
    """A re-send behind the watermark, after the card moved 11 min on, gets its first features (a stays in state)."""
    minute = 60 * S
    events = [Event("a", "c", 0, T + 10 * minute, 1.0, "m"),  # in e's 3600 s window
              Event("e", "c", 0, T + 60 * minute, 2.0, "m"),
              Event("f", "c", 0, T + 71 * minute, 3.0, "m"),  # a cutoff of max - lateness - 1 h would evict a
              Event("e", "c", 0, T + 60 * minute, 2.0, "m")]  # re-sent: below the watermark but replayable
    worker = Worker(Tables())
    outcomes = [worker.handle(ev) for ev in events]
    assert isinstance(outcomes[1], Scored) and isinstance(outcomes[3], Scored)
    assert outcomes[1].features["count_3600"] == 2.0
    assert outcomes[3].features == outcomes[1].features
    check(events, outcomes)


@pytest.mark.parametrize("beyond_ms", [0, 1])
def test_redelivery_at_the_replay_horizon(beyond_ms: int) -> None:
    """A re-send exactly at the replay horizon (card max - lateness - the replay allowance) replays its first
    features; 1 ms older is late."""
    e_ts = T + 30 * 60 * S
    f_ts = e_ts + LATENESS_MS + DEFAULT_SPEC.replay_allowance_ms + beyond_ms
    events = [Event("a", "c", 0, T, 1.0, "m"),  # in e's window, and must survive until e's replay
              Event("e", "c", 0, e_ts, 2.0, "m"),
              Event("f", "c", 0, f_ts, 3.0, "m"),
              Event("e", "c", 0, e_ts, 2.0, "m")]
    worker = Worker(Tables())
    outcomes = [worker.handle(ev) for ev in events[:3]]
    worker.restart()
    outcomes.append(worker.handle(events[3]))
    if beyond_ms:
        assert outcomes[3] == Late(f_ts - LATENESS_MS)
    else:
        assert isinstance(outcomes[1], Scored) and outcomes[1].features["count_3600"] == 2.0
        assert outcomes[3] == outcomes[1]
    check(events, outcomes)


# --- isolation: hostile records among valid ones ------------------------------------------------------------

DEAD_LETTER_REASONS = {"empty_value", "too_large", "invalid_json", "not_an_object", "missing_field", "wrong_type",
                       "out_of_range", "not_finite", "unprintable", "future_timestamp"}
# Every record's Kafka timestamp in run_mixed: after every event time of the scenarios, so only a hostile record
# is ahead of it by more than MAX_FUTURE_MS (the worker's default, SEAM_MAX_FUTURE_S).
KAFKA_TS = T + 10 * 24 * 3600 * S
MAX_FUTURE_MS = 300 * S
JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False)
                           | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                                        max_size=3), max_leaves=8)


@st.composite
def hostile_values(draw: st.DrawFn) -> bytes | None:
    """A value no contract accepts: none or empty, bytes that are not JSON, JSON of any nesting that is not a
    transaction (its id missing), a transaction whose id or card id holds an unprintable character, or one
    whose event time is far ahead of its record's Kafka timestamp."""
    kind = draw(st.sampled_from(("none", "bytes", "nested", "near", "unprintable", "future")))
    if kind == "none":
        return draw(st.sampled_from((None, b"")))
    if kind == "bytes":
        return b"\xff" + draw(st.binary(max_size=40))  # never UTF-8, so never JSON
    near = {"id": "x", "card_id": "c0", "ts": T, "amount": 1.0, "merchant_id": "m0"}
    if kind == "nested":
        return orjson.dumps(draw(JSON_VALUES) if draw(st.booleans()) else {
            k: draw(JSON_VALUES) for k in near if k != "id"})  # no id: never a transaction
    if kind == "future":  # a valid transaction of a scenario's card, stamped ahead of its Kafka timestamp: it
        # would raise its partition's watermark past every later event
        ahead = draw(st.integers(MAX_FUTURE_MS + 1, 2**42))
        return orjson.dumps(near | {"id": f"future-{ahead}", "card_id": draw(st.sampled_from(["c0", "c1", "c2"])),
                                    "ts": KAFKA_TS + ahead})
    if kind == "near":
        field = draw(st.sampled_from(sorted(near)))
        return orjson.dumps(near | {field: draw(st.sampled_from((None, "", [], {"a": [1]}, True, float("inf"), -1)))}
                            | {"id": None})
    bad = draw(st.sampled_from(("\x00", "\n", "\x7f", "\u200b", "\u2028")))
    field = draw(st.sampled_from(("id", "card_id")))
    return orjson.dumps(near | {field: f"c{bad}0"})


async def run_mixed(scenario: Scenario, hostile: dict[int, list[tuple[bytes | None, bytes | None]]]
                    ) -> tuple[list[Outcome], dict[int, str], list[int]]:
    """Pipeline.handle over the scenario's events with the hostile records before the events they are keyed to
    (on the same partition); return the events' outcomes, each hostile offset's dead-letter reason, the acks."""
    tables, boundary = Tables(), FakeBoundary()
    acked: list[int] = []
    sent: list[tuple[str, bytes]] = []
    loop = asyncio.get_running_loop()

    async def send(batch: RecordBatch, topic: str, key: bytes | None, value: bytes) -> Awaitable[object]:
        assert key is None or len(key) <= 1024
        sent.append((topic, value))
        delivered: asyncio.Future[object] = loop.create_future()
        delivered.set_result(None)
        return delivered

    def failed(error: BaseException) -> None:
        raise AssertionError(f"delivery failed: {error!r}")

    def new_pipeline() -> Pipeline:
        return Pipeline(cast("ModelBoundary[ScoringItem]", boundary), Outputs("pred", "dlq", "late", send),
                        tables.new_cache(scenario.max_clean_cards), allowed_lateness_ms=LATENESS_MS,
                        on_delivery_failure=failed, max_future_ms=MAX_FUTURE_MS)

    offsets: dict[int, int] = {}  # event index -> its offset
    hostile_offsets: set[int] = set()
    pipeline, offset = new_pipeline(), 0
    for partition, run in batches_of(scenario):
        first = run[0][0]
        if first in scenario.flush_before:
            pipeline.cache.flush()
        if first in scenario.restart_before:
            pipeline.cache.flush()
            pipeline = new_pipeline()
        records = []
        for index, ev in run:
            for key, value in hostile.get(index, []):
                records.append(Record("tx", partition, offset, KAFKA_TS, key, value))
                hostile_offsets.add(offset)
                offset += 1
            records.append(Record("tx", partition, offset, KAFKA_TS, ev.card_id.encode(), orjson.dumps(
                {"id": ev.id, "card_id": ev.card_id, "ts": ev.ts, "amount": ev.amount, "merchant_id": ev.merchant_id})))
            offsets[index] = offset
            offset += 1
        await pipeline.handle(cast(Any, FakeBatch(partition, records, acked)))
    await asyncio.sleep(0)
    by_offset: dict[int, Outcome] = {}
    reasons: dict[int, str] = {}
    for topic, value in sent:
        body = orjson.loads(value)
        if topic == "dlq":
            assert body["offset"] not in reasons, f"two dead letters for offset {body['offset']}"
            reasons[body["offset"]] = body["reason"]
        else:
            assert topic == "late", topic
            by_offset[body["offset"]] = Late(body["watermark"])
    for item in boundary.items:
        by_offset[item.record.offset] = Scored(dict(zip(NAMES, item.features, strict=True)))
    assert set(reasons) == hostile_offsets, "every hostile record has one dead letter, and only they have"
    return [by_offset[offsets[index]] for index in range(len(scenario.events))], reasons, acked


@PROPERTY
@given(scenarios(), st.data())
def test_hostile_records_change_nothing_for_the_others_and_each_gets_a_dead_letter(
        scenario: Scenario, data: st.DataObject) -> None:
    """Arbitrary keys (bytes of any value, none, a megabyte) and hostile values among the valid records, with
    redeliveries and flushes and restarts: every valid record gets exactly the reference's outcome, every hostile
    one a dead letter with a reason, and Pipeline.handle never raises."""
    keys = st.one_of(st.none(), st.binary(max_size=24), st.builds(bytes, st.just(1_000_000)))  # a megabyte of NUL
    positions = data.draw(st.lists(st.tuples(st.integers(0, len(scenario.events) - 1), keys, hostile_values()),
                                   max_size=12))
    hostile: dict[int, list[tuple[bytes | None, bytes | None]]] = {}
    for index, key, value in positions:
        hostile.setdefault(index, []).append((key, value))
    outcomes, reasons, acked = asyncio.run(run_mixed(scenario, hostile))
    check(scenario.events, outcomes)
    assert set(reasons.values()) <= DEAD_LETTER_REASONS, reasons
    assert set(reasons) <= set(acked), "a dead-lettered record is acknowledged once its letter is delivered"


def test_a_record_from_the_future_is_a_dead_letter_and_moves_no_watermark_across_a_restart() -> None:
    """One valid transaction stamped in 2200 (a terminal with a wrong clock) among a card's events, a restart
    after it: before the bound it raised its partition's watermark, and every later event was late, after the
    restart too (the watermark is in the changelog). Now it is a dead letter that names the bound."""
    events = tuple(Event(f"e{i}", "c0", 0, T + i * 60 * S, float(i), "m") for i in range(6))
    scenario = Scenario(events, flush_before=frozenset(), restart_before=frozenset({3}), max_clean_cards=10,
                        forget_on_restart=True)
    future = orjson.dumps({"id": "from-2200", "card_id": "c0", "ts": 7_258_118_400_000, "amount": 1.0,
                           "merchant_id": "m"})
    outcomes, reasons, _ = asyncio.run(run_mixed(scenario, {1: [(b"c0", future)]}))
    check(events, outcomes)
    assert all(isinstance(outcome, Scored) for outcome in outcomes)
    assert list(reasons.values()) == ["future_timestamp"]


def test_event_time_bounds_hold_to_the_records_own_kafka_timestamp() -> None:
    """Ahead by the bound passes, a millisecond more does not; behind is unbounded unless asked for; a record
    without a Kafka timestamp (-1) is held to nothing. The message says by how much and which setting."""
    pipeline = Pipeline(cast("ModelBoundary[ScoringItem]", FakeBoundary()), Outputs("pred", "dlq", "late", cast(
        Any, None)), Tables().new_cache(10), allowed_lateness_ms=LATENESS_MS, on_delivery_failure=print,
        max_future_ms=MAX_FUTURE_MS, max_past_ms=0)
    tx = Event("e", "c0", 0, KAFKA_TS, 1.0, "m")

    def verdict(ts: int, kafka_ts: int, past_ms: int = 0) -> str | None:
        pipeline._max_past_ms = past_ms
        decoded = pipeline.format.decode(orjson.dumps({"id": tx.id, "card_id": tx.card_id, "ts": ts, "amount": 1.0,
                                                       "merchant_id": "m"}))
        result = pipeline._in_time(decoded, Record("tx", 0, 0, kafka_ts, b"c0", b""))
        return result.reason if isinstance(result, Invalid) else None

    assert verdict(KAFKA_TS + MAX_FUTURE_MS, KAFKA_TS) is None
    assert verdict(KAFKA_TS + MAX_FUTURE_MS + 1, KAFKA_TS) == "future_timestamp"
    assert verdict(7_258_118_400_000, -1) is None  # no Kafka timestamp: nothing to hold it to
    assert verdict(1_000_000_000_000, KAFKA_TS) is None  # 24 years behind: a backfill
    assert verdict(KAFKA_TS - 3600 * S - 1, KAFKA_TS, past_ms=3600 * S) == "past_timestamp"
    assert verdict(KAFKA_TS - 3600 * S, KAFKA_TS, past_ms=3600 * S) is None
    far = pipeline._in_time(pipeline.format.decode(orjson.dumps({"id": "f", "card_id": "c0", "ts": 7_258_118_400_000,
                                                                 "amount": 1.0, "merchant_id": "m"})),
                            Record("tx", 0, 0, 1_764_500_000_000, b"c0", b""))
    assert isinstance(far, Invalid)
    assert far.message == ("event time 2200-01-01T00:00:00.000Z is 5,493,618,400.000 s ahead of the record's Kafka "
                           "timestamp 2025-11-30T10:53:20.000Z; SEAM_MAX_FUTURE_S allows 300 s")
