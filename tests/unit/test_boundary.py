"""Unit tests for agents.boundary.ModelBoundary: batching, ordering, failures and backpressure."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import random
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass

import numpy as np
import pytest

from agents.boundary import BatchResult, BoundaryStats, ModelBoundary

WIDTH = 15
GUARD_S = 10.0  # hang guard only: every awaited outcome below happens without waiting on a clock
NEVER_MS = 3_600_000.0  # with a frozen fake clock, an age release can never happen


class FakeClock:
    """A monotonic clock that only moves when a test moves it."""

    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Collector:
    """An async ``deliver`` that records each BatchResult and lets a test wait for N items."""

    def __init__(self, before: Callable[[BatchResult[int]], Awaitable[None]] | None = None) -> None:
        self.results: list[BatchResult[int]] = []
        self._before = before
        self._changed = asyncio.Event()

    async def __call__(self, result: BatchResult[int]) -> None:
        if self._before is not None:
            await self._before(result)
        self.results.append(result)
        self._changed.set()

    @property
    def items(self) -> list[int]:
        return [item for r in self.results for item in r.items]

    async def wait_items(self, count: int) -> None:
        """Wait until at least ``count`` items were delivered (fails after the hang guard)."""

        async def until() -> None:
            while len(self.items) < count:
                self._changed.clear()
                await self._changed.wait()

        await asyncio.wait_for(until(), GUARD_S)


def row(i: int) -> list[float]:
    """A feature vector whose first value identifies the item."""
    return [float(i)] + [0.0] * (WIDTH - 1)


def tenth_of_first(features: np.ndarray) -> np.ndarray:
    """A real predict: the first feature divided by ten."""
    return features[:, 0] / 10


@dataclass
class Harness:
    """A running boundary, its collector and its dispatch task."""

    boundary: ModelBoundary[int]
    collector: Collector
    task: asyncio.Task[None]

    async def submit(self, i: int) -> None:
        await asyncio.wait_for(self.boundary.submit(row(i), i), GUARD_S)


MakeHarness = Callable[..., Harness]


@pytest.fixture
async def harness() -> AsyncIterator[MakeHarness]:
    """Factory: build a ModelBoundary, start run() as a task; cancels and closes at teardown."""
    made: list[Harness] = []

    def make(
        predict: Callable[[np.ndarray], np.ndarray] = tenth_of_first,
        collector: Collector | None = None,
        *,
        max_batch_size: int = 4,
        max_wait_ms: float = 0.0,
        max_inflight_batches: int = 2,
        clock: Callable[[], float] | None = None,
    ) -> Harness:
        collector = collector or Collector()
        kwargs = {} if clock is None else {"clock": clock}
        boundary: ModelBoundary[int] = ModelBoundary(
            predict,
            collector,
            max_batch_size=max_batch_size,
            max_wait_ms=max_wait_ms,
            max_inflight_batches=max_inflight_batches,
            **kwargs,
        )
        h = Harness(boundary, collector, asyncio.create_task(boundary.run()))
        made.append(h)
        return h

    yield make
    for h in made:
        h.task.cancel()
        with contextlib.suppress(asyncio.CancelledError, RuntimeError):
            await h.task
        h.boundary.close()


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    """A threading.Event gating predict; set at teardown so no thread hangs."""
    event = threading.Event()
    yield event
    event.set()


def gated(gate: threading.Event) -> Callable[[np.ndarray], np.ndarray]:
    """A predict that blocks on ``gate`` (bounded by the hang guard)."""

    def predict(features: np.ndarray) -> np.ndarray:
        if not gate.wait(GUARD_S):
            raise TimeoutError("gate never opened")
        return tenth_of_first(features)

    return predict


# --- delivery -------------------------------------------------------------------------------------


async def test_every_item_delivered_once_in_order(harness: MakeHarness) -> None:
    """All submitted items arrive exactly once, in submission order, in batches of at most 4."""
    h = harness(max_batch_size=4, max_wait_ms=0.0)
    rng = random.Random(3)
    for i in range(50):
        await h.submit(i)
        for _ in range(rng.randrange(3)):  # vary how batches form
            await asyncio.sleep(0)
    await h.collector.wait_items(50)
    assert h.collector.items == list(range(50))
    assert all(1 <= len(r.items) <= 4 for r in h.collector.results)
    for r in h.collector.results:
        assert r.error is None
        assert r.scores is not None
        np.testing.assert_allclose(r.scores, np.array(r.items, dtype=np.float32) / 10, rtol=1e-6)
        assert r.features.shape == (len(r.items), WIDTH)
        assert r.features.dtype == np.float32
        assert len(r.queue_ms) == len(r.items)
        assert r.infer_ms >= 0
    assert h.boundary.stats.items == 50
    assert h.boundary.stats.batches == len(h.collector.results)
    assert h.boundary.stats.failed_batches == 0
    assert h.boundary.waiting == 0


async def test_full_batches_released_by_size_without_waiting(harness: MakeHarness) -> None:
    """max_wait_ms=10 s, size 4: 8 items go out as two full batches long before any age bound."""
    clock = FakeClock()
    h = harness(max_batch_size=4, max_wait_ms=10_000, clock=clock)  # the clock never reaches 10 s
    for i in range(8):
        await h.submit(i)
    await h.collector.wait_items(8)
    assert [r.items for r in h.collector.results] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert all(q == 0.0 for r in h.collector.results for q in r.queue_ms)


async def test_partial_batch_waits_for_age_on_frozen_clock(harness: MakeHarness) -> None:
    """With the clock frozen, a partial batch is never released; full ones still are."""
    clock = FakeClock()
    h = harness(max_batch_size=4, max_wait_ms=NEVER_MS, clock=clock)
    for i in range(6):
        await h.submit(i)
    await h.collector.wait_items(4)
    for _ in range(20):
        await asyncio.sleep(0)
    assert h.collector.items == [0, 1, 2, 3]
    assert h.boundary.waiting == 2


async def test_partial_batch_released_by_age(harness: MakeHarness) -> None:
    """A lone item is delivered once its (short) wait has passed, in a batch of one."""
    h = harness(max_batch_size=64, max_wait_ms=1.0)
    await h.submit(7)
    await h.collector.wait_items(1)
    assert [r.items for r in h.collector.results] == [[7]]


async def test_queue_ms_measured_with_injected_clock(harness: MakeHarness) -> None:
    """queue_ms is dispatch time minus arrival time, per item, from the injected clock."""
    clock = FakeClock(100.0)
    h = harness(max_batch_size=8, max_wait_ms=0.0, clock=clock)
    await h.boundary.submit(row(0), 0)  # does not yield: nothing can be dispatched in between
    clock.now = 100.1
    await h.boundary.submit(row(1), 1)
    clock.now = 100.25
    await h.collector.wait_items(2)
    (result,) = h.collector.results
    assert result.items == [0, 1]
    assert result.queue_ms == pytest.approx([250.0, 150.0])
    assert h.boundary.stats.queue_ms_total == pytest.approx(400.0)


async def test_delivery_order_kept_when_deliver_is_slow(harness: MakeHarness) -> None:
    """A deliver that yields a varying number of times still sees batches in dispatch order."""
    rng = random.Random(11)

    async def dawdle(result: BatchResult[int]) -> None:
        for _ in range(rng.randrange(6)):
            await asyncio.sleep(0)

    h = harness(
        collector=Collector(before=dawdle),
        max_batch_size=3,
        max_wait_ms=0.0,
        max_inflight_batches=3,
    )
    for i in range(40):
        await h.submit(i)
        if i % 5 == 0:
            await asyncio.sleep(0)
    await h.collector.wait_items(40)
    assert h.collector.items == list(range(40))
    assert all(len(r.items) <= 3 for r in h.collector.results)


async def test_drain_waits_for_dispatched_batches(harness: MakeHarness) -> None:
    """drain() returns only after every dispatched batch was delivered."""
    released = asyncio.Event()

    async def hold(_: BatchResult[int]) -> None:
        await released.wait()

    h = harness(
        collector=Collector(before=hold), max_batch_size=2, max_wait_ms=NEVER_MS, clock=FakeClock()
    )
    for i in range(4):
        await h.submit(i)

    async def dispatched() -> None:
        while h.boundary.waiting:
            await asyncio.sleep(0)

    await asyncio.wait_for(dispatched(), GUARD_S)
    drain = asyncio.create_task(h.boundary.drain())
    for _ in range(20):
        await asyncio.sleep(0)
    assert not drain.done()
    assert h.collector.items == []
    released.set()
    await asyncio.wait_for(drain, GUARD_S)
    assert h.collector.items == [0, 1, 2, 3]


async def test_drain_without_batches_returns() -> None:
    """drain() on a boundary that never dispatched returns at once."""
    boundary: ModelBoundary[int] = ModelBoundary(
        tenth_of_first, Collector(), max_batch_size=2, max_wait_ms=1
    )
    try:
        await asyncio.wait_for(boundary.drain(), GUARD_S)
    finally:
        boundary.close()


# --- failures -------------------------------------------------------------------------------------


async def test_predict_error_is_delivered_not_raised(harness: MakeHarness) -> None:
    """A failing predict gives a BatchResult with the error, no scores, its items; then recovers."""

    def picky(features: np.ndarray) -> np.ndarray:
        if (features[:, 0] < 0).any():
            raise ValueError("negative feature")
        return tenth_of_first(features)

    h = harness(picky, max_batch_size=4, max_wait_ms=0.0)
    await h.submit(1)
    await h.collector.wait_items(1)
    await h.submit(-2)
    await h.submit(-3)
    await h.collector.wait_items(3)
    await h.submit(4)
    await h.collector.wait_items(4)
    results = h.collector.results
    assert h.collector.items == [1, -2, -3, 4]
    failed = [r for r in results if r.error is not None]
    assert [item for r in failed for item in r.items] == [-2, -3]
    for r in failed:
        assert isinstance(r.error, ValueError)
        assert r.scores is None
        assert r.infer_ms == 0.0
    ok = [r for r in results if r.error is None]
    assert [item for r in ok for item in r.items] == [1, 4]
    assert all(r.scores is not None for r in ok)
    assert h.boundary.stats.failed_batches == len(failed)
    assert not h.task.done()


async def test_deliver_error_makes_run_raise(harness: MakeHarness) -> None:
    """If deliver raises, run() raises (chained to the cause) and later submits fail too."""
    boom = ConnectionError("broker gone")

    async def explode(_: BatchResult[int]) -> None:
        raise boom

    # The failure surfaces through run() and submit() only: no "exception was never retrieved".
    unhandled: list[dict[str, object]] = []
    asyncio.get_running_loop().set_exception_handler(
        lambda _loop, context: unhandled.append(context)
    )
    h = harness(collector=Collector(before=explode), max_batch_size=2, max_wait_ms=0.0)
    await h.submit(1)
    with pytest.raises(RuntimeError, match="delivering a scored batch failed") as info:
        await asyncio.wait_for(h.task, GUARD_S)
    assert info.value.__cause__ is boom
    with pytest.raises(RuntimeError):
        await h.boundary.submit(row(2), 2)
    gc.collect()
    await asyncio.sleep(0)
    assert unhandled == []


# --- backpressure ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("max_batch_size", "max_inflight_batches"), [(2, 1), (3, 2)])
async def test_submit_blocks_when_full_then_resumes(
    harness: MakeHarness,
    gate: threading.Event,
    max_batch_size: int,
    max_inflight_batches: int,
) -> None:
    """Inference stuck: submit blocks once max_batch_size*(max_inflight_batches+1) items wait."""
    h = harness(
        gated(gate),
        max_batch_size=max_batch_size,
        max_wait_ms=NEVER_MS,
        max_inflight_batches=max_inflight_batches,
        clock=FakeClock(),
    )
    capacity = max_batch_size * (max_inflight_batches + 1)
    in_flight = max_batch_size * max_inflight_batches  # dispatched, stuck in or before predict
    accepted = in_flight + capacity
    for i in range(accepted):
        await h.submit(i)  # each completes (the hang guard fails the test otherwise)
    assert h.boundary.waiting == capacity

    blocked = asyncio.create_task(h.boundary.submit(row(accepted), accepted))
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(asyncio.shield(blocked), 0.05)
    assert not blocked.done()
    assert h.boundary.waiting == capacity
    assert h.collector.items == []

    gate.set()
    await asyncio.wait_for(blocked, GUARD_S)
    total = accepted + 1
    while total % max_batch_size:  # fill the last batch so it is released by size
        await h.submit(total)
        total += 1
    await h.collector.wait_items(total)
    assert h.collector.items == list(range(total))
    assert all(len(r.items) == max_batch_size for r in h.collector.results)


# --- construction and stats -----------------------------------------------------------------------


async def test_constructor_validation() -> None:
    """Zero in-flight batches, a zero batch size or a negative wait are rejected."""
    with pytest.raises(ValueError, match="max_inflight_batches"):
        ModelBoundary(
            tenth_of_first, Collector(), max_batch_size=4, max_wait_ms=1, max_inflight_batches=0
        )
    with pytest.raises(ValueError, match="max_batch_size"):
        ModelBoundary(tenth_of_first, Collector(), max_batch_size=0, max_wait_ms=1)
    with pytest.raises(ValueError, match="max_wait_s"):
        ModelBoundary(tenth_of_first, Collector(), max_batch_size=4, max_wait_ms=-1)


def test_empty_stats_are_zero() -> None:
    """Stats of an unused boundary are zeros, without division errors."""
    assert BoundaryStats().as_dict() == {
        "batches": 0,
        "items": 0,
        "failed_batches": 0,
        "mean_batch_size": 0.0,
        "mean_queue_ms": 0.0,
        "mean_infer_ms": 0.0,
    }


def test_stats_means() -> None:
    """Means are per item (queue) and per batch (size, inference)."""
    stats = BoundaryStats(
        batches=2, items=6, failed_batches=1, queue_ms_total=12.0, infer_ms_total=3.0
    )
    assert stats.as_dict() == {
        "batches": 2,
        "items": 6,
        "failed_batches": 1,
        "mean_batch_size": 3.0,
        "mean_queue_ms": 2.0,
        "mean_infer_ms": 1.5,
    }
