"""The model boundary: re-batch feature vectors and run the model on its own thread.

Producers ``await boundary.submit(features, item)``. One dispatch loop releases batches as the
:class:`~agents.model.batcher.Batcher` decides (size, age, deadline; adaptive size target), runs each on a
single dedicated inference thread (ONNX Runtime releases the GIL, so the event loop keeps
consuming), and hands each result to ``deliver`` in dispatch order. While one batch runs, the next
one fills; at most ``max_inflight_batches`` are dispatched and not yet delivered. When
``max_batch_size * (max_inflight_batches + 1)`` items wait, ``submit`` blocks: consumption slows
down instead of memory growing.

If a batch's inference raises, the batch is bisected on the inference thread until the rows that
fail on their own are isolated: every other row still gets its score, and the failing rows come back
in ``BatchResult.row_errors`` for the caller to dead-letter.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

import numpy as np

from agents.model.batcher import Batcher, Pending

__all__ = ["BatchObserver", "BatchResult", "BoundaryStats", "ModelBoundary"]

logger = logging.getLogger(__name__)

T = TypeVar("T")
Predict = Callable[[np.ndarray], np.ndarray]


@dataclass(frozen=True, slots=True)
class BatchResult(Generic[T]):
    """One batch's items and scores; rows whose inference failed are in ``row_errors`` (index -> error)."""

    items: list[T]
    features: np.ndarray
    scores: np.ndarray
    queue_ms: list[float]
    infer_ms: float
    row_errors: dict[int, str] = field(default_factory=dict)
    deadline_misses: int = 0
    arrived_late: int = 0  # of the misses: items already past their deadline when they reached the boundary


class BatchObserver(Protocol):
    """Receives every completed batch (metrics)."""

    def on_batch(self, size: int, queue_s: Sequence[float], infer_s: float, failed_rows: int,
                 deadline_misses: int, target_size: int, arrived_late: int = 0) -> None: ...


@dataclass(slots=True)
class BoundaryStats:
    """Running totals and recent queue delays, for the web views and logs."""

    batches: int = 0
    items: int = 0
    failed_rows: int = 0
    deadline_misses: int = 0
    arrived_late: int = 0
    queue_ms_total: float = 0.0
    infer_ms_total: float = 0.0
    recent_queue_ms: deque[float] = field(default_factory=lambda: deque(maxlen=4096))
    recent_batch_sizes: deque[int] = field(default_factory=lambda: deque(maxlen=256))

    def as_dict(self) -> dict[str, float | int]:
        recent = sorted(self.recent_queue_ms)

        def pct(q: float) -> float:
            return recent[min(len(recent) - 1, int(q * len(recent)))] if recent else 0.0

        sizes = self.recent_batch_sizes
        return {
            "batches": self.batches,
            "items": self.items,
            "failed_rows": self.failed_rows,
            "deadline_misses": self.deadline_misses,
            "arrived_late": self.arrived_late,
            "mean_batch_size": self.items / self.batches if self.batches else 0.0,
            "mean_queue_ms": self.queue_ms_total / self.items if self.items else 0.0,
            "mean_infer_ms": self.infer_ms_total / self.batches if self.batches else 0.0,
            "recent_mean_batch_size": sum(sizes) / len(sizes) if sizes else 0.0,
            "recent_queue_ms_p50": pct(0.50),
            "recent_queue_ms_p99": pct(0.99),
        }


class ModelBoundary(Generic[T]):
    """Size- and age-bounded batching in front of a blocking ``predict``, off the event loop."""

    def __init__(
        self,
        predict: Predict,
        deliver: Callable[[BatchResult[T]], Awaitable[None]],
        *,
        max_batch_size: int,
        max_wait_ms: float,
        max_inflight_batches: int = 2,
        sla_ms: float | None = None,
        adaptive: bool = False,
        observer: BatchObserver | None = None,
        clock: Callable[[], float] = time.monotonic,
        age_of: Callable[[T], float] | None = None,
    ) -> None:
        if max_inflight_batches < 1:
            raise ValueError(f"max_inflight_batches must be >= 1, got {max_inflight_batches}")
        self._predict = predict
        self._deliver = deliver
        self._clock = clock
        # How old an item already is when it arrives (seconds): its deadline is its age short of the SLA.
        self._age_of = age_of
        self._observer = observer
        self.batcher: Batcher[tuple[Sequence[float], T]] = Batcher(
            max_batch_size, max_wait_ms / 1000, sla_s=None if sla_ms is None else sla_ms / 1000, adaptive=adaptive)
        self._capacity = max_batch_size * (max_inflight_batches + 1)
        self._inflight = asyncio.Semaphore(max_inflight_batches)
        self._wakeup = asyncio.Event()
        self._space = asyncio.Event()
        self._tail: asyncio.Future[None] | None = None
        self._failure: BaseException | None = None
        self._flushing = 0
        self._held = 0  # hand-overs in progress (see holding())
        self._running = 0  # batches dispatched whose inference has not finished
        self._sleep_until = float("inf")  # when the dispatch loop will look again unless woken
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="seam-inference")
        self.stats = BoundaryStats()

    @property
    def waiting(self) -> int:
        """Items queued and not yet dispatched."""
        return len(self.batcher)

    async def submit(self, features: Sequence[float], item: T) -> None:
        """Queue one feature vector; waits while the boundary is full."""
        await self.submit_many(((features, item),))

    async def submit_many(self, items: Sequence[tuple[Sequence[float], T]]) -> None:
        """Queue feature vectors in order; waits whenever the boundary is full.

        As many as fit go in at once: one arrival-rate observation and one release decision for all
        of them (a fetch hands over a few dozen to hundreds at a time).
        """
        start, batcher = 0, self.batcher
        while start < len(items):
            while len(batcher) >= self._capacity:
                self._raise_failure()
                self._space.clear()
                await self._space.wait()
            self._raise_failure()
            end = min(len(items), start + self._capacity - len(batcher))
            self._add(items[start:end])
            start = end

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        """While held (a fetch being handed over in parts), an idle inference thread does not take what waits
        at once: the parts leave together when the hand-over ends, unless the size, age or deadline bound
        releases them sooner. Each batch costs the event loop far more than its inference (a thread hand-off
        each way, its outputs' produce requests and their acknowledgements), so a fetch is one batch, not a
        batch per part."""
        self._held += 1
        try:
            yield
        finally:
            self._held -= 1
            if not self._held:
                self._wakeup.set()

    def offer_many(self, items: Sequence[tuple[Sequence[float], T]]) -> int:
        """Queue as many of ``items`` as fit now, never waiting; return how many were taken (the first ones).

        For work that must not slow its caller down (a shadow model): what does not fit is the
        caller's to drop and count.
        """
        if self._failure is not None:
            return 0
        room = max(0, self._capacity - len(self.batcher))
        taken = items if len(items) <= room else items[:room]
        if taken:
            self._add(taken)
        return len(taken)

    def _add(self, items: Sequence[tuple[Sequence[float], T]]) -> None:
        batcher = self.batcher
        was_empty = not len(batcher)
        now = self._clock()
        if self._age_of is not None and batcher.sla_s is not None:
            age_of, sla_s = self._age_of, batcher.sla_s
            batcher.add_many(items, now, [now + sla_s - age_of(item) for _features, item in items])
        else:
            batcher.add_many(items, now)
        if was_empty or len(batcher) >= batcher.target_size():
            self._wakeup.set()
        elif batcher.sla_s is not None:
            # A bigger batch takes longer to run, so its deadline release moves earlier.
            due = batcher.due_at(idle=self._idle())
            if due is not None and due < self._sleep_until:
                self._wakeup.set()

    async def run(self) -> None:
        """Dispatch batches until cancelled; raises if delivering a batch failed."""
        loop = asyncio.get_running_loop()
        while True:
            self._raise_failure()
            due = self.batcher.due_at(idle=self._idle())
            if due is not None and self._flushing:
                due = min(due, self._clock())
            if due is None or self._clock() < due:
                self._wakeup.clear()
                self._sleep_until = float("inf") if due is None else due
                timeout = None if due is None else due - self._clock()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wakeup.wait(), timeout)
                self._sleep_until = float("inf")
                continue
            await self._inflight.acquire()
            batch = self.batcher.take(self._clock())
            self._space.set()
            self._running += 1
            dispatched = self._clock()
            future = loop.run_in_executor(self._executor, self._infer, batch)
            self._tail = asyncio.ensure_future(self._complete(batch, dispatched, future, self._tail))

    async def drain(self) -> None:
        """Wait until every dispatched batch has been delivered."""
        if self._tail is not None:
            await asyncio.wait([self._tail])

    async def flush(self) -> None:
        """Release everything waiting now, regardless of the bounds, and wait until it is delivered."""
        self._flushing += 1
        try:
            while len(self.batcher):
                self._wakeup.set()
                await asyncio.sleep(0.001)
            await self.drain()
        finally:
            self._flushing -= 1

    def close(self) -> None:
        """Release the inference thread."""
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _infer(
        self, batch: list[Pending[tuple[Sequence[float], T]]],
    ) -> tuple[np.ndarray, np.ndarray, dict[int, str], float]:
        """Run on the inference thread: score the batch, bisecting around rows that make it fail."""
        features = np.asarray([p.item[0] for p in batch], dtype=np.float32)
        started = time.perf_counter()
        try:
            scores = self._predict(features)
            errors: dict[int, str] = {}
        except Exception as exc:  # noqa: BLE001 - isolated below, rows are dead-lettered
            scores, errors = self._bisect(features, exc)
        return features, scores, errors, time.perf_counter() - started

    def _bisect(self, features: np.ndarray, error: Exception) -> tuple[np.ndarray, dict[int, str]]:
        scores = np.full(len(features), np.nan, dtype=np.float32)
        errors: dict[int, str] = {}
        failing = [(0, len(features), error)]
        while failing:
            lo, hi, exc = failing.pop()
            if hi - lo == 1:
                errors[lo] = f"{type(exc).__name__}: {exc}"
                continue
            mid = (lo + hi) // 2
            for a, b in ((lo, mid), (mid, hi)):
                try:
                    scores[a:b] = self._predict(features[a:b])
                except Exception as part_exc:  # noqa: BLE001
                    failing.append((a, b, part_exc))
        return scores, errors

    async def _complete(
        self,
        batch: list[Pending[tuple[Sequence[float], T]]],
        dispatched: float,
        future: asyncio.Future[tuple[np.ndarray, np.ndarray, dict[int, str], float]],
        previous: asyncio.Future[None] | None,
    ) -> None:
        try:
            features, scores, row_errors, infer_s = await future
        except Exception as exc:  # noqa: BLE001 - the thread itself failed: every row is an error
            features, scores, infer_s = np.empty((0, 0), np.float32), np.full(len(batch), np.nan, np.float32), 0.0
            row_errors = {i: f"{type(exc).__name__}: {exc}" for i in range(len(batch))}
        finally:
            self._running -= 1
            self._wakeup.set()  # the thread may be idle now: adaptive release re-evaluates
        try:
            await self._finish(batch, dispatched, previous, features, scores, row_errors, infer_s)
        finally:
            # The slot is free only once the batch is handed over (the pipeline sends its outputs and
            # acknowledges them when the broker has them): a stuck delivery stops dispatching,
            # and with it submit(), instead of piling up scored batches.
            self._inflight.release()

    async def _finish(
        self,
        batch: list[Pending[tuple[Sequence[float], T]]],
        dispatched: float,
        previous: asyncio.Future[None] | None,
        features: np.ndarray,
        scores: np.ndarray,
        row_errors: dict[int, str],
        infer_s: float,
    ) -> None:
        if not row_errors:
            self.batcher.observe_inference(len(batch), infer_s)
        if previous is not None:
            await asyncio.wait([previous])  # deliver in dispatch order
        done = self._clock()
        queue_s = [dispatched - p.arrived for p in batch]
        misses = sum(done > p.deadline for p in batch)
        arrived_late = sum(p.deadline <= p.arrived for p in batch)
        result = BatchResult([p.item[1] for p in batch], features, scores, [q * 1000 for q in queue_s],
                             infer_s * 1000, row_errors, misses, arrived_late)
        stats = self.stats
        stats.batches += 1
        stats.items += len(batch)
        stats.failed_rows += len(row_errors)
        stats.deadline_misses += misses
        stats.arrived_late += arrived_late
        stats.queue_ms_total += sum(result.queue_ms)
        stats.infer_ms_total += result.infer_ms
        stats.recent_queue_ms.extend(result.queue_ms)
        stats.recent_batch_sizes.append(len(batch))
        if self._observer is not None:
            try:
                self._observer.on_batch(len(batch), queue_s, infer_s, len(row_errors), misses,
                                        self.batcher.target_size(), arrived_late)
            except Exception:  # metrics must never cost a batch
                logger.exception("batch observer failed")
        try:
            await self._deliver(result)
        except Exception as exc:  # noqa: BLE001 - surfaced by run() and submit()
            self._failure = exc
            self._wakeup.set()
            self._space.set()

    def _idle(self) -> bool:
        """Whether adaptive release may take what waits at once: the thread has nothing and no hand-over is
        in progress."""
        return self._running == 0 and not self._held

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise RuntimeError("delivering a scored batch failed") from self._failure
