"""seam's producer of outputs (predictions, feature log, dead letters, late records), in batches.

Sending record by record through Faust's producer costs 14–16 µs per record here, and aiokafka keeps
one produce request in flight per broker connection. :class:`OutputProducer` is a producer of its own:
:meth:`~OutputProducer.send` appends a record to the open batch of its topic partition (partitioned
like Kafka's default partitioner: murmur2 of the key) and returns that batch's delivery future.

Each topic partition has at most one batch on its way to the broker. A partition with none on its
way hands its open batch to the producer at the end of the event-loop turn that opened it; a
partition whose batch is still on its way keeps appending to its open batch, which goes as soon as
the one before it is acknowledged. So batches grow with the load and the broker's round trip, and a
produce request carries one batch per partition: a burst of outputs never queues up as many small
batches, each waiting for a request of its own. Records of one partition keep their order.
"""

from __future__ import annotations

import asyncio
import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaProducer

from tables.kafka import Connection, append, client_options, partition_of

__all__ = ["OutputProducer"]


@dataclass(slots=True)
class _Batch:
    builder: Any
    delivered: asyncio.Future[Any]


@dataclass(slots=True)
class _PartitionBatches:
    """One topic partition's batches: the open one, full ones waiting, the one on its way."""

    topic: str
    partition: int
    open: _Batch | None = None
    full: deque[_Batch] = field(default_factory=deque)
    on_its_way: _Batch | None = None

    def batches(self) -> list[_Batch]:
        return [b for b in (self.on_its_way, *self.full, self.open) if b is not None]


@dataclass(slots=True)
class _PartitionCache:
    """Key -> partition for one topic (key ids repeat: the partitioner in Python costs microseconds)."""

    count: int
    by_key: dict[bytes, int] = field(default_factory=dict)


class OutputProducer:
    """Batches outputs per topic partition, with at most one batch per partition on its way at a time."""

    MAX_CACHED_KEYS = 200_000

    def __init__(self, bootstrap: str | Connection | None = None, *, producer: AIOKafkaProducer | None = None,
                 max_batch_size: int = 256 * 1024, linger_ms: int = 0) -> None:
        """A producer of its own on ``bootstrap``, or batches on ``producer`` (a transactional one, whose
        owner starts, stops and commits it)."""
        self._owned = producer is None
        if producer is None:
            if bootstrap is None:
                raise ValueError("an output producer needs a cluster to connect to, or a producer to batch on")
            producer = AIOKafkaProducer(**client_options(bootstrap), acks="all", enable_idempotence=True,
                                        max_batch_size=max_batch_size, linger_ms=linger_ms)
        self._producer = producer
        self._partitions: dict[str, _PartitionCache] = {}
        self._batches: dict[tuple[str, int], _PartitionBatches] = {}
        self._ready: list[_PartitionBatches] = []  # partitions with nothing on its way and something to send
        self._scheduled = False
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        """Connect to the cluster."""
        await self._producer.start()

    async def flush(self) -> None:
        """Send every record handed in so far; return once each is acknowledged (or failed)."""
        pending = [batch.delivered for state in self._batches.values() for batch in state.batches()]
        self._hand_over()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)

    async def stop(self) -> None:
        """Send what is open, wait for it, and disconnect (a producer of its own)."""
        await self.flush()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._owned:
            await self._producer.stop()

    async def send(self, batch: object, topic: str, key: bytes | None, value: bytes) -> asyncio.Future[Any]:
        """Add one record to its partition's open batch; return that batch's delivery future."""
        partition = await self._partition(topic, key)
        state = self._batches.get((topic, partition))
        if state is None:
            state = self._batches[(topic, partition)] = _PartitionBatches(topic, partition)
        open_batch = state.open
        if open_batch is None:
            open_batch = state.open = self._new_batch()
            if state.on_its_way is None:
                self._make_ready(state)
        builder, full = append(open_batch.builder, self._producer.create_batch, key, value)
        if full is not None:  # full: it goes next, and the new one is open
            state.full.append(open_batch)
            open_batch = state.open = _Batch(builder, asyncio.get_running_loop().create_future())
        return open_batch.delivered

    async def _partition(self, topic: str, key: bytes | None) -> int:
        cache = self._partitions.get(topic)
        if cache is None:
            partitions = await self._producer.partitions_for(topic)
            cache = self._partitions[topic] = _PartitionCache(len(partitions))
        if key is None:
            return random.randrange(cache.count)
        partition = cache.by_key.get(key)
        if partition is None:
            if len(cache.by_key) >= self.MAX_CACHED_KEYS:
                cache.by_key.clear()
            partition = cache.by_key[key] = partition_of(key, cache.count)
        return partition

    def _new_batch(self) -> _Batch:
        return _Batch(self._producer.create_batch(), asyncio.get_running_loop().create_future())

    def _make_ready(self, state: _PartitionBatches) -> None:
        self._ready.append(state)
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._hand_over)  # at the end of this turn

    def _hand_over(self) -> None:
        """Give each ready partition's next batch to the producer."""
        self._scheduled = False
        ready, self._ready = self._ready, []
        for state in ready:
            if state.on_its_way is not None:
                continue
            if state.full:
                batch = state.full.popleft()
            elif state.open is not None:
                batch, state.open = state.open, None
            else:
                continue
            state.on_its_way = batch
            task = asyncio.ensure_future(self._send(state, batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _send(self, state: _PartitionBatches, batch: _Batch) -> None:
        try:
            sent = await self._producer.send_batch(batch.builder, state.topic, partition=state.partition)
        except BaseException as exc:
            self._done(state, batch)
            if not batch.delivered.done():
                batch.delivered.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        sent.add_done_callback(lambda done: self._acknowledged(state, batch, done))

    def _acknowledged(self, state: _PartitionBatches, batch: _Batch, done: asyncio.Future[Any]) -> None:
        _settle(batch, done)
        self._done(state, batch)

    def _done(self, state: _PartitionBatches, batch: _Batch) -> None:
        if state.on_its_way is batch:
            state.on_its_way = None
        if state.full or state.open is not None:
            self._make_ready(state)


def _settle(batch: _Batch, done: asyncio.Future[Any]) -> None:
    delivered = batch.delivered
    if delivered.done():
        return
    if done.cancelled():
        delivered.cancel()
    elif done.exception() is not None:
        delivered.set_exception(done.exception())  # type: ignore[arg-type]
    else:
        delivered.set_result(done.result())
