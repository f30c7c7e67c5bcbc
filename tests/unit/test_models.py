"""Unit tests for agents.model.models.ModelSet: routing by card, swaps without a restart, refusals, the shadow.

Real ONNX Runtime sessions on CPU (the repository's two models share the feature contract and differ in
their tag) on real boundaries; no Kafka. Every wait is bounded by a hang guard.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from agents.model.boundary import BatchResult, ModelBoundary
from agents.model.deployment import Deployment, ModelRef, canary_bucket, deploy, initial, promote, set_shadow
from agents.model.models import ModelSet
from agents.model.runtime import ModelRuntime
from agents.observe.metrics import BoundaryMetrics
from tables.features import DEFAULT_SPEC
from tests.poison_model import write_reordered_model

ROOT = Path(__file__).resolve().parents[2]
V1 = ROOT / "models" / "fraud-mlp.onnx"  # fraud-mlp@1
V2 = ROOT / "models" / "fraud-mlp-bench.onnx"  # fraud-mlp-bench@1: same contract and scores, another tag
GUARD_S = 20.0
ROW = tuple(0.0 for _ in DEFAULT_SPEC.names)


class Harness:
    """A ModelSet whose deliveries are recorded as (role, model tag, card) per row."""

    def __init__(self, *, capacity_batch: int = 32) -> None:
        self.delivered: list[tuple[str, str, str]] = []
        self.failures: list[BaseException] = []
        self.metrics = BoundaryMetrics()
        self.release = asyncio.Event()
        self.release.set()
        self._batch = capacity_batch
        self.models = ModelSet(self._load, self._serve, self.failures.append)

    @staticmethod
    def _load(ref: ModelRef) -> ModelRuntime:
        runtime = ModelRuntime.load(ref.path, feature_names=DEFAULT_SPEC.names, device="cpu", sha256=ref.sha256)
        runtime.warmup([1, 8])
        return runtime

    def _serve(self, runtime: ModelRuntime, role: str) -> tuple[ModelBoundary[Any], Any]:
        info = runtime.info
        metrics = self.metrics.for_model(info.name, info.version, info.provider, role)

        async def deliver(result: BatchResult[Any]) -> None:
            if role == "shadow":
                await self.release.wait()
            self.delivered.extend((role, info.tag, item.tx.key) for item in result.items)

        boundary: ModelBoundary[Any] = ModelBoundary(runtime.predict, deliver, max_batch_size=self._batch,
                                                     max_wait_ms=1, max_inflight_batches=1, sla_ms=50, adaptive=True)
        return boundary, metrics

    async def submit(self, cards: list[str]) -> None:
        rows = [(ROW, SimpleNamespace(tx=SimpleNamespace(key=card))) for card in cards]
        await asyncio.wait_for(self.models.submit_many(rows), GUARD_S)

    async def settle(self, count: int) -> None:
        async def wait() -> None:
            while len(self.delivered) < count:
                await asyncio.sleep(0.005)
        await asyncio.wait_for(wait(), GUARD_S)


@pytest.fixture
async def harness() -> AsyncIterator[Harness]:
    h = Harness()
    await h.models.start(initial(ModelRef.of(V1)))
    yield h
    await h.models.close()


CARDS = [f"card-{i}" for i in range(2_000)]


async def test_a_canary_scores_its_share_of_cards_and_each_card_stays_on_one_model(harness: Harness) -> None:
    deployment = deploy(harness.models.deployment, ModelRef.of(V2), canary_percent=20)
    assert await harness.models.apply(deployment)
    await harness.submit(CARDS + CARDS)
    await harness.settle(2 * len(CARDS))
    by_card: dict[str, set[str]] = {}
    for _role, tag, card in harness.delivered:
        by_card.setdefault(card, set()).add(tag)
    assert all(len(tags) == 1 for tags in by_card.values())
    canary_cards = {card for card, tags in by_card.items() if tags == {"fraud-mlp-bench@1"}}
    assert canary_cards == {card for card in CARDS if canary_bucket(card) < 2_000}
    assert 0.17 < len(canary_cards) / len(CARDS) < 0.23
    assert harness.failures == []


async def test_a_swap_lets_queued_rows_finish_on_their_model_and_sends_new_rows_to_the_new_one(
        harness: Harness) -> None:
    before = [f"before-{i}" for i in range(500)]
    await harness.submit(before)  # queued (or dispatched) at the old primary, not yet delivered
    old = harness.models.primary
    assert await harness.models.apply(deploy(harness.models.deployment, ModelRef.of(V2)))
    after = [f"after-{i}" for i in range(500)]
    await harness.submit(after)
    await harness.settle(1_000)
    tags = {card: tag for _role, tag, card in harness.delivered}
    assert len(harness.delivered) == 1_000  # every row exactly once
    assert {tags[c] for c in before} == {"fraud-mlp@1"}
    assert {tags[c] for c in after} == {"fraud-mlp-bench@1"}
    assert old is not None and old.task is not None and old.task.done()  # the old boundary stopped
    assert harness.models.swaps == 1


async def test_a_promotion_keeps_the_canarys_model_loaded(harness: Harness) -> None:
    canary = deploy(harness.models.deployment, ModelRef.of(V2), canary_percent=50)
    assert await harness.models.apply(canary)
    runtime = harness.models.canary.runtime  # type: ignore[union-attr]
    assert await harness.models.apply(promote(canary))
    assert harness.models.primary.runtime is runtime and harness.models.canary is None  # type: ignore[union-attr]


@pytest.mark.parametrize("case, reason", [
    ("missing", "missing_file"), ("corrupt", "not_a_model"), ("hash", "sha256_mismatch"), ("features", "contract"),
])
async def test_a_model_that_cannot_serve_is_refused_and_the_old_one_keeps_scoring(
        harness: Harness, tmp_path: Path, case: str, reason: str) -> None:
    if case == "missing":
        ref = ModelRef(str(tmp_path / "gone.onnx"), "0" * 64)
    elif case == "corrupt":
        (tmp_path / "corrupt.onnx").write_bytes(V1.read_bytes()[:500])
        ref = ModelRef.of(tmp_path / "corrupt.onnx")
    elif case == "hash":
        ref = ModelRef(str(V2), "f" * 64)
    else:
        ref = ModelRef.of(write_reordered_model(V1, tmp_path / "reordered.onnx"))
    serving = harness.models.deployment
    attempt = deploy(serving, ref, canary_percent=30)
    assert not await harness.models.apply(attempt)
    rejected = harness.models.rejected
    assert rejected is not None and (rejected.revision, rejected.reason) == (attempt.revision, reason)
    assert harness.models.deployment is serving
    await harness.submit(CARDS[:100])
    await harness.settle(100)
    assert {tag for _role, tag, _card in harness.delivered} == {"fraud-mlp@1"}
    described = harness.models.describe()
    assert described["rejected"]["reason"] == reason and described["canary"] is None  # type: ignore[index]


async def test_a_shadow_scores_the_same_rows_and_drops_what_it_cannot_take(harness: Harness) -> None:
    shadowed = set_shadow(harness.models.deployment, ModelRef.of(V2))
    assert await harness.models.apply(shadowed)
    harness.release.clear()  # the shadow's deliveries hang: its boundary fills up
    await harness.submit(CARDS)  # never waits for the shadow
    await harness.settle(len(CARDS))
    primary = [d for d in harness.delivered if d[0] == "primary"]
    assert len(primary) == len(CARDS)
    dropped = harness.metrics.shadow_dropped.labels("fraud-mlp-bench", "1")._value.get()
    assert dropped > 0
    harness.release.set()
    await harness.settle(2 * len(CARDS) - int(dropped))
    shadow = [d for d in harness.delivered if d[0] == "shadow"]
    assert len(shadow) == len(CARDS) - dropped and {tag for _r, tag, _c in shadow} == {"fraud-mlp-bench@1"}


async def test_a_start_on_a_refused_deployment_falls_back_to_the_settings_model(tmp_path: Path) -> None:
    h = Harness()
    broken = Deployment(revision=4, primary=ModelRef(str(tmp_path / "gone.onnx"), "0" * 64))
    await h.models.start(broken, fallback=initial(ModelRef.of(V1)))
    try:
        assert h.models.primary is not None and h.models.primary.runtime.info.tag == "fraud-mlp@1"
        assert h.models.rejected is not None and h.models.rejected.revision == 4
        await h.submit(["a", "b"])
        await h.settle(2)
    finally:
        await h.models.close()


def test_scores_are_the_same_from_both_models() -> None:
    """The two files differ in tag only (the bench model's extra layers are zero-weighted)."""
    features = np.random.default_rng(3).normal(size=(16, len(DEFAULT_SPEC.names))).astype(np.float32)
    one = ModelRuntime.load(V1, feature_names=DEFAULT_SPEC.names, device="cpu").predict(features)
    two = ModelRuntime.load(V2, feature_names=DEFAULT_SPEC.names, device="cpu").predict(features)
    assert np.allclose(one, two, atol=1e-5)


async def test_a_start_on_a_refused_deployment_serves_the_newest_earlier_one_that_can(tmp_path: Path) -> None:
    """What the running workers kept serving when they refused it: a restarted worker joins them."""
    good = set_shadow(initial(ModelRef.of(V1)), ModelRef.of(V2))
    broken = ModelRef(str(tmp_path / "gone.onnx"), "0" * 64)
    latest = deploy(deploy(good, broken), ModelRef.of(V2), canary_percent=10)  # revisions 2 and 3 refused
    h = Harness()
    await h.models.start(latest, fallback=initial(ModelRef.of(V2)))
    try:
        assert h.models.deployment is not None and h.models.deployment.revision == good.revision
        assert h.models.shadow is not None and h.models.rejected is not None and h.models.rejected.revision == 3
    finally:
        await h.models.close()


async def test_a_loader_that_raises_anything_refuses_the_deployment_instead_of_stopping_the_worker(
        harness: Harness) -> None:
    def broken(ref: ModelRef) -> ModelRuntime:
        raise RuntimeError("CUDA session could not be created")

    harness.models._load = broken  # the loader of a worker whose device fails on the new file
    assert not await harness.models.apply(deploy(harness.models.deployment, ModelRef.of(V2)))
    assert harness.models.rejected is not None and harness.models.rejected.reason == "load_error"
    assert harness.models.primary is not None and harness.models.primary.runtime.info.tag == "fraud-mlp@1"
