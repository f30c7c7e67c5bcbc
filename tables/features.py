"""Event-time-correct per-key features of any feature spec, kept as compact state (pure code, no Faust).

The feature of an event ``e`` of key ``k`` is computed over ``S_W``: the events of ``k`` that were
applied to state before ``e`` or are ``e`` itself (arrival order), whose event time lies in the
window ``(e.ts - W, e.ts]``. Events that arrived earlier but carry a later ``ts`` are excluded, so a
feature describes the moment of the event it scores, whatever the arrival order. What each operation
computes over ``S_W`` is declared in :data:`tables.spec.OPERATIONS`; a spec (:class:`tables.spec.FeatureSpec`)
names the features, in model order.

State per key is one small dict of parallel columns sorted by event time (ties in arrival order)::

    {"n": <arrival counter>, "prev": <max ts evicted, or None>, "pv": <that event's values, or None>,
     "ts": [ms, ...], "id": IdColumn([event_id, ...]), "seq": [arrival number, ...],
     "values": ([value, ...], ...)}

Numbers are held in :class:`array.array` columns (``ts`` and ``seq`` as 64-bit integers, a column of
float values as doubles), the ids in one string (:class:`IdColumn`: 21 bytes an id of 20 characters,
where its string object and a slot took 80), other strings in lists (:func:`compact`), and every column
takes an event in place. A column that is not new is walked by no young collection, and a worker runs no
other kind on what it has held for a tenth of a second (``app.scoring`` freezes what each young
collection leaves). A column rebuilt at each event (tuples were) is walked element by element by the
next young collection, each element a cold read of a cached key's memory: 5.6 µs of 40.3 per event
with 100,000 keys of 54 events, against 0.3 of 32.7 in place. An array also holds a number in 8
bytes, where a number object takes 32 and its slot 8 more. A hot key, one with a window index
(below), holds its numbers in lists too, changed in place as the index follows them.

``values`` holds one column per field the spec's features read (``spec.stored``, in that order). A new
event is inserted with ``bisect``; every event already in the state arrived before it, so its
windows are index ranges found by bisection and its aggregates are C-level ``fsum``/``max``/``set``
over list slices. All of an event's windows end at it, so a longer window's range holds a shorter one's:
where the two start at the same event (the key had nothing between their starts) the longer takes the
shorter's aggregates, and its maximum and minimum otherwise start from the shorter's, so a key's
events are not walked once per window. Only a redelivered event (its id is already in the state) takes
the slow path that also filters by arrival number, so it is scored with exactly the features it had the
first time.

Eviction keeps the state bounded without changing any result. A future event of this key that is not
late has ``ts >= key_max_ts - allowed_lateness`` (the partition's watermark is at least that), so it
never needs anything at or below ``key_max_ts - allowed_lateness - W`` (``W`` the largest window). A
*redelivered* event is scored again from the state only while it lies within the replay horizon,
``ts >= key_max_ts - allowed_lateness - R`` (:func:`replayable`; ``R`` the spec's replay allowance,
by default ``W``); older redeliveries are below the watermark and go to the late topic like any
late event. Replaying an event at the replay horizon needs its window of context, so the state keeps
events down to ``key_max_ts - allowed_lateness - R - W`` (``spec.horizon_ms``) and evicts the rest
(a large state, once they are a 32nd of it). ``prev`` and ``pv`` keep the highest evicted time and that
event's values, for ``since_prev`` and ``last``.

Sums and variances are exact, rounded once (the exact sum of the window's values; the exact
population variance, whose square root is ``std``), so every way of computing a window gives the same
float: a redelivered event gets exactly its first features.

Hot keys. Slices cost what a window holds, so a key with thousands of events per window would pay
that on every event. A key that holds ``HOT_EVENTS`` events or more and has been scored ``INDEX_AFTER``
times by slices since its state was read or made gets a :class:`_WindowIndex`, kept in memory beside the
state (never stored: it is rebuilt from the columns when a loaded key turns hot). Building one costs 6-17
sliced events (a pass over every event, with exact prefix sums), so it is built only once the key has
shown that it stays: a key read back for one event, as most are once the cache holds fewer keys than the
stream touches, is scored by slices and never pays for an index it would drop with its state. The index:
the set of its ids, exact prefix sums (and sums of squares) of the columns that are summed, the
staircases of suffix maxima and minima, and, for each distinct count, the value counts of the window
that ends at the key's highest time. A new event's windows then cost a bisection, two subtractions and
a staircase lookup each, and its distinct counts are those anchored counts corrected by the events
between the two windows' edges: work that grows with how far out of order it arrived, not with the
window. The index changes no result: the reference tests run with every key hot and with none.

Tiled keys. A hot key whose store can read its events back (``KeyState.store``: the state cache's, over its
table's sealed chunks) keeps only its *raw band* in its columns: the events at or above its newest time minus
the allowed lateness and the replay allowance, where every fresh event, out-of-order neighbour and replayable
redelivery lies. Those below it go into time tiles (:mod:`tables.tiles`) once the store holds them, and a
window that reaches below the band adds the tiles above its lower edge, and the events above the edge in the
edge's tile, read back from the store (:func:`_tiled_features`). A redelivery reaching below the band and a
key's page read the tiles back whole (:func:`materialized`); an event below the band (a lost watermark) makes
the key hold every event raw again. The reference tests run a third time with every key tiled.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from math import fsum, sqrt
from typing import Any

from specs import EXAMPLE_SPEC
from tables.spec import FeatureSpec, feature_set_version, load_spec
from tables.tiles import Layout, Store, Tiles, fraction_bits, scaled

__all__ = [
    "DEFAULT_SPEC", "HOT_EVENTS", "INDEX_AFTER", "SPILL_EVENTS", "TILES_PER_WINDOW", "Applied", "IdColumn", "KeyState",
    "FeatureSpec", "Watermark", "apply_event",
    "as_lists", "as_plain", "compact", "event_ids", "feature_set_version", "has_event",
    "latest_features", "materialized", "memory_bytes", "new_state", "replayable", "state_bytes", "upgrade_state",
]

# A key holding this many events may get a _WindowIndex. Below it slices cost less than twice the index (one
# card, example spec, its hour holding half its events: 9 µs an event indexed, 16 sliced at 192 held, 24 at
# 384), and an indexed event takes 318 bytes of memory where a sliced one takes 58: at 96, the cards of a
# real-time soak at 3,000/s over 100,000 cards spent a third of the cache on indexes within 30 minutes.
HOT_EVENTS = 256
# ... once slices have scored it this many times since its state was read or made (it pays for the index
# only if it stays cached, and a key read back on a miss is often scored once and dropped again)
INDEX_AFTER = 16
# A hot key whose store can read its events back (KeyState.loader) tiles those below its raw band
# (tables.tiles) once this many, and a 32nd of what it holds raw, are due: the largest window in this many tiles
SPILL_EVENTS = 256
TILES_PER_WINDOW = 64
# What a key's state costs in memory, measured with tracemalloc per key over thousands of keys of the example
# spec read back into a StateCache (synthetic keys: ids of about 20 characters, interned merchants): the dict,
# its columns, the key and the cache's entries; each event held (its id's characters and a NUL in its IdColumn,
# 8 bytes each of time, arrival number and amount in their arrays, a merchant's slot, and what the columns hold
# spare); an indexed event's share of the index (its id as a string object, in a list and a set, a prefix sum;
# its columns are lists then). tests/unit/test_key_store.py holds them to the measure. (One key measured alone
# also counts the free lists its decoding fills, about 900 bytes: what KEY_BYTES was, 2,000, counted.)
KEY_BYTES = 1_050
EVENT_BYTES = 58
INDEXED_EVENT_BYTES = 260

# The example spec (specs/fraud.toml): what a worker computes unless SEAM_FEATURE_SPEC names another.
DEFAULT_SPEC = load_spec(EXAMPLE_SPEC)


_COLUMNS = ("ts", "id", "seq")
_FLOAT = {float}
_END = "\x00"  # in an IdColumn's text: before the first id and after each
_ESCAPE = "\x01"  # ... and what stands for NUL (\x01b) or itself (\x01a) inside an id


def _escaped(event_id: str) -> str:
    if _END in event_id or _ESCAPE in event_id:
        return event_id.replace(_ESCAPE, _ESCAPE + "a").replace(_END, _ESCAPE + "b")
    return event_id


def _unescaped(held: str) -> str:
    head, *rest = held.split(_ESCAPE)
    return head + "".join((_ESCAPE if part[0] == "a" else _END) + part[1:] for part in rest)


class IdColumn:
    """A key's event ids in the state's order, held as one string: NUL before the first id and after each.

    In a list, an id of 20 characters costs 80 bytes (its string object and its slot); here 21, and the
    collector sees one object with one untracked string, however many ids it holds. Whether an id is held is a
    C-level search for NUL, the id, NUL. An id goes in at the end (events arrive mostly in order) or, out
    of order, after the NULs counted back from the end; positions and slices split the text (a flush, an
    eviction, a replay). NUL and ``\x01`` inside an id are escaped, so any id can be held.
    """

    __slots__ = ("count", "text")

    def __init__(self, ids: Iterable[str] = ()) -> None:
        held = ids if isinstance(ids, list) else list(ids)
        joined = _END.join(held)
        if _ESCAPE in joined or joined.count(_END) != max(len(held) - 1, 0):
            joined = _END.join(map(_escaped, held))
        self.text = f"{_END}{joined}{_END}" if held else _END
        self.count = len(held)

    def __len__(self) -> int:
        return self.count

    def __contains__(self, event_id: object) -> bool:
        if not isinstance(event_id, str):
            return False
        if _END in event_id or _ESCAPE in event_id:
            event_id = _escaped(event_id)
        return f"\x00{event_id}\x00" in self.text

    def as_list(self) -> list[str]:
        """The ids, in order."""
        if not self.count:
            return []
        return self._as_given(self.text[1:-1].split(_END))

    def _as_given(self, held: list[str]) -> list[str]:
        """Ids split off the text, as they were handed in."""
        return [_unescaped(event_id) for event_id in held] if _ESCAPE in self.text else held

    def __iter__(self) -> Iterator[str]:
        return iter(self.as_list())

    def __getitem__(self, item: int | slice) -> Any:
        if type(item) is slice and self.count >= 32:
            start, stop, step = item.indices(self.count)
            newest = self.count - start
            if step == 1 and 0 < newest <= self.count >> 1 and stop > start:
                # Among the newest ids (a flush writes a key's tail at every write): split only those off the
                # end, not the whole text (at 250 ids held, 8.8 µs a write for a tail of 16).
                return self._as_given(self.text.rsplit(_END, newest + 1)[1:-1][:stop - start])
        return self.as_list()[item]

    def __delitem__(self, item: slice) -> None:
        """Drop the oldest ids: ``del column[:count]`` (the only deletion a state makes)."""
        start, stop, step = item.indices(self.count)
        if start or step != 1:
            raise TypeError("an IdColumn drops a prefix only")
        text, cut = self.text, 0
        for _ in range(stop):
            cut = text.find(_END, cut + 1)
        self.text, self.count = text[cut:], self.count - stop

    def insert(self, pos: int, event_id: str) -> None:
        """Insert ``event_id`` before the id at ``pos`` (at the end if ``pos`` is the length)."""
        if _END in event_id or _ESCAPE in event_id:
            event_id = _escaped(event_id)
        if pos >= self.count:
            self.text = f"{self.text}{event_id}\x00"
        else:
            text = self.text
            cut = len(text) - 1
            for _ in range(self.count - max(pos, 0)):
                cut = text.rfind(_END, 0, cut)
            self.text = f"{text[:cut + 1]}{event_id}{_END}{text[cut + 1:]}"
        self.count += 1

    def index(self, event_id: str) -> int:
        """The position of ``event_id``."""
        return self.as_list().index(event_id)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, IdColumn):
            return self.text == other.text
        if isinstance(other, list | tuple):
            return self.as_list() == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"IdColumn({self.as_list()!r})"


class KeyState(dict[str, Any]):
    """A key's state: a plain dict of columns (what is stored), plus its in-memory window index.

    Columns are arrays, an IdColumn and lists (:func:`compact`), or all lists while a window index follows
    them; two states are equal when they hold the same values, whichever.
    """

    __slots__ = ("index", "sliced", "store", "tiles")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.index: _WindowIndex | None = None
        self.sliced = 0  # events scored by slices while the key held HOT_EVENTS or more (see INDEX_AFTER)
        self.store: Store | None = None  # where its events are held whole: a hot key may then tile (tables.tiles)
        self.tiles: Tiles | None = None  # the key's events below its raw band, when tiled: not in the columns

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, dict):
            return NotImplemented
        return as_plain(self) == as_plain(other)

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    __hash__ = None  # type: ignore[assignment]


def as_plain(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` as JSON holds it: its columns as lists (a copy; the state is left as it is)."""
    plain = {name: list(value) if name in _COLUMNS else value for name, value in state.items()}
    if "values" in state:
        plain["values"] = [list(column) for column in state["values"]]
    if state.get("pv") is not None:
        plain["pv"] = list(state["pv"])
    return plain


@dataclass(frozen=True, slots=True)
class Applied:
    """The result of applying one event: its features and whether it was new to the state."""

    features: tuple[float, ...]
    duplicate: bool


def new_state(width: int | FeatureSpec = DEFAULT_SPEC) -> KeyState:
    """Return the state of a key that has seen nothing: ``width`` value columns (or a spec's ``stored`` fields)."""
    columns = len(width.stored) if isinstance(width, FeatureSpec) else width
    return KeyState(n=0, prev=None, pv=None, ts=array("q"), id=IdColumn(), seq=array("q"),
                    values=tuple([] for _ in range(columns)))


def compact(state: KeyState) -> KeyState:
    """Hold ``state``'s columns as arrays, an IdColumn and lists (unless it has a window index, whose key
    keeps lists); return it.

    Times and arrival numbers as arrays of 64-bit integers, a column of floats as an array of doubles (8
    bytes a number, no objects inside), the ids as an :class:`IdColumn` (one string), any other column
    (strings) as a list: each takes an event in place, so a cached key's columns are never new again and
    no young collection walks them.
    """
    if type(state) is KeyState and state.index is not None:
        return state
    for name in ("ts", "seq"):
        if type(state[name]) is not array:
            state[name] = array("q", state[name])
    if type(state["id"]) is not IdColumn:
        state["id"] = IdColumn(state["id"])
    state["values"] = tuple([_compact_column(column) for column in state["values"]])
    if state["pv"] is not None and type(state["pv"]) is not tuple:
        state["pv"] = tuple(state["pv"])
    return state


def _compact_column(column: Sequence[Any]) -> Sequence[Any]:
    """A value column as an array of doubles if it holds floats only, else as a list."""
    if type(column) is array or (type(column) is list and not (column and type(column[0]) is float)):
        return column
    if column and type(column[0]) is float and set(map(type, column)) == _FLOAT:
        return array("d", column)
    return column if type(column) is list else list(column)


def _with(column: Sequence[Any], pos: int, value: Any) -> Sequence[Any]:
    """``column`` (an array or a list) with ``value`` inserted at ``pos``, in place; an empty column that
    gets a float becomes an array."""
    if not column and type(value) is float and type(column) is not array:  # a numeric column's first value
        return array("d", (value,))
    column.insert(pos, value)  # type: ignore[attr-defined]
    return column


def as_lists(state: KeyState) -> None:
    """Hold ``state``'s columns as lists: a hot key's, changed in place while its window index follows them."""
    for name in _COLUMNS:
        if type(state[name]) is not list:
            state[name] = list(state[name])  # an array's numbers as Python ints and floats
    state["values"] = [column if type(column) is list else list(column) for column in state["values"]]


def upgrade_state(state: dict[str, Any]) -> KeyState:
    """Bring a stored state written by an earlier seam to the current layout: rows under ``"ev"`` (the
    example spec's amount and merchant), or named columns (``amt``, ``mer``)."""
    if "ev" in state:
        rows = sorted(state["ev"], key=lambda row: (row[1], row[0]))  # [seq, ts, amount, merchant, id]
        upgraded = new_state(2)
        as_lists(upgraded)
        upgraded["n"], upgraded["prev"] = state["n"], state["prev"]
        for seq, ts, amount, merchant, event_id in rows:
            for column, value in zip((upgraded["ts"], upgraded["values"][0], upgraded["values"][1], upgraded["id"],
                                      upgraded["seq"]), (ts, amount, merchant, event_id, seq), strict=True):
                column.append(value)
        return compact(upgraded)
    if "amt" in state:
        return compact(KeyState(n=state["n"], prev=state["prev"], pv=None, ts=state["ts"], id=state["id"],
                                seq=state["seq"], values=[state["amt"], state["mer"]]))
    return compact(state if isinstance(state, KeyState) else KeyState(state))


def event_ids(state: KeyState) -> list[str]:
    """The ids of the events held in ``state``, in arrival order."""
    return [event_id for _, event_id in sorted(zip(state["seq"], state["id"], strict=True))]


def has_event(state: KeyState, event_id: str) -> bool:
    """Say whether ``state`` holds the event ``event_id`` (applied and not yet evicted; a tiled key answers for
    the events it holds raw, every one a redelivery of which :func:`replayable` accepts)."""
    index = state.index if isinstance(state, KeyState) else None
    if index is not None and index.fits(state):
        return event_id in index.ids
    return event_id in state["id"]


def apply_event(
    state: KeyState,
    event_id: str,
    ts_ms: int,
    values: tuple[Any, ...],
    *,
    allowed_lateness_ms: int,
    spec: FeatureSpec = DEFAULT_SPEC,
) -> Applied:
    """Apply one on-time event to ``state`` in place (once per id) and compute its features.

    ``values``: the event's values of ``spec.stored``, in that order (numbers as floats).
    """
    plan = _plan_of(spec)
    tiled = type(state) is KeyState and state.tiles is not None
    if tiled and (ts_ms < state.tiles.top or  # type: ignore[union-attr]
                  ts_ms <= state["ts"][-1] - allowed_lateness_ms - spec.replay_allowance_ms - spec.max_window_ms):
        _untile(state)  # below the raw band (its watermark was lost): the key holds every event raw again
        tiled = False
    index = (_index_of(state, plan) if type(state) is KeyState and (tiled or len(state["ts"]) >= HOT_EVENTS)
             else None)
    ids: Sequence[str] = state["id"]
    if event_id in (ids if index is None else index.ids):
        if tiled:  # its windows may reach below the raw band, where only arrival order tells what counts
            whole = materialized(state)
            return Applied(_replayed_features(whole, whole["id"].index(event_id), plan), True)
        return Applied(_replayed_features(state, ids.index(event_id), plan), True)
    state["n"] += 1
    if type(state) is KeyState and state.store is not None:
        state.store.applied(ts_ms)
    times: Sequence[int] = state["ts"]
    pos = bisect_right(times, ts_ms)
    if not isinstance(times, list):  # compact (see compact): arrays and lists, each takes the event in place
        if type(times) is not array or type(ids) is not IdColumn or type(state["values"]) is not tuple:
            times, ids = compact(state)["ts"], state["id"]  # columns of tuples, as an earlier seam held them
        times.insert(pos, ts_ms)  # type: ignore[attr-defined]
        state["seq"].insert(pos, state["n"])
        ids.insert(pos, event_id)  # type: ignore[attr-defined]
        if len(ids) > 1:
            for column, value in zip(state["values"], values, strict=True):
                column.insert(pos, value)
        else:  # the key's first event: a column of floats starts an array
            state["values"] = tuple([_with(column, pos, value)
                                     for column, value in zip(state["values"], values, strict=True)])
    else:  # lists: a hot key's, or a state as JSON gives it
        times.insert(pos, ts_ms)  # type: ignore[attr-defined]
        ids.insert(pos, event_id)  # type: ignore[attr-defined]
        state["seq"].insert(pos, state["n"])
        for column, value in zip(state["values"], values, strict=True):
            column.insert(pos, value)
        if index is not None:
            index.insert(state, pos)
    pos = _evict(state, pos, times[-1] - allowed_lateness_ms - spec.replay_allowance_ms - spec.max_window_ms, index)
    if index is None or state.index is None:
        return Applied(plan.sliced(state, pos), False)
    if state.store is not None:
        pos = _spill(state, pos, times[-1] - allowed_lateness_ms - spec.replay_allowance_ms, index, plan)
        times = state["ts"]
    index.stamp = (state["n"], len(times))
    if state.tiles is not None:
        return Applied(_tiled_features(state, pos, index, state.tiles, plan), False)
    return Applied(plan.indexed(state, pos, index), False)


def memory_bytes(events_held: int, indexed: bool = False) -> int:
    """About how much memory a key state holding ``events_held`` events takes (what the cache is sized in),
    with its window index if ``indexed``."""
    return KEY_BYTES + events_held * (EVENT_BYTES + INDEXED_EVENT_BYTES if indexed else EVENT_BYTES)


def state_bytes(state: KeyState) -> int:
    """About how much memory ``state`` takes now: its raw events, with its window index if it has one, and its
    tiles (what the cache is sized in)."""
    if type(state) is not KeyState:
        return memory_bytes(len(state["ts"]))
    tiles = state.tiles
    return memory_bytes(len(state["ts"]), state.index is not None) + (0 if tiles is None else tiles.memory_bytes())


def latest_features(state: KeyState, spec: FeatureSpec = DEFAULT_SPEC) -> tuple[str, tuple[float, ...]] | None:
    """The id and features of the key's most recently applied event still in state, if any."""
    if not state["seq"]:
        return None
    if isinstance(state, KeyState) and state.tiles is not None:
        state = materialized(state)
    index = max(range(len(state["seq"])), key=state["seq"].__getitem__)
    return state["id"][index], _replayed_features(state, index, _plan_of(spec))


def replayable(state: KeyState, ts_ms: int, *, allowed_lateness_ms: int, spec: FeatureSpec = DEFAULT_SPEC) -> bool:
    """Say whether an already-applied event at ``ts_ms`` can be scored again with its first features."""
    times: list[int] = state["ts"]
    return not times or ts_ms >= times[-1] - allowed_lateness_ms - spec.replay_allowance_ms


# --- what a spec computes, laid out for the hot path -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Aggregate:
    """The aggregates of one stored column over one window, and the output slots each goes to."""

    column: int
    sums: tuple[int, ...] = ()
    means: tuple[int, ...] = ()
    ratios: tuple[int, ...] = ()
    maxima: tuple[int, ...] = ()
    minima: tuple[int, ...] = ()
    stds: tuple[int, ...] = ()
    distincts: tuple[int, ...] = ()

    @property
    def total(self) -> bool:
        """Whether the window's sum is needed (for a sum, a mean or a ratio to the mean)."""
        return bool(self.sums or self.means or self.ratios)

    @property
    def kinds(self) -> frozenset[str]:
        """What the sliced path computes over the window's slice for these features (keys of ``_SLICED``)."""
        needed = {"sum": self.total, "max": self.maxima, "min": self.minima, "var": self.stds,
                  "distinct": self.distincts}
        return frozenset(kind for kind, wanted in needed.items() if wanted)


@dataclass(frozen=True, slots=True)
class _Window:
    ms: int
    counts: tuple[int, ...]
    aggregates: tuple[_Aggregate, ...]


@dataclass(frozen=True, slots=True)
class _Plan:
    """A spec's features grouped by window (each window's bounds found once), with their output slots."""

    spec: FeatureSpec
    width: int
    windows: tuple[_Window, ...]
    since_prev: tuple[tuple[int, float], ...]  # (slot, default)
    last: tuple[tuple[int, int, float], ...]  # (slot, column, default)
    summed: frozenset[int]  # the columns a window index keeps prefix sums of
    squared: frozenset[int]  # ... and of their squares (std)
    maxima: frozenset[int]
    minima: frozenset[int]
    distinct: frozenset[tuple[int, int]]  # (column, window ms)
    sources: list[str] = field(default_factory=list)  # the text of the functions _compile made
    layout: Layout = field(init=False)  # what a tiled key keeps per tile (tables.tiles)
    sliced: Callable[[KeyState, int], tuple[float, ...]] = field(init=False)
    indexed: Callable[[KeyState, int, _WindowIndex], tuple[float, ...]] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sliced", _compile(self, indexed=False))
        object.__setattr__(self, "indexed", _compile(self, indexed=True))
        object.__setattr__(self, "layout", Layout(self.summed, self.squared, self.maxima, self.minima,
                                                  frozenset(col for col, _ in self.distinct)))


_OPS_OF_AGGREGATE = {"sum": "sums", "mean": "means", "ratio_to_mean": "ratios", "max": "maxima", "min": "minima",
                     "std": "stds", "distinct": "distincts"}
_plans: dict[int, _Plan] = {}


def _plan_of(spec: FeatureSpec) -> _Plan:
    plan = _plans.get(id(spec))
    if plan is None or plan.spec is not spec:
        plan = _plans[id(spec)] = _build_plan(spec)
    return plan


def _build_plan(spec: FeatureSpec) -> _Plan:
    column = {name: index for index, name in enumerate(spec.stored)}
    windows: dict[int, tuple[list[int], dict[int, dict[str, list[int]]]]] = {}
    since_prev, last = [], []
    for slot, feature in enumerate(spec.features):
        if feature.op == "since_prev":
            assert feature.default is not None
            since_prev.append((slot, feature.default))
        elif feature.op == "last":
            assert feature.field is not None and feature.default is not None
            last.append((slot, column[feature.field], feature.default))
        else:
            assert feature.window_ms is not None
            counts, aggregates = windows.setdefault(feature.window_ms, ([], {}))
            if feature.op == "count":
                counts.append(slot)
            else:
                assert feature.field is not None
                ops = aggregates.setdefault(column[feature.field], {})
                ops.setdefault(_OPS_OF_AGGREGATE[feature.op], []).append(slot)
    laid_out = tuple(
        _Window(ms, tuple(counts), tuple(_Aggregate(col, **{kind: tuple(slots) for kind, slots in ops.items()})
                                         for col, ops in aggregates.items()))
        for ms, (counts, aggregates) in windows.items())
    every = [(window.ms, aggregate) for window in laid_out for aggregate in window.aggregates]
    return _Plan(
        spec, len(spec.features), laid_out, tuple(since_prev), tuple(last),
        summed=frozenset(a.column for _, a in every if a.total or a.stds),
        squared=frozenset(a.column for _, a in every if a.stds),
        maxima=frozenset(a.column for _, a in every if a.maxima),
        minima=frozenset(a.column for _, a in every if a.minima),
        distinct=frozenset((a.column, ms) for ms, a in every if a.distincts))


def _index_of(state: KeyState, plan: _Plan) -> _WindowIndex | None:
    """The window index of a key holding ``HOT_EVENTS`` events or more: kept, or built from its columns once
    slices have scored the key ``INDEX_AFTER`` times (None until then: this event is scored by slices)."""
    index = state.index
    if index is not None and index.plan is plan and index.fits(state):
        return index
    if state.sliced < INDEX_AFTER and state.tiles is None:  # a tiled key is scored with its index only
        state.sliced += 1
        state.index = None
        return None
    if state["ts"]:
        as_lists(state)
        state.index = index = _WindowIndex(state, plan)
    else:
        state.index = index = None
    return index


def _evict(state: KeyState, pos: int, cutoff: int, index: _WindowIndex | None) -> int:
    """Drop events at or below ``cutoff`` except the one at ``pos``; return its new index.

    Removing from the front of the columns moves what they hold, so a large state evicts once a
    1/32 of it is due, not at every event: events below the cutoff are in no window and no replay.
    """
    times: Sequence[int] = state["ts"]
    tiles = state.tiles if type(state) is KeyState else None
    if tiles is not None:
        dropped = tiles.drop_through(cutoff)
        if dropped is not None and (state["prev"] is None or dropped[0] >= state["prev"]):
            state["prev"], state["pv"] = dropped
    count = bisect_right(times, cutoff)
    if count <= len(times) >> 5:
        return pos
    if pos < count:
        # The event just applied is itself that old (replayed after its watermark was lost): it stays
        # until the next event, because its own windows must contain it.
        keep = [i for i in range(len(times)) if i >= count or i == pos]
        others = [i for i in range(count) if i != pos]
        newest = max(others, key=lambda i: (times[i], i)) if others else None
        evicted = None if newest is None else (times[newest], tuple(column[newest] for column in state["values"]))
        for name in _COLUMNS:
            state[name] = _taken(state[name], keep)
        state["values"] = type(state["values"])(_taken(column, keep) for column in state["values"])
        new_pos = 0
        if index is not None:
            state.index = None  # rare: rebuilt at the key's next event
    else:
        evicted = (times[count - 1], tuple(column[count - 1] for column in state["values"]))
        if index is not None:
            index.evict(state, count)
        for name in _COLUMNS:
            state[name] = _dropped(state[name], count)
        state["values"] = type(state["values"])([_dropped(column, count) for column in state["values"]])
        new_pos = pos - count
    if evicted is not None and (state["prev"] is None or evicted[0] >= state["prev"]):
        state["prev"], state["pv"] = evicted
    return new_pos


def _spill(state: KeyState, pos: int, band: int, index: _WindowIndex, plan: _Plan) -> int:
    """Tile the events below ``band`` (the raw band's lower edge), from where the key's store can cut, once
    enough are due; return the new index of the event at ``pos``."""
    times: Sequence[int] = state["ts"]
    if bisect_left(times, band) < SPILL_EVENTS:
        return pos
    store = state.store
    assert store is not None
    cut = store.cut(band)
    count = 0 if cut is None else bisect_left(times, cut)
    if cut is None or count < SPILL_EVENTS or count <= len(times) >> 5 or pos < count:
        return pos
    tiles = state.tiles
    if tiles is None:
        tiles = state.tiles = Tiles(max(1, plan.spec.max_window_ms // TILES_PER_WINDOW), plan.layout, store.read)
    columns = state["values"]
    tiles.spill(times[:count], state["seq"][:count], [column[:count] for column in columns], cut)
    index.evict(state, count)
    for name in _COLUMNS:
        state[name] = _dropped(state[name], count)
    state["values"] = type(columns)([_dropped(column, count) for column in columns])
    return pos - count


def materialized(state: KeyState) -> KeyState:
    """A tiled key's state with every event raw, its tiled ones read back from its store (a copy; a key's page
    and a redelivery reaching below its raw band read it)."""
    tiles = state.tiles
    assert tiles is not None
    whole = KeyState(n=state["n"], prev=state["prev"], pv=state["pv"], ts=list(state["ts"]), id=list(state["id"]),
                     seq=list(state["seq"]), values=[list(column) for column in state["values"]])
    if tiles.first_ts is not None:
        below = tiles.loader(tiles.first_ts, tiles.top)
        if len(below) != len(tiles):
            raise RuntimeError(f"a key of {len(tiles)} tiled events read back {len(below)} from its store")
        whole["ts"][:0], whole["id"][:0], whole["seq"][:0] = below.ts, below.ids, below.seq
        for column, values in zip(whole["values"], below.values, strict=True):
            column[:0] = values
    return whole


def _untile(state: KeyState) -> None:
    """Hold every event of a tiled key raw again (its window index is rebuilt at its next event)."""
    whole = materialized(state)
    for name in ("ts", "id", "seq", "values"):
        state[name] = whole[name]
    state.tiles = state.index = None


def _taken(column: Sequence[Any], keep: list[int]) -> Sequence[Any]:
    """The elements of ``column`` at ``keep``, in a column of its kind."""
    if type(column) is array:
        return array(column.typecode, [column[i] for i in keep])
    held = column.as_list() if type(column) is IdColumn else column
    return type(column)(held[i] for i in keep)  # type: ignore[call-arg]


def _dropped(column: Sequence[Any], count: int) -> Sequence[Any]:
    """``column`` without its first ``count`` elements: a tuple sliced, a list or an array cut in place."""
    if type(column) is tuple:
        return column[count:]
    del column[:count]  # type: ignore[attr-defined]
    return column


def _compile(plan: _Plan, indexed: bool) -> Callable[..., tuple[float, ...]]:
    """The features of the newest-arrived event at index ``pos`` (every other event arrived before it), as a
    function made for ``plan``: ``f(state, pos)`` from list slices, or ``f(state, pos, index)`` from a hot
    key's window index. Written out per spec, like a hand-written one: each window's bounds found once,
    each aggregate computed once and only where a feature needs it, no loop over the features. The
    reference tests hold both to the definition; ``plan.sources`` keeps the text.
    """
    body = ["    times = state['ts']", "    columns = state['values']", "    ts_ms = times[pos]",
            "    hi = pos + 1  # later indices hold later event times"]
    out: list[str] = ["0.0"] * plan.width
    if indexed:
        for col in sorted(plan.summed):
            body.append(f"    sums{col} = index.sums[{col}]; prefix{col}, unit{col} = sums{col}.sums, sums{col}.unit")
        for col in sorted(plan.maxima):
            body.append(f"    maxima{col} = index.maxima[{col}]")
        for col in sorted(plan.minima):
            body.append(f"    minima{col} = index.minima[{col}]")
    # The sliced path takes the windows from the shortest: all end at the event, so a longer window's range
    # holds a shorter one's, and its aggregates of a column start from the shorter window's (see _sliced).
    order = range(len(plan.windows)) if indexed else sorted(range(len(plan.windows)),
                                                            key=lambda w: plan.windows[w].ms)
    shorter: dict[int, tuple[str, str, frozenset[str]]] = {}  # column -> (lo, name, kinds) of its last window
    for w in order:
        window = plan.windows[w]
        lo = f"lo{w}"
        body.append(f"    {lo} = bisect_right(times, ts_ms - {window.ms}, 0, hi)")
        for slot in window.counts:
            out[slot] = f"float(hi - {lo})"
        for aggregate in window.aggregates:
            col, name = aggregate.column, f"w{w}c{aggregate.column}"
            if not indexed:
                body += _sliced(col, name, lo, aggregate.kinds, shorter.get(col))
                shorter[col] = (lo, name, aggregate.kinds)
            elif aggregate.total:
                body.append(f"    sum_{name} = (prefix{col}[hi] - prefix{col}[{lo}]) / unit{col}")
            if aggregate.total:
                body.append(f"    mean_{name} = sum_{name} / (hi - {lo})")
            for slot in aggregate.sums:
                out[slot] = f"sum_{name}"
            for slot in aggregate.means:
                out[slot] = f"mean_{name}"
            for slot in aggregate.ratios:
                out[slot] = f"(columns[{col}][pos] / mean_{name} if mean_{name} else 0.0)"
            for slot in aggregate.maxima:
                out[slot] = f"maxima{col}.extreme(columns[{col}], {lo}, hi)" if indexed else f"float(max_{name})"
            for slot in aggregate.minima:
                out[slot] = f"minima{col}.extreme(columns[{col}], {lo}, hi)" if indexed else f"float(min_{name})"
            for slot in aggregate.stds:
                out[slot] = f"sqrt(sums{col}.variance({lo}, hi))" if indexed else f"sqrt(var_{name})"
            for slot in aggregate.distincts:
                out[slot] = (f"float(index.distinct[{col}, {window.ms}].count(state, {lo}, pos))" if indexed
                             else f"float(distinct_{name})")
    if plan.since_prev or plan.last:
        lasts = sorted({col for _, col, _ in plan.last})
        body += ["    if pos:", "        since = (ts_ms - times[pos - 1]) / 1000.0"]
        body += [f"        last{col} = float(columns[{col}][pos - 1])" for col in lasts]
        body += ["    elif state['prev'] is not None and state['prev'] <= ts_ms:",
                 "        since = (ts_ms - state['prev']) / 1000.0"]
        body += [f"        last{col} = float(state['pv'][{col}])" for col in lasts]
        body += ["    else:", "        since = None"]
        body += [f"        last{col} = None" for col in lasts]
        for slot, default in plan.since_prev:
            out[slot] = f"({default!r} if since is None else since)"
        for slot, col, default in plan.last:
            out[slot] = f"({default!r} if last{col} is None else last{col})"
    arguments = "state, pos, index" if indexed else "state, pos"
    source = "\n".join([f"def features({arguments}):", *body, f"    return ({', '.join(out)},)", ""])
    namespace: dict[str, Any] = {"bisect_right": bisect_right, "fsum": fsum, "sqrt": sqrt, "_variance": _variance}
    exec(compile(source, f"<features of spec {plan.spec.name!r}{' (indexed)' if indexed else ''}>", "exec"),  # noqa: S102
         namespace)
    plan.sources.append(source)
    function: Callable[..., tuple[float, ...]] = namespace["features"]
    return function


# What the sliced path computes over a window's slice of a column, per aggregate it needs.
_SLICED = {"sum": "fsum({0})", "max": "max({0})", "min": "min({0})", "var": "_variance({0})",
           "distinct": "len(set({0}))"}


def _sliced(col: int, name: str, lo: str, kinds: frozenset[str],
            shorter: tuple[str, str, frozenset[str]] | None) -> list[str]:
    """Lines that set ``<kind>_<name>`` for each of ``kinds`` over ``columns[col][lo:hi]``.

    ``shorter``: the (lo, name, kinds) of the column's next shorter window, whose range ends where this one
    does and starts at or after ``lo``. Where both start at the same event (the key had no event between
    the two windows' starts: usual), the shorter window's aggregates are this one's. Otherwise a maximum or minimum
    is the shorter window's combined with the events before it (the same element ``max`` or ``min`` of the
    whole slice returns, a signed zero included: the earlier events come first and win ties, as in the slice);
    a sum, a variance and a distinct count are taken over the whole slice, as exactness needs.
    """
    whole = f"{name} = columns[{col}][{lo}:hi]"
    own = {kind: f"{kind}_{name} = {_SLICED[kind].format(name)}" for kind in sorted(kinds)}
    if shorter is None or not kinds & shorter[2]:
        return [f"    {line}" for line in (whole, *own.values())]
    inner_lo, inner, inner_kinds = shorter
    same = [f"{kind}_{name} = {kind}_{inner}" if kind in inner_kinds else own[kind] for kind in own]
    apart = [f"{kind}_{name} = {kind}({kind}(columns[{col}][{lo}:{inner_lo}]), {kind}_{inner})"
             if kind in inner_kinds and kind in ("max", "min") else own[kind] for kind in own]

    def block(lines: list[str]) -> list[str]:
        sliced = [whole] if any(line in own.values() for line in lines) else []
        return [f"        {line}" for line in sliced + lines]

    return [f"    if {lo} == {inner_lo}:", *block(same), "    else:", *block(apart)]


def _replayed_features(state: KeyState, index: int, plan: _Plan) -> tuple[float, ...]:
    """Features of an already-applied event: only events that arrived no later than it count.

    Deliberately not shared with :func:`_compile`'s functions: those are made for the newest event only;
    the reference tests hold both to the same definition.
    """
    times: list[int] = state["ts"]
    seqs: list[int] = state["seq"]
    columns: list[list[Any]] = state["values"]
    seq, ts_ms = seqs[index], times[index]
    rows = [i for i in range(len(times)) if seqs[i] <= seq and times[i] <= ts_ms]  # in (ts, arrival) order
    out = [0.0] * plan.width
    for window in plan.windows:
        lower = ts_ms - window.ms
        inside = [i for i in rows if times[i] > lower]
        for slot in window.counts:
            out[slot] = float(len(inside))
        for aggregate in window.aggregates:
            values = [columns[aggregate.column][i] for i in inside]
            if aggregate.total:
                total = fsum(values)
                mean = total / len(values)
                for slot in aggregate.sums:
                    out[slot] = total
                for slot in aggregate.means:
                    out[slot] = mean
                for slot in aggregate.ratios:
                    out[slot] = columns[aggregate.column][index] / mean if mean else 0.0
            for slot in aggregate.maxima:
                out[slot] = float(max(values))
            for slot in aggregate.minima:
                out[slot] = float(min(values))
            for slot in aggregate.stds:
                out[slot] = sqrt(_variance(values))
            for slot in aggregate.distincts:
                out[slot] = float(len(set(values)))
    earlier = [i for i in rows if seqs[i] != seq]
    prev = state["prev"]
    previous: tuple[int, list[Any]] | None = None
    if earlier:
        latest = earlier[-1]  # rows are in (ts, arrival) order
        previous = times[latest], [column[latest] for column in columns]
    if prev is not None and prev <= ts_ms and (previous is None or prev > previous[0]):
        previous = prev, state["pv"]
    for slot, default in plan.since_prev:
        out[slot] = default if previous is None else (ts_ms - previous[0]) / 1000.0
    for slot, column, default in plan.last:
        out[slot] = default if previous is None else float(previous[1][column])
    return tuple(out)


def _tiled_features(state: KeyState, pos: int, index: _WindowIndex, tiles: Tiles, plan: _Plan) -> tuple[float, ...]:
    """The features of the newest-arrived event at ``pos`` of a tiled key: what ``plan.indexed`` computes, where
    a window that reaches below the raw band adds the tiled events above its lower edge (the raw band's part
    comes from the index; exact sums are added as integers and rounded once)."""
    times: list[int] = state["ts"]
    columns: list[list[Any]] = state["values"]
    ts_ms, hi = times[pos], pos + 1
    out = [0.0] * plan.width
    for window in plan.windows:
        lower = ts_ms - window.ms
        lo = bisect_right(times, lower, 0, hi)
        part = tiles.above(lower) if not lo and lower + 1 < tiles.top else None
        tiled = 0 if part is None else part.count
        count = hi - lo + tiled
        for slot in window.counts:
            out[slot] = float(count)
        for aggregate in window.aggregates:
            col = aggregate.column
            if aggregate.total or aggregate.stds:
                sums = index.sums[col]
                bits = sums.bits
                total = sums.sums[hi] - sums.sums[lo]
                squares = 0 if sums.squares is None else sums.squares[hi] - sums.squares[lo]
                if part is not None and tiled:
                    both = max(bits, part.bits)
                    total = (total << (both - bits)) + (part.sums[col] << (both - part.bits))
                    if sums.squares is not None:
                        squares = (squares << 2 * (both - bits)) + (part.squares[col] << 2 * (both - part.bits))
                    bits = both
                rounded = total / (1 << bits)  # the exact sum, rounded once
                mean = rounded / count
                for slot in aggregate.sums:
                    out[slot] = rounded
                for slot in aggregate.means:
                    out[slot] = mean
                for slot in aggregate.ratios:
                    out[slot] = columns[col][pos] / mean if mean else 0.0
                for slot in aggregate.stds:
                    out[slot] = sqrt((count * squares - total * total) / ((count * count) << (2 * bits)))
            for slot in aggregate.maxima:
                high = index.maxima[col].extreme(columns[col], lo, hi)
                if part is not None and tiled and not high > part.maxima[col]:
                    high = float(part.maxima[col])  # the earlier value wins a tie, as max() of the window gives
                out[slot] = high
            for slot in aggregate.minima:
                low = index.minima[col].extreme(columns[col], lo, hi)
                if part is not None and tiled and not low < part.minima[col]:
                    low = float(part.minima[col])
                out[slot] = low
            for slot in aggregate.distincts:
                out[slot] = float(index.distinct[col, window.ms].count(state, lo, pos))
    if plan.since_prev or plan.last:
        previous: tuple[int, Sequence[Any]] | None = None
        if pos:
            previous = times[pos - 1], [column[pos - 1] for column in columns]
        elif len(tiles):
            previous = tiles.newest_event()
        elif state["prev"] is not None and state["prev"] <= ts_ms:
            previous = state["prev"], state["pv"]
        for slot, default in plan.since_prev:
            out[slot] = default if previous is None else (ts_ms - previous[0]) / 1000.0
        for slot, col, default in plan.last:
            out[slot] = default if previous is None else float(previous[1][col])
    return tuple(out)


def _variance(values: list[float]) -> float:
    """The exact population variance of ``values``, correctly rounded (exact integers throughout)."""
    ratios = [value.as_integer_ratio() for value in values]
    bits = max(denominator.bit_length() for _, denominator in ratios) - 1
    scaled = [numerator << (bits - denominator.bit_length() + 1) for numerator, denominator in ratios]
    count, total = len(scaled), sum(scaled)
    return (count * sum(x * x for x in scaled) - total * total) / ((count * count) << (2 * bits))


class _WindowIndex:
    """What makes a hot key's features cost the same whatever its windows hold (in memory only).

    * ``ids``: the key's event ids, for the duplicate check;
    * ``sums``: per summed column, exact prefix sums (and sums of squares, for ``std``);
    * ``maxima``, ``minima``: per column, the staircase of suffix maxima or minima;
    * ``distinct``: per (column, window), the value counts of the window that ends at the key's highest
      time. Events arrive mostly in order, so a new event's distinct window is that one corrected by
      the few events between the two windows' edges.
    """

    __slots__ = ("distinct", "ids", "maxima", "minima", "plan", "stamp", "sums")

    def __init__(self, state: KeyState, plan: _Plan) -> None:
        self.plan = plan
        self.ids = set(state["id"])
        columns = state["values"]
        self.sums = {col: _Sums(columns[col], col in plan.squared) for col in plan.summed}
        self.maxima = {col: _Stair(columns[col], 1.0) for col in plan.maxima}
        self.minima = {col: _Stair(columns[col], -1.0) for col in plan.minima}
        self.distinct = {(col, ms): _Distinct(state, col, ms) for col, ms in plan.distinct}
        self.stamp = (state["n"], len(state["ts"]))

    def fits(self, state: KeyState) -> bool:
        """Whether the index is of ``state`` as it is now (every change went through :func:`apply_event`)."""
        return self.stamp == (state["n"], len(state["ts"]))

    def insert(self, state: KeyState, pos: int) -> None:
        """Take in the event just inserted at ``pos``."""
        self.ids.add(state["id"][pos])
        columns = state["values"]
        for col, sums in self.sums.items():
            sums.insert(pos, columns[col][pos])
        for col, stair in self.maxima.items():
            stair.insert(columns[col], pos)
        for col, stair in self.minima.items():
            stair.insert(columns[col], pos)
        for distinct in self.distinct.values():
            distinct.insert(state, pos)

    def evict(self, state: KeyState, count: int) -> None:
        """Forget the ``count`` oldest events, about to be removed (all below every anchored window)."""
        self.ids.difference_update(state["id"][:count])
        for sums in self.sums.values():
            sums.evict(count)
        for stair in (*self.maxima.values(), *self.minima.values()):
            stair.evict(count)


class _Sums:
    """Exact prefix sums of a column in event-time order, as integers in units of ``2**-bits`` (``bits``
    grows when a value needs more): a window's sum is one subtraction, exact, and rounded once; with
    ``squares``, the prefix sums of the squares too (units of ``2**-2bits``), for the exact variance."""

    __slots__ = ("bits", "squares", "sums", "unit")

    def __init__(self, values: list[float], squares: bool) -> None:
        self.bits = fraction_bits(values)
        self.unit = 1 << self.bits
        held = scaled(values, self.bits)
        self.sums = list(accumulate(held, initial=0))
        self.squares: list[int] | None = list(accumulate((x * x for x in held), initial=0)) if squares else None

    def insert(self, pos: int, value: float) -> None:
        numerator, denominator = value.as_integer_ratio()
        bits = denominator.bit_length() - 1
        if bits > self.bits:
            shift = bits - self.bits
            self.sums = [total << shift for total in self.sums]
            if self.squares is not None:
                self.squares = [total << (2 * shift) for total in self.squares]
            self.bits, self.unit = bits, 1 << bits
        scaled = numerator << (self.bits - bits)
        sums = self.sums
        sums.insert(pos + 1, sums[pos] + scaled)
        for later in range(pos + 2, len(sums)):  # the events after it in event time: few, mostly none
            sums[later] += scaled
        squares = self.squares
        if squares is not None:
            square = scaled * scaled
            squares.insert(pos + 1, squares[pos] + square)
            for later in range(pos + 2, len(squares)):
                squares[later] += square

    def evict(self, count: int) -> None:
        del self.sums[:count]
        if self.squares is not None:
            del self.squares[:count]

    def total(self, lo: int, hi: int) -> float:
        """``fsum(values[lo:hi])``: int / int, the exact sum correctly rounded, as fsum gives."""
        return (self.sums[hi] - self.sums[lo]) / self.unit

    def variance(self, lo: int, hi: int) -> float:
        """The exact population variance of ``values[lo:hi]``, correctly rounded (as ``_variance`` gives)."""
        assert self.squares is not None
        count, total = hi - lo, self.sums[hi] - self.sums[lo]
        return (count * (self.squares[hi] - self.squares[lo]) - total * total) / ((count * count) << (2 * self.bits))


class _Stair:
    """The positions (plus ``base``, the events evicted since it was built) whose value beats every value
    after them (exceeds it, with ``sign`` 1; is below it, with -1). The first of them at or after a
    window's start holds the extreme from there to the end: the window's extreme, unless it lies after
    the window's end (an event that arrived out of order, beyond a later one), where the window is scanned."""

    __slots__ = ("base", "positions", "sign")

    def __init__(self, values: list[float], sign: float) -> None:
        self.sign, self.base = sign, 0
        positions: list[int] = []
        for position in range(len(values) - 1, -1, -1):
            if not positions or sign * values[position] > sign * values[positions[-1]]:
                positions.append(position)
        positions.reverse()
        self.positions = positions

    def insert(self, values: list[float], pos: int) -> None:
        """Take in the value just inserted at ``pos`` of ``values``."""
        stair, base, sign = self.positions, self.base, self.sign
        value = sign * values[pos]
        after = bisect_left(stair, pos + base)
        for later in range(after, len(stair)):
            stair[later] += 1
        if after == len(stair) or sign * values[stair[after] - base] < value:
            start = after
            while start and sign * values[stair[start - 1] - base] <= value:
                start -= 1
            stair[start:after] = [pos + base]

    def evict(self, count: int) -> None:
        del self.positions[:bisect_left(self.positions, self.base + count)]
        self.base += count

    def extreme(self, values: list[float], lo: int, hi: int) -> float:
        """``max(values[lo:hi])`` (or ``min``)."""
        stair = self.positions
        first = bisect_left(stair, lo + self.base)
        if first < len(stair) and stair[first] - self.base < hi:
            return float(values[stair[first] - self.base])
        return float(max(values[lo:hi]) if self.sign > 0 else min(values[lo:hi]))


class _Distinct:
    """The value counts of one column over the window of ``window_ms`` that ends at ``anchor``, the key's
    highest event time."""

    __slots__ = ("anchor", "column", "counts", "window_ms")

    def __init__(self, state: KeyState, column: int, window_ms: int) -> None:
        times: list[int] = state["ts"]
        self.column, self.window_ms = column, window_ms
        self.anchor = times[-1]
        self.counts: dict[Any, int] = {}
        for value in state["values"][column][bisect_right(times, self.anchor - window_ms):]:
            self.counts[value] = self.counts.get(value, 0) + 1
        tiles = state.tiles
        if tiles is not None and self.anchor - window_ms + 1 < tiles.top:
            tiles.count_values(column, self.anchor - window_ms, tiles.top - 1, self.counts)

    def insert(self, state: KeyState, pos: int) -> None:
        """Take in the event just inserted at ``pos``."""
        times: list[int] = state["ts"]
        values: list[Any] = state["values"][self.column]
        ts_ms, counts = times[pos], self.counts
        if ts_ms > self.anchor:  # the anchored window moves up: drop what falls out of it
            for value in values[bisect_right(times, self.anchor - self.window_ms):
                                bisect_right(times, ts_ms - self.window_ms)]:
                left = counts[value] - 1
                if left:
                    counts[value] = left
                else:
                    del counts[value]
            tiles = state.tiles
            if tiles is not None and self.anchor - self.window_ms + 1 < tiles.top:  # ... and what is tiled of it
                tiles.count_values(self.column, self.anchor - self.window_ms,
                                   min(ts_ms - self.window_ms, tiles.top - 1), counts, -1)
            self.anchor = ts_ms
        if ts_ms > self.anchor - self.window_ms:
            counts[values[pos]] = counts.get(values[pos], 0) + 1

    def count(self, state: KeyState, lo: int, pos: int) -> int:
        """``len(set(values[lo:pos + 1]))``, for the window (starting at ``lo``) of the event at ``pos``."""
        times: list[int] = state["ts"]
        values: list[Any] = state["values"][self.column]
        if pos == len(times) - 1:  # the newest event time: the anchored window itself
            return len(self.counts)
        start = bisect_right(times, self.anchor - self.window_ms)
        tiles, lower = state.tiles, times[pos] - self.window_ms
        tiled = tiles is not None and lower + 1 < tiles.top  # its window reaches below the raw band
        if start > pos + 1 or (len(times) - 1 - pos) + (start - lo) > pos + 1 - lo:
            if tiled:
                assert tiles is not None
                below: dict[Any, int] = {}
                tiles.count_values(self.column, lower, tiles.top - 1, below)
                return len(set(values[lo:pos + 1]).union(below))
            return len(set(values[lo:pos + 1]))
        # Its window is the anchored one without the events after it and with those before the anchored start.
        delta: dict[Any, int] = {}
        for value in values[pos + 1:]:
            delta[value] = delta.get(value, 0) - 1
        for value in values[lo:start]:
            delta[value] = delta.get(value, 0) + 1
        if tiled:
            assert tiles is not None
            tiles.count_values(self.column, lower, min(self.anchor - self.window_ms, tiles.top - 1), delta)
        counts = self.counts
        distinct = len(counts)
        for value, change in delta.items():
            held = counts.get(value, 0)
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
