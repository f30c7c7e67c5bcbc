"""Ending a restore whose changelog ends with transaction markers (exactly once).

A transactional changelog ends with a commit or abort marker, never with a record, so Faust's restore
(which waits to *apply* the record before the end offset) would wait forever; Faust only handles this
for its own exactly-once mode. :func:`release_restores` marks a changelog partition restored once the
consumer has read past its end with nothing left to apply.

Why a poll, with event-loop turns counted: Faust gives no signal to wait on. Its restore
(``Recovery._slurp_changelogs``) takes each record from the changelog queue and counts it a few
awaits later; the only "nothing more came" it knows is its own 5 s timeout on that queue, and its
handling of a changelog that ends with markers (``detect_aborted_tx``) runs only in Faust's own
exactly-once mode, after two of those timeouts. So the watch checks once a second, and takes a
partition as received once the queue has stayed empty for ``SETTLE_TURNS`` turns of the loop.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from tables.faust_compat import mark_restored, restore_state

__all__ = ["release_restores"]

logger = logging.getLogger(__name__)


SETTLE_TURNS = 8  # event-loop turns a record taken from the changelog queue needs to be counted received


async def release_restores(app: Any, *, interval_s: float = 1.0) -> None:
    """Until the worker stops: end restores that have read past their changelog's last record (only markers left).

    Faust counts a partition restored once it has received the record at its highwater (the offset
    before the end), and drops any changelog record at or below the offset marked restored. Marking
    it too early therefore loses records: a key restored incompletely. A partition is marked once
    everything the fetcher returned below its end has been received, which takes three steps:

    1. the consumer's position is past the highwater: every record up to it has been fetched;
    2. a whole drain-loop round has begun since that position was read: the fetch that returned the
       last records (still on its way from the consumer thread, or being handed on) was handed on;
    3. the changelog queue is empty and stays empty for a few event-loop turns: the restore has taken
       every record and counted it (taking one and counting it are some turns apart).

    All in the same assignment (a rebalance restarts the restore) and with no changelog sought back
    meanwhile (records a rebalance interrupted are fetched again: the position read is no longer
    true). Faust's restore state is read through :func:`tables.faust_compat.restore_state`, after every
    await, never across one.
    """
    consumer = app.consumer
    past_end: dict[Any, tuple[tuple[int, int, int], int]] = {}  # tp: (assignment, fetch round) once past its end

    def assignment() -> tuple[int, int, int]:
        return consumer.epoch, app.consumer_generation_id, consumer.rewinds

    def unreceived(tp: Any) -> int | None:
        """The highwater if ``tp`` still waits for records below it, else None (read now)."""
        restoring, highwaters, offsets, _ = restore_state(app)
        highwater, applied = highwaters.get(tp), offsets.get(tp)
        if not restoring or highwater is None or applied is None or applied >= highwater:
            return None
        return highwater

    async def settled() -> bool:
        for _ in range(SETTLE_TURNS):
            if not restore_state(app)[3]:
                return False
            await asyncio.sleep(0)
        return restore_state(app)[3]

    while not app.should_stop:  # the consumer goes first when the worker stops
        await asyncio.sleep(interval_s)
        if not restore_state(app)[0]:
            past_end.clear()
            continue
        for tp in list(restore_state(app)[1]):
            highwater = unreceived(tp)
            if highwater is None:
                past_end.pop(tp, None)
                continue
            seen = past_end.get(tp)
            if seen is not None and seen[0] == assignment() and consumer.fetch_rounds > seen[1] and await settled():
                highwater = unreceived(tp)  # again: the turns above let the restore run
                queue_empty = restore_state(app)[3]
                if highwater is not None and seen[0] == assignment() and queue_empty:
                    logger.info("restore of %s ends at offset %d: only transaction markers follow", tp, highwater)
                    mark_restored(app, tp, highwater)
                past_end.pop(tp, None)
                continue
            before = assignment()
            position = await consumer.position(tp)
            highwater = unreceived(tp)
            if highwater is not None and position is not None and position > highwater and before == assignment():
                past_end[tp] = (assignment(), consumer.fetch_rounds)
            else:
                past_end.pop(tp, None)
