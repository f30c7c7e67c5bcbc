"""tables.changelog: bulk table writes, the changelog offsets they record, and failures that stick."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import orjson
import pytest
from faust.types import TP

from tables.changelog import ChangelogWriter


class Store:
    """The slice of a Faust store the writer uses, recording what it was asked to do."""

    def __init__(self) -> None:
        self.rows: dict[tuple[int, bytes], bytes | None] = {}
        self.persisted: dict[TP, int] = {}
        self.partition: int | None = None

    def _encode_key(self, key: Any) -> bytes:
        return orjson.dumps(key.decode() if isinstance(key, bytes) else key)

    def _encode_value(self, value: Any) -> bytes:
        return orjson.dumps(value)

    def _set(self, key: bytes, value: bytes | None) -> None:
        assert self.partition is not None, "written outside a partition scope"
        self.rows[(self.partition, key)] = value

    def set_persisted_offset(self, tp: TP, offset: int) -> None:
        self.persisted[tp] = offset


class Topic:
    def __init__(self, name: str) -> None:
        self.name = name

    def get_topic_name(self) -> str:
        return self.name


class Table:
    key_type = None  # Faust's default: keys and values go through the store's serializers
    value_type = None

    def __init__(self, name: str) -> None:
        self.data = Store()
        self.changelog_topic = Topic(f"{name}-changelog")


class Broker:
    """Assigns offsets per topic partition, like a log; can be told to fail."""

    def __init__(self) -> None:
        self.log: dict[tuple[str, int], list[tuple[bytes, bytes | None]]] = {}
        self.fail: Exception | None = None

    async def send(self, topic: str, partition: int, batch: Sequence[tuple[bytes, bytes | None]]) -> list[int]:
        await asyncio.sleep(0)
        if self.fail is not None:
            raise self.fail
        records = self.log.setdefault((topic, partition), [])
        first = len(records)
        records.extend(batch)
        return list(range(first, len(records)))


def scope_for(*tables: Table) -> Any:
    @contextmanager
    def scope(partition: int) -> Iterator[None]:
        for table in tables:
            table.data.partition = partition
        try:
            yield
        finally:
            for table in tables:
                table.data.partition = None

    return scope


def test_writes_reach_the_changelog_on_flush_and_the_store_once_acknowledged() -> None:
    table, broker = Table("cards"), Broker()
    writer = ChangelogWriter(broker.send, scope_for(table))
    writer.write(table, 3, b"c-1", {"n": 1})
    writer.write(table, 3, b"c-1", {"n": 2})
    writer.write(table, 0, b"c-9", {"n": 7})
    assert table.data.rows == {} and broker.log == {} and len(writer) == 3
    assert asyncio.run(writer.flush()) == 3
    assert broker.log[("cards-changelog", 3)] == [(b'"c-1"', b'{"n":1}'), (b'"c-1"', b'{"n":2}')]
    assert table.data.rows[(3, b'"c-1"')] == b'{"n":2}'
    assert table.data.persisted == {TP("cards-changelog", 3): 1, TP("cards-changelog", 0): 0}
    assert len(writer) == 0 and asyncio.run(writer.flush()) == 0


def test_the_local_store_never_holds_what_the_changelog_lacks() -> None:
    """A worker killed mid-flush and restarted on its folder reads RocksDB, then the changelog after it.

    Stored before their records were acknowledged, writes the changelog never got stayed in RocksDB
    (newer than the changelog, which a restore elsewhere reads), and a partition stored step by step
    held some of its cards newer than the others: redelivered events were routed late.
    """
    table, broker = Table("cards"), Broker()
    rows_at_send: list[int] = []

    async def send(topic: str, partition: int, batch: Any) -> list[int]:
        rows_at_send.append(len(table.data.rows))
        return await broker.send(topic, partition, batch)

    writer = ChangelogWriter(send, scope_for(table))
    writer.write(table, 1, b"c-1", {"n": 1})
    broker.fail = ConnectionError("killed")
    with pytest.raises(ConnectionError):
        asyncio.run(writer.flush())
    assert rows_at_send == [0] and table.data.rows == {} and table.data.persisted == {}


def test_a_failed_flush_fails_every_later_flush() -> None:
    table, broker = Table("cards"), Broker()
    writer = ChangelogWriter(broker.send, scope_for(table))
    writer.write(table, 1, b"c-1", {"n": 1})
    broker.fail = ConnectionError("broker gone")
    with pytest.raises(ConnectionError):
        asyncio.run(writer.flush())
    broker.fail = None
    writer.write(table, 1, b"c-2", {"n": 1})
    with pytest.raises(RuntimeError, match="earlier changelog write failed"):
        asyncio.run(writer.flush())
    assert table.data.persisted == {}
