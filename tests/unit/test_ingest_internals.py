"""The faust-streaming internals batch ingestion relies on still have the shape it expects.

If one of these fails after a faust-streaming upgrade, agents/ingest/consumer.py must be revisited before the
new version is allowed (see its module docstring); SEAM_INGEST=stream keeps working meanwhile.
"""

from __future__ import annotations

import asyncio
import inspect
import weakref
from collections.abc import Iterator
from contextvars import ContextVar
from importlib.metadata import version
from time import monotonic
from types import SimpleNamespace
from typing import Any

import faust
import pytest
from faust.transport.consumer import Consumer as FaustConsumer
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP

from agents.commit.checkpoint import Checkpoint
from agents.commit.guarantee import AtLeastOnce
from agents.ingest import consumer as ingest
from agents.ingest.records import RecordBatch
from agents.observe.metrics import BoundaryMetrics
from tables.cache import StateCache

TESTED_FAUST = "0.15.3"


def test_faust_streaming_is_the_tested_version() -> None:
    assert version("faust-streaming") == TESTED_FAUST, (
        f"agents/ingest/consumer.py was tested with faust-streaming {TESTED_FAUST}; re-run its checks and "
        "update TESTED_FAUST (and the pin in pyproject.toml) deliberately")


@pytest.mark.parametrize(("name", "params"), [
    ("_drain_messages", ["self", "fetcher"]),
    ("_wait_next_records", ["self", "timeout"]),
    ("_add_gap", ["self", "tp", "offset_from", "offset_to"]),
    ("perform_seek", ["self"]),
    ("commit", None),
    ("on_partitions_revoked", ["self", "revoked"]),
    ("on_partitions_assigned", ["self", "assigned", "generation_id"]),
    ("_new_offset", ["self", "tp"]),
    ("_handle_attached", ["self", "commit_offsets"]),
    ("_commit_offsets", ["self", "offsets", "start_new_transaction"]),
])
def test_consumer_methods_keep_their_signatures(name: str, params: list[str] | None) -> None:
    method = getattr(FaustConsumer, name)
    assert inspect.iscoroutinefunction(method) or name == "_new_offset", f"{name} is no longer async"
    if params is not None:
        assert list(inspect.signature(method).parameters) == params


def test_a_rebalance_reaching_a_stopping_app_closes_the_consumer_through_close() -> None:
    # BatchConsumer.close replaces this call: Faust's version closed the consumer thread's Kafka consumer on
    # the app's loop, and the thread's stop then skipped it (no LeaveGroup; a SIGTERM could hang).
    import faust

    assert not inspect.iscoroutinefunction(FaustConsumer.close)
    assert list(inspect.signature(FaustConsumer.close).parameters) == ["self"]
    assert "self.consumer.close()" in inspect.getsource(faust.App._on_rebalance_when_stopped)


def test_current_event_is_a_context_variable_of_weak_references() -> None:
    from faust import streams

    assert isinstance(streams._current_event, ContextVar)
    class StandIn:
        pass

    stand_in = StandIn()
    token = streams._current_event.set(weakref.ref(stand_in))  # type: ignore[arg-type]
    try:
        assert streams.current_event() is stand_in
    finally:
        streams._current_event.reset(token)


def test_driver_transport_has_a_consumer_slot() -> None:
    assert faust_aiokafka.Transport.Consumer is faust_aiokafka.Consumer
    assert ingest.BatchTransport.Consumer is ingest.BatchConsumer


class InFlight:
    """Work in flight as a commit sees it (agents.commit.checkpoint.Work): no state; ``deliver`` set by a test."""

    def __init__(self) -> None:
        self.metrics = BoundaryMetrics()
        self.cache: StateCache | None = None
        self.should_stop = False
        self.deliver: Any = None

    async def deliver_in_flight(self) -> None:
        if self.deliver is not None:
            await self.deliver()

    async def delivered(self) -> None:
        return None

    async def crash(self, reason: BaseException) -> None:
        raise AssertionError(f"crashed: {reason!r}")


def batch_app(name: str) -> faust.App:
    """An app on batch ingestion, committing at least once through a real checkpoint."""
    app = faust.App(f"{name}-{id(object())}", broker="kafka://127.0.0.1:1", store="memory://")
    ingest.install(app, Checkpoint(app, AtLeastOnce(bootstrap="127.0.0.1:1", input_topic="t"), InFlight()))
    return app


@pytest.fixture
def consumer() -> Iterator[ingest.BatchConsumer]:
    app = batch_app("ingest-internals")
    consumer = app.consumer
    assert isinstance(consumer, ingest.BatchConsumer)
    yield consumer


def test_consumer_state_attributes_exist(consumer: ingest.BatchConsumer) -> None:
    for name in ("_read_offset", "_acked", "_acked_index", "_committed_offset", "_gap",
                 "_buffered_partitions", "_n_acked", "_commit_every", "suspend_flow", "flow_active"):
        assert hasattr(consumer, name), name
    tp = TP("t", 0)
    assert consumer._read_offset[tp] is None  # defaultdict(lambda: None)
    assert consumer._acked[tp] == [] and consumer._acked_index[tp] == set()


def test_bulk_acks_advance_faust_commit_offset_only_over_contiguous_offsets(consumer: ingest.BatchConsumer) -> None:
    tp = TP("t", 0)
    assert consumer.ack_offsets(tp, [0, 1, 2, 3, 4, 6, 7], consumer.epoch) == 7
    assert consumer._new_offset(tp) == 5  # 5 is not acknowledged: commit stops before it
    assert consumer.ack_offsets(tp, [5, 6], consumer.epoch) == 1  # 6 was already acknowledged
    assert consumer._new_offset(tp) == 8


def test_gaps_count_as_acknowledged_but_not_the_record_after_them(consumer: ingest.BatchConsumer) -> None:
    tp = TP("t", 0)
    consumer.ack_offsets(tp, [0, 1], consumer.epoch)
    consumer.acks.gap(tp, 2, 4, None)  # offsets 2..4 never come (e.g. transaction markers)
    consumer.ack_offsets(tp, [6], consumer.epoch)
    assert consumer._new_offset(tp) == 5  # record 5 not yet acknowledged
    consumer.ack_offsets(tp, [5], consumer.epoch)
    assert consumer._new_offset(tp) == 7


async def test_acks_from_before_a_revocation_are_dropped(consumer: ingest.BatchConsumer) -> None:
    tp = TP("t", 0)
    stale_epoch = consumer.epoch
    consumer.epochs.revoke()  # what on_partitions_revoked does
    assert consumer.ack_offsets(tp, [0, 1, 2], stale_epoch) == 0
    assert consumer.stale_acks == 1
    assert consumer._new_offset(tp) is None


def test_table_partition_directs_table_writes_without_a_faust_event() -> None:
    app = faust.App(f"ingest-table-{id(object())}", broker="kafka://127.0.0.1:1", store="memory://",
                    topic_partitions=4)
    table = app.Table("t", partitions=4)
    sent: list[int | None] = []

    def send_changelog(partition: int | None, key: object, value: object, *args: object, **kwargs: object) -> object:
        sent.append(partition)
        return SimpleNamespace(message=SimpleNamespace(partition=partition))

    table.send_changelog = send_changelog  # type: ignore[method-assign,assignment]
    source = app.topic("source", partitions=4)
    with pytest.raises(TypeError):
        table["k"] = 1  # Faust refuses a write outside an event
    with ingest.table_partition(source.get_topic_name(), 3):
        table["k"] = 1
    assert sent == [3]
    assert faust.current_event() is None  # restored after the block


def test_exactly_once_internals_keep_their_shape() -> None:
    """What agents/commit/transactions.py and the read_committed consumer thread rely on."""
    from aiokafka import AIOKafkaConsumer
    from faust.stores.rocksdb import Store as RocksStore

    assert list(inspect.signature(FaustConsumer._filter_committable_offsets).parameters) == ["self", "tps"]
    assert list(inspect.signature(FaustConsumer._filter_tps_with_pending_acks).parameters) == ["self", "topics"]
    assert list(inspect.signature(faust_aiokafka.Consumer._new_consumer_thread).parameters) == ["self"]
    creator = faust_aiokafka.AIOKafkaConsumerThread._create_worker_consumer
    assert list(inspect.signature(creator).parameters) == ["self", "transport"]
    for name in ("isolation_level", "fetch_min_bytes", "fetch_max_wait_ms"):
        assert f"self._{name} = {name}" in inspect.getsource(AIOKafkaConsumer.__init__), name
        assert f"{name}=self._{name}" in inspect.getsource(AIOKafkaConsumer.start), name
    # tables.faust_compat.set_fetch_wait: the fetcher keeps the wait and reads it for each request it builds.
    from aiokafka.consumer.fetcher import Fetcher

    assert "self._fetch_max_wait_ms = fetch_max_wait_ms" in inspect.getsource(Fetcher.__init__)
    assert "self._fetch_max_wait_ms," in inspect.getsource(Fetcher._get_actions_per_node)
    assert "self._fetch_min_bytes = fetch_min_bytes" in inspect.getsource(Fetcher.__init__)
    assert "self._fetch_min_bytes," in inspect.getsource(Fetcher._get_actions_per_node)
    for name, params in [("_encode_key", ["self", "key"]), ("_encode_value", ["self", "value"]),
                         ("_set", ["self", "key", "value"]), ("_del", ["self", "key"]),
                         ("set_persisted_offset", ["self", "tp", "offset"]),
                         ("_db_for_partition", ["self", "partition"])]:
        assert list(inspect.signature(getattr(RocksStore, name)).parameters) == params, name
    # tables.changelog writes rocksdict WriteBatches to the stores that say they use rocksdict.
    from faust.stores import rocksdb as faust_rocksdb

    assert faust_rocksdb.USE_ROCKSDICT is True
    assert "self.use_rocksdict = USE_ROCKSDICT" in inspect.getsource(RocksStore.__init__)
    # tables.faust_compat.share_rocksdb_memory replaces a store's rocksdb_options; a partition opens with them.
    assert "self.rocksdb_options.open(" in inspect.getsource(RocksStore._open_for_partition)
    assert "self.as_options()" in inspect.getsource(faust_rocksdb.RocksDBOptions.open)
    assert "rocksdict.Cache(self.block_cache_size)" in inspect.getsource(faust_rocksdb.RocksDBOptions.as_options)


def test_current_partition_reads_the_table_partition_scope() -> None:
    with ingest.table_partition("tx", 5):
        assert ingest.current_partition() == 5
    with pytest.raises(RuntimeError):
        ingest.current_partition()


class _Record(SimpleNamespace):
    pass


def _records(tp: TP, first: int, count: int) -> list[_Record]:
    return [_Record(topic=tp.topic, partition=tp.partition, offset=o, timestamp=0, key=None, value=b"{}")
            for o in range(first, first + count)]


@pytest.fixture
def positioned(consumer: ingest.BatchConsumer, monkeypatch: pytest.MonkeyPatch) -> ingest.BatchConsumer:
    """A consumer owning t[0], sought to offset 0, whose commits and Faust revocation are recorded."""
    tp = TP("t", 0)
    monkeypatch.setattr(consumer, "assignment", lambda: {tp})
    consumer.epochs.seek_done(consumer.epochs.seek_started())
    consumer._read_offset[tp] = 0
    consumer.committed = []  # type: ignore[attr-defined]

    async def commit_group_offsets(offsets: dict[TP, int]) -> bool:
        consumer.committed.append(offsets.get(tp))  # type: ignore[attr-defined]
        return True

    async def faust_revoked(self: object, revoked: object) -> None:
        return None

    monkeypatch.setattr(consumer, "commit_group_offsets", commit_group_offsets)
    monkeypatch.setattr(faust_aiokafka.Consumer, "on_partitions_revoked", faust_revoked)
    return consumer


async def test_revocation_closes_intake_before_it_delivers_and_commits(
        positioned: ingest.BatchConsumer, monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch fetched while in-flight work is delivered waits, then is dropped: never acked too late."""
    consumer, tp = positioned, TP("t", 0)
    handled: list[int] = []
    hook_started, hook_may_end = asyncio.Event(), asyncio.Event()

    async def handler(batch: RecordBatch) -> None:
        handled.extend(r.offset for r in batch.records)
        batch.ack([r.offset for r in batch.records])

    async def deliver_in_flight() -> None:
        hook_started.set()
        await hook_may_end.wait()

    monkeypatch.setattr(consumer.commits._work, "deliver", deliver_in_flight)  # type: ignore[attr-defined]
    await consumer._deliver_batch(tp, _records(tp, 0, 10), handler)
    revoking = asyncio.ensure_future(consumer.on_partitions_revoked({tp}))
    await hook_started.wait()
    late = asyncio.ensure_future(consumer._deliver_batch(tp, _records(tp, 10, 10), handler))
    await asyncio.sleep(0.01)
    assert handled == list(range(10)), "a batch was handed over while partitions were being revoked"
    hook_may_end.set()
    await revoking
    await late
    assert handled == list(range(10)), "a batch fetched before the revocation was handled after it"
    assert consumer.committed == [10]  # type: ignore[attr-defined]


async def test_a_handed_over_batch_counts_as_its_partition_streaming_for_faust(
        positioned: ingest.BatchConsumer) -> None:
    """Faust's consumer thread logs "Stream has not started processing" (an ERROR and a page of causes) for
    every lagging partition whose stream took no event for five minutes; batch-handled records pass no Faust
    stream, so the consumer marks the partition's progress where Faust's check reads it."""
    consumer, tp = positioned, TP("t", 0)
    monitor = consumer.app.monitor
    assert "monitor.stream_inbound_time.get(tp)" in inspect.getsource(
        faust_aiokafka.AIOKafkaConsumerThread.verify_event_path)
    assert tp not in monitor.stream_inbound_time

    async def handler(batch: RecordBatch) -> None:
        batch.ack([r.offset for r in batch.records])

    before = monotonic()
    await consumer._deliver_batch(tp, _records(tp, 0, 3), handler)
    assert before <= monitor.stream_inbound_time[tp] <= monotonic()


async def test_a_revocation_waits_for_the_batch_being_handled(
        positioned: ingest.BatchConsumer, monkeypatch: pytest.MonkeyPatch) -> None:
    consumer, tp = positioned, TP("t", 0)
    release = asyncio.Event()

    async def slow_handler(batch: RecordBatch) -> None:
        await release.wait()
        batch.ack([r.offset for r in batch.records])

    handling = asyncio.ensure_future(consumer._deliver_batch(tp, _records(tp, 0, 5), slow_handler))
    await asyncio.sleep(0)
    revoking = asyncio.ensure_future(consumer.on_partitions_revoked({tp}))
    await asyncio.sleep(0.01)
    assert not revoking.done()
    release.set()
    await asyncio.gather(handling, revoking)
    assert consumer.committed == [5]  # type: ignore[attr-defined]  # its acks were in before the commit


async def test_a_drain_loop_cancelled_by_a_stop_ends_normally(consumer: ingest.BatchConsumer,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Faust's fetcher treats a cancel during a rebalance as a restart it cannot do: never let it see one."""
    fetcher = SimpleNamespace(_stopped=asyncio.Event())

    async def wait_forever(timeout: float) -> tuple[dict[TP, list[object]], None]:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    monkeypatch.setattr(consumer, "_wait_next_records", wait_forever)
    draining = asyncio.ensure_future(consumer._drain_messages(fetcher))
    await asyncio.sleep(0)
    fetcher._stopped.set()  # Service.stop() sets it before it cancels the service's tasks
    draining.cancel()
    await asyncio.wait([draining])
    assert not draining.cancelled() and draining.exception() is None


async def test_an_assignment_is_prepared_before_faust_restores_and_seeks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Exactly once: the previous owner's transactions complete before changelog ends or offsets are read."""
    order: list[str] = []
    may_finish = asyncio.Event()

    async def prepare(assigned: set[TP]) -> None:
        order.append(f"prepare {sorted(tp.partition for tp in assigned)}")
        await may_finish.wait()

    async def faust_assigned(self: object, assigned: set[TP], generation_id: int = 0) -> None:
        order.append("faust: restore, then seek")

    app = batch_app("ingest-assign")
    monkeypatch.setattr(app.consumer.commits.guarantee, "prepare_assignment", prepare)  # type: ignore[attr-defined]
    monkeypatch.setattr(faust_aiokafka.Consumer, "on_partitions_assigned", faust_assigned)
    assigning = asyncio.ensure_future(app.consumer.on_partitions_assigned({TP("t", 1), TP("t", 0)}))
    await asyncio.sleep(0.01)
    assert order == ["prepare [0, 1]"]  # Faust's handling waits for it
    may_finish.set()
    await assigning
    assert order == ["prepare [0, 1]", "faust: restore, then seek"]


async def test_a_fetch_round_ends_only_once_its_records_were_handed_on(
        consumer: ingest.BatchConsumer, monkeypatch: pytest.MonkeyPatch) -> None:
    """An exactly-once restore counts on it: a new round means the last fetch reached the restore."""
    tp = TP("changelog", 0)
    fetcher = SimpleNamespace(_stopped=asyncio.Event())
    fetched = asyncio.Event()
    delivering, may_deliver = asyncio.Event(), asyncio.Event()
    calls = 0

    async def next_records(timeout: float) -> tuple[dict[TP, list[object]], None]:
        nonlocal calls
        calls += 1
        if calls == 1:
            return {tp: _records(tp, 0, 3)}, None  # type: ignore[dict-item]
        fetched.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def deliver_each(tp_: TP, records: list[object]) -> list[object]:
        delivering.set()
        await may_deliver.wait()
        return []

    monkeypatch.setattr(consumer, "_wait_next_records", next_records)
    monkeypatch.setattr(consumer, "_deliver_each", deliver_each)
    monkeypatch.setattr(type(consumer), "flow_active", True)
    draining = asyncio.ensure_future(consumer._drain_messages(fetcher))
    await delivering.wait()
    assert consumer.fetch_rounds == 1
    may_deliver.set()
    await fetched.wait()
    assert consumer.fetch_rounds == 2
    fetcher._stopped.set()
    draining.cancel()
    await asyncio.wait([draining])


@pytest.fixture
def rewinds(consumer: ingest.BatchConsumer, monkeypatch: pytest.MonkeyPatch) -> list[dict[TP, tuple[int, int]]]:
    """The changelog partitions the consumer seeks back, per call (topic "changelog" is a changelog)."""
    calls: list[dict[TP, tuple[int, int]]] = []

    async def rewind(consumer_: object, dropped: dict[TP, tuple[int, int]]) -> None:
        calls.append(dict(dropped))

    async def perform_seek() -> None:
        pass

    monkeypatch.setattr(ingest, "rewind", rewind)
    monkeypatch.setattr(consumer, "perform_seek", perform_seek)
    monkeypatch.setattr(consumer, "_is_changelog_tp", lambda tp: tp.topic == "changelog")
    monkeypatch.setattr(consumer, "_to_message", lambda tp, record: record)

    async def wait_first(*waiting: Any) -> SimpleNamespace:  # as the consumer's (a mode Service's)
        tasks = {aw: asyncio.ensure_future(aw) for aw in waiting}
        await asyncio.wait(tasks.values(), return_when=asyncio.FIRST_COMPLETED)
        done = [aw for aw, task in tasks.items() if task.done()]
        for task in tasks.values():
            task.cancel()
        return SimpleNamespace(done=done)

    monkeypatch.setattr(consumer, "wait_first", wait_first)
    monkeypatch.setattr(consumer, "suspend_flow", asyncio.Event())
    return calls


async def _one_round(consumer: ingest.BatchConsumer, monkeypatch: pytest.MonkeyPatch,
                     records: dict[TP, list[object]]) -> None:
    fetcher = SimpleNamespace(_stopped=asyncio.Event())
    calls = 0

    async def next_records(timeout: float) -> tuple[dict[TP, list[object]], None]:
        nonlocal calls
        calls += 1
        if calls == 1:
            return records, None
        fetcher._stopped.set()
        return {}, None

    monkeypatch.setattr(consumer, "_wait_next_records", next_records)
    await consumer._drain_messages(fetcher)


async def test_changelog_records_fetched_while_the_flow_is_suspended_are_sought_back(
        consumer: ingest.BatchConsumer, monkeypatch: pytest.MonkeyPatch,
        rewinds: list[dict[TP, tuple[int, int]]]) -> None:
    """A rebalance drops what it interrupts; a changelog has no committed offset to seek back to.

    Left past them, the fetcher never returned those records again: a restore that started then
    received nothing of its partition and ended at its last marker (a card restored empty).
    """
    changelog, source = TP("changelog", 2), TP("t", 0)
    consumer.flow_active = False
    await _one_round(consumer, monkeypatch, {changelog: _records(changelog, 0, 47), source: _records(source, 5, 3)})
    assert rewinds == [{changelog: (0, 46)}]  # the input is sought to its committed offset, as by Faust
    assert consumer.rewinds == 1


async def test_changelog_records_a_suspension_interrupts_are_sought_back(
        consumer: ingest.BatchConsumer, monkeypatch: pytest.MonkeyPatch,
        rewinds: list[dict[TP, tuple[int, int]]]) -> None:
    changelog = TP("changelog", 2)
    handed: list[int] = []

    async def callback(message: object) -> None:
        if len(handed) == 2:  # the third waits (the restore's queue is full) when a rebalance starts
            consumer.suspend_flow.set()
            await asyncio.Event().wait()
        handed.append(message.offset)  # type: ignore[attr-defined]

    monkeypatch.setattr(consumer, "callback", callback)
    await _one_round(consumer, monkeypatch, {changelog: _records(changelog, 10, 5)})
    assert handed == [10, 11]
    assert rewinds == [{changelog: (12, 14)}]


async def test_input_records_dropped_without_faust_seeking_back_are_sought_back(
        consumer: ingest.BatchConsumer, monkeypatch: pytest.MonkeyPatch,
        rewinds: list[dict[TP, tuple[int, int]]]) -> None:
    """An input partition fetched while it is not yet active (newly assigned, its state restoring):
    its records are dropped. Left past them, the fetcher's next records began after a hole, which the
    acknowledgement ledger took for offsets the broker skipped: a takeover committed 1,741 inputs of
    one partition (offsets 2640-4380) that were never scored."""
    source, ready = TP("t", 3), TP("t", 0)
    fetcher = SimpleNamespace(_stopped=asyncio.Event())
    rounds = 0
    handed: list[TP] = []

    async def next_records(timeout: float) -> tuple[dict[TP, list[object]], set[TP]]:
        nonlocal rounds
        rounds += 1
        if rounds > 1:
            fetcher._stopped.set()
            return {}, set()
        return {source: _records(source, 2640, 3), ready: _records(ready, 7, 2)}, {ready}

    async def deliver_batch(tp: TP, tp_records: list[object], handler: object) -> None:
        handed.append(tp)

    monkeypatch.setattr(consumer, "_wait_next_records", next_records)
    monkeypatch.setattr(consumer, "_deliver_batch", deliver_batch)
    monkeypatch.setattr(consumer.ingestion, "handlers", {"t": object()})
    await consumer._drain_messages(fetcher)
    assert handed == [ready]
    assert rewinds == [{source: (2640, 2642)}]


async def test_a_stopping_worker_seeks_nothing_back(
        consumer: ingest.BatchConsumer, monkeypatch: pytest.MonkeyPatch,
        rewinds: list[dict[TP, tuple[int, int]]]) -> None:
    """A SIGTERM during a rebalance: the seek would go through a consumer thread that may be gone (the
    worker hung, still running 40 s after the signal); the next owner reads from the committed offsets."""
    changelog = TP("changelog", 2)
    monkeypatch.setattr(type(consumer.app), "should_stop", property(lambda app: True))
    consumer.flow_active = False
    await _one_round(consumer, monkeypatch, {changelog: _records(changelog, 0, 5)})
    assert rewinds == [] and consumer.rewinds == 0


async def test_a_round_that_handed_everything_on_seeks_nothing(
        consumer: ingest.BatchConsumer, monkeypatch: pytest.MonkeyPatch,
        rewinds: list[dict[TP, tuple[int, int]]]) -> None:
    changelog = TP("changelog", 2)
    handed: list[int] = []

    async def callback(message: object) -> None:
        handed.append(message.offset)  # type: ignore[attr-defined]

    monkeypatch.setattr(consumer, "callback", callback)
    await _one_round(consumer, monkeypatch, {changelog: _records(changelog, 10, 5)})
    assert handed == [10, 11, 12, 13, 14] and rewinds == [] and consumer.rewinds == 0


async def test_rewind_seeks_back_only_partitions_still_past_the_dropped_records() -> None:
    from aiokafka import TopicPartition

    from tables.faust_compat import rewind

    moved, kept, gone = TopicPartition("changelog", 0), TopicPartition("changelog", 1), TopicPartition("changelog", 2)
    positions = {moved: 48, kept: 0}  # kept: sought back (a restore started) after the fetch
    seeks: list[tuple[TopicPartition, int]] = []

    class Kafka:
        def assignment(self) -> set[TopicPartition]:
            return {moved, kept}

        async def position(self, tp: TopicPartition) -> int:
            return positions[tp]

        def seek(self, tp: TopicPartition, offset: int) -> None:
            seeks.append((tp, offset))

    class Thread:
        def _ensure_consumer(self) -> Kafka:
            return Kafka()

        async def call_thread(self, fun: Any) -> Any:
            return await fun()

    await rewind(SimpleNamespace(_thread=Thread()), {TP("changelog", 0): (0, 46), TP("changelog", 1): (0, 46),
                                                     TP("changelog", 2): (0, 46)})
    assert seeks == [(moved, 0)] and gone not in positions


def test_recovery_producer_and_assignor_names_of_the_compat_module_exist() -> None:
    """What tables.faust_compat reads of Faust's restore, producer buffer and assignor."""
    from faust.assignor.partition_assignor import PartitionAssignor
    from faust.tables.manager import TableManager
    from faust.tables.recovery import Recovery
    from faust.transport.producer import ProducerBuffer

    init = inspect.getsource(Recovery.__init__)
    for name in ("active_highwaters", "active_offsets"):
        assert f"self.{name}" in init, name
    assert "in_recovery" in inspect.getsource(Recovery)
    assert isinstance(inspect.getattr_static(TableManager, "changelog_queue"), property)
    for name in ("size", "flush"):
        assert hasattr(ProducerBuffer, name), name
    for name in ("changelog_distribution", "external_topic_distribution"):
        assert hasattr(PartitionAssignor, name), name


def test_commit_fetcher_and_worker_names_of_the_compat_module_exist() -> None:
    """What tables.faust_compat reads of Faust's commit, fetcher, changelog test and worker."""
    from faust.sensors.base import SensorDelegate
    from faust.transport.consumer import Fetcher
    from faust.worker import Worker
    from mode import Service

    assert list(inspect.signature(FaustConsumer._is_changelog_tp).parameters) == ["self", "tp"]
    for name in ("on_commit_initiated", "on_commit_completed"):
        assert hasattr(SensorDelegate, name), name
    assert issubclass(Fetcher, Service) and "self._stopped = " in inspect.getsource(Service.__init__)
    assert "self.spinner = " in inspect.getsource(Worker.__init__)
    # Faust's own commit, once it has chosen the offsets, is what seam's group commit does (commit_offsets).
    commit_tps = inspect.getsource(FaustConsumer._commit_tps)
    assert "_handle_attached(commit_offsets)" in commit_tps and "_commit_offsets(" in commit_tps


def test_the_fetch_is_faust_getmany_without_its_method_queue() -> None:
    """What tables.faust_compat.fetch_records calls: the thread's own fetch, on the thread's own loop."""
    from mode.threads import ServiceThread

    thread = faust_aiokafka.AIOKafkaConsumerThread
    assert list(inspect.signature(thread.getmany).parameters) == ["self", "active_partitions", "timeout"]
    getmany = inspect.getsource(thread.getmany)
    assert "self.call_thread(" in getmany and "self._fetch_records," in getmany
    assert "max_records=_consumer._max_poll_records" in getmany
    assert list(inspect.signature(thread._fetch_records).parameters) == [
        "self", "consumer", "active_partitions", "timeout", "max_records"]
    assert "if not self.consumer.flow_active:" in inspect.getsource(thread._fetch_records)
    assert "self.thread_loop = " in inspect.getsource(ServiceThread.__init__)
    assert ingest._TunedConsumerThread.getmany is not thread.getmany


def test_the_fetch_runs_on_the_thread_loop_and_answers_on_the_callers() -> None:
    from tables.faust_compat import fetch_records

    calls: list[tuple[Any, ...]] = []
    kafka = SimpleNamespace(_max_poll_records=500)

    async def scenario() -> None:
        import threading

        thread_loop = asyncio.new_event_loop()
        runner = threading.Thread(target=thread_loop.run_forever, daemon=True)
        runner.start()

        async def fetch(consumer: Any, active: Any, *, timeout: float, max_records: int) -> dict[str, int]:
            calls.append((asyncio.get_running_loop() is thread_loop, consumer, active, timeout, max_records))
            return {"records": 3}

        fake = SimpleNamespace(_ensure_consumer=lambda: kafka, _fetch_records=fetch, thread_loop=thread_loop)
        try:
            assert await fetch_records(fake, {"tp"}, 0.5) == {"records": 3}
        finally:
            thread_loop.call_soon_threadsafe(thread_loop.stop)
            runner.join()
            thread_loop.close()

    asyncio.run(scenario())
    assert calls == [(True, kafka, {"tp"}, 0.5, 500)]


@pytest.mark.parametrize("patched", [True, False])
def test_a_transactional_producer_retries_a_coordinator_lookup_the_broker_cut_off(patched: bool) -> None:
    """A connection closed during FindCoordinator (a broker stopping) is retried, not the producer's end.

    Without tables.faust_compat.retry_coordinator_lookups, aiokafka's sender raises it (its task ends and
    every later transaction call fails); with it, the lookup is tried again and finds the coordinator.
    """
    from aiokafka import AIOKafkaProducer
    from aiokafka.client import CoordinationType
    from aiokafka.errors import InvalidRequestError, KafkaConnectionError, KafkaError

    from tables.faust_compat import retry_coordinator_lookups

    async def scenario(failures: list[Exception]) -> tuple[Any, int]:
        producer = AIOKafkaProducer(bootstrap_servers="127.0.0.1:1", transactional_id="t-0",
                                    enable_idempotence=True, retry_backoff_ms=1)
        if patched:
            assert retry_coordinator_lookups(producer) is producer
        client = producer._sender.client
        lookups = 0

        async def lookup(coordinator_type: Any, key: str) -> int:
            nonlocal lookups
            lookups += 1
            if failures:
                raise failures.pop(0)
            return 7

        async def ready(node_id: int, group: Any = None) -> bool:
            return True

        async def metadata() -> bool:
            return True

        client.coordinator_lookup, client.ready, client.force_metadata_update = lookup, ready, metadata
        try:
            return await producer._sender._find_coordinator(CoordinationType.TRANSACTION, "t-0"), lookups
        except KafkaError as err:
            return err, lookups

    cut_off = [KafkaConnectionError("Connection at 127.0.0.1:9092 closed"), KafkaConnectionError("closed")]
    found, lookups = asyncio.run(scenario(cut_off))
    if patched:
        assert (found, lookups) == (7, 3)
    else:  # aiokafka's own behaviour, which the patch exists for
        assert isinstance(found, KafkaError) and isinstance(found.__cause__, KafkaConnectionError)
        assert lookups == 1
    refused, lookups = asyncio.run(scenario([InvalidRequestError()]))  # not retriable: raised either way
    assert isinstance(refused, KafkaError) and lookups == 1
