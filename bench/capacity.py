"""Live capacity: whether an open-loop phase kept up, and where the next bisection probe goes (pure)."""

from __future__ import annotations

from typing import Any

__all__ = ["SLA_MS", "kept_up", "next_probe"]

SLA_MS = 50.0  # seam's default SEAM_SLA_MS, which the benchmark's seam workers run with


def kept_up(point: dict[str, Any], sla_ms: float = SLA_MS) -> bool:
    """Whether a load phase's lag stayed bounded: every input answered within the drain cap, and the p99
    of its last second no more than ``sla_ms`` above the highest p99 of its first two (a queue that
    grows for the whole phase shows in its last second)."""
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
