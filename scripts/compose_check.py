"""Run inside the compose network (``docker-compose run -T --entrypoint python worker - < scripts/compose_check.py``):
say whether every input record was answered, as one JSON line.

Reads the input topic from its start to its current end, then the outputs (predictions, late records, dead
letters) until every input's id is among them or ``CHECK_TIMEOUT_S`` passes. Connects as the worker's settings
say (``SEAM_*``: TLS and SASL on a secured cluster, as a principal that may read all of those topics), or to
``CHECK_BOOTSTRAP`` in plaintext. Uses only what the worker image has (seam's own package, aiokafka, orjson).
"""

import asyncio
import os
import sys
import time
from collections import Counter

import orjson
from aiokafka import AIOKafkaConsumer

from app.settings import Settings
from tables.kafka import Connection, assign_all, client_options

KAFKA = Connection(os.environ["CHECK_BOOTSTRAP"]) if "CHECK_BOOTSTRAP" in os.environ else Settings.from_env().kafka
INPUT = os.environ.get("CHECK_INPUT", "transactions")
OUTPUTS = {"prediction": os.environ.get("CHECK_PREDICTIONS", "predictions"),
           "late": os.environ.get("CHECK_LATE", "transactions-late"),
           "dead_letter": os.environ.get("CHECK_DLQ", "transactions-dlq")}
TIMEOUT_S = float(os.environ.get("CHECK_TIMEOUT_S", "120"))


async def read_to_end(consumer: AIOKafkaConsumer, topic: str, deadline: float) -> list[bytes]:
    """Every record of ``topic`` up to its end offsets as they are now."""
    partitions = await assign_all(consumer, KAFKA, [topic], from_end=False)
    ends = await consumer.end_offsets(partitions)
    values: list[bytes] = []
    while time.monotonic() < deadline:
        for records in (await consumer.getmany(timeout_ms=500, max_records=20_000)).values():
            values += [r.value for r in records]
        if all([await consumer.position(tp) >= ends[tp] for tp in partitions]):
            break
    return values


def event_id(kind: str, value: bytes) -> str:
    record = orjson.loads(value)
    if kind == "prediction":
        return record["id"]
    if kind == "late":
        return record["event"]["id"]
    return orjson.loads(record["value"])["id"]  # a dead letter's original JSON


async def main() -> int:
    deadline = time.monotonic() + TIMEOUT_S
    consumer = AIOKafkaConsumer(**client_options(KAFKA), enable_auto_commit=False)
    await consumer.start()
    try:
        inputs = [orjson.loads(v) for v in await read_to_end(consumer, INPUT, deadline)]
        ids = {tx["id"] for tx in inputs}
        kinds = {topic: kind for kind, topic in OUTPUTS.items()}
        counts: Counter[str] = Counter()
        answered: set[str] = set()
        predicted: set[str] = set()
        await assign_all(consumer, KAFKA, list(OUTPUTS.values()), from_end=False)
        while time.monotonic() < deadline and not ids <= answered:
            for tp, records in (await consumer.getmany(timeout_ms=500, max_records=20_000)).items():
                kind = kinds[tp.topic]
                for record in records:
                    event = event_id(kind, record.value)
                    answered.add(event)
                    counts[kind] += 1
                    if kind == "prediction":
                        predicted.add(event)
        missing = ids - answered
        cards = Counter(tx["card_id"] for tx in inputs).most_common(3)
        print(orjson.dumps({
            "inputs": len(inputs), "distinct_ids": len(ids), "unanswered": len(missing),
            "sample_unanswered": sorted(missing)[:10], "outputs": dict(counts),
            "predicted_ids": len(predicted), "cards": [card for card, _n in cards],
        }).decode(), flush=True)
        return 0 if not missing else 1
    finally:
        await consumer.stop()


sys.exit(asyncio.run(main()))
