"""The broker stops and comes back mid-stream: the worker carries on by itself and loses nothing."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from app.localhost import free_port
from app.synthetic import TransactionGenerator
from tests.conftest import KAFKA_LOCAL
from tests.integration.kafka_helpers import Topics, Worker, collect_outcomes, encode, prepare_topics

pytestmark = pytest.mark.integration

TOTAL = 8_000
DOWN_S = 8.0


class Broker:
    """A broker of this test's own (the session's broker is shared and must stay up)."""

    def __init__(self, run_dir: Path) -> None:
        self.port = free_port()
        self._args = ["--port", str(self.port), "--controller-port", str(free_port()), "--run-dir", str(run_dir)]

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _run(self, command: str) -> None:
        done = subprocess.run([sys.executable, str(KAFKA_LOCAL), command, *self._args], capture_output=True,
                              text=True)
        assert done.returncode == 0, f"kafka_local {command} failed:\n{done.stdout}\n{done.stderr}"

    def up(self) -> None:
        self._run("up")

    def down(self) -> None:
        self._run("down")


async def produce_paced(bootstrap: str, topic: str, events: list[dict[str, Any]], rate: float = 500.0) -> None:
    """Produce at a steady rate with one producer that waits out the broker's absence.

    Idempotent: a produce request the broker wrote but did not answer before it went away is retried,
    and without idempotence the retry writes the records twice (an input repeated, not an output).
    """
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5, request_timeout_ms=60_000,
                                enable_idempotence=True)
    await producer.start()
    try:
        started, futures = time.monotonic(), []
        for index, event in enumerate(events):
            key, value = encode(event)
            futures.append(await producer.send(topic, value, key=key))
            delay = started + index / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    broker = Broker(tmp_path / "kafka")
    broker.up()
    try:
        yield broker
    finally:
        broker.down()


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
def test_worker_rides_out_a_broker_restart(broker: Broker, tmp_path: Path, guarantee: str) -> None:
    topics = Topics.unique(uuid.uuid4().hex[:10])
    prepare_topics(broker.bootstrap, topics)
    generator = TransactionGenerator(cards=50, seed=41, late_rate=0.01, id_prefix="br")
    events = [next(generator)[0] for _ in range(TOTAL)]  # every id once: a duplicate output is a duplicate
    env = topics.env() | {"SEAM_PROCESSING_GUARANTEE": guarantee}
    worker = Worker(broker.bootstrap, env, tmp_path / "w0", free_port())
    try:
        worker.wait_ready()
        producer = threading.Thread(target=asyncio.run, args=(produce_paced(broker.bootstrap, topics.input, events),))
        producer.start()  # ~16 s of input; the broker goes away a few seconds in
        time.sleep(4.0)
        broker.down()
        time.sleep(DOWN_S)
        assert worker.proc.poll() is None, f"the worker exited while the broker was down:\n{worker.log_tail()}"
        broker.up()
        producer.join()
        all_ids = {e["id"] for e in events}
        out = asyncio.run(collect_outcomes(broker.bootstrap, topics, all_ids, timeout_s=120,
                                           read_committed=guarantee == "exactly_once"))
        assert worker.proc.poll() is None, f"the worker exited:\n{worker.log_tail()}"
    finally:
        code = worker.stop()
    scored = Counter(p["id"] for p in out[topics.predictions])
    late = Counter(r["event"]["id"] for r in out[topics.late])
    assert set(scored) | set(late) == all_ids, "a transaction was lost"
    assert not out[topics.dlq]
    duplicates = sum(scored.values()) - len(scored) + sum(late.values()) - len(late)
    print(f"\nbroker restart ({guarantee}): {len(events)} inputs, broker down {DOWN_S:.0f} s, "
          f"{duplicates} duplicate outputs")
    if guarantee == "exactly_once":
        assert duplicates == 0, f"{duplicates} outputs were committed twice"
    assert code == 0, worker.log_tail()
