"""Wiring of the scoring pipeline into a Faust app: ingestion, the model service, the outputs.

:func:`install` adds it to an app built from :class:`app.settings.Settings` (see :func:`app.main.create_app`);
nothing here reads the environment or builds anything at import. ``ScoringService`` loads the ONNX
Runtime session when the worker starts, owns the model boundary and the pipeline, and delivers scored
batches. The processing guarantee and the ingestion path are chosen once, in :func:`install`:

* the guarantee (:mod:`agents.commit.guarantee`): at least once (outputs and the changelog on producers
  of their own) or exactly once (Kafka transactions); it owns the producers and how state is written;
* batch ingestion (``SEAM_INGEST=batch``, the default): per-partition lists beneath Faust's per-event
  path (:mod:`agents.ingest.consumer`), committed by :class:`agents.commit.checkpoint.Checkpoint`;
* stream ingestion (``SEAM_INGEST=stream``): a plain Faust agent, at least once, with each batch's
  state changes written through Faust's tables at once.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any, cast

import faust
import numpy as np
from faust import Stream
from faust.types import EventT
from mode import Service
from prometheus_client import Histogram

from agents.commit.checkpoint import Checkpoint
from agents.commit.guarantee import guarantee_for
from agents.delivery.outputs import OutputProducer
from agents.formats.avro import SchemaRegistry
from agents.formats.codec import Contract
from agents.formats.record_format import RecordFormat, avro_format, json_format
from agents.ingest import consumer as ingest
from agents.ingest.records import Acker, RecordBatch
from agents.model.boundary import BatchResult, ModelBoundary
from agents.model.control import ControlFollower
from agents.model.deployment import Deployment, DeploymentError, ModelRef, initial
from agents.model.models import ModelSet
from agents.model.runtime import ModelFileError, ModelFiles, ModelInfo, ModelRuntime
from agents.observe.metrics import BoundaryMetrics, ModelMetrics
from agents.observe.monitor import (
    InputPartition,
    Readiness,
    Restore,
    Snapshot,
    StatePartition,
    WorkerCollector,
    readiness,
)
from agents.pipeline import Outputs, Pipeline, ScoringItem
from app.settings import Settings
from tables.cache import StateCache, StoreState
from tables.faust_compat import committed_offset, restore_state, restoring, rocksdb_partitions
from tables.features import KeyState
from tables.key_store import Stored, changes, stored_key
from tables.spec import FeatureSpec
from tables.state import LAYOUT_KEY, WATERMARK_KEY, StateTables

__all__ = ["ScoringService", "install"]

logger = logging.getLogger(__name__)


def _age_s(item: ScoringItem) -> float:
    """How long ago the item's input record reached the broker: the deadline counts from there."""
    return max(0.0, time.time() - item.record.timestamp / 1000)


def _scored(result: BatchResult[ScoringItem]) -> np.ndarray:
    """A batch's scores without the rows whose inference failed."""
    if not result.row_errors:
        return result.scores
    return np.delete(result.scores, list(result.row_errors))


def _tune_garbage_collection() -> None:
    """Keep CPython's cyclic collector from stalling the event loop (reference counting frees the rest).

    A full collection walks every tracked object, the cached key states' columns included, and holds
    the event loop meanwhile: 80-200 ms every 2-3 s at 4,000 events/s with the default thresholds.
    Everything loaded by now (Faust, aiokafka, ONNX Runtime, numpy) lives as long as the worker and is
    frozen, so no collection walks it again.

    The allocation counter alone does not bound a young collection: every free of a collected object counts
    against it, so a worker in steady churn (each event's new objects in, the old ones out) never reaches
    the threshold while the new objects pile up in the young generation. A young collection then walked
    600,000 of them and held the loop for 0.4-1.2 s, in the minutes the cache filled. So the worker runs a
    young collection every ``GC_YOUNG_INTERVAL_S`` (:meth:`ScoringService._collect_young`), which walks
    what a tenth of a second made, and freezes what it leaves: no later collection walks an object twice.
    Cyclic garbage is therefore collected only while it is young, which is all the worker makes: over
    soaks at 3,000 events/s, collections of the older generations found nothing to free, and a full one
    took 226-282 ms with 100,000 keys cached. Unfrozen, the older generations would hold every cached
    key's columns, and an automatic collection of them (its threshold counts the young collections, so it
    comes due whenever an allocation burst starts one) would walk them all.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG_ALLOCATIONS, 10, 100)


GC_YOUNG_ALLOCATIONS = 20_000
GC_YOUNG_INTERVAL_S = 0.1


def _timed_collections(pause: Histogram) -> Callable[[str, dict[str, Any]], None]:
    """A ``gc.callbacks`` entry that observes how long each collection holds the process, by generation."""
    by_generation = [pause.labels(str(generation)) for generation in range(3)]
    started = 0.0

    def callback(phase: str, info: dict[str, Any]) -> None:
        nonlocal started
        if phase == "start":
            started = time.perf_counter()
        else:
            by_generation[info["generation"]].observe(time.perf_counter() - started)

    return callback


class ScoringService(Service):
    """Owns the models (agents.model.models), their boundaries and the pipeline; delivers scored batches to Kafka.

    The models served are the control topic's deployment (agents.model.control), followed while the worker
    runs; with none there, ``SEAM_MODEL_PATH``.
    """

    def __init__(self, app: faust.App, settings: Settings, tables: StateTables, spec: FeatureSpec,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.app, self.settings, self.tables = app, settings, tables
        self.spec, self.contract = spec, Contract(spec)  # what the input holds and which features it gets
        self.models: ModelSet[ScoringItem] | None = None
        self._gc_timer: Callable[[str, dict[str, Any]], None] | None = None  # times collections once ready
        self.control: ControlFollower | None = None
        self.shadow_producer: OutputProducer | None = None
        self._shadow_starting = asyncio.Lock()
        self.pipeline: Pipeline | None = None
        self.format: RecordFormat = json_format(self.contract, settings.max_record_bytes)
        self.metrics = BoundaryMetrics()
        WorkerCollector(self._snapshot, registry=self.metrics.registry)
        self._revoked_at: float | None = None  # when the running rebalance revoked the partitions
        # Chosen once: what differs between at least once and exactly once (producers, state writes,
        # fencing, revocation, stop).
        self.guarantee = guarantee_for(
            settings.processing_guarantee, bootstrap=settings.kafka, group_id=app.conf.id,
            input_topic=settings.input_topic, write_interval_s=settings.state_write_interval_s,
            current_epoch=lambda: cast(ingest.BatchConsumer, app.consumer).epoch)
        self._ready = asyncio.Event()
        self.joined_generation: int | None = None  # the group generation of the last assignment received

    def _state_writers(self) -> tuple[StoreState, Callable[[int], None], Callable[[str], None]]:
        """How the state cache writes a key's state, a watermark and a layout record, for the configured mode."""
        tables = self.tables
        if self.settings.ingest == "stream":
            # The plain Faust path: Faust table writes, with each batch's changes at once.
            return tables.store_state, tables.store_watermark, tables.store_layout
        write = self.guarantee.table_write

        def write_state(key: str, state: KeyState, stored: Stored, touched: set[int]) -> int:
            partition = ingest.current_partition()
            writes = changes(stored_key(key), state, stored, touched)
            for raw, value in writes:
                write(tables.state_table, partition, raw, value)
            return len(writes)

        def write_watermark(max_ts: int) -> None:
            write(tables.watermarks, ingest.current_partition(), WATERMARK_KEY, max_ts)

        def write_layout(layout: str) -> None:
            write(tables.watermarks, ingest.current_partition(), LAYOUT_KEY, layout)

        return write_state, write_watermark, write_layout

    async def on_start(self) -> None:
        settings = self.settings
        self.metrics.set_sla(settings.sla_ms / 1000)
        send = await self.guarantee.start()
        if settings.input_format == "avro":
            subjects = {"prediction": f"{settings.predictions_topic}-value",
                        "shadow-score": f"{settings.shadow_topic}-value"}
            if settings.feature_log_topic:
                subjects["features"] = f"{settings.feature_log_topic}-value"
            registry = SchemaRegistry(settings.schema_registry_url, username=settings.schema_registry_username,
                                      password=settings.schema_registry_password,
                                      ca_file=settings.schema_registry_ca_file)
            self.format = await avro_format(
                registry, subjects=subjects, contract=self.contract,
                timeout_s=settings.schema_registry_timeout_s, max_record_bytes=settings.max_record_bytes,
                on_lookup=lambda result: self.metrics.schema_lookups.labels(result).inc())
        outputs = Outputs(settings.predictions_topic, settings.dlq_topic, settings.late_topic, send,
                          feature_log_topic=settings.feature_log_topic or None)
        lateness_ms = self.spec.allowed_lateness_ms
        store_state, store_max_ts, store_layout = self._state_writers()
        cache_bytes = settings.state_cache_bytes
        self.metrics.cache_limit.set(cache_bytes)
        logger.info("state cache: %d MB of key states in memory (%s)", cache_bytes >> 20,
                    "SEAM_STATE_CACHE_MB" if settings.state_cache_mb else "a quarter of the worker's memory limit")
        cache = StateCache(
            load_state=self.tables.load_state, load_states=self.tables.load_states,
            load_watermark=self.tables.load_watermark, store_state=store_state,
            store_watermark=store_max_ts, allowed_lateness_ms=lateness_ms,
            max_clean_bytes=cache_bytes, spec=self.spec,
            load_layout=self.tables.load_layout, store_layout=store_layout, read_events=self.tables.read_events,
            on_load=self.metrics.state_load.observe,
            scope=lambda partition: ingest.table_partition(settings.input_topic, partition))
        models = ModelSet(self._load_model, self._serve, self._on_dispatch_failure, metrics=self.metrics)
        self.pipeline = Pipeline(
            models, outputs, cache, allowed_lateness_ms=lateness_ms,
            on_delivery_failure=self._on_delivery_failure,
            # The plain Faust path has no commit hook: write each batch's changes through at once.
            write_through=settings.ingest == "stream", metrics=self.metrics if settings.metrics else None,
            record_format=self.format, max_future_ms=int(settings.max_future_s * 1000),
            max_past_ms=int(settings.max_past_s * 1000))
        # The control topic's deployment first: a worker that starts later serves what the others serve.
        self.control = ControlFollower(settings.kafka, settings.model_control_topic)
        await self.control.start()
        try:
            default: Deployment | None = initial(await asyncio.to_thread(ModelRef.of, settings.model_path))
        except DeploymentError as exc:
            default, missing = None, f"SEAM_MODEL_PATH: {exc}"
        latest = await self.control.catch_up()
        if isinstance(latest, DeploymentError):
            models.reject(None, latest)
            latest = None
        if latest is not None:
            await models.start(latest, fallback=default)
        elif default is not None:
            await models.start(default)
        else:
            raise ModelFileError(f"{missing}, and the control topic {settings.model_control_topic!r} holds no "
                                 "deployment", "missing_file")
        self.models = models
        _tune_garbage_collection()
        self._gc_timer = _timed_collections(self.metrics.gc_pause)
        gc.callbacks.append(self._gc_timer)
        self._ready.set()
        logger.info("model boundary ready: %s, ingest=%s max_batch_size=%d max_wait_ms=%s sla_ms=%s "
                    "adaptive=%s guarantee=%s", models.describe_short(), settings.ingest,
                    settings.max_batch_size, settings.max_wait_ms, settings.sla_ms, settings.adaptive_batching,
                    settings.processing_guarantee)

    def _load_model(self, ref: ModelRef) -> ModelRuntime:
        """Read, hash, open, check and warm one model (blocking: on a thread of its own)."""
        settings = self.settings
        files = ModelFiles.under(settings.model_root, settings.model_path, max_bytes=settings.max_model_mb << 20)
        runtime = ModelRuntime.load(ref.path, feature_names=self.spec.names, device=settings.device,
                                    threads=settings.inference_threads, sha256=ref.sha256, files=files)
        runtime.warmup(sorted({1, min(8, settings.max_batch_size), settings.max_batch_size}))
        return runtime

    def _serve(self, runtime: ModelRuntime, role: str) -> tuple[ModelBoundary[ScoringItem], ModelMetrics]:
        """A boundary for ``runtime`` in ``role``: its scores become predictions, or shadow scores."""
        settings, info = self.settings, runtime.info
        metrics = self.metrics.for_model(info.name, info.version, info.provider, role)
        deliver = (functools.partial(self._deliver_shadow, info, metrics) if role == "shadow"
                   else functools.partial(self._deliver, info, metrics))
        boundary: ModelBoundary[ScoringItem] = ModelBoundary(
            runtime.predict, deliver,
            max_batch_size=settings.max_batch_size, max_wait_ms=settings.max_wait_ms,
            max_inflight_batches=settings.max_inflight_batches, sla_ms=settings.sla_ms,
            adaptive=settings.adaptive_batching, observer=metrics if settings.metrics else None,
            # A shadow keeps no deadline: its rows' scores change nothing downstream.
            age_of=None if role == "shadow" else _age_s)
        return boundary, metrics

    @property
    def runtime(self) -> ModelRuntime | None:
        """The primary model (the one every key not on a canary gets)."""
        primary = None if self.models is None else self.models.primary
        return None if primary is None else primary.runtime

    @property
    def boundary(self) -> ModelBoundary[ScoringItem] | None:
        """The primary model's boundary."""
        primary = None if self.models is None else self.models.primary
        return None if primary is None else primary.boundary

    async def on_stop(self) -> None:
        if self._gc_timer is not None and self._gc_timer in gc.callbacks:
            gc.callbacks.remove(self._gc_timer)
        # The app has stopped fetching by now (the consumer's own last commit comes after this service
        # has stopped): at least once commits what is delivered while its producers still run.
        if self.pipeline is not None:
            await self.guarantee.stopping(self.app)
        if self.models is not None:
            await self.models.close()
        if self.control is not None:
            await self.control.stop()
            self.control = None
        await self.guarantee.close()
        if self.shadow_producer is not None:
            await self.shadow_producer.stop()
            self.shadow_producer = None
        if self.format.close is not None:
            await self.format.close()

    async def wait_ready(self) -> Pipeline:
        """Return the pipeline once the model is loaded."""
        await self._ready.wait()
        assert self.pipeline is not None
        return self.pipeline

    @Service.task
    async def _follow_deployments(self) -> None:
        """Apply each new deployment the control topic brings (the newest, when several arrive at once)."""
        await self.wait_ready()
        models, control = self.models, self.control
        assert models is not None and control is not None
        while not self.should_stop:
            latest = await control.next(timeout_s=1.0)
            if isinstance(latest, DeploymentError):
                models.reject(None, latest)
            elif latest is not None:
                await models.apply(latest)  # a refusal is recorded (and counted) there

    @Service.task
    async def _write_behind(self) -> None:
        await self.wait_ready()
        if self.settings.ingest == "batch":  # the plain Faust path writes each batch's changes at once
            await self.guarantee.write_behind(self, self.app)

    @Service.task
    async def _collect_young(self) -> None:
        """A young collection every GC_YOUNG_INTERVAL_S, so none has much to walk, and what it leaves frozen, so
        none walks it again (see _tune_garbage_collection)."""
        await self.wait_ready()
        while not self.should_stop:
            await asyncio.sleep(GC_YOUNG_INTERVAL_S)
            gc.collect(0)
            gc.freeze()

    @Service.task
    async def _watch_event_loop(self) -> None:
        """Measure how late the event loop runs a timer: what every record waits for when it stalls."""
        interval_s, lag = 0.05, self.metrics.loop_lag
        while not self.should_stop:
            started = time.perf_counter()
            await asyncio.sleep(interval_s)
            lag.observe(max(0.0, time.perf_counter() - started - interval_s))

    async def _deliver(self, info: ModelInfo, metrics: ModelMetrics, result: BatchResult[ScoringItem]) -> None:
        assert self.pipeline is not None
        await self.pipeline.deliver(result, info, self.settings.fraud_threshold)
        if self.settings.metrics:
            metrics.scores.observe_many(_scored(result))

    async def _deliver_shadow(self, info: ModelInfo, metrics: ModelMetrics, result: BatchResult[ScoringItem]
                              ) -> None:
        """Send a shadow batch's scores; nothing waits for them and no record's acknowledgement depends on them."""
        producer = self.shadow_producer
        if producer is None:
            async with self._shadow_starting:
                if self.shadow_producer is None:
                    started = OutputProducer(self.settings.kafka)
                    await started.start()
                    self.shadow_producer = started
            producer = self.shadow_producer
            assert producer is not None
        topic, tag, errors, encode = self.settings.shadow_topic, info.tag, result.row_errors, self.format.shadow_score
        deliveries = []
        for index, (item, score) in enumerate(zip(result.items, result.scores.tolist(), strict=True)):
            if index not in errors:
                deliveries.append(await producer.send(
                    None, topic, item.tx.key.encode(), encode(item.tx, score=score, model=tag)))
        if self.settings.metrics:
            metrics.scores.observe_many(_scored(result))
        if deliveries:
            asyncio.gather(*deliveries).add_done_callback(functools.partial(self._shadow_delivered, len(deliveries)))

    def _shadow_delivered(self, count: int, done: asyncio.Future[Any]) -> None:
        if done.cancelled() or done.exception() is not None:
            error = "cancelled" if done.cancelled() else repr(done.exception())
            logger.warning("%d shadow scores could not be delivered: %s (predictions are not affected)", count, error)
            return
        if self.settings.metrics:
            self.metrics.events_out.labels("shadow", self.settings.shadow_topic).inc(count)

    def _on_dispatch_failure(self, error: BaseException) -> None:
        logger.error("a model boundary failed: %r; stopping the worker", error)
        self.add_future(self.crash(error))

    def _on_delivery_failure(self, error: BaseException) -> None:
        # Not acknowledging keeps the offset uncommitted; stopping makes the record come back.
        if self.app.should_stop:
            return  # the producer is closing under a pending send: the record is simply redelivered
        logger.error("an output could not be delivered: %r; stopping the worker", error)
        self.add_future(self.crash(error))  # owned by the service

    # Rebalances and shutdown (connected to the app's signals by install()).

    async def on_partitions_revoked(self, revoked: Any) -> None:
        self._revoked_at = time.perf_counter()
        if self.pipeline is not None:
            self.pipeline.forget_partitions()
        await self.guarantee.revoked()

    async def on_partitions_assigned(self, assigned: Any) -> None:
        self._rebalanced(assigned)
        self.guarantee.assigned(self.app)

    def _rebalanced(self, assigned: Any) -> None:
        metrics, revoked_at = self.metrics, self._revoked_at
        metrics.rebalances.inc()
        took = None if revoked_at is None else time.perf_counter() - revoked_at
        if took is not None:
            metrics.rebalance.observe(took)
        self._revoked_at = None
        self.joined_generation = self.app.consumer_generation_id
        inputs = sorted(tp.partition for tp in assigned if tp.topic == self.settings.input_topic)
        logger.info("rebalance: generation %s, input partitions %s%s", self.app.consumer_generation_id, inputs,
                    "" if took is None else f", {took:.2f} s after the revocation")

    def readiness(self) -> Readiness:
        """Whether this worker serves now (GET /ready/): in the group, models warmed and dispatching, no
        rebalance or restore running."""
        app, models = self.app, self.models
        joined = self.joined_generation is not None
        inputs = (sorted(tp.partition for tp in app.consumer.assignment() if tp.topic == self.settings.input_topic)
                  if joined else [])
        return readiness(joined=joined, models_running=models is not None and models.running,
                         rebalancing=bool(app.rebalancing), restoring=restoring(app), input_partitions=inputs)

    def _snapshot(self) -> Snapshot | None:
        """Lag, state size and restore progress as they are now (read by /metrics, see agents.observe.monitor)."""
        pipeline = self.pipeline
        if pipeline is None:
            return None
        app, topic = self.app, self.settings.input_topic
        consumer = app.consumer
        owned = sorted((tp for tp in consumer.assignment() if tp.topic == topic), key=lambda tp: tp.partition)
        inputs = []
        for tp in owned:
            try:
                end = consumer.highwater(tp)
            except Exception:  # noqa: BLE001 - not fetched yet, or the consumer is between rebalances
                end = None
            handled, handled_ts = pipeline.handled.get(tp.partition, (None, None))
            inputs.append(InputPartition(tp.partition, end, committed_offset(consumer, tp), handled, handled_ts))
        state = []
        for partition, db in sorted(rocksdb_partitions(self.tables.state_table.data).items()):
            keys = db.property_int_value("rocksdb.estimate-num-keys") or 0
            size = sum(db.property_int_value(name) or 0
                       for name in ("rocksdb.total-sst-files-size", "rocksdb.cur-size-all-mem-tables"))
            state.append(StatePartition(partition, keys, size))
        in_recovery, highwaters, offsets, _ = restore_state(app)
        restores = [Restore(tp.topic, tp.partition, max(0, (end or 0) - offsets.get(tp, -1)))
                    for tp, end in highwaters.items()] if in_recovery else []
        fetch_wait_ms = getattr(consumer, "fetch_wait_ms", None)  # batch ingestion's (not the plain Faust agent's)
        return Snapshot(topic, inputs, state, restores, rebalancing=bool(app.rebalancing),
                        cache_hits=pipeline.cache.hits, cache_misses=pipeline.cache.misses,
                        db_memory=self.tables.db_memory(), db_memory_limit=self.tables.db_memory_limit,
                        fetch_wait_ms=fetch_wait_ms)

    async def before_shutdown(self) -> None:
        await self.guarantee.before_shutdown()

    # What a commit reads of the work in flight (agents.commit.checkpoint.Work).

    @property
    def cache(self) -> StateCache | None:
        return None if self.pipeline is None else self.pipeline.cache

    async def deliver_in_flight(self) -> None:
        if self.models is not None:
            await self.models.flush()

    async def delivered(self) -> None:
        if self.pipeline is not None:
            await self.pipeline.delivered()


def install(app: faust.App, settings: Settings, tables: StateTables, spec: FeatureSpec) -> ScoringService:
    """Add the scoring service for ``spec`` and the ingestion path the settings choose to ``app``."""
    scoring = ScoringService(app, settings, tables, spec)
    app.service(scoring)  # type: ignore[arg-type]

    async def revoked(sender: Any, revoked: Any, **kwargs: Any) -> None:
        await scoring.on_partitions_revoked(revoked)

    async def assigned(sender: Any, assigned: Any, **kwargs: Any) -> None:
        await scoring.on_partitions_assigned(assigned)

    async def shutting_down(sender: Any, **kwargs: Any) -> None:
        await scoring.before_shutdown()

    app.on_partitions_revoked.connect(revoked)  # type: ignore[arg-type]
    app.on_partitions_assigned.connect(assigned)  # type: ignore[arg-type]
    app.on_before_shutdown.connect(shutting_down)  # type: ignore[arg-type]
    # internal=True: Faust also declares the topic (seam creates it earlier, see app.topics).
    topic = app.topic(settings.input_topic, partitions=settings.topic_partitions, internal=True)
    ingestion = BatchIngestion() if settings.ingest == "batch" else StreamIngestion()
    ingestion.install(app, settings, scoring, topic)
    return scoring


class BatchIngestion:
    """Per-partition lists beneath Faust's per-event path; commits through the checkpoint."""

    def install(self, app: faust.App, settings: Settings, scoring: ScoringService, topic: Any) -> None:
        # The commit protocol, both guarantees, every step in order: agents/commit/checkpoint.py.
        checkpoint = Checkpoint(app, scoring.guarantee, scoring)
        ingestion = ingest.install(app, checkpoint, fetch=ingest.FetchOptions(
            settings.fetch_min_bytes, settings.fetch_max_wait_ms, busy_max_wait_ms=settings.fetch_max_wait_busy_ms))

        def hand_over() -> AbstractContextManager[None]:
            pipeline = scoring.pipeline
            return nullcontext() if pipeline is None else pipeline.holding()

        ingestion.hand_over = hand_over

        @ingestion.batch_agent(app, topic)
        async def score_batches(batch: RecordBatch) -> None:
            """Compute the features of a partition's fetched records and hand them to the boundary."""
            pipeline = await scoring.wait_ready()
            await pipeline.handle(batch)


class _StreamRecord:
    """A Faust message as the pipeline's raw record (timestamp in milliseconds)."""

    __slots__ = ("headers", "key", "offset", "partition", "timestamp", "topic", "value")

    def __init__(self, topic: str, partition: int, offset: int, timestamp: int,
                 key: bytes | None, value: bytes | None, headers: Any) -> None:
        self.topic, self.partition, self.offset = topic, partition, offset
        self.timestamp, self.key, self.value = timestamp, key, value
        # Faust hands headers over as a list of (name, value) pairs, or as a mapping.
        pairs = headers.items() if isinstance(headers, Mapping) else headers or ()
        self.headers: Sequence[tuple[str, bytes]] = [(str(name), value) for name, value in pairs]


def _acker(event: EventT) -> Acker:
    def ack(_offsets: Sequence[int]) -> bool:
        return event.ack()

    return ack


class StreamIngestion:
    """The plain Faust path: one event at a time through the same pipeline (at least once)."""

    def install(self, app: faust.App, settings: Settings, scoring: ScoringService, topic: Any) -> None:
        @app.agent(topic)  # type: ignore[arg-type]  # noack() is on Stream, not StreamT
        async def score_events(stream: Stream[bytes]) -> None:
            pipeline = await scoring.wait_ready()
            async for event in stream.noack().events():
                msg = event.message
                record = _StreamRecord(msg.topic, msg.partition, msg.offset, int((msg.timestamp or 0) * 1000),
                                       msg.key, msg.value, msg.headers)
                await pipeline.handle(RecordBatch(msg.topic, msg.partition, [record], _acker(event)))
