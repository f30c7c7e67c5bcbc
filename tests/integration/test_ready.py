"""Readiness on the real broker: /ready/ says 200 only once the worker serves, and a spare replica is ready too."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from app.localhost import free_port
from tests.integration.kafka_helpers import Topics, Worker, prepare_topics
from tests.poison_model import write_slow_model

pytestmark = pytest.mark.integration


def probe(worker: Worker, path: str) -> tuple[int, dict[str, Any]] | None:
    """``(status, body)`` of a GET, or None while the web server does not answer yet."""
    try:
        status, body = worker.get(path)
    except OSError:
        return None
    return status, orjson.loads(body)


def wait_ready(worker: Worker, timeout_s: float = 90) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert worker.running(), f"worker exited with {worker.proc.returncode}:\n{worker.log_tail()}"
        answer = probe(worker, "/ready/")
        if answer is not None and answer[0] == 200:
            return answer[1]
        time.sleep(0.1)
    raise AssertionError(f"worker not ready after {timeout_s} s:\n{worker.log_tail()}")


def test_ready_waits_for_a_slow_model_and_a_spare_is_ready(kafka_bootstrap: str, tmp_path: Path,
                                                           unique: str) -> None:
    topics = Topics.unique(unique)
    prepare_topics(kafka_bootstrap, topics, partitions=1)
    # Every call of this model (each of its three warm-up calls included) costs 80 dense 768 x 768 products:
    # about 10 s to load and warm here, far longer than the group takes to hand out the partition.
    slow = write_slow_model(tmp_path / "slow.onnx", matmuls=80)
    env = topics.env() | {"SEAM_TOPIC_PARTITIONS": "1", "SEAM_SESSION_TIMEOUT_S": "6"}
    first = Worker(kafka_bootstrap, env | {"SEAM_MODEL_PATH": str(slow)}, tmp_path / "w1", free_port())
    second: Worker | None = None
    try:
        # Poll /ready/ then /model/ until /model/ answers 200: /ready/ must not say 200 before /model/ does.
        loading_seen: list[dict[str, Any]] = []
        deadline = time.monotonic() + 120
        while True:
            assert time.monotonic() < deadline, f"the model never loaded:\n{first.log_tail()}"
            assert first.running(), f"worker exited with {first.proc.returncode}:\n{first.log_tail()}"
            ready, model = probe(first, "/ready/"), probe(first, "/model/")
            if ready is not None and model is not None:
                if model[0] == 200:
                    break
                assert ready[0] == 503, f"/ready/ said {ready} while /model/ said {model}"
                assert "model" in ready[1]["waiting_for"] and not ready[1]["ready"], ready
                loading_seen.append(ready[1])
            time.sleep(0.05)
        assert loading_seen, "the web server never answered while the model was loading: the test proved nothing"
        # The group handed out the partition long before the model was warm: the old /ready/ said 200 here.
        assert any("group" not in r["waiting_for"] for r in loading_seen), loading_seen[-1]
        body = wait_ready(first)
        assert body == {"ready": True, "input_partitions": [0], "spare": False, "waiting_for": []}, body

        # More workers than partitions: the second owns nothing and is a ready spare; the first serves again.
        second = Worker(kafka_bootstrap, env, tmp_path / "w2", free_port())
        bodies: list[dict[str, Any]] = []
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            answers = [probe(w, "/ready/") for w in (first, second)]
            bodies = [a[1] for a in answers if a is not None]
            if len(bodies) == 2 and all(b["ready"] for b in bodies):
                break
            time.sleep(0.2)
        else:
            raise AssertionError(f"both workers never became ready: {bodies}\n{second.log_tail()}")
        assert sorted(b["input_partitions"] for b in bodies) == [[], [0]], bodies
        assert sorted(b["spare"] for b in bodies) == [False, True], bodies
        assert first.get("/healthz")[0] == 200 and second.get("/healthz")[0] == 200
    finally:
        for worker in (first, second):
            if worker is not None:
                worker.stop()
