"""Unit tests for app.cluster: merging the leader's distribution with each member's own standbys."""

from __future__ import annotations

from typing import Any

from app.cluster import describe_cluster, local_view

A, B = "http://a:6066", "http://b:6066"
CHANGELOG = "seam-card-state-changelog"


def describe(peer_views: dict[str, Any], generation: int = 3) -> dict[str, Any]:
    return describe_cluster(
        self_url=A, generation=generation, input_topic="tx", input_partitions=4,
        changelog_distribution={A: {CHANGELOG: [1, 0]}, B: {CHANGELOG: [2]}},
        external_distribution={A: {"tx": [1, 0]}, B: {"tx": [2], "seam-__assignor-__leader": [0]}},
        peer_views=peer_views)


def test_members_actives_and_standbys_are_merged_sorted() -> None:
    view = describe({A: local_view(A, 3, {}, {CHANGELOG: [2]}), B: local_view(B, 3, {}, {CHANGELOG: [1, 0]})})
    assert [m["url"] for m in view["workers"]] == [A, B]
    a, b = view["workers"]
    assert a["self"] and not b["self"]
    assert a["active"] == {CHANGELOG: [0, 1], "tx": [0, 1]}
    assert a["input_partitions"] == [0, 1] and b["input_partitions"] == [2]
    assert b["active"]["seam-__assignor-__leader"] == [0]
    assert a["standby_partitions"] == [2] and b["standby_partitions"] == [0, 1]
    assert view["unowned_input_partitions"] == [3]
    assert "generation" not in a and "error" not in b


def test_a_member_that_did_not_answer_has_unknown_standbys() -> None:
    view = describe({A: local_view(A, 3, {}, {}), B: "unreachable: timeout"})
    b = view["workers"][1]
    assert b["standby"] is None and b["standby_partitions"] is None
    assert b["error"] == "unreachable: timeout"
    assert b["input_partitions"] == [2]


def test_a_member_on_another_generation_is_flagged() -> None:
    view = describe({A: local_view(A, 3, {}, {}), B: local_view(B, 4, {}, {})})
    assert view["workers"][1]["generation"] == 4


def test_local_view_drops_empty_topics_and_sorts() -> None:
    assert local_view(A, 1, {"tx": [3, 1], "other": []}, {}) == {
        "url": A, "generation": 1, "active": {"tx": [1, 3]}, "standby": {}}
