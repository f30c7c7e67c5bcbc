"""Unit tests for agents.model.boundary.ModelBoundary: batching, ordering, failures, deadlines and backpressure.

No Kafka and no wall-clock assertions: the boundary runs on an injected fake clock wherever time matters,
predict functions are real numpy code on the real inference thread, and every wait is bounded by a hang
guard that only fires if an expected outcome never happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import random
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from agents.model.batcher import LatencyModel
from agents.model.boundary import BatchObserver, BatchResult, BoundaryStats, ModelBoundary
from agents.model.runtime import ModelInfo, ModelRuntime

WIDTH = 15
GUARD_S = 10.0  # hang guard only: every awaited outcome below happens without waiting on a clock
NEVER_MS = 3_600_000.0  # with a frozen fake clock, an age release can never happen
MARK = 666.0  # a feature value that makes the marked-row predicts below fail
MS = 0.001


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
        """Every delivered item, in delivery order."""
        return [item for r in self.results for item in r.items]

    async def wait_items(self, count: int) -> None:
        """Wait until at least ``count`` items were delivered (fails after the hang guard)."""

        async def until() -> None:
            while len(self.items) < count:
                self._changed.clear()
                await self._changed.wait()

        try:
            await asyncio.wait_for(until(), GUARD_S)
        except TimeoutError:
            pytest.fail(f"{len(self.items)} of {count} items delivered within the {GUARD_S} s hang guard")


def row(i: int, *, marked: bool = False) -> list[float]:
    """A feature vector whose first value identifies the item; a marked one carries MARK second."""
    return [float(i), MARK if marked else 0.0] + [0.0] * (WIDTH - 2)


def tenth_of_first(features: np.ndarray) -> np.ndarray:
    """A real predict: the first feature divided by ten."""
    return features[:, 0] / 10


def fails_on_mark(features: np.ndarray) -> np.ndarray:
    """A real predict that raises whenever its batch contains a marked row (like a poisoned input)."""
    if (features == MARK).any():
        raise ValueError(f"marked row in a batch of {len(features)}")
    return tenth_of_first(features)


class FixedLatency(LatencyModel):
    """A latency model with fixed coefficients ``t(n) = a + b * n``, deaf to measured inference times.

    Measured times come from ``time.perf_counter`` on the inference thread, so a test that needs a
    known ``t(n)`` installs one of these as ``boundary.batcher.latency``.
    """

    def __init__(self, a: float, b: float) -> None:
        super().__init__()
        self.a, self.b = a, b
        self.observed: list[int] = []

    def observe(self, batch_size: int, seconds: float) -> None:
        """Count the observation; the coefficients stay as set."""
        self.observed.append(batch_size)

    def coefficients(self) -> tuple[float, float]:
        """The current ``(a, b)``."""
        return self.a, self.b


@dataclass
class ObserverCall:
    """The arguments of one BatchObserver.on_batch call."""

    size: int
    queue_s: list[float]
    infer_s: float
    failed_rows: int
    deadline_misses: int
    target_size: int


@dataclass
class RecordingObserver:
    """A BatchObserver that records every call."""

    calls: list[ObserverCall] = field(default_factory=list)

    def on_batch(self, size: int, queue_s: Sequence[float], infer_s: float, failed_rows: int,
                 deadline_misses: int, target_size: int, arrived_late: int = 0) -> None:
        """Record one completed batch."""
        self.calls.append(ObserverCall(size, list(queue_s), infer_s, failed_rows, deadline_misses, target_size))


@dataclass
class Harness:
    """A running boundary, its collector and its dispatch task."""

    boundary: ModelBoundary[int]
    collector: Collector
    task: asyncio.Task[None]

    async def submit(self, i: int, *, marked: bool = False) -> None:
        """Submit item ``i`` (its feature row from :func:`row`), bounded by the hang guard."""
        await asyncio.wait_for(self.boundary.submit(row(i, marked=marked), i), GUARD_S)


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
        sla_ms: float | None = None,
        adaptive: bool = False,
        observer: BatchObserver | None = None,
        age_of: Callable[[int], float] | None = None,
    ) -> Harness:
        collector = collector or Collector()
        kwargs: dict[str, Any] = {} if clock is None else {"clock": clock}
        if age_of is not None:
            kwargs["age_of"] = age_of
        boundary: ModelBoundary[int] = ModelBoundary(
            predict,
            collector,
            max_batch_size=max_batch_size,
            max_wait_ms=max_wait_ms,
            max_inflight_batches=max_inflight_batches,
            sla_ms=sla_ms,
            adaptive=adaptive,
            observer=observer,
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
        assert r.row_errors == {}
        assert isinstance(r.scores, np.ndarray)
        assert r.scores.shape == (len(r.items),)
        assert not np.isnan(r.scores).any()
        np.testing.assert_allclose(r.scores, np.array(r.items, dtype=np.float32) / 10, rtol=1e-6)
        assert r.features.shape == (len(r.items), WIDTH)
        assert r.features.dtype == np.float32
        assert len(r.queue_ms) == len(r.items)
        assert r.infer_ms >= 0
        assert r.deadline_misses == 0
    assert h.boundary.stats.items == 50
    assert h.boundary.stats.batches == len(h.collector.results)
    assert h.boundary.stats.failed_rows == 0
    assert h.boundary.stats.deadline_misses == 0
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


async def test_per_card_order_kept_across_batches(harness: MakeHarness) -> None:
    """Concurrent per-card producers, 2 batches in flight, predict with random sleeps: per-card order holds."""
    cards, per_card = 6, 40
    thread_rng = random.Random(5)  # used on the single inference thread only

    def jittery(features: np.ndarray) -> np.ndarray:
        time.sleep(thread_rng.uniform(0.0, 0.001))
        return tenth_of_first(features)

    h = harness(jittery, max_batch_size=4, max_wait_ms=0.0, max_inflight_batches=2, clock=FakeClock())

    async def produce(card: int) -> None:
        rng = random.Random(card)
        for seq in range(per_card):
            await h.submit(card * 1000 + seq)
            for _ in range(rng.randrange(3)):
                await asyncio.sleep(0)

    await asyncio.wait_for(asyncio.gather(*(produce(c) for c in range(cards))), GUARD_S)
    await h.collector.wait_items(cards * per_card)
    delivered = h.collector.items
    assert sorted(delivered) == sorted(c * 1000 + s for c in range(cards) for s in range(per_card))
    for card in range(cards):
        assert [i % 1000 for i in delivered if i // 1000 == card] == list(range(per_card))
    assert len(h.collector.results) >= cards * per_card // 4
    for r in h.collector.results:
        np.testing.assert_allclose(r.scores, np.array(r.items, dtype=np.float32) / 10, rtol=1e-6)


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
    """A predict that always raises: every row comes back in row_errors with NaN scores, run() goes on."""
    calls: list[int] = []

    def broken(features: np.ndarray) -> np.ndarray:
        calls.append(len(features))
        raise ValueError("model exploded")

    h = harness(broken, max_batch_size=4, max_wait_ms=NEVER_MS, clock=FakeClock())
    for i in range(8):
        await h.submit(i)
    await h.collector.wait_items(8)
    assert h.collector.items == list(range(8))
    assert [len(r.items) for r in h.collector.results] == [4, 4]
    for r in h.collector.results:
        assert r.row_errors == {i: "ValueError: model exploded" for i in range(4)}
        assert isinstance(r.scores, np.ndarray)
        assert r.scores.shape == (4,)
        assert np.isnan(r.scores).all()
        np.testing.assert_array_equal(r.features[:, 0], np.array(r.items, dtype=np.float32))
        assert len(r.queue_ms) == 4
    # each batch was tried whole first, then bisected down to every row on its own
    assert calls[0] == 4
    assert calls.count(1) == 8
    assert h.boundary.stats.failed_rows == 8
    assert h.boundary.stats.items == 8
    # failed batches are not timing samples for the latency model
    assert h.boundary.batcher.latency.coefficients() == LatencyModel().coefficients()
    assert not h.task.done()
    await h.submit(8)  # and the boundary still takes and delivers work
    await h.boundary.flush()
    assert h.collector.results[-1].items == [8]
    assert h.collector.results[-1].row_errors == {0: "ValueError: model exploded"}
    assert not h.task.done()


async def test_failing_rows_isolated_then_recovers(harness: MakeHarness) -> None:
    """Rows a picky predict rejects come back as row errors; the others, before and after, are scored."""

    def picky(features: np.ndarray) -> np.ndarray:
        if (features[:, 0] < 0).any():
            raise ValueError("negative feature")
        return tenth_of_first(features)

    h = harness(picky, max_batch_size=4, max_wait_ms=0.0)
    await h.submit(1)
    await h.collector.wait_items(1)
    await h.submit(-2)
    await h.submit(-3)
    await h.submit(5)
    await h.collector.wait_items(4)
    await h.submit(4)
    await h.collector.wait_items(5)
    assert h.collector.items == [1, -2, -3, 5, 4]
    failed = {item for r in h.collector.results for i, item in enumerate(r.items) if i in r.row_errors}
    assert failed == {-2, -3}
    for r in h.collector.results:
        for i, item in enumerate(r.items):
            if i in r.row_errors:
                assert r.row_errors[i] == "ValueError: negative feature"
                assert np.isnan(r.scores[i])
            else:
                assert r.scores[i] == pytest.approx(item / 10)
    assert h.boundary.stats.failed_rows == 2
    assert not h.task.done()


@pytest.mark.parametrize("marked", [(3, 11), (0, 15), (7, 8), (5,), tuple(range(16))])
async def test_bisection_isolates_exactly_the_failing_rows(harness: MakeHarness, marked: tuple[int, ...]) -> None:
    """A batch of 16 with marked rows: exactly those indexes fail, with the message; the rest are scored."""
    h = harness(fails_on_mark, max_batch_size=16, max_wait_ms=NEVER_MS, clock=FakeClock())
    for i in range(16):
        await h.submit(i, marked=i in marked)
    await h.collector.wait_items(16)
    (result,) = h.collector.results
    assert result.items == list(range(16))
    assert sorted(result.row_errors) == list(marked)
    for i in marked:
        assert result.row_errors[i] == "ValueError: marked row in a batch of 1"
        assert np.isnan(result.scores[i])
    scored = [i for i in range(16) if i not in marked]
    np.testing.assert_allclose(result.scores[scored], np.array(scored, dtype=np.float32) / 10, rtol=1e-6)
    assert h.boundary.stats.failed_rows == len(marked)
    assert h.boundary.stats.items == 16


class ShortByOneSession:
    """An ONNX-Runtime-like session that returns one score too few when a batch holds a marked row."""

    def run(self, output_names: list[str], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        """Score ``feeds``' only input like :func:`tenth_of_first`, as an ``[N, 1]`` output."""
        (features,) = feeds.values()
        scores = tenth_of_first(features).reshape(-1, 1)
        return [scores[:-1] if (features == MARK).any() else scores]


async def test_model_contract_violation_isolated_like_an_error(harness: MakeHarness) -> None:
    """ModelRuntime.predict raises ModelContractError on a short output; those rows are bisected out."""
    info = ModelInfo(name="stub", version="1", path="stub.onnx", provider="CPUExecutionProvider",
                     feature_names=tuple(f"f{i}" for i in range(WIDTH)), input_name="x", output_name="score")
    runtime = ModelRuntime(ShortByOneSession(), info)  # type: ignore[arg-type]
    h = harness(runtime.predict, max_batch_size=8, max_wait_ms=NEVER_MS, clock=FakeClock())
    for i in range(8):
        await h.submit(i, marked=i == 5)
    await h.collector.wait_items(8)
    (result,) = h.collector.results
    assert result.row_errors == {5: "ModelContractError: model returned 0 scores for a batch of 1 rows"}
    assert np.isnan(result.scores[5])
    scored = [0, 1, 2, 3, 4, 6, 7]
    np.testing.assert_allclose(result.scores[scored], np.array(scored, dtype=np.float32) / 10, rtol=1e-6)


async def test_value_error_from_wrong_row_count_isolated(harness: MakeHarness) -> None:
    """A predict that checks its own output length and raises ValueError is handled the same way."""

    def checked(features: np.ndarray) -> np.ndarray:
        scores = tenth_of_first(features)
        if (features == MARK).any():
            scores = scores[1:]
        if len(scores) != len(features):
            raise ValueError(f"{len(scores)} scores for {len(features)} rows")
        return scores

    h = harness(checked, max_batch_size=8, max_wait_ms=NEVER_MS, clock=FakeClock())
    for i in range(8):
        await h.submit(i, marked=i in (0, 6))
    await h.collector.wait_items(8)
    (result,) = h.collector.results
    assert result.row_errors == {0: "ValueError: 0 scores for 1 rows", 6: "ValueError: 0 scores for 1 rows"}
    scored = [1, 2, 3, 4, 5, 7]
    np.testing.assert_allclose(result.scores[scored], np.array(scored, dtype=np.float32) / 10, rtol=1e-6)
    assert np.isnan(result.scores[[0, 6]]).all()


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


# --- deadlines and adaptive batching ------------------------------------------------------------


async def test_lone_item_released_at_deadline_minus_predicted_latency(harness: MakeHarness) -> None:
    """SLA 20 ms, predicted inference 3 ms, max wait 50 ms: a lone item goes out at arrival + 17 ms."""
    clock = FakeClock(1_000.0)
    h = harness(max_batch_size=64, max_wait_ms=50.0, sla_ms=20.0, clock=clock)
    h.boundary.batcher.latency = LatencyModel(prior_s=0.003)
    await h.boundary.submit(row(1), 1)
    clock.now = 1_000.0165  # before the deadline release (and long before the age bound)
    await asyncio.sleep(0.1)  # let run() re-check the clock several times (its timer is ~17 ms)
    assert h.collector.items == []
    assert h.boundary.waiting == 1
    clock.now = 1_000.0175  # past arrival + 20 ms - 3 ms, still before arrival + 50 ms
    await h.collector.wait_items(1)
    (result,) = h.collector.results
    assert result.queue_ms == pytest.approx([17.5])
    assert result.deadline_misses == 0


async def test_deadline_misses_counted_when_inference_runs_late(harness: MakeHarness) -> None:
    """Only items whose deadline passed before delivery count: inference taking 10 ms makes one miss."""
    clock = FakeClock(1_000.0)

    def slow_by_10_ms(features: np.ndarray) -> np.ndarray:
        clock.now += 10 * MS  # the inference takes 10 ms of (fake) time
        return tenth_of_first(features)

    h = harness(slow_by_10_ms, max_batch_size=2, max_wait_ms=NEVER_MS, sla_ms=20.0, clock=clock)
    await h.boundary.submit(row(0), 0)  # deadline 1000.020
    clock.now = 1_000.015
    await h.boundary.submit(row(1), 1)  # deadline 1000.035; the pair is released by size at 1000.015
    await h.collector.wait_items(2)
    first = h.collector.results[0]
    assert first.queue_ms == pytest.approx([15.0, 0.0])
    assert first.deadline_misses == 1  # done at 1000.025: item 0 late, item 1 in time
    await h.submit(2)
    await h.submit(3)  # arrive at 1000.025, done at 1000.035: in time
    await h.collector.wait_items(4)
    assert h.collector.results[1].deadline_misses == 0
    assert h.boundary.stats.deadline_misses == 1


async def test_the_deadline_counts_from_the_input_record_not_from_the_boundary(harness: MakeHarness) -> None:
    """An item that spent 15 ms before the boundary has 5 ms of a 20 ms SLA left; one 30 ms old has none."""
    clock = FakeClock(1_000.0)
    ages = {0: 0.015, 1: 0.030}
    observer = RecordingObserver()
    h = harness(max_batch_size=8, max_wait_ms=10.0, sla_ms=20.0, clock=clock, age_of=ages.__getitem__,
                observer=observer)
    await h.boundary.submit(row(0), 0)
    assert h.boundary.batcher.due_at() == pytest.approx(1_000.005, abs=1e-3)  # 5 ms left, less inference
    clock.now = 1_000.006
    await h.collector.wait_items(1)
    await h.boundary.submit(row(1), 1)  # already past its deadline: a backlog, so the age bound releases it
    assert h.boundary.batcher.due_at() == pytest.approx(1_000.016)
    clock.now = 1_000.016
    await h.collector.wait_items(2)
    late = h.collector.results[1]
    assert late.deadline_misses == 1 and late.arrived_late == 1
    assert h.boundary.stats.arrived_late == 1 and h.boundary.stats.as_dict()["arrived_late"] == 1
    assert [c.deadline_misses for c in observer.calls] == [1, 1]  # the first one finished at 1000.006


async def test_deadline_misses_include_waiting_for_earlier_delivery(harness: MakeHarness) -> None:
    """A batch delivered after a slow delivery of the previous one misses its deadline; the first does not."""
    clock = FakeClock(1_000.0)

    async def slow_first_delivery(result: BatchResult[int]) -> None:
        if result.items[0] == 0:
            clock.now += 30 * MS

    h = harness(collector=Collector(before=slow_first_delivery), max_batch_size=2, max_wait_ms=NEVER_MS,
                sla_ms=20.0, clock=clock)
    for i in range(4):
        await h.boundary.submit(row(i), i)  # all at 1000.000: two batches, both dispatched at once
    await h.collector.wait_items(4)
    assert [r.deadline_misses for r in h.collector.results] == [0, 2]
    assert h.boundary.stats.deadline_misses == 2


async def test_adaptive_low_rate_releases_single_items_at_once(harness: MakeHarness) -> None:
    """Adaptive, one item per 10 s against a 20 ms SLA: target 1, each item goes out with no clock movement."""
    clock = FakeClock(1_000.0)
    h = harness(max_batch_size=64, max_wait_ms=NEVER_MS, sla_ms=20.0, adaptive=True, clock=clock)
    assert h.boundary.batcher.target_size() == 1  # no rate known yet
    await h.submit(0)
    await h.collector.wait_items(1)
    clock.now += 10.0
    await h.submit(1)
    await h.collector.wait_items(2)
    assert h.boundary.batcher.rate.rate() == pytest.approx(0.1)
    assert h.boundary.batcher.target_size() == 1
    assert [r.items for r in h.collector.results] == [[0], [1]]
    assert [r.queue_ms for r in h.collector.results] == [[0.0], [0.0]]


async def test_adaptive_high_rate_fills_batches_up_to_the_cap(harness: MakeHarness) -> None:
    """Adaptive at 10k items/s, t(n) = 1 ms + 0.01 ms * n, SLA 20 ms: the target (173) is capped at 16."""
    clock = FakeClock(1_000.0)
    observer = RecordingObserver()
    h = harness(max_batch_size=16, max_wait_ms=NEVER_MS, sla_ms=20.0, adaptive=True, clock=clock,
                observer=observer)
    h.boundary.batcher.latency = FixedLatency(1 * MS, 0.01 * MS)
    await h.submit(0)  # rate unknown: released alone
    await h.collector.wait_items(1)
    for i in range(1, 33):
        clock.now += 0.1 * MS
        await h.boundary.submit(row(i), i)  # no yield in between: the loop sees all 32 at once
    assert h.boundary.batcher.rate.rate() == pytest.approx(10_000, rel=1e-6)
    assert h.boundary.batcher.target_size() == 16
    await h.collector.wait_items(33)
    assert [len(r.items) for r in h.collector.results] == [1, 16, 16]
    assert h.collector.items == list(range(33))
    assert [c.target_size for c in observer.calls] == [1, 16, 16]
    assert h.boundary.stats.deadline_misses == 0


async def test_adaptive_items_pile_up_while_busy_and_leave_together(
    harness: MakeHarness, gate: threading.Event
) -> None:
    """Work-conserving adaptive release: idle thread -> at once; busy -> wait, then go out as one batch."""
    clock = FakeClock(1_000.0)
    h = harness(gated(gate), max_batch_size=64, max_wait_ms=NEVER_MS, sla_ms=20.0, adaptive=True, clock=clock)
    h.boundary.batcher.latency = FixedLatency(1 * MS, 0.01 * MS)
    await h.submit(0)  # thread idle: dispatched at once, then held at the gate

    async def dispatched() -> None:
        while h.boundary.waiting:
            await asyncio.sleep(0)

    await asyncio.wait_for(dispatched(), GUARD_S)
    for i in range(1, 11):
        clock.now += 0.1 * MS
        await h.submit(i)
    for _ in range(20):
        await asyncio.sleep(0)
    # 10 waiting, below the target of 64 (173 capped), deadline 19 ms away: they wait for the thread
    assert h.boundary.batcher.target_size() == 64
    assert h.boundary.waiting == 10
    gate.set()
    await h.collector.wait_items(11)
    assert [r.items for r in h.collector.results] == [[0], list(range(1, 11))]
    assert h.boundary.stats.deadline_misses == 0


async def test_a_hand_over_in_parts_leaves_as_one_batch_while_held(harness: MakeHarness) -> None:
    """Adaptive, idle thread: rows handed in parts (a fetch's partitions, the loop turning in between) while the
    boundary is held leave together when the hold ends; without a hold the first part leaves alone."""
    clock = FakeClock(1_000.0)
    h = harness(max_batch_size=64, max_wait_ms=NEVER_MS, sla_ms=20.0, adaptive=True, clock=clock)
    h.boundary.batcher.latency = FixedLatency(1 * MS, 0.01 * MS)
    await h.submit(0)  # no rate known yet: released alone
    await h.collector.wait_items(1)

    async def hand_in(part: tuple[int, ...]) -> None:
        clock.now += 0.1 * MS
        await h.boundary.submit_many([(row(i), i) for i in part])
        for _ in range(20):
            await asyncio.sleep(0)  # the dispatch loop runs in between

    with h.boundary.holding():
        for part in ((1, 2), (3, 4), (5,)):
            await hand_in(part)
        assert h.boundary.waiting == 5 and len(h.collector.results) == 1  # below the size target: held
    await h.collector.wait_items(6)
    await hand_in((6, 7))  # no hold: the idle thread takes the first part at once
    await h.collector.wait_items(8)
    await hand_in((8,))
    await h.collector.wait_items(9)
    assert [r.items for r in h.collector.results] == [[0], [1, 2, 3, 4, 5], [6, 7], [8]]


async def test_a_held_boundary_still_releases_by_size(harness: MakeHarness) -> None:
    """A hold suspends only the idle release: a batch of the size target goes out during the hand-over."""
    clock = FakeClock(1_000.0)
    h = harness(max_batch_size=4, max_wait_ms=NEVER_MS, sla_ms=20.0, adaptive=True, clock=clock)
    h.boundary.batcher.latency = FixedLatency(1 * MS, 0.01 * MS)
    await h.submit(0)
    await h.collector.wait_items(1)
    with h.boundary.holding():
        clock.now += 0.1 * MS
        await h.boundary.submit_many([(row(i), i) for i in range(1, 7)])
        await h.collector.wait_items(5)  # the size target (4) released while held
        for _ in range(20):
            await asyncio.sleep(0)
        assert h.boundary.waiting == 2
    await h.collector.wait_items(7)
    assert [r.items for r in h.collector.results] == [[0], [1, 2, 3, 4], [5, 6]]


async def test_deadline_release_when_queue_growth_moves_due_earlier(harness: MakeHarness) -> None:
    """Rule 3 with t(n) growing in n: more waiting items make the batch due earlier, and it must go out.

    SLA 1 h, t(n) = 50 s * n, size target 64. A lone item is due at arrival + 3550 s, so run() sleeps
    until then. 700 s later 59 more arrive: 60 items are due at arrival + 3600 - 3000 = 600 s, already
    past. The boundary must release them now rather than at the lone item's old due time.
    """
    clock = FakeClock(1_000.0)
    h = harness(max_batch_size=64, max_wait_ms=NEVER_MS, sla_ms=3_600_000.0, clock=clock)
    h.boundary.batcher.latency = FixedLatency(0.0, 50.0)
    await h.submit(0)
    for _ in range(20):
        await asyncio.sleep(0)  # run() has computed the lone item's due time and sleeps
    clock.now = 1_700.0
    for i in range(1, 60):
        await h.boundary.submit(row(i), i)
    assert h.boundary.batcher.ready(clock.now)
    await h.collector.wait_items(60)
    assert h.collector.items == list(range(60))
    assert h.boundary.stats.deadline_misses == 0


async def test_deadline_release_when_latency_estimate_rises(
    harness: MakeHarness, gate: threading.Event
) -> None:
    """Rule 3 after the latency model learns inference is slow: the waiting item's earlier due applies.

    SLA 1 h, predicted inference 0 s: a lone item is due at arrival + 3600 s and run() sleeps. A batch
    in flight then completes and the model learns t = 3000 s: the item is due at arrival + 600 s, and at
    1000 + 700 s it must be released instead of waiting for the old due time.
    """

    class LearnsSlow(FixedLatency):
        """Predicts 0 s until it observes a batch, then 3000 s per call (measured times are real)."""

        def observe(self, batch_size: int, seconds: float) -> None:
            super().observe(batch_size, seconds)
            self.a = 3_000.0

    clock = FakeClock(1_000.0)
    h = harness(gated(gate), max_batch_size=4, max_wait_ms=NEVER_MS, sla_ms=3_600_000.0, clock=clock)
    h.boundary.batcher.latency = LearnsSlow(0.0, 0.0)
    for i in range(4):
        await h.submit(i)  # a full batch, dispatched and held at the gate
    await h.submit(4)  # alone: due at 1000 + 3600 s
    for _ in range(20):
        await asyncio.sleep(0)  # run() has computed that due time and sleeps
    assert h.boundary.waiting == 1
    clock.now = 1_700.0
    assert not h.boundary.batcher.ready(clock.now)
    gate.set()
    await h.collector.wait_items(5)  # now due at 1000 + 600 s: released without the old timer firing
    assert [r.items for r in h.collector.results] == [[0, 1, 2, 3], [4]]


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


async def test_backpressure_bounds_memory_with_a_slow_model(harness: MakeHarness) -> None:
    """A model ~10x slower than a producer: waiting items never exceed the capacity, the producer is held.

    The documented bounds: at most max_batch_size * (max_inflight_batches + 1) items wait, and at most
    max_inflight_batches batches are between dispatch and the end of their inference.
    """
    max_batch_size, max_inflight_batches, total = 4, 2, 120
    capacity = max_batch_size * (max_inflight_batches + 1)
    inferred = [0]  # items whose predict returned; written on the inference thread only

    def slow(features: np.ndarray) -> np.ndarray:
        time.sleep(0.002)  # 2 ms per batch of <= 4: far slower than the producer below
        inferred[0] += len(features)
        return tenth_of_first(features)

    h = harness(slow, max_batch_size=max_batch_size, max_wait_ms=0.0,
                max_inflight_batches=max_inflight_batches, clock=FakeClock())
    waiting: list[int] = []
    inferring: list[int] = []

    async def produce() -> None:
        for i in range(total):
            await h.boundary.submit(row(i), i)
            waiting.append(h.boundary.waiting)
            inferring.append(i + 1 - h.boundary.waiting - inferred[0])

    await asyncio.wait_for(produce(), GUARD_S)
    await h.collector.wait_items(total)
    assert max(waiting) == capacity  # the producer really was held back by a full boundary
    assert all(w <= capacity for w in waiting)
    assert all(0 <= n <= max_batch_size * max_inflight_batches for n in inferring)
    assert max(w + n for w, n in zip(waiting, inferring, strict=True)) <= (
        capacity + max_batch_size * max_inflight_batches)
    assert h.collector.items == list(range(total))


async def test_backpressure_holds_while_delivery_is_stuck(harness: MakeHarness) -> None:
    """Delivery blocked (e.g. the producer to Kafka stalls): submit must block once the boundary is full.

    The module documents that at most max_inflight_batches batches are dispatched and not yet delivered,
    and that at most max_batch_size * (max_inflight_batches + 1) items wait. So, with deliver stuck, no
    more than in_flight + capacity items can be accepted, however long the producer tries.
    """
    released = asyncio.Event()

    async def stuck(_: BatchResult[int]) -> None:
        await released.wait()

    max_batch_size, max_inflight_batches = 2, 1
    h = harness(collector=Collector(before=stuck), max_batch_size=max_batch_size, max_wait_ms=0.0,
                max_inflight_batches=max_inflight_batches, clock=FakeClock())
    bound = max_batch_size * max_inflight_batches + max_batch_size * (max_inflight_batches + 1)
    accepted = [0]

    async def produce() -> None:
        for i in range(200):
            await h.boundary.submit(row(i), i)
            accepted[0] += 1

    producer = asyncio.create_task(produce())
    try:
        await asyncio.wait([producer], timeout=1.0)  # more than enough for 200 fast predicts
        assert accepted[0] <= bound, f"accepted {accepted[0]} items with delivery stuck (bound {bound})"
    finally:
        producer.cancel()
        released.set()
        with contextlib.suppress(asyncio.CancelledError):
            await producer


# --- observer -------------------------------------------------------------------------------------


async def test_observer_sees_every_batch_consistently(harness: MakeHarness) -> None:
    """One on_batch per batch, in delivery order, with the sizes, delays and failures of the result."""
    observer = RecordingObserver()
    h = harness(fails_on_mark, max_batch_size=4, max_wait_ms=NEVER_MS, clock=FakeClock(), observer=observer)
    for i in range(12):
        await h.submit(i, marked=i in (3, 5, 6))
    await h.collector.wait_items(12)
    results = h.collector.results
    assert len(observer.calls) == len(results) == h.boundary.stats.batches == 3
    for call, r in zip(observer.calls, results, strict=True):
        assert call.size == len(r.items)
        assert call.queue_s == pytest.approx([q / 1000 for q in r.queue_ms])
        assert call.infer_s * 1000 == pytest.approx(r.infer_ms)
        assert call.failed_rows == len(r.row_errors)
        assert call.deadline_misses == r.deadline_misses == 0
        assert call.target_size == 4
    assert [c.failed_rows for c in observer.calls] == [1, 2, 0]
    assert sum(c.size for c in observer.calls) == h.boundary.stats.items == 12
    assert sum(c.failed_rows for c in observer.calls) == h.boundary.stats.failed_rows == 3


async def test_observer_reports_deadline_misses(harness: MakeHarness) -> None:
    """The observer gets each batch's deadline misses, the same count as the BatchResult."""
    clock = FakeClock(1_000.0)
    observer = RecordingObserver()

    def slow_by_30_ms(features: np.ndarray) -> np.ndarray:
        clock.now += 30 * MS
        return tenth_of_first(features)

    h = harness(slow_by_30_ms, max_batch_size=3, max_wait_ms=NEVER_MS, sla_ms=20.0, clock=clock,
                observer=observer)
    for i in range(3):
        await h.boundary.submit(row(i), i)
    await h.collector.wait_items(3)
    assert [(c.size, c.deadline_misses) for c in observer.calls] == [(3, 3)]
    assert h.collector.results[0].deadline_misses == 3


async def test_failing_observer_does_not_lose_the_batch(harness: MakeHarness) -> None:
    """If the observer (metrics) raises, the scored batch must not vanish silently.

    Either it is still delivered, or the failure surfaces through run() like a delivery failure; a batch
    that is neither delivered nor reported would never be produced, dead-lettered or retried.
    """

    class Broken:
        """An observer whose every call fails."""

        def on_batch(self, size: int, queue_s: Sequence[float], infer_s: float, failed_rows: int,
                     deadline_misses: int, target_size: int) -> None:
            raise RuntimeError("metrics backend down")

    unhandled: list[dict[str, object]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _loop, context: unhandled.append(context))
    h = harness(max_batch_size=2, max_wait_ms=NEVER_MS, clock=FakeClock(), observer=Broken())
    await h.submit(0)
    await h.submit(1)

    async def delivered_or_failed() -> None:
        while not h.collector.items and not h.task.done():
            await asyncio.sleep(0.001)

    try:
        await asyncio.wait_for(delivered_or_failed(), GUARD_S)
    except TimeoutError:
        pytest.fail("the batch was neither delivered nor reported by run() after the observer raised")
    if h.task.done():
        with pytest.raises(RuntimeError):
            h.task.result()
    else:
        assert h.collector.items == [0, 1]
    gc.collect()
    await asyncio.sleep(0)
    assert unhandled == []  # no "Task exception was never retrieved" either


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
        "failed_rows": 0,
        "deadline_misses": 0,
        "arrived_late": 0,
        "mean_batch_size": 0.0,
        "mean_queue_ms": 0.0,
        "mean_infer_ms": 0.0,
        "recent_mean_batch_size": 0.0,
        "recent_queue_ms_p50": 0.0,
        "recent_queue_ms_p99": 0.0,
    }


def test_stats_means() -> None:
    """Means are per item (queue) and per batch (size, inference); recent figures use the windows."""
    stats = BoundaryStats(
        batches=2,
        items=6,
        failed_rows=1,
        deadline_misses=2,
        queue_ms_total=12.0,
        infer_ms_total=3.0,
        recent_queue_ms=deque(float(v) for v in range(100, -1, -1)),  # 0..100 ms, unsorted
        recent_batch_sizes=deque([2, 4]),
    )
    assert stats.as_dict() == {
        "batches": 2,
        "items": 6,
        "failed_rows": 1,
        "deadline_misses": 2,
        "arrived_late": 0,
        "mean_batch_size": 3.0,
        "mean_queue_ms": 2.0,
        "mean_infer_ms": 1.5,
        "recent_mean_batch_size": 3.0,
        "recent_queue_ms_p50": 50.0,
        "recent_queue_ms_p99": 99.0,
    }


def test_stats_recent_windows_are_bounded() -> None:
    """The recent windows keep the newest entries only, so memory stays bounded."""
    stats = BoundaryStats()
    stats.recent_queue_ms.extend(float(v) for v in range(10_000))
    stats.recent_batch_sizes.extend(range(1_000))
    assert len(stats.recent_queue_ms) == 4096
    assert stats.recent_queue_ms[0] == 10_000 - 4096
    assert len(stats.recent_batch_sizes) == 256
    assert stats.as_dict()["recent_queue_ms_p99"] == pytest.approx(float(10_000 - 4096 + int(0.99 * 4096)))


async def test_stats_recent_windows_follow_batches(harness: MakeHarness) -> None:
    """After real batches the recent windows hold their sizes and per-item queue delays."""
    clock = FakeClock(1_000.0)
    h = harness(max_batch_size=3, max_wait_ms=NEVER_MS, clock=clock)
    await h.boundary.submit(row(0), 0)
    clock.now = 1_000.002
    await h.boundary.submit(row(1), 1)
    await h.boundary.submit(row(2), 2)
    await h.collector.wait_items(3)
    await h.submit(3)
    await h.boundary.flush()
    stats = h.boundary.stats
    assert list(stats.recent_batch_sizes) == [3, 1]
    assert list(stats.recent_queue_ms) == pytest.approx([2.0, 0.0, 0.0, 0.0])
    assert stats.as_dict()["recent_mean_batch_size"] == 2.0
    assert stats.as_dict()["recent_queue_ms_p99"] == pytest.approx(2.0)


async def test_a_handed_over_fetch_is_one_arrival_of_many_for_the_rate() -> None:
    """submit_many queues a fetch's rows together: 100 rows every 10 ms is 10,000/s, not "simultaneous"."""
    now = [0.0]
    boundary: ModelBoundary[int] = ModelBoundary(
        tenth_of_first, Collector(), max_batch_size=512, max_wait_ms=5, sla_ms=50, adaptive=True,
        clock=lambda: now[0])
    try:
        for step in range(5):
            now[0] = step * 0.010
            await boundary.submit_many([([float(i)], step * 100 + i) for i in range(100)])
        assert boundary.batcher.rate.rate() == pytest.approx(10_000)
        assert boundary.waiting == 500
    finally:
        boundary.close()
