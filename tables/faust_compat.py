"""Every faust-streaming, mode and aiokafka name seam uses that is private or undocumented, in one place.

Tested with faust-streaming 0.15.3 and aiokafka 0.14.0 (pinned in pyproject.toml);
``tests/unit/test_ingest_internals.py`` fails loudly if any of them changes shape. It sits in the bottom
layer, so every module that needs one of them imports it from here. The one exception is
:class:`agents.ingest.consumer.BatchConsumer`, which subclasses Faust's aiokafka consumer (through the
names given here) and so overrides and reads its base class's own members, listed here:

* ``faust.transport.drivers.aiokafka.Consumer`` (subclassed; ``on_partitions_revoked`` and
  ``on_partitions_assigned`` extended, ``close`` replaced), ``Transport`` and its ``Consumer`` slot,
  ``AIOKafkaConsumerThread``;
* ``Consumer._drain_messages`` (replaced), ``_new_offset`` and ``_filter_tps_with_pending_acks``
  (extended: batch-handled partitions are answered by :mod:`agents.ingest.acks`), ``_wait_next_records``,
  ``_read_offset``, ``_add_gap``, ``_committed_offset``, ``_n_acked``, ``_commit_every``,
  ``_buffered_partitions``, ``_to_message``, ``perform_seek``, ``flow_active``, ``suspend_flow``,
  ``_filter_committable_offsets``, ``_filter_tps_with_pending_acks``, ``_new_consumer_thread``,
  ``_new_offset``, ``_stopped`` (all used by the subclass).

And here:

* the fetcher's ``_stopped`` event and the consumer's ``_is_changelog_tp`` (:func:`fetcher_stopped`,
  :func:`is_changelog`);
* the Faust consumer's ``_handle_attached`` and ``_commit_offsets``, and the app's commit sensors
  (:func:`commit_offsets`: Faust's offset commit once the offsets are chosen);
* the worker's ``spinner`` (:func:`without_spinner`);
* ``Recovery.active_offsets`` written (:func:`mark_restored`);
* the monitor's ``stream_inbound_time`` written (:func:`mark_stream_progress`).

* ``faust.streams._current_event``, the ContextVar behind ``faust.current_event()``: table reads and
  writes go to the partition of the event it names;
* ``faust.transport.consumer.ack_lock``;
* the Faust consumer's ``_thread`` (its ``call_thread`` and ``_ensure_consumer``), to seek fetched but
  dropped changelog records back;
* ``AIOKafkaConsumerThread._create_worker_consumer`` and aiokafka's ``AIOKafkaConsumer._isolation_level``,
  ``_fetch_min_bytes`` and ``_fetch_max_wait_ms``, read by ``start()``, and its fetcher's
  ``_fetch_max_wait_ms`` and ``_fetch_min_bytes``, read for each fetch request (:func:`set_fetch_wait`);
* ``AIOKafkaConsumerThread.getmany`` (replaced), its ``_fetch_records`` and ``thread_loop``, and aiokafka's
  ``AIOKafkaConsumer._max_poll_records`` (:func:`fetch_records`);
* the RocksDB store's ``_encode_key``, ``_encode_value``, ``_set``, ``_del``, ``_db_for_partition``
  (also read directly: one read per key instead of Faust's two), ``_dbs`` (the databases opened, for
  their size), ``use_rocksdict`` and ``set_persisted_offset``, and its ``rocksdb_options`` (replaced, so
  that every partition's database shares one memory budget: :func:`share_rocksdb_memory`);
* the consumer's ``_committed_offset`` (read for the consumer lag);
* ``Recovery.in_recovery``, ``active_highwaters``, ``active_offsets`` and ``TableManager.changelog_queue``;
* the Faust producer's ``buffer`` (``size``, ``state``, ``flush()``);
* the assignor's ``changelog_distribution`` and ``external_topic_distribution``;
* an aiokafka producer's ``_sender``, and its ``_find_coordinator``, ``client`` and ``_retry_backoff``
  (:func:`retry_coordinator_lookups`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping, MutableMapping
from time import monotonic
from typing import Any

import rocksdict
from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.errors import IllegalStateError, KafkaError
from faust import current_event as faust_current_event
from faust.exceptions import ProducerSendError
from faust.stores.rocksdb import RocksDBOptions
from faust.streams import _current_event
from faust.transport.consumer import ack_lock
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP

__all__ = [
    "AIOKafkaConsumerThread", "FaustConsumer", "FaustTransport", "ack_lock", "commit_offsets", "current_event",
    "drain_producer_buffer", "encode_key", "encode_value", "fetch_records", "fetcher_stopped", "group_distribution",
    "is_changelog",
    "mark_restored", "mark_stream_progress",
    "persist_changelog_offset", "restore_state", "restoring", "raw_get", "raw_get_many", "rewind",
    "retry_coordinator_lookups", "rocksdb_partition", "set_fetch_wait", "share_rocksdb_memory", "store_writes",
    "tune_fetch", "uses_rocksdict", "without_spinner",
]

logger = logging.getLogger(__name__)

FaustConsumer = faust_aiokafka.Consumer
FaustTransport = faust_aiokafka.Transport
AIOKafkaConsumerThread = faust_aiokafka.AIOKafkaConsumerThread
current_event = _current_event


def tune_fetch(consumer: Any, *, min_bytes: int, max_wait_ms: int, read_committed: bool) -> None:
    """Set an aiokafka consumer's fetch options (and isolation level) before it starts."""
    consumer._fetch_min_bytes = min_bytes
    consumer._fetch_max_wait_ms = max_wait_ms
    if read_committed:
        consumer._isolation_level = "read_committed"


def set_fetch_wait(thread: Any, max_wait_ms: int, min_bytes: int) -> None:
    """Let the broker hold a running consumer's next fetch requests up to ``max_wait_ms`` for ``min_bytes``.

    aiokafka's fetcher reads both for each request it builds, on the consumer thread; an int attribute is
    replaced in one step, so no lock is needed. Before the consumer has started there is nothing to change.
    """
    fetcher = getattr(thread._ensure_consumer(), "_fetcher", None)
    if fetcher is not None:
        fetcher._fetch_max_wait_ms, fetcher._fetch_min_bytes = max_wait_ms, min_bytes


async def fetch_records(thread: Any, active_partitions: set[TP] | None, timeout: float) -> Any:
    """What Faust's ``getmany`` fetches, run on the consumer thread's loop without its method queue.

    Faust's own call goes through mode's method queue, whose workers, on every call, start three tasks
    (the queue, the thread stopping, the thread crashing), wait for the first and cancel the others:
    once per fetch round, hundreds of times a second. Here the fetch (Faust's ``_fetch_records``, which
    returns nothing while the flow is stopped) is scheduled on that loop directly, and its result comes
    back the way the method queue sends it: a thread-safe callback on the caller's loop.
    """
    consumer = thread._ensure_consumer()
    fetch = thread._fetch_records(consumer, active_partitions, timeout=timeout,
                                  max_records=consumer._max_poll_records)
    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(fetch, thread.thread_loop))


def retry_coordinator_lookups(producer: AIOKafkaProducer) -> AIOKafkaProducer:
    """Make a transactional producer retry a coordinator lookup that failed with a retriable error.

    aiokafka's sender retries a lookup that finds no coordinator, no ready node or a timeout, but any
    other error ends its sender task, and with it the producer: every later transaction call raises.
    A connection the broker closes while the lookup is in flight (a broker stopping, restarting or
    moving the coordinator) is such an error, so a broker restart could stop an exactly-once worker.
    Here a lookup that failed with a retriable error (``KafkaError.retriable``; aiokafka raises it as
    the cause of its own) is tried again after the sender's backoff, with fresh metadata, as aiokafka
    does for the errors it knows. Call it before the producer starts.
    """
    sender = producer._sender
    find = sender._find_coordinator

    async def find_coordinator(coordinator_type: Any, coordinator_key: Any) -> Any:
        while True:
            try:
                return await find(coordinator_type, coordinator_key)
            except KafkaError as err:
                cause = err.__cause__
                if not (isinstance(cause, KafkaError) and cause.retriable):
                    raise
                logger.warning("coordinator lookup for %s failed (%r); retrying", coordinator_key, cause)
                await sender.client.force_metadata_update()
                await asyncio.sleep(sender._retry_backoff)

    sender._find_coordinator = find_coordinator
    return producer


def fetcher_stopped(fetcher: Any) -> Any:
    """The fetcher's stop check: a callable that says whether Faust's fetcher has stopped."""
    return fetcher._stopped.is_set


def is_changelog(consumer: Any, tp: TP) -> bool:
    """Whether ``tp`` is a table's changelog partition (Faust's own test)."""
    return bool(consumer._is_changelog_tp(tp))


async def commit_offsets(consumer: Any, offsets: Mapping[TP, int]) -> bool:
    """Commit ``offsets`` for the group as Faust's commit does once it has chosen them.

    The messages Faust attached to those offsets are published first (none on seam's path), then Faust's
    ``_commit_offsets``: its producer flushed, the offsets of partitions still assigned committed, the
    tables told. The app's sensors see the commit as they see Faust's own.
    """
    if not offsets:
        return False
    sensors = consumer.app.sensors
    sensor_state = sensors.on_commit_initiated(consumer)
    try:
        await consumer._handle_attached(offsets)
    except ProducerSendError as exc:
        await consumer.crash(exc)
        return False
    committed: bool = await consumer._commit_offsets(offsets)
    sensors.on_commit_completed(consumer, sensor_state)
    return committed


async def rewind(consumer: Any, dropped: Mapping[TP, tuple[int, int]]) -> None:
    """Seek partitions back to the first of their ``(first, last)`` offsets fetched but not handed on.

    Only where the position is still past ``last``: a partition sought since (a restore starting, a
    new assignment) keeps its new position. Runs in the consumer thread, where fetches and seeks do.
    """
    thread = consumer._thread

    async def back() -> None:
        kafka = thread._ensure_consumer()
        assigned = kafka.assignment()
        for tp, (first, last) in dropped.items():
            partition = TopicPartition(tp.topic, tp.partition)
            try:
                if partition in assigned and await kafka.position(partition) > last:
                    kafka.seek(partition, first)
            except IllegalStateError:  # unassigned while its position was reset: the next owner reads it
                continue

    await thread.call_thread(back)


# Stores.

def encode_key(store: Any, key: Any) -> bytes:
    """A table key as the table's store writes it to RocksDB and its changelog."""
    encoded: bytes = store._encode_key(key)
    return encoded


def encode_value(store: Any, value: Any) -> bytes:
    """A table value as the table's store writes it to RocksDB and its changelog."""
    encoded: bytes = store._encode_value(value)
    return encoded


def uses_rocksdict(store: Any) -> bool:
    """Whether ``store`` is a RocksDB store on rocksdict (its partitions take rocksdict write batches)."""
    return bool(getattr(store, "use_rocksdict", False))


def rocksdb_partition(store: Any, partition: int) -> Any:
    """The rocksdict database of one partition of a RocksDB store."""
    return store._db_for_partition(partition)


def raw_get(table: Any, key: bytes) -> bytes | None:
    """A raw (bytes to bytes) table's value for ``key`` in the current partition, or None.

    One RocksDB read: a Faust table's ``get`` checks that the key exists and then reads it (two).
    """
    db = _current_partition_db(table.data)
    found: bytes | None = table.get(key) if db is None else db.get(key)
    return found


def raw_get_many(table: Any, keys: list[bytes]) -> list[bytes | None]:
    """:func:`raw_get` for several keys: one multi-key RocksDB read (rocksdict's ``get`` of a list)."""
    db = _current_partition_db(table.data)
    values: list[bytes | None] = [table.get(key) for key in keys] if db is None else db.get(keys)
    return values


def _current_partition_db(store: Any) -> Any:
    """The rocksdict database of the current event's partition, or None (no event, or another store)."""
    event = faust_current_event()
    return rocksdb_partition(store, event.message.partition) if event is not None and uses_rocksdict(store) else None


class _SharedMemoryOptions(RocksDBOptions):  # type: ignore[misc]
    """Faust's rocksdict options (its ``as_options``, rocksdict branch), but with one block cache and one write
    buffer manager for every database opened with them."""

    def __init__(self, base: RocksDBOptions, cache: rocksdict.Cache,
                 write_buffers: rocksdict.WriteBufferManager) -> None:
        super().__init__(max_open_files=base.max_open_files, write_buffer_size=base.write_buffer_size,
                         max_write_buffer_number=base.max_write_buffer_number,
                         target_file_size_base=base.target_file_size_base, bloom_filter_size=base.bloom_filter_size,
                         use_rocksdict=True, ttl=base.ttl)
        self.cache = cache
        self.write_buffers = write_buffers

    def as_options(self) -> rocksdict.Options:
        options = rocksdict.Options(raw_mode=True)
        options.create_if_missing(True)
        if self.max_open_files is not None:
            options.set_max_open_files(self.max_open_files)
        options.set_write_buffer_size(self.write_buffer_size)
        options.set_target_file_size_base(self.target_file_size_base)
        options.set_max_write_buffer_number(self.max_write_buffer_number)
        options.set_write_buffer_manager(self.write_buffers)
        table = rocksdict.BlockBasedOptions()
        table.set_bloom_filter(self.bloom_filter_size, True)
        table.set_block_cache(self.cache)
        table.set_index_type(rocksdict.BlockBasedIndexType.binary_search())
        options.set_block_based_table_factory(table)
        return options


def share_rocksdb_memory(store: Any, cache: rocksdict.Cache, write_buffers: rocksdict.WriteBufferManager) -> None:
    """Open every later partition of a rocksdict ``store`` with ``cache`` as its block cache and ``write_buffers``
    over its memtables (another store is left as it is)."""
    if uses_rocksdict(store):
        store.rocksdb_options = _SharedMemoryOptions(store.rocksdb_options, cache, write_buffers)


def rocksdb_partitions(store: Any) -> Mapping[int, Any]:
    """The rocksdict databases a RocksDB store has opened, by partition (none for other stores)."""
    return dict(store._dbs) if uses_rocksdict(store) else {}


def committed_offset(consumer: Any, tp: TP) -> int | None:
    """The offset the group last committed for ``tp`` as the consumer knows it (``None``: none yet)."""
    offset: int | None = consumer._committed_offset.get(tp)
    return offset


def persist_changelog_offset(store: Any, tp: TP, offset: int) -> None:
    """Record the changelog offset a store has applied up to (where its next restore starts)."""
    store.set_persisted_offset(tp, offset)


# Recovery, producer, assignor.

def restore_state(app: Any) -> tuple[bool, Mapping[Any, int | None], MutableMapping[Any, int], bool]:
    """Faust's restore: (restoring now, end offset to reach per active changelog partition, offset
    received per partition (see :func:`mark_restored`), changelog queue empty)."""
    recovery = app.tables.recovery
    return (bool(recovery.in_recovery), recovery.active_highwaters, recovery.active_offsets,
            bool(app.tables.changelog_queue.empty()))


def mark_restored(app: Any, tp: Any, offset: int) -> None:
    """End ``tp``'s restore at ``offset``: Faust takes it as received up to there."""
    app.tables.recovery.active_offsets[tp] = offset


def mark_stream_progress(app: Any, tp: TP) -> None:
    """Tell Faust's monitor that ``tp``'s records are being handled now, as its streams do for each event.

    Faust's consumer thread checks every partition that lags: one whose stream has not taken an event for
    ``stream_processing_timeout`` (five minutes; ever, since the start) gets an ERROR, "Stream has not started
    processing", with a page of possible causes. Batch-handled records never pass through a Faust stream, so
    without this every worker that ran behind for a moment five minutes after it started logged that error.
    """
    monitor = app.monitor
    if monitor is not None:
        monitor.stream_inbound_time[tp] = monotonic()


def restoring(app: Any) -> bool:
    """Whether the app is restoring tables from their changelogs right now."""
    return bool(app.tables.recovery.in_recovery)


async def drain_producer_buffer(app: Any, on_stopping: Any) -> None:
    """Send everything in the Faust producer's buffer; call ``on_stopping(size)`` (it raises) if it stopped.

    The buffer's own flush gives up after 0.1 s without progress: this waits until it is empty.
    """
    buffer = app.producer.buffer
    while buffer.size:
        if buffer.state != "running":
            on_stopping(buffer.size)
        await buffer.flush()


def without_spinner(worker: Any) -> None:
    """Drop Faust's worker's terminal spinner (it sets the root logger to DEBUG when the level is WARN or above)."""
    worker.spinner = None


def group_distribution(assignor: Any) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    """The group's assignment as each member's URL → (changelog partitions, other topics' partitions)."""
    return assignor.changelog_distribution, assignor.external_topic_distribution


def store_writes(store: Any, writes: Iterable[tuple[bytes, bytes | None]]) -> None:
    """Apply encoded writes (``None``: delete) to the store of the current partition."""
    for key, value in writes:
        if value is None:
            store._del(key)
        else:
            store._set(key, value)
