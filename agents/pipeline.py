"""The scoring pipeline for one batch of raw records: decode, route, features, hand to the boundary.

Both ingestion paths call :meth:`Pipeline.handle`: batch ingestion with a partition's fetched
records, the plain Faust-agent path (``SEAM_INGEST=stream``) with one record at a time. Every
record is acknowledged exactly when all its outputs are acknowledged by the broker (a dead letter or
late record right after it is delivered, a scored record after its prediction is delivered) and
the state change it caused has been flushed to the table (see :mod:`tables.cache`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from agents.formats.codec import Event, Invalid, dead_letter, dead_letter_key, late_record
from agents.formats.record_format import RecordFormat, json_format
from agents.ingest.records import RawRecord, RecordBatch
from agents.model.boundary import BatchResult
from agents.model.runtime import ModelInfo
from agents.observe.metrics import BoundaryMetrics
from tables.cache import StateCache
from tables.features import apply_event, feature_set_version, has_event, replayable

__all__ = ["Outputs", "Pipeline", "ScoringItem"]

logger = logging.getLogger(__name__)

# (source batch, topic, key, value) -> the delivery future; the batch says which partition's output it is.
Send = Callable[[RecordBatch, str, bytes | None, bytes], Awaitable[Awaitable[object]]]


@dataclass(frozen=True, slots=True)
class Outputs:
    """Where results go: topic names and the send function (returns the delivery future)."""

    predictions_topic: str
    dlq_topic: str
    late_topic: str
    send: Send
    feature_log_topic: str | None = None  # None: no feature log


@dataclass(frozen=True, slots=True)
class ScoringItem:
    """A scored-to-be event, its features, and the record to acknowledge afterwards."""

    tx: Event
    features: tuple[float, ...]
    batch: RecordBatch
    record: RawRecord
    state_round: int


class Boundary(Protocol):
    """Where the pipeline hands its rows: a model boundary, or the models of a deployment (agents.model.models)."""

    async def submit_many(self, items: Sequence[tuple[Sequence[float], ScoringItem]]) -> None: ...

    def holding(self) -> AbstractContextManager[None]:
        """While held, rows handed in wait to leave together (a fetch handed over partition by partition)."""


HANDLE_STEP_S = 0.002  # the most handling work in one event-loop turn, across batches (checked per 16 records)
HANDLE_CHECK_EVERY = 16
# Records decoded ahead, whose keys the cache does not hold are then read together (StateCache.prefetch):
# as many as between two checks of the step's time, so the reads of a step's misses stay in that step.
PREFETCH_RECORDS = HANDLE_CHECK_EVERY


def _now_ms() -> int:
    return int(time.time() * 1000)


def _when(ms: int) -> str:
    """Epoch milliseconds as UTC ISO-8601 (the milliseconds themselves where no calendar date holds them)."""
    try:
        return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    except (OverflowError, ValueError, OSError):
        return f"{ms} ms"


class Pipeline:
    """Per-partition event-time routing and feature state in front of the model boundary."""

    def __init__(
        self,
        boundary: Boundary,
        outputs: Outputs,
        cache: StateCache,
        *,
        allowed_lateness_ms: int,
        on_delivery_failure: Callable[[BaseException], None],
        write_through: bool = False,
        metrics: BoundaryMetrics | None = None,
        record_format: RecordFormat | None = None,
        max_future_ms: int = 0,
        max_past_ms: int = 0,
    ) -> None:
        """``max_future_ms``, ``max_past_ms``: how far an event time may lie ahead of (behind) its record's Kafka
        timestamp (0: no bound); beyond, the record is a dead letter (``future_timestamp``, ``past_timestamp``)."""
        self._max_future_ms, self._max_past_ms = max_future_ms, max_past_ms
        self.format = record_format or json_format()  # how records are decoded and outputs encoded
        self.spec = self.format.contract.spec  # the features computed, from the fields the format decodes
        self._metrics = metrics
        self._boundary = boundary
        self._outputs = outputs
        self.cache = cache
        self._lateness_ms = allowed_lateness_ms
        self._on_delivery_failure = on_delivery_failure
        self._write_through = write_through
        self._pending: set[asyncio.Future[Any]] = set()  # outputs sent, not yet delivered
        # One step's budget spans batches: a fetch of many partitions hands over one batch each, and
        # batches of a few dozen records each would otherwise never yield (a whole fetch in one turn).
        self._step_started = time.perf_counter()
        self._unchecked = 0
        # Input partition -> (offset after the last record handed in, that record's broker timestamp):
        # the consumer's lag is measured from here (agents.observe.monitor).
        self.handled: dict[int, tuple[int, int]] = {}

    def forget_partitions(self) -> None:
        """Drop cached state and watermarks (after a rebalance the partitions may belong to others)."""
        self.cache.forget()
        self.handled.clear()

    def holding(self) -> AbstractContextManager[None]:
        """Around a fetch's hand-over: its partitions' rows reach the model as one batch, not one per part."""
        return self._boundary.holding()

    async def handle(self, batch: RecordBatch) -> None:
        """Route, apply and submit one batch of records from one partition, in offset order."""
        cache, partition, lateness_ms = self.cache, batch.partition, self._lateness_ms
        metrics = self._metrics
        if batch.records:
            last = batch.records[-1]
            self.handled[partition] = (last.offset + 1, last.timestamp)
        if metrics is not None:
            metrics.events_in.inc(len(batch.records))
            now_ms = time.time() * 1000
            metrics.stage.labels("ingest").observe_ages(now_ms, [record.timestamp for record in batch.records])
        record_format = self.format
        if record_format.prepare is not None:  # Avro: the batch's writer schemas, from the registry if new
            await record_format.prepare([record.value for record in batch.records])
        decode = record_format.decode
        watermark = cache.watermark(partition)
        items: list[tuple[tuple[float, ...], ScoringItem]] = []
        records = batch.records
        spec = self.spec
        ahead: list[Event | Invalid] = []
        for index, record in enumerate(records):
            self._unchecked += 1
            if self._unchecked >= HANDLE_CHECK_EVERY:
                self._unchecked = 0
                if time.perf_counter() - self._step_started > HANDLE_STEP_S:
                    # A fetch can hold thousands of records: hand over what is ready and let the
                    # boundary and the deliveries run, instead of holding the loop for the whole fetch.
                    if items:
                        await self._boundary.submit_many(items)
                        items = []
                    await asyncio.sleep(0)
                    self._step_started = time.perf_counter()
            if not index % PREFETCH_RECORDS:
                window = records[index:index + PREFETCH_RECORDS]
                ahead = [self._in_time(decode(later.value), later) for later in window]
                cache.prefetch(partition, [later.key for later in ahead if not isinstance(later, Invalid)])
            tx = ahead[index % PREFETCH_RECORDS]
            if isinstance(tx, Invalid):
                if metrics is not None:
                    metrics.dead_letters.labels(tx.reason).inc()
                await self._route(batch, record, "dead_letter", self._outputs.dlq_topic, dead_letter(
                    tx, topic=record.topic, partition=record.partition, offset=record.offset,
                    key=record.key, value=record.value, routed_at_ms=_now_ms(), headers=record.headers))
                continue
            state = cache.state(partition, tx.key)
            # A redelivered event already in its key's state is scored again (same features) even if
            # the restored watermark has passed it, as long as it lies within the replay horizon.
            if watermark.is_late(tx.ts) and not (
                    has_event(state, tx.id) and replayable(state, tx.ts, allowed_lateness_ms=lateness_ms, spec=spec)):
                assert record.value is not None and watermark.value is not None
                if metrics is not None:
                    metrics.late_records.labels(str(partition)).inc()
                await self._route(batch, record, "late", self._outputs.late_topic, late_record(
                    tx, raw=record.value, watermark=watermark.value, topic=record.topic,
                    partition=record.partition, offset=record.offset, routed_at_ms=_now_ms(),
                    raw_is_json=record_format.text_input, contract=record_format.contract, headers=record.headers))
                continue
            if watermark.observe(tx.ts):
                cache.touch_watermark(partition)
            applied = apply_event(state, tx.id, tx.ts, tx.values, allowed_lateness_ms=lateness_ms, spec=spec)
            if not applied.duplicate:
                cache.touch(partition, tx.key, tx.ts)
            items.append((applied.features, ScoringItem(tx, applied.features, batch, record, cache.write_round)))
        if self._write_through:
            cache.flush()
        if items:
            await self._boundary.submit_many(items)

    def _in_time(self, tx: Event | Invalid, record: RawRecord) -> Event | Invalid:
        """``tx``, or why its event time is too far from its record's Kafka timestamp to be believed.

        One record stamped in the far future would otherwise raise its partition's watermark past every
        later event (all of them late, after a restart too: the watermark is in the changelog). The bound
        is the record's own timestamp, not the worker's clock, so a redelivery meets the same verdict.
        """
        if isinstance(tx, Invalid) or record.timestamp <= 0:  # no Kafka timestamp (-1): nothing to hold it to
            return tx
        ahead_ms = tx.ts - record.timestamp
        if self._max_future_ms and ahead_ms > self._max_future_ms:
            return Invalid("future_timestamp", f"event time {_when(tx.ts)} is {ahead_ms / 1000:,.3f} s ahead of "
                           f"the record's Kafka timestamp {_when(record.timestamp)}; SEAM_MAX_FUTURE_S allows "
                           f"{self._max_future_ms / 1000:g} s")
        if self._max_past_ms and -ahead_ms > self._max_past_ms:
            return Invalid("past_timestamp", f"event time {_when(tx.ts)} is {-ahead_ms / 1000:,.3f} s behind the "
                           f"record's Kafka timestamp {_when(record.timestamp)}; SEAM_MAX_PAST_S allows "
                           f"{self._max_past_ms / 1000:g} s")
        return tx

    async def _route(self, batch: RecordBatch, record: RawRecord, kind: str, topic: str, value: bytes) -> None:
        key = dead_letter_key(record.key) if kind == "dead_letter" else record.key
        delivery = asyncio.ensure_future(await self._outputs.send(batch, topic, key, value))
        offset = record.offset
        self._track(delivery, lambda done: self._ack_if_delivered(done, kind, topic, [(batch, offset)]))

    def _track(self, delivery: asyncio.Future[Any], on_done: Callable[[asyncio.Future[Any]], None]) -> None:
        """Count ``delivery`` as pending until it is done; then run ``on_done`` (which acknowledges)."""
        delivery.add_done_callback(on_done)
        self._pending.add(delivery)
        delivery.add_done_callback(self._pending.discard)

    def _failed(self, done: asyncio.Future[Any]) -> bool:
        """Report a failed delivery to ``on_delivery_failure``; return whether it failed."""
        if not done.cancelled() and done.exception() is None:
            return False
        error = done.exception() if not done.cancelled() else asyncio.CancelledError()
        assert error is not None
        self._on_delivery_failure(error)
        return True

    async def delivered(self) -> None:
        """Wait until every output sent so far is delivered (and its records acknowledged or failed)."""
        while self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)
            await asyncio.sleep(0)  # the acknowledging callbacks were added first, but let them all run

    def _ack_if_delivered(self, done: asyncio.Future[Any], kind: str, topic: str,
                          acks: list[tuple[RecordBatch, int]]) -> None:
        if self._failed(done):
            return
        if self._metrics is not None:
            self._metrics.events_out.labels(kind, topic).inc()
        _ack(acks)

    async def deliver(self, result: BatchResult[ScoringItem], info: ModelInfo, threshold: float) -> None:
        """Send a scored batch (dead letters for rows whose inference failed); ack once delivered."""
        outputs, encode = self._outputs, self.format
        feature_log, feature_set = outputs.feature_log_topic, _feature_set(info.feature_names)
        deliveries = []
        size = len(result.items)
        if result.row_errors:
            logger.error("inference failed for %d of %d rows; dead-lettering them: %s", len(result.row_errors),
                         size, next(iter(result.row_errors.values())))
        for index, (item, score, queue_ms) in enumerate(
                zip(result.items, result.scores.tolist(), result.queue_ms, strict=True)):
            record = item.record
            error = result.row_errors.get(index)
            if error is not None:
                if self._metrics is not None:  # counted when sent, as the records that fail to decode are
                    self._metrics.dead_letters.labels("inference_error").inc()
                value = dead_letter(
                    Invalid("inference_error", f"inference failed: {error}"), topic=record.topic,
                    partition=record.partition, offset=record.offset, key=record.key, value=record.value,
                    routed_at_ms=_now_ms(), headers=record.headers)
                deliveries.append(await outputs.send(item.batch, outputs.dlq_topic, dead_letter_key(record.key), value))
                continue
            key = item.tx.key.encode()
            value = encode.prediction(item.tx, score=score, threshold=threshold, model=info.tag, queue_ms=queue_ms,
                               infer_ms=result.infer_ms, batch_size=size)
            deliveries.append(await outputs.send(item.batch, outputs.predictions_topic, key, value))
            if feature_log is not None:
                features = encode.feature_record(item.tx, feature_set=feature_set, features=item.features)
                deliveries.append(await outputs.send(item.batch, feature_log, key, features))
        # Not awaited: the boundary's next batch need not wait for the broker. The records are
        # acknowledged (and so become committable) only once every output is delivered.
        sent_at = time.perf_counter()
        self._track(asyncio.gather(*deliveries), lambda done: self._scored_delivered(done, result, sent_at))

    def _scored_delivered(self, done: asyncio.Future[Any], result: BatchResult[ScoringItem], sent_at: float) -> None:
        if self._failed(done):
            return
        metrics = self._metrics
        if metrics is not None:
            failed = len(result.row_errors)
            outputs = self._outputs
            metrics.events_out.labels("prediction", outputs.predictions_topic).inc(len(result.items) - failed)
            if outputs.feature_log_topic is not None:
                metrics.events_out.labels("feature_log", outputs.feature_log_topic).inc(len(result.items) - failed)
            if failed:
                metrics.events_out.labels("dead_letter", outputs.dlq_topic).inc(failed)
            metrics.stage.labels("delivery").observe(time.perf_counter() - sent_at)
            now_ms = time.time() * 1000
            metrics.end_to_end.observe_ages(now_ms, [item.record.timestamp for item in result.items])
        acks = [(item.batch, item.record.offset) for item in result.items]
        self.cache.ack_when_flushed(max(item.state_round for item in result.items), lambda: _ack(acks))


@functools.lru_cache(maxsize=8)
def _feature_set(names: tuple[str, ...]) -> str:
    return feature_set_version(names)


def _ack(acks: list[tuple[RecordBatch, int]]) -> None:
    """Acknowledge offsets, one call per source batch."""
    grouped: dict[int, tuple[RecordBatch, list[int]]] = {}
    for batch, offset in acks:
        grouped.setdefault(id(batch), (batch, []))[1].append(offset)
    for batch, offsets in grouped.values():
        batch.ack(offsets)
