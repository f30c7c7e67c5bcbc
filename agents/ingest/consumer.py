"""Batch ingestion: Kafka records reach seam as per-partition lists, beneath Faust's per-event path.

Faust delivers records one at a time (a task per message in the consumer's drain loop, then the
conductor, the stream, an ack per event); that plumbing, not the model or the broker, caps a Faust
agent at a few thousand events per second. This module keeps Faust's consumer thread, rebalancing,
commit bookkeeping, tables and web views, and replaces only the drain loop for topics that have a
batch handler. :func:`install` gives an app a consumer of its own that commits through the app's
:class:`Commits` (seam's: :class:`agents.commit.checkpoint.Checkpoint`, where every step of a commit is),
and returns its :class:`Ingestion`, on which handlers are registered (they belong to that app):

* ``@ingestion.batch_agent(app, topic)`` registers ``async def handler(batch: RecordBatch)``. The handler receives
  every record the fetch returned for one partition, raw (bytes, offset, key, timestamp), in order.
* Acknowledgement is explicit: ``batch.ack(offsets)`` marks offsets committable once their outputs
  are delivered; Faust's periodic commit then advances each partition up to the first offset not yet
  acknowledged, as seam's ledger (:mod:`agents.ingest.acks`) counts it. Offsets the broker never returns
  (transaction markers, compacted records) are registered as gaps and count as acknowledged.
* Rebalance safety: when partitions are revoked, intake closes and a commit runs (``"revocation"``:
  what is in flight is delivered, within a bound, and what it acknowledged is committed) before the
  partitions go. Every batch also
  remembers the assignment epoch it was fetched in; Faust revokes all partitions at every rebalance
  and seeks back to the committed offsets afterwards, so an ack that arrives later, from an older
  epoch, is dropped: those records are delivered again (to this worker or the new owner) and are
  never acknowledged after their partition moved.
* Backpressure: the drain loop awaits the handler, and the handler awaits the model boundary, so a
  full boundary stops fetching; the consumer thread's own fetch buffer bounds what is read ahead.
* Commits: Faust's timer and Faust's stop call :meth:`BatchConsumer.commit`, which hands them on with
  their reason; so do acknowledgements piling up (in the background, where the guarantee wants it).
  The consumer answers which offsets may be committed (:meth:`BatchConsumer.committable_offsets`) and
  commits them for the group (:meth:`BatchConsumer.commit_group_offsets`).
* A handler that raises stops the worker without acknowledging the batch (it is redelivered after
  the restart); the error is logged with its partition and offsets.
* Transactions (commits that ``read_committed``): the consumer reads only committed records, and after a
  seek never goes back before what it committed in a transaction itself.

The private faust-streaming and aiokafka names it relies on are listed in :mod:`tables.faust_compat`, and
reached through it: the consumer's own state as well, through the names that module gives it.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from faust.types import TP, AppT, TopicT

from agents.ingest.acks import AckLedger
from agents.ingest.epochs import AssignmentEpochs
from agents.ingest.pacing import FetchPacing
from agents.ingest.records import Acker, RawRecord, RecordBatch
from tables.faust_compat import (
    AIOKafkaConsumerThread,
    FaustConsumer,
    FaustTransport,
    ack_lock,
    commit_offsets,
    current_event,
    fetch_records,
    is_changelog,
    mark_stream_progress,
    rewind,
    set_fetch_wait,
    tune_fetch,
)
from tables.faust_compat import (
    fetcher_stopped as fetcher_stopped_of,
)

__all__ = [
    "Acker",
    "BatchConsumer",
    "BatchTransport",
    "FetchOptions",
    "RawRecord",
    "RecordBatch",
    "Commits",
    "CommitReason",
    "Ingestion",
    "current_partition",
    "install",
    "table_partition",
]

logger = logging.getLogger(__name__)


BatchHandler = Callable[[RecordBatch], Awaitable[None]]
# What asked for a commit: Faust (its commit timer), Faust or seam while the worker stops, acknowledgements
# piling up, partitions about to be revoked.
CommitReason = Literal["faust", "acks", "revocation", "stop"]
# A hole this large in the offsets handed over is not transaction markers: worth a warning (see _deliver_batch_now).
LARGE_GAP = 100


class Commits(Protocol):
    """Who commits for a batch consumer: :class:`agents.commit.checkpoint.Checkpoint`."""

    intake: asyncio.Lock  # held by the consumer around every batch it hands over

    @property
    def commits_on_acks(self) -> bool:
        """Whether acknowledgements piling up (Faust's ``broker_commit_every``) start a commit."""

    @property
    def read_committed(self) -> bool:
        """Whether the consumer reads only committed records (transactions)."""

    async def prepare_assignment(self, assigned: set[TP]) -> None:
        """Run on newly assigned partitions before their restore starts and before they are sought."""

    async def commit(self, reason: CommitReason, *, then: Callable[[], None] | None = None) -> bool:
        """Commit what is done (``then`` runs before intake opens again); return whether offsets went."""


@dataclass(frozen=True, slots=True)
class FetchOptions:
    """How the consumer fetches: a fetch waits up to ``max_wait_ms`` for ``min_bytes`` of records, and up to
    ``busy_max_wait_ms`` as the event loop gets busy (:mod:`agents.ingest.pacing`; not above ``max_wait_ms``:
    a fixed wait)."""

    min_bytes: int = 1
    max_wait_ms: int = 1500  # Faust's own choice
    read_committed: bool = False
    busy_max_wait_ms: int = 0


@dataclass
class Ingestion:
    """One app's batch ingestion: its handlers, who commits, and how it fetches (see :func:`install`)."""

    commits: Commits
    fetch: FetchOptions = field(default_factory=FetchOptions)
    handlers: dict[str, BatchHandler] = field(default_factory=dict)
    # Entered around each fetch's hand-over to the handlers (the pipeline's: its rows leave together).
    hand_over: Callable[[], AbstractContextManager[None]] = nullcontext

    def batch_agent(self, app: AppT, topic: TopicT) -> Callable[[BatchHandler], BatchHandler]:
        """Register ``handler`` for every partition of ``topic`` (the topic joins the app's subscription)."""

        def register(handler: BatchHandler) -> BatchHandler:
            for name in topic.topics:
                if name in self.handlers:
                    raise ValueError(f"topic {name!r} already has a batch handler")
                self.handlers[name] = handler
            app.topics.add(topic)
            return handler

        return register


class _SourceEvent:
    """Stands in for Faust's current event: tables only read ``.message.topic/.partition``."""

    __slots__ = ("message", "__weakref__")

    def __init__(self, topic: str, partition: int) -> None:
        self.message = _SourceMessage(topic, partition)


@dataclass(frozen=True, slots=True)
class _SourceMessage:
    topic: str
    partition: int


def current_partition() -> int:
    """The source partition current table reads and writes use (inside :func:`table_partition`)."""
    ref = current_event.get(None)
    event = ref() if ref is not None else None
    if event is None:
        raise RuntimeError("no current source partition (use table_partition)")
    return int(event.message.partition)


@contextmanager
def table_partition(topic: str, partition: int) -> Iterator[None]:
    """Make table reads and writes inside the block use ``partition`` of ``topic``'s tables."""
    stand_in = _SourceEvent(topic, partition)
    token = current_event.set(weakref.ref(stand_in))  # type: ignore[arg-type]
    try:
        yield
    finally:
        current_event.reset(token)


class _TunedConsumerThread(AIOKafkaConsumerThread):
    """Faust's consumer thread with seam's fetch options (and read_committed for transactions)."""

    def __init__(self, consumer: BatchConsumer, **kwargs: Any) -> None:
        super().__init__(consumer, **kwargs)
        self.options = consumer.ingestion.fetch

    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        options = self.options
        tune_fetch(consumer, min_bytes=options.min_bytes, max_wait_ms=options.max_wait_ms,
                   read_committed=options.read_committed)  # read by start(), which has not run yet
        return consumer

    async def getmany(self, active_partitions: set[TP] | None, timeout: float) -> Any:
        """Fetch as Faust does, without a trip through mode's method queue (see :func:`fetch_records`)."""
        return await fetch_records(self, active_partitions, timeout)


class BatchConsumer(FaustConsumer):
    """Faust's aiokafka consumer whose drain loop hands batch-handled topics over as lists."""

    ingestion: Ingestion  # :func:`install` gives each app a subclass with its own

    @property
    def commits(self) -> Commits:
        return self.ingestion.commits

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.epochs = AssignmentEpochs()  # what may be handed over, and from where (agents.ingest.epochs)
        self.acks: AckLedger[TP] = AckLedger()  # what batch-handled partitions may commit (agents.ingest.acks)
        self._background_commit: asyncio.Future[None] | None = None
        self.transaction_offsets: dict[TP, int] = {}  # offsets this worker committed in transactions
        self.fetch_rounds = 0  # drain-loop rounds begun: each hands on all its fetch returned, then the next begins
        options = self.ingestion.fetch
        # How long fetches wait, from how busy the event loop is (None: always options.max_wait_ms).
        self.fetch_pacing = (FetchPacing(options.max_wait_ms, options.busy_max_wait_ms, options.min_bytes)
                             if options.busy_max_wait_ms > options.max_wait_ms else None)
        self.rewinds = 0  # changelog partitions sought back to records fetched but not handed on

    @property
    def fetch_wait_ms(self) -> int:
        """How long the broker may hold the next fetch for records, in ms."""
        return self.fetch_pacing.wait_ms if self.fetch_pacing is not None else self.ingestion.fetch.max_wait_ms

    @property
    def epoch(self) -> int:
        """The assignment epoch: it changes whenever partitions are revoked."""
        return self.epochs.epoch

    @property
    def stale_acks(self) -> int:
        """Acknowledgements dropped because their batch was fetched before a revocation."""
        return self.epochs.stale_acks

    def _new_consumer_thread(self) -> AIOKafkaConsumerThread:
        return _TunedConsumerThread(self, loop=self.loop, beacon=self.beacon)

    async def on_partitions_assigned(self, assigned: set[TP], generation_id: int = 0) -> None:
        if self.should_stop or self.app.should_stop:
            # A rebalance that completes while the worker stops (its revoke hook outlasted a SIGTERM): the
            # tables, recovery and fetcher it would restart are stopping, and the consumer thread's stop
            # waits for this callback. The partitions go to the others once this member leaves the group.
            logger.info("partitions assigned while stopping: not taken up (%d)", len(assigned))
            return
        # Before Faust's own handling, which starts the restores (reading the changelogs' end
        # offsets) and then seeks to the committed offsets: exactly once waits here until the
        # previous owner's transactions are complete, so both read what that owner committed.
        await self.commits.prepare_assignment(assigned)
        await super().on_partitions_assigned(assigned, generation_id)

    def close(self) -> None:
        """Nothing: the consumer thread's stop closes the Kafka consumer, on the thread's own loop.

        Faust calls this when a rebalance reaches a stopping app. Its version marks the aiokafka consumer
        closed and runs the consumer's client and group coordinator close on the app's loop, from the
        wrong thread, while the consumer thread's loop still drives them. The thread's own stop then
        found the consumer closed and skipped it: no LeaveGroup (the others waited out the session
        timeout for this member's partitions), and a rebalance completing meanwhile could leave the
        worker hanging on SIGTERM. The thread's stop, which follows, closes the consumer where it runs
        and leaves the group.
        """

    async def on_partitions_revoked(self, revoked: set[TP]) -> None:
        def forget() -> None:
            # Any batch fetched before this point may no longer be ours: its acks are dropped, and
            # what was done in the revoked partitions no longer counts (their records come again).
            self.epochs.revoke()
            self.acks.forget(revoked)

        if revoked:
            # Intake closed, in-flight work delivered, then committed, then forgotten: a batch handed
            # over meanwhile would be acknowledged too late and handled again by the next owner.
            await self.commits.commit("revocation", then=forget)
        else:
            async with self.commits.intake:
                forget()
        await super().on_partitions_revoked(revoked)

    async def perform_seek(self) -> None:
        started_in = self.epochs.seek_started()
        await super().perform_seek()
        await self._seek_past_own_commits()
        self.epochs.seek_done(started_in)

    async def _seek_past_own_commits(self) -> None:
        # A transaction's offsets become visible once the broker has written its commit markers,
        # after commit_transaction() returns; a seek right after it (a rebalance) can read the
        # previous offsets. What this worker committed itself is certain: never go back before it.
        assigned = self.assignment()
        for tp, offset in self.transaction_offsets.items():
            committed = self._committed_offset[tp]
            if tp in assigned and (committed is None or committed < offset):
                logger.info("%s: committed offset read as %s, but this worker's transaction committed %d; "
                            "resuming there", tp, committed, offset)
                self._committed_offset[tp] = offset
                self._read_offset[tp] = offset
                await self.seek(tp, offset)

    async def _deliver_held(self) -> None:
        for tp, tp_records in self.epochs.take_held().items():
            await self._deliver_batch(tp, tp_records, self.ingestion.handlers[tp.topic])

    @property
    def stopping(self) -> bool:
        """Whether the consumer or the app is stopping."""
        return bool(self.should_stop or self.app.should_stop)

    async def commit(self, topics: Any = None, start_new_transaction: bool = True) -> bool:
        """Faust's commit (its timer, its stop): every topic's, through the app's commits."""
        return await self.commits.commit("stop" if self.stopping else "faust")

    def committable_offsets(self) -> dict[TP, int]:
        """Each partition's offset up to which every record is done (Faust asks :meth:`_new_offset`)."""
        return dict(self._filter_committable_offsets(list(self._filter_tps_with_pending_acks(None))))

    async def commit_group_offsets(self, offsets: Mapping[TP, int]) -> bool:
        """Commit ``offsets`` for the consumer group, as Faust's own commit does."""
        return await commit_offsets(self, offsets)

    def committed_in_transactions(self, offsets: Mapping[TP, int]) -> None:
        """Record offsets that transactions committed: a seek never goes back before them."""
        self._committed_offset.update(offsets)
        self.transaction_offsets.update(offsets)

    def ack_offsets(self, tp: TP, offsets: Iterable[int], epoch: int) -> int:
        """Mark ``offsets`` of ``tp`` acknowledged unless the assignment changed; return how many."""
        if not self.epochs.accepts(epoch):
            return 0
        with ack_lock:
            fresh = self.acks.ack(tp, offsets, self._committed_offset[tp])
            self._n_acked += fresh
        return fresh

    def _new_offset(self, tp: TP) -> int | None:
        # Faust's commit asks this for every partition with acknowledgements: batch-handled ones
        # are answered by seam's ledger, the others (Faust's own per-message path) by Faust's.
        if tp in self.acks:
            return self.acks.committable(tp, self._committed_offset[tp])
        return super()._new_offset(tp)

    def _filter_tps_with_pending_acks(self, topics: Any = None) -> Iterator[TP]:
        yield from super()._filter_tps_with_pending_acks(topics)
        for tp in self.acks.partitions():
            if topics is None or tp in topics or tp.topic in topics:
                yield tp

    async def _drain_messages(self, fetcher: Any) -> None:  # noqa: C901 - mirrors Faust's loop
        consumer_stopped = self._stopped.is_set  # the base class's own (see tables.faust_compat)
        fetcher_stopped = fetcher_stopped_of(fetcher)
        try:
            while not (consumer_stopped() or fetcher_stopped()):
                # Everything the previous round's fetch returned was handed on (to a handler, to a
                # table's restore), or dropped for a rebalance and sought back to: a restore may count
                # on it (see agents.commit.transactions.release_restores).
                self.fetch_rounds += 1
                if self.fetch_pacing is not None:
                    wait_ms = self.fetch_pacing.observe(time.monotonic(), time.thread_time())
                    if wait_ms is not None:
                        set_fetch_wait(self._thread, wait_ms, self.fetch_pacing.min_bytes)
                records, active = await self._wait_next_records(1.0)
                if self.epochs.holding and self.epochs.positioned and self.flow_active and not self.should_stop:
                    # Even if nothing new came: the seek may have left the position past these.
                    await self._deliver_held()
                if not records or self.should_stop:
                    continue
                dropped: dict[TP, tuple[int, int]] = {}
                if not self.flow_active:
                    self._not_handed_on(dropped, records.items(), inputs=False)
                    await self.perform_seek()  # as Faust's getmany: re-read from committed offsets
                    await self._rewind(dropped)  # and changelogs, which have none, from these records
                    continue
                generation = self.app.consumer_generation_id
                fetched = list(records.items())
                with self.ingestion.hand_over():
                    for index, (tp, tp_records) in enumerate(fetched):
                        if not self.flow_active or self.app.consumer_generation_id != generation:
                            self._not_handed_on(dropped, fetched[index:])
                            break
                        if active is not None and tp not in active and tp not in self._buffered_partitions:
                            self._not_handed_on(dropped, [(tp, tp_records)])
                            continue
                        handler = self.ingestion.handlers.get(tp.topic)
                        if handler is None:
                            self._not_handed_on(dropped, [(tp, await self._deliver_each(tp, tp_records))])
                        else:
                            await self._deliver_batch(tp, tp_records, handler)
                await self._rewind(dropped)
                commit_every = self._commit_every
                if commit_every is not None and self._n_acked >= commit_every and self.commits.commits_on_acks:
                    # In the background, unlike Faust's loop: a commit flushes the producer (and the
                    # state cache's changelog writes); awaiting it here would stall ingestion.
                    self._n_acked = 0
                    self._background_commit = asyncio.ensure_future(self._commit_in_background())
        except self.consumer_stopped_errors:
            if self.transport.app.should_stop:
                return
            raise
        except asyncio.CancelledError:
            # Faust cancels this loop only to stop the fetcher (the worker is stopping). If that
            # happens during a rebalance, Faust's fetcher treats the cancel as a restart and calls
            # its supervisor, which it does not have: the worker would exit with an AttributeError.
            # Ending the loop normally here is what a stop means anyway.
            if fetcher_stopped() or consumer_stopped() or self.app.should_stop:
                return
            raise

    async def _commit_in_background(self) -> None:
        try:
            await self.commits.commit("acks")
        except Exception:
            if not self.should_stop:  # failing while stopping is expected; the next owner re-reads
                logger.exception("background commit failed")

    async def _deliver_batch(self, tp: TP, tp_records: list[Any], handler: BatchHandler) -> None:
        epoch = self.epoch
        try:
            async with self.commits.intake:  # closed while a commit cuts (exactly once) or partitions are revoked
                if self.epoch != epoch:
                    # Revoked while this waited: the partition is sought to its committed offset again
                    # (here or at its next owner), which these records are not before.
                    return
                await self._deliver_batch_now(tp, tp_records, handler, epoch)
        except Exception as exc:
            await self.crash(exc)  # outside the intake lock: stopping revokes, which takes it
            raise

    async def _deliver_batch_now(self, tp: TP, tp_records: list[Any], handler: BatchHandler, epoch: int) -> None:
        if not self.epochs.positioned:  # not yet sought to the committed offsets since the rebalance
            self.epochs.hold(tp, tp_records)
            return
        if tp not in self.assignment():
            # Fetched before a rebalance that gave the partition to another worker, which reads
            # these records from the committed offset: never handle them here.
            return
        # For batch-handled partitions the read offset is the next offset expected, as Faust's seek
        # sets it (Faust's own loop then stores the last offset read, and lets a re-fetch of that
        # record through again); never back before what this epoch handed over already.
        expected = self.epochs.next_offset(tp, self._read_offset[tp])
        committed = self._committed_offset[tp]
        fresh = []
        for record in tp_records:  # in offset order, each once (held records may repeat a fetch)
            if expected is not None and record.offset < expected:
                continue
            if expected is not None and record.offset > expected:
                # Offsets the broker skipped (transaction markers, compaction) count as acknowledged.
                # Unlike Faust's own loop, the gap ends before this record: it is not acked yet.
                if record.offset - expected >= LARGE_GAP:
                    logger.warning("%s[%d]: offsets %d-%d were not returned by the broker; taken as skipped "
                                   "(transaction markers, compaction)", tp.topic, tp.partition, expected,
                                   record.offset - 1)
                self.acks.gap(tp, expected, record.offset - 1, committed)
            fresh.append(record)
            expected = record.offset + 1
        if not fresh:
            return
        self.acks.begin(tp, fresh[0].offset, committed)  # with nothing committed, the partition starts here
        mark_stream_progress(self.app, tp)  # for Faust's check of lagging partitions (not a stream's events)
        self._read_offset[tp] = fresh[-1].offset + 1
        self.epochs.handed(tp, fresh[-1].offset + 1)
        batch = RecordBatch(tp.topic, tp.partition, fresh, lambda offsets: self.ack_offsets(tp, offsets, epoch),
                            epoch)
        try:
            await handler(batch)
        except Exception:
            logger.exception("batch handler failed on %r; the batch is not acknowledged", batch)
            raise

    def _not_handed_on(self, dropped: dict[TP, tuple[int, int]], fetched: Iterable[tuple[TP, list[Any]]], *,
                       inputs: bool = True) -> None:
        # Faust's loop drops what a rebalance interrupts and seeks back to the committed offsets, but
        # a changelog has none: the fetcher would stay past records a restore then never receives (a
        # key restored without them). An input partition dropped without that seek (fetched while it
        # was not yet active, or in a generation that ended) would stay past them as well, and its next
        # records would start after a hole that the acknowledgement ledger takes for offsets the broker
        # skipped: committed, never scored. Both are sought back to (see tables.faust_compat.rewind);
        # ``inputs=False`` where Faust's seek to the committed offsets follows anyway.
        for tp, tp_records in fetched:
            if tp_records and (inputs or is_changelog(self, tp)):
                dropped[tp] = (tp_records[0].offset, tp_records[-1].offset)

    async def _rewind(self, dropped: Mapping[TP, tuple[int, int]]) -> None:
        if self.should_stop or self.app.should_stop:
            # Stopping: nothing here reads these records again (the next owner starts from the committed
            # offsets), and the consumer thread may be gone, so a seek through it would never return.
            return
        if dropped:
            self.rewinds += 1  # first: a restore that read the position before must not count on it
            logger.info("records a rebalance interrupted are fetched again: %s",
                        ", ".join(f"{tp.topic}[{tp.partition}] from {first}" for tp, (first, _) in dropped.items()))
            await rewind(self, dropped)

    async def _deliver_each(self, tp: TP, tp_records: list[Any]) -> list[Any]:
        """Faust's own per-message path, for topics without a batch handler (tables, other agents).

        Returns the records not handed on: the flow was suspended (a rebalance) before they were.
        """
        for index, record in enumerate(tp_records):
            read_offset = self._read_offset[tp]
            if read_offset is not None and record.offset < read_offset:
                continue
            if read_offset and record.offset - read_offset > 1 and self.app.topics.acks_enabled_for(tp.topic):
                await self._add_gap(tp, read_offset + 1, record.offset)
            handing = self.callback(self._to_message(tp, record))
            if handing not in (await self.wait_first(handing, self.suspend_flow.wait())).done:
                return tp_records[index:]
            self._read_offset[tp] = record.offset
        return []


class BatchTransport(FaustTransport):
    """Faust's aiokafka transport with the batch-delivering consumer."""

    Consumer = BatchConsumer


def install(app: AppT, commits: Commits, *, fetch: FetchOptions | None = None) -> Ingestion:
    """Make ``app`` consume through a :class:`BatchConsumer` of its own that commits through ``commits``
    (call before the worker starts). ``fetch`` sets how records are fetched (read_committed as
    ``commits`` asks). Returns the app's :class:`Ingestion`: register batch handlers on it.
    """
    options = fetch or FetchOptions()
    ingestion = Ingestion(commits, FetchOptions(options.min_bytes, options.max_wait_ms, commits.read_committed,
                                                options.busy_max_wait_ms))
    consumer = type("BatchConsumer", (BatchConsumer,), {"ingestion": ingestion})
    transport = type("BatchTransport", (BatchTransport,), {"Consumer": consumer})
    app.transport = transport(app.conf.broker_consumer, app)
    return ingestion
