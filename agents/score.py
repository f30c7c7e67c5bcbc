"""The scoring pipeline: decode, event-time features into the table, the model boundary, outputs.

``score_events`` reads raw transactions, routes bad records to the dead-letter topic and late ones to
the late topic, applies on-time events to the card's state and submits the feature vector to the
model boundary. ``ScoringService`` owns the boundary and the ONNX Runtime session (created when the
worker starts) and delivers each scored batch to the predictions topic. An input record is
acknowledged only after every output it caused is acknowledged by the broker, so the committed
offset never passes a record whose outputs could still be lost.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

from faust import Stream
from faust.types import EventT
from mode import Service

from agents.boundary import BatchResult, ModelBoundary
from agents.codec import (
    Invalid,
    Transaction,
    dead_letter,
    decode_transaction,
    late_record,
    prediction,
)
from agents.runtime import ModelRuntime
from app.main import app, settings
from tables.features import DEFAULT_SPEC, Watermark, apply_event, new_state
from tables.state import load_state, store_state

__all__ = ["ScoringService", "score_events", "scoring", "transactions_topic"]

logger = logging.getLogger(__name__)

# internal=True: seam creates these topics with the configured partition count when they are missing.
transactions_topic = app.topic(settings.input_topic, partitions=settings.topic_partitions, internal=True)
predictions_topic = app.topic(settings.predictions_topic, partitions=settings.topic_partitions, internal=True)
dlq_topic = app.topic(settings.dlq_topic, partitions=settings.topic_partitions, internal=True)
late_topic = app.topic(settings.late_topic, partitions=settings.topic_partitions, internal=True)


@dataclass(frozen=True, slots=True)
class ScoringItem:
    """What travels through the boundary with a feature vector: the event and its source record."""

    tx: Transaction
    features: tuple[float, ...]
    event: EventT


def _now_ms() -> int:
    return int(time.time() * 1000)


async def _send(topic: str, key: bytes | None, value: bytes) -> Awaitable[object]:
    return await app.producer.send(topic, key, value, partition=None, timestamp=None, headers=None)


def _ack_when_delivered(event: EventT, delivery: Awaitable[object]) -> None:
    future = asyncio.ensure_future(delivery)
    future.add_done_callback(lambda f: _ack_or_crash(event, f))


def _ack_or_crash(event: EventT, delivered: asyncio.Future[object]) -> None:
    if delivered.cancelled() or delivered.exception() is not None:
        # Not acking keeps the offset uncommitted; stopping the worker makes the record come back.
        logger.error("output for %s could not be delivered: %r", event.message.tp, delivered)
        asyncio.ensure_future(app.crash(RuntimeError(f"output delivery failed: {delivered!r}")))
        return
    event.ack()


class ScoringService(Service):
    """Owns the model runtime and the boundary; delivers scored batches to Kafka."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.runtime: ModelRuntime | None = None
        self.boundary: ModelBoundary[ScoringItem] | None = None
        self._ready = asyncio.Event()

    async def on_start(self) -> None:
        for topic in (predictions_topic, dlq_topic, late_topic):
            await topic.maybe_declare()
        runtime = await asyncio.to_thread(
            ModelRuntime.load, settings.model_path, feature_names=DEFAULT_SPEC.names,
            device=settings.device, threads=settings.inference_threads)
        sizes = sorted({1, min(8, settings.max_batch_size), settings.max_batch_size})
        await asyncio.to_thread(runtime.warmup, sizes)
        self.runtime = runtime
        self.boundary = ModelBoundary(
            runtime.predict, self._deliver,
            max_batch_size=settings.max_batch_size, max_wait_ms=settings.max_wait_ms,
            max_inflight_batches=settings.max_inflight_batches)
        self._ready.set()
        logger.info("model boundary ready: %s on %s, max_batch_size=%d max_wait_ms=%s",
                    runtime.info.tag, runtime.info.provider, settings.max_batch_size, settings.max_wait_ms)

    async def on_stop(self) -> None:
        if self.boundary is not None:
            self.boundary.close()

    async def wait_ready(self) -> ModelBoundary[ScoringItem]:
        """Return the boundary once the model is loaded."""
        await self._ready.wait()
        assert self.boundary is not None
        return self.boundary

    @Service.task
    async def _dispatch(self) -> None:
        boundary = await self.wait_ready()
        try:
            await boundary.run()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            await self.crash(exc)

    async def _deliver(self, result: BatchResult[ScoringItem]) -> None:
        assert self.runtime is not None
        info = self.runtime.info
        sends = []
        if result.error is not None or result.scores is None:
            logger.error("inference failed for a batch of %d: %r", len(result.items), result.error)
            for item in result.items:
                msg = item.event.message
                value = dead_letter(
                    Invalid("inference_error", f"inference failed: {result.error!r}"),
                    topic=msg.topic, partition=msg.partition, offset=msg.offset,
                    key=msg.key, value=msg.value, routed_at_ms=_now_ms())
                sends.append((item.event, await _send(dlq_topic.get_topic_name(), msg.key, value)))
        else:
            size = len(result.items)
            for item, score, queue_ms in zip(result.items, result.scores.tolist(), result.queue_ms,
                                             strict=True):
                value = prediction(
                    item.tx, score=score, threshold=settings.fraud_threshold, model=info.tag,
                    feature_names=info.feature_names, features=item.features,
                    queue_ms=queue_ms, infer_ms=result.infer_ms, batch_size=size)
                key = item.tx.card_id.encode()
                sends.append((item.event, await _send(predictions_topic.get_topic_name(), key, value)))
        await asyncio.gather(*(delivery for _, delivery in sends))
        for event, _ in sends:
            event.ack()


scoring = ScoringService()
app.service(scoring)  # type: ignore[arg-type]

_watermarks: dict[int, Watermark] = {}


@app.agent(transactions_topic)  # type: ignore[arg-type]  # noack() is on Stream, not StreamT
async def score_events(stream: Stream[bytes]) -> None:
    """Compute each transaction's features and hand them to the model boundary."""
    boundary = await scoring.wait_ready()
    lateness_ms = int(settings.allowed_lateness_s * 1000)
    async for event in stream.noack().events():
        msg = event.message
        tx = decode_transaction(msg.value)
        if isinstance(tx, Invalid):
            value = dead_letter(tx, topic=msg.topic, partition=msg.partition, offset=msg.offset,
                                key=msg.key, value=msg.value, routed_at_ms=_now_ms())
            _ack_when_delivered(event, await _send(dlq_topic.get_topic_name(), msg.key, value))
            continue
        watermark = _watermarks.setdefault(msg.partition, Watermark(lateness_ms))
        if watermark.is_late(tx.ts):
            value = late_record(tx, raw=msg.value, watermark=watermark.value or 0, topic=msg.topic,
                                partition=msg.partition, offset=msg.offset, routed_at_ms=_now_ms())
            _ack_when_delivered(event, await _send(late_topic.get_topic_name(), msg.key, value))
            continue
        watermark.observe(tx.ts)
        state = load_state(tx.card_id) or new_state()
        applied = apply_event(state, tx.id, tx.ts, tx.amount, tx.merchant_id,
                              allowed_lateness_ms=lateness_ms)
        if not applied.duplicate:
            store_state(tx.card_id, state)
        await boundary.submit(applied.features, ScoringItem(tx, applied.features, event))
