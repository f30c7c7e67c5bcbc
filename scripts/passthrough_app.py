#!/usr/bin/env python3
"""A minimal Faust app for measuring and testing ingestion: decode each record, produce a small one.

    python scripts/passthrough_app.py worker -l warn --without-web

Environment: PT_BROKER (kafka://127.0.0.1:9092), PT_APP_ID, PT_INPUT, PT_OUTPUT, PT_DATA_DIR,
PT_MODE (``batch``: seam's batch ingestion, acknowledging after delivery; ``take``: a Faust agent
using ``stream.take(512)``, Faust acknowledging each event), PT_FAIL_OFFSET (batch mode: the handler
raises on the batch holding this offset of partition 0, to test that a failed batch is not
acknowledged), PT_REVOKE_DELAY_S (batch mode: the revoke hook waits this long, logging
``revoke hook holding``, so a test can stop the worker in the middle of a rebalance). The output
value is ``{"p": partition, "o": offset, "id": <input id>}``.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

import faust
import orjson

from agents.commit.checkpoint import Checkpoint
from agents.commit.guarantee import AtLeastOnce
from agents.ingest import consumer as ingest
from agents.ingest.records import RecordBatch
from agents.observe.metrics import BoundaryMetrics
from tables.cache import StateCache

MODE = os.environ.get("PT_MODE", "batch")
FAIL_OFFSET = int(os.environ.get("PT_FAIL_OFFSET", "-1"))
REVOKE_DELAY_S = float(os.environ.get("PT_REVOKE_DELAY_S", "0"))
logger = logging.getLogger("passthrough")

BROKER = os.environ.get("PT_BROKER", "kafka://127.0.0.1:9092")
app = faust.App(
    os.environ.get("PT_APP_ID", "passthrough"),
    broker=BROKER,
    store="memory://",
    datadir=os.environ.get("PT_DATA_DIR", ".data/passthrough"),
    key_serializer="raw",
    value_serializer="raw",
    broker_max_poll_records=2000,
    producer_acks=-1,
    consumer_auto_offset_reset="earliest",
    stream_wait_empty=False,
    autodiscover=False,
)
input_topic = app.topic(os.environ.get("PT_INPUT", "pt-in"))
OUTPUT = os.environ.get("PT_OUTPUT", "pt-out")


def transform(partition: int, offset: int, value: bytes | None) -> bytes:
    tx_id = orjson.loads(value).get("id") if value else None
    return orjson.dumps({"p": partition, "o": offset, "id": tx_id})


async def send(key: bytes | None, value: bytes) -> Any:
    return await app.producer.send(OUTPUT, key, value, partition=None, timestamp=None, headers=None)


in_flight: set[asyncio.Future[Any]] = set()



class InFlight:
    """The outputs on their way, as a commit sees them: this app keeps no state."""

    metrics = BoundaryMetrics()
    cache: StateCache | None = None

    @property
    def should_stop(self) -> bool:
        return bool(app.should_stop)

    async def deliver_in_flight(self) -> None:
        if REVOKE_DELAY_S:
            logger.warning("revoke hook holding for %.1f s", REVOKE_DELAY_S)
            await asyncio.sleep(REVOKE_DELAY_S)
        await self.delivered()

    async def delivered(self) -> None:
        if in_flight:
            await asyncio.wait(list(in_flight))

    async def crash(self, reason: BaseException) -> None:
        await app.crash(reason)


if MODE == "batch":
    # No state, so nothing of the guarantee but the offsets it commits (its producers are never started).
    guarantee = AtLeastOnce(bootstrap=BROKER.removeprefix("kafka://"), input_topic=input_topic.get_topic_name())
    ingestion = ingest.install(app, Checkpoint(app, guarantee, InFlight()))

    @ingestion.batch_agent(app, input_topic)
    async def passthrough_batches(batch: RecordBatch) -> None:
        if batch.partition == 0 and any(r.offset == FAIL_OFFSET for r in batch.records):
            raise RuntimeError(f"PT_FAIL_OFFSET {FAIL_OFFSET} reached")
        futures = [await send(r.key, transform(r.partition, r.offset, r.value)) for r in batch.records]
        offsets = [r.offset for r in batch.records]
        done = asyncio.gather(*futures)
        in_flight.add(done)
        done.add_done_callback(in_flight.discard)
        done.add_done_callback(lambda f: batch.ack(offsets) if f.exception() is None else None)

else:

    @app.agent(input_topic)
    async def passthrough_take(stream: faust.Stream[bytes]) -> None:
        async for events in stream.take_events(512, within=0.05):
            futures = [await send(e.message.key, transform(e.message.partition, e.message.offset, e.value))
                       for e in events]
            await asyncio.gather(*futures)


if __name__ == "__main__":
    app.main()
