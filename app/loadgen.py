"""An open-loop load generator: a synthetic stream's records at a fixed rate, keyed by their spec's key field.

Open loop means records are sent on a fixed schedule (``rate`` per second from the start), whether
or not the pipeline keeps up, so measured latency includes queueing as a real source would cause it.
Records are partitioned as Kafka's default partitioner does (murmur2 of the key).

The generator shares the machine with what it measures. Drawing and encoding a record costs about as much
as sending it, so a benchmark can have every record of a run drawn and encoded before the schedule starts
(``prepare=True``): the timed loop then only batches and sends them.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson
from aiokafka import AIOKafkaProducer

from app.topics import ensure_topics
from tables.kafka import Connection, append, client_options, partition_of

__all__ = ["ProduceReport", "produce"]

# The schedule is kept in steps of at least this long: each step's records go out as one batch per
# partition (``send_batch``: ~4 µs per record here, against 14-16 µs for a per-record ``send``), so the
# generator takes less of the CPU it shares with the system it measures.
TICK_S = 0.002


@dataclass(frozen=True, slots=True)
class ProduceReport:
    """What a run sent."""

    sent: int
    positive: int  # the records the generator labelled positive (fraud bursts, device faults)
    elapsed_s: float
    cpu_s: float = 0.0  # this process's CPU time (every thread) while the schedule ran, preparing not counted

    @property
    def rate(self) -> float:
        return self.sent / self.elapsed_s if self.elapsed_s else 0.0


# A record ready to send: (record, labelled positive, Kafka key, value).
Ready = tuple[dict[str, Any], bool, bytes, bytes]


def _ready(generator: Iterable[tuple[dict[str, Any], bool]], key_field: str,
           encode: Callable[[dict[str, Any]], bytes]) -> Iterator[Ready]:
    for tx, is_positive in generator:
        yield tx, is_positive, tx[key_field].encode(), encode(tx)


async def produce(
    bootstrap: str | Connection,
    topic: str,
    *,
    rate: float,
    duration_s: float,
    generator: Iterator[tuple[dict[str, Any], bool]],
    key_field: str = "card_id",
    partitions: int = 8,
    on_progress: Callable[[int, int], None] | None = None,
    on_sent: Callable[[dict[str, Any], int], None] | None = None,
    on_acked: Callable[[list[dict[str, Any]], int], None] | None = None,
    stop: Callable[[], bool] | None = None,
    encode: Callable[[dict[str, Any]], bytes] = orjson.dumps,
    prepare: bool = False,
) -> ProduceReport:
    """Send ``rate`` records per second for ``duration_s`` seconds (or until ``stop()`` is true, checked
    every tick); wait for every ack. Each record's Kafka key is its ``key_field`` (the spec's key).

    ``encode`` turns a record into its value (JSON by default; an :class:`agents.formats.avro.AvroWriter` for
    Avro). Each record's Kafka timestamp is the wall-clock time (epoch ms) at which it was handed to the
    producer; ``on_sent(record, timestamp_ms)`` is told it (the benchmark measures latency from it).
    ``on_acked(records, timestamp_ms)`` is told each batch's records once the broker has them, with the
    timestamp it returned: the broker's append time on a ``LogAppendTime`` topic, else the producer's.

    ``prepare``: draw and encode the run's ``rate * duration_s`` records before the schedule starts (all of
    them held in memory), so that sending them on schedule is all the generator does while it runs.
    """
    if rate <= 0 or duration_s <= 0:
        raise ValueError("rate and duration must be positive")
    await ensure_topics(bootstrap, [topic], partitions)
    total = int(rate * duration_s)
    ready = _ready(generator, key_field, encode)
    if prepare:
        ready = iter(list(itertools.islice(ready, total)))
    producer = AIOKafkaProducer(**client_options(bootstrap), acks="all", linger_ms=5,
                                max_batch_size=256 * 1024)
    await producer.start()
    sent = positive = 0
    pending: list[asyncio.Future[object]] = []

    def acknowledged(records: list[dict[str, Any]], done: asyncio.Future[Any]) -> None:
        if on_acked is not None and not done.cancelled() and done.exception() is None:
            on_acked(records, done.result().timestamp)

    async def send(batch: Any, partition: int, records: list[dict[str, Any]]) -> asyncio.Future[Any]:
        future = await producer.send_batch(batch, topic, partition=partition)
        if on_acked is not None:
            future.add_done_callback(functools.partial(acknowledged, records))
        return future

    try:
        count = len(await producer.partitions_for(topic))
        partitions_by_key: dict[bytes, int] = {}
        started, cpu_started = time.monotonic(), time.process_time()
        while sent < total and not (stop is not None and stop()):
            due = min(total, int((time.monotonic() - started) * rate) + 1)
            now_ms = int(time.time() * 1000)
            batches: dict[int, tuple[Any, list[dict[str, Any]]]] = {}
            while sent < due:
                tx, is_positive, key, value = next(ready)
                partition = partitions_by_key.get(key)
                if partition is None:
                    partition = partitions_by_key[key] = partition_of(key, count)
                batch, records = batches.get(partition) or (producer.create_batch(), [])
                batch, full = append(batch, producer.create_batch, key, value, now_ms)
                if full is not None:
                    pending.append(await send(full, partition, records))
                    records = []
                if on_acked is not None:
                    records.append(tx)
                batches[partition] = batch, records
                if on_sent is not None:
                    on_sent(tx, now_ms)
                sent += 1
                positive += is_positive
            for partition, (batch, records) in batches.items():
                pending.append(await send(batch, partition, records))
            if len(pending) > 1000:
                await asyncio.gather(*pending)
                pending.clear()
            if on_progress is not None:
                on_progress(sent, total)
            await asyncio.sleep(max(TICK_S, started + sent / rate - time.monotonic()))
        await asyncio.gather(*pending)
        await producer.flush()
    finally:
        await producer.stop()
    return ProduceReport(sent, positive, time.monotonic() - started, time.process_time() - cpu_started)
