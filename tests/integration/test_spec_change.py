"""A worker started with a feature spec its stored state cannot serve stops with a message that says why."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from itertools import islice
from pathlib import Path

import pytest

from app.localhost import free_port
from app.synthetic import TransactionGenerator
from specs import EXAMPLE_SPEC
from tests.integration.kafka_helpers import Topics, Worker, collect, encode, prepare_topics, produce_raw

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def test_a_spec_that_reads_a_field_the_state_does_not_keep_is_refused(kafka_bootstrap: str, tmp_path: Path) -> None:
    topics = Topics.unique(uuid.uuid4().hex[:10])
    prepare_topics(kafka_bootstrap, topics)
    records = [tx for tx, _ in islice(TransactionGenerator(cards=50, seed=4, late_rate=0.0, id_prefix="sc"), 300)]
    asyncio.run(produce_raw(kafka_bootstrap, topics.input, [encode(tx) for tx in records]))
    data_dir = tmp_path / "worker"
    worker = Worker(kafka_bootstrap, topics.env(), data_dir, free_port())
    try:
        worker.wait_ready()
        out = asyncio.run(collect(kafka_bootstrap, [topics.predictions],
                                  done=lambda o: len(o[topics.predictions]) >= len(records), timeout_s=120))
        assert {p["id"] for p in out[topics.predictions]} == {tx["id"] for tx in records}
    finally:
        assert worker.stop() == 0, worker.log_tail()

    # The example spec and one more feature, over a field its states do not keep (and a model that takes it).
    spec = tmp_path / "with-countries.toml"
    spec.write_text(EXAMPLE_SPEC.read_text().replace(
        'country = { type = "string", optional = true, max_chars = 128 }',
        'country = { type = "string", optional = true, default = "none", max_chars = 128 }')
        + '\n[[features]]\nname = "countries_1h"\nop = "distinct"\nfield = "country"\nwindow = "1h"\n')
    model = tmp_path / "with-countries.onnx"
    subprocess.run([sys.executable, "scripts/train_model.py", "--spec", str(spec), "--events", "20000", "--epochs",
                    "1", "--out", str(model)], cwd=ROOT, check=True, capture_output=True, timeout=120)
    changed = Worker(kafka_bootstrap, topics.env() | {"SEAM_FEATURE_SPEC": str(spec), "SEAM_MODEL_PATH": str(model)},
                     data_dir, free_port())
    try:
        changed.wait_ready()
        later = [tx for tx, _ in islice(TransactionGenerator(cards=50, seed=5, late_rate=0.0, id_prefix="sd",
                                                             start_ms=records[-1]["ts"] + 1), 100)]
        asyncio.run(produce_raw(kafka_bootstrap, topics.input, [encode(tx) for tx in later]))
        deadline = time.monotonic() + 60
        while changed.running() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not changed.running(), "the worker kept running on state it cannot serve"
        log = changed.log_tail(200)
        assert "cannot serve feature spec 'fraud'" in log, log
        assert "read country, which the state does not keep" in log and "SEAM_APP_ID" in log, log
    finally:
        changed.stop()
