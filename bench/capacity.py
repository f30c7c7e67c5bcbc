"""Live capacity: whether an open-loop phase kept up, and where the next bisection probe goes (pure)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["SLA_MS", "kept_up", "next_probe", "p99_by_second"]

SLA_MS = 50.0  # seam's default SEAM_SLA_MS, which the benchmark's seam workers run with


def p99_by_second(sent_ms: Mapping[str, int], latency_ms: Mapping[str, int], start_ms: int) -> list[float]:
    """The p99 latency of the inputs sent in each whole second from ``start_ms`` (``sent_ms``: when each was sent;
    ``latency_ms``: those answered), in order.

    Only seconds that end before the last input was sent: the generator starts a little after the phase's
    clock, so its last second is cut short, and the few inputs sent in it meet a worker that no longer
    shares its cores with the generator. Taken as the phase's last second, it read a queue that grew for
    the whole phase (p99 533 ms in its first second, 1,077 ms in its sixth) as one that stayed bounded.
    """
    if not sent_ms:
        return []
    last_sent = max(sent_ms.values())
    by_second: dict[int, list[int]] = {}
    for tx_id, latency in latency_ms.items():
        second = (sent_ms[tx_id] - start_ms) // 1000
        if start_ms + (second + 1) * 1000 <= last_sent + 1:
            by_second.setdefault(second, []).append(latency)
    return [round(float(np.percentile(values, 99)), 1) for _, values in sorted(by_second.items())]


def kept_up(point: dict[str, Any], sla_ms: float = SLA_MS) -> bool:
    """Whether a load phase's lag stayed bounded: every input answered within the drain cap, and the p99
    of its last whole second (:func:`p99_by_second`) no more than ``sla_ms`` above the highest p99 of its first
    two (a queue that grows for the whole phase shows in its last second)."""
    if point.get("overloaded") or point.get("unanswered", 1) or not point.get("p99_ms_by_second"):
        return False
    by_second = point["p99_ms_by_second"]
    return bool(by_second[-1] <= max(by_second[:2]) + sla_ms)


def next_probe(points: list[dict[str, Any]], ceiling: float) -> tuple[float, float]:
    """The bracket (kept up, did not) that the load points so far leave for the live capacity."""
    kept = [p["offered_per_s"] for p in points if kept_up(p)]
    fell = [p["offered_per_s"] for p in points if not kept_up(p)]
    low = max(kept, default=0.0)
    high = min([rate for rate in fell if rate > low], default=ceiling)
    return float(low), float(high)
