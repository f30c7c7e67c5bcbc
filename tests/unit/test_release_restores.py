"""When an exactly-once restore may end: only once everything fetched has reached the restore.

The fakes mirror what release_restores reads: Faust's restore (highwaters, offsets received, its
changelog queue and the task that takes records from it, as in ``Recovery._slurp_changelogs``) and
the consumer (position, assignment epoch, drain-loop rounds).
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from agents.ingest.restore import release_restores

TP_ = ("card-state-changelog", 0)
HIGHWATER = 99  # offset 100 is the commit marker that ends the changelog: Faust waits for 99
INTERVAL_S = 0.01


class Consumer:
    def __init__(self) -> None:
        self.fetch_position = 0
        self.fetch_rounds = 0
        self.epoch = 0
        self.rewinds = 0

    async def position(self, tp: Any) -> int:
        return self.fetch_position


class Restore:
    """Faust's restore: takes records from the changelog queue, counts them, drops those already counted."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.dropped: list[int] = []

    async def run(self) -> None:
        queue, offsets = self.app.tables.changelog_queue, self.app.tables.recovery.active_offsets
        while True:
            offset = await asyncio.wait_for(queue.get(), timeout=5.0)  # as Faust: a task a few turns away
            if offset > offsets[TP_]:
                offsets[TP_] = offset
            else:
                self.dropped.append(offset)


def make_app() -> Any:
    recovery = SimpleNamespace(in_recovery=True, active_highwaters={TP_: HIGHWATER}, active_offsets={TP_: 97})
    return SimpleNamespace(should_stop=False, consumer=Consumer(), consumer_generation_id=1,
                           tables=SimpleNamespace(recovery=recovery, changelog_queue=asyncio.Queue()))


async def rounds(app: Any, n: int) -> None:
    """The drain loop goes round ``n`` times, with nothing fetched."""
    for _ in range(n):
        await asyncio.sleep(INTERVAL_S / 3)
        app.consumer.fetch_rounds += 1


def restored(app: Any) -> bool:
    return app.tables.recovery.active_offsets[TP_] == HIGHWATER


async def stop(app: Any, *tasks: asyncio.Task[None]) -> None:
    app.should_stop = True
    for task in tasks:
        task.cancel()
    await asyncio.wait(tasks)


def test_a_restore_ends_past_the_last_record_when_only_markers_follow() -> None:
    async def scenario() -> None:
        app = make_app()
        app.consumer.fetch_position = 101
        task = asyncio.create_task(release_restores(app, interval_s=INTERVAL_S))
        await rounds(app, 15)
        assert restored(app)
        await stop(app, task)
    asyncio.run(scenario())


def test_a_restore_does_not_end_while_the_fetch_that_returned_its_last_records_is_on_its_way() -> None:
    """The fetcher is past the end: its last records are still on their way from the consumer thread.

    Marking the restore done then made Faust drop them (at or below the restored offset): a card
    restored incompletely after a takeover.
    """
    async def scenario() -> None:
        app = make_app()
        restore = Restore(app)
        taking = asyncio.create_task(restore.run())
        app.consumer.fetch_position = 101  # records 98 and 99 fetched, the drain loop still awaits them
        task = asyncio.create_task(release_restores(app, interval_s=INTERVAL_S))
        await asyncio.sleep(INTERVAL_S * 8)
        assert not restored(app)
        for offset in (98, 99):  # the round hands them on, and the next begins
            app.tables.changelog_queue.put_nowait(offset)
        app.consumer.fetch_rounds += 1
        await rounds(app, 15)
        assert restored(app) and restore.dropped == []
        await stop(app, task, taking)
    asyncio.run(scenario())


def test_a_restore_does_not_end_while_the_restore_has_records_to_take() -> None:
    async def scenario() -> None:
        app = make_app()
        app.consumer.fetch_position = 101
        app.tables.changelog_queue.put_nowait(98)  # nothing takes it yet
        task = asyncio.create_task(release_restores(app, interval_s=INTERVAL_S))
        await rounds(app, 15)
        assert not restored(app)
        restore = Restore(app)
        taking = asyncio.create_task(restore.run())
        await rounds(app, 15)
        assert restored(app) and restore.dropped == []
        await stop(app, task, taking)
    asyncio.run(scenario())


def test_no_record_is_dropped_whenever_the_last_fetch_is_handed_on() -> None:
    """The last records reach the queue at any moment after the position was read, and are taken some
    turns later: whenever it is, the restore ends only after counting them, and drops none."""
    class LastFetchInFlight(Consumer):
        def __init__(self, app: Any, turns: int) -> None:
            super().__init__()
            self.app, self.turns, self.handing = app, turns, None

        async def position(self, tp: Any) -> int:
            if self.handing is None:  # the fetch that returned 98 and 99 is on its way now
                self.handing = asyncio.ensure_future(self.hand_on())
            return 101

        async def hand_on(self) -> None:
            for _ in range(self.turns):
                await asyncio.sleep(0)
            for offset in (98, 99):
                self.app.tables.changelog_queue.put_nowait(offset)
            while True:  # that round ends; idle rounds follow
                self.fetch_rounds += 1
                await asyncio.sleep(INTERVAL_S / 3)

    async def scenario(turns: int) -> None:
        app = make_app()
        app.consumer = LastFetchInFlight(app, turns)
        restore = Restore(app)
        taking = asyncio.create_task(restore.run())
        task = asyncio.create_task(release_restores(app, interval_s=INTERVAL_S))
        for _ in range(100):
            await asyncio.sleep(INTERVAL_S / 2)
            if restored(app):
                break
        assert restored(app) and restore.dropped == [], turns
        await stop(app, task, taking, app.consumer.handing)

    for turns in [*range(12), 50, 200]:
        asyncio.run(scenario(turns))


def test_a_restore_does_not_end_before_the_fetcher_is_past_its_end() -> None:
    async def scenario() -> None:
        app = make_app()
        app.consumer.fetch_position = 99  # offset 99 not fetched yet
        task = asyncio.create_task(release_restores(app, interval_s=INTERVAL_S))
        await rounds(app, 15)
        assert not restored(app)
        await stop(app, task)
    asyncio.run(scenario())


def test_a_rebalance_between_the_checks_starts_over() -> None:
    async def scenario() -> None:
        app = make_app()
        app.consumer.fetch_position = 101
        task = asyncio.create_task(release_restores(app, interval_s=INTERVAL_S))
        for _ in range(12):  # a new assignment at every check: never two checks in the same one
            await asyncio.sleep(INTERVAL_S)
            app.consumer.epoch += 1
            app.consumer.fetch_rounds += 1
        assert not restored(app)
        await rounds(app, 15)
        assert restored(app)
        await stop(app, task)
    asyncio.run(scenario())
