"""SIGKILL the worker three times mid-stream: nothing is lost (at least once), nothing doubles (exactly once)."""

from __future__ import annotations

import asyncio
import random
import signal
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from app.localhost import free_port
from app.synthetic import TransactionGenerator
from tests.integration.kafka_helpers import (
    Topics,
    Worker,
    collect_outcomes,
    encode,
    prepare_topics,
    produce_raw,
    with_features,
)
from tests.integration.test_pipeline import stream_with_late_and_duplicates, with_partitions
from tests.reference import Scored, replay

pytestmark = pytest.mark.integration

TOTAL = 20_000


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
def test_three_sigkills_lose_nothing_and_keep_features_exact(
        kafka_bootstrap: str, tmp_path: Path, guarantee: str) -> None:
    rng = random.Random(29)
    topics = Topics.unique(uuid.uuid4().hex[:10])
    prepare_topics(kafka_bootstrap, topics)
    exactly_once = guarantee == "exactly_once"
    if exactly_once:  # every id once in the input, so that any repeated output is a duplicate
        generator = TransactionGenerator(cards=50, seed=29, late_rate=0.01, id_prefix="ke")
        events = with_partitions([next(generator)[0] for _ in range(TOTAL)], 4)
    else:
        # At least once replays what was processed after the last commit. A redelivered event keeps
        # its first features only within the replay horizon (allowed lateness + the largest window,
        # 61 min), counted from its card's newest event; older ones are routed late. With 50 cards
        # the stream covers 30 s of event time per event, so a replay of ~200 records (one write
        # interval while catching up) already spanned more, and ~100 events were routed late in some
        # runs. 2,000 cards: 0.75 s per event, a replay of 4,000 records stays within the horizon.
        events = with_partitions(stream_with_late_and_duplicates(TOTAL, seed=29, prefix="kl", cards=2_000), 4)
    expected = replay(events, allowed_lateness_ms=60_000)
    first_features: dict[str, dict[str, float]] = {}
    for event, outcome in zip(events, expected, strict=True):
        if isinstance(outcome, Scored):
            first_features.setdefault(event["id"], outcome.features)
    env = topics.env() | {"SEAM_SESSION_TIMEOUT_S": "6", "SEAM_PROCESSING_GUARANTEE": guarantee}

    def produce_slowly() -> None:  # ~10 s of input, so the kills land mid-stream
        for start in range(0, len(events), 1_000):
            asyncio.run(produce_raw(kafka_bootstrap, topics.input, [encode(e) for e in events[start:start + 1_000]]))
            time.sleep(0.45)

    producer = threading.Thread(target=produce_slowly)
    producer.start()
    kills = 0
    worker = Worker(kafka_bootstrap, env, tmp_path / "w0", free_port())
    try:
        for _ in range(3):
            worker.wait_ready()
            time.sleep(rng.uniform(1.0, 4.0))
            worker.proc.send_signal(signal.SIGKILL)
            worker.proc.wait()
            worker.stop()
            kills += 1
            # A replacement with the same local state folder, as a restarted container would have.
            worker = Worker(kafka_bootstrap, env, tmp_path / "w0", free_port())
        producer.join()
        all_ids = {e["id"] for e in events}
        out = asyncio.run(collect_outcomes(kafka_bootstrap, topics, all_ids, timeout_s=240,
                                           read_committed=exactly_once))
    finally:
        producer.join()
        code = worker.stop()
    predictions: list[dict[str, Any]] = with_features(out, topics)
    scored = Counter(p["id"] for p in predictions)
    late = {r["event"]["id"] for r in out[topics.late]}
    assert kills == 3
    assert set(scored) | late == {e["id"] for e in events}, "a transaction was lost"
    assert set(scored) == set(first_features), "scored exactly the events the reference scores"
    for p in predictions:
        assert p["features"] == pytest.approx(first_features[p["id"]], rel=1e-9), p["id"]
    duplicates = sum(scored.values()) - len(scored)
    late_counts = Counter(r["event"]["id"] for r in out[topics.late])
    print(f"\nkill test ({guarantee}): {len(events)} inputs, {duplicates} duplicate predictions, "
          f"{sum(late_counts.values())} late records, {len(out[topics.dlq])} dead letters after 3 SIGKILLs")
    if exactly_once:
        assert duplicates == 0 and max(late_counts.values(), default=1) == 1, "an output was committed twice"
        assert not set(scored) & set(late_counts), "a transaction was both scored and routed late"
        assert not out[topics.dlq]
    assert code == 0, worker.log_tail()


def test_exactly_once_through_a_join_and_a_sigkill(kafka_bootstrap: str, tmp_path: Path) -> None:
    """Partitions move twice (a worker joins, then the first is killed): still every id exactly once."""
    topics = Topics.unique(uuid.uuid4().hex[:10])
    prepare_topics(kafka_bootstrap, topics)
    generator = TransactionGenerator(cards=50, seed=31, late_rate=0.01, id_prefix="kj")
    events = with_partitions([next(generator)[0] for _ in range(9_000)], 4)
    expected = replay(events, allowed_lateness_ms=60_000)
    features = {e["id"]: o.features for e, o in zip(events, expected, strict=True) if isinstance(o, Scored)}
    env = topics.env() | {"SEAM_SESSION_TIMEOUT_S": "6", "SEAM_PROCESSING_GUARANTEE": "exactly_once"}

    def produce(part: list[dict[str, Any]], pause_s: float) -> None:
        for start in range(0, len(part), 500):
            asyncio.run(produce_raw(kafka_bootstrap, topics.input, [encode(e) for e in part[start:start + 500]]))
            time.sleep(pause_s)

    first = Worker(kafka_bootstrap, env, tmp_path / "w1", free_port())
    second: Worker | None = None
    try:
        first.wait_ready()
        produce(events[:3_000], 0.2)
        second = Worker(kafka_bootstrap, env, tmp_path / "w2", free_port())  # first rebalance: half moves
        producer = threading.Thread(target=produce, args=(events[3_000:6_000], 0.4))
        producer.start()
        second.wait_ready()
        time.sleep(1.0)
        first.proc.send_signal(signal.SIGKILL)  # second rebalance, after the session timeout: the rest moves
        first.proc.wait()
        producer.join()
        produce(events[6_000:], 0.2)
        all_ids = {e["id"] for e in events}
        out = asyncio.run(collect_outcomes(kafka_bootstrap, topics, all_ids, timeout_s=180, read_committed=True))
    finally:
        first.stop()
        code = second.stop() if second is not None else 0
    outputs = Counter([p["id"] for p in out[topics.predictions]] + [r["event"]["id"] for r in out[topics.late]])
    assert set(outputs) == all_ids, "a transaction was lost"
    assert max(outputs.values()) == 1, f"{sum(outputs.values()) - len(outputs)} outputs were committed twice"
    assert {p["id"] for p in out[topics.predictions]} == set(features)
    for p in with_features(out, topics):
        assert p["features"] == pytest.approx(features[p["id"]], rel=1e-9), p["id"]
    assert code == 0, second.log_tail() if second is not None else ""
