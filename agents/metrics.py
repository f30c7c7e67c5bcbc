"""Prometheus metrics of the model boundary and the pipeline (served at ``GET /metrics``)."""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["BoundaryMetrics"]

_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
_SECONDS_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0)
_LATENCY_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0,
                    5.0)


class BoundaryMetrics:
    """One registry per worker; the boundary reports each batch, the pipeline its records."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.batch_size = Histogram("seam_batch_size", "Rows per model batch.", buckets=_SIZE_BUCKETS, registry=r)
        self.queue_delay = Histogram("seam_queue_delay_seconds", "Time an item waited at the boundary.",
                                     buckets=_SECONDS_BUCKETS, registry=r)
        self.inference = Histogram("seam_inference_seconds", "Model time per batch.", buckets=_SECONDS_BUCKETS,
                                   registry=r)
        self.deadline_misses = Counter(
            "seam_deadline_misses", "Items scored after their SLA deadline, by where it was lost: ingest (already "
            "late when it reached the boundary) or boundary (queue, inference, delivery order).", ["stage"],
            registry=r)
        self.failed_rows = Counter("seam_inference_failed_rows", "Rows isolated as failing inference.", registry=r)
        self.events_in = Counter("seam_events_in", "Input records handled.", registry=r)
        self.events_out = Counter("seam_events_out", "Output records delivered.", ["topic_kind"], registry=r)
        self.batch_target = Gauge("seam_adaptive_batch_target", "Current batch size target.", registry=r)
        self.model = Gauge("seam_model_info", "The model served and the provider it runs on.",
                           ["model", "provider"], registry=r)
        self.end_to_end = Histogram(
            "seam_end_to_end_seconds", "Input record's broker timestamp to its prediction acknowledged by the broker.",
            buckets=_LATENCY_BUCKETS, registry=r)
        self.stage = Histogram(
            "seam_stage_seconds", "Time per stage: ingest (input broker timestamp to the boundary, per record), "
            "delivery (prediction batch sent to acknowledged, per batch).", ["stage"], buckets=_LATENCY_BUCKETS,
            registry=r)
        self.loop_lag = Histogram("seam_event_loop_lag_seconds", "How late the event loop ran a 50 ms timer.",
                                  buckets=_LATENCY_BUCKETS, registry=r)
        self.state_flush = Histogram("seam_state_flush_seconds", "Writing changed card state before a commit.",
                                     buckets=_LATENCY_BUCKETS, registry=r)
        self.state_writes = Counter("seam_state_writes", "Changelog records written by state flushes.", registry=r)
        self.commit = Histogram("seam_commit_seconds", "Offset commits, state flush included.",
                                buckets=_LATENCY_BUCKETS, registry=r)
        self.cached_cards = Gauge("seam_state_cached_cards", "Card states held in memory.", registry=r)
        self.cached_events = Gauge("seam_state_cached_events", "Events held in the card states in memory.",
                                   registry=r)

    def on_batch(self, size: int, queue_s: Sequence[float], infer_s: float, failed_rows: int,
                 deadline_misses: int, target_size: int, arrived_late: int = 0) -> None:
        """Record one completed batch."""
        self.batch_size.observe(size)
        for q in queue_s:
            self.queue_delay.observe(q)
        self.inference.observe(infer_s)
        if arrived_late:
            self.deadline_misses.labels("ingest").inc(arrived_late)
        if deadline_misses > arrived_late:
            self.deadline_misses.labels("boundary").inc(deadline_misses - arrived_late)
        if failed_rows:
            self.failed_rows.inc(failed_rows)
        self.batch_target.set(target_size)
