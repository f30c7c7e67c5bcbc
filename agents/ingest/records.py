"""The records batch ingestion hands over, and how they are acknowledged (no Faust import: any layer may use them)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

__all__ = ["Acker", "RawRecord", "RecordBatch"]


class RawRecord(Protocol):
    """One Kafka record as fetched: aiokafka's ``ConsumerRecord`` satisfies it (timestamp in ms)."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes]]  # carried into dead letters and late records, so a replay keeps them


Acker = Callable[[Sequence[int]], object]


class RecordBatch:
    """The records one fetch returned for one partition, and the way to acknowledge them."""

    __slots__ = ("topic", "partition", "records", "epoch", "_acker")

    def __init__(self, topic: str, partition: int, records: Sequence[RawRecord], acker: Acker, epoch: int = 0) -> None:
        self.topic = topic
        self.partition = partition
        self.records = records
        self.epoch = epoch  # the consumer's assignment epoch when the records were fetched
        self._acker = acker

    def ack(self, offsets: Sequence[int]) -> None:
        """Mark these offsets committable: their outputs are delivered."""
        self._acker(offsets)

    def __repr__(self) -> str:
        first, last = self.records[0].offset, self.records[-1].offset
        return f"<RecordBatch {self.topic}[{self.partition}] offsets {first}..{last} ({len(self.records)})>"
