"""State and watermarks come back from the changelog after the worker's RocksDB folder is wiped."""

from __future__ import annotations

import asyncio
import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest

from app.localhost import free_port
from tests.integration.kafka_helpers import Topics, Worker, collect, encode, prepare_topics, produce_raw, with_features
from tests.integration.test_pipeline import stream_with_late_and_duplicates, with_partitions
from tests.reference import Late, Scored, replay

pytestmark = pytest.mark.integration

HALF = 1500


def test_wiped_worker_restores_state_and_watermarks_from_the_changelog(kafka_bootstrap: str, tmp_path: Path) -> None:
    topics = Topics.unique(uuid.uuid4().hex[:10])
    prepare_topics(kafka_bootstrap, topics)
    events = with_partitions(stream_with_late_and_duplicates(2 * HALF, seed=23, prefix="rs"), 4)
    first, second = events[:HALF], events[HALF:]
    # An event late only with respect to the first half's watermark: a worker that lost its watermarks
    # would apply it.
    partition = second[0]["partition"]
    high = max(e["ts"] for e in first if e["partition"] == partition)
    sneaky = dict(next(e for e in first if e["partition"] == partition), id="rs-sneaky", ts=high - 300_000)
    second.insert(0, sneaky)
    expected = replay(first + second, allowed_lateness_ms=60_000)
    data_dir = tmp_path / "worker"

    def run_worker(batch: list[dict[str, Any]], so_far: int) -> list[dict[str, Any]]:
        """Produce ``batch``, run a worker until the outcomes of the first ``so_far`` events are out."""
        seen = list(zip((first + second)[:so_far], expected[:so_far], strict=True))
        scored_ids = {e["id"] for e, o in seen if isinstance(o, Scored)}
        late_ids = {e["id"] for e, o in seen if isinstance(o, Late)}
        asyncio.run(produce_raw(kafka_bootstrap, topics.input, [encode(e) for e in batch]))
        worker = Worker(kafka_bootstrap, topics.env(), data_dir, free_port())
        try:
            worker.wait_ready()
            out = asyncio.run(collect(
                kafka_bootstrap, [topics.predictions, topics.features, topics.late],
                done=lambda o: ({p["id"] for p in o[topics.predictions]} >= scored_ids
                                and {f["id"] for f in o[topics.features]} >= scored_ids
                                and {r["event"]["id"] for r in o[topics.late]} >= late_ids),
                timeout_s=120))
        finally:
            assert worker.stop() == 0, worker.log_tail()
        return with_features(out, topics) + [{"late": r} for r in out[topics.late]]

    run_worker(first, HALF)
    shutil.rmtree(data_dir)  # the local RocksDB state is gone: only the changelog topics remain
    outputs = run_worker(second, len(expected))

    reference: dict[str, dict[str, float]] = {}
    for event, outcome in zip(first + second, expected, strict=True):
        if isinstance(outcome, Scored):
            reference.setdefault(event["id"], outcome.features)
    predictions = [o for o in outputs if "late" not in o]
    late_ids = {o["late"]["event"]["id"] for o in outputs if "late" in o}
    assert {p["id"] for p in predictions} == set(reference)
    for p in predictions:
        assert p["features"] == pytest.approx(reference[p["id"]], rel=1e-9), p["id"]
    assert "rs-sneaky" in late_ids, "the restored watermark must keep rejecting late events"
    want_late = {e["id"] for e, o in zip(first + second, expected, strict=True) if isinstance(o, Late)}
    assert late_ids >= want_late
    # Records redelivered after a rebalance (at least once) whose event time is by then beyond the
    # replay horizon go to the late topic too; that is only allowed for events already scored.
    assert late_ids - want_late <= {p["id"] for p in predictions}
