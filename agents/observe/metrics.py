"""Prometheus metrics of the model boundary and the pipeline (served at ``GET /metrics``)."""

from __future__ import annotations

import bisect
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

__all__ = ["BatchHistogram", "BoundaryMetrics", "BreachLog", "ModelMetrics"]

logger = logging.getLogger(__name__)

_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
_SECONDS_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0)
_SCORE_BUCKETS = tuple(round(0.05 * i, 2) for i in range(1, 21))
# A miss reads one header and a chunk per 32 events held: tens of microseconds to milliseconds.
_LOAD_BUCKETS = (0.00002, 0.00005, 0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5)
_LATENCY_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0,
                    5.0)


class _Series:
    """One label set's bucket counts and sum.

    Batches of values wait as arrays and are counted together (one ``searchsorted`` and one
    ``bincount`` per ``PENDING_VALUES`` values, or when the page is read): numpy's per-call cost,
    not the values, is what a batch of a few dozen costs.
    """

    __slots__ = ("_bounds", "_bound_list", "_counts", "_total", "_pending", "_pending_values")

    PENDING_VALUES = 8192

    def __init__(self, bounds: np.ndarray) -> None:
        self._bounds = bounds
        self._bound_list = bounds.tolist()
        self._counts = np.zeros(len(bounds) + 1, dtype=np.int64)  # the last: above every bound (+Inf)
        self._total = 0.0
        self._pending: list[np.ndarray] = []
        self._pending_values = 0

    @property
    def counts(self) -> np.ndarray:
        """Observations per bucket (not cumulative; the last is above every bound)."""
        self._count_pending()
        return self._counts

    @property
    def total(self) -> float:
        """The sum of the observed values."""
        self._count_pending()
        return self._total

    def observe(self, value: float) -> None:
        """Record one value."""
        self._counts[bisect.bisect_left(self._bound_list, value)] += 1
        self._total += value

    def observe_many(self, values: Iterable[float]) -> None:
        """Record many values at once (a batch's or a fetch's)."""
        if isinstance(values, np.ndarray):
            self._add(values.astype(np.float64))
        else:
            self._add(np.array(values if isinstance(values, list | tuple) else list(values), dtype=np.float64))

    def observe_ages(self, now_ms: float, timestamps_ms: Sequence[int]) -> None:
        """Record how long ago each of ``timestamps_ms`` was, in seconds (never below 0), at ``now_ms``."""
        ages = np.array(timestamps_ms, dtype=np.float64)
        np.subtract(now_ms, ages, out=ages)
        np.maximum(ages, 0.0, out=ages)
        ages *= 0.001
        self._add(ages)

    def _add(self, array: np.ndarray) -> None:
        if array.size:
            self._pending.append(array)
            self._pending_values += array.size
            if self._pending_values >= self.PENDING_VALUES:
                self._count_pending()

    def _count_pending(self) -> None:
        if not self._pending:
            return
        array = self._pending[0] if len(self._pending) == 1 else np.concatenate(self._pending)
        self._pending, self._pending_values = [], 0
        # side="left": a value equal to a bound falls in that bound's bucket (le, "<="), as in Prometheus.
        self._counts += np.bincount(self._bounds.searchsorted(array), minlength=len(self._counts))
        self._total += float(array.sum())


class BatchHistogram(Collector):
    """A Prometheus histogram that records a whole batch of values in one call.

    prometheus-client's ``Histogram.observe`` takes a lock and walks the buckets for every value:
    about 1 µs, three times per record on the worker's event loop (ingest, queue, end to end).
    Here a batch of values is one small array, counted with the next few thousand values in one
    ``searchsorted`` and one ``bincount`` (and always before the page is read). The exposition is the
    same (``_bucket`` with ``le``, ``_count``, ``_sum``). Not thread-safe: the worker observes and
    serves ``/metrics`` on its event loop.
    """

    def __init__(self, name: str, documentation: str, *, buckets: Sequence[float],
                 labelnames: Sequence[str] = (), registry: CollectorRegistry | None = None) -> None:
        self._name = name
        self._documentation = documentation
        self._bounds = np.asarray(sorted(float(b) for b in buckets), dtype=np.float64)
        self._labelnames = tuple(labelnames)
        self._series: dict[tuple[str, ...], _Series] = {}
        if not labelnames:
            self._series[()] = _Series(self._bounds)
        if registry is not None:
            registry.register(self)

    def labels(self, *values: str) -> _Series:
        """The series of one label set (created on first use)."""
        if len(values) != len(self._labelnames):
            raise ValueError(f"{self._name} takes labels {self._labelnames}, got {values}")
        series = self._series.get(values)
        if series is None:
            series = self._series[values] = _Series(self._bounds)
        return series

    def observe(self, value: float) -> None:
        """Record one value (no labels)."""
        self._series[()].observe(value)

    def observe_many(self, values: Iterable[float]) -> None:
        """Record many values (no labels)."""
        self._series[()].observe_many(values)

    def observe_ages(self, now_ms: float, timestamps_ms: Sequence[int]) -> None:
        """Record the ages of ``timestamps_ms`` at ``now_ms``, in seconds (no labels)."""
        self._series[()].observe_ages(now_ms, timestamps_ms)

    def collect(self) -> Iterator[HistogramMetricFamily]:
        """The exposition: cumulative buckets, count and sum per label set."""
        family = HistogramMetricFamily(self._name, self._documentation, labels=self._labelnames)
        edges = [*(floatToGoString(b) for b in self._bounds.tolist()), "+Inf"]
        for values, series in self._series.items():
            cumulative = np.cumsum(series.counts).tolist()
            family.add_metric(list(values), list(zip(edges, cumulative, strict=True)), series.total)
        yield family


class BreachLog:
    """Deadline misses as one warning per interval at most (a count, not a line per record)."""

    def __init__(self, interval_s: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self.sla_s: float | None = None
        self._clock = clock
        self._since = clock()
        self._items = self._late = self._lost = 0

    def record(self, items: int, misses: int, arrived_late: int) -> str | None:
        """Count one batch; return (and log) the warning when one is due."""
        self._items += items
        self._late += arrived_late
        self._lost += misses - arrived_late
        now = self._clock()
        if now - self._since < self.interval_s:
            return None
        items, late, lost, took = self._items, self._late, self._lost, now - self._since
        missed = late + lost
        self._since, self._items, self._late, self._lost = now, 0, 0, 0
        if not missed:
            return None
        budget = "" if self.sla_s is None else f" {self.sla_s * 1000:g} ms"
        message = (f"SLA: {missed:,} of {items:,} records scored in the last {took:.0f} s missed their{budget} "
                   f"deadline ({late:,} already late at the boundary, {lost:,} lost there); they were scored")
        logger.warning(message)
        return message


class BoundaryMetrics:
    """One registry per worker; the boundary reports each batch, the pipeline its records.

    Each served model reports its batches to its own :class:`ModelMetrics` (:meth:`for_model`): every
    model metric carries the ``model`` and ``version`` labels.
    """

    MODEL_LABELS = ("model", "version")

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r, model = self.registry, self.MODEL_LABELS
        self.batch_size = Histogram("seam_batch_size", "Rows per model batch.", model, buckets=_SIZE_BUCKETS,
                                    registry=r)
        self.queue_delay = BatchHistogram("seam_queue_delay_seconds", "Time an item waited at the boundary.",
                                          buckets=_SECONDS_BUCKETS, labelnames=model, registry=r)
        self.inference = Histogram("seam_inference_seconds", "Model time per batch.", model,
                                   buckets=_SECONDS_BUCKETS, registry=r)
        self.deadline_misses = Counter(
            "seam_deadline_misses", "Items scored after their SLA deadline, by where it was lost: ingest (already "
            "late when it reached the boundary) or boundary (queue, inference, delivery order).",
            ["stage", *model], registry=r)
        self.failed_rows = Counter("seam_inference_failed_rows", "Rows isolated as failing inference.", model,
                                   registry=r)
        self.batch_target = Gauge("seam_adaptive_batch_target", "Current batch size target.", model, registry=r)
        self.model = Gauge("seam_model_info", "The models served (1), their role (primary, canary, shadow) and "
                           "the provider each really runs on.", [*model, "provider", "role"], registry=r)
        self.scores = BatchHistogram("seam_scores", "Scores given, by model (the shadow's included).",
                                     buckets=_SCORE_BUCKETS, labelnames=model, registry=r)
        self.gc_pause = Histogram("seam_gc_pause_seconds", "Time the process stood still in CPython's cyclic garbage "
                                  "collector, by generation (2: a full collection).", ["generation"],
                                  buckets=_SECONDS_BUCKETS, registry=r)
        self.deployment_revision = Gauge("seam_model_deployment_revision", "The deployment revision served (0: "
                                         "SEAM_MODEL_PATH, nothing deployed through the control topic).", registry=r)
        self.deployment_rejections = Counter(
            "seam_model_deployment_rejections", "Deployments refused (the current models kept serving), by reason: "
            "missing_file, sha256_mismatch, not_a_model, contract, invalid_record, load_error.", ["reason"], registry=r)
        self.shadow_dropped = Counter("seam_shadow_dropped_rows", "Rows the shadow model could not take (its queue "
                                      "was full) and did not score.", model, registry=r)
        self.sla = Gauge("seam_sla_seconds", "The boundary's latency budget per record (SEAM_SLA_MS).", registry=r)
        self.events_in = Counter("seam_events_in", "Input records handled.", registry=r)
        self.events_out = Counter("seam_events_out", "Output records delivered, by kind and topic.",
                                  ["topic_kind", "topic"], registry=r)
        self.dead_letters = Counter("seam_dead_letters", "Records sent to the dead-letter topic, by reason.",
                                    ["reason"], registry=r)
        self.schema_lookups = Counter(
            "seam_schema_lookups", "Writer schemas looked up in the schema registry (Avro input), by result: found, "
            "unknown (not in the registry), unavailable (no answer in time), unsupported (not Avro).", ["result"],
            registry=r)
        self.late_records = Counter("seam_late_records", "Records behind their partition's watermark, sent to the "
                                    "late topic, by input partition.", ["partition"], registry=r)
        self.end_to_end = BatchHistogram(
            "seam_end_to_end_seconds", "Input record's broker timestamp to its prediction acknowledged by the broker.",
            buckets=_LATENCY_BUCKETS, registry=r)
        self.stage = BatchHistogram(
            "seam_stage_seconds", "Time per stage: ingest (input broker timestamp to the boundary, per record), "
            "delivery (prediction batch sent to acknowledged, per batch).", labelnames=["stage"],
            buckets=_LATENCY_BUCKETS, registry=r)
        self.loop_lag = Histogram("seam_event_loop_lag_seconds", "How late the event loop ran a 50 ms timer.",
                                  buckets=_LATENCY_BUCKETS, registry=r)
        self.state_flush = Histogram("seam_state_flush_seconds", "Writing changed key state before a commit.",
                                     buckets=_LATENCY_BUCKETS, registry=r)
        self.state_writes = Counter("seam_state_writes", "Changelog records written by state flushes.", registry=r)
        self.commit = Histogram("seam_commit_seconds", "Offset commits, state flush included.",
                                buckets=_LATENCY_BUCKETS, registry=r)
        self.rebalances = Counter("seam_rebalances", "Consumer group rebalances this worker took part in.",
                                  registry=r)
        self.rebalance = Histogram("seam_rebalance_seconds", "From partitions revoked to the new assignment "
                                   "handled (its state restore is seam_restore_remaining_records).",
                                   buckets=_LATENCY_BUCKETS, registry=r)
        self.state_load = Histogram("seam_state_load_seconds", "Reading a key state the cache did not hold from "
                                    "the table (RocksDB reads and decoding), per miss.", buckets=_LOAD_BUCKETS,
                                    registry=r)
        self.cached_keys = Gauge("seam_state_cached_keys", "Key states held in memory.", registry=r)
        self.cached_events = Gauge("seam_state_cached_events", "Events held in the key states in memory.",
                                   registry=r)
        self.cached_bytes = Gauge("seam_state_cached_bytes", "Memory of the key states in memory, as the cache "
                                  "counts it against its bound, seam_state_cache_limit_bytes.", registry=r)
        self.cache_limit = Gauge("seam_state_cache_limit_bytes", "The state cache's bound on unchanged key states: "
                                 "SEAM_STATE_CACHE_MB, or a quarter of the worker's memory limit.", registry=r)
        self.breaches = BreachLog()

    def set_sla(self, sla_s: float) -> None:
        """The latency budget per record: a gauge, and the deadline the breach warnings name."""
        self.sla.set(sla_s)
        self.breaches.sla_s = sla_s

    def for_model(self, name: str, version: str, provider: str, role: str) -> ModelMetrics:
        """The series of one model served in ``role`` (its ``model`` and ``version`` labels on every model metric)."""
        return ModelMetrics(self, name, version, provider, role)


class ModelMetrics:
    """One served model's series: its boundary reports each batch here (a :class:`BatchObserver`)."""

    def __init__(self, metrics: BoundaryMetrics, name: str, version: str, provider: str, role: str) -> None:
        labels = (name, version)
        self._metrics, self._info = metrics, (*labels, provider, role)
        metrics.model.labels(*self._info).set(1)
        self._batch_size = metrics.batch_size.labels(*labels)
        self._queue_delay = metrics.queue_delay.labels(*labels)
        self._inference = metrics.inference.labels(*labels)
        self._failed_rows = metrics.failed_rows.labels(*labels)
        self._batch_target = metrics.batch_target.labels(*labels)
        self._misses = {stage: metrics.deadline_misses.labels(stage, *labels) for stage in ("ingest", "boundary")}
        self.scores = metrics.scores.labels(*labels)
        self.shadow_dropped = metrics.shadow_dropped.labels(*labels)
        self._breaches = metrics.breaches if role != "shadow" else None  # a shadow has no deadline to keep

    def retire(self) -> None:
        """The model no longer serves in this role: drop its ``seam_model_info`` series (counts stay)."""
        with contextlib.suppress(KeyError):  # retired once already
            self._metrics.model.remove(*self._info)

    def on_batch(self, size: int, queue_s: Sequence[float], infer_s: float, failed_rows: int,
                 deadline_misses: int, target_size: int, arrived_late: int = 0) -> None:
        """Record one completed batch of this model."""
        self._batch_size.observe(size)
        self._queue_delay.observe_many(queue_s)
        self._inference.observe(infer_s)
        if failed_rows:
            self._failed_rows.inc(failed_rows)
        self._batch_target.set(target_size)
        if self._breaches is None:
            return
        if arrived_late:
            self._misses["ingest"].inc(arrived_late)
        if deadline_misses > arrived_late:
            self._misses["boundary"].inc(deadline_misses - arrived_late)
        self._breaches.record(size, deadline_misses, arrived_late)
