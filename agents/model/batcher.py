"""Batch assembly for the model boundary: size, age and deadline bounds, optionally adaptive.

Pure and clock-injected (every method takes ``now``); the asyncio driver is ``agents.model.boundary``.

Release rules, checked by :meth:`Batcher.due_at` / :meth:`Batcher.ready`:

1. **Size:** a batch of ``target_size()`` items is waiting (``max_batch_size`` when not adaptive).
2. **Age:** the oldest waiting item has waited ``max_wait_s`` (the age of the oldest item, not a
   periodic timer).
3. **Deadline:** each item must be scored within ``sla_s`` of its arrival, or by the deadline it
   brings (the boundary derives it from the input record's broker timestamp, so time spent before
   the boundary counts). The oldest item's deadline comes first, so the batch is released no later
   than ``oldest.deadline - t̂(n)``, where ``t̂(n)`` is the expected inference time of the batch that
   would be released.

Adaptive mode (on by default in a worker) chooses the size target from two online estimates:

* the inference time as a function of batch size, ``t̂(n) = a + b·n``, fitted by exponentially
  weighted least squares over recent batches (:class:`LatencyModel`);
* the arrival rate ``λ``, an exponentially weighted average of inter-arrival gaps
  (:class:`RateEstimator`); items added together (:meth:`Batcher.add_many`, a fetch's rows) are
  one observation of ``n`` arrivals over the time since the previous one.

Adaptive release is work-conserving:

* **Idle:** when the inference thread is idle, whatever is waiting goes out at once (the boundary counts
  the thread as busy while a fetch is being handed over in parts: ``ModelBoundary.holding``). Under low load
  every item finds the thread idle, so batches are small and queueing is near zero. Under high load
  items pile up while a batch runs and leave together when it finishes, so batches grow with load
  without any fixed wait.
* **Target:** while the thread is busy, a batch is also released (into the next in-flight slot) once
  ``target_size()`` items wait. Filling a batch of ``n`` items takes about ``(n - 1) / λ`` seconds,
  and the batch then runs for ``t̂(n)``. The target is the largest ``n <= max_batch_size`` with
  ``(n - 1) / λ + t̂(n) <= sla_s``.
* **SLA cap:** a released batch holds at most the largest ``n`` whose ``t̂(n)`` still fits in the
  oldest item's remaining budget; once that budget is spent (after a stall) batches are full again,
  to clear the backlog fastest.

The age and deadline rules bound every item's wait whatever the estimates say.

**Backlog:** an item that arrives already past its deadline (its input record waited before the
boundary, for example behind a backlog in the topic) cannot be saved by releasing it at once. While
the oldest item is such an item, a batch is released when it is full or when that item has waited
``max_wait_s``, in either mode: full batches clear the backlog fastest.

Items leave in arrival order, so predictions for one key leave in the order its events arrived.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["Batcher", "LatencyModel", "Pending", "RateEstimator"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Pending(Generic[T]):
    """An item waiting at the boundary, when it arrived and when it must be scored by."""

    item: T
    arrived: float
    deadline: float


class LatencyModel:
    """Online fit of inference seconds as ``a + b * batch_size`` (exponentially weighted)."""

    def __init__(self, decay: float = 0.95, prior_s: float = 0.001) -> None:
        if not 0 < decay < 1:
            raise ValueError("decay must be in (0, 1)")
        self.decay = decay
        self._prior_s = prior_s
        self._w = self._x = self._y = self._xx = self._xy = 0.0

    def observe(self, batch_size: int, seconds: float) -> None:
        """Record one batch's inference time."""
        d = self.decay
        self._w = d * self._w + 1.0
        self._x = d * self._x + batch_size
        self._y = d * self._y + seconds
        self._xx = d * self._xx + batch_size * batch_size
        self._xy = d * self._xy + batch_size * seconds

    def coefficients(self) -> tuple[float, float]:
        """``(a, b)``: fixed cost per call and cost per row, in seconds (never negative)."""
        if self._w == 0:
            return self._prior_s, 0.0
        mean_x, mean_y = self._x / self._w, self._y / self._w
        var_x = self._xx / self._w - mean_x * mean_x
        if var_x <= 1e-9:  # one batch size seen so far: attribute the time to the call
            return max(mean_y, 0.0), 0.0
        slope = max((self._xy / self._w - mean_x * mean_y) / var_x, 0.0)
        return max(mean_y - slope * mean_x, 0.0), slope

    def predict(self, batch_size: int) -> float:
        """Expected inference seconds for a batch of ``batch_size``."""
        a, b = self.coefficients()
        return a + b * batch_size


class RateEstimator:
    """Arrival rate (items per second) from exponentially weighted inter-arrival gaps."""

    def __init__(self, decay: float = 0.99) -> None:
        self.decay = decay
        self._gap: float | None = None
        self._last: float | None = None

    def observe(self, now: float, count: int = 1) -> None:
        """Record ``count`` arrivals at ``now``."""
        if self._last is not None and count > 0:
            gap = max(now - self._last, 0.0) / count
            self._gap = gap if self._gap is None else self.decay * self._gap + (1 - self.decay) * gap
        self._last = now

    def rate(self) -> float:
        """Items per second; 0 before two arrivals."""
        if self._gap is None:
            return 0.0
        return float("inf") if self._gap == 0 else 1.0 / self._gap


class Batcher(Generic[T]):
    """A FIFO of items that says when the next batch is due and hands it out."""

    def __init__(
        self,
        max_batch_size: int,
        max_wait_s: float,
        *,
        sla_s: float | None = None,
        adaptive: bool = False,
        latency: LatencyModel | None = None,
        rate: RateEstimator | None = None,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if max_wait_s < 0:
            raise ValueError(f"max_wait_s must be >= 0, got {max_wait_s}")
        if sla_s is not None and sla_s <= 0:
            raise ValueError(f"sla_s must be > 0, got {sla_s}")
        if adaptive and sla_s is None:
            raise ValueError("adaptive batching needs an SLA")
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_s
        self.sla_s = sla_s
        self.adaptive = adaptive
        self.latency = latency or LatencyModel()
        self.rate = rate or RateEstimator()
        self._queue: deque[Pending[T]] = deque()

    def __len__(self) -> int:
        return len(self._queue)

    def add(self, item: T, now: float, deadline: float | None = None) -> None:
        """Queue ``item``, arrived at ``now``, to be scored by ``deadline`` (default: ``now`` + the SLA)."""
        self.add_many((item,), now, None if deadline is None else (deadline,))

    def add_many(self, items: Sequence[T], now: float, deadlines: Sequence[float] | None = None) -> None:
        """Queue ``items``, all arrived at ``now``, each by its deadline (default: ``now`` + the SLA)."""
        if deadlines is None:
            default = now + self.sla_s if self.sla_s is not None else float("inf")
            self._queue.extend(Pending(item, now, default) for item in items)
        else:
            self._queue.extend(Pending(item, now, deadline) for item, deadline in zip(items, deadlines, strict=True))
        if self.adaptive:
            self.rate.observe(now, len(items))

    def target_size(self) -> int:
        """How many waiting items release a batch at once (see the module docstring)."""
        if not self.adaptive or self.sla_s is None:
            return self.max_batch_size
        rate = self.rate.rate()
        if rate <= 0:
            return 1
        # Largest n with (n - 1) * gap + a + b * n <= sla, solved for n.
        gap = 1.0 / rate
        a, b = self.latency.coefficients()
        if gap + b <= 0:
            return self.max_batch_size
        n = int((self.sla_s - a + gap) / (gap + b))
        return max(1, min(self.max_batch_size, n))

    def due_at(self, idle: bool = False) -> float | None:
        """When the next batch must be released at the latest, or ``None`` when empty.

        ``idle``: the inference thread has nothing to do (adaptive mode then releases at once).
        """
        if not self._queue:
            return None
        oldest = self._queue[0]
        if oldest.deadline <= oldest.arrived:
            # A backlog: the oldest item was late before it got here, and releasing it at once would
            # not save its deadline. Full batches (or the age bound) clear the backlog fastest.
            if len(self._queue) >= self.max_batch_size:
                return oldest.arrived
            return oldest.arrived + self.max_wait_s
        if (idle and self.adaptive) or len(self._queue) >= self.target_size():
            return oldest.arrived
        due = oldest.arrived + self.max_wait_s
        if self.sla_s is not None:
            size = min(len(self._queue), self.max_batch_size)
            due = min(due, oldest.deadline - self.latency.predict(size))
        return max(due, oldest.arrived)

    def ready(self, now: float, idle: bool = False) -> bool:
        """Say whether a batch should be released at ``now``."""
        due = self.due_at(idle)
        return due is not None and now >= due

    def take(self, now: float | None = None) -> list[Pending[T]]:
        """Remove and return the oldest items: at most ``max_batch_size``, and in adaptive mode (given
        ``now``) no more than the oldest item's remaining SLA budget can run."""
        count = min(len(self._queue), self.max_batch_size)
        if self.adaptive and now is not None and count > 1:
            count = min(count, self._sla_cap(self._queue[0].deadline - now))
        return [self._queue.popleft() for _ in range(count)]

    def _sla_cap(self, budget_s: float) -> int:
        a, b = self.latency.coefficients()
        if b <= 0 or budget_s < a + b:
            # Nothing to protect (or the oldest item will be late anyway): the largest batch clears
            # the backlog fastest, so a stall does not leave the boundary running single rows.
            return self.max_batch_size
        return max(1, int((budget_s - a) / b))

    def observe_inference(self, batch_size: int, seconds: float) -> None:
        """Feed one batch's measured inference time to the latency model."""
        self.latency.observe(batch_size, seconds)
