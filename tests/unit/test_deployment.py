"""Unit tests for agents.model.deployment: the deployment record, the commands' transitions, the canary's card hash."""

from __future__ import annotations

import collections
import hashlib
from pathlib import Path

import orjson
import pytest

from agents.model import control
from agents.model.deployment import (
    CANARY_BUCKETS,
    Deployment,
    DeploymentError,
    ModelRef,
    canary_bucket,
    deploy,
    file_sha256,
    initial,
    promote,
    rollback,
    set_shadow,
)
from tables.kafka import partition_of

V1 = ModelRef("/models/v1.onnx", "1" * 64)
V2 = ModelRef("/models/v2.onnx", "2" * 64)
V3 = ModelRef("/models/v3.onnx", "3" * 64)


def test_canary_then_promote_then_rollback_puts_every_card_back_on_the_first_model() -> None:
    start = initial(V1)
    canary = deploy(start, V2, canary_percent=20)
    assert (canary.revision, canary.primary, canary.canary, canary.canary_percent) == (1, V1, V2, 20.0)
    promoted = promote(canary)
    assert (promoted.revision, promoted.primary, promoted.canary) == (2, V2, None)
    back = rollback(promoted)
    assert (back.revision, back.primary, back.canary, back.command) == (3, V1, None, "rollback")
    with pytest.raises(DeploymentError, match="no earlier primary"):
        rollback(back)


def test_rollback_with_a_canary_withdraws_the_canary_only() -> None:
    canary = deploy(deploy(initial(V1), V2), V3, canary_percent=5)
    back = rollback(canary)
    assert (back.primary, back.canary, back.canary_percent) == (V2, None, 0.0)
    assert rollback(back).primary == V1  # and further back from there


def test_commands_refuse_what_makes_no_sense() -> None:
    with pytest.raises(DeploymentError, match="no canary"):
        promote(initial(V1))
    with pytest.raises(DeploymentError, match="already the primary"):
        deploy(initial(V1), V1, canary_percent=10)
    with pytest.raises(DeploymentError, match="between 0 and 100"):
        deploy(initial(V1), V2, canary_percent=100)
    with pytest.raises(DeploymentError, match="a canary needs a primary"):
        deploy(None, V2, canary_percent=10)


def test_a_shadow_stays_through_deploys_until_it_is_stopped() -> None:
    shadowed = set_shadow(initial(V1), V3)
    moved = deploy(shadowed, V2)
    assert (moved.primary, moved.shadow) == (V2, V3)
    stopped = set_shadow(moved, None)
    assert stopped.shadow is None
    with pytest.raises(DeploymentError, match="no shadow"):
        set_shadow(stopped, None)


def test_history_is_bounded() -> None:
    current = initial(V1)
    for index in range(30):
        current = deploy(current, V2 if index % 2 else V3)
    assert current.revision == 30 and len(current.history) == 10
    assert current.history[0].revision == 29


def test_the_record_round_trips_and_bad_records_are_refused_with_a_reason() -> None:
    deployment = deploy(set_shadow(initial(V1), V3), V2, canary_percent=12.5)
    assert control.decode(control.encode(deployment)) == deployment
    for value, reason in ((b"{", "not JSON"), (b"[]", "JSON object"), (None, "tombstone"),
                          (orjson.dumps({"revision": 1, "primary": {"path": "/m", "sha256": "xyz"}}), "sha256"),
                          (orjson.dumps({"revision": "1", "primary": V1.as_dict()}), "revision")):
        with pytest.raises(DeploymentError, match=reason):
            control.decode(value)


def test_same_models_ignores_revision_and_history() -> None:
    a = deploy(initial(V1), V2, canary_percent=20)
    b = Deployment(revision=9, primary=V1, canary=V2, canary_percent=20.0)
    assert a.same_models(b) and not a.same_models(promote(a))


def test_canary_buckets_are_stable_uniform_and_not_the_partitioners() -> None:
    cards = [f"card-{i:05d}" for i in range(20_000)]
    buckets = [canary_bucket(card) for card in cards]
    assert buckets == [canary_bucket(card) for card in cards]
    assert all(0 <= b < CANARY_BUCKETS for b in buckets)
    share = sum(b < 2_000 for b in buckets) / len(cards)
    assert 0.19 < share < 0.21
    # Ids a few characters apart (the synthetic generator's) too: a linear hash (CRC-32) gave 18.0 % here.
    short = [f"c-{i}" for i in range(5_000)]
    assert 0.188 < sum(canary_bucket(card) < 2_000 for card in short) / len(short) < 0.212
    # Within each input partition the canary takes the same share (its hash is not Kafka's).
    by_partition = collections.defaultdict(list)
    for card, bucket in zip(cards, buckets, strict=True):
        by_partition[partition_of(card.encode(), 8)].append(bucket < 2_000)
    assert all(0.17 < sum(v) / len(v) < 0.23 for v in by_partition.values())


def test_a_reference_hashes_the_file_as_it_is(tmp_path: Path) -> None:
    path = tmp_path / "m.onnx"
    path.write_bytes(b"model bytes")
    ref = ModelRef.of(path)
    assert ref.sha256 == file_sha256(path) == hashlib.sha256(b"model bytes").hexdigest()
    assert ref.path == str(path.resolve())
    with pytest.raises(DeploymentError, match="does not exist"):
        ModelRef.of(tmp_path / "missing.onnx")
