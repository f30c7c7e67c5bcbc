"""When an exactly-once restore may end: only once everything fetched has reached the restore."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from agents.transactions import release_restores

TP_ = ("card-state-changelog", 0)
HIGHWATER = 99  # offset 100 is the commit marker that ends the changelog: Faust waits for 99


class Queue:
    def __init__(self) -> None:
        self.items = 0

    def empty(self) -> bool:
        return self.items == 0


class Consumer:
    def __init__(self) -> None:
        self.delivered_all_fetched = True
        self.fetch_position = 0

    async def position(self, tp: Any) -> int:
        return self.fetch_position


def make_app() -> Any:
    recovery = SimpleNamespace(in_recovery=True, active_highwaters={TP_: HIGHWATER}, active_offsets={TP_: 97})
    return SimpleNamespace(should_stop=False, consumer=Consumer(),
                           tables=SimpleNamespace(recovery=recovery, changelog_queue=Queue()))


async def ticks(app: Any, n: int) -> None:
    for _ in range(n):
        await asyncio.sleep(0.012)


def test_a_restore_ends_past_the_last_record_when_only_markers_follow() -> None:
    async def scenario() -> None:
        app = make_app()
        app.consumer.fetch_position = 101
        task = asyncio.create_task(release_restores(app, interval_s=0.01))
        await ticks(app, 5)
        assert app.tables.recovery.active_offsets[TP_] == HIGHWATER
        app.should_stop = True
        await task
    asyncio.run(scenario())


def test_a_restore_does_not_end_while_fetched_records_are_on_their_way() -> None:
    """The fetcher is past the end, but records it returned are still in the drain loop or the queue.

    Marking the restore done then made Faust drop them (at or below the restored offset): a card
    restored incompletely after a takeover.
    """
    async def scenario() -> None:
        app = make_app()
        app.consumer.fetch_position = 101
        app.consumer.delivered_all_fetched = False
        task = asyncio.create_task(release_restores(app, interval_s=0.01))
        await ticks(app, 6)
        assert app.tables.recovery.active_offsets[TP_] == 97  # in the drain loop's hands
        app.consumer.delivered_all_fetched = True
        app.tables.changelog_queue.items = 2
        await ticks(app, 6)
        assert app.tables.recovery.active_offsets[TP_] == 97  # in the changelog queue
        app.tables.changelog_queue.items = 0
        app.tables.recovery.active_offsets[TP_] = 98  # the restore received them
        await ticks(app, 6)
        assert app.tables.recovery.active_offsets[TP_] == HIGHWATER
        app.should_stop = True
        await task
    asyncio.run(scenario())


def test_a_restore_does_not_end_before_the_fetcher_is_past_its_end() -> None:
    async def scenario() -> None:
        app = make_app()
        app.consumer.fetch_position = 99  # offset 99 not fetched yet
        task = asyncio.create_task(release_restores(app, interval_s=0.01))
        await ticks(app, 6)
        assert app.tables.recovery.active_offsets[TP_] == 97
        app.should_stop = True
        await task
    asyncio.run(scenario())
