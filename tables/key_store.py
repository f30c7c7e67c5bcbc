"""How a key's state is laid out in its table: a header that carries the newest events, and sealed chunks.

A key keeps every event of its horizon (allowed lateness, the replay allowance and the largest window,
71 minutes in the example spec). Written as one value, each flush would rewrite all of them, so the bytes
sent to the changelog would grow with the events a key keeps, not with the events that changed. Split
by fixed time buckets, a quiet key would need one read per bucket to load. The state is therefore
split by *count*, along event time:

* ``<key id>`` holds the header ``{"v": 3, "n": <arrival counter>, "prev": <max evicted ts>,
  "c": [[first chunk, last chunk], ...], "t": <tail start ts>, "k": <next chunk number>,
  "e": <tail>}``: the chunk numbers as runs of consecutive numbers (one run, usually: the header's
  size does not grow with the chunks), and the tail, the key's newest events (those at or after the
  tail start), fewer than ``CHUNK_EVENTS`` of them, as parallel lists ``[ts, <value columns>, id, seq]``
  (the value columns of ``tables.features``: one per field the spec's features read), and ``"pv"``, the
  values of the event at ``prev``, when known;
* ``<key id>\\x00c<chunk>`` holds one sealed chunk's events, in the same form. Chunk ``i`` holds the
  events from its start up to the next chunk's start (the first chunk from the lowest time, the last up
  to the tail start). Chunk numbers grow along event time; a loaded chunk starts at its first event.

Events arrive mostly in event-time order, so a new event usually lands in the tail: a flush writes one
record for such a key, and a key with fewer than ``CHUNK_EVENTS`` events is read with one. When the
tail reaches ``CHUNK_EVENTS`` it is sealed into a chunk, written once. A late event that falls into a
sealed chunk rewrites that chunk; eviction rewrites the chunk it cut into and deletes the chunks it
emptied. A flush's work and bytes thus follow the events that changed (at most a chunk per change), and
loading a key costs one read per ``CHUNK_EVENTS`` events it holds. The keys a fetched batch needs
and the cache does not hold are read together (:func:`decode_many`): all their headers in one
multi-key read, then all their chunks in a second.

Chunks are written before the header and deletions after it. Within a changelog partition records keep
their order and a crash loses a suffix, so a header never lists a chunk whose write was lost. A chunk
rewritten before a lost header may hold an event the header's counter does not count: the counter is
read as at least the highest arrival number held. Everything is JSON (orjson). Values written by an
earlier seam (the whole state under the key id, or per-minute buckets) are read as before and
rewritten in this layout at the key's next flush.

Keys: a key's header is under :func:`stored_key`, its UTF-8 bytes with every NUL byte doubled, and
its chunks (and the earlier per-minute buckets) under those bytes, a single NUL byte and a suffix
(``chunk_key``). A stored key never holds a lone NUL, so no key's header or chunk can be another
key's, whatever the key holds (input validation refuses unprintable keys anyway); a key without NUL,
every key so far, is stored under its plain UTF-8 bytes.
"""

from __future__ import annotations

import sys
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from tables.features import KeyState, compact, new_state, upgrade_state
from tables.tiles import Events

__all__ = ["CHUNK_EVENTS", "Packed", "Stored", "held_of",
           "chunk_key", "changes", "cut_below", "decode", "decode_many", "events_between", "events_held", "stored_key"]

CHUNK_EVENTS = 32
_SEPARATOR = b"\x00"  # a stored key has none alone (stored_key doubles them)
_V2_BUCKET_MS = 60_000  # the per-minute buckets of the previous layout

Write = tuple[bytes, bytes | None]  # (key, value); None deletes the key
Chunk = tuple[int, int, int]  # (chunk number, start ts, events)


@dataclass(slots=True)
class Stored:
    """What the table holds for a key: its sealed chunks and tail start, as of the last write."""

    # (chunk number, start ts, events), by start: tuples, so that packing and unpacking the list are
    # C-level copies whatever a key holds (a hot key holds thousands of chunks)
    chunks: list[Chunk] = field(default_factory=list)
    tail: int | None = None  # the tail start; None: no chunk, the tail holds every event
    next_chunk: int = 0
    n: int = 0  # the arrival counter and the events held at the last write: fewer held than written
    held: int = 0  # plus arrived since means eviction happened
    legacy: list[bytes] | None = None  # an earlier layout: rewrite it all, then delete these keys

    def packed(self) -> Packed:
        """As tuples, which the cyclic garbage collector does not walk: how a cache holds it between writes."""
        return (tuple(self.chunks), self.tail, self.next_chunk, self.n, self.held,
                None if self.legacy is None else tuple(self.legacy))

    @classmethod
    def unpacked(cls, packed: Packed) -> Stored:
        """The :class:`Stored` that :meth:`packed` gave ``packed``."""
        chunks, tail, next_chunk, n, held, legacy = packed
        return cls(list(chunks), tail, next_chunk, n, held,
                   None if legacy is None else list(legacy))


# Stored.packed(): chunks, tail, next chunk, n, held, legacy
Packed = tuple[tuple[Chunk, ...], int | None, int, int, int, tuple[bytes, ...] | None]


def held_of(packed: Packed) -> int:
    """The events a key held at its last write, from its packed :class:`Stored`."""
    return packed[4]


def stored_key(key: str) -> bytes:
    """The table key of a key's header: its UTF-8 bytes, NUL bytes doubled (so none is a chunk's separator)."""
    raw = key.encode()
    return raw.replace(b"\x00", b"\x00\x00") if b"\x00" in raw else raw


def chunk_key(state_key: bytes, chunk: int) -> bytes:
    """The table key of one sealed chunk of a key."""
    return state_key + _SEPARATOR + b"c" + str(chunk).encode()


def decode(header: bytes | None, get: Callable[[bytes], bytes | None], state_key: bytes) -> tuple[KeyState, Stored]:
    """Rebuild a key's state from its header and chunks (``get`` reads a key of the table)."""
    if header is None:
        return new_state(), Stored()
    return _decode(orjson.loads(header), get, state_key)


def decode_many(state_keys: Sequence[bytes], get_many: Callable[[list[bytes]], list[bytes | None]]) -> list[
        tuple[KeyState, Stored] | None]:
    """:func:`decode` for several keys, in two batched reads (``get_many``): their headers, then their chunks.

    ``None`` for a key the table does not hold.
    """
    metas = [None if header is None else orjson.loads(header) for header in get_many(list(state_keys))]
    wanted = [chunk_key(state_key, number) for state_key, meta in zip(state_keys, metas, strict=True)
              if meta is not None and meta.get("v") == 3 for first, last in meta["c"]
              for number in range(first, last + 1)]
    chunks = dict(zip(wanted, get_many(wanted), strict=True)) if wanted else {}
    return [None if meta is None else _decode(meta, chunks.get if meta.get("v") == 3 else _single_reads(get_many),
                                              state_key)
            for state_key, meta in zip(state_keys, metas, strict=True)]


def _single_reads(get_many: Callable[[list[bytes]], list[bytes | None]]) -> Callable[[bytes], bytes | None]:
    return lambda key: get_many([key])[0]


def _decode(meta: dict[str, Any], get: Callable[[bytes], bytes | None], state_key: bytes) -> tuple[KeyState, Stored]:
    version = meta.get("v")
    if version is None:  # the whole state in one value
        state = upgrade_state(meta)
        return state, Stored(n=state["n"], held=len(state["ts"]), legacy=[])
    state = new_state(2 if version == 2 else len(meta["e"]) - 3)  # the layout of per-minute buckets had two
    # Filled in place, then compacted: times and arrival numbers straight into their arrays (C-level), the
    # other columns as lists first (a value column becomes an array of doubles only if it holds floats alone).
    state["id"], state["values"] = [], [[] for _ in state["values"]]
    state["n"], state["prev"], state["pv"] = meta["n"], meta["prev"], meta.get("pv")
    if version == 2:
        keys = [state_key + _SEPARATOR + str(bucket).encode() for bucket in sorted(meta["b"])]
        legacy = [key for key in keys if _extend(state, get(key))]
        return compact(state), Stored(n=state["n"], held=len(state["ts"]), legacy=legacy)
    chunks = []
    for first, last in meta["c"]:
        for number in range(first, last + 1):
            value = get(chunk_key(state_key, number))
            if value is not None:
                held = len(state["ts"])
                _extend_columns(state, orjson.loads(value))
                if len(state["ts"]) > held:
                    chunks.append((number, state["ts"][held], len(state["ts"]) - held))
    _extend_columns(state, meta["e"])
    if state["seq"]:
        state["n"] = max(state["n"], max(state["seq"]))
    return compact(state), Stored(chunks, meta["t"], meta["k"], state["n"], len(state["ts"]))


def _extend(state: KeyState, value: bytes | None) -> bool:
    if value is None:
        return False
    _extend_columns(state, orjson.loads(value))
    return True


def _extend_columns(state: KeyState, columns: list[list[Any]]) -> None:
    state["ts"].extend(columns[0])
    for held, values in zip(state["values"], columns[1:-2], strict=True):
        held.extend(_interned(values))
    state["id"].extend(columns[-2])
    state["seq"].extend(columns[-1])


def _interned(values: list[Any]) -> Iterable[Any]:
    """A decoded value column as a state holds it: strings as one object per value (a merchant, a country)
    however often it repeats."""
    return map(sys.intern, values) if values and isinstance(values[0], str) else values


def changes(state_key: bytes, state: KeyState, stored: Stored, touched: Iterable[int]) -> list[Write]:
    """The writes that bring the table's copy of a key up to ``state``; update ``stored`` to match.

    ``touched`` are the event times of the events applied since the last write.
    """
    times: list[int] = state["ts"]
    tiles = state.tiles if type(state) is KeyState else None
    gone: list[bytes] = []
    if stored.legacy is not None:  # rewrite everything: it starts in the tail and is sealed below
        gone += stored.legacy
        stored.chunks, stored.tail, stored.legacy = [], None, None
    chunks = stored.chunks
    writes: list[Write] = []
    if chunks:
        tail_start = stored.tail
        assert tail_start is not None  # chunks end where the tail starts
        # Only the chunks that changed are visited: a hot key holds thousands of them, and a flush of it
        # writes its header every write interval (when every flush walked them all, a key at 100 events/s
        # cost 5 ms per flush after an hour of event time).
        emptied = []
        # A tiled key's chunks below its raw band hold its tiled events (tables.tiles), which it reads back from
        # them: none takes an event (the key cut its tiles at a chunk's start), and a chunk whose events are
        # all evicted is deleted; one the eviction cut into stays as it is (the key evicts those events again
        # if it is read back whole).
        cold = 0 if tiles is None else bisect_left(chunks, tiles.top, key=_start)
        for index in sorted(_changed_chunks(chunks, tail_start, stored, state, touched)):
            chunk = chunks[index]
            if index < cold:
                end = chunks[index + 1][1] if index + 1 < len(chunks) else tail_start
                if state["prev"] is not None and end <= state["prev"] + 1:
                    gone.append(chunk_key(state_key, chunk[0]))
                    emptied.append(index)
                continue
            lo = 0 if index == 0 else bisect_left(times, chunk[1])
            hi = bisect_left(times, chunks[index + 1][1] if index + 1 < len(chunks) else tail_start)
            if lo == hi:
                gone.append(chunk_key(state_key, chunk[0]))
                emptied.append(index)
                continue
            chunks[index] = (chunk[0], chunk[1], hi - lo)
            writes.append((chunk_key(state_key, chunk[0]), _encode(state, lo, hi)))
        for index in reversed(emptied):
            del chunks[index]
    tail = stored.tail if chunks else None
    lo = 0 if tail is None else bisect_left(times, tail)
    while len(times) - lo >= CHUNK_EVENTS:  # seal the tail into chunks of about CHUNK_EVENTS
        cut = lo + CHUNK_EVENTS
        while cut < len(times) and times[cut] == times[cut - 1]:
            cut += 1  # equal times stay together: a time belongs to one chunk
        chunks.append((stored.next_chunk, times[lo] if tail is None else tail, cut - lo))
        writes.append((chunk_key(state_key, stored.next_chunk), _encode(state, lo, cut)))
        stored.next_chunk += 1
        tail = times[cut] if cut < len(times) else times[-1] + 1
        lo = cut
    stored.tail, stored.n, stored.held = tail, state["n"], events_held(state)
    header = {"v": 3, "n": state["n"], "prev": state["prev"], "c": _runs(chunks), "t": tail, "k": stored.next_chunk,
              "e": _columns(state, lo, len(times))}
    if state["pv"] is not None:
        header["pv"] = state["pv"]
    writes.append((state_key, orjson.dumps(header)))
    # After the header: a crash between them leaves an unlisted chunk, never a listed one missing.
    writes += [(key, None) for key in gone]
    return writes


def _changed_chunks(chunks: list[Chunk], tail: int, stored: Stored, state: KeyState,
                    touched: Iterable[int]) -> set[int]:
    """The sealed chunks that received events or lost some to eviction since the last write."""
    rewrite = {max(bisect_right(chunks, ts, key=_start) - 1, 0) for ts in touched if ts < tail}
    if events_held(state) < stored.held + (state["n"] - stored.n):
        # Eviction removes the oldest events, at or below "prev" (and at most one older event
        # replayed into the first chunk): the first chunk and those starting at or below "prev".
        prev = state["prev"]
        rewrite.update(range(max(bisect_right(chunks, prev, key=_start) if prev is not None else 0, 1)))
    return rewrite


def _start(chunk: Chunk) -> int:
    return chunk[1]


def _runs(chunks: list[Chunk]) -> list[list[int]]:
    """The chunk numbers (increasing) as ``[first, last]`` runs of consecutive numbers."""
    if chunks and chunks[-1][0] - chunks[0][0] == len(chunks) - 1:  # increasing, so consecutive: one run
        return [[chunks[0][0], chunks[-1][0]]]
    runs: list[list[int]] = []
    for number, _, _ in chunks:
        if runs and runs[-1][1] == number - 1:
            runs[-1][1] = number
        else:
            runs.append([number, number])
    return runs


def _columns(state: KeyState, lo: int, hi: int) -> list[Sequence[Any]]:
    return [_plain(state["ts"][lo:hi]), *(_plain(values[lo:hi]) for values in state["values"]), state["id"][lo:hi],
            _plain(state["seq"][lo:hi])]


def _plain(column: Sequence[Any]) -> Sequence[Any]:
    """A slice of a column as JSON can hold it: an array's numbers as a list (lists and tuples as they are)."""
    return column.tolist() if type(column) is array else column


def _encode(state: KeyState, lo: int, hi: int) -> bytes:
    return orjson.dumps(_columns(state, lo, hi))


def events_held(state: KeyState) -> int:
    """How many events a key's state holds, raw and tiled."""
    tiles = state.tiles if type(state) is KeyState else None
    return len(state["ts"]) + (0 if tiles is None else len(tiles))


def cut_below(stored: Packed, durable_tail: int, below: int) -> int | None:
    """The highest time at or below ``below`` (and ``durable_tail``, where the chunks the table is known to hold
    end) at which one of a key's sealed chunks starts or they end: where it may cut its tiles."""
    chunks, limit = stored[0], min(below, durable_tail)
    if limit == durable_tail:
        return limit
    at = bisect_right(chunks, limit, key=_start)
    return chunks[at - 1][1] if at else None


def events_between(state_key: bytes, stored: Packed, lo: int, hi: int,
                   get_many: Callable[[list[bytes]], list[bytes | None]]) -> Events:
    """A key's events with ``lo <= ts < hi``, read back from its sealed chunks (all below its tail)."""
    chunks, tail = stored[0], stored[1]
    assert tail is not None and hi <= tail, "read back from sealed chunks only"
    first, last = max(bisect_right(chunks, lo, key=_start) - 1, 0), bisect_left(chunks, hi, key=_start)
    ts: list[int] = []
    seq: list[int] = []
    ids: list[str] = []
    values: list[list[Any]] = []
    for value in get_many([chunk_key(state_key, number) for number, _, _ in chunks[first:last]]):
        if value is None:
            raise RuntimeError(f"a sealed chunk of key {state_key!r} is missing from its table")
        columns = orjson.loads(value)
        start, end = bisect_left(columns[0], lo), bisect_left(columns[0], hi)
        ts += columns[0][start:end]
        seq += columns[-1][start:end]
        ids += columns[-2][start:end]
        if not values:
            values = [[] for _ in columns[1:-2]]
        for held, column in zip(values, columns[1:-2], strict=True):
            held += _interned(column[start:end])
    return Events(ts, seq, ids, tuple(values))
