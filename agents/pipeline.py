"""The scoring pipeline for one batch of raw records: decode, route, features, hand to the boundary.

Both ingestion paths call :meth:`Pipeline.handle`: batch ingestion with a partition's fetched
records, the plain Faust-agent path (``SEAM_INGEST=stream``) with one record at a time. Every
record is acknowledged exactly when all its outputs are acknowledged by the broker: a dead letter or
late record right after it is delivered, a scored record after its prediction is delivered.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from agents.boundary import BatchResult, ModelBoundary
from agents.codec import Invalid, Transaction, dead_letter, decode_transaction, late_record, prediction
from agents.ingest import RawRecord, RecordBatch, table_partition
from agents.runtime import ModelInfo
from tables.features import CardState, Watermark, apply_event, new_state

__all__ = ["Outputs", "Pipeline", "ScoringItem", "StateStore"]

logger = logging.getLogger(__name__)

Send = Callable[[str, bytes | None, bytes], Awaitable[Awaitable[object]]]


@dataclass(frozen=True, slots=True)
class Outputs:
    """Where results go: topic names and the send function (returns the delivery future)."""

    predictions_topic: str
    dlq_topic: str
    late_topic: str
    send: Send


@dataclass(frozen=True, slots=True)
class StateStore:
    """Per-card state access (the Faust table, or a dict in tests)."""

    load: Callable[[str], CardState | None]
    store: Callable[[str, CardState], None]


@dataclass(frozen=True, slots=True)
class ScoringItem:
    """A scored-to-be transaction, its features, and the record to acknowledge afterwards."""

    tx: Transaction
    features: tuple[float, ...]
    batch: RecordBatch
    record: RawRecord


def _now_ms() -> int:
    return int(time.time() * 1000)


class Pipeline:
    """Per-partition event-time routing and feature state in front of the model boundary."""

    def __init__(
        self,
        boundary: ModelBoundary[ScoringItem],
        outputs: Outputs,
        state: StateStore,
        *,
        allowed_lateness_ms: int,
        on_delivery_failure: Callable[[BaseException], None],
    ) -> None:
        self._boundary = boundary
        self._outputs = outputs
        self._state = state
        self._lateness_ms = allowed_lateness_ms
        self._on_delivery_failure = on_delivery_failure
        self._watermarks: dict[tuple[str, int], Watermark] = {}

    def forget_partitions(self) -> None:
        """Drop in-memory watermarks (after a rebalance the partitions may belong to others)."""
        self._watermarks.clear()

    async def handle(self, batch: RecordBatch) -> None:
        """Route, apply and submit one batch of records from one partition, in offset order."""
        key = (batch.topic, batch.partition)
        watermark = self._watermarks.get(key) or self._watermarks.setdefault(key, Watermark(self._lateness_ms))
        accepted: list[tuple[RawRecord, Transaction]] = []
        for record in batch.records:
            tx = decode_transaction(record.value)
            if isinstance(tx, Invalid):
                await self._route(batch, record, self._outputs.dlq_topic, dead_letter(
                    tx, topic=record.topic, partition=record.partition, offset=record.offset,
                    key=record.key, value=record.value, routed_at_ms=_now_ms()))
            elif watermark.is_late(tx.ts):
                assert record.value is not None and watermark.value is not None
                await self._route(batch, record, self._outputs.late_topic, late_record(
                    tx, raw=record.value, watermark=watermark.value, topic=record.topic,
                    partition=record.partition, offset=record.offset, routed_at_ms=_now_ms()))
            else:
                watermark.observe(tx.ts)
                accepted.append((record, tx))
        if accepted:
            await self._boundary.submit_many(self._apply(batch, accepted))

    def _apply(
        self, batch: RecordBatch, accepted: list[tuple[RawRecord, Transaction]],
    ) -> list[tuple[tuple[float, ...], ScoringItem]]:
        # Each card's state is read once and written once per batch, however many of its events
        # the batch holds: the changelog gets one record per card per batch.
        items = []
        states: dict[str, CardState] = {}
        dirty: set[str] = set()
        with table_partition(batch.topic, batch.partition):
            for record, tx in accepted:
                state = states.get(tx.card_id)
                if state is None:
                    state = states[tx.card_id] = self._state.load(tx.card_id) or new_state()
                applied = apply_event(state, tx.id, tx.ts, tx.amount, tx.merchant_id,
                                      allowed_lateness_ms=self._lateness_ms)
                if not applied.duplicate:
                    dirty.add(tx.card_id)
                items.append((applied.features, ScoringItem(tx, applied.features, batch, record)))
            for card_id in dirty:
                self._state.store(card_id, states[card_id])
        return items

    async def _route(self, batch: RecordBatch, record: RawRecord, topic: str, value: bytes) -> None:
        delivery = asyncio.ensure_future(await self._outputs.send(topic, record.key, value))
        offset = record.offset
        delivery.add_done_callback(lambda done: self._ack_if_delivered(done, [(batch, offset)]))

    def _ack_if_delivered(self, done: asyncio.Future[object], acks: list[tuple[RecordBatch, int]]) -> None:
        if done.cancelled() or done.exception() is not None:
            error = done.exception() if not done.cancelled() else asyncio.CancelledError()
            assert error is not None
            self._on_delivery_failure(error)
            return
        _ack(acks)

    async def deliver(self, result: BatchResult[ScoringItem], info: ModelInfo, threshold: float) -> None:
        """Send a scored batch (or its dead letters) and acknowledge the records once delivered."""
        outputs = self._outputs
        deliveries = []
        if result.error is not None or result.scores is None:
            logger.error("inference failed for a batch of %d: %r", len(result.items), result.error)
            for item in result.items:
                record = item.record
                value = dead_letter(
                    Invalid("inference_error", f"inference failed: {result.error!r}"),
                    topic=record.topic, partition=record.partition, offset=record.offset,
                    key=record.key, value=record.value, routed_at_ms=_now_ms())
                deliveries.append(await outputs.send(outputs.dlq_topic, record.key, value))
        else:
            size = len(result.items)
            for item, score, queue_ms in zip(result.items, result.scores.tolist(), result.queue_ms, strict=True):
                value = prediction(
                    item.tx, score=score, threshold=threshold, model=info.tag, feature_names=info.feature_names,
                    features=item.features, queue_ms=queue_ms, infer_ms=result.infer_ms, batch_size=size)
                deliveries.append(await outputs.send(outputs.predictions_topic, item.tx.card_id.encode(), value))
        await asyncio.gather(*deliveries)
        _ack([(item.batch, item.record.offset) for item in result.items])


def _ack(acks: list[tuple[RecordBatch, int]]) -> None:
    """Acknowledge offsets, one call per source batch."""
    grouped: dict[int, tuple[RecordBatch, list[int]]] = {}
    for batch, offset in acks:
        grouped.setdefault(id(batch), (batch, []))[1].append(offset)
    for batch, offsets in grouped.values():
        batch.ack(offsets)
