"""Read a worker's ``GET /metrics`` page back: histogram quantiles (bucket upper bounds) and values."""

from __future__ import annotations

import math
import urllib.request
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["Histogram", "fetch", "histograms", "merged", "since"]


@dataclass(frozen=True)
class Histogram:
    """One histogram series: cumulative bucket counts by upper bound."""

    buckets: tuple[tuple[float, float], ...]  # (upper bound, cumulative count), ascending

    @property
    def count(self) -> float:
        return self.buckets[-1][1] if self.buckets else 0.0

    def quantile(self, q: float) -> float:
        """The upper bound of the bucket holding the ``q`` quantile (``inf`` past the last finite one)."""
        total = self.count
        for bound, cumulative in self.buckets:
            if total and cumulative >= q * total:
                return bound
        return math.nan

    def minus(self, earlier: Histogram | None) -> Histogram:
        """What was observed after ``earlier`` (the same series read before): counts bucket by bucket."""
        if earlier is None:
            return self
        before = dict(earlier.buckets)
        return Histogram(tuple((bound, count - before.get(bound, 0.0)) for bound, count in self.buckets))

    def max_bound(self) -> float:
        """The upper bound of the highest bucket with observations: the largest value is at most this."""
        previous, worst = 0.0, 0.0
        for bound, cumulative in self.buckets:
            if cumulative > previous:
                worst = bound
            previous = cumulative
        return worst


def fetch(url: str, timeout_s: float = 2.0) -> str:
    """GET a /metrics page."""
    with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 - the worker's own page
        return str(response.read().decode())


def histograms(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], Histogram]:
    """Every histogram series on the page, by (name, labels other than ``le``)."""
    series: dict[tuple[str, tuple[tuple[str, str], ...]], list[tuple[float, float]]] = {}
    for family in text_string_to_metric_families(text):
        if family.type != "histogram":
            continue
        for sample in family.samples:
            if not sample.name.endswith("_bucket"):
                continue
            labels = tuple(sorted((k, v) for k, v in sample.labels.items() if k != "le"))
            series.setdefault((family.name, labels), []).append((float(sample.labels["le"]), sample.value))
    return {key: Histogram(tuple(sorted(points))) for key, points in series.items()}


def since(after: str, before: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], Histogram]:
    """Every histogram series of the page ``after``, less what the earlier page ``before`` had observed."""
    earlier = histograms(before)
    return {key: series.minus(earlier.get(key)) for key, series in histograms(after).items()}


def merged(observed: dict[tuple[str, tuple[tuple[str, str], ...]], Histogram], name: str,
           labels: tuple[tuple[str, str], ...] = ()) -> Histogram | None:
    """The sum of ``name``'s series whose labels include ``labels`` (for example every model version's)."""
    wanted = set(labels)
    matching = [series for (family, own), series in observed.items() if family == name and wanted <= set(own)]
    if not matching:
        return None
    totals: dict[float, float] = {}
    for series in matching:
        for bound, count in series.buckets:
            totals[bound] = totals.get(bound, 0.0) + count
    return Histogram(tuple(sorted(totals.items())))
