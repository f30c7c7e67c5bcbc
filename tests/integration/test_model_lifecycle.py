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
from prometheus_client.parser import text_string_to_metric_families

from agents.model import control
from agents.model.deployment import CANARY_BUCKETS, Deployment, ModelRef, canary_bucket
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


def counted(workers: list[Worker]) -> Counter[str]:
    """What the workers have done so far, summed over them from their /metrics: rows scored per model
    (``fraud-mlp@2``; the shadow's included) and outputs delivered per kind (``prediction``, ``shadow``)."""
    totals: Counter[str] = Counter()
    for worker in workers:
        status, body = worker.get("/metrics", timeout_s=5)
        assert status == 200, body
        for family in text_string_to_metric_families(body.decode()):
            for sample in family.samples:
                if sample.name == "seam_scores_count":
                    totals[f"{sample.labels['model']}@{sample.labels['version']}"] += int(sample.value)
                elif sample.name == "seam_events_out_total":
                    totals[sample.labels["topic_kind"]] += int(sample.value)
    return totals


def wait_for_more(workers: list[Worker], what: str, more: dict[str, int], *, after: float = 0.0,
                  timeout_s: float = 120) -> None:
    """Wait until the workers have counted (:func:`counted`) at least ``more[name]`` more of each name than at
    ``after`` (epoch seconds; now if it has passed)."""
    time.sleep(max(0.0, after - time.time()))  # a phase's window opens then: count only what falls inside it
    start = counted(workers)
    deadline = time.monotonic() + timeout_s
    while True:
        grown = counted(workers) - start
        if all(grown[name] >= n for name, n in more.items()):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: wanted {more} more within {timeout_s:.0f} s, got {dict(grown)}")
        time.sleep(0.2)


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
                          "SEAM_MODEL_DIR": str(tmp_path),
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
        for worker in workers:  # the load flows through both workers before anything is deployed
            wait_for_more([worker], "predictions before the first deployment", {"prediction": 100})

        def run(*args: str) -> None:
            done = seam_model(cli_env, *args)
            assert done.returncode == 0, done.stderr

        converged: dict[int, float] = {}  # revision -> when every worker served it, epoch seconds
        run("deploy", str(v2), "--canary", "20")
        converged[1] = wait_for_deployment(workers, lambda v: v["revision"] == 1 and v["canary"]
                                           and v["canary"]["model"] == V2_TAG and v["canary"]["percent"] == 20)
        # Enough canary traffic for its share to be measured to +-0.03 (asserted below over > 1,500).
        wait_for_more(workers, "the canary phase", {V1_TAG: 2_400, V2_TAG: 600}, after=converged[1] + SETTLE_S)
        marks["canary"] = (converged[1] + SETTLE_S, time.time())
        run("promote")
        converged[2] = wait_for_deployment(workers, lambda v: v["revision"] == 2 and v["primary"]["model"] == V2_TAG
                                           and v["canary"] is None)
        wait_for_more(workers, "the promoted phase", {V2_TAG: 400}, after=converged[2] + SETTLE_S)
        marks["promoted"] = (converged[2] + SETTLE_S, time.time())
        run("rollback")
        converged[3] = wait_for_deployment(workers, lambda v: v["revision"] == 3 and v["primary"]["model"] == V1_TAG)
        wait_for_more(workers, "the rolled-back phase", {V1_TAG: 400}, after=converged[3] + SETTLE_S)
        # A shadow: the same rows scored by fraud-mlp@2 on the side, predictions untouched.
        run("shadow", str(v2))
        wait_for_deployment(workers, lambda v: v["revision"] == 4 and (v["shadow"] or {}).get("model") == V2_TAG)
        wait_for_more(workers, "the shadow phase", {"shadow": 1_000})  # asserted below: > 500 shadow rows
        # Refused: a truncated file, then a model whose feature names are in another order.
        run("deploy", str(corrupt))
        wait_for_deployment(workers, lambda v: (v["rejected"] or {}).get("revision") == 5)
        assert {deployment_of(w)["rejected"]["reason"] for w in workers} == {"not_a_model"}
        run("deploy", str(write_reordered_model(v2, tmp_path / "reordered.onnx", version="3")))
        wait_for_deployment(workers, lambda v: (v["rejected"] or {}).get("revision") == 6)
        assert {deployment_of(w)["rejected"]["reason"] for w in workers} == {"contract"}
        # Refused by the CLI: a file outside SEAM_MODEL_DIR, in one line. A record written around the CLI, naming
        # /dev/zero (read whole, it grew a worker to 23.7 GB): refused by every worker, which keep serving.
        outside = seam_model(cli_env, "deploy", "/etc/hostname")
        assert outside.returncode != 0 and "outside SEAM_MODEL_DIR" in outside.stderr, outside
        assert "Traceback" not in outside.stderr
        asyncio.run(control.write(kafka_bootstrap, env["SEAM_MODEL_CONTROL_TOPIC"],
                                  Deployment(revision=7, primary=ModelRef("/dev/zero", "0" * 64), command="deploy")))
        wait_for_deployment(workers, lambda v: (v["rejected"] or {}).get("revision") == 7)
        refusals = [deployment_of(w)["rejected"] for w in workers]
        assert {r["reason"] for r in refusals} == {"outside_model_dir"}, refusals
        assert all(v["revision"] == 4 and v["primary"]["model"] == V1_TAG for v in map(deployment_of, workers))
        wait_for_more(workers, "predictions after the refused deployments", {V1_TAG: 400, "prediction": 400})
        marks["rolled_back"] = (converged[3] + SETTLE_S, time.time())
        # Convergence is measured from each record's write (its Kafka timestamp), not from starting the command.
        control_topic = env["SEAM_MODEL_CONTROL_TOPIC"]
        records = asyncio.run(collect(kafka_bootstrap, [control_topic], done=lambda out: len(out[control_topic]) >= 7,
                                      timeout_s=30, settle_s=0))[control_topic]
        written = {r["revision"]: r["_kafka_ts"] / 1000 for r in records}
        convergence = {phase: converged[revision] - written[revision]
                       for phase, revision in (("canary", 1), ("promote", 2), ("rollback", 3))}
        status = seam_model(cli_env, "status")
        assert status.returncode == 0 and "revision 7" in status.stdout, status
        rejections = [line for w in workers for line in w.get("/metrics")[1].decode().splitlines()
                      if line.startswith("seam_model_deployment_rejections_total")]
        assert sorted(rejections) == sorted(
            f'seam_model_deployment_rejections_total{{reason="{reason}"}} 1.0'
            for reason in ("contract", "not_a_model", "outside_model_dir") for _ in workers), rejections
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
