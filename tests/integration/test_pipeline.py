"""End to end against the real broker: one worker scores a stream, routes bad and late records."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections import Counter
from typing import Any

import orjson
import pytest

from app.localhost import free_port
from app.synthetic import TransactionGenerator
from tables.features import DEFAULT_SPEC
from tables.kafka import partition_of
from tests.integration.kafka_helpers import (
    Topics,
    Worker,
    collect,
    encode,
    prepare_topics,
    produce_raw,
    with_features,
)
from tests.reference import Late, Scored, replay

pytestmark = pytest.mark.integration

VALID = 1000
MALFORMED: list[tuple[bytes | None, bytes | None, str]] = [
    (b"c-1", b'{"id": "bad-1", "card_id": "c-1", "ts": 17', "invalid_json"),
    (b"c-1", b"[1, 2, 3]", "not_an_object"),
    (b"c-2", b'{"id": "bad-3", "card_id": "c-2", "ts": 1764500000123, "merchant_id": "m"}', "missing_field"),
    (b"c-2", b'{"id": "bad-4", "card_id": "c-2", "ts": "yesterday", "amount": 1, "merchant_id": "m"}',
     "wrong_type"),
    (b"c-3", b'{"id": "bad-5", "card_id": "c-3", "ts": 1764500000123, "amount": NaN, "merchant_id": "m"}',
     "not_finite"),
    (b"c-3", b'{"id": "bad-6", "card_id": "c-3", "ts": 1764500000123, "amount": 1e999, "merchant_id": "m"}',
     "not_finite"),
    (None, b"", "empty_value"),
    (b"c-4", b"\xff\xfe\x00garbage", "invalid_json"),
]


def stream_with_late_and_duplicates(count: int, seed: int, prefix: str, cards: int = 50) -> list[dict[str, Any]]:
    """Synthetic transactions (some out of order, some late) with a few redelivered duplicates.

    Each card transacts every 10-60 minutes of event time, so the stream advances about
    ``1,500 s / cards`` of event time per event (30 s with 50 cards).
    """
    generator = TransactionGenerator(cards=cards, seed=seed, late_rate=0.01, id_prefix=prefix)
    events = [next(generator)[0] for _ in range(count)]
    rng = random.Random(seed)
    for _ in range(count // 100):
        original = rng.randrange(len(events) - 10)
        events.insert(original + rng.randint(1, 10), dict(events[original]))
    return events


def with_partitions(events: list[dict[str, Any]], partitions: int) -> list[dict[str, Any]]:
    """Attach the partition Kafka's default partitioner gives each card id (as the producer does)."""
    return [e | {"partition": partition_of(e["card_id"].encode(), partitions)} for e in events]


@pytest.fixture(scope="module", params=["batch", "stream"])
def run(
    request: pytest.FixtureRequest, kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, Any]:
    """Produce valid, late, duplicate and malformed records, run one worker, collect every output."""
    topics = Topics.unique(uuid.uuid4().hex[:10])
    prepare_topics(kafka_bootstrap, topics)
    events = stream_with_late_and_duplicates(VALID, seed=11, prefix="it")
    records: list[tuple[bytes | None, bytes | None]] = [encode(tx) for tx in events]
    rng = random.Random(3)
    for key, value, _reason in MALFORMED:
        records.insert(rng.randrange(len(records)), (key, value))
    asyncio.run(produce_raw(kafka_bootstrap, topics.input, records))
    expected = replay(with_partitions(events, 4), allowed_lateness_ms=60_000)
    scored = sum(isinstance(o, Scored) for o in expected)

    env = topics.env() | {"SEAM_INGEST": request.param}
    worker = Worker(kafka_bootstrap, env, tmp_path_factory.mktemp("worker"), free_port())
    try:
        worker.wait_ready()
        outputs = asyncio.run(collect(
            kafka_bootstrap, [topics.predictions, topics.features, topics.dlq, topics.late],
            done=lambda out: (len(out[topics.predictions]) >= scored and len(out[topics.dlq]) >= len(MALFORMED)
                              and len(out[topics.late]) >= len(expected) - scored
                              and len(out[topics.features]) >= scored),
            timeout_s=120))
        outputs["joined"] = with_features(outputs, topics)
        model_view = orjson.loads(worker.get("/model/")[1])
        card = events[0]["card_id"]
        features_view = worker.get(f"/features/{card}/")
        unknown_card_view = worker.get("/features/no-such-card/")
        health_view = worker.get("/healthz")
    finally:
        code = worker.stop()
    return {
        "topics": topics, "events": events, "expected": expected, "outputs": outputs, "model_view": model_view,
        "features_view": features_view, "unknown_card_view": unknown_card_view, "health_view": health_view,
        "exit_code": code,
        "log": worker.log_tail(200),
    }


def test_every_transaction_is_scored_or_late_as_the_reference_says(run: dict[str, Any]) -> None:
    topics, events, expected = run["topics"], run["events"], run["expected"]
    want_scored = Counter(e["id"] for e, o in zip(events, expected, strict=True) if isinstance(o, Scored))
    want_late = Counter(e["id"] for e, o in zip(events, expected, strict=True) if isinstance(o, Late))
    assert Counter(p["id"] for p in run["outputs"][topics.predictions]) == want_scored, run["log"]
    assert Counter(r["event"]["id"] for r in run["outputs"][topics.late]) == want_late
    assert len(want_late) >= 3, "the stream should exercise the late path"
    assert sum(want_scored.values()) > len(want_scored), "the stream should exercise redeliveries"


def test_predictions_carry_score_model_and_timing_and_the_feature_log_their_features(run: dict[str, Any]) -> None:
    topics = run["topics"]
    for p in run["outputs"][topics.predictions]:
        assert set(p) == {"id", "card_id", "ts", "score", "is_fraud", "model", "timing", "_kafka_ts"}
        assert 0.0 <= p["score"] <= 1.0
        assert p["is_fraud"] == (p["score"] >= 0.5)
        assert p["model"] == "fraud-mlp@1"
        assert set(p["timing"]) == {"queue_ms", "infer_ms", "batch_size"}
        assert 1 <= p["timing"]["batch_size"] <= 256
    assert Counter(f["id"] for f in run["outputs"][topics.features]) == Counter(
        p["id"] for p in run["outputs"][topics.predictions])
    for f in run["outputs"][topics.features]:
        assert f["feature_set"] == DEFAULT_SPEC.version and len(f["features"]) == len(DEFAULT_SPEC.names)


def test_features_match_the_independent_reference(run: dict[str, Any]) -> None:
    reference: dict[str, dict[str, float]] = {}
    for event, outcome in zip(run["events"], run["expected"], strict=True):
        if isinstance(outcome, Scored):
            reference.setdefault(event["id"], outcome.features)
    for p in run["outputs"]["joined"]:
        assert p["features"] == pytest.approx(reference[p["id"]], rel=1e-9), p["id"]


def test_model_learned_the_fraud_bursts(run: dict[str, Any]) -> None:
    predictions = run["outputs"][run["topics"].predictions]
    flagged = sum(p["is_fraud"] for p in predictions)
    # The synthetic stream has a few percent fraud: a model flagging nothing or everything is broken.
    assert 0 < flagged < len(predictions) * 0.2


def test_malformed_records_reach_the_dead_letter_topic_with_reason_and_source(run: dict[str, Any]) -> None:
    topics = run["topics"]
    letters = run["outputs"][topics.dlq]
    assert sorted(d["reason"] for d in letters) == sorted(reason for _, _, reason in MALFORMED)
    for letter in letters:
        assert letter["topic"] == topics.input
        assert letter["offset"] >= 0 and 0 <= letter["partition"] < 4
        assert letter["message"]
    binary = next(d for d in letters if d["value_base64"])
    assert binary["value"] == "//4AZ2FyYmFnZQ=="


def test_late_events_carry_reason_watermark_and_source(run: dict[str, Any]) -> None:
    topics = run["topics"]
    late_by_id = {e["id"]: o for e, o in zip(run["events"], run["expected"], strict=True) if isinstance(o, Late)}
    for record in run["outputs"][topics.late]:
        assert record["reason"] == "late"
        assert record["event"]["ts"] < record["watermark"] == late_by_id[record["event"]["id"]].watermark
        assert record["topic"] == topics.input and record["offset"] >= 0


def test_web_views_report_model_and_card_state(run: dict[str, Any]) -> None:
    view = run["model_view"]
    assert view["model"] == "fraud-mlp@1"
    assert view["provider"] == "CPUExecutionProvider"
    assert view["runtime"].split(" ")[0] in ("onnxruntime", "onnxruntime-gpu")
    assert view["stats"]["items"] == sum(isinstance(o, Scored) for o in run["expected"])
    status, body = run["features_view"]
    assert status == 200
    answer = orjson.loads(body)
    card = run["events"][0]["card_id"]
    applied = {e["id"] for e, o in zip(run["events"], run["expected"], strict=True) if isinstance(o, Scored)}
    last_id = [tx["id"] for tx in run["events"] if tx["card_id"] == card and tx["id"] in applied][-1]
    prediction = next(p for p in run["outputs"]["joined"] if p["id"] == last_id)
    assert answer["card_id"] == card and answer["event_id"] == last_id
    assert answer["features"] == prediction["features"]
    assert answer["watermark"] is not None
    assert run["unknown_card_view"][0] == 404
    assert "error" in orjson.loads(run["unknown_card_view"][1])
    assert run["health_view"][0] == 200 and orjson.loads(run["health_view"][1]) == {"alive": True}


def test_worker_stops_cleanly(run: dict[str, Any]) -> None:
    assert run["exit_code"] == 0, run["log"]
