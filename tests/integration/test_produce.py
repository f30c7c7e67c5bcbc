"""`seam produce` writes an example spec's synthetic stream: records its spec accepts, keyed by its key field."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest

from agents.formats.codec import Contract, Event, JsonInput
from app.loadgen import produce
from app.localhost import worker_env
from app.synthetic import TransactionGenerator
from specs import SPECS
from tables.spec import load_spec
from tests.integration.kafka_helpers import collect

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["fraud", "sensors"])
def test_seam_produce_writes_the_spec_s_stream_keyed_by_its_key(kafka_bootstrap: str, name: str) -> None:
    spec = load_spec(SPECS / f"{name}.toml")
    topic = f"produce-{name}-{uuid.uuid4().hex[:8]}"
    env = worker_env({"SEAM_BROKER_URL": f"kafka://{kafka_bootstrap}", "SEAM_FEATURE_SPEC": str(SPECS / f"{name}.toml"),
                      "SEAM_TOPIC_PARTITIONS": "2"})
    done = subprocess.run([sys.executable, "-m", "app", "produce", "--rate", "300", "--duration", "1", "--keys", "20",
                           "--topic", topic, "--seed", "3"], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"sent 300 {name} records" in done.stdout, done.stdout

    def raw(_topic: str, key: bytes | None, value: bytes) -> dict[str, Any]:
        return {"key": key, "value": value}

    out = asyncio.run(collect(kafka_bootstrap, [topic], done=lambda o: len(o[topic]) >= 300, timeout_s=60,
                              settle_s=0.5, decode=raw))[topic]
    assert len(out) == 300
    decode = JsonInput(Contract(spec)).decode
    for record in out:
        event = decode(record["value"])
        assert isinstance(event, Event), (record, event)
        assert record["key"] == orjson.loads(record["value"])[spec.key].encode() == event.key.encode()


def test_a_prepared_run_sends_the_same_records_on_the_same_schedule(kafka_bootstrap: str) -> None:
    """``produce(prepare=True)`` draws and encodes every record first: the same records, keys and partitions."""
    def raw(_topic: str, key: bytes | None, value: bytes) -> dict[str, Any]:
        return {"key": key, "value": value}

    async def run(prepare: bool) -> tuple[list[tuple[bytes | None, bytes]], list[int]]:
        topic = f"produce-prepared-{uuid.uuid4().hex[:8]}"
        stamps: list[int] = []
        report = await produce(kafka_bootstrap, topic, rate=2000, duration_s=0.5, partitions=3, prepare=prepare,
                               generator=TransactionGenerator(cards=50, seed=5, late_rate=0.0),
                               on_sent=lambda _tx, ts_ms: stamps.append(ts_ms))
        assert report.sent == 1000 and report.cpu_s > 0
        out = (await collect(kafka_bootstrap, [topic], done=lambda o: len(o[topic]) >= 1000, timeout_s=60,
                             settle_s=0.5, decode=raw))[topic]
        return sorted(((r["key"], r["value"]) for r in out), key=lambda kv: orjson.loads(kv[1])["id"]), stamps

    live, live_stamps = asyncio.run(run(prepare=False))
    prepared, prepared_stamps = asyncio.run(run(prepare=True))
    assert len(prepared) == 1000 and prepared == live
    for stamps in (live_stamps, prepared_stamps):
        assert len(stamps) == 1000 and stamps == sorted(stamps)
        # The schedule: 1,000 records at 2,000/s take about half a second from the first to the last.
        assert 300 <= stamps[-1] - stamps[0] < 5000
