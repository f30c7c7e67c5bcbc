"""Unit tests for agents.observe.metrics.BatchHistogram: the same exposition as prometheus-client's Histogram."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from agents.observe.metrics import BatchHistogram

BUCKETS = (0.001, 0.005, 0.01, 0.5, 1.0, 5.0)


def exposition(registry: CollectorRegistry) -> list[str]:
    """The page's sample lines, without prometheus-client's own ``_created`` series."""
    return [line for line in generate_latest(registry).decode().splitlines()
            if line and not line.startswith("#") and "_created" not in line]


@given(batches=st.lists(st.lists(st.floats(min_value=0, max_value=10, allow_nan=False)), max_size=6),
       single=st.lists(st.sampled_from((0.0, *BUCKETS, 7.5)), max_size=5))
def test_batches_expose_what_one_value_at_a_time_would(batches: list[list[float]], single: list[float]) -> None:
    """Bucket counts (a value equal to a bound is in its bucket), count and sum match prometheus-client's."""
    reference, batched = CollectorRegistry(), CollectorRegistry()
    expected = Histogram("x_seconds", "doc", ["stage"], buckets=BUCKETS, registry=reference)
    actual = BatchHistogram("x_seconds", "doc", labelnames=["stage"], buckets=BUCKETS, registry=batched)
    for stage in ("ingest", "delivery"):  # a label set is exposed from its first labels() call
        expected.labels(stage)
        actual.labels(stage)
    for values in batches:
        for value in values:
            expected.labels("ingest").observe(value)
        actual.labels("ingest").observe_many(iter(values))
    for value in single:
        expected.labels("delivery").observe(value)
        actual.labels("delivery").observe(value)
    want, got = exposition(reference), exposition(batched)
    assert [line.rsplit(" ", 1)[0] for line in got] == [line.rsplit(" ", 1)[0] for line in want]
    for mine, theirs in zip(got, want, strict=True):
        assert float(mine.rsplit(" ", 1)[1]) == pytest.approx(float(theirs.rsplit(" ", 1)[1]))


def test_a_histogram_without_labels_and_wrong_labels() -> None:
    """Unlabelled series take values directly; a wrong label count is refused."""
    registry = CollectorRegistry()
    histogram = BatchHistogram("y_seconds", "doc", buckets=BUCKETS, registry=registry)
    histogram.observe_many([0.002, 0.002, 9.0])
    histogram.observe(0.001)
    lines = exposition(registry)
    assert 'y_seconds_bucket{le="0.001"} 1.0' in lines
    assert 'y_seconds_bucket{le="0.005"} 3.0' in lines
    assert 'y_seconds_count 4.0' in lines
    labelled = BatchHistogram("z_seconds", "doc", labelnames=["stage"], buckets=BUCKETS)
    with pytest.raises(ValueError, match="stage"):
        labelled.labels("a", "b")


@given(timestamps=st.lists(st.integers(min_value=0, max_value=20_000), max_size=40))
def test_ages_are_recorded_as_the_seconds_since_each_timestamp(timestamps: list[int]) -> None:
    """observe_ages(now, ts) is observe_many of max(0, now - ts) / 1000: a clock behind gives 0, not < 0."""
    now_ms = 10_000.0
    by_age, by_value = CollectorRegistry(), CollectorRegistry()
    BatchHistogram("a_seconds", "doc", buckets=BUCKETS, registry=by_age).observe_ages(now_ms, timestamps)
    BatchHistogram("a_seconds", "doc", buckets=BUCKETS, registry=by_value).observe_many(
        [max(0.0, now_ms - ts) / 1000 for ts in timestamps])
    for mine, theirs in zip(exposition(by_age), exposition(by_value), strict=True):
        assert mine.rsplit(" ", 1)[0] == theirs.rsplit(" ", 1)[0]
        assert float(mine.rsplit(" ", 1)[1]) == pytest.approx(float(theirs.rsplit(" ", 1)[1]))
