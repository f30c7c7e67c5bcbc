"""A write-back cache of key states and partition watermarks, flushed behind and before each offset commit.

Writing a key's state to the table on every event costs a RocksDB put and a changelog record each
time. The cache keeps the states this worker is updating in memory, and a flush writes each changed
key once, however many of its events arrived since the last flush (its header, plus any chunk the
flush seals, rewrites or deletes: :mod:`tables.key_store`), and each changed watermark once. The
caller decides when a flush runs (:mod:`agents.commit.guarantee`, in the steps of a commit):

* batch ingestion, at least once: behind, every ``SEAM_STATE_WRITE_INTERVAL_S`` (0.25 s) while some
  key has changed and no rebalance runs, and once more right before every offset commit for the
  rest. A key that keeps changing is so written about once per write interval (four times a second
  by default), not once per commit interval. A flush's changelog records are acknowledged before
  the offsets of the records whose changes they hold are committed;
* batch ingestion, exactly once: at each commit, staged in that commit's transactions;
* stream ingestion: after every record, written through Faust's tables.

Ordering guarantee: a record whose state change is only in the cache must not have its offset
committed. Every change is stamped with the cache's current ``write_round``; the pipeline asks
:meth:`StateCache.ack_when_flushed` to hold a record's acknowledgement until a flush has written the
write round it was stamped with.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager

from tables.features import DEFAULT_SPEC, FeatureSpec, KeyState, Watermark, memory_bytes, new_state, state_bytes
from tables.key_store import Packed, Stored, cut_below, events_held, held_of
from tables.spec import layout_change
from tables.tiles import Events

__all__ = ["StateCache", "StateLayoutError"]

Scope = Callable[[int], AbstractContextManager[object]]
# Reads a key from its table (None if unknown); writes the changes since ``Stored`` (given the
# event times of the events applied since), updating it; returns how many records it wrote.
LoadState = Callable[[str], tuple[KeyState, Stored] | None]
TRIM_STEP_KEYS = 2_048  # the most clean states one trim drops (it runs after every flush)
LoadStates = Callable[[list[str]], list[tuple[KeyState, Stored] | None]]  # several keys, batched reads
StoreState = Callable[[str, KeyState, Stored, set[int]], int]
# Reads back a key's events with lo <= ts < hi from its sealed chunks (what the table holds of it: Stored.packed)
ReadEvents = Callable[[str, Packed, int, int], Events]


class StateLayoutError(RuntimeError):
    """A partition's stored state was built for a spec it cannot serve (the message says why and what to do)."""


class StateCache:
    """One worker's cached view of its partitions' key states and watermarks."""

    def __init__(
        self,
        *,
        load_state: LoadState,
        store_state: StoreState,
        load_watermark: Callable[[], int | None],
        store_watermark: Callable[[int], None],
        scope: Scope,
        allowed_lateness_ms: int,
        max_clean_bytes: int = 256 << 20,
        on_load: Callable[[float], object] | None = None,
        clock: Callable[[], float] = time.perf_counter,
        load_states: LoadStates | None = None,
        spec: FeatureSpec = DEFAULT_SPEC,
        load_layout: Callable[[], str | None] | None = None,
        store_layout: Callable[[str], None] | None = None,
        read_events: ReadEvents | None = None,
    ) -> None:
        """``on_load(seconds)`` is told how long each key read from the table took (a miss; a batched
        read's time is shared among its keys). With ``read_events``, a hot key tiles the events below its raw
        band (``tables.tiles``), reading them back from its chunks in the table as its windows' edges pass."""
        self._load_state = load_state
        self._load_states = load_states
        self._store_state = store_state
        self._load_watermark = load_watermark
        self._store_watermark = store_watermark
        self._scope = scope
        self._lateness_ms = allowed_lateness_ms
        self._max_clean_bytes = max_clean_bytes
        self._states: dict[int, dict[str, KeyState]] = {}
        self._stored: dict[int, dict[str, Packed]] = {}  # what the table holds of each (Stored.packed)
        # keys counted with a window index, by partition: the memory each was counted with (state_bytes)
        self._indexed: dict[int, dict[str, int]] = {}
        self._read_events = read_events
        self._settling: list[_KeyStore] = []  # hot keys written since the last trim()
        self._dirty: dict[int, dict[str, set[int]]] = {}  # partition -> key -> times of the events applied
        self._watermarks: dict[int, Watermark] = {}
        self._dirty_watermarks: set[int] = set()
        self._deferred: list[tuple[int, Callable[[], object]]] = []
        self.write_round = 0  # stamped on changes; a flush writes the changes of the rounds before it
        self._flushed_round = 0  # changes stamped below this are written
        self.flushes = 0
        self.writes = 0
        self.last_events_held = 0  # events in the cached states as of their last write (or load)
        self.last_bytes_held = 0  # their memory (tables.features.memory_bytes), counted alike
        self.hits = 0  # key lookups the cache answered
        self.misses = 0  # key lookups that read the table (the key was not cached, or new)
        self._prefetched: set[tuple[int, str]] = set()  # read by prefetch(), not yet asked for
        self._trims = 0
        self._on_load = on_load
        self._clock = clock
        self._spec = spec
        # Each partition's state records the layout it holds (tables.spec.FeatureSpec.layout), read with its
        # watermark: a spec the state cannot serve stops the worker (StateLayoutError) instead of scoring wrongly.
        self._load_layout, self._store_layout = load_layout, store_layout
        self._dirty_layouts: set[int] = set()

    def state(self, partition: int, key: str) -> KeyState:
        """The key's state (from the cache, else the table, else new); mark it changed with touch()."""
        held = self._states.setdefault(partition, {})
        state = held.pop(key, None)
        if state is not None:
            held[key] = state  # to the end: the cache drops least recently used states first
            if self._prefetched and (partition, key) in self._prefetched:
                self._prefetched.discard((partition, key))
                self.misses += 1  # read by prefetch() for this lookup
            else:
                self.hits += 1
            return state
        self.misses += 1
        started = self._clock()
        with self._scope(partition):
            loaded = self._load_state(key)
        if self._on_load is not None:
            self._on_load(self._clock() - started)
        return self._install(partition, key, loaded)

    def prefetch(self, partition: int, keys: Iterable[str]) -> None:
        """Read the keys among ``keys`` that the cache does not hold, together (``load_states``).

        Each counts as a miss when :meth:`state` then asks for it; without ``load_states`` this does
        nothing (each miss is read by :meth:`state`).
        """
        if self._load_states is None:
            return
        held = self._states.setdefault(partition, {})
        missing = list(dict.fromkeys(key for key in keys if key not in held))
        if not missing:
            return
        started = self._clock()
        with self._scope(partition):
            loaded = self._load_states(missing)
        if self._on_load is not None:
            share = (self._clock() - started) / len(missing)
            for _ in missing:
                self._on_load(share)
        for key, found in zip(missing, loaded, strict=True):
            self._install(partition, key, found)
            self._prefetched.add((partition, key))

    def _install(self, partition: int, key: str, loaded: tuple[KeyState, Stored] | None) -> KeyState:
        state, stored = loaded if loaded is not None else (new_state(self._spec), Stored())
        self.last_events_held += stored.held
        self.last_bytes_held += memory_bytes(stored.held)
        if state["ts"]:
            self._raise_watermark(partition, state["ts"][-1])
        self._states.setdefault(partition, {})[key] = state
        self._stored.setdefault(partition, {})[key] = stored.packed()
        return state

    def _raise_watermark(self, partition: int, key_max_ts: int) -> None:
        # A flush writes key states and the watermark to two changelog topics, and a crash can land
        # between them: the restored watermark may then lag a restored key. The partition has seen
        # at least this key's events, so its watermark is at least theirs; without this, a
        # redelivered event the key's state has already evicted would be applied again, out of place.
        if self.watermark(partition).observe(key_max_ts):
            self.touch_watermark(partition)

    def peek(self, partition: int, key: str) -> KeyState | None:
        """The key's current state (cache, else table) without caching it; ``None`` if unknown."""
        state = self._states.get(partition, {}).get(key)
        if state is None:
            with self._scope(partition):
                loaded = self._load_state(key)
            state = None if loaded is None else loaded[0]
        return state

    def touch(self, partition: int, key: str, ts_ms: int | None = None) -> None:
        """Mark a key's state changed (by an event at ``ts_ms``): the next flush writes the change."""
        touched = self._dirty.setdefault(partition, {}).setdefault(key, set())
        if ts_ms is not None:
            touched.add(ts_ms)

    def watermark(self, partition: int) -> Watermark:
        """The partition's watermark, restored from the table the first time it is asked for."""
        watermark = self._watermarks.get(partition)
        if watermark is None:
            with self._scope(partition):
                max_ts = self._load_watermark()
                recorded = self._load_layout() if self._load_layout is not None else None
            if recorded != self._spec.layout and self._store_layout is not None:
                if recorded is not None:
                    problem = layout_change(recorded, self._spec)
                    if problem is not None:
                        raise StateLayoutError(f"partition {partition}'s state cannot serve feature spec "
                                               f"{self._spec.name!r}: {problem}")
                self._dirty_layouts.add(partition)  # recorded with the partition's next writes
            watermark = self._watermarks[partition] = Watermark(self._lateness_ms, max_ts)
        return watermark

    def touch_watermark(self, partition: int) -> None:
        """Mark a partition's watermark changed."""
        self._dirty_watermarks.add(partition)

    def ack_when_flushed(self, stamped_round: int, ack: Callable[[], object]) -> None:
        """Run ``ack`` now if the change stamped ``stamped_round`` is flushed, else once it is."""
        if stamped_round < self._flushed_round:
            ack()
        else:
            self._deferred.append((stamped_round, ack))

    def flush(self, *, trim: bool = True) -> int:
        """Write every changed state and watermark to the tables; release held acks; return writes.

        With ``trim=False`` the clean states stay cached even past the cache's bounds: the caller's
        writes do not reach the table at once (a transaction), so the table must not be read for
        them yet; it calls :meth:`trim` once they have.
        """
        return deque(self.flushing(trim=trim), maxlen=1).pop()

    def flushing(self, *, trim: bool = True, keys_per_step: int = 64) -> Iterator[int]:
        """:meth:`flush` in steps: yields the writes so far after every ``keys_per_step`` keys.

        The caller may let other work run between steps (the worker scores records meanwhile). The
        partitions flushed are those changed when it starts. A partition's keys changed by then are
        written in steps; the last step also writes every key of that partition changed during the
        steps, and then its watermark, in one go. So what is written of a partition holds every event
        applied to it before that moment and nothing after it: after a crash, no restored key is
        ahead of the others or of the watermark (a key loaded after a restart raises the watermark
        to its newest event, which must not pass events of other keys that were not written yet).
        Acknowledgements of changes made after the flush started still wait for the next flush.
        """
        flushing_round = self.write_round
        self.write_round += 1  # changes from now on are acknowledged after the next flush
        partitions = sorted(set(self._dirty) | self._dirty_watermarks | self._dirty_layouts)
        writes = 0
        for partition in partitions:
            pending = list(self._dirty.pop(partition, {}).items())
            while len(pending) > keys_per_step:
                writes += self._write(partition, pending[:keys_per_step])
                pending = pending[keys_per_step:]
                yield writes
            last = dict(pending)
            for key, touched in self._dirty.pop(partition, {}).items():
                last.setdefault(key, set()).update(touched)
            writes += self._write(partition, list(last.items()))
            writes += self._write_watermark(partition)
            yield writes
        self._flushed(flushing_round, writes, trim)
        yield writes

    def _write(self, partition: int, keys: Sequence[tuple[str, set[int]]]) -> int:
        cached, stored = self._states.get(partition), self._stored.get(partition)
        if cached is None or stored is None:
            return 0  # forgotten (revoked) meanwhile: redelivered records recompute it
        writes = 0
        with self._scope(partition):
            for key, touched in keys:
                state = cached.get(key)
                if state is not None:
                    written = Stored.unpacked(stored[key])
                    held = written.held
                    writes += self._store_state(key, state, written, touched)
                    stored[key] = written.packed()
                    self.last_events_held += written.held - held
                    self.last_bytes_held += self._recount(partition, key, state, held)
                    if self._read_events is not None and state.index is not None:  # hot: it may tile
                        store = state.store
                        if not isinstance(store, _KeyStore):
                            store = state.store = _KeyStore(self, partition, key)
                        store.wrote(min(touched, default=None), written.tail)
                        self._settling.append(store)
        return writes

    def _recount(self, partition: int, key: str, state: KeyState, was_held: int) -> int:
        """How much more memory a written key is counted with: its events, and its window index and tiles if it
        has them."""
        indexed = self._indexed.setdefault(partition, {})
        was = indexed.pop(key, None)
        now = state_bytes(state)
        if state.index is not None or state.tiles is not None:
            indexed[key] = now
        return now - (memory_bytes(was_held) if was is None else was)

    def _write_watermark(self, partition: int) -> int:
        written = 0
        if partition in self._dirty_layouts and self._store_layout is not None:
            self._dirty_layouts.discard(partition)
            with self._scope(partition):
                self._store_layout(self._spec.layout)
            written = 1
        if partition not in self._dirty_watermarks:
            return written
        self._dirty_watermarks.discard(partition)
        watermark = self._watermarks.get(partition)
        if watermark is None or watermark.max_ts is None:
            return 0
        with self._scope(partition):
            self._store_watermark(watermark.max_ts)
        return written + 1

    def _flushed(self, flushed_round: int, writes: int, trim: bool) -> None:
        self._flushed_round = flushed_round + 1
        self.flushes += 1
        self.writes += writes
        ready = [ack for stamped, ack in self._deferred if stamped <= flushed_round]
        self._deferred = [(stamped, ack) for stamped, ack in self._deferred if stamped > flushed_round]
        for ack in ready:
            ack()
        if trim:
            self.trim()

    def trim(self) -> None:
        """Drop clean states, least recently used first (partition by partition, starting from the next
        partition each time), down to the bound.

        The bound is ``max_clean_bytes`` of memory in all cached states (``memory_bytes`` of the events
        each held at its last write or load); a dropped state is read back from the table when its
        key comes again.
        """
        for store in self._settling:  # what the keys' writes hold is in the table now
            store.settled()
        self._settling.clear()
        held = self.last_bytes_held  # counted as states are loaded, written and dropped: no walk over all
        if held <= self._max_clean_bytes:
            return
        # A dropped state's objects are freed at once, on the event loop: dropping an eighth of a full
        # cache at once (32 MB) held it for 0.4-0.8 s every few minutes. Each flush (four a second)
        # drops only what the cache went over by since the last, at most TRIM_STEP_KEYS states.
        goal = self._max_clean_bytes
        budget = TRIM_STEP_KEYS
        events = self.last_events_held
        partitions = list(self._states)
        self._trims += 1
        turn = self._trims % len(partitions)
        for partition in partitions[turn:] + partitions[:turn]:
            cached = self._states[partition]
            dirty, stored = self._dirty.get(partition, {}), self._stored.get(partition, {})
            indexed = self._indexed.get(partition, {})
            victims: list[str] = []
            for key in cached:
                if held <= goal or len(victims) >= budget:
                    break
                if key not in dirty:  # clean: it holds what was last written (or loaded)
                    victims.append(key)
                    events -= held_of(stored[key])
                    counted = indexed.get(key)
                    held -= memory_bytes(held_of(stored[key])) if counted is None else counted
            for key in victims:
                del cached[key]
                stored.pop(key, None)
                indexed.pop(key, None)
            if self._prefetched:
                self._prefetched.difference_update((partition, key) for key in victims)
            self.last_events_held, self.last_bytes_held = events, held
            budget -= len(victims)
            if held <= goal or budget <= 0:
                return

    def events_held(self) -> int:
        """Events held in all cached key states now (what the cache's memory grows with; walks them all)."""
        return sum(events_held(state) for cached in self._states.values() for state in cached.values())

    def cached_keys(self) -> int:
        """Key states held in memory."""
        return sum(len(cached) for cached in self._states.values())

    def forget(self) -> None:
        """Drop everything (partitions were revoked); unflushed changes are recomputed on redelivery."""
        self._states.clear()
        self._stored.clear()
        self._indexed.clear()
        self._settling.clear()
        self._dirty.clear()
        self._watermarks.clear()
        self._dirty_watermarks.clear()
        self._dirty_layouts.clear()
        self._deferred.clear()
        self._prefetched.clear()
        self.last_events_held = self.last_bytes_held = 0

    def dirty_keys(self) -> int:
        """How many key states wait for the next flush."""
        return sum(len(ids) for ids in self._dirty.values())


class _KeyStore:
    """A hot key's events as its table holds them (``tables.tiles.Store``): read back from its sealed chunks,
    and cut below every event the table may not hold yet: at or below the tail of its last write that reached
    the table, and below the events applied since (touched, or written and not yet in the table)."""

    __slots__ = ("cache", "durable_tail", "key", "partition", "unwritten_low", "written_low", "written_tail")

    def __init__(self, cache: StateCache, partition: int, key: str) -> None:
        self.cache, self.partition, self.key = cache, partition, key
        self.durable_tail: int | None = None  # the tail of the key's last write that reached the table
        self.written_tail: int | None = None  # ... of its last write
        self.unwritten_low: int | None = None  # the lowest time applied since the key's last write
        self.written_low: int | None = None  # ... and written since the last trim()

    def applied(self, ts: int) -> None:
        if self.unwritten_low is None or ts < self.unwritten_low:
            self.unwritten_low = ts  # not in the table until its write has reached it

    def wrote(self, touched_low: int | None, tail: int | None) -> None:
        """The key was written (its events applied since its last write: from ``touched_low``, or from when the
        cache made this store), not yet in the table."""
        for low in (touched_low, self.unwritten_low):
            if low is not None and (self.written_low is None or low < self.written_low):
                self.written_low = low
        self.unwritten_low, self.written_tail = None, tail

    def settled(self) -> None:
        """What the key's writes hold is in the table now (the cache's trim())."""
        self.durable_tail, self.written_low = self.written_tail, None

    def cut(self, below: int) -> int | None:
        stored = self.cache._stored.get(self.partition, {}).get(self.key)
        if stored is None or self.durable_tail is None:
            return None
        for low in (self.unwritten_low, self.written_low):
            if low is not None:
                below = min(below, low)
        return cut_below(stored, self.durable_tail, below)

    def read(self, lo: int, hi: int) -> Events:
        cache = self.cache
        assert cache._read_events is not None
        with cache._scope(self.partition):
            return cache._read_events(self.key, cache._stored[self.partition][self.key], lo, hi)
