"""Kafka plumbing shared by the benchmarks: topics, pre-loading inputs, reading outputs, dropping backlogs.

Output topics are created with ``message.timestamp.type=LogAppendTime``: every output record then carries
the time the broker appended it, whichever client produced it and whatever timestamp that client set
(Quix Streams, for one, gives an output the timestamp of its input). Latency is that time minus the input
record's timestamp, which the load generator sets when it sends the record; both clocks are this machine's.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Sequence

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.records_to_delete import RecordsToDelete

from app.topics import delete_topics
from tables.kafka import Connection, assign_all, client_options

__all__ = [
    "PARTITIONS", "OutputRecord", "delete_topics", "drop_backlog", "end_offsets", "output_span", "produce_inputs",
    "raw_passthrough", "read_range",
]

PARTITIONS = 8
Offsets = dict[int, int]
OutputRecord = tuple[int, bytes]  # (timestamp ms, value)


async def produce_inputs(bootstrap: str | Connection, topic: str, values: Sequence[tuple[bytes, bytes]]) -> None:
    """Send keyed records in order with the default partitioner; wait for every ack."""
    producer = AIOKafkaProducer(**client_options(bootstrap), acks="all", linger_ms=10, max_batch_size=512 * 1024)
    await producer.start()
    try:
        pending = []
        for key, value in values:
            pending.append(await producer.send(topic, value, key=key))
            if len(pending) >= 20_000:
                await asyncio.gather(*pending)
                pending.clear()
        await asyncio.gather(*pending)
    finally:
        await producer.stop()


async def output_span(bootstrap: str | Connection, topic: str, expected: int, timeout_s: float) -> tuple[int, float]:
    """Read ``topic`` until ``expected`` records; return (count, seconds from first to last timestamp)."""
    consumer = AIOKafkaConsumer(**client_options(bootstrap), enable_auto_commit=False, fetch_max_bytes=64 << 20)
    await consumer.start()
    count, first, last = 0, None, 0
    try:
        await assign_all(consumer, bootstrap, [topic], from_end=False)
        deadline = time.monotonic() + timeout_s
        while count < expected and time.monotonic() < deadline:
            for records in (await consumer.getmany(timeout_ms=500, max_records=50_000)).values():
                count += len(records)
                stamps = [r.timestamp for r in records]
                first = min(stamps) if first is None else min(first, *stamps)
                last = max(last, *stamps)
    finally:
        await consumer.stop()
    return count, max(1e-3, (last - (first or last)) / 1000)


async def raw_passthrough(bootstrap: str | Connection, source: str, sink: str, expected: int) -> None:
    """The ceiling: aiokafka only, with the same decode/produce/ack-after-delivery work as the pipelines."""
    consumer = AIOKafkaConsumer(source, **client_options(bootstrap), group_id=f"raw-{uuid.uuid4().hex[:6]}",
                                enable_auto_commit=False, auto_offset_reset="earliest", max_poll_records=2000)
    producer = AIOKafkaProducer(**client_options(bootstrap), acks="all", linger_ms=5)
    await consumer.start()
    await producer.start()
    done = 0
    try:
        while done < expected:
            batch = await consumer.getmany(timeout_ms=1000)
            futures = []
            for tp, records in batch.items():
                for r in records:
                    value = orjson.dumps({"p": tp.partition, "o": r.offset, "id": orjson.loads(r.value).get("id")})
                    futures.append(await producer.send(sink, value, key=r.key))
                done += len(records)
            await asyncio.gather(*futures)
            await consumer.commit()
    finally:
        await consumer.stop()
        await producer.stop()


async def end_offsets(bootstrap: str | Connection, topic: str, partitions: int = PARTITIONS) -> Offsets:
    """Each partition's end offset (where the next record goes)."""
    consumer = AIOKafkaConsumer(**client_options(bootstrap), enable_auto_commit=False)
    await consumer.start()
    try:
        ends = await consumer.end_offsets([TopicPartition(topic, p) for p in range(partitions)])
    finally:
        await consumer.stop()
    return {tp.partition: offset for tp, offset in ends.items()}


class OffsetWatch:
    """A long-lived client that answers "how many records are in this topic now" cheaply (progress)."""

    def __init__(self, bootstrap: str | Connection, topic: str, partitions: int = PARTITIONS) -> None:
        self._consumer = AIOKafkaConsumer(**client_options(bootstrap), enable_auto_commit=False)
        self._partitions = [TopicPartition(topic, p) for p in range(partitions)]

    async def __aenter__(self) -> OffsetWatch:
        await self._consumer.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._consumer.stop()

    async def offsets(self) -> Offsets:
        ends = await self._consumer.end_offsets(self._partitions)
        return {tp.partition: offset for tp, offset in ends.items()}

    async def total(self) -> int:
        return sum((await self.offsets()).values())


async def read_range(bootstrap: str | Connection, topic: str, start: Offsets, end: Offsets) -> list[OutputRecord]:
    """Read each partition's records in ``[start, end)``; return (timestamp, value) pairs."""
    wanted = {p: (start.get(p, 0), e) for p, e in end.items() if e > start.get(p, 0)}
    if not wanted:
        return []
    consumer = AIOKafkaConsumer(**client_options(bootstrap), enable_auto_commit=False, fetch_max_bytes=64 << 20,
                                max_partition_fetch_bytes=16 << 20)
    await consumer.start()
    out: list[OutputRecord] = []
    try:
        partitions = {p: TopicPartition(topic, p) for p in wanted}
        consumer.assign(list(partitions.values()))
        for p, tp in partitions.items():
            consumer.seek(tp, wanted[p][0])
        remaining = dict(wanted)
        while remaining:
            batch = await consumer.getmany(*[partitions[p] for p in remaining], timeout_ms=1000, max_records=50_000)
            if not batch:
                # Records below the log start were deleted (a dropped backlog): nothing more to read there.
                break
            for tp, records in batch.items():
                stop = remaining.get(tp.partition, (0, 0))[1]
                out += [(r.timestamp, r.value) for r in records if r.offset < stop]
                if records and records[-1].offset >= stop - 1:
                    remaining.pop(tp.partition, None)
    finally:
        await consumer.stop()
    return out


async def drop_backlog(bootstrap: str | Connection, topic: str, partitions: int = PARTITIONS) -> Offsets:
    """Delete every record now in ``topic`` (consumers behind jump to the new log start); return the ends."""
    ends = await end_offsets(bootstrap, topic, partitions)
    admin = AIOKafkaAdminClient(**client_options(bootstrap))
    await admin.start()
    try:
        await admin.delete_records({TopicPartition(topic, p): RecordsToDelete(o) for p, o in ends.items()},
                                   timeout_ms=30_000)
    finally:
        await admin.close()
    return ends
