"""Kafka plumbing every layer shares: the default partitioner, filling record batches, whole-topic assignment.

It sits in the bottom layer (``tables/`` writes changelogs as well), so the outputs, the changelog
writer, the load generator, the web views and the benchmark all partition and batch records the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.partitioner import murmur2

__all__ = ["append", "assign_all", "partition_counts", "partition_of"]



class Batch(Protocol):
    """A record batch being filled (aiokafka's ``BatchBuilder``): ``append`` returns None once it is full."""

    def append(self, *, timestamp: int | None, key: bytes | None, value: bytes | None) -> object | None: ...


BatchT = TypeVar("BatchT", bound=Batch)


def partition_of(key: bytes, partitions: int) -> int:
    """The partition Kafka's default partitioner (Java's and aiokafka's) gives ``key``: murmur2, positive, modulo."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def append(batch: BatchT, new_batch: Callable[[], BatchT], key: bytes | None, value: bytes | None,
           timestamp: int | None = None) -> tuple[BatchT, BatchT | None]:
    """Append a record to ``batch`` or, once it is full, to a new one from ``new_batch``.

    Returns the batch now open and the full one to send (``None`` if there is none). A record that does
    not fit in an empty batch raises ``ValueError``.
    """
    if batch.append(key=key, value=value, timestamp=timestamp) is not None:
        return batch, None
    fresh = new_batch()
    if fresh.append(key=key, value=value, timestamp=timestamp) is None:
        raise ValueError(f"a record of {len(key or b'') + len(value or b'')} bytes does not fit in a batch")
    return fresh, batch


async def partition_counts(bootstrap: str, topics: list[str]) -> dict[str, int]:
    """Ask the cluster how many partitions each topic has; raises ``LookupError`` for a missing one."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        described = await admin.describe_topics(topics)
    finally:
        await admin.close()
    counts = {t["topic"]: len(t["partitions"]) for t in described if not t.get("error_code")}
    missing = [t for t in topics if t not in counts]
    if missing:
        raise LookupError(f"topics {missing} do not exist")
    return counts


async def assign_all(
    consumer: AIOKafkaConsumer, bootstrap: str, topics: list[str], *, from_end: bool,
) -> list[TopicPartition]:
    """Assign every partition of ``topics`` (which must exist) and seek to their start or end."""
    counts = await partition_counts(bootstrap, topics)
    partitions = [TopicPartition(t, p) for t in topics for p in range(counts[t])]
    consumer.assign(partitions)
    if from_end:
        await consumer.seek_to_end(*partitions)
        for tp in partitions:
            await consumer.position(tp)  # resolve the end now, not at the first fetch
    else:
        await consumer.seek_to_beginning(*partitions)
    return partitions
