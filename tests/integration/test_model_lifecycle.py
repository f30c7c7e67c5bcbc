"""Model deployments under load: canary, promote, rollback and refused files, with two workers on the real broker.

The commands are ``seam model ...`` run as a user runs them; the workers learn of each deployment from the
control topic alone. A second version of the model is trained for the test (``scripts/train_model.py``).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import orjson
import pytest

from agents.deployment import CANARY_BUCKETS, canary_bucket
from app.loadgen import produce
from app.localhost import free_port, worker_env
from app.synthetic import TransactionGenerator
from tests.integration.kafka_helpers import Topics, Worker, collect, prepare_topics
from tests.integration.test_scale_out import cluster_of
from tests.poison_model import write_reordered_model

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
V1_TAG, V2_TAG = "fraud-mlp@1", "fraud-mlp@2"
RATE, CARDS, PARTITIONS = 400.0, 5_000, 4
SETTLE_S = 1.0  # after both workers report a deployment, batches dispatched before it have been delivered


def seam_model(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "app", "model", *args], env=worker_env(env), cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def deployment_of(worker: Worker) -> dict[str, Any]:
    status, body = worker.get("/model/", timeout_s=5)
    assert status == 200, body
    view: dict[str, Any] = orjson.loads(body)["deployment"]
    return view


def wait_for_deployment(workers: list[Worker], check: Any, timeout_s: float = 20) -> float:
    """Wait until ``check(view)`` holds for every worker's /model/ deployment; return when it did."""
    deadline = time.monotonic() + timeout_s
    views: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        views = [deployment_of(w) for w in workers]
        if all(check(v) for v in views):
            return time.time()
        time.sleep(0.1)
    raise AssertionError(f"the workers did not converge: {views}")


def wait_for_cluster(workers: list[Worker], timeout_s: float = 60) -> None:
    """Wait until every worker's /cluster/ lists these workers and every input partition is owned."""
    urls = sorted(f"http://127.0.0.1:{w.web_port}" for w in workers)
    deadline = time.monotonic() + timeout_s
    views: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        views = [cluster_of(w) for w in workers]
        if all([m["url"] for m in v["workers"]] == urls and not v["unowned_input_partitions"] for v in views):
            return
        time.sleep(0.3)
    raise AssertionError(f"the cluster did not settle on {urls}: {views}")


def test_canary_promote_rollback_and_refused_models_under_load(kafka_bootstrap: str, tmp_path: Path) -> None:
    suffix = uuid.uuid4().hex[:10]
    topics = Topics.unique(suffix)
    prepare_topics(kafka_bootstrap, topics, partitions=PARTITIONS)
    v2 = tmp_path / "fraud-mlp-2.onnx"
    subprocess.run([sys.executable, "scripts/train_model.py", "--version", "2", "--seed", "11", "--events", "50000",
                    "--epochs", "3", "--out", str(v2)], cwd=ROOT, check=True, capture_output=True, timeout=120)
    corrupt = tmp_path / "corrupt.onnx"
    corrupt.write_bytes(v2.read_bytes()[:700])
    env = topics.env() | {"SEAM_MODEL_CONTROL_TOPIC": f"ctl-{suffix}", "SEAM_SHADOW_TOPIC": f"shadow-{suffix}",
                          "SEAM_TOPIC_PARTITIONS": str(PARTITIONS), "SEAM_SESSION_TIMEOUT_S": "6"}
    cli_env = env | {"SEAM_BROKER_URL": f"kafka://{kafka_bootstrap}"}
    stop_load = threading.Event()

    def load() -> None:
        generator = TransactionGenerator(cards=CARDS, seed=5, late_rate=0.0, id_prefix="ml")
        asyncio.run(produce(kafka_bootstrap, topics.input, rate=RATE, duration_s=600, generator=generator,
                            partitions=PARTITIONS, stop=stop_load.is_set))

    a, b = (Worker(kafka_bootstrap, env, tmp_path / name, free_port()) for name in ("a", "b"))
    workers = [a, b]
    loader = threading.Thread(target=load)
    marks: dict[str, tuple[float, float]] = {}  # phase -> (from, to), epoch seconds
    try:
        a.wait_ready()
        b.wait_ready()
        wait_for_cluster(workers)
        assert all(v["revision"] == 0 and v["primary"]["model"] == V1_TAG for v in map(deployment_of, workers))
        loader.start()
        time.sleep(3)

        def run(*args: str) -> None:
            done = seam_model(cli_env, *args)
            assert done.returncode == 0, done.stderr

        issued = time.time()
        run("deploy", str(v2), "--canary", "20")
        converged = wait_for_deployment(workers, lambda v: v["revision"] == 1 and v["canary"]
                                        and v["canary"]["model"] == V2_TAG and v["canary"]["percent"] == 20)
        convergence = {"canary": converged - issued}
        time.sleep(10)
        issued = time.time()
        marks["canary"] = (converged + SETTLE_S, issued)
        run("promote")
        converged = wait_for_deployment(workers, lambda v: v["revision"] == 2 and v["primary"]["model"] == V2_TAG
                                        and v["canary"] is None)
        convergence["promote"] = converged - issued
        time.sleep(6)
        issued = time.time()
        marks["promoted"] = (converged + SETTLE_S, issued)
        run("rollback")
        converged = wait_for_deployment(workers, lambda v: v["revision"] == 3 and v["primary"]["model"] == V1_TAG)
        convergence["rollback"] = converged - issued
        time.sleep(3)
        # A shadow: the same rows scored by fraud-mlp@2 on the side, predictions untouched.
        run("shadow", str(v2))
        wait_for_deployment(workers, lambda v: v["revision"] == 4 and (v["shadow"] or {}).get("model") == V2_TAG)
        time.sleep(3)
        # Refused: a truncated file, then a model whose feature names are in another order.
        run("deploy", str(corrupt))
        wait_for_deployment(workers, lambda v: (v["rejected"] or {}).get("revision") == 5)
        assert {deployment_of(w)["rejected"]["reason"] for w in workers} == {"not_a_model"}
        run("deploy", str(write_reordered_model(v2, tmp_path / "reordered.onnx", version="3")))
        wait_for_deployment(workers, lambda v: (v["rejected"] or {}).get("revision") == 6)
        assert {deployment_of(w)["rejected"]["reason"] for w in workers} == {"contract"}
        assert all(v["revision"] == 4 and v["primary"]["model"] == V1_TAG for v in map(deployment_of, workers))
        time.sleep(2)
        marks["rolled_back"] = (marks["promoted"][1] + convergence["rollback"] + SETTLE_S, time.time())
        status = seam_model(cli_env, "status")
        assert status.returncode == 0 and "revision 6" in status.stdout, status
        rejections = [line for w in workers for line in w.get("/metrics")[1].decode().splitlines()
                      if line.startswith("seam_model_deployment_rejections_total")]
        assert sorted(rejections) == sorted(
            f'seam_model_deployment_rejections_total{{reason="{reason}"}} 1.0'
            for reason in ("contract", "not_a_model") for _ in workers), rejections
        stop_load.set()
        loader.join()
        sent = asyncio.run(collect(kafka_bootstrap, [topics.input], done=lambda out: True, timeout_s=30,
                                   settle_s=3))[topics.input]
        ids = {tx["id"] for tx in sent}
        shadow_topic = env["SEAM_SHADOW_TOPIC"]
        out = asyncio.run(collect(kafka_bootstrap, [topics.predictions, topics.dlq, shadow_topic],
                                  done=lambda out: {p["id"] for p in out[topics.predictions]} >= ids, timeout_s=120))
    finally:
        stop_load.set()
        if loader.is_alive():
            loader.join()
        for worker in workers:
            worker.terminate()
        codes = [w.stop() for w in workers]
    logs = "\n\n".join(w.log_tail(40) for w in workers)
    assert codes == [0, 0], logs
    predictions = out[topics.predictions]
    assert {p["id"] for p in predictions} == ids, f"{len(ids - {p['id'] for p in predictions})} inputs unanswered"
    assert out[topics.dlq] == []
    # At least once: a redelivered input is scored again; every id has one distinct answer per model it met.
    first: dict[str, dict[str, Any]] = {}
    for p in predictions:
        first.setdefault(p["id"], p)

    def phase(name: str) -> list[dict[str, Any]]:
        start, end = marks[name]
        return [p for p in first.values() if start * 1000 <= p["_kafka_ts"] < end * 1000]

    canary = phase("canary")
    by_card: dict[str, set[str]] = defaultdict(set)
    for p in canary:
        by_card[p["card_id"]].add(p["model"])
    assert all(len(models) == 1 for models in by_card.values()), "a card's predictions flipped between versions"
    assert all(models == ({V2_TAG} if canary_bucket(card) < 20 * CANARY_BUCKETS // 100 else {V1_TAG})
               for card, models in by_card.items()), "a card was scored by the model its bucket does not pick"
    share = sum(p["model"] == V2_TAG for p in canary) / len(canary)
    assert len(canary) > 1_500 and abs(share - 0.20) <= 0.03, (len(canary), share)
    assert Counter(p["model"] for p in phase("promoted")) .keys() == {V2_TAG}
    assert Counter(p["model"] for p in phase("rolled_back")).keys() == {V1_TAG}
    shadow = out[shadow_topic]
    assert len(shadow) > 500 and {r["model"] for r in shadow} == {V2_TAG}, len(shadow)
    assert {r["id"] for r in shadow} <= ids
    assert {first[r["id"]]["model"] for r in shadow} == {V1_TAG}  # the shadow changed no prediction
    assert all(seconds < 5 for seconds in convergence.values()), convergence
    print(f"canary share {share:.3f} over {len(canary)} predictions; convergence {convergence}")
