"""agents.ingest.read_ahead: records taken as fetches return, handed to the next round whole, never across a seek."""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from types import SimpleNamespace
from typing import Any

import pytest

from agents.ingest.read_ahead import ReadAhead

A, B = ("in", 0), ("in", 1)


class Fetcher:
    """aiokafka's fetcher as the read-ahead sees it: records arrive per partition; taking them moves the position."""

    def __init__(self) -> None:
        self.state: object = object()  # the assignment's state (one for all partitions is enough here)
        self.positions: dict[Any, int] = {A: 0, B: 0}
        self.log: dict[Any, int] = {A: 0, B: 0}  # the next offset each partition's log will write
        self.arrived = asyncio.Event()
        self.calls: list[tuple[frozenset[Any] | None, int]] = []
        self.error: BaseException | None = None
        self.read_ahead: ReadAhead | None = None
        self.during_take: Any = None  # called once inside the next take, after its records were drained

    def produce(self, tp: Any, n: int) -> None:
        self.log[tp] += n
        self.arrived.set()

    def seek(self, tp: Any, offset: int) -> None:
        assert self.read_ahead is not None
        self.read_ahead.sought([tp])
        self.positions[tp] = offset
        self.arrived.set()  # the fetcher fetches from the new position

    def reassign(self) -> None:
        self.state = object()

    def position(self, tp: Any) -> tuple[object, int] | None:
        return (self.state, self.positions[tp]) if tp in self.positions else None

    async def fetch(self, partitions: Collection[Any] | None, timeout: float, max_records: int) -> dict[Any, list[Any]]:
        self.calls.append((frozenset(partitions) if partitions is not None else None, max_records))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            if self.error is not None:
                raise self.error
            taken: dict[Any, list[Any]] = {}
            for tp in self.positions:
                if partitions is not None and tp not in partitions:
                    continue
                start = self.positions[tp]
                end = min(self.log[tp], start + max_records - sum(map(len, taken.values())))
                if end > start:
                    taken[tp] = [SimpleNamespace(offset=offset) for offset in range(start, end)]
                    self.positions[tp] = end
            if taken:
                if self.during_take is not None:
                    during, self.during_take = self.during_take, None
                    during()
                return taken
            self.arrived.clear()
            try:
                await asyncio.wait_for(self.arrived.wait(), max(0.0, deadline - loop.time()))
            except TimeoutError:
                return {}


def offsets(taken: dict[Any, list[Any]]) -> dict[Any, list[int]]:
    return {tp: [record.offset for record in records] for tp, records in taken.items()}


def read_ahead(fetcher: Fetcher, limit: int = 100, max_records: int = 50) -> ReadAhead:
    fetcher.read_ahead = ReadAhead(fetcher.fetch, fetcher.position, fetcher.seek, limit, max_records)
    return fetcher.read_ahead


async def settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


async def test_what_comes_while_a_round_runs_is_taken_at_once_and_handed_to_the_next_round_whole() -> None:
    fetcher = Fetcher()
    ahead = read_ahead(fetcher)
    fetcher.produce(A, 3)
    assert offsets(await ahead.take(None, 1.0)) == {A: [0, 1, 2]}
    # The round runs; three fetches return meanwhile, each taken as it comes.
    for _ in range(3):
        fetcher.produce(A, 2)
        fetcher.produce(B, 1)
        await settle()
    assert ahead.held == 9 and fetcher.positions == {A: 9, B: 3}
    assert offsets(await ahead.take(None, 1.0)) == {A: [3, 4, 5, 6, 7, 8], B: [0, 1, 2]}
    assert ahead.held == 0
    ahead.close()


async def test_it_holds_at_most_its_limit_and_fetches_on_once_a_round_makes_room() -> None:
    fetcher = Fetcher()
    ahead = read_ahead(fetcher, limit=10)
    fetcher.produce(A, 1)
    assert offsets(await ahead.take(None, 1.0)) == {A: [0]}
    fetcher.produce(A, 25)
    await settle()
    assert ahead.held == 10 and fetcher.positions[A] == 11  # the rest stays with the broker's fetcher
    assert fetcher.calls[-1][1] <= 10
    calls = len(fetcher.calls)
    await settle()
    assert len(fetcher.calls) == calls  # full: no fetch until a round takes
    assert offsets(await ahead.take(None, 1.0)) == {A: list(range(1, 11))}
    await settle()
    assert ahead.held == 10
    assert offsets(await ahead.take(None, 1.0)) == {A: list(range(11, 21))}
    ahead.close()


async def test_a_seek_drops_what_is_held_for_its_partition_only() -> None:
    fetcher = Fetcher()
    ahead = read_ahead(fetcher)
    fetcher.produce(A, 1)
    await ahead.take(None, 1.0)
    fetcher.produce(A, 4)
    fetcher.produce(B, 2)
    await settle()
    fetcher.seek(A, 2)  # a rewind: what comes next for A is 2
    await settle()
    taken = offsets(await ahead.take(None, 1.0))
    assert taken[B] == [0, 1]
    assert taken.get(A, [2, 3, 4]) == [2, 3, 4]  # never 1..4 (held before the seek)
    if A not in taken:
        assert offsets(await ahead.take(None, 1.0)) == {A: [2, 3, 4]}
    assert ahead.dropped == 4
    ahead.close()


async def test_a_seek_while_records_are_being_taken_drops_those_of_its_partition() -> None:
    fetcher = Fetcher()
    ahead = read_ahead(fetcher)
    fetcher.produce(A, 1)
    await ahead.take(None, 1.0)
    fetcher.during_take = lambda: fetcher.seek(A, 0)  # from another thread, between the take and its keeping
    fetcher.produce(A, 3)
    fetcher.produce(B, 2)
    await settle()
    taken = offsets(await ahead.take(None, 1.0))
    while A not in taken or B not in taken:
        more = offsets(await ahead.take(None, 1.0))
        assert more and not set(more) & set(taken)
        taken |= more
    assert taken == {A: [0, 1, 2, 3], B: [0, 1]}  # A from the seek's offset, never 1..3 as taken before it
    assert ahead.dropped == 3
    ahead.close()


async def test_records_of_an_earlier_assignment_are_not_handed_on() -> None:
    fetcher = Fetcher()
    ahead = read_ahead(fetcher)
    fetcher.produce(A, 1)
    await ahead.take(None, 1.0)
    fetcher.produce(A, 3)
    await settle()
    fetcher.reassign()  # a rebalance: new states, positions as the new assignment seeks them
    fetcher.positions[A] = 1
    fetcher.arrived.set()
    taken = offsets(await ahead.take(None, 1.0))
    assert taken == {} or taken == {A: [1, 2, 3]}  # fetched again in the new assignment, never the old ones
    assert ahead.dropped == 3
    ahead.close()


async def test_what_is_held_for_a_partition_a_round_does_not_ask_for_goes_back_to_the_fetcher() -> None:
    fetcher = Fetcher()
    ahead = read_ahead(fetcher)
    fetcher.produce(A, 2)
    assert offsets(await ahead.take({A, B}, 1.0)) == {A: [0, 1]}
    fetcher.produce(A, 1)
    fetcher.produce(B, 2)
    await settle()
    assert ahead.held == 3
    assert offsets(await ahead.take({A}, 1.0)) == {A: [2]}  # B paused, say
    assert ahead.held == 0 and fetcher.positions[B] == 0 and ahead.dropped == 0  # as if never taken
    fetcher.produce(A, 1)
    await settle()
    assert offsets(await ahead.take({A}, 1.0)) == {A: [3]}
    assert fetcher.positions[B] == 0  # not read while not asked for
    assert offsets(await ahead.take({A, B}, 1.0)) == {B: [0, 1]}
    ahead.close()


async def test_a_round_asking_while_the_flow_is_stopped_comes_back_at_once() -> None:
    """Faust's fetch answers nothing at once while its flow is stopped: a round must not wait out its timeout,
    nor spin reading, then."""
    fetcher = Fetcher()
    ahead = read_ahead(fetcher)
    stopped = {"calls": 0}

    async def flow_stopped(partitions: Any, timeout: float, max_records: int) -> dict[Any, list[Any]]:
        stopped["calls"] += 1
        return {}

    ahead._fetch = flow_stopped  # type: ignore[method-assign]
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await ahead.take(None, 5.0) == {}
    assert loop.time() - started < 1.0 and stopped["calls"] == 1
    ahead.close()


async def test_a_fetch_error_reaches_the_round_that_asks_next() -> None:
    fetcher = Fetcher()
    ahead = read_ahead(fetcher)
    fetcher.produce(A, 1)
    await ahead.take(None, 1.0)
    fetcher.error = RuntimeError("consumer stopped")
    fetcher.arrived.set()
    await settle()
    with pytest.raises(RuntimeError, match="consumer stopped"):
        await ahead.take(None, 1.0)
    ahead.close()


async def test_a_round_waits_for_records_and_comes_back_empty_when_none_come() -> None:
    fetcher = Fetcher()
    ahead = read_ahead(fetcher)
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await ahead.take(None, 0.05) == {}
    assert loop.time() - started >= 0.05
    loop.call_later(0.02, fetcher.produce, A, 2)
    assert offsets(await ahead.take(None, 5.0)) == {A: [0, 1]}
    ahead.close()


async def test_without_a_limit_a_round_fetches_for_itself() -> None:
    fetcher = Fetcher()
    ahead = read_ahead(fetcher, limit=0, max_records=3)
    fetcher.produce(A, 5)
    assert offsets(await ahead.take(None, 1.0)) == {A: [0, 1, 2]}
    fetcher.produce(A, 1)
    await settle()
    assert fetcher.positions[A] == 3 and ahead.held == 0  # nothing taken between rounds
    assert offsets(await ahead.take(None, 1.0)) == {A: [3, 4, 5]}
    assert [call[1] for call in fetcher.calls] == [3, 3]


def test_its_bounds_are_checked() -> None:
    fetcher = Fetcher.__new__(Fetcher)
    with pytest.raises(ValueError):
        ReadAhead(fetcher.fetch, fetcher.position, fetcher.seek, -1, 10)
    with pytest.raises(ValueError):
        ReadAhead(fetcher.fetch, fetcher.position, fetcher.seek, 10, 0)
