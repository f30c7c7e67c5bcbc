"""Who owns what: the cluster as one worker sees it, built from Faust's assignment metadata.

Every assignment the group leader hands out carries the active partitions of every member, keyed by
the member's web URL: table changelogs in ``changelog_distribution`` and the other subscribed topics
(the input topic) in ``external_topic_distribution``. Standby partitions are only in each member's
own assignment, so ``GET /cluster/`` asks the other members for theirs (``?scope=local``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["TopicPartitions", "describe_cluster", "local_view"]

TopicPartitions = Mapping[str, Sequence[int]]


def _sorted(assignment: TopicPartitions) -> dict[str, list[int]]:
    return {topic: sorted(partitions) for topic, partitions in sorted(assignment.items()) if partitions}


def local_view(url: str, generation: int, actives: TopicPartitions, standbys: TopicPartitions) -> dict[str, Any]:
    """This worker's own assignment: what ``GET /cluster/?scope=local`` answers."""
    return {"url": url, "generation": generation, "active": _sorted(actives), "standby": _sorted(standbys)}


def describe_cluster(
    *,
    self_url: str,
    generation: int,
    input_topic: str,
    input_partitions: int,
    changelog_distribution: Mapping[str, TopicPartitions],
    external_distribution: Mapping[str, TopicPartitions],
    peer_views: Mapping[str, Mapping[str, Any] | str],
) -> dict[str, Any]:
    """Merge the leader's distribution (actives of every member) with each member's own standbys.

    ``peer_views`` maps a member URL to its local view, or to an error text when it did not answer.
    """
    urls = sorted(set(changelog_distribution) | set(external_distribution))
    workers = []
    owned: set[int] = set()
    for url in urls:
        active = _sorted({**external_distribution.get(url, {}), **changelog_distribution.get(url, {})})
        owned.update(active.get(input_topic, []))
        view = peer_views.get(url, "not asked")
        worker: dict[str, Any] = {"url": url, "self": url == self_url, "active": active}
        worker["input_partitions"] = active.get(input_topic, [])
        if isinstance(view, str):
            worker["standby"], worker["standby_partitions"], worker["error"] = None, None, view
        else:
            worker["standby"] = _sorted(view["standby"])
            # Tables are partitioned like the input topic: a standby changelog partition is a warm
            # copy of that input partition's state.
            worker["standby_partitions"] = sorted({p for ps in worker["standby"].values() for p in ps})
            if view["generation"] != generation:
                worker["generation"] = view["generation"]  # that member has moved on (or not yet)
        workers.append(worker)
    return {
        "served_by": self_url,
        "generation": generation,
        "input_topic": input_topic,
        "workers": workers,
        "unowned_input_partitions": sorted(set(range(input_partitions)) - owned),
    }
