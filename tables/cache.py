"""A write-back cache of card states and partition watermarks, flushed before each offset commit.

Writing a card's state to the table on every event costs a RocksDB put and a changelog record each
time. The cache keeps the states this worker is updating in memory and writes each changed card (and
each changed watermark) once per flush; the worker flushes right before it commits offsets, so at
most one changelog record per card per commit interval is produced, and Faust flushes the producer
before the offsets go out.

Ordering guarantee: a record whose state change is only in the cache must not have its offset
committed. Every change is stamped with the cache's current ``epoch``; the pipeline asks
:meth:`StateCache.ack_when_flushed` to hold a record's acknowledgement until a flush has written the
epoch it was stamped with.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from itertools import groupby
from operator import itemgetter

from tables.features import CardState, Watermark, new_state

__all__ = ["StateCache"]

Scope = Callable[[int], AbstractContextManager[object]]


class StateCache:
    """One worker's cached view of its partitions' card states and watermarks."""

    def __init__(
        self,
        *,
        load_card: Callable[[str], CardState | None],
        store_card: Callable[[str, CardState], None],
        load_watermark: Callable[[], int | None],
        store_watermark: Callable[[int], None],
        scope: Scope,
        allowed_lateness_ms: int,
        max_clean_cards: int = 100_000,
    ) -> None:
        self._load_card = load_card
        self._store_card = store_card
        self._load_watermark = load_watermark
        self._store_watermark = store_watermark
        self._scope = scope
        self._lateness_ms = allowed_lateness_ms
        self._max_clean_cards = max_clean_cards
        self._cards: dict[int, dict[str, CardState]] = {}
        self._dirty: dict[int, set[str]] = {}
        self._watermarks: dict[int, Watermark] = {}
        self._dirty_watermarks: set[int] = set()
        self._deferred: list[tuple[int, Callable[[], object]]] = []
        self.epoch = 0  # stamped on changes; a flush writes the changes of the epochs before it
        self._flushed_epoch = 0  # changes stamped below this are written
        self.flushes = 0
        self.writes = 0

    def card(self, partition: int, card_id: str) -> CardState:
        """The card's state (from the cache, else the table, else new); mark it changed with touch()."""
        cards = self._cards.setdefault(partition, {})
        state = cards.get(card_id)
        if state is None:
            with self._scope(partition):
                state = self._load_card(card_id)
            if state is not None and state["ts"]:
                self._raise_watermark(partition, state["ts"][-1])
            state = cards[card_id] = state if state is not None else new_state()
        return state

    def _raise_watermark(self, partition: int, card_max_ts: int) -> None:
        # A flush writes card states and the watermark to two changelog topics, and a crash can land
        # between them: the restored watermark may then lag a restored card. The partition has seen
        # at least this card's events, so its watermark is at least theirs; without this, a
        # redelivered event the card's state has already evicted would be applied again, out of place.
        if self.watermark(partition).observe(card_max_ts):
            self.touch_watermark(partition)

    def peek(self, partition: int, card_id: str) -> CardState | None:
        """The card's current state (cache, else table) without caching it; ``None`` if unknown."""
        state = self._cards.get(partition, {}).get(card_id)
        if state is None:
            with self._scope(partition):
                state = self._load_card(card_id)
        return state

    def touch(self, partition: int, card_id: str) -> None:
        """Mark a card's state changed: the next flush writes it."""
        self._dirty.setdefault(partition, set()).add(card_id)

    def watermark(self, partition: int) -> Watermark:
        """The partition's watermark, restored from the table the first time it is asked for."""
        watermark = self._watermarks.get(partition)
        if watermark is None:
            with self._scope(partition):
                max_ts = self._load_watermark()
            watermark = self._watermarks[partition] = Watermark(self._lateness_ms, max_ts)
        return watermark

    def touch_watermark(self, partition: int) -> None:
        """Mark a partition's watermark changed."""
        self._dirty_watermarks.add(partition)

    def ack_when_flushed(self, stamped_epoch: int, ack: Callable[[], object]) -> None:
        """Run ``ack`` now if the change stamped ``stamped_epoch`` is flushed, else once it is."""
        if stamped_epoch < self._flushed_epoch:
            ack()
        else:
            self._deferred.append((stamped_epoch, ack))

    def flush(self, *, trim: bool = True) -> int:
        """Write every changed state and watermark to the tables; release held acks; return writes.

        With ``trim=False`` the clean states stay cached even past ``max_clean_cards``: the caller's
        writes do not reach the table at once (a transaction), so the table must not be read for
        them yet; it calls :meth:`trim` once they have.
        """
        epoch, cards, watermarks = self._take_dirty()
        writes = self._write(cards) + self._write_watermarks(watermarks)
        self._flushed(epoch, writes, trim)
        return writes

    def _take_dirty(self) -> tuple[int, list[tuple[int, str]], list[int]]:
        cards = [(partition, card_id) for partition, ids in self._dirty.items() for card_id in ids]
        watermarks = list(self._dirty_watermarks)
        self._dirty = {}
        self._dirty_watermarks = set()
        epoch = self.epoch
        self.epoch += 1  # changes from now on belong to the next flush
        return epoch, cards, watermarks

    def _write(self, cards: list[tuple[int, str]]) -> int:
        writes = 0
        for partition, group in groupby(cards, key=itemgetter(0)):
            cached = self._cards.get(partition)
            if cached is None:
                continue  # forgotten (revoked) meanwhile: redelivered records recompute it
            with self._scope(partition):
                for _, card_id in group:
                    state = cached.get(card_id)
                    if state is not None:
                        self._store_card(card_id, state)
                        writes += 1
        return writes

    def _write_watermarks(self, partitions: list[int]) -> int:
        writes = 0
        for partition in partitions:
            watermark = self._watermarks.get(partition)
            if watermark is not None and watermark.max_ts is not None:
                with self._scope(partition):
                    self._store_watermark(watermark.max_ts)
                writes += 1
        return writes

    def _flushed(self, epoch: int, writes: int, trim: bool) -> None:
        self._flushed_epoch = epoch + 1
        self.flushes += 1
        self.writes += writes
        ready = [ack for stamped, ack in self._deferred if stamped <= epoch]
        self._deferred = [(stamped, ack) for stamped, ack in self._deferred if stamped > epoch]
        for ack in ready:
            ack()
        if trim:
            self.trim()

    def trim(self) -> None:
        """Drop the cached states if there are more than ``max_clean_cards`` and none is dirty."""
        if not self._dirty and sum(len(cards) for cards in self._cards.values()) > self._max_clean_cards:
            self._cards.clear()  # everything is clean: reload from RocksDB on demand

    def forget(self) -> None:
        """Drop everything (partitions were revoked); unflushed changes are recomputed on redelivery."""
        self._cards.clear()
        self._dirty.clear()
        self._watermarks.clear()
        self._dirty_watermarks.clear()
        self._deferred.clear()

    def dirty_cards(self) -> int:
        """How many card states wait for the next flush."""
        return sum(len(ids) for ids in self._dirty.values())
