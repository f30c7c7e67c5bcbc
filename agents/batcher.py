"""Batch assembly for the model boundary: size and age bounds, pure and clock-injected.

A batch is released when it holds ``max_batch_size`` items, or when its oldest item has waited
``max_wait_s`` (the age of the oldest item, not a periodic timer). Items leave in arrival order, so
predictions for one card leave in the order its events arrived.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["Batcher", "Pending"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Pending(Generic[T]):
    """An item waiting at the boundary and the time it arrived there."""

    item: T
    arrived: float


class Batcher(Generic[T]):
    """A FIFO of items that says when the next batch is due and hands it out."""

    def __init__(self, max_batch_size: int, max_wait_s: float) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if max_wait_s < 0:
            raise ValueError(f"max_wait_s must be >= 0, got {max_wait_s}")
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_s
        self._queue: deque[Pending[T]] = deque()

    def __len__(self) -> int:
        return len(self._queue)

    def add(self, item: T, now: float) -> None:
        """Queue ``item``, arrived at ``now``."""
        self._queue.append(Pending(item, now))

    def due_at(self) -> float | None:
        """When the next batch must be released at the latest, or ``None`` when empty."""
        if not self._queue:
            return None
        if len(self._queue) >= self.max_batch_size:
            return self._queue[0].arrived
        return self._queue[0].arrived + self.max_wait_s

    def ready(self, now: float) -> bool:
        """Say whether a batch should be released at ``now``."""
        due = self.due_at()
        return due is not None and now >= due

    def take(self) -> list[Pending[T]]:
        """Remove and return the oldest items, at most ``max_batch_size`` of them."""
        count = min(len(self._queue), self.max_batch_size)
        return [self._queue.popleft() for _ in range(count)]
