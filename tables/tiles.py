"""Time tiles: what a hot key keeps in memory of its events below the band it holds raw (pure code, no Faust).

A key's features need every event of its largest window, and exactly: a window ends at its event's time
to the millisecond, so its lower edge can fall between any two events. What changes over time is only
where the edges are. Events below the *raw band* (the allowed lateness and the replay allowance under the
key's newest event: every event a future fresh event can be scored before, arrive out of order beside, or
be a redelivery of) can no longer change, so a key that holds many of them keeps them as tiles instead:

* a tile is the key's events whose time falls in one aligned slice ``[k * width, (k + 1) * width)``;
* per tile, how each operation tiles: the count; per summed column the exact sum (and the exact sum of
  squares, for ``std``) as integers in units of ``2 ** -bits`` (``bits`` shared by all tiles, so the tiles
  hold exact prefix sums and a run of tiles costs one subtraction); the maximum and minimum (the first such
  value, as ``max`` of the events in time order returns it); the exact value counts of each distinct column;
  and the newest event (for ``since_prev`` and ``last``);
* the raw events themselves stay where the key's store holds them. A window whose lower edge falls inside a
  tile reads that tile's events back (:data:`Loader`) and keeps a few such tiles (:class:`Raw`, with their
  exact suffix sums and suffix extremes), so an edge moving through a tile costs one read.

A window that reaches below the raw band is then exact as a sum of parts: the edge tile's events above the
edge, the whole tiles above it, and the raw band (``tables.features``). Memory per key is the raw band, the
tiles (the horizon over ``width``) and the few edge tiles read back: it does not grow with the events a
largest window holds. Tiles never take a new event (every fresh event lies in the raw band), only more of
the raw band's oldest events as it moves up (:meth:`Tiles.spill`), and the key's horizon drops whole tiles
(:meth:`Tiles.drop_through`).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Any, Protocol

__all__ = ["EDGE_TILES", "Events", "Layout", "Loader", "Part", "Raw", "Store", "Tiles", "fraction_bits", "scaled"]

# What tiles cost in memory (tables.features.state_bytes): a tile with its prefix sums and extremes, one value
# count of a distinct column, one event read back with its suffix sums and extremes. Measured with tracemalloc
# on the example spec (one key at 20 events/s for two hours: 64 tiles, 3,200 value counts, 4,500 events read
# back, 1.51 MB allocated by this module and the reads, 1.53 MB counted).
TILE_BYTES = 300
VALUE_COUNT_BYTES = 50
READ_EVENT_BYTES = 300
# Tiles read back and kept at once (a window's edge needs one at a time; several windows, out-of-order events
# and a distinct count's anchored window may need a few)
EDGE_TILES = 4


@dataclass(frozen=True, slots=True)
class Events:
    """A key's events as its store holds them, in (time, arrival) order: parallel columns."""

    ts: Sequence[int]
    seq: Sequence[int]
    ids: Sequence[str]
    values: tuple[Sequence[Any], ...]

    def __len__(self) -> int:
        return len(self.ts)


# Reads back the key's events with ``lo <= ts < hi`` (every one of them that the key holds)
Loader = Callable[[int, int], Events]


class Store(Protocol):
    """Where a key's events are held whole (its table's sealed chunks, ``tables.key_store``): what lets it tile."""

    def read(self, lo: int, hi: int) -> Events:
        """The key's events with ``lo <= ts < hi``, every one the key holds (a :data:`Loader`)."""

    def applied(self, ts: int) -> None:
        """The key applied an event at ``ts``: the store does not hold it before the key's next write."""

    def cut(self, below: int) -> int | None:
        """The highest time at or below ``below`` under which the store holds every event the key applied, and
        at which none of its units of storage is cut in two (None: none yet)."""


@dataclass(frozen=True, slots=True)
class Layout:
    """What the tiles of a spec keep per column (the value columns of ``tables.features``)."""

    summed: frozenset[int]
    squared: frozenset[int]
    maxima: frozenset[int]
    minima: frozenset[int]
    distinct: frozenset[int]


@dataclass(slots=True)
class Part:
    """The aggregates of a key's tiled events above some time: what a window adds to its raw band's part.

    ``sums`` in units of ``2 ** -bits``, ``squares`` in units of ``2 ** -2bits``; an extreme is None when
    ``count`` is 0.
    """

    count: int
    bits: int
    sums: dict[int, int]
    squares: dict[int, int]
    maxima: dict[int, Any]
    minima: dict[int, Any]


def scaled(values: Sequence[Any], bits: int) -> list[int]:
    """``values`` as integers in units of ``2 ** -bits`` (exact: ``bits`` is at least what each needs)."""
    out = []
    for value in values:
        numerator, denominator = value.as_integer_ratio()
        out.append(numerator << (bits - denominator.bit_length() + 1))
    return out


def fraction_bits(values: Sequence[Any]) -> int:
    """The binary digits after the point that the most exacting of ``values`` needs to be held exactly."""
    return max((value.as_integer_ratio()[1].bit_length() - 1 for value in values), default=0)


def _suffix_sums(values: list[int]) -> list[int]:
    """``out[j]`` is ``sum(values[j:])``, and ``out[len(values)]`` is 0."""
    return list(accumulate(reversed(values), initial=0))[::-1]


def _suffix_extremes(values: Sequence[Any], sign: float) -> list[Any]:
    """``out[j]`` is ``max(values[j:])`` (``sign`` 1) or ``min`` (-1): the first such value, as they return it."""
    out: list[Any] = [None] * len(values)
    best = None
    for j in range(len(values) - 1, -1, -1):
        value = values[j]
        if best is None or sign * value >= sign * best:
            best = value
        out[j] = best
    return out


class Raw:
    """One tile's events read back: in (time, arrival) order, with exact suffix sums and suffix extremes."""

    __slots__ = ("bits", "events", "maxima", "minima", "squares", "sums")

    def __init__(self, events: Events, layout: Layout) -> None:
        self.events = events
        self.bits = max((fraction_bits(events.values[col]) for col in layout.summed), default=0)
        self.sums: dict[int, list[int]] = {}
        self.squares: dict[int, list[int]] = {}
        for col in layout.summed:
            held = scaled(events.values[col], self.bits)
            self.sums[col] = _suffix_sums(held)
            if col in layout.squared:
                self.squares[col] = _suffix_sums([x * x for x in held])
        self.maxima = {col: _suffix_extremes(events.values[col], 1.0) for col in layout.maxima}
        self.minima = {col: _suffix_extremes(events.values[col], -1.0) for col in layout.minima}


class Tiles:
    """A key's tiled events: every event it holds below ``top`` (see the module docstring).

    Per tile, in time order: its number, the time of its first event, its count and sums as exact prefix
    sums over the tiles (``counts[i]`` covers the tiles before ``i``), its extremes and value counts, and its
    newest event. Tiles leave from the front only, so the prefix sums are differences from any origin.
    """

    __slots__ = ("bits", "counts", "firsts", "lasts", "layout", "loader", "maxima", "minima", "newest", "numbers",
                 "raw", "squares", "sums", "top", "values", "width_ms")

    def __init__(self, width_ms: int, layout: Layout, loader: Loader) -> None:
        self.width_ms, self.layout, self.loader = width_ms, layout, loader
        self.top = 0  # every event the key holds below this time is tiled; none above it is
        self.bits = 0
        self.numbers: list[int] = []
        # Each tile's events lie in [first, last): the time of its first event and the cut it last took events
        # below (the store may hold events of its time beside them that the key evicted)
        self.firsts: list[int] = []
        self.lasts: list[int] = []
        self.counts: list[int] = [0]
        self.sums: dict[int, list[int]] = {col: [0] for col in layout.summed}
        self.squares: dict[int, list[int]] = {col: [0] for col in layout.squared}
        self.maxima: dict[int, list[Any]] = {col: [] for col in layout.maxima}
        self.minima: dict[int, list[Any]] = {col: [] for col in layout.minima}
        self.values: dict[int, list[dict[Any, int]]] = {col: [] for col in layout.distinct}
        self.newest: list[tuple[int, int, tuple[Any, ...]]] = []  # (ts, arrival, values) of each tile's newest
        self.raw: dict[int, Raw] = {}  # tiles read back, by number, oldest read first

    def __len__(self) -> int:
        """How many events the tiles hold."""
        return self.counts[-1] - self.counts[0]

    @property
    def first_ts(self) -> int | None:
        """The time of the oldest tiled event."""
        return self.firsts[0] if self.firsts else None

    def spill(self, ts: Sequence[int], seq: Sequence[int], values: Sequence[Sequence[Any]], top: int) -> None:
        """Take in the raw band's oldest events (all below ``top``, none below an event already tiled)."""
        width, start = self.width_ms, 0
        while start < len(ts):
            number = ts[start] // width
            end = bisect_left(ts, (number + 1) * width, start)
            self._add(number, ts[start:end], seq[start:end], [column[start:end] for column in values])
            self.lasts[-1] = top
            start = end
        self.top = max(self.top, top)

    def _add(self, number: int, ts: Sequence[int], seq: Sequence[int], values: list[Sequence[Any]]) -> None:
        if not self.numbers or self.numbers[-1] != number:
            self.numbers.append(number)
            self.firsts.append(ts[0])
            self.lasts.append(ts[-1] + 1)
            self.counts.append(self.counts[-1])
            for sums in (*self.sums.values(), *self.squares.values()):
                sums.append(sums[-1])
            for extremes in (*self.maxima.values(), *self.minima.values()):
                extremes.append(None)
            for counts in self.values.values():
                counts.append({})
            self.newest.append((ts[0], seq[0], ()))
        self.raw.pop(number, None)  # read back before it took these: read it again when needed
        self.counts[-1] += len(ts)
        bits = max((fraction_bits(values[col]) for col in self.layout.summed), default=0)
        if bits > self.bits:
            shift = bits - self.bits
            for col in self.sums:
                self.sums[col] = [total << shift for total in self.sums[col]]
            for col in self.squares:
                self.squares[col] = [total << (2 * shift) for total in self.squares[col]]
            self.bits = bits
        for col, sums in self.sums.items():
            units = scaled(values[col], self.bits)
            sums[-1] += sum(units)
            if col in self.squares:
                self.squares[col][-1] += sum(x * x for x in units)
        for col, extremes in self.maxima.items():
            high = max(values[col])
            if extremes[-1] is None or high > extremes[-1]:  # the earlier events come first and win ties
                extremes[-1] = high
        for col, extremes in self.minima.items():
            low = min(values[col])
            if extremes[-1] is None or low < extremes[-1]:
                extremes[-1] = low
        for col, per_tile in self.values.items():
            held = per_tile[-1]
            for value in values[col]:
                held[value] = held.get(value, 0) + 1
        self.newest[-1] = (ts[-1], seq[-1], tuple(column[-1] for column in values))

    def drop_through(self, cutoff: int) -> tuple[int, tuple[Any, ...]] | None:
        """Forget the tiles whose every event lies at or below ``cutoff``; the newest such event, if any.

        A tile goes once the cut it last took events below is at most ``cutoff + 1``; tiles keep time order, so
        every event kept is newer than every event dropped.
        """
        count = bisect_right(self.lasts, cutoff + 1)  # tiles whose events all lie below cutoff + 1
        if not count:
            return None
        ts, _, values = self.newest[count - 1]
        for number in self.numbers[:count]:
            self.raw.pop(number, None)
        for column in (self.numbers, self.firsts, self.lasts, self.counts, *self.sums.values(), *self.squares.values(),
                       *self.maxima.values(), *self.minima.values(), *self.values.values(), self.newest):
            del column[:count]
        return ts, values

    def memory_bytes(self) -> int:
        """About how much memory the tiles take, with the tiles read back."""
        counts = sum(len(held) for per_tile in self.values.values() for held in per_tile)
        read = sum(len(raw.events) for raw in self.raw.values())
        return len(self.numbers) * TILE_BYTES + counts * VALUE_COUNT_BYTES + read * READ_EVENT_BYTES

    def newest_event(self) -> tuple[int, tuple[Any, ...]] | None:
        """The time and values of the newest tiled event (by time, then arrival)."""
        if not self.newest:
            return None
        ts, _, values = self.newest[-1]
        return ts, values

    def read(self, number: int) -> Raw:
        """The events of tile ``number`` read back (kept among the last ``EDGE_TILES`` read)."""
        raw = self.raw.get(number)
        if raw is not None:
            return raw
        index = bisect_left(self.numbers, number)
        if index == len(self.numbers) or self.numbers[index] != number:
            raise KeyError(number)
        width = self.width_ms
        events = self.loader(self.firsts[index], min((number + 1) * width, self.lasts[index]))
        held = self.counts[index + 1] - self.counts[index]
        if len(events) != held:
            raise RuntimeError(f"a tile of {held} events read back {len(events)} from the key's store")
        if len(self.raw) >= EDGE_TILES:
            del self.raw[next(iter(self.raw))]
        self.raw[number] = raw = Raw(events, self.layout)
        return raw

    def above(self, lower: int) -> Part:
        """The aggregates of the tiled events with ``lower < ts`` (the edge's tile is read back)."""
        number = lower // self.width_ms
        start = bisect_right(self.numbers, number)  # the tiles above the edge's
        raw = None
        if start and self.numbers[start - 1] == number:
            if lower < self.firsts[start - 1]:
                start -= 1  # the edge lies below the tile's first event: the whole tile is above it
            else:
                raw = self.read(number)
        end, bits = len(self.numbers), self.bits
        count = self.counts[end] - self.counts[start]
        sums = {col: prefix[end] - prefix[start] for col, prefix in self.sums.items()}
        squares = {col: prefix[end] - prefix[start] for col, prefix in self.squares.items()}
        maxima: dict[int, Any] = {col: max(high[start:]) if start < end else None for col, high in self.maxima.items()}
        minima: dict[int, Any] = {col: min(low[start:]) if start < end else None for col, low in self.minima.items()}
        if raw is not None:  # the edge tile's events above the edge, which come before the whole tiles
            at = bisect_right(raw.events.ts, lower)
            if at < len(raw.events):
                count += len(raw.events) - at
                shift = bits - raw.bits
                for col in sums:
                    sums[col] += raw.sums[col][at] << shift
                for col in squares:
                    squares[col] += raw.squares[col][at] << (2 * shift)
                for col, later in maxima.items():
                    high = raw.maxima[col][at]
                    maxima[col] = high if later is None or not later > high else later
                for col, later in minima.items():
                    low = raw.minima[col][at]
                    minima[col] = low if later is None or not later < low else later
        return Part(count, bits, sums, squares, maxima, minima)

    def count_values(self, col: int, lower: int, upper: int, into: dict[Any, int], sign: int = 1) -> None:
        """Add to ``into`` the value counts of column ``col`` over the tiled events with ``lower < ts <= upper``
        (times ``sign``: -1 takes them off; a value whose count comes to 0 leaves ``into``)."""
        if upper <= lower:
            return
        width, numbers = self.width_ms, self.numbers
        low, high = lower // width, upper // width
        for index in range(bisect_left(numbers, low), bisect_right(numbers, high)):
            number = numbers[index]
            if number < high and (number > low or lower < self.firsts[index]):  # all of the tile's events
                counted = self.values[col][index]
            else:
                events = self.read(number).events
                counted = {}
                for value in events.values[col][bisect_right(events.ts, lower):bisect_right(events.ts, upper)]:
                    counted[value] = counted.get(value, 0) + 1
            for value, count in counted.items():
                left = into.get(value, 0) + sign * count
                if left:
                    into[value] = left
                else:
                    del into[value]
