"""The card-state table layout: a header with the newest events and sealed chunks, written as the state changes."""

from __future__ import annotations

import contextlib
import gc
import random
import sys
import tracemalloc

import orjson
import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from tables import features
from tables.cache import StateCache
from tables.features import DEFAULT_SPEC, KeyState, apply_event, as_plain, memory_bytes, new_state
from tables.key_store import CHUNK_EVENTS, Stored, changes, chunk_key, decode, decode_many, stored_key

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

    def load(self) -> tuple[KeyState, Stored]:
        self.reads = 0
        return decode(self.data.get(KEY), self._get, KEY)

    def _get(self, key: bytes) -> bytes | None:
        self.reads += 1
        return self.data.get(key)


def keys_of(stored: Stored) -> set[bytes]:
    """The keys the table must hold for a card: its header and its listed chunks."""
    return {KEY} | {chunk_key(KEY, chunk[0]) for chunk in stored.chunks}


def same(loaded: Stored, stored: Stored) -> bool:
    """Equal but for chunk starts: a loaded chunk starts at its first event, a written one may start earlier."""
    return ([(c[0], c[2]) for c in loaded.chunks], loaded.tail, loaded.next_chunk, loaded.n, loaded.held,
            loaded.legacy) == ([(c[0], c[2]) for c in stored.chunks], stored.tail, stored.next_chunk, stored.n,
                               stored.held, stored.legacy)


def fill(state: KeyState, count: int, *, start: int = T, step_ms: int = 1_000, prefix: str = "e") -> set[int]:
    """Apply ``count`` in-order events; return their times (what the cache passes as touched)."""
    touched = set()
    for i in range(count):
        ts = start + i * step_ms
        apply_event(state, f"{prefix}{i}", ts, (float(i % 7), f"m{i % 3}"), allowed_lateness_ms=LATENESS_MS)
        touched.add(ts)
    return touched


def test_a_card_with_few_events_is_one_record_read_with_one_get() -> None:
    table, state, stored = Table(), new_state(), Stored()
    table.apply(changes(KEY, state, stored, fill(state, CHUNK_EVENTS - 1)))
    assert set(table.data) == {KEY} and stored.chunks == []
    loaded, loaded_stored = table.load()
    assert loaded == state and table.reads == 0  # the header alone
    assert same(loaded_stored, stored)


def test_a_full_tail_is_sealed_and_loading_costs_one_read_per_chunk() -> None:
    table, state, stored = Table(), new_state(), Stored()
    table.apply(changes(KEY, state, stored, fill(state, 10 * CHUNK_EVENTS + 5)))
    assert len(stored.chunks) == 10 and all(chunk[2] == CHUNK_EVENTS for chunk in stored.chunks)
    assert set(table.data) == keys_of(stored)
    assert len(orjson.loads(table.data[KEY])["e"][0]) == 5  # the tail: the newest events
    loaded, loaded_stored = table.load()
    assert loaded == state and table.reads == 10
    assert same(loaded_stored, stored)


def test_a_flush_writes_what_changed_not_what_the_card_holds() -> None:
    table, state, stored = Table(), new_state(), Stored()
    table.apply(changes(KEY, state, stored, fill(state, 2_000, step_ms=3_000)))  # 100 minutes, all kept
    full = table.bytes_written
    table.bytes_written = 0
    ts = T + 2_000 * 3_000
    apply_event(state, "new", ts, (10.0, "m"), allowed_lateness_ms=LATENESS_MS)
    writes = changes(KEY, state, stored, {ts})
    table.apply(writes)
    assert [key for key, _ in writes] == [KEY]  # the event went to the tail, in the header
    assert table.bytes_written * 50 < full, (table.bytes_written, full)
    assert table.load()[0] == state


class _CountedChunks(list):  # type: ignore[type-arg]
    """A chunk list that counts how many of its chunks are read."""

    reads = 0

    def __getitem__(self, index):  # type: ignore[no-untyped-def]
        _CountedChunks.reads += 1
        return super().__getitem__(index)

    def __iter__(self):  # type: ignore[no-untyped-def]
        for index in range(len(self)):
            yield self[index]


def test_a_write_reads_the_chunks_that_changed_not_every_chunk_held() -> None:
    """A hot key holds thousands of chunks and is written every write interval: a write that walked them all
    cost 5 ms after an hour at 100 events/s. A new event in order, and a late one, read a few of 1,000."""
    table, state, stored = Table(), new_state(), Stored()
    table.apply(changes(KEY, state, stored, fill(state, 1_000 * CHUNK_EVENTS, step_ms=2)))
    assert len(stored.chunks) == 1_000
    stored.chunks = _CountedChunks(stored.chunks)
    _CountedChunks.reads = 0
    touched = fill(state, 1, start=state["ts"][-1] + 1, prefix="new")
    table.apply(changes(KEY, state, stored, touched))
    late = stored.chunks[500][1] + 1
    apply_event(state, "late", late, (1.0, "m"), allowed_lateness_ms=LATENESS_MS)
    table.apply(changes(KEY, state, stored, {late}))
    assert _CountedChunks.reads < 60, _CountedChunks.reads
    loaded, loaded_stored = table.load()
    assert loaded == state and same(loaded_stored, stored) and set(table.data) == keys_of(stored)


def test_a_late_event_rewrites_only_the_chunk_it_falls_into() -> None:
    table, state, stored = Table(), new_state(), Stored()
    table.apply(changes(KEY, state, stored, fill(state, 6 * CHUNK_EVENTS, step_ms=100)))
    target = stored.chunks[3]
    ts = target[1] + 50  # inside chunk 3, well within the lateness
    apply_event(state, "late", ts, (1.0, "m"), allowed_lateness_ms=LATENESS_MS)
    writes = changes(KEY, state, stored, {ts})
    assert [key for key, _ in writes] == [chunk_key(KEY, target[0]), KEY]
    assert stored.chunks[3] == (target[0], target[1], CHUNK_EVENTS + 1)
    table.apply(writes)
    assert table.load()[0] == state


def test_eviction_deletes_emptied_chunks_after_the_header_and_rewrites_the_cut_one() -> None:
    table, state, stored = Table(), new_state(), Stored()
    horizon_ms = DEFAULT_SPEC.horizon_ms
    table.apply(changes(KEY, state, stored, fill(state, 4 * CHUNK_EVENTS, step_ms=1_000, prefix="old")))
    first, second = stored.chunks[0][0], stored.chunks[1][0]
    ts = T + (CHUNK_EVENTS + 10) * 1_000 + horizon_ms + 1  # evicts chunk 0 and 11 events of chunk 1
    apply_event(state, "new", ts, (1.0, "m"), allowed_lateness_ms=LATENESS_MS)
    writes = changes(KEY, state, stored, {ts})
    keys = [key for key, _ in writes]
    assert keys == [chunk_key(KEY, second), KEY, chunk_key(KEY, first)] and writes[-1][1] is None
    table.apply(writes)
    loaded, _ = table.load()
    assert loaded == state and loaded["id"][0] == f"old{CHUNK_EVENTS + 11}"
    assert set(table.data) == keys_of(stored)


def legacy_columns(state: KeyState) -> dict[str, object]:
    """A state as earlier seams held it: named columns of the example spec's amount and merchant."""
    plain = as_plain(state)
    return {"n": plain["n"], "prev": plain["prev"], "ts": plain["ts"], "amt": plain["values"][0],
            "mer": plain["values"][1], "id": plain["id"], "seq": plain["seq"]}


def test_a_state_written_whole_by_an_earlier_seam_is_read_and_rewritten_in_chunks() -> None:
    state = new_state()
    fill(state, 2 * CHUNK_EVENTS, step_ms=20_000)
    table = Table()
    table.data[KEY] = orjson.dumps(legacy_columns(state))
    loaded, stored = table.load()
    assert loaded == state and stored.legacy == []
    apply_event(loaded, "next", T + 200 * 20_000, (2.0, "m"), allowed_lateness_ms=LATENESS_MS)
    table.apply(changes(KEY, loaded, stored, {T + 200 * 20_000}))
    again, again_stored = table.load()
    assert again == loaded and again_stored.legacy is None
    assert len(again_stored.chunks) == 2 and set(table.data) == keys_of(again_stored)


def test_per_minute_buckets_of_an_earlier_seam_are_read_and_replaced() -> None:
    state = new_state()
    fill(state, 30, step_ms=20_000)
    table = Table()
    minutes = sorted({ts // 60_000 for ts in state["ts"]})
    for minute in minutes:
        index = [i for i, ts in enumerate(state["ts"]) if ts // 60_000 == minute]
        table.data[KEY + b"\x00" + str(minute).encode()] = orjson.dumps(
            [[legacy_columns(state)[c][i] for i in index] for c in ("ts", "amt", "mer", "id", "seq")])
    table.data[KEY] = orjson.dumps({"v": 2, "n": state["n"], "prev": state["prev"], "b": minutes})
    loaded, stored = table.load()
    assert loaded == state and len(stored.legacy or []) == len(minutes)
    table.apply(changes(KEY, loaded, stored, set()))
    assert set(table.data) == {KEY} and table.load()[0] == state


def test_a_chunk_rewritten_before_a_lost_header_does_not_reuse_an_arrival_number() -> None:
    table, state, stored = Table(), new_state(), Stored()
    table.apply(changes(KEY, state, stored, fill(state, 3 * CHUNK_EVENTS, step_ms=100)))
    ts = stored.chunks[1][1] + 10
    apply_event(state, "late", ts, (1.0, "m"), allowed_lateness_ms=LATENESS_MS)
    writes = changes(KEY, state, stored, {ts})
    table.apply(writes[:-1])  # the crash lost the header
    loaded, _ = table.load()
    assert "late" in loaded["id"] and loaded["n"] == state["n"]


@hsettings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), flush_every=st.integers(1, 80), spread_s=st.sampled_from([0, 5, 60, 900]))
def test_any_sequence_of_events_and_flushes_restores_exactly(seed: int, flush_every: int, spread_s: int) -> None:
    """Out-of-order events, ties, redeliveries, evictions: the table always restores the in-memory state."""
    rng = random.Random(seed)
    table, state, stored = Table(), new_state(), Stored()
    touched: set[int] = set()
    now, ids = T, []
    for i in range(400):
        now += rng.randint(0, spread_s * 1000)
        if ids and rng.random() < 0.05:
            event_id, ts = rng.choice(ids)  # a redelivery
        else:
            event_id, ts = f"e{i}", now - rng.randint(0, LATENESS_MS)
            ids.append((event_id, ts))
        applied = apply_event(state, event_id, ts, (rng.random() * 100, f"m{rng.randint(0, 5)}"),
                              allowed_lateness_ms=LATENESS_MS)
        if not applied.duplicate:
            touched.add(ts)
        if i % flush_every == 0:
            table.apply(changes(KEY, state, stored, touched))
            touched = set()
            loaded, loaded_stored = table.load()
            assert loaded == state
            assert same(loaded_stored, stored)
            assert set(table.data) == keys_of(stored)
            if rng.random() < 0.2:  # a restart: continue from what the table holds
                state, stored = loaded, loaded_stored


@pytest.mark.parametrize("events, indexed", [(1, False), (5, False), (50, False), (200, False), (255, False),
                                            (1000, False), (200, True), (1000, True)])
def test_memory_bytes_is_what_a_cached_card_takes(events: int, indexed: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cache is sized by ``memory_bytes``: within 10 % of what tracemalloc measures per card for cards read
    back from their table into a :class:`StateCache` (its entries, keys and states; ids of 20 characters,
    merchants interned and held already, as a worker's repeat across cards), with a window index once a card
    has one. What the second half of many cards adds: one card alone would also count the free lists its
    decoding fills."""
    monkeypatch.setattr(features, "INDEX_AFTER", 0)
    monkeypatch.setattr(features, "HOT_EVENTS", 96)  # an index for 200 events too: what an indexed event takes
    rng = random.Random(events)
    cards = 32 * max(2, 5_000_000 // memory_bytes(events, indexed) // 32)  # 2.5 MB measured, at least 64 cards
    table: dict[bytes, bytes] = {}
    for card in range(cards):
        state = new_state()
        for i in range(events):
            values = (round(rng.uniform(1, 500), 2), sys.intern(f"m-{rng.randrange(5000)}"))  # held by the worker
            apply_event(state, f"soak1a2b3c-{rng.randrange(10**9):09d}", T + i * 4_000, values,  # all held
                        allowed_lateness_ms=LATENESS_MS)
        table.update(changes(stored_key(f"card-{card:07d}-0123"), state, Stored(), set(state["ts"])))
    cache = StateCache(load_state=lambda key: None, store_state=lambda *args: 0, load_watermark=lambda: None,
                       store_watermark=lambda max_ts: None, scope=lambda partition: contextlib.nullcontext(),
                       allowed_lateness_ms=LATENESS_MS,
                       load_states=lambda keys: decode_many([stored_key(key) for key in keys],
                                                            lambda raw: [table.get(key) for key in raw]))
    cache.watermark(0)
    tracemalloc.start()
    try:
        traced = []  # after the first half of the cards and after the rest: what the second half took
        second_half: list[KeyState] = []
        for first in range(0, cards, 16):
            if first == cards // 2:
                gc.collect()
                traced.append(tracemalloc.get_traced_memory()[0])
            keys = [f"card-{card:07d}-0123" for card in range(first, first + 16)]  # as records bring them
            cache.prefetch(0, keys)
            for key in keys:
                state = cache.state(0, key)
                if indexed:
                    apply_event(state, f"one-more-event-{key}", state["ts"][-1] + 1, (1.0, "m-1"),
                                allowed_lateness_ms=LATENESS_MS)
                    assert state.index is not None
                if traced:
                    second_half.append(state)
        gc.collect()
        traced.append(tracemalloc.get_traced_memory()[0])
    finally:
        tracemalloc.stop()
    assert len(second_half) == cards // 2
    measured = (traced[1] - traced[0]) / len(second_half)
    expected = sum(memory_bytes(len(state["ts"]), indexed) for state in second_half) / len(second_half)
    assert 0.9 <= measured / expected <= 1.1, (measured, expected)


def test_decode_many_reads_the_headers_then_every_chunk_in_two_batched_reads() -> None:
    """Several cards of one partition: one read of all headers, one of all their chunks; a card the table
    does not hold is None; each card decodes as it does alone."""
    table = Table()
    cards = {b"quiet": 3, b"busy": 4 * CHUNK_EVENTS + 3, b"full": 2 * CHUNK_EVENTS}
    for key, count in cards.items():
        state, stored = new_state(), Stored()
        table.apply(changes(key, state, stored, fill(state, count, prefix=key.decode())))
    reads: list[list[bytes]] = []

    def get_many(keys: list[bytes]) -> list[bytes | None]:
        reads.append(keys)
        return [table.data.get(key) for key in keys]

    keys = [b"busy", b"nobody", b"quiet", b"full"]
    loaded = decode_many(keys, get_many)
    assert reads[0] == keys and len(reads) == 2 and len(reads[1]) == 4 + 2
    assert loaded[1] is None
    for key, found in zip(keys, loaded, strict=True):
        if key in table.data:
            assert found is not None
            alone = decode(table.data[key], table.data.get, key)
            assert found[0] == alone[0] and same(found[1], alone[1])
    assert decode_many([b"quiet"], get_many)[0] is not None and len(reads) == 3  # no chunk: no second read


@hsettings(max_examples=300, derandomize=True, database=None, deadline=None)
@given(st.lists(st.text(alphabet="a\x00c0123", min_size=1, max_size=6), min_size=2, max_size=6, unique=True))
def test_no_key_stores_a_record_under_another_keys_table_key(keys: list[str]) -> None:
    """Whatever a key holds (NUL bytes, a NUL and "c" and digits, a suffix of another key), the table keys of its
    header and of its chunks are its own: ``"a\\x00c0"``'s header is not ``"a"``'s chunk 0."""
    owner: dict[bytes, str] = {}
    for key in keys:
        for table_key in (stored_key(key), *(chunk_key(stored_key(key), chunk) for chunk in range(12))):
            assert owner.setdefault(table_key, key) == key, f"{key!r} and {owner[table_key]!r} share {table_key!r}"
    assert stored_key("c-42") == b"c-42"  # a key without NUL is stored as before


def test_a_key_holding_nul_keeps_its_state_apart_from_the_key_it_starts_with() -> None:
    table = Table()
    for key, amount in (("a", 1.0), ("a\x00c0", 2.0)):
        state = new_state()
        apply_event(state, f"{key}-e", T, (amount, "m"), allowed_lateness_ms=LATENESS_MS)
        state_key = stored_key(key)
        for write_key, value in changes(state_key, state, Stored(), {T}):
            table.data[write_key] = value
    for key, amount in (("a", 1.0), ("a\x00c0", 2.0)):
        state_key = stored_key(key)
        loaded, _ = decode(table.data[state_key], table.data.get, state_key)
        assert list(loaded["values"][0]) == [amount] and loaded["id"] == [f"{key}-e"]
