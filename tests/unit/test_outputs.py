"""agents.delivery.outputs: batches per topic partition, at most one on its way per partition, order kept.

The producer here is a test double of aiokafka's batch API (``create_batch``, ``send_batch``,
``partitions_for``) around aiokafka's real ``BatchBuilder``; the test decides when the broker answers.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.producer.message_accumulator import BatchBuilder

from agents.delivery.outputs import OutputProducer

TOPIC = "predictions"


class Broker:
    """Records every batch handed over and answers each when the test says so."""

    def __init__(self, partitions: int = 4, batch_size: int = 16 * 1024) -> None:
        self.partitions, self.batch_size = partitions, batch_size
        self.handed: list[tuple[int, list[bytes], asyncio.Future[Any]]] = []

    async def partitions_for(self, topic: str) -> set[int]:
        return set(range(self.partitions))

    def create_batch(self) -> Batch:
        return Batch(BatchBuilder(self.batch_size, 0))

    async def send_batch(self, builder: Batch, topic: str, *, partition: int) -> asyncio.Future[Any]:
        assert topic == TOPIC
        values = builder.values
        acked: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.handed.append((partition, values, acked))
        return acked

    def on_its_way(self, partition: int) -> list[list[bytes]]:
        return [values for p, values, acked in self.handed if p == partition and not acked.done()]

    def answer(self, partition: int | None = None) -> None:
        for p, _values, acked in self.handed:
            if not acked.done() and (partition is None or p == partition):
                acked.set_result(("metadata", p))


class Batch:
    """aiokafka's BatchBuilder (which decides when a batch is full), remembering the values appended."""

    def __init__(self, builder: BatchBuilder) -> None:
        self.builder = builder
        self.values: list[bytes] = []

    def append(self, *, key: bytes | None, value: bytes, timestamp: int | None) -> Any:
        metadata = self.builder.append(key=key, value=value, timestamp=timestamp)
        if metadata is not None:
            self.values.append(value)
        return metadata


DEFAULT_PARTITIONER = DefaultPartitioner()  # aiokafka's own, as Java's: the partitions seam must match


def key_for(partition: int, partitions: int = 4) -> bytes:
    return next(k for k in (f"card-{i}".encode() for i in range(1000))
                if DEFAULT_PARTITIONER(k, list(range(partitions)), list(range(partitions))) == partition)


async def turn() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


@pytest.mark.asyncio
async def test_records_of_one_turn_go_as_one_batch_per_partition() -> None:
    broker = Broker()
    outputs = OutputProducer(producer=broker)  # type: ignore[arg-type]
    futures = [await outputs.send(None, TOPIC, key_for(p), f"{p}-{i}".encode()) for i in range(3) for p in (0, 1)]
    assert broker.handed == []  # nothing before the end of the turn
    await turn()
    assert sorted((p, values) for p, values, _ in broker.handed) == [
        (0, [b"0-0", b"0-1", b"0-2"]), (1, [b"1-0", b"1-1", b"1-2"])]
    assert not any(f.done() for f in futures)
    broker.answer()
    await turn()
    assert all(f.done() and f.result() for f in futures)


@pytest.mark.asyncio
async def test_a_partition_with_a_batch_on_its_way_gathers_the_next_one_until_it_is_acknowledged() -> None:
    broker = Broker()
    outputs = OutputProducer(producer=broker)  # type: ignore[arg-type]
    key = key_for(2)
    first = await outputs.send(None, TOPIC, key, b"a")
    await turn()
    later = []
    for value in (b"b", b"c", b"d"):  # three turns while the first batch is on its way
        later.append(await outputs.send(None, TOPIC, key, value))
        await turn()
        assert broker.on_its_way(2) == [[b"a"]]
    assert len({id(f) for f in later}) == 1  # one open batch gathered them
    broker.answer(2)
    await turn()
    assert first.done() and not later[0].done()
    assert broker.on_its_way(2) == [[b"b", b"c", b"d"]]
    broker.answer(2)
    await turn()
    assert later[0].done()
    assert [values for _p, values, _ in broker.handed] == [[b"a"], [b"b", b"c", b"d"]]


@pytest.mark.asyncio
async def test_full_batches_wait_their_turn_and_keep_the_partitions_order() -> None:
    broker = Broker(batch_size=256)
    outputs = OutputProducer(producer=broker)  # type: ignore[arg-type]
    key = key_for(1)
    sent = [f"value-{i:03d}-".encode() * 3 for i in range(20)]
    for value in sent:
        await outputs.send(None, TOPIC, key, value)
    await turn()
    handed_values: list[bytes] = []
    while broker.on_its_way(1):
        assert len(broker.on_its_way(1)) == 1  # never two batches of one partition at a time
        handed_values += broker.on_its_way(1)[0]
        broker.answer(1)
        await turn()
    assert handed_values == sent
    assert len(broker.handed) > 2


@pytest.mark.asyncio
async def test_flush_waits_for_every_record_handed_in_and_a_failure_reaches_its_future() -> None:
    broker = Broker()
    outputs = OutputProducer(producer=broker)  # type: ignore[arg-type]
    ok = await outputs.send(None, TOPIC, key_for(0), b"x")
    await turn()
    failing = await outputs.send(None, TOPIC, key_for(0), b"y")  # waits behind x
    flushing = asyncio.ensure_future(outputs.flush())
    await turn()
    assert not flushing.done()
    broker.answer(0)
    await turn()
    _p, values, acked = broker.handed[-1]
    assert values == [b"y"]
    acked.set_exception(RuntimeError("broker says no"))
    await asyncio.wait_for(flushing, 1)
    assert ok.result()
    with pytest.raises(RuntimeError, match="broker says no"):
        failing.result()
