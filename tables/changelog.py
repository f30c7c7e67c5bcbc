"""Table writes in bulk: local RocksDB at once, changelog records sent together and awaited together.

A Faust table write queues its changelog record in Faust's producer buffer, which hands one record
to the Kafka client per event-loop turn; on a busy worker a flush of a few thousand card states then
takes seconds. :class:`ChangelogWriter` encodes each write exactly as Faust stores it and puts it
in the partition's RocksDB store at once (later reads see it, as with a Faust table write); on
:meth:`~ChangelogWriter.flush` it sends all changelog records straight to the producer (which
batches them), so a flush costs about one produce round trip. Once every record is acknowledged it
records the changelog offset in the store, as Faust does per record, so a restart reads only what
came after.

Exactly-once mode stages the same encoded writes in transactions instead (see
:mod:`agents.transactions`) and writes the stores only after the transaction commits.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from contextlib import AbstractContextManager
from typing import Any

from faust.types import TP

__all__ = ["ChangelogWriter", "Write", "encode", "persist_offsets", "store"]

# (table, partition, encoded key, encoded value)
Write = tuple[Any, int, bytes, bytes | None]
Send = Callable[[str, bytes, bytes | None, int], Awaitable[Awaitable[Any]]]
Scope = Callable[[int], AbstractContextManager[object]]


def encode(table: Any, partition: int, key: Any, value: Any) -> Write:
    """A table write encoded by the table's own store (the bytes its changelog and RocksDB hold)."""
    store = table.data
    return table, partition, store._encode_key(key), store._encode_value(value)


def store(write: Write, scope: Scope) -> None:
    """Put one encoded write into its partition's RocksDB store (no changelog record)."""
    table, partition, key, value = write
    with scope(partition):
        table.data._set(key, value)


def persist_offsets(writes: Iterable[Write], offsets: Iterable[int], *, offset_step: int = 0) -> None:
    """Record each (table, partition)'s last changelog offset in its store, as Faust does per write.

    ``offset_step`` is added to the recorded offset: a transaction's commit marker follows its last
    record, so a restart should resume after the marker.
    """
    last: dict[tuple[Any, int], int] = {}
    for (table, partition, _key, _value), offset in zip(writes, offsets, strict=True):
        last[(table, partition)] = max(last.get((table, partition), -1), offset)
    for (table, partition), offset in last.items():
        table.data.set_persisted_offset(TP(table.changelog_topic.get_topic_name(), partition), offset + offset_step)


class ChangelogWriter:
    """Collects table writes and writes them (store and changelog) in one go on :meth:`flush`."""

    def __init__(self, send: Send, scope: Scope) -> None:
        self._send = send
        self._scope = scope
        self._writes: list[Write] = []
        self.failed: BaseException | None = None

    def write(self, table: Any, partition: int, key: Any, value: Any) -> None:
        """Write ``key`` in ``partition`` of ``table`` to the store now, and queue its changelog record."""
        write = encode(table, partition, key, value)
        store(write, self._scope)
        self._writes.append(write)

    def __len__(self) -> int:
        return len(self._writes)

    async def flush(self) -> int:
        """Send every queued changelog record and wait until all are acknowledged; return how many.

        A failure is final: this and every later flush raise, so no offset that depends on the lost
        records is ever committed (the worker stops and the records are processed again).
        """
        if self.failed is not None:  # once lost, the changes are not in the changelog: never commit past them
            raise RuntimeError("an earlier changelog write failed") from self.failed
        writes, self._writes = self._writes, []
        if not writes:
            return 0
        # One table after the other, in the order of their first write, each acknowledged before the
        # next is sent: the state cache writes cards before watermarks, so a crash mid-flush can leave
        # a card newer than its watermark (which the cache repairs on load) but never the reverse,
        # which would route its redelivered events late.
        tables: dict[Any, list[Write]] = {}
        for write in writes:
            tables.setdefault(write[0], []).append(write)
        try:
            for group in tables.values():
                deliveries = [await self._send(table.changelog_topic.get_topic_name(), key, value, partition)
                              for table, partition, key, value in group]
                metadata = await asyncio.gather(*deliveries)
                persist_offsets(group, (m.offset for m in metadata))
        except BaseException as exc:
            self.failed = exc
            raise
        return len(writes)
