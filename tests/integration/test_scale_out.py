"""Scaling out: two workers, a third joining mid-stream, one SIGKILLed; nothing lost, features exact."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from app.localhost import free_port
from app.synthetic import TransactionGenerator
from tests.integration.kafka_helpers import (
    REPLAY_ALLOWANCE_MS,
    Topics,
    Worker,
    collect,
    encode,
    prepare_topics,
    produce_raw,
    replay_allowance_spec,
    with_features,
)
from tests.integration.test_pipeline import with_partitions
from tests.reference import Scored, replay

pytestmark = pytest.mark.integration

TOTAL, PARTITIONS, CHUNK = 40_000, 8, 1_000


def cluster_of(worker: Worker) -> dict[str, Any]:
    status, body = worker.get("/cluster/", timeout_s=5)
    assert status == 200, body
    view: dict[str, Any] = orjson.loads(body)
    return view


def wait_for_cluster(workers: list[Worker], timeout_s: float = 60) -> list[dict[str, Any]]:
    """Wait until every worker's /cluster/ lists exactly these workers, all partitions owned and standbys known."""
    urls = sorted(f"http://127.0.0.1:{w.web_port}" for w in workers)
    deadline = time.monotonic() + timeout_s
    views: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        views = [cluster_of(w) for w in workers]
        if all([m["url"] for m in v["workers"]] == urls and not v["unowned_input_partitions"]
               and all(m["standby_partitions"] for m in v["workers"]) for v in views):
            return views
        time.sleep(0.5)
    raise AssertionError(f"the cluster did not settle on {urls}: {views}")


def assert_standbys_cover_others(view: dict[str, Any]) -> None:
    """With one standby replica, every input partition has a warm copy on a worker that does not own it."""
    owner = {p: m["url"] for m in view["workers"] for p in m["input_partitions"]}
    assert sorted(owner) == list(range(PARTITIONS)), view
    for member in view["workers"]:
        for partition in member["standby_partitions"]:
            assert owner[partition] != member["url"], f"partition {partition} is active and standby on one worker"
    standby = {p for m in view["workers"] for p in m["standby_partitions"]}
    assert standby == set(range(PARTITIONS)), view


def test_join_and_sigkill_mid_stream_lose_nothing_and_keep_features_exact(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    topics = Topics.unique(uuid.uuid4().hex[:10])
    prepare_topics(kafka_bootstrap, topics, partitions=PARTITIONS)
    generator = TransactionGenerator(cards=800, seed=41, id_prefix="so")
    events = [next(generator)[0] for _ in range(TOTAL)]
    # 800 cards: 1.9 s of event time per record, so a replay after the kill can span more than the example
    # spec's 11-minute replay horizon (kafka_helpers.REPLAY_ALLOWANCE_MS).
    expected = replay(with_partitions(events, PARTITIONS), allowed_lateness_ms=60_000,
                      replay_allowance_ms=REPLAY_ALLOWANCE_MS)
    first_features: dict[str, dict[str, float]] = {}
    last_applied: dict[str, str] = {}
    for event, outcome in zip(events, expected, strict=True):
        if isinstance(outcome, Scored):
            first_features.setdefault(event["id"], outcome.features)
            last_applied[event["card_id"]] = event["id"]
    env = topics.env() | replay_allowance_spec(tmp_path) | {
        "SEAM_TOPIC_PARTITIONS": str(PARTITIONS), "SEAM_STANDBY_REPLICAS": "1", "SEAM_SESSION_TIMEOUT_S": "6"}
    joined = threading.Event()
    produced = [0]

    def produce() -> None:
        # Held at a quarter until the third worker is up, so that its join and the kill that follows
        # both land while records are still flowing.
        for start in range(0, TOTAL, CHUNK):
            if start == TOTAL // 4:
                joined.wait(120)
            asyncio.run(produce_raw(kafka_bootstrap, topics.input, [encode(e) for e in events[start:start + CHUNK]]))
            produced[0] = start + CHUNK
            time.sleep(0.2)

    a, b = (Worker(kafka_bootstrap, env, tmp_path / name, free_port()) for name in ("a", "b"))
    workers = [a, b]
    producer = threading.Thread(target=produce)
    try:
        a.wait_ready()
        b.wait_ready()
        for view in wait_for_cluster([a, b]):
            assert_standbys_cover_others(view)
        producer.start()
        while produced[0] < TOTAL // 8 and producer.is_alive():
            time.sleep(0.1)
        c = Worker(kafka_bootstrap, env, tmp_path / "c", free_port())
        workers.append(c)
        c.wait_ready()
        joined.set()
        while produced[0] < TOTAL // 2 and producer.is_alive():
            time.sleep(0.05)
        b.proc.send_signal(signal.SIGKILL)
        b.proc.wait()
        killed_at = produced[0]
        producer.join()
        all_ids = {e["id"] for e in events}

        def accounted(out: dict[str, list[dict[str, Any]]]) -> set[str]:
            return ({p["id"] for p in out[topics.predictions]} | {r["event"]["id"] for r in out[topics.late]}
                    | {orjson.loads(r["value"])["id"] for r in out[topics.dlq]})

        def complete(out: dict[str, list[dict[str, Any]]]) -> bool:
            return (accounted(out) >= all_ids
                    and {f["id"] for f in out[topics.features]} >= {p["id"] for p in out[topics.predictions]})

        out = asyncio.run(collect(kafka_bootstrap, [topics.predictions, topics.features, topics.late, topics.dlq],
                                  done=complete, timeout_s=240))
        survivors = [a, c]
        final_views = wait_for_cluster(survivors)
        cards = sorted(last_applied)[::20]
        answers = {card: [orjson.loads(w.get(f"/features/{card}/", timeout_s=5)[1]) for w in survivors]
                   for card in cards}
    finally:
        joined.set()
        if producer.is_alive():
            producer.join()
        for worker in workers:
            worker.terminate()
        codes = [w.stop() for w in workers]
    logs = "\n\n".join(w.log_tail(30) for w in workers)
    assert TOTAL // 2 <= killed_at < TOTAL, f"the kill did not land mid-stream ({killed_at} produced)"
    assert codes[0] == 0 and codes[2] == 0 and codes[1] == -signal.SIGKILL, (codes, logs)

    predictions: list[dict[str, Any]] = with_features(out, topics)
    scored = Counter(p["id"] for p in predictions)
    assert accounted(out) == all_ids, f"{len(all_ids - accounted(out))} transactions lost\n{logs}"
    assert set(scored) == set(first_features), "scored exactly the events the reference scores"
    assert not out[topics.dlq], out[topics.dlq][:3]
    for p in predictions:
        assert p["features"] == pytest.approx(first_features[p["id"]], rel=1e-9), p["id"]

    # The worker that joined took over partitions, and the killed one is gone from every view.
    for view in final_views:
        assert_standbys_cover_others(view)
        assert [m["url"] for m in view["workers"]] == sorted(f"http://127.0.0.1:{w.web_port}" for w in survivors)
        assert all(m["input_partitions"] for m in view["workers"]), view
    # /features/ answers the same on every worker: the owner's state, equal to the reference.
    for card, (from_a, from_c) in answers.items():
        assert from_a == from_c, card
        assert from_a["event_id"] == last_applied[card], card
        assert from_a["features"] == pytest.approx(first_features[last_applied[card]], rel=1e-9), card
    assert len({a["served_by"] for pair in answers.values() for a in pair}) == 2, "both survivors own cards"
    duplicates = sum(scored.values()) - len(scored)
    print(f"\nscale-out test: {TOTAL} inputs, 0 lost, {duplicates} duplicate predictions "
          f"(join at {TOTAL // 8}+, SIGKILL after {killed_at} produced)")
