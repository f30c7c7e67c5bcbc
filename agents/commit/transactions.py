"""Exactly-once processing: one Kafka transaction per input partition per commit.

With ``SEAM_PROCESSING_GUARANTEE=exactly_once`` every output of a record (prediction, dead letter,
late record), the changelog records of the state it changed, and its input offset are written in
one transaction of the producer that owns the record's input partition:

* **One transactional producer per input partition**, ``transactional.id = <group>-<topic>-<partition>``.
  The id follows the partition, not the worker: whoever owns a partition next initialises the same
  id, which fences a previous owner that is still running (a zombie after a missed rebalance) and
  aborts the transaction a killed owner left open. A new owner waits for the id before anything
  reads the partition's changelog end or committed offset (:meth:`PartitionTransactions.fence`): the
  broker grants it only once the previous owner's last transaction is complete.
* **A commit is a cut.** The consumer holds intake while it commits (see
  :class:`agents.ingest.BatchConsumer`), the model boundary is drained, the state cache's changes are
  staged here as changelog records, and then each open transaction gets its partition's offset and
  commits. No transaction ever holds an output whose record's offset it does not also commit.
* **Local state follows the commit.** Staged changelog records are written to the RocksDB store
  only after their transaction commits (together with the changelog offset, so a restart does not
  read them back again). After a crash the store therefore never holds state from an aborted
  transaction; whatever committed later is restored from the changelog.
* **Stale work is dropped.** A batch fetched before a rebalance may belong to another worker now;
  its outputs are discarded rather than written into a new transaction (the records are delivered
  again and their acknowledgements are dropped anyway, see :mod:`agents.ingest`).
* Any failure to begin, write or commit a transaction (fenced, timed out) stops the worker: its
  open transactions are aborted by the next owner and the records are processed again. A broker
  that goes away is not such a failure: the producers wait for it, retrying their requests, and
  their coordinator lookups too (:func:`tables.faust_compat.retry_coordinator_lookups`).
* **Restores end at markers:** a transactional changelog ends with a marker, never a record; see
  :mod:`agents.ingest.restore`.

Consumers of seam's outputs read them with ``isolation.level=read_committed``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.structs import OffsetAndMetadata
from faust.types import TP

from agents.delivery.outputs import OutputProducer
from agents.ingest.consumer import table_partition
from agents.ingest.records import RecordBatch
from tables.changelog import Write, encode, persist_offsets, send_many, store
from tables.faust_compat import retry_coordinator_lookups
from tables.kafka import Connection, client_options

__all__ = ["PartitionTransactions"]

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class _Transaction:
    producer: AIOKafkaProducer
    outputs: OutputProducer  # the producer's outputs, batched per topic partition and event-loop turn
    in_transaction: bool = False
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class PartitionTransactions:
    """The transactional producers of one worker's input partitions, and the commits across them."""

    def __init__(
        self,
        *,
        bootstrap: str | Connection,
        group_id: str,
        input_topic: str,
        current_epoch: Callable[[], int],
        transaction_timeout_ms: int = 30_000,
        linger_ms: int = 5,
        max_batch_size: int = 256 * 1024,
    ) -> None:
        self._bootstrap = bootstrap
        self._group_id = group_id
        self._input_topic = input_topic
        self._current_epoch = current_epoch
        self._producer_options = {
            "transaction_timeout_ms": transaction_timeout_ms,
            "linger_ms": linger_ms,
            "max_batch_size": max_batch_size,
        }
        self._partitions: dict[int, _Transaction] = {}
        self._opening: dict[int, asyncio.Future[_Transaction]] = {}
        self._staged: dict[int, list[Write]] = {}
        self.commits = 0
        self.dropped = 0

    def transactional_id(self, partition: int) -> str:
        """The transactional id of an input partition's producer (the same on every worker)."""
        return f"{self._group_id}-{self._input_topic}-{partition}"

    async def fence(self, partitions: set[int], timeout_s: float = 60.0) -> None:
        """Open the producers of ``partitions`` and wait until each holds its transactional id.

        The broker grants the id only once the previous owner's last transaction is complete: one it
        was committing has its markers written, one left open is aborted. Until then that owner's
        committed offsets and changelog records may not be visible yet (aiokafka reads committed
        offsets without ``require_stable``), and a new owner that read them early would process
        committed records again (repeated outputs) or end its restore before the last committed
        state (a key restored incompletely). A producer's start does not wait for the id; an
        empty transaction does (it completes without a request to the broker).
        """
        async def granted(partition: int) -> None:
            state = await self._producer(partition)
            async with state.lock:
                if not state.in_transaction:
                    await state.producer.begin_transaction()  # waits for the producer id
                    await state.producer.commit_transaction()

        await asyncio.wait_for(asyncio.gather(*(granted(p) for p in partitions)), timeout_s)

    async def _producer(self, partition: int) -> _Transaction:
        state = self._partitions.get(partition)
        if state is not None:
            return state
        opening = self._opening.get(partition)
        if opening is None:
            opening = self._opening[partition] = asyncio.ensure_future(self._start(partition))
        try:
            return await asyncio.shield(opening)
        finally:
            if opening.done():
                self._opening.pop(partition, None)

    async def _start(self, partition: int) -> _Transaction:
        producer = retry_coordinator_lookups(AIOKafkaProducer(
            **client_options(self._bootstrap), transactional_id=self.transactional_id(partition),
            enable_idempotence=True, acks="all", **self._producer_options))
        await producer.start()
        state = self._partitions[partition] = _Transaction(producer, OutputProducer(producer=producer))
        return state

    async def _begun(self, partition: int) -> _Transaction:
        state = await self._producer(partition)
        if not state.in_transaction:
            async with state.lock:
                if not state.in_transaction:
                    await state.producer.begin_transaction()
                    state.in_transaction = True
        return state

    async def send(self, batch: RecordBatch, topic: str, key: bytes | None, value: bytes) -> Awaitable[Any]:
        """Write an output of ``batch``'s records into its partition's transaction; return the delivery."""
        if batch.epoch != self._current_epoch():
            # Fetched before a rebalance: the records come again and these acks are dropped.
            self.dropped += 1
            done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            done.set_result(None)
            return done
        state = await self._begun(batch.partition)
        return await state.outputs.send(batch, topic, key, value)

    def stage(self, table: Any, partition: int, key: Any, value: Any) -> None:
        """Queue a table write of ``partition`` for its next transaction (written locally after it commits)."""
        self._staged.setdefault(partition, []).append(encode(table, partition, key, value))

    @property
    def staged(self) -> int:
        """Table writes waiting for their transaction."""
        return sum(len(writes) for writes in self._staged.values())

    async def commit(self, offsets: Mapping[TP, int]) -> bool:
        """Commit every open transaction with its partition's offset; then apply its state locally.

        With intake held and the boundary drained, every output and state change in a transaction
        belongs to an acknowledged record, so each open transaction has an offset to commit. One
        without is an inconsistency: it is aborted, and this raises (the worker stops).
        """
        by_partition = {tp.partition: offset for tp, offset in offsets.items() if tp.topic == self._input_topic}
        staged, self._staged = self._staged, {}
        orphans = sorted(p for p, s in self._partitions.items()
                         if (s.in_transaction or p in staged) and p not in by_partition)
        if orphans:
            for partition in orphans:
                if self._partitions[partition].in_transaction:
                    await self._partitions[partition].producer.abort_transaction()
                    self._partitions[partition].in_transaction = False
            detail = ", ".join(f"{p}: {len(staged.get(p, []))} table writes" for p in orphans)
            raise RuntimeError(f"transactions with outputs or table writes but no offset to commit ({detail}); "
                               f"committable offsets: {dict(by_partition)}")
        partitions = {p for p, s in self._partitions.items() if s.in_transaction} | set(staged) | set(by_partition)
        await asyncio.gather(*(
            self._commit_partition(p, by_partition.get(p), staged.get(p, [])) for p in sorted(partitions)))
        self.commits += 1
        return True

    async def _commit_partition(self, partition: int, offset: int | None, staged: list[Write]) -> None:
        state = await self._begun(partition)
        await state.outputs.flush()
        by_table: dict[Any, list[Write]] = {}
        for write in staged:
            by_table.setdefault(write[0], []).append(write)
        sent = await asyncio.gather(*(
            send_many(state.producer, table.changelog_topic.get_topic_name(), partition,
                      [(key, value) for _t, _p, key, value in writes]) for table, writes in by_table.items()))
        await state.producer.flush()  # every output and changelog record of the transaction is acknowledged
        staged = [write for writes in by_table.values() for write in writes]
        offsets = [offset for table_offsets in sent for offset in table_offsets]
        if offset is not None:
            await state.producer.send_offsets_to_transaction(
                {TopicPartition(self._input_topic, partition): OffsetAndMetadata(offset, "")}, self._group_id)
        await state.producer.commit_transaction()
        state.in_transaction = False
        store(staged, functools.partial(table_partition, self._input_topic))
        # The commit marker follows the transaction's last record in this (single-writer) changelog
        # partition: a restart resumes after it instead of waiting to read past it.
        persist_offsets(staged, offsets, offset_step=1)

    async def close(self) -> None:
        """Stop every producer (partitions were revoked; open transactions are aborted)."""
        partitions, self._partitions = self._partitions, {}
        self._staged = {}
        for partition, state in partitions.items():
            try:
                if state.in_transaction:
                    logger.warning("aborting the open transaction of partition %d (revoked)", partition)
                    await state.producer.abort_transaction()
            except Exception:  # the next owner's producer aborts it anyway (same transactional id)
                logger.exception("could not abort the transaction of partition %d", partition)
            finally:
                await state.producer.stop()
