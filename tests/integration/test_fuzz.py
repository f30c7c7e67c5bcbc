"""10,000 malformed records among valid ones: the worker keeps running, nothing is lost."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from app.localhost import free_port
from app.synthetic import TransactionGenerator
from tests.integration.kafka_helpers import Topics, Worker, collect, prepare_topics, produce_raw

pytestmark = pytest.mark.integration

MALFORMED = 10_000
VALID = 4_000


def malformed_kinds(rng: random.Random) -> list[tuple[str, Callable[[dict[str, object]], bytes]]]:
    """(expected reason, value from a valid transaction) for many kinds of bad input."""

    def with_field(name: str, value: str) -> Callable[[dict[str, object]], bytes]:
        def make(tx: dict[str, object]) -> bytes:
            text = orjson.dumps({k: v for k, v in tx.items() if k != name}).decode()
            return (text[:-1] + f', "{name}": {value}}}').encode()
        return make

    def without(name: str) -> Callable[[dict[str, object]], bytes]:
        return lambda tx: orjson.dumps({k: v for k, v in tx.items() if k != name})

    return [
        ("invalid_json", lambda tx: orjson.dumps(tx)[: rng.randrange(1, 20)]),  # truncated
        ("invalid_json", lambda tx: bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64))) + b"\xff"),
        ("not_an_object", lambda tx: orjson.dumps([tx])),
        ("not_an_object", lambda tx: b'"a string"'),
        ("not_an_object", lambda tx: b"42"),
        ("not_an_object", lambda tx: b"null"),
        ("empty_value", lambda tx: b""),
        ("missing_field", without("amount")),
        ("missing_field", without("id")),
        ("missing_field", without("ts")),
        ("wrong_type", with_field("amount", '"12.5"')),
        ("wrong_type", with_field("ts", '"2025-12-01"')),
        ("wrong_type", with_field("card_id", "42")),
        ("wrong_type", with_field("amount", "true")),
        ("not_finite", with_field("amount", "NaN")),
        ("not_finite", with_field("amount", "Infinity")),
        ("not_finite", with_field("amount", "1e999")),
        ("out_of_range", with_field("amount", "1e20")),
        ("out_of_range", with_field("ts", "1764500000")),  # seconds, not milliseconds
        ("out_of_range", with_field("id", '""')),
        ("too_large", lambda tx: orjson.dumps(dict(tx, padding="x" * 70_000))),
    ]


def test_fuzzed_input_is_dead_lettered_and_valid_input_scored(kafka_bootstrap: str, tmp_path: Path) -> None:
    rng = random.Random(17)
    topics = Topics.unique(uuid.uuid4().hex[:10])
    prepare_topics(kafka_bootstrap, topics)
    generator = TransactionGenerator(cards=200, seed=17, late_rate=0.0, id_prefix="fz")
    kinds = malformed_kinds(rng)
    records: list[tuple[bytes | None, bytes | None]] = []
    expected: Counter[str] = Counter()
    valid_ids = set()
    for i in range(VALID + MALFORMED):
        tx, _ = next(generator)
        if i % 14 < 4 and len(valid_ids) < VALID:  # valid ones interleaved, some with a null key
            valid_ids.add(tx["id"])
            records.append((None if i % 50 == 0 else tx["card_id"].encode(), orjson.dumps(tx)))
        else:
            reason, make = kinds[rng.randrange(len(kinds))]
            expected[reason] += 1
            records.append((tx["card_id"].encode() if rng.random() < 0.9 else None, make(tx)))
    big = dict(next(generator)[0], padding="x" * 1_000_000)  # a 1 MB value
    records.insert(len(records) // 2, (b"c-big", orjson.dumps(big)))
    expected["too_large"] += 1
    malformed = sum(expected.values())
    asyncio.run(produce_raw(kafka_bootstrap, topics.input, records))

    worker = Worker(kafka_bootstrap, topics.env(), tmp_path / "worker", free_port())
    try:
        worker.wait_ready()
        out = asyncio.run(collect(
            kafka_bootstrap, [topics.predictions, topics.dlq],
            done=lambda o: len(o[topics.dlq]) >= malformed and {p["id"] for p in o[topics.predictions]} >= valid_ids,
            timeout_s=240))
        alive = worker.proc.poll() is None
    finally:
        code = worker.stop()
    letters = out[topics.dlq]
    reasons = Counter(d["reason"] for d in letters)
    print(f"\nfuzz: {malformed} malformed, {len(valid_ids)} valid; dead letters by reason: "
          + ", ".join(f"{reason} {count}" for reason, count in sorted(reasons.items())))
    assert alive and code == 0, worker.log_tail()
    assert reasons == expected
    assert {p["id"] for p in out[topics.predictions]} == valid_ids
    assert len({(d["partition"], d["offset"]) for d in letters}) == malformed  # each source record once
    binary = [d for d in letters if d["value_base64"]]
    assert binary and all(d["topic"] == topics.input for d in letters)
