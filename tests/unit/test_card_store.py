"""The card-state table layout: a header and per-minute buckets, written as the state changes."""

from __future__ import annotations

import random

import orjson
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from tables.card_store import BUCKET_MS, Stored, bucket_key, changes, decode
from tables.features import DEFAULT_SPEC, CardState, apply_event, new_state

LATENESS_MS = 60_000
T = 1_764_500_000_000
KEY = b"card-1"


class Table:
    """One partition of the card-state table: bytes to bytes, with every write counted."""

    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}
        self.bytes_written = 0

    def apply(self, writes: list[tuple[bytes, bytes | None]]) -> None:
        for key, value in writes:
            if value is None:
                assert key in self.data, f"tombstone for {key!r}, which was never written"
                del self.data[key]
            else:
                self.data[key] = value
                self.bytes_written += len(key) + len(value)

    def load(self) -> tuple[CardState, Stored]:
        return decode(self.data.get(KEY), self.data.get, KEY)


def test_a_card_round_trips_through_its_header_and_buckets() -> None:
    table, state, stored = Table(), new_state(), Stored()
    touched: set[int] = set()
    for i in range(30):
        ts = T + i * 20_000
        apply_event(state, f"e{i}", ts, float(i), f"m{i % 3}", allowed_lateness_ms=LATENESS_MS)
        touched.add(ts // BUCKET_MS)
    table.apply(changes(KEY, state, stored, touched))
    loaded, loaded_stored = table.load()
    assert loaded == state
    assert loaded_stored.buckets == stored.buckets == {(T + i * 20_000) // BUCKET_MS for i in range(30)}
    assert set(table.data) == {KEY} | {bucket_key(KEY, b) for b in stored.buckets}


def test_a_flush_writes_what_changed_not_what_the_card_holds() -> None:
    table, state, stored = Table(), new_state(), Stored()
    for i in range(2_000):  # one event every 3 s: 100 minutes of events, all within the horizon
        apply_event(state, f"e{i}", T + i * 3_000, 10.0, "m", allowed_lateness_ms=LATENESS_MS)
    table.apply(changes(KEY, state, stored, {(T + i * 3_000) // BUCKET_MS for i in range(2_000)}))
    full = table.bytes_written
    table.bytes_written = 0
    ts = T + 2_000 * 3_000
    apply_event(state, "new", ts, 10.0, "m", allowed_lateness_ms=LATENESS_MS)
    writes = changes(KEY, state, stored, {ts // BUCKET_MS})
    table.apply(writes)
    assert len(writes) == 2  # the bucket that got the event, the header
    assert table.bytes_written * 50 < full, (table.bytes_written, full)
    assert table.load()[0] == state


def test_eviction_deletes_emptied_buckets_after_the_header_and_rewrites_the_cut_one() -> None:
    table, state, stored = Table(), new_state(), Stored()
    horizon_ms = LATENESS_MS + 2 * DEFAULT_SPEC.max_window_ms
    for i in range(10):
        apply_event(state, f"old{i}", T + i * 25_000, 1.0, "m", allowed_lateness_ms=LATENESS_MS)
    table.apply(changes(KEY, state, stored, {(T + i * 25_000) // BUCKET_MS for i in range(10)}))
    old_buckets = set(stored.buckets)
    ts = T + 4 * 25_000 + horizon_ms + 1  # evicts old0..old4
    apply_event(state, "new", ts, 1.0, "m", allowed_lateness_ms=LATENESS_MS)
    writes = changes(KEY, state, stored, {ts // BUCKET_MS})
    header_at = [key for key, _ in writes].index(KEY)
    tombstones = [key for key, value in writes if value is None]
    assert tombstones and all(i > header_at for i, (_, v) in enumerate(writes) if v is None)
    table.apply(writes)
    loaded, _ = table.load()
    assert loaded == state and loaded["id"][0] == "old5"
    assert set(table.data) == {KEY} | {bucket_key(KEY, b) for b in stored.buckets}
    assert stored.buckets < old_buckets | {ts // BUCKET_MS}


def test_a_state_written_whole_by_an_earlier_seam_is_read_and_rewritten_in_buckets() -> None:
    state = new_state()
    for i in range(5):
        apply_event(state, f"e{i}", T + i * 70_000, 2.0, "m", allowed_lateness_ms=LATENESS_MS)
    table = Table()
    table.data[KEY] = orjson.dumps(state)
    loaded, stored = table.load()
    assert loaded == state and stored.legacy
    apply_event(loaded, "e5", T + 5 * 70_000, 2.0, "m", allowed_lateness_ms=LATENESS_MS)
    table.apply(changes(KEY, loaded, stored, {(T + 5 * 70_000) // BUCKET_MS}))
    again, again_stored = table.load()
    assert again == loaded and not again_stored.legacy
    assert len(again_stored.buckets) == 6


@hsettings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), flush_every=st.integers(1, 40), spread_s=st.sampled_from([5, 60, 900]))
def test_any_sequence_of_events_and_flushes_restores_exactly(seed: int, flush_every: int, spread_s: int) -> None:
    """Out-of-order events, redeliveries, evictions: the table always restores the in-memory state."""
    rng = random.Random(seed)
    table, state, stored = Table(), new_state(), Stored()
    touched: set[int] = set()
    now, ids = T, []
    for i in range(300):
        now += rng.randint(0, spread_s * 1000)
        if ids and rng.random() < 0.05:
            event_id, ts = rng.choice(ids)  # a redelivery
        else:
            event_id, ts = f"e{i}", now - rng.randint(0, LATENESS_MS)
            ids.append((event_id, ts))
        applied = apply_event(state, event_id, ts, rng.random() * 100, f"m{rng.randint(0, 5)}",
                              allowed_lateness_ms=LATENESS_MS)
        if not applied.duplicate:
            touched.add(ts // BUCKET_MS)
        if i % flush_every == 0:
            table.apply(changes(KEY, state, stored, touched))
            touched = set()
            loaded, loaded_stored = table.load()
            assert loaded == state
            assert loaded_stored.buckets == stored.buckets
            assert set(table.data) == {KEY} | {bucket_key(KEY, b) for b in stored.buckets}
            if rng.random() < 0.2:  # a restart: continue from what the table holds
                state, stored = loaded, loaded_stored
