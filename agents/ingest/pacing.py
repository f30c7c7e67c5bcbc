"""How long the broker may hold a fetch for records: short while the event loop has time to spare, longer as it fills.

Every fetch round costs the worker far more than its records: the consumer thread's fetch and its hand-over to
the event loop, one model batch and its trip to the inference thread and back, the outputs' produce requests and
their answers, the acknowledgements. A fetch waits up to ``SEAM_FETCH_MAX_WAIT_MS`` (10 ms) for new records, so
below a few tens of thousands of events a second a worker runs about a hundred rounds a second whatever its load:
at half of its saturation rate a third of a core went to rounds, and the loop had too little left to keep its
queue short (docs/BENCHMARKS.md). A longer wait makes rounds fewer and larger, but every record waits for it,
which only pays where the loop is busy: idle, a record should be fetched as soon as it comes.

:class:`FetchPacing` sets the wait from the event loop's own CPU share (its thread's CPU time against the wall
clock, averaged over about a second): ``idle_wait_ms`` up to a share of ``LOW``, ``busy_wait_ms`` from ``HIGH``,
in proportion between them. A longer wait lowers the share it is chosen from, so the wait settles where the
two meet. The bytes a fetch waits for grow in proportion to its wait, or they would end a longer wait first
(32 KiB come in about 13 ms at 17,000 events a second). Pure and clock-injected: the consumer's drain loop
feeds it each round and applies what it returns (:func:`tables.faust_compat.set_fetch_wait`).
"""

from __future__ import annotations

__all__ = ["FetchPacing"]

# The event loop's CPU share below which fetches wait the shortest (a loop at a quarter of the saturation rate
# of `make bench` runs at about half of its thread's time), and above which they wait the longest.
LOW = 0.5
HIGH = 0.8
HORIZON_S = 1.0  # the share is an exponentially weighted average over about this long
MIN_STEP_S = 0.05  # rounds closer together than this are measured together (a thread's CPU clock is coarse)


class FetchPacing:
    """The fetch wait for an event loop's CPU share (see the module docstring)."""

    def __init__(self, idle_wait_ms: int, busy_wait_ms: int, idle_min_bytes: int = 1) -> None:
        if idle_wait_ms < 0 or busy_wait_ms < idle_wait_ms:
            raise ValueError(f"need 0 <= idle wait <= busy wait, got {idle_wait_ms} and {busy_wait_ms} ms")
        if idle_min_bytes < 1:
            raise ValueError(f"need idle min bytes >= 1, got {idle_min_bytes}")
        self.idle_wait_ms, self.busy_wait_ms, self.idle_min_bytes = idle_wait_ms, busy_wait_ms, idle_min_bytes
        self.wait_ms = idle_wait_ms  # what the consumer starts with
        self.share = 0.0  # the loop's CPU share, averaged
        self._last: tuple[float, float] | None = None

    def observe(self, now: float, cpu_s: float) -> int | None:
        """The loop's thread has used ``cpu_s`` of CPU by ``now`` (seconds, any origin); return the fetch wait in ms
        if it changes, else None."""
        if self._last is None:
            self._last = (now, cpu_s)
            return None
        last_now, last_cpu = self._last
        elapsed = now - last_now
        if elapsed < MIN_STEP_S:
            return None
        self._last = (now, cpu_s)
        share = min(1.0, max(0.0, (cpu_s - last_cpu) / elapsed))
        self.share += min(1.0, elapsed / HORIZON_S) * (share - self.share)
        busy = min(1.0, max(0.0, (self.share - LOW) / (HIGH - LOW)))
        wait_ms = round(self.idle_wait_ms + (self.busy_wait_ms - self.idle_wait_ms) * busy)
        if wait_ms == self.wait_ms:
            return None
        self.wait_ms = wait_ms
        return wait_ms

    @property
    def min_bytes(self) -> int:
        """The bytes a fetch waits for at the current wait: ``idle_min_bytes`` scaled with the wait."""
        if self.idle_wait_ms == 0:
            return self.idle_min_bytes
        return self.idle_min_bytes * self.wait_ms // self.idle_wait_ms
