"""The acknowledgement ledger of batch-handled partitions: which offsets are done, and what may be committed.

Pure bookkeeping (no Faust, no asyncio), driven by :class:`agents.ingest.BatchConsumer`:

* a record is *done* once it is acknowledged (:meth:`AckLedger.ack`: every output delivered, its
  state written), and an offset the broker never returns (a transaction marker, a compacted record)
  once it is registered as a gap (:meth:`AckLedger.gap`);
* the committable offset of a partition is the first offset at or after its committed offset that is
  not done (:meth:`AckLedger.committable`): everything before it is done, nothing after it counts
  until it is. Acknowledgements arrive out of order (a dead letter is delivered before the prediction
  of an earlier record of its batch), so done offsets past the first missing one wait;
* a revocation forgets the partition (:meth:`AckLedger.forget`): its records are delivered again
  from the committed offset, here or at the next owner, and only those new deliveries count.

Faust's own ledger (``Consumer._new_offset``) lets a commit pass one missing offset: with offset 31
committed and 32 acknowledged, it commits 33 although 31 is not done, and a crash then would lose
31. This one never passes a missing offset. The committed offset itself stays Faust's (it moves when
a commit succeeds and when the consumer seeks); every call here is given it.
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Hashable, Iterable, Iterator
from typing import Generic, TypeVar

__all__ = ["AckLedger"]

P = TypeVar("P", bound=Hashable)  # a topic partition


class _PartitionLedger:
    __slots__ = ("start", "frontier", "done", "gaps")

    def __init__(self, frontier: int) -> None:
        self.start = frontier  # where the partition was started from (committed, or its first record)
        self.frontier = frontier  # the first offset not known to be done
        self.done: set[int] = set()  # done offsets past the frontier
        self.gaps: list[tuple[int, int]] = []  # (first, last) offset ranges past the frontier, by first

    def catch_up(self, committed: int | None) -> None:
        """Never behind the committed offset (a seek or another commit moved it on)."""
        if committed is not None and committed > self.frontier:
            self.frontier = committed
            self.done = {o for o in self.done if o >= committed}
        self.advance()

    def advance(self) -> None:
        frontier, done, gaps = self.frontier, self.done, self.gaps
        while True:
            if frontier in done:
                done.discard(frontier)
                frontier += 1
            elif gaps and gaps[0][0] <= frontier:
                frontier = max(frontier, gaps.pop(0)[1] + 1)
            else:
                break
        self.frontier = frontier


class AckLedger(Generic[P]):
    """Done offsets per partition, and the offset up to which all of them are done."""

    def __init__(self) -> None:
        self._partitions: dict[P, _PartitionLedger] = {}

    def _partition(self, tp: P, committed: int | None, first: int) -> _PartitionLedger:
        state = self._partitions.get(tp)
        if state is None:
            state = self._partitions[tp] = _PartitionLedger(first if committed is None else committed)
        return state

    def begin(self, tp: P, first: int, committed: int | None) -> None:
        """Records of ``tp`` are handed over from ``first`` on: with nothing committed, it starts there."""
        self._partition(tp, committed, first)

    def ack(self, tp: P, offsets: Iterable[int], committed: int | None) -> int:
        """Mark ``offsets`` of ``tp`` done; return how many were not done (nor committed) before."""
        offsets = list(offsets)
        if not offsets:
            return 0
        state = self._partition(tp, committed, min(offsets))
        state.catch_up(committed)
        frontier, done = state.frontier, state.done
        fresh = [o for o in offsets if o >= frontier and o not in done]
        done.update(fresh)
        state.advance()
        return len(fresh)

    def gap(self, tp: P, first: int, last: int, committed: int | None) -> None:
        """Offsets ``first`` to ``last`` (inclusive) will never be delivered: they count as done."""
        if last < first:
            return
        state = self._partition(tp, committed, first)
        insort(state.gaps, (first, last))
        state.catch_up(committed)

    def committable(self, tp: P, committed: int | None) -> int | None:
        """The offset to commit for ``tp`` (everything before it is done), or None if nothing new is."""
        state = self._partitions.get(tp)
        if state is None:
            return None
        state.catch_up(committed)
        floor = state.start if committed is None else committed
        return state.frontier if state.frontier > floor else None

    def forget(self, tps: Iterable[P]) -> None:
        """The partitions were revoked: what was done in them no longer counts."""
        for tp in tps:
            self._partitions.pop(tp, None)

    def __contains__(self, tp: object) -> bool:
        return tp in self._partitions

    def partitions(self) -> Iterator[P]:
        """The partitions with anything done."""
        return iter(list(self._partitions))
