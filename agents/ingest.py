"""Batch ingestion: Kafka records reach seam as per-partition lists, beneath Faust's per-event path.

Faust delivers records one at a time (a task per message in the consumer's drain loop, then the
conductor, the stream, an ack per event); that plumbing, not the model or the broker, caps a Faust
agent at a few thousand events per second. This module keeps Faust's consumer thread, rebalancing,
commit bookkeeping, tables and web views, and replaces only the drain loop for topics that have a
batch handler. :func:`install` gives an app a consumer of its own and returns its :class:`Ingestion`,
on which handlers and hooks are registered (they belong to that app, not to this module):

* ``@ingestion.batch_agent(app, topic)`` registers ``async def handler(batch: RecordBatch)``. The handler receives
  every record the fetch returned for one partition, raw (bytes, offset, key, timestamp), in order.
* Acknowledgement is explicit: ``batch.ack(offsets)`` marks offsets committable once their outputs
  are delivered; Faust's periodic commit then advances each partition up to the first offset not yet
  acknowledged, as seam's ledger (:mod:`agents.acks`) counts it. Offsets the broker never returns
  (transaction markers, compacted records) are registered as gaps and count as acknowledged.
* Rebalance safety: when partitions are revoked, the hooks registered with :meth:`Ingestion.before_revoke`
  (the pipeline flushes its model boundary) get up to ``REVOKE_FLUSH_TIMEOUT_S`` to deliver what is
  in flight, and what they acknowledged is committed before the partitions go. Every batch also
  remembers the assignment epoch it was fetched in; Faust revokes all partitions at every rebalance
  and seeks back to the committed offsets afterwards, so an ack that arrives later, from an older
  epoch, is dropped: those records are delivered again (to this worker or the new owner) and are
  never acknowledged after their partition moved.
* Backpressure: the drain loop awaits the handler, and the handler awaits the model boundary, so a
  full boundary stops fetching; the consumer thread's own fetch buffer bounds what is read ahead.
* :meth:`Ingestion.before_commit` hooks run right before every offset commit (the pipeline flushes its cached
  table writes there, so the changelog records precede the offsets that depend on them).
* A handler that raises stops the worker without acknowledging the batch (it is redelivered after
  the restart); the error is logged with its partition and offsets.
* Transactions (:func:`install` with ``commit_offsets``): offsets are committed by that function
  (seam's exactly-once mode writes them into Kafka transactions, see :mod:`agents.transactions`)
  instead of the consumer, every commit holds intake (no handler runs while hooks and the commit
  do), and the consumer reads ``read_committed``.

The private faust-streaming and aiokafka names it relies on are listed, and all but the consumer's own
state used from the subclass are reached through, :mod:`app.faust_compat`.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from faust.types import TP, AppT, TopicT

from agents.acks import AckLedger
from agents.epochs import AssignmentEpochs
from app.faust_compat import (
    AIOKafkaConsumerThread,
    FaustConsumer,
    FaustTransport,
    ack_lock,
    current_event,
    rewind,
    tune_fetch,
)

__all__ = [
    "Acker",
    "BatchConsumer",
    "BatchTransport",
    "FetchOptions",
    "RawRecord",
    "RecordBatch",
    "Ingestion",
    "SkipCommit",
    "current_partition",
    "install",
    "table_partition",
]

logger = logging.getLogger(__name__)


class RawRecord(Protocol):
    """One Kafka record as fetched: aiokafka's ``ConsumerRecord`` satisfies it (timestamp in ms)."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes]]  # carried into dead letters and late records, so a replay keeps them


Acker = Callable[[Sequence[int]], object]


class RecordBatch:
    """The records one fetch returned for one partition, and the way to acknowledge them."""

    __slots__ = ("topic", "partition", "records", "epoch", "_acker")

    def __init__(self, topic: str, partition: int, records: Sequence[RawRecord], acker: Acker, epoch: int = 0) -> None:
        self.topic = topic
        self.partition = partition
        self.records = records
        self.epoch = epoch  # the consumer's assignment epoch when the records were fetched
        self._acker = acker

    def ack(self, offsets: Sequence[int]) -> None:
        """Mark these offsets committable: their outputs are delivered."""
        self._acker(offsets)

    def __repr__(self) -> str:
        first, last = self.records[0].offset, self.records[-1].offset
        return f"<RecordBatch {self.topic}[{self.partition}] offsets {first}..{last} ({len(self.records)})>"


BatchHandler = Callable[[RecordBatch], Awaitable[None]]
RevokeHook = Callable[[], Awaitable[None]]
CommitHook = Callable[[], Awaitable[None]]
OffsetCommitter = Callable[[Mapping[TP, int]], Awaitable[bool]]
AssignmentPreparer = Callable[[set[TP]], Awaitable[None]]
REVOKE_FLUSH_TIMEOUT_S = 10.0
STOP_COMMIT_TIMEOUT_S = 5.0
# A hole this large in the offsets handed over is not transaction markers: worth a warning (see _deliver_batch_now).
LARGE_GAP = 100


class SkipCommit(Exception):  # noqa: N818 - a control-flow signal, not an error
    """Raised by a commit hook when committing now would be unsafe; the commit is skipped."""


@dataclass(frozen=True, slots=True)
class FetchOptions:
    """How the consumer fetches: a fetch waits up to ``max_wait_ms`` for ``min_bytes`` of records."""

    min_bytes: int = 1
    max_wait_ms: int = 1500  # Faust's own choice
    read_committed: bool = False


@dataclass
class Ingestion:
    """One app's batch ingestion: its handlers and hooks, and how it fetches and commits (see :func:`install`)."""

    offset_committer: OffsetCommitter | None = None  # commits in transactions, holding intake
    commit_observer: Callable[[float], None] | None = None  # gets the seconds each commit took
    assignment_preparer: AssignmentPreparer | None = None  # before a new assignment is restored and sought
    fetch: FetchOptions = field(default_factory=FetchOptions)
    handlers: dict[str, BatchHandler] = field(default_factory=dict)
    revoke_hooks: list[RevokeHook] = field(default_factory=list)
    commit_hooks: list[CommitHook] = field(default_factory=list)

    def before_revoke(self, hook: RevokeHook) -> RevokeHook:
        """Register ``hook`` to deliver in-flight work before partitions are revoked (bounded in time)."""
        self.revoke_hooks.append(hook)
        return hook

    def before_commit(self, hook: CommitHook) -> CommitHook:
        """Register ``hook`` to run (and be awaited) right before every offset commit."""
        self.commit_hooks.append(hook)
        return hook

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


class BatchConsumer(FaustConsumer):
    """Faust's aiokafka consumer whose drain loop hands batch-handled topics over as lists."""

    ingestion = Ingestion()  # :func:`install` gives each app a subclass with its own

    @property
    def offset_committer(self) -> OffsetCommitter | None:
        """Set by :func:`install`: commits go through it, holding intake, reading read_committed."""
        return self.ingestion.offset_committer

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.epochs = AssignmentEpochs()  # what may be handed over, and from where (agents.epochs)
        self.acks: AckLedger[TP] = AckLedger()  # what batch-handled partitions may commit (agents.acks)
        self._background_commit: asyncio.Future[None] | None = None
        self._intake = asyncio.Lock()
        self._committing = asyncio.Lock()
        self.transaction_offsets: dict[TP, int] = {}  # offsets this worker committed in transactions
        self.fetch_rounds = 0  # drain-loop rounds begun: each hands on all its fetch returned, then the next begins
        self.rewinds = 0  # changelog partitions sought back to records fetched but not handed on

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
        preparer = self.ingestion.assignment_preparer
        if preparer is not None:
            await preparer(assigned)
        await super().on_partitions_assigned(assigned, generation_id)

    async def on_partitions_revoked(self, revoked: set[TP]) -> None:
        # Intake closes first: a batch handed over after the in-flight work was delivered, or while
        # its offsets were committed, would be acknowledged too late and handled again by the next
        # owner. No commit runs meanwhile either (one may already hold the producer's flush).
        async with self._committing, self._intake:
            if revoked:
                revoke_hooks = self.ingestion.revoke_hooks
                if revoke_hooks:
                    try:
                        await asyncio.wait_for(asyncio.gather(*(hook() for hook in revoke_hooks)),
                                               REVOKE_FLUSH_TIMEOUT_S)
                    except TimeoutError:
                        logger.warning("in-flight batches not delivered within %.0fs of revocation; they will "
                                       "be delivered again", REVOKE_FLUSH_TIMEOUT_S)
                await self._bounded_while_stopping(self._commit_after_hooks(None, True))
            # Any batch fetched before this point may no longer be ours: its acks are dropped, and
            # what was done in the revoked partitions no longer counts (their records come again).
            self.epochs.revoke()
            self.acks.forget(revoked)
        await super().on_partitions_revoked(revoked)

    async def perform_seek(self) -> None:
        started_in = self.epochs.seek_started()
        await super().perform_seek()
        if self.offset_committer is not None:
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

    async def commit(self, topics: Any = None, start_new_transaction: bool = True) -> bool:
        return await self._bounded_while_stopping(self._commit_one_at_a_time(topics, start_new_transaction))

    async def _bounded_while_stopping(self, commit: Awaitable[bool]) -> bool:
        if not (self.should_stop or self.app.should_stop):
            return await commit
        # Stopping: a commit must not hold shutdown up (the producer or the consumer thread may be
        # gone). Not committing is safe: the records are delivered again.
        try:
            return await asyncio.wait_for(commit, STOP_COMMIT_TIMEOUT_S)
        except TimeoutError:
            logger.warning("commit while stopping took over %.0fs; skipped (those records are delivered again)",
                           STOP_COMMIT_TIMEOUT_S)
            return False

    async def _commit_one_at_a_time(self, topics: Any, start_new_transaction: bool) -> bool:
        async with self._committing:  # one at a time, hooks included (a hook may yield mid-flush)
            started = time.perf_counter()
            if self.offset_committer is None:
                committed = await self._commit_after_hooks(topics, start_new_transaction)
            else:
                async with self._intake:  # a cut: no batch is handled until the transactions commit
                    committed = await self._commit_after_hooks(topics, start_new_transaction)
            observer = self.ingestion.commit_observer
            if committed and observer is not None:
                observer(time.perf_counter() - started)
            return committed

    async def _commit_after_hooks(self, topics: Any, start_new_transaction: bool) -> bool:
        # Runs before Faust computes the committable offsets and flushes the producer, so table
        # writes released here reach the changelog before the offsets that depend on them.
        try:
            for hook in self.ingestion.commit_hooks:
                await hook()
        except SkipCommit as reason:
            logger.info("commit skipped: %s", reason)
            return False
        committer = self.offset_committer
        if committer is None:
            return await super().commit(topics, start_new_transaction=start_new_transaction)
        # Faust's commit drops partitions that are no longer in the assignment, which they are not
        # any more while being revoked; their transactions must still commit with their offsets.
        pending = list(self._filter_tps_with_pending_acks(topics))
        offsets = self._filter_committable_offsets(pending)
        try:
            committed = await committer(offsets)
        except Exception as exc:
            logger.exception("transactional commit failed; stopping (open transactions are aborted by the "
                             "partitions' next owner, and their records processed again)")
            # Not awaited here: stopping commits too, and this commit holds intake until it returns.
            self.add_future(self.crash(exc))
            return False
        if committed:
            self._committed_offset.update(offsets)
            self.transaction_offsets.update(offsets)
        return committed

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
        consumer_stopped = self._stopped.is_set
        fetcher_stopped = fetcher._stopped.is_set
        try:
            while not (consumer_stopped() or fetcher_stopped()):
                # Everything the previous round's fetch returned was handed on (to a handler, to a
                # table's restore), or dropped for a rebalance and sought back to: a restore may count
                # on it (see agents.transactions.release_restores).
                self.fetch_rounds += 1
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
                # Exactly once commits by the interval only: every commit is a cut that holds intake
                # (and outputs are visible when it is done, not sooner, whatever piled up).
                if commit_every is not None and self._n_acked >= commit_every and self.offset_committer is None:
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
            await self.commit()
        except Exception:
            if not self.should_stop:  # failing while stopping is expected; the next owner re-reads
                logger.exception("background commit failed")

    async def _deliver_batch(self, tp: TP, tp_records: list[Any], handler: BatchHandler) -> None:
        epoch = self.epoch
        try:
            async with self._intake:  # closed while a commit cuts (exactly once) or partitions are revoked
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
        # skipped: committed, never scored. Both are sought back to (see app.faust_compat.rewind);
        # ``inputs=False`` where Faust's seek to the committed offsets follows anyway.
        for tp, tp_records in fetched:
            if tp_records and (inputs or self._is_changelog_tp(tp)):
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


def install(app: AppT, *, commit_offsets: OffsetCommitter | None = None, fetch: FetchOptions | None = None,
            observe_commit: Callable[[float], None] | None = None,
            prepare_assignment: AssignmentPreparer | None = None) -> Ingestion:
    """Make ``app`` consume through a :class:`BatchConsumer` of its own (call before the worker starts).

    With ``commit_offsets``, that function commits the offsets (in transactions), every commit holds
    intake, and the consumer reads ``read_committed``. ``fetch`` sets how records are fetched;
    ``observe_commit`` gets the seconds each commit took (hooks included); ``prepare_assignment``
    runs on newly assigned partitions before their restore starts and before they are sought.
    Returns the app's :class:`Ingestion`: register batch handlers and hooks on it.
    """
    options = fetch or FetchOptions()
    ingestion = Ingestion(
        offset_committer=commit_offsets, commit_observer=observe_commit, assignment_preparer=prepare_assignment,
        fetch=FetchOptions(options.min_bytes, options.max_wait_ms, commit_offsets is not None))
    consumer = type("BatchConsumer", (BatchConsumer,), {"ingestion": ingestion})
    transport = type("BatchTransport", (BatchTransport,), {"Consumer": consumer})
    app.transport = transport(app.conf.broker_consumer, app)
    return ingestion
