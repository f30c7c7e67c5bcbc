"""Assignment epochs of one consumer: which fetched records may be handed over, and from where.

Pure bookkeeping (no Faust, no asyncio), driven by :class:`agents.ingest.BatchConsumer`:

* Faust revokes every partition at each rebalance (:meth:`AssignmentEpochs.revoke` starts a new
  epoch) and then seeks each assigned partition to its committed offset, once after the assignment
  and again at the end of a restore (:meth:`~AssignmentEpochs.seek_started` /
  :meth:`~AssignmentEpochs.seek_done`).
* A batch remembers the epoch it was fetched in; its acknowledgements count only in that epoch
  (:meth:`~AssignmentEpochs.accepts`): after a revocation the records are delivered again, here or at
  their next owner, and must not also become committable from the old batch.
* Records fetched in an epoch before its first seek may come from a position taken before the
  previous owner's last commit was visible: they are held (:meth:`~AssignmentEpochs.hold`) and
  released once the epoch is positioned (:meth:`~AssignmentEpochs.take_held`), de-duplicated and in
  offset order, to pass the read-offset filter like any others.
* Within an epoch a record is handed over once: a later seek back to the committed offset (the end of
  a restore) does not hand over again what was handed already (:meth:`~AssignmentEpochs.next_offset`).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any, Protocol, TypeVar

__all__ = ["AssignmentEpochs", "Offsetted"]


class Offsetted(Protocol):
    """A fetched record: all this module reads of it is its offset."""

    @property
    def offset(self) -> int: ...


P = TypeVar("P", bound=Hashable)  # a topic partition


class AssignmentEpochs:
    """The consumer's assignment epoch, whether it is positioned, its held and handed records."""

    def __init__(self) -> None:
        self.epoch = 0
        self._positioned_epoch = -1
        self._held: dict[Any, list[Any]] = {}
        self._held_epoch = 0
        self._handed: dict[Any, int] = {}  # per partition: the offset after the last record handed over
        self.stale_acks = 0

    def revoke(self) -> None:
        """Partitions were revoked: a new epoch starts, unpositioned; earlier batches are stale."""
        self.epoch += 1
        self._handed.clear()

    def seek_started(self) -> int:
        """A seek to the committed offsets starts; pass the result to :meth:`seek_done`."""
        return self.epoch

    def seek_done(self, started_in: int) -> None:
        """The seek started in epoch ``started_in`` is done: the epoch is positioned, unless revoked meanwhile."""
        if started_in == self.epoch:
            self._positioned_epoch = started_in

    @property
    def positioned(self) -> bool:
        """Whether the current epoch has been sought to its committed offsets."""
        return self._positioned_epoch == self.epoch

    def accepts(self, epoch: int) -> bool:
        """Whether acknowledgements of a batch fetched in ``epoch`` still count (counts those that do not)."""
        if epoch == self.epoch:
            return True
        self.stale_acks += 1
        return False

    def hold(self, partition: P, records: Sequence[Offsetted]) -> None:
        """Keep records fetched before the epoch was positioned, until it is."""
        if self._held_epoch != self.epoch:
            self._held, self._held_epoch = {}, self.epoch
        self._held.setdefault(partition, []).extend(records)

    @property
    def holding(self) -> bool:
        """Whether records are held."""
        return bool(self._held)

    def take_held(self) -> dict[Any, list[Any]]:
        """The held records of the current epoch, each offset once, in order (none if held in an earlier one)."""
        held, self._held = self._held, {}
        if self._held_epoch != self.epoch:
            return {}
        # The same records can have been fetched (and held) twice, around Faust's seeks.
        return {p: sorted({r.offset: r for r in records}.values(), key=lambda r: r.offset)
                for p, records in held.items()}

    def next_offset(self, partition: P, read_offset: int | None) -> int | None:
        """The next offset to hand over: the read offset, but never back before what was handed this epoch."""
        handed = self._handed.get(partition)
        if handed is not None and (read_offset is None or handed > read_offset):
            return handed
        return read_offset

    def handed(self, partition: P, next_offset: int) -> None:
        """Records of ``partition`` before ``next_offset`` were handed over in this epoch."""
        self._handed[partition] = next_offset
