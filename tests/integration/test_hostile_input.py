"""Records written to hurt: a worker fed them stays up, dead-letters each with its reason, and scores the rest."""

from __future__ import annotations

import asyncio
import base64
import time
import uuid
from pathlib import Path

import orjson
import pytest

from agents.model import control
from agents.model.deployment import Deployment, ModelRef
from app.localhost import free_port
from app.synthetic import TransactionGenerator
from tests.integration.kafka_helpers import (
    Topics,
    Worker,
    collect,
    collect_outcomes,
    encode,
    prepare_topics,
    produce_raw,
)

pytestmark = pytest.mark.integration


def test_huge_keys_and_unprintable_ids_are_dead_lettered_and_the_worker_stays_up(kafka_bootstrap: str,
                                                                                 tmp_path: Path) -> None:
    """All at once: a 900 KB key with an empty value (its dead letter, the key twice and escaped, would pass the
    broker's 1 MiB limit: the worker stopped, and met it again after each restart), a 300 KB key of NUL bytes
    with a valid value, a card id "c-1\\x00c0" (its header was card c-1's chunk 0 in the table), an id with a
    newline, a transaction stamped in 2200 (it silenced its partition), and a deployment record naming
    /dev/zero (read whole, it grew a worker to 23.7 GB)."""
    topics = Topics.unique(uuid.uuid4().hex[:10])
    prepare_topics(kafka_bootstrap, topics)
    generator = TransactionGenerator(cards=30, seed=9, late_rate=0.0, out_of_order_rate=0.0, id_prefix="hi")
    valid = [next(generator)[0] for _ in range(300)]
    template = valid[0]
    hostile = [
        (b"k" * 900_000, None, "empty_value"),
        # The value is fine, and on time on whichever partition the key sends it to: scored.
        (b"\x00" * 300_000, orjson.dumps(dict(template, id="hi-nul-key", ts=valid[-1]["ts"])), None),
        (b"c-1\x00c0", orjson.dumps(dict(template, id="hi-nul-card", card_id="c-1\x00c0")), "unprintable"),
        (b"c-2", orjson.dumps(dict(template, id="hi-new\nline", card_id="c-2")), "unprintable"),
        (template["card_id"].encode(), orjson.dumps(dict(template, id="hi-2200", ts=7_258_118_400_000)),
         "future_timestamp"),
    ]
    headers = [("trace-id", b"\x00\x01t-9"), ("source", b"pos-7")]
    records = [encode(tx) for tx in valid[:150]] + [(key, value, headers) for key, value, reason in hostile if reason]
    # Last: its event time is the stream's newest, which raises its partition's watermark.
    records += [encode(tx) for tx in valid[150:]] + [(key, value) for key, value, reason in hostile if not reason]
    asyncio.run(produce_raw(kafka_bootstrap, topics.input, records))
    scored = {tx["id"] for tx in valid} | {"hi-nul-key"}
    env = topics.env() | {"SEAM_MODEL_CONTROL_TOPIC": f"ctl-{topics.app_id}"}
    worker = Worker(kafka_bootstrap, env, tmp_path / "worker", free_port())
    try:
        worker.wait_ready()
        asyncio.run(control.write(kafka_bootstrap, env["SEAM_MODEL_CONTROL_TOPIC"],
                                  Deployment(revision=1, primary=ModelRef("/dev/zero", "0" * 64), command="deploy")))
        out = asyncio.run(collect(
            kafka_bootstrap, [topics.predictions, topics.dlq],
            done=lambda o: {p["id"] for p in o[topics.predictions]} >= scored and len(o[topics.dlq]) >= 4,
            timeout_s=120))
        deadline = time.monotonic() + 60
        while (model := orjson.loads(worker.get("/model/")[1]))["deployment"]["rejected"] is None:
            assert time.monotonic() < deadline, model
            time.sleep(0.2)
        assert model["deployment"]["rejected"]["reason"] == "outside_model_dir", model
        assert model["deployment"]["revision"] == 0  # still serving SEAM_MODEL_PATH
        assert worker.running(), worker.log_tail()
    finally:
        assert worker.stop() == 0, worker.log_tail()
    assert {p["id"] for p in out[topics.predictions]} == scored
    letters = out[topics.dlq]
    assert sorted(d["reason"] for d in letters) == sorted(reason for _, _, reason in hostile if reason), letters
    huge = next(d for d in letters if d["reason"] == "empty_value")
    assert huge["key_truncated"] is True and huge["key_size"] == 900_000 and len(huge["key"]) == 1024
    messages = sorted(d["message"] for d in letters if d["reason"] == "unprintable")
    assert "'card_id' holds U+0000 at position 3" in messages[0] and "'id' holds U+000A at position 6" in messages[1]
    assert not any(d["key_truncated"] for d in letters if d["reason"] == "unprintable")
    # Each letter keeps its record's Kafka headers, so a replay can send them again.
    assert all(d["headers"] == [["trace-id", base64.b64encode(b"\x00\x01t-9").decode()],
                                ["source", base64.b64encode(b"pos-7").decode()]] for d in letters), letters


def test_a_record_from_the_future_moves_no_watermark_before_or_after_a_restart(kafka_bootstrap: str,
                                                                               tmp_path: Path) -> None:
    """A valid transaction stamped in 2200 (a terminal with a wrong clock) amid a card's stream. It raised its
    partition's watermark to 2200, so every later event there went to the late topic, and again after a restart
    (570 of the next 2,000 on 4 partitions). Now it is a dead letter, and everything before and after the
    restart is scored."""
    topics = Topics.unique(uuid.uuid4().hex[:10])
    prepare_topics(kafka_bootstrap, topics)
    generator = TransactionGenerator(cards=30, seed=11, late_rate=0.0, out_of_order_rate=0.0, id_prefix="fu")
    valid = [next(generator)[0] for _ in range(400)]
    future = dict(valid[0], id="fu-2200", ts=7_258_118_400_000)
    first = [encode(tx) for tx in valid[:100]] + [encode(future)] + [encode(tx) for tx in valid[100:200]]
    asyncio.run(produce_raw(kafka_bootstrap, topics.input, first))
    data = tmp_path / "worker"
    for phase, batch in enumerate((valid[:200], valid[200:])):
        if phase:
            asyncio.run(produce_raw(kafka_bootstrap, topics.input, [encode(tx) for tx in batch]))
        worker = Worker(kafka_bootstrap, topics.env(), data, free_port())  # the same folder: a restart
        try:
            worker.wait_ready()
            expected = {tx["id"] for tx in valid[:200 * (phase + 1)]}
            out = asyncio.run(collect_outcomes(kafka_bootstrap, topics, expected, timeout_s=120))
        finally:
            assert worker.stop() == 0, worker.log_tail()
        assert out[topics.late] == []
        assert {p["id"] for p in out[topics.predictions]} >= {tx["id"] for tx in batch}
    letters = out[topics.dlq]
    assert [(d["reason"], orjson.loads(d["value"])["id"]) for d in letters] == [("future_timestamp", "fu-2200")]
    assert "ahead of the record's Kafka timestamp" in letters[0]["message"] and letters[0]["offset"] >= 0
