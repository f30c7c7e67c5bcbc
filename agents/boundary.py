"""The model boundary: re-batch feature vectors and run the model on its own thread.

Producers ``await boundary.submit(features, item)``. One dispatch loop releases batches as the
:class:`~agents.batcher.Batcher` decides, runs each on a single dedicated inference thread (ONNX
Runtime releases the GIL, so the event loop keeps consuming), and hands each result to ``deliver`` in
dispatch order. While one batch runs, the next one fills; at most ``max_inflight_batches`` are
dispatched and not yet delivered. When ``max_batch_size * (max_inflight_batches + 1)`` items wait,
``submit`` blocks: consumption slows down instead of memory growing.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np

from agents.batcher import Batcher, Pending

__all__ = ["BatchResult", "BoundaryStats", "ModelBoundary"]

T = TypeVar("T")
Predict = Callable[[np.ndarray], np.ndarray]


@dataclass(frozen=True, slots=True)
class BatchResult(Generic[T]):
    """One batch's items with their scores (or the error that stopped inference)."""

    items: list[T]
    features: np.ndarray
    scores: np.ndarray | None
    queue_ms: list[float]
    infer_ms: float
    error: BaseException | None = None


@dataclass(slots=True)
class BoundaryStats:
    """Running totals for the web view, metrics and logs."""

    batches: int = 0
    items: int = 0
    failed_batches: int = 0
    queue_ms_total: float = 0.0
    infer_ms_total: float = 0.0

    def as_dict(self) -> dict[str, float | int]:
        return {
            "batches": self.batches,
            "items": self.items,
            "failed_batches": self.failed_batches,
            "mean_batch_size": self.items / self.batches if self.batches else 0.0,
            "mean_queue_ms": self.queue_ms_total / self.items if self.items else 0.0,
            "mean_infer_ms": self.infer_ms_total / self.batches if self.batches else 0.0,
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
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_inflight_batches < 1:
            raise ValueError(f"max_inflight_batches must be >= 1, got {max_inflight_batches}")
        self._predict = predict
        self._deliver = deliver
        self._clock = clock
        self._batcher: Batcher[tuple[Sequence[float], T]] = Batcher(max_batch_size, max_wait_ms / 1000)
        self._capacity = max_batch_size * (max_inflight_batches + 1)
        self._inflight = asyncio.Semaphore(max_inflight_batches)
        self._wakeup = asyncio.Event()
        self._space = asyncio.Event()
        self._tail: asyncio.Future[None] | None = None
        self._failure: BaseException | None = None
        self._flushing = 0
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="seam-inference")
        self.stats = BoundaryStats()

    @property
    def waiting(self) -> int:
        """Items queued and not yet dispatched."""
        return len(self._batcher)

    async def submit(self, features: Sequence[float], item: T) -> None:
        """Queue one feature vector; waits while the boundary is full."""
        while len(self._batcher) >= self._capacity:
            self._raise_failure()
            self._space.clear()
            await self._space.wait()
        self._raise_failure()
        self._batcher.add((features, item), self._clock())
        size = len(self._batcher)
        if size == 1 or size >= self._batcher.max_batch_size:
            self._wakeup.set()

    async def submit_many(self, items: Iterable[tuple[Sequence[float], T]]) -> None:
        """Queue feature vectors in order; waits whenever the boundary is full."""
        for features, item in items:
            await self.submit(features, item)

    async def run(self) -> None:
        """Dispatch batches until cancelled; raises if delivering a batch failed."""
        loop = asyncio.get_running_loop()
        while True:
            self._raise_failure()
            due = self._batcher.due_at()
            if due is not None and self._flushing:
                due = min(due, self._clock())
            if due is None or self._clock() < due:
                self._wakeup.clear()
                timeout = None if due is None else due - self._clock()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wakeup.wait(), timeout)
                continue
            await self._inflight.acquire()
            batch = self._batcher.take()
            self._space.set()
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
            while len(self._batcher):
                self._wakeup.set()
                await asyncio.sleep(0.001)
            await self.drain()
        finally:
            self._flushing -= 1

    def close(self) -> None:
        """Release the inference thread."""
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _infer(self, batch: list[Pending[tuple[Sequence[float], T]]]) -> tuple[np.ndarray, np.ndarray, float]:
        features = np.asarray([p.item[0] for p in batch], dtype=np.float32)
        started = time.perf_counter()
        scores = self._predict(features)
        return features, scores, (time.perf_counter() - started) * 1000

    async def _complete(
        self,
        batch: list[Pending[tuple[Sequence[float], T]]],
        dispatched: float,
        future: asyncio.Future[tuple[np.ndarray, np.ndarray, float]],
        previous: asyncio.Future[None] | None,
    ) -> None:
        error: BaseException | None = None
        try:
            features, scores, infer_ms = await future
        except Exception as exc:  # noqa: BLE001 - handed to deliver, which routes the rows
            features, scores, infer_ms, error = np.empty((0, 0), np.float32), None, 0.0, exc
        finally:
            self._inflight.release()
        if previous is not None:
            await asyncio.wait([previous])  # deliver in dispatch order
        queue_ms = [(dispatched - p.arrived) * 1000 for p in batch]
        result = BatchResult([p.item[1] for p in batch], features, scores, queue_ms, infer_ms, error)
        stats = self.stats
        stats.batches += 1
        stats.items += len(batch)
        stats.failed_batches += error is not None
        stats.queue_ms_total += sum(queue_ms)
        stats.infer_ms_total += infer_ms
        try:
            await self._deliver(result)
        except Exception as exc:  # noqa: BLE001 - surfaced by run() and submit()
            self._failure = exc
            self._wakeup.set()
            self._space.set()

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise RuntimeError("delivering a scored batch failed") from self._failure
