"""How a card's state is laid out in its table: a small header and one record per minute of events.

A card keeps every event of its replay horizon (allowed lateness plus twice the largest window, two
hours and more by default). Written as one value, each flush would rewrite all of them, so the bytes
sent to the changelog would grow with the events a card keeps, not with the events that changed. The
state is therefore split by event time into buckets of ``BUCKET_MS``:

* ``<card id>`` holds the header ``{"v": 2, "n": <arrival counter>, "prev": <max evicted ts>,
  "b": [bucket, ...]}``;
* ``<card id>\\x00<bucket>`` holds that bucket's events as parallel lists ``[ts, amt, mer, id, seq]``.

A flush writes the buckets that received events, the bucket eviction cut into (if any), the header,
and then tombstones for buckets eviction emptied: its work and bytes follow the events that changed.
Within a changelog partition records keep their order and a crash loses a suffix, so a header never
lists a bucket whose write was lost. Everything is JSON (orjson); a value written by an earlier seam
(the whole state under the card id) is read as before and rewritten in this layout at its next flush.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import orjson

from tables.features import CardState, new_state, upgrade_state

__all__ = ["BUCKET_MS", "Stored", "bucket_key", "changes", "decode", "events_held"]

BUCKET_MS = 60_000
_COLUMNS = ("ts", "amt", "mer", "id", "seq")
_SEPARATOR = b"\x00"  # card ids are validated text: no NUL

Write = tuple[bytes, bytes | None]  # (key, value); None deletes the key


@dataclass(slots=True)
class Stored:
    """What the table holds for a card: its buckets, and the counters at the last write."""

    buckets: set[int] = field(default_factory=set)
    n: int = 0
    held: int = 0  # events in the state when it was last written
    legacy: bool = False  # the table holds the whole state under the card id (an earlier layout)


def bucket_key(card_key: bytes, bucket: int) -> bytes:
    """The table key of one bucket of a card."""
    return card_key + _SEPARATOR + str(bucket).encode()


def decode(header: bytes | None, get: Callable[[bytes], bytes | None], card_key: bytes) -> tuple[CardState, Stored]:
    """Rebuild a card's state from its header and buckets (``get`` reads a key of the table)."""
    if header is None:
        return new_state(), Stored()
    meta = orjson.loads(header)
    if "v" not in meta:  # the whole state in one value
        state = upgrade_state(meta)
        return state, Stored(n=state["n"], held=len(state["ts"]), legacy=True)
    state = new_state()
    state["n"], state["prev"] = meta["n"], meta["prev"]
    buckets = set()
    for bucket in sorted(meta["b"]):
        value = get(bucket_key(card_key, bucket))
        if value is None:
            continue
        buckets.add(bucket)
        for column, values in zip(_COLUMNS, orjson.loads(value), strict=True):
            state[column].extend(values)
    return state, Stored(buckets, state["n"], len(state["ts"]))


def changes(card_key: bytes, state: CardState, stored: Stored, touched: Iterable[int]) -> list[Write]:
    """The writes that bring the table's copy of a card up to ``state``; update ``stored`` to match.

    ``touched`` are the buckets that received events since the last write. Evictions since then are
    found from the counters: the state holds fewer events than were written plus those added.
    """
    times: list[int] = state["ts"]
    rewrite = set(touched)
    gone: set[int] = set()
    if stored.legacy:
        rewrite |= {ts // BUCKET_MS for ts in times}
        stored.legacy = False
    elif len(times) < stored.held + (state["n"] - stored.n):
        # Eviction removes the oldest events: buckets at or below the newest evicted time changed.
        edge = (state["prev"] if state["prev"] is not None else -1) // BUCKET_MS
        for bucket in stored.buckets:
            if bucket > edge:
                continue
            lo = bisect_left(times, bucket * BUCKET_MS)
            if lo < len(times) and times[lo] < (bucket + 1) * BUCKET_MS:
                rewrite.add(bucket)
            else:
                gone.add(bucket)
    written = stored.buckets
    writes: list[Write] = []
    for bucket in sorted(rewrite - gone):
        lo, hi = bisect_left(times, bucket * BUCKET_MS), bisect_left(times, (bucket + 1) * BUCKET_MS)
        if lo == hi:
            gone.add(bucket)
            continue
        writes.append((bucket_key(card_key, bucket), orjson.dumps([state[c][lo:hi] for c in _COLUMNS])))
    stored.buckets = (stored.buckets | rewrite) - gone
    stored.n, stored.held = state["n"], len(times)
    header = {"v": 2, "n": state["n"], "prev": state["prev"], "b": sorted(stored.buckets)}
    writes.append((card_key, orjson.dumps(header)))
    # After the header: a crash between them leaves an unlisted bucket, never a listed one missing.
    writes += [(bucket_key(card_key, bucket), None) for bucket in sorted(gone & written)]
    return writes


def events_held(state: CardState) -> int:
    """How many events a card's state holds (what its memory grows with)."""
    return len(state["ts"])
