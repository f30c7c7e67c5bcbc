"""Two workers share the partitions; /features/{card_id}/ gives the same answer on both."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import orjson
import pytest

from app.localhost import free_port
from app.synthetic import TransactionGenerator
from tests.integration.kafka_helpers import Topics, Worker, collect, encode, prepare_topics, produce_raw

pytestmark = pytest.mark.integration


def test_features_view_is_routed_to_the_owner_from_any_worker(kafka_bootstrap: str, tmp_path: Path) -> None:
    topics = Topics.unique(uuid.uuid4().hex[:10])
    prepare_topics(kafka_bootstrap, topics)
    events = [next(g)[0] for g in [TransactionGenerator(cards=20, seed=9, late_rate=0.0, id_prefix="rq")]
              for _ in range(600)]
    workers = [Worker(kafka_bootstrap, topics.env(), tmp_path / name, free_port()) for name in ("a", "b")]
    try:
        for worker in workers:
            worker.wait_ready()
        asyncio.run(produce_raw(kafka_bootstrap, topics.input, [encode(e) for e in events]))
        asyncio.run(collect(kafka_bootstrap, [topics.predictions],
                            lambda o: len({p["id"] for p in o[topics.predictions]}) >= len(events), timeout_s=120))
        cards = sorted({e["card_id"] for e in events})
        answers: dict[str, list[dict[str, object]]] = {}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            answers = {card: [orjson.loads(w.get(f"/features/{card}/", timeout_s=5)[1]) for w in workers]
                       for card in cards}
            if all("features" in a for pair in answers.values() for a in pair):
                break
            time.sleep(1)  # a rebalance may still be settling
        # Faust's own pages (every worker's URL and partitions, any table's contents) are off by default.
        faust_pages = [workers[0].get(path)[0] for path in ("/router/", "/table/card-state/")]
    finally:
        # Both at once: a worker told to stop while the group rebalances around the other one can
        # hit faust-streaming's fetcher-restart path on shutdown (an exit code, not data loss).
        for worker in workers:
            worker.terminate()
        codes = [w.stop() for w in workers]
    last = {e["card_id"]: e["id"] for e in events}
    for card, (from_a, from_b) in answers.items():
        assert from_a == from_b, card
        assert from_a["event_id"] == last[card]
    owners = {a["served_by"] for pair in answers.values() for a in pair}
    assert len(owners) == 2, f"both workers should own some cards: {owners}"
    assert codes == [0, 0], "\n".join(w.log_tail(30) for w in workers)
    assert faust_pages == [404, 404]
