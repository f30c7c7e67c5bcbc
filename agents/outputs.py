"""seam's producer of outputs (predictions, feature log, dead letters, late records), in batches.

Sending record by record through Faust's producer costs 14–16 µs per record here, and aiokafka keeps
one produce request in flight per broker connection, so outputs also queued behind whatever else
that producer carried. :class:`OutputProducer` is a producer of its own: :meth:`~OutputProducer.send`
appends a record to an open batch of its topic partition (partitioned like Kafka's default
partitioner: murmur2 of the key) and returns that batch's delivery future; every batch opened during
one event-loop turn is sent at the end of the turn, in the order the batches were opened, so the
records of one key keep their order. A batch that fills up is sent at once.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.partitioner import murmur2

from agents.ingest import RecordBatch

__all__ = ["OutputProducer"]


@dataclass(slots=True)
class _OpenBatch:
    topic: str
    partition: int
    builder: Any
    delivered: asyncio.Future[Any]


@dataclass(slots=True)
class _PartitionCache:
    """Key -> partition for one topic (card ids repeat: murmur2 in Python costs microseconds)."""

    count: int
    by_key: dict[bytes, int] = field(default_factory=dict)


class OutputProducer:
    """Gathers outputs per topic partition within an event-loop turn and sends each as one batch."""

    MAX_CACHED_KEYS = 200_000

    def __init__(self, bootstrap: str | None = None, *, producer: AIOKafkaProducer | None = None,
                 max_batch_size: int = 256 * 1024, linger_ms: int = 0) -> None:
        """A producer of its own on ``bootstrap``, or batches on ``producer`` (a transactional one, whose
        owner starts, stops and commits it)."""
        self._owned = producer is None
        if producer is None:
            producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True,
                                        max_batch_size=max_batch_size, linger_ms=linger_ms)
        self._producer = producer
        self._partitions: dict[str, _PartitionCache] = {}
        self._open: dict[tuple[str, int], _OpenBatch] = {}
        self._closed: list[_OpenBatch] = []
        self._scheduled = False
        self._sending = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        """Connect to the cluster."""
        await self._producer.start()

    async def flush(self) -> None:
        """Hand every open batch to the producer now (its delivery futures settle when it is acknowledged)."""
        self._schedule_now()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def stop(self) -> None:
        """Send what is open, wait for it, and disconnect (a producer of its own)."""
        await self.flush()
        if self._owned:
            await self._producer.stop()

    async def send(self, batch: RecordBatch | None, topic: str, key: bytes | None, value: bytes) -> asyncio.Future[Any]:
        """Add one record to its partition's open batch; return that batch's delivery future."""
        partition = await self._partition(topic, key)
        open_batch = self._open.get((topic, partition))
        if open_batch is None:
            open_batch = self._new_batch(topic, partition)
        if open_batch.builder.append(key=key, value=value, timestamp=None) is None:
            self._close(open_batch)  # full: sent at once, and a new one is opened
            open_batch = self._new_batch(topic, partition)
            if open_batch.builder.append(key=key, value=value, timestamp=None) is None:
                raise ValueError(f"an output record of {len(value)} bytes does not fit in a batch")
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
            partition = cache.by_key[key] = (murmur2(key) & 0x7FFFFFFF) % cache.count
        return partition

    def _new_batch(self, topic: str, partition: int) -> _OpenBatch:
        loop = asyncio.get_running_loop()
        open_batch = self._open[(topic, partition)] = _OpenBatch(
            topic, partition, self._producer.create_batch(), loop.create_future())
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._schedule_now)  # at the end of this turn: everything opened in it goes
        return open_batch

    def _close(self, open_batch: _OpenBatch) -> None:
        del self._open[(open_batch.topic, open_batch.partition)]
        self._closed.append(open_batch)
        self._start_sending()

    def _schedule_now(self) -> None:
        self._scheduled = False
        self._closed += self._open.values()
        self._open = {}
        self._start_sending()

    def _start_sending(self) -> None:
        if not self._closed:
            return
        batches, self._closed = self._closed, []
        task = asyncio.ensure_future(self._send_in_order(batches))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send_in_order(self, batches: list[_OpenBatch]) -> None:
        async with self._sending:  # FIFO: batches of one partition reach the accumulator in order
            for open_batch in batches:
                try:
                    sent = await self._producer.send_batch(open_batch.builder, open_batch.topic,
                                                           partition=open_batch.partition)
                except BaseException as exc:
                    if not open_batch.delivered.done():
                        open_batch.delivered.set_exception(exc)
                    continue
                sent.add_done_callback(lambda done, b=open_batch: _settle(b, done))


def _settle(open_batch: _OpenBatch, done: asyncio.Future[Any]) -> None:
    delivered = open_batch.delivered
    if delivered.done():
        return
    if done.cancelled():
        delivered.cancel()
    elif done.exception() is not None:
        delivered.set_exception(done.exception())  # type: ignore[arg-type]
    else:
        delivered.set_result(done.result())
