"""A worker with SEAM_LOG_FORMAT=json writes nothing but JSON lines, with one line per rebalance."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import orjson
import pytest

from app.localhost import free_port
from app.synthetic import TransactionGenerator
from tests.integration.kafka_helpers import Topics, Worker, collect, encode, prepare_topics, produce_raw

pytestmark = pytest.mark.integration


def test_json_logs_are_one_object_per_line(kafka_bootstrap: str, tmp_path: Path) -> None:
    topics = Topics.unique(uuid.uuid4().hex[:10])
    prepare_topics(kafka_bootstrap, topics)
    worker = Worker(kafka_bootstrap, topics.env() | {"SEAM_LOG_FORMAT": "json"}, tmp_path / "worker", free_port())
    generator = TransactionGenerator(cards=20, seed=2, late_rate=0.0, out_of_order_rate=0.0, id_prefix="lg")
    events = [next(generator)[0] for _ in range(200)]
    try:
        worker.wait_ready()
        asyncio.run(produce_raw(kafka_bootstrap, topics.input, [encode(e) for e in events]))
        asyncio.run(collect(kafka_bootstrap, [topics.predictions],
                            done=lambda out: len(out[topics.predictions]) >= len(events), timeout_s=60))
    finally:
        assert worker.stop() == 0, worker.log_tail()
    lines = [line for line in (tmp_path / "worker" / "worker.log").read_text().splitlines() if line.strip()]
    entries = []
    for line in lines:
        try:
            entries.append(orjson.loads(line))
        except orjson.JSONDecodeError:
            raise AssertionError(f"not a JSON line: {line!r}") from None
    assert all({"time", "level", "logger", "message", "worker"} <= set(e) for e in entries)
    assert not any(e["level"] == "DEBUG" for e in entries)
    messages = [e["message"] for e in entries]
    assert sum(m.startswith("rebalance: generation") for m in messages) >= 1
    assert any(m.startswith("model fraud-mlp@1 loaded") for m in messages)
