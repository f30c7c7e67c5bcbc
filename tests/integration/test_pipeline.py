"""End to end against the real broker: one worker scores a stream, routes bad and late records."""

from __future__ import annotations

import asyncio
import random
import uuid
from typing import Any

import orjson
import pytest

from app.synthetic import TransactionGenerator
from tables.features import DEFAULT_SPEC, apply_event, new_state
from tests.conftest import free_port
from tests.integration.kafka_helpers import (
    Topics,
    Worker,
    collect,
    encode,
    prepare_topics,
    produce_raw,
)

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


@pytest.fixture(scope="module", params=["batch", "stream"])
def run(
    request: pytest.FixtureRequest, kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, Any]:
    """Produce valid, malformed and late records, run one worker (each ingestion path), collect every output."""
    topics = Topics.unique(uuid.uuid4().hex[:10])
    prepare_topics(kafka_bootstrap, topics)
    generator = TransactionGenerator(cards=50, seed=11, late_rate=0.0, id_prefix="it")
    valid = [next(generator)[0] for _ in range(VALID)]
    late = dict(valid[-1], id="it-late", ts=max(tx["ts"] for tx in valid) - 600_000)
    records: list[tuple[bytes | None, bytes | None]] = [encode(tx) for tx in valid]
    rng = random.Random(3)
    for key, value, _reason in MALFORMED:
        records.insert(rng.randrange(len(records)), (key, value))
    records.append(encode(late))
    asyncio.run(produce_raw(kafka_bootstrap, topics.input, records))

    env = topics.env() | {"SEAM_INGEST": request.param}
    worker = Worker(kafka_bootstrap, env, tmp_path_factory.mktemp("worker"), free_port())
    try:
        worker.wait_ready()
        outputs = asyncio.run(collect(
            kafka_bootstrap, [topics.predictions, topics.dlq, topics.late],
            done=lambda out: (len({p["id"] for p in out[topics.predictions]}) >= VALID
                              and len(out[topics.dlq]) >= len(MALFORMED) and len(out[topics.late]) >= 1),
            timeout_s=120))
        model_view = orjson.loads(worker.get("/model/")[1])
        card = valid[0]["card_id"]
        features_view = worker.get(f"/features/{card}/")
    finally:
        code = worker.stop()
    return {
        "topics": topics, "valid": valid, "late": late, "outputs": outputs, "model_view": model_view,
        "features_view": features_view, "exit_code": code, "log": worker.log_tail(200),
    }


def test_exactly_one_prediction_per_valid_transaction(run: dict[str, Any]) -> None:
    predictions = run["outputs"][run["topics"].predictions]
    ids = [p["id"] for p in predictions]
    assert sorted(ids) == sorted(tx["id"] for tx in run["valid"]), run["log"]
    assert len(ids) == len(set(ids)) == VALID


def test_predictions_carry_score_model_features_and_timing(run: dict[str, Any]) -> None:
    for p in run["outputs"][run["topics"].predictions]:
        assert 0.0 <= p["score"] <= 1.0
        assert p["is_fraud"] == (p["score"] >= 0.5)
        assert p["model"] == "fraud-mlp@1"
        assert list(p["features"]) == list(DEFAULT_SPEC.names)
        assert set(p["timing"]) == {"queue_ms", "infer_ms", "batch_size"}
        assert 1 <= p["timing"]["batch_size"] <= 256


def test_features_match_the_reference_applied_in_arrival_order(run: dict[str, Any]) -> None:
    states: dict[str, dict[str, Any]] = {}
    expected = {}
    for tx in run["valid"]:
        state = states.setdefault(tx["card_id"], new_state())
        applied = apply_event(state, tx["id"], tx["ts"], tx["amount"], tx["merchant_id"],
                              allowed_lateness_ms=60_000)
        expected[tx["id"]] = dict(zip(DEFAULT_SPEC.names, applied.features, strict=True))
    for p in run["outputs"][run["topics"].predictions]:
        assert p["features"] == pytest.approx(expected[p["id"]], rel=1e-9), p["id"]


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


def test_late_event_goes_to_the_late_topic_not_scored(run: dict[str, Any]) -> None:
    topics = run["topics"]
    (late,) = run["outputs"][topics.late]
    assert late["reason"] == "late"
    assert late["event"]["id"] == "it-late"
    assert late["event"]["ts"] < late["watermark"]
    assert "it-late" not in {p["id"] for p in run["outputs"][topics.predictions]}


def test_web_views_report_model_and_card_state(run: dict[str, Any]) -> None:
    view = run["model_view"]
    assert view["model"] == "fraud-mlp@1"
    assert view["provider"] == "CPUExecutionProvider"
    assert view["stats"]["items"] == VALID
    status, body = run["features_view"]
    assert status == 200
    assert orjson.loads(body)["card_id"] == run["valid"][0]["card_id"]


def test_worker_stops_cleanly(run: dict[str, Any]) -> None:
    assert run["exit_code"] == 0, run["log"]
