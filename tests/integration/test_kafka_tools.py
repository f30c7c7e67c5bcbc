"""Kafka's own command-line tools against a worker's group and topics (``make kafka-tool``)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from pathlib import Path

import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.localhost import free_port
from app.synthetic import TransactionGenerator
from tests.conftest import KAFKA_LOCAL
from tests.integration.kafka_helpers import Topics, Worker, encode, prepare_topics, produce_raw

pytestmark = pytest.mark.integration


def tool(bootstrap: str, *args: str) -> str:
    done = subprocess.run([sys.executable, str(KAFKA_LOCAL), "tool", *args, "--bootstrap-server", bootstrap],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def describe(bootstrap: str, group: str, topic: str) -> dict[int, dict[str, str]]:
    """``kafka-consumer-groups --describe``'s rows for ``topic``, by partition."""
    lines = [line.split() for line in tool(bootstrap, "kafka-consumer-groups", "--describe", "--group", group)
             .splitlines() if line.strip()]
    header = next(line for line in lines if line[:2] == ["GROUP", "TOPIC"])
    rows = [dict(zip(header, line, strict=False)) for line in lines if line[:2] == [group, topic]]
    return {int(row["PARTITION"]): row for row in rows}


def lag_metric(worker: Worker) -> dict[int, float]:
    text = worker.get("/metrics")[1].decode()
    return {int(s.labels["partition"]): s.value for f in text_string_to_metric_families(text) for s in f.samples
            if s.name == "seam_consumer_lag_records"}


def test_consumer_groups_describe_and_the_console_consumer_see_the_worker(kafka_bootstrap: str,
                                                                          tmp_path: Path) -> None:
    topics = Topics.unique(uuid.uuid4().hex[:10])
    prepare_topics(kafka_bootstrap, topics)
    generator = TransactionGenerator(cards=100, seed=4, late_rate=0.0, out_of_order_rate=0.0, id_prefix="kt")
    events = [next(generator)[0] for _ in range(1200)]
    worker = Worker(kafka_bootstrap, topics.env() | {"SEAM_COMMIT_INTERVAL_S": "0.5"}, tmp_path / "worker",
                    free_port())
    try:
        worker.wait_ready()
        asyncio.run(produce_raw(kafka_bootstrap, topics.input, [encode(e) for e in events]))
        # Kafka's view and the worker's agree once every input is handled and committed: no lag.
        deadline = time.monotonic() + 90
        while True:
            rows = describe(kafka_bootstrap, topics.app_id, topics.input)
            caught_up = len(rows) == 4 and all(row["LAG"] == "0" for row in rows.values())
            if caught_up and lag_metric(worker) == {p: 0.0 for p in range(4)}:
                break
            assert time.monotonic() < deadline, f"kafka-consumer-groups: {rows}; worker: {lag_metric(worker)}"
            time.sleep(1.0)
        assert sum(int(row["LOG-END-OFFSET"]) for row in rows.values()) == len(events)
        assert all(row["CURRENT-OFFSET"] == row["LOG-END-OFFSET"] for row in rows.values())
        # Stopped, the worker's committed offsets stay: new records show as lag in Kafka's tool.
        assert worker.stop() == 0, worker.log_tail()
        asyncio.run(produce_raw(kafka_bootstrap, topics.input, [encode(next(generator)[0]) for _ in range(40)]))
        after = describe(kafka_bootstrap, topics.app_id, topics.input)
        assert sum(int(row["LAG"]) for row in after.values()) == 40
        printed = tool(kafka_bootstrap, "kafka-console-consumer", "--topic", topics.predictions, "--from-beginning",
                       "--max-messages", "5", "--formatter-property", "print.key=true",
                       "--formatter-property", "key.separator=|")
        lines = printed.strip().splitlines()
        assert len(lines) == 5
        for line in lines:
            key, value = line.split("|", 1)
            prediction = orjson.loads(value)
            assert prediction["card_id"] == key and 0.0 <= prediction["score"] <= 1.0
    finally:
        if worker.proc.poll() is None:
            assert worker.stop() == 0, worker.log_tail()
