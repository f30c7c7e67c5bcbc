"""A model that fails on some rows: the other rows are scored, the failing ones are dead-lettered."""

from __future__ import annotations

import asyncio
import random
import re
import uuid
from pathlib import Path

import orjson
import pytest

from app.localhost import free_port
from app.synthetic import TransactionGenerator
from tests.integration.kafka_helpers import Topics, Worker, collect, encode, prepare_topics, produce_raw
from tests.poison_model import POISON_AMOUNT, write_poison_model

pytestmark = pytest.mark.integration


def test_poison_rows_are_isolated_and_dead_lettered(kafka_bootstrap: str, tmp_path: Path) -> None:
    topics = Topics.unique(uuid.uuid4().hex[:10])
    prepare_topics(kafka_bootstrap, topics)
    generator = TransactionGenerator(cards=40, seed=5, late_rate=0.0, out_of_order_rate=0.0, id_prefix="ps")
    events = [next(generator)[0] for _ in range(400)]
    rng = random.Random(1)
    poison_ids = []
    for i in range(3):
        # A card of its own, so only this row carries the marked amount in its 60 s window.
        donor = events[rng.randrange(50, len(events))]
        poison = dict(donor, id=f"poison-{i}", card_id=f"poison-card-{i}", amount=POISON_AMOUNT)
        events.insert(events.index(donor) + 1, poison)
        poison_ids.append(poison["id"])
    asyncio.run(produce_raw(kafka_bootstrap, topics.input, [encode(e) for e in events]))
    env = topics.env() | {"SEAM_MODEL_PATH": str(write_poison_model(tmp_path / "poison.onnx")),
                          "SEAM_MAX_WAIT_MS": "20"}
    worker = Worker(kafka_bootstrap, env, tmp_path / "worker", free_port())
    good = {e["id"] for e in events} - set(poison_ids)
    try:
        worker.wait_ready()
        out = asyncio.run(collect(
            kafka_bootstrap, [topics.predictions, topics.dlq],
            done=lambda o: {p["id"] for p in o[topics.predictions]} >= good and len(o[topics.dlq]) >= 3,
            timeout_s=90))
        metrics = worker.get("/metrics")[1].decode()
        batcher = orjson.loads(worker.get("/batcher/")[1])
    finally:
        assert worker.stop() == 0, worker.log_tail()
    assert {p["id"] for p in out[topics.predictions]} == good
    letters = out[topics.dlq]
    assert sorted(orjson.loads(d["value"])["id"] for d in letters) == sorted(poison_ids)
    assert all(d["reason"] == "inference_error" and "Gather" in d["message"] for d in letters)
    batch_sizes = {p["timing"]["batch_size"] for p in out[topics.predictions]}
    assert max(batch_sizes) > 1, "poison rows were isolated inside real batches"
    assert re.search(r'^seam_inference_failed_rows_total\{model="[^"]+",version="[^"]+"\} 3\.0$', metrics, re.M)
    assert f'seam_events_out_total{{topic="{topics.dlq}",topic_kind="dead_letter"}} 3.0' in metrics
    assert 'seam_dead_letters_total{reason="inference_error"} 3.0' in metrics
    assert batcher["stats"]["failed_rows"] == 3 and batcher["adaptive"] is True
