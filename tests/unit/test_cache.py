"""Unit tests for tables.cache.StateCache over dict-backed tables with a partition-recording scope."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from tables.cache import StateCache, StateLayoutError
from tables.features import KeyState, apply_event, memory_bytes, new_state
from tables.key_store import Stored
from tables.spec import FeatureSpec, parse_spec
from tests.specs import fraud_like

LATENESS_MS = 60_000
T = 1_764_500_000_000


class Tables:
    """Partitioned dict tables; every access is logged with the partition that was current during it."""

    def __init__(self) -> None:
        self.cards: dict[tuple[int, str], KeyState] = {}
        self.watermarks: dict[int, int] = {}
        self.current: int | None = None
        self.log: list[tuple[str, int | None, object]] = []

    @contextmanager
    def scope(self, partition: int) -> Iterator[None]:
        assert self.current is None, "scopes must not nest"
        self.current = partition
        try:
            yield
        finally:
            self.current = None

    def load_state(self, card_id: str) -> tuple[KeyState, Stored] | None:
        self.log.append(("load_state", self.current, card_id))
        state = self.cards.get((self._partition(), card_id))
        if state is None:
            return None
        return copy.deepcopy(state), Stored(n=state["n"], held=len(state["ts"]))  # like a RocksDB read: a fresh object

    def store_state(self, card_id: str, state: KeyState, stored: Stored, touched: set[int]) -> int:
        self.log.append(("store_state", self.current, card_id))
        self.cards[(self._partition(), card_id)] = copy.deepcopy(state)
        stored.n, stored.held = state["n"], len(state["ts"])  # as tables.key_store.changes() records it
        return 1

    def load_watermark(self) -> int | None:
        self.log.append(("load_watermark", self.current, None))
        return self.watermarks.get(self._partition())

    def store_watermark(self, max_ts: int) -> None:
        self.log.append(("store_watermark", self.current, max_ts))
        self.watermarks[self._partition()] = max_ts

    def _partition(self) -> int:
        assert self.current is not None, "table access outside a partition scope"
        return self.current

    def ops(self, name: str) -> list[tuple[int | None, object]]:
        """(partition, key) of every logged access of one kind."""
        return [(partition, key) for op, partition, key in self.log if op == name]


@pytest.fixture
def tables() -> Tables:
    return Tables()


@pytest.fixture
def make_cache(tables: Tables) -> Callable[..., StateCache]:
    """Factory: a StateCache over ``tables`` (keyword arguments override the defaults)."""

    def make(max_clean_bytes: int = 256 << 20) -> StateCache:
        return StateCache(load_state=tables.load_state, store_state=tables.store_state,
                          load_watermark=tables.load_watermark, store_watermark=tables.store_watermark,
                          scope=tables.scope, allowed_lateness_ms=LATENESS_MS, max_clean_bytes=max_clean_bytes)

    return make


def stored_state(event_id: str = "e1", ts: int = T) -> KeyState:
    """A non-empty card state."""
    state = new_state()
    apply_event(state, event_id, ts, (5.0, "m"), allowed_lateness_ms=LATENESS_MS)
    return state


def apply(state: KeyState, event_id: str, ts: int = T) -> None:
    apply_event(state, event_id, ts, (1.0, "m"), allowed_lateness_ms=LATENESS_MS)


# --- card(), peek() ------------------------------------------------------------------------------------------


def test_card_loads_once_in_its_partition_scope_and_caches(
    tables: Tables, make_cache: Callable[..., StateCache]
) -> None:
    tables.cards[(2, "c")] = stored_state()
    cache = make_cache()
    first = cache.state(2, "c")
    assert first == stored_state()
    assert cache.state(2, "c") is first
    assert tables.ops("load_state") == [(2, "c")]


def test_lookups_count_hits_and_misses_and_time_each_table_read(tables: Tables) -> None:
    now = [100.0]

    def load_state(card_id: str) -> tuple[KeyState, Stored] | None:
        now[0] += 0.003 if card_id == "stored" else 0.001  # the table read takes this long
        return tables.load_state(card_id)

    tables.cards[(0, "stored")] = stored_state()
    loads: list[float] = []
    cache = StateCache(load_state=load_state, store_state=tables.store_state, load_watermark=tables.load_watermark,
                       store_watermark=tables.store_watermark, scope=tables.scope, allowed_lateness_ms=LATENESS_MS,
                       on_load=loads.append, clock=lambda: now[0])
    cache.state(0, "stored")
    cache.state(0, "stored")
    cache.state(0, "new")
    cache.state(0, "stored")
    cache.peek(0, "other")  # a web view's look: not a pipeline lookup
    assert (cache.hits, cache.misses) == (2, 2)
    assert loads == pytest.approx([0.003, 0.001])


def test_prefetch_reads_the_missing_cards_together_and_counts_each_as_one_miss(tables: Tables) -> None:
    """One batched read, in the partition's scope, for the cards not cached (each once, however often it
    comes); card() then answers from memory, counted as that lookup's miss; the read's time is shared."""
    now = [100.0]
    batches: list[tuple[int | None, list[str]]] = []

    def load_states(card_ids: list[str]) -> list[tuple[KeyState, Stored] | None]:
        batches.append((tables.current, card_ids))
        now[0] += 0.004
        return [tables.cards.get((0, card_id)) and (copy.deepcopy(tables.cards[(0, card_id)]),
                                                    Stored(n=1, held=1)) for card_id in card_ids]

    tables.cards[(0, "stored")] = stored_state(ts=T + 5_000)
    loads: list[float] = []
    cache = StateCache(load_state=tables.load_state, load_states=load_states, store_state=tables.store_state,
                       load_watermark=tables.load_watermark, store_watermark=tables.store_watermark,
                       scope=tables.scope, allowed_lateness_ms=LATENESS_MS, on_load=loads.append,
                       clock=lambda: now[0])
    cache.state(0, "cached")
    cache.prefetch(0, ["stored", "cached", "new", "stored"])
    assert batches == [(0, ["stored", "new"])] and loads == pytest.approx([0.0, 0.002, 0.002])  # "cached", then both
    assert cache.watermark(0).max_ts == T + 5_000  # raised to the loaded card's newest event, as card() does
    assert cache.state(0, "stored") == stored_state(ts=T + 5_000) and cache.state(0, "new") == new_state()
    cache.state(0, "stored")
    cache.prefetch(0, ["stored", "new", "cached"])  # all cached: no read
    assert len(batches) == 1 and tables.ops("load_state") == [(0, "cached")]
    assert (cache.hits, cache.misses) == (1, 3)
    assert cache.last_bytes_held == memory_bytes(0) * 2 + memory_bytes(1)


def test_unknown_card_is_a_new_state_loaded_once(tables: Tables, make_cache: Callable[..., StateCache]) -> None:
    cache = make_cache()
    state = cache.state(0, "nobody")
    assert state == new_state()
    apply(state, "e1")
    assert cache.state(0, "nobody") is state and state["id"] == ["e1"]
    assert tables.ops("load_state") == [(0, "nobody")]


def test_same_card_id_in_two_partitions_is_two_states(tables: Tables, make_cache: Callable[..., StateCache]) -> None:
    tables.cards[(1, "c")] = stored_state("in-1")
    cache = make_cache()
    assert cache.state(1, "c")["id"] == ["in-1"]
    assert cache.state(3, "c") == new_state()
    assert tables.ops("load_state") == [(1, "c"), (3, "c")]


def test_peek_returns_the_cached_state_without_loading(tables: Tables, make_cache: Callable[..., StateCache]) -> None:
    cache = make_cache()
    state = cache.state(0, "c")
    apply(state, "unflushed")
    assert cache.peek(0, "c") is state
    assert tables.ops("load_state") == [(0, "c")]


def test_peek_loads_in_scope_but_does_not_cache(tables: Tables, make_cache: Callable[..., StateCache]) -> None:
    tables.cards[(1, "c")] = stored_state()
    cache = make_cache()
    assert cache.peek(1, "c") == stored_state()
    assert cache.peek(1, "c") == stored_state()
    assert cache.peek(1, "unknown") is None
    assert tables.ops("load_state") == [(1, "c"), (1, "c"), (1, "unknown")]
    cache.state(1, "c")  # peek cached nothing: card() loads again
    assert tables.ops("load_state")[-1] == (1, "c") and len(tables.ops("load_state")) == 4


# --- touch(), flush() ----------------------------------------------------------------------------------------


def test_flush_writes_each_touched_card_once_in_its_scope(
    tables: Tables, make_cache: Callable[..., StateCache]
) -> None:
    cache = make_cache()
    a, b = cache.state(0, "a"), cache.state(1, "b")
    cache.state(1, "untouched")
    for i in range(3):
        apply(a, f"a{i}", T + i)
        cache.touch(0, "a")
    apply(b, "b0")
    cache.touch(1, "b")
    assert cache.dirty_keys() == 2
    assert tables.ops("store_state") == []  # nothing is written before a flush
    assert cache.flush() == 2
    assert sorted(tables.ops("store_state"), key=str) == [(0, "a"), (1, "b")]
    assert tables.cards[(0, "a")]["id"] == ["a0", "a1", "a2"]
    assert tables.cards[(1, "b")]["id"] == ["b0"]
    assert (1, "untouched") not in tables.cards
    assert cache.dirty_keys() == 0


def test_a_second_flush_writes_only_what_was_touched_since(
    tables: Tables, make_cache: Callable[..., StateCache]
) -> None:
    cache = make_cache()
    a, b = cache.state(0, "a"), cache.state(0, "b")
    apply(a, "a0")
    apply(b, "b0")
    cache.touch(0, "a")
    cache.touch(0, "b")
    cache.flush()
    assert cache.flush() == 0
    apply(b, "b1", T + 1)
    cache.touch(0, "b")
    assert cache.flush() == 1
    assert tables.ops("store_state") in ([(0, "a"), (0, "b"), (0, "b")], [(0, "b"), (0, "a"), (0, "b")])
    assert tables.cards[(0, "b")]["id"] == ["b0", "b1"]


def test_table_holds_a_snapshot_of_the_flushed_state(tables: Tables, make_cache: Callable[..., StateCache]) -> None:
    cache = make_cache()
    state = cache.state(0, "c")
    apply(state, "flushed")
    cache.touch(0, "c")
    cache.flush()
    apply(state, "not-yet", T + 1)  # changed after the flush, not touched
    assert tables.cards[(0, "c")]["id"] == ["flushed"]
    assert cache.flush() == 0


# --- watermarks ----------------------------------------------------------------------------------------------


def test_watermark_is_restored_from_the_table_once(tables: Tables, make_cache: Callable[..., StateCache]) -> None:
    tables.watermarks[3] = T
    cache = make_cache()
    watermark = cache.watermark(3)
    assert watermark.max_ts == T and watermark.value == T - LATENESS_MS
    assert watermark.is_late(T - LATENESS_MS - 1) and not watermark.is_late(T - LATENESS_MS)
    assert cache.watermark(3) is watermark
    unknown = cache.watermark(0)
    assert unknown.max_ts is None and unknown.value is None
    assert tables.ops("load_watermark") == [(3, None), (0, None)]


def test_touched_watermark_is_stored_in_its_scope_on_flush(
    tables: Tables, make_cache: Callable[..., StateCache]
) -> None:
    cache = make_cache()
    cache.watermark(1).observe(T + 5)
    cache.watermark(2).observe(T + 9)  # observed but not touched: not written
    cache.touch_watermark(1)
    assert tables.ops("store_watermark") == []
    assert cache.flush() == 1
    assert tables.ops("store_watermark") == [(1, T + 5)]
    assert tables.watermarks == {1: T + 5}
    assert cache.flush() == 0  # no longer dirty


def test_touched_watermark_without_events_is_not_stored(
    tables: Tables, make_cache: Callable[..., StateCache]
) -> None:
    cache = make_cache()
    cache.watermark(0)
    cache.touch_watermark(0)
    assert cache.flush() == 0
    assert tables.ops("store_watermark") == [] and tables.watermarks == {}


def test_flushed_state_and_watermark_restore_into_a_new_cache(
    tables: Tables, make_cache: Callable[..., StateCache]
) -> None:
    cache = make_cache()
    apply(cache.state(2, "c"), "e1", T + 7)
    cache.touch(2, "c")
    cache.watermark(2).observe(T + 7)
    cache.touch_watermark(2)
    assert cache.flush() == 2
    restored = make_cache()
    assert restored.state(2, "c")["id"] == ["e1"]
    assert restored.watermark(2).max_ts == T + 7


# --- acknowledgements and epochs -----------------------------------------------------------------------------


def test_flush_increments_the_epoch_even_with_nothing_to_write(make_cache: Callable[..., StateCache]) -> None:
    cache = make_cache()
    assert cache.write_round == 0
    cache.flush()
    cache.flush()
    assert cache.write_round == 2 and cache.flushes == 2 and cache.writes == 0


def test_ack_of_the_current_epoch_waits_for_the_next_flush_then_runs_once(
    make_cache: Callable[..., StateCache],
) -> None:
    cache = make_cache()
    runs: list[str] = []
    cache.ack_when_flushed(cache.write_round, lambda: runs.append("a"))
    cache.ack_when_flushed(cache.write_round, lambda: runs.append("b"))
    assert runs == []
    cache.flush()
    assert runs == ["a", "b"]
    cache.flush()
    assert runs == ["a", "b"]


def test_ack_of_an_older_epoch_runs_immediately(make_cache: Callable[..., StateCache]) -> None:
    cache = make_cache()
    stamped = cache.write_round
    cache.flush()
    runs: list[int] = []
    cache.ack_when_flushed(stamped, lambda: runs.append(stamped))
    assert runs == [stamped]
    cache.flush()
    assert runs == [stamped]


def test_deferred_acks_run_after_the_writes_they_wait_for(
    tables: Tables, make_cache: Callable[..., StateCache]
) -> None:
    cache = make_cache()
    apply(cache.state(0, "c"), "e1")
    cache.touch(0, "c")
    cache.watermark(0).observe(T)
    cache.touch_watermark(0)
    cache.ack_when_flushed(cache.write_round, lambda: tables.log.append(("ack", None, None)))
    cache.flush()
    assert [op for op, _, _ in tables.log if op != "load_state" and op != "load_watermark"] == [
        "store_state", "store_watermark", "ack"]


def test_ack_stamped_after_a_flush_waits_for_the_following_one(make_cache: Callable[..., StateCache]) -> None:
    cache = make_cache()
    cache.flush()
    runs: list[str] = []
    cache.ack_when_flushed(cache.write_round, lambda: runs.append("late"))
    assert runs == []
    cache.flush()
    assert runs == ["late"]


# --- forget() ------------------------------------------------------------------------------------------------


def test_forget_drops_states_watermarks_dirty_marks_and_deferred_acks(
    tables: Tables, make_cache: Callable[..., StateCache]
) -> None:
    tables.cards[(0, "c")] = stored_state("stored")
    tables.watermarks[0] = T
    cache = make_cache()
    apply(cache.state(0, "c"), "unflushed", T + 1)
    cache.touch(0, "c")
    cache.watermark(0).observe(T + 1)
    cache.touch_watermark(0)
    runs: list[str] = []
    cache.ack_when_flushed(cache.write_round, lambda: runs.append("ack"))
    cache.forget()
    assert cache.dirty_keys() == 0
    assert cache.state(0, "c")["id"] == ["stored"]  # reloaded: the unflushed change is gone
    assert cache.watermark(0).max_ts == T  # reloaded from the table
    assert len(tables.ops("load_state")) == 2 and len(tables.ops("load_watermark")) == 2
    assert cache.flush() == 0
    assert runs == []  # a forgotten ack never runs
    assert tables.ops("store_state") == [] and tables.ops("store_watermark") == []


# --- max_clean_bytes -----------------------------------------------------------------------------------------


def test_clean_cache_is_cleared_after_a_flush_beyond_the_bound(
    tables: Tables, make_cache: Callable[..., StateCache]
) -> None:
    cache = make_cache(max_clean_bytes=2 * memory_bytes(0))  # two empty cards
    states = [cache.state(0, name) for name in ("a", "b", "c")]
    apply(states[0], "a1")
    cache.touch(0, "a")
    assert cache.flush() == 1
    assert len(tables.ops("load_state")) == 3
    reloaded = cache.state(0, "a")
    assert reloaded is not states[0] and reloaded["id"] == ["a1"]  # from the table, with the flushed change
    assert len(tables.ops("load_state")) == 4


def test_clean_cache_within_the_bound_is_kept(tables: Tables, make_cache: Callable[..., StateCache]) -> None:
    cache = make_cache(max_clean_bytes=2 * memory_bytes(0))  # two empty cards
    a = cache.state(0, "a")
    cache.state(1, "b")
    cache.flush()
    assert cache.state(0, "a") is a
    assert len(tables.ops("load_state")) == 2


def test_watermarks_survive_the_clean_cache_bound(tables: Tables, make_cache: Callable[..., StateCache]) -> None:
    cache = make_cache(max_clean_bytes=0)
    cache.state(0, "a")
    watermark = cache.watermark(0)
    watermark.observe(T)
    cache.flush()  # watermark not touched, so not stored: it must stay in memory
    assert cache.watermark(0) is watermark and watermark.max_ts == T
    assert tables.ops("load_watermark") == [(0, None)]


def test_the_bound_drops_least_recently_used_clean_states_and_bytes_are_counted_without_a_walk(
        tables: Tables, make_cache: Callable[..., StateCache]) -> None:
    for i in range(4):
        tables.cards[(0, f"old{i}")] = stored_state(f"o{i}")
    # One byte short of the six states below (four of one event, two of four): a flush drops to 7/8 of it.
    cache = make_cache(max_clean_bytes=4 * memory_bytes(1) + 2 * memory_bytes(4) - 1)
    for i in range(4):
        cache.state(0, f"old{i}")  # loaded first
    cache.state(0, "old0")  # used again: now more recent than old1..old3
    for name in ("a", "b"):
        state = cache.state(0, name)
        for j in range(4):
            apply(state, f"{name}{j}", T + j)
            cache.touch(0, name, T + j)
    cache.flush()  # least recently used first: old1 goes, and that is enough
    assert list(cache._states[0]) == ["old2", "old3", "old0", "a", "b"]
    assert cache.last_events_held == cache.events_held() == 11
    assert cache.last_bytes_held == 3 * memory_bytes(1) + 2 * memory_bytes(4)


def test_a_state_is_counted_with_its_window_index_only_while_it_has_one(
        make_cache: Callable[..., StateCache], monkeypatch: pytest.MonkeyPatch) -> None:
    """A hot key's window index costs memory beside its events: the cache counts it from the write after the
    index is made, and stops once the state (with its index) is dropped."""
    from tables import features

    monkeypatch.setattr(features, "HOT_EVENTS", 3)
    monkeypatch.setattr(features, "INDEX_AFTER", 2)
    cache = make_cache()
    state = cache.state(0, "hot")
    counted = []
    for j in range(6):
        apply(state, f"h{j}", T + j)
        cache.touch(0, "hot", T + j)
        cache.flush()
        counted.append((state.index is not None, cache.last_bytes_held))
    # events 4 and 5 are scored by slices (INDEX_AFTER), the sixth builds the index
    assert counted == [(False, memory_bytes(n)) for n in range(1, 6)] + [(True, memory_bytes(6, indexed=True))]
    cache._max_clean_bytes = 0
    cache.trim()
    assert cache.cached_keys() == 0 and cache.last_bytes_held == 0


# --- counters ------------------------------------------------------------------------------------------------


def test_counters_accumulate_flushes_and_writes(make_cache: Callable[..., StateCache]) -> None:
    cache = make_cache()
    for name in ("a", "b"):
        apply(cache.state(0, name), f"{name}1")
        cache.touch(0, name)
    cache.watermark(0).observe(T)
    cache.touch_watermark(0)
    assert cache.flush() == 3
    apply(cache.state(1, "c"), "c1")
    cache.touch(1, "c")
    cache.touch(1, "c")
    assert cache.flush() == 1
    cache.flush()
    assert (cache.flushes, cache.writes, cache.write_round) == (3, 4, 3)


# --- consistency of a restored card and its partition's watermark ---------------------------------------------


def test_a_restored_card_raises_a_lagging_watermark_and_marks_it_for_the_next_flush(
    tables: Tables, make_cache: Callable[..., StateCache]
) -> None:
    """A crash between the two changelog writes of a flush leaves the watermark behind a card's state."""
    state = stored_state("e1", T)
    apply(state, "e2", T + 3 * 3_600_000)  # evicts e1: far older than the card's newest event
    assert state["id"] == ["e2"]
    tables.cards[(1, "c")] = state
    tables.watermarks[1] = T  # the watermark written before e2 was applied
    cache = make_cache()
    assert cache.watermark(1).max_ts == T
    cache.state(1, "c")
    # e1, redelivered, is now late (it was applied once and evicted) instead of being applied again.
    assert cache.watermark(1).max_ts == T + 3 * 3_600_000
    assert cache.watermark(1).is_late(T)
    cache.flush()
    assert tables.watermarks[1] == T + 3 * 3_600_000


def test_a_restored_card_behind_the_watermark_leaves_it_alone(
    tables: Tables, make_cache: Callable[..., StateCache]
) -> None:
    tables.cards[(0, "c")] = stored_state("e1", T)
    tables.watermarks[0] = T + 5_000
    cache = make_cache()
    cache.state(0, "c")
    assert cache.watermark(0).max_ts == T + 5_000
    assert cache.flush() == 0



def test_a_partition_is_written_up_to_one_moment_with_its_watermark(
        tables: Tables, make_cache: Callable[..., StateCache]) -> None:
    """Cards changed while a partition is written in steps go out with its last step, then its watermark.

    Otherwise a crash could leave a restored card ahead of another card's unwritten events, and a
    card loaded after the restart raises the watermark past them: they would be routed late.
    """
    cache = make_cache()
    for i in range(70):
        apply(cache.state(0, f"c{i}"), f"e{i}", T + i)
        cache.touch(0, f"c{i}", T + i)
    cache.watermark(0).observe(T + 69)
    cache.touch_watermark(0)
    steps = cache.flushing(keys_per_step=64)
    next(steps)  # 64 cards written; the worker handles more records meanwhile
    apply(cache.state(0, "meanwhile"), "m", T + 100)
    cache.touch(0, "meanwhile", T + 100)
    cache.watermark(0).observe(T + 100)
    cache.touch_watermark(0)
    assert (0, "meanwhile") not in tables.cards
    for _ in steps:
        pass
    assert (0, "meanwhile") in tables.cards and tables.watermarks[0] == T + 100
    assert cache.dirty_keys() == 0


# --- the layout a partition's states hold ----------------------------------------------------------------------


def layout_cache(tables: Tables, layouts: dict[int, str], spec: FeatureSpec) -> StateCache:
    def load_layout() -> str | None:
        return layouts.get(tables._partition())

    def store_layout(layout: str) -> None:
        layouts[tables._partition()] = layout

    return StateCache(load_state=tables.load_state, store_state=tables.store_state,
                      load_watermark=tables.load_watermark, store_watermark=tables.store_watermark, scope=tables.scope,
                      allowed_lateness_ms=spec.allowed_lateness_ms, spec=spec, load_layout=load_layout,
                      store_layout=store_layout)


def test_a_partition_records_its_layout_and_refuses_a_spec_it_cannot_serve(tables: Tables) -> None:
    """Compatible: a feature added over a kept field, windows no longer than the state holds. Not: a field the
    state does not keep, a longer reach back, another key. The refusal says what changed and what to do."""
    layouts: dict[int, str] = {}
    base = fraud_like((60, 600), 600, 600)
    cache = layout_cache(tables, layouts, base)
    cache.watermark(0).observe(T)
    cache.touch_watermark(0)
    cache.flush()
    assert layouts == {0: base.layout}

    narrower = fraud_like((60,), 60, 60)  # less history needed: served, and recorded as the new reach
    served = layout_cache(tables, layouts, narrower)
    served.watermark(0)
    served.flush()
    assert layouts == {0: narrower.layout}

    wider = fraud_like((60, 600), 600, 600)  # back to 10 minutes: the state now keeps only the narrower reach
    with pytest.raises(StateLayoutError, match=r"partition 0's state cannot serve .* reaches back 21m .* holds 3m"):
        layout_cache(tables, layouts, wider).watermark(0)
    reads_more = parse_spec(SPEC_WITH_COUNTRY, source="t")
    with pytest.raises(StateLayoutError, match="read country, which the state does not keep .* new SEAM_APP_ID"):
        layout_cache(tables, layouts, reads_more).watermark(0)
    other_key = parse_spec(SPEC_WITH_COUNTRY.replace('key = "card_id"', 'key = "merchant_id"').replace(
        'merchant_id = { type = "string" }', 'card_id = { type = "string" }'), source="t")
    with pytest.raises(StateLayoutError, match="keyed by 'card_id' and the spec by 'merchant_id'"):
        layout_cache(tables, layouts, other_key).watermark(0)
    assert layouts == {0: narrower.layout}  # a refused spec writes nothing
    layout_cache(tables, layouts, wider).watermark(1)  # a partition without state takes any spec


SPEC_WITH_COUNTRY = """
name = "t"
key = "card_id"
event_id = "id"
event_time = "ts"
allowed_lateness = "60s"

[fields]
amount = { type = "float" }
merchant_id = { type = "string" }
country = { type = "string" }

[[features]]
name = "countries_60s"
op = "distinct"
field = "country"
window = "60s"

[[features]]
name = "amount_sum_60"
op = "sum"
field = "amount"
window = "60s"
"""
