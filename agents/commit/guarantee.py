"""The processing guarantee, chosen once when the app is built: everything that differs between the two.

:meth:`agents.commit.checkpoint.Checkpoint.commit` runs the same steps under both; each step asks the
guarantee what it does there. Besides the commit, a guarantee owns its producers and how state is
written, and what happens when partitions are assigned or revoked and when the worker stops:

=================  ==================================================  =================================================
                   :class:`AtLeastOnce`                                :class:`ExactlyOnce`
=================  ==================================================  =================================================
outputs            producers of their own (the feature log on a         each input partition's transactional producer
                   second: as many records as the predictions)          (:mod:`agents.commit.transactions`)
state writes       behind, every ``SEAM_STATE_WRITE_INTERVAL_S``, and   staged in each commit's transactions, into the
                   in each commit: changelog records on a producer of   local stores once the transaction commits
                   their own, acknowledged, then the local stores
a commit           records are scored meanwhile                         a cut: intake held, boundary drained, outputs
                                                                        delivered
offsets            the group's offset commit; also when                 in each partition's transaction, by the
                   acknowledgements pile up                             interval only
new assignment     nothing                                              fenced: waits for the previous owner's
                                                                        transactions; restores end at markers
revocation         nothing                                              open transactions aborted, producers closed
stop               a last commit while the producers still run          nothing (the next owner aborts what is open)
=================  ==================================================  =================================================
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from faust.types import TP

from agents.commit.checkpoint import Offsets, SkipCommit, Work
from agents.commit.transactions import PartitionTransactions
from agents.delivery.outputs import OutputProducer
from agents.ingest.consumer import table_partition
from agents.ingest.restore import release_restores
from agents.pipeline import Send
from tables.cache import StateCache
from tables.changelog import ChangelogProducer, ChangelogWriter
from tables.kafka import Connection

__all__ = ["AtLeastOnce", "ExactlyOnce", "TableWrite", "guarantee_for"]

logger = logging.getLogger(__name__)

# One table write of a partition: (table, partition, key, value); the value None deletes.
TableWrite = Callable[[Any, int, Any, Any], None]
STEP_S = 0.002  # the most state-writing work in one event-loop turn
# ... and its share of the event loop while records arrive: after a step of state writing the write waits
# (1 - share) / share times as long, so scoring keeps the rest of the loop whatever a write has to do.
STATE_WRITE_SHARE = 0.25
# A state write sends what it has queued once it holds this much, and goes on: the keys one write covers grow
# with the keys changed since the last, and a worker behind its input changes them all (100,000 cards at 7,500
# events/s in time lapse: each write covered nearly every card and held all their records until it ended; the
# worker held 1.0 GB at 4 minutes without this bound, 0.8 with it).
STATE_WRITE_SEND_BYTES = 4 << 20


def _crash_later(work: Work, exc: BaseException, pending: set[asyncio.Task[None]]) -> None:
    """Stop the worker for ``exc`` without awaiting it here: stopping commits too, and this runs inside a
    commit (``pending`` holds the task until it is done)."""
    task = asyncio.ensure_future(work.crash(exc))
    pending.add(task)
    task.add_done_callback(pending.discard)


def _observe(work: Work, cache: StateCache, writes: int, seconds: float) -> None:
    metrics = work.metrics
    metrics.state_flush.observe(seconds)
    metrics.state_writes.inc(writes)
    metrics.cached_keys.set(cache.cached_keys())
    metrics.cached_events.set(cache.last_events_held)
    metrics.cached_bytes.set(cache.last_bytes_held)


class AtLeastOnce:
    """Outputs on producers of their own, state written behind through its changelog, the group's offsets."""

    name = "at_least_once"
    cuts = False  # records are scored while a commit writes
    commits_on_acks = True  # acknowledgements piling up start a commit (in the background)
    read_committed = False

    def __init__(self, *, bootstrap: str | Connection, input_topic: str, write_interval_s: float = 0.25,
                 changelog: ChangelogWriter | None = None) -> None:
        """``changelog``: the writer of the state's changelog records (default: on a producer of its own)."""
        self._bootstrap = bootstrap
        self._write_interval_s = write_interval_s
        self._outputs: OutputProducer | None = None
        self._changelog_producer: ChangelogProducer | None = None
        if changelog is None:
            changelog = ChangelogWriter(self._send_changelog, functools.partial(table_partition, input_topic))
        self.changelog = changelog
        self._writing = asyncio.Lock()  # one state write at a time: behind, or in a commit
        self.paused_s = 0.0  # how long the last state write waited for scoring between its steps
        self._crashing: set[asyncio.Task[None]] = set()

    # Outputs and the changelog: producers of their own.

    async def start(self) -> Send:
        """Connect the producers; return how the pipeline sends an output."""
        self._changelog_producer = ChangelogProducer(self._bootstrap)
        await self._changelog_producer.start()
        # Every output on one connection: a model batch's predictions and feature-log records (as many)
        # leave in one produce request, not one each. Two connections cost the event loop 1-3 µs more an
        # event in writes, wake-ups and acknowledgements, and raised the median and the p99 at half of
        # saturation (docs/BENCHMARKS.md, "One connection for the outputs").
        self._outputs = OutputProducer(self._bootstrap)
        await self._outputs.start()
        return self._outputs.send

    async def stopping(self, app: Any) -> None:
        """The app has stopped fetching: commit what is delivered while the producers still run."""
        await app.consumer.commit()

    async def close(self) -> None:
        """Deliver what is pending and disconnect."""
        outputs, self._outputs = self._outputs, None
        if outputs is not None:
            await outputs.stop()
        if self._changelog_producer is not None:
            await self._changelog_producer.stop()
            self._changelog_producer = None

    async def _send_changelog(self, topic: str, partition: int, records: Sequence[tuple[bytes, bytes | None]]
                              ) -> list[int]:
        producer = self._changelog_producer
        if producer is None:
            raise RuntimeError("the changelog producer is not running")
        return await producer.send_many(topic, partition, records)

    # State.

    @property
    def table_write(self) -> TableWrite:
        """How the state cache's writes reach the tables: the changelog writer's batches."""
        return self.changelog.write

    async def write_behind(self, work: Work, app: Any) -> None:
        """Every write interval, write what changed (a commit's step 4), until the worker stops."""
        while not work.should_stop:
            await asyncio.sleep(self._write_interval_s)
            cache = work.cache
            if cache is None or app.rebalancing or cache.dirty_keys() == 0:
                continue
            try:
                await self.write_state(cache, work, paced=True)
            except SkipCommit:
                return  # the worker is stopping (see write_state)

    async def write_state(self, cache: StateCache, work: Work, *, paced: bool = False) -> int:
        """The cache's changes as changelog records, all acknowledged, then into the local stores; then trim.

        ``paced``: records are being scored meanwhile, so the write takes at most ``STATE_WRITE_SHARE`` of the
        event loop (otherwise, as a revocation or a stop wants it, it runs as fast as it can).
        """
        pause_ratio = (1 - STATE_WRITE_SHARE) / STATE_WRITE_SHARE if paced and not work.should_stop else 0.0
        async with self._writing:
            writes, paused_s = 0, 0.0
            started = step_started = time.perf_counter()
            # The keys written stay cached (no trim) until the changelog has them and they are stored.
            for written in cache.flushing(trim=False):
                writes = written
                if self.changelog.pending_bytes >= STATE_WRITE_SEND_BYTES:
                    # Sent as they come, in the order they came (a partition's keys before its watermark):
                    # what a write holds is bounded, however many keys it covers.
                    await self._flush_changelog(work)
                step_s = time.perf_counter() - step_started
                if step_s > STEP_S:
                    # Let records be scored, and for longer than this step took: a write that took turns with
                    # scoring would halve what the loop scores while it runs, and records would queue up.
                    paused_from = time.perf_counter()
                    await asyncio.sleep(step_s * pause_ratio)
                    step_started = time.perf_counter()
                    paused_s += step_started - paused_from
            await self._flush_changelog(work)
            cache.trim()  # the written states are in RocksDB now: clean ones may be dropped
            self.paused_s = paused_s
            _observe(work, cache, writes, time.perf_counter() - started)
            return writes

    async def _flush_changelog(self, work: Work) -> None:
        """The changelog records queued, acknowledged, then in the local stores; a failure stops the worker."""
        try:
            await self.changelog.flush()
        except BaseException as exc:
            if work.should_stop:  # stopping under a pending write: the records come again
                raise SkipCommit(f"changelog records not sent while stopping: {exc!r}") from exc
            if not isinstance(exc, Exception):
                raise
            # Records whose state is not in the changelog may be acknowledged already (at the end of a write)
            # or not yet (a send within it): either way no offset may be committed past them, so stop.
            _crash_later(work, exc, self._crashing)
            raise SkipCommit(f"changelog records could not be sent: {exc!r}") from exc

    # A commit's steps (agents.commit.checkpoint).

    async def drain(self, work: Work) -> None:
        """Nothing: a commit counts only what is acknowledged, and records are scored meanwhile."""

    async def commit_offsets(self, consumer: Offsets, offsets: Mapping[TP, int], work: Work) -> bool:
        return await consumer.commit_group_offsets(offsets)

    def after_commit(self, cache: StateCache) -> None:
        """Nothing: the state write trimmed the cache already."""

    # Assignments.

    async def prepare_assignment(self, assigned: set[TP]) -> None:
        """Nothing to wait for: a new owner reads what the group committed."""

    async def revoked(self) -> None:
        """Nothing: what was delivered is committed; the rest comes again at its next owner."""

    def assigned(self, app: Any) -> None:
        """Nothing: Faust's restores end on their own."""

    async def before_shutdown(self) -> None:
        """Nothing runs beside the consumer."""


class ExactlyOnce:
    """Outputs, state and offsets in one Kafka transaction per input partition per commit (read_committed)."""

    name = "exactly_once"
    cuts = True  # every commit is a cut that holds intake
    commits_on_acks = False  # by the interval only: outputs are visible when a commit is done, not sooner
    read_committed = True
    paused_s = 0.0  # a commit's state write is a cut: it never pauses

    def __init__(self, *, bootstrap: str | Connection, group_id: str, input_topic: str,
                 current_epoch: Callable[[], int]) -> None:
        self.transactions = PartitionTransactions(bootstrap=bootstrap, group_id=group_id, input_topic=input_topic,
                                                 current_epoch=current_epoch)
        self._input_topic = input_topic
        self._restore_watch: asyncio.Future[None] | None = None
        self._crashing: set[asyncio.Task[None]] = set()

    # Outputs: each partition's transactional producer, opened when its partition is assigned.

    async def start(self) -> Send:
        return self.transactions.send

    async def stopping(self, app: Any) -> None:
        """Nothing: what is not committed is aborted by the partitions' next owner."""

    async def close(self) -> None:
        """Nothing: the transactional producers close when their partitions are revoked."""

    # State.

    @property
    def table_write(self) -> TableWrite:
        """How the state cache's writes reach the tables: staged for the partition's next transaction."""
        return self.transactions.stage

    async def write_behind(self, work: Work, app: Any) -> None:
        """Nothing: state goes into the transactions, at commits."""

    async def write_state(self, cache: StateCache, work: Work, *, paced: bool = False) -> int:
        started = time.perf_counter()
        writes = cache.flush(trim=False)  # staged: RocksDB gets them after the commit
        _observe(work, cache, writes, time.perf_counter() - started)
        return writes

    # A commit's steps (agents.commit.checkpoint).

    async def drain(self, work: Work) -> None:
        await work.deliver_in_flight()
        await work.delivered()

    async def commit_offsets(self, consumer: Offsets, offsets: Mapping[TP, int], work: Work) -> bool:
        try:
            committed = await self.transactions.commit(offsets)
        except Exception as exc:
            logger.exception("transactional commit failed; stopping (open transactions are aborted by the "
                             "partitions' next owner, and their records processed again)")
            _crash_later(work, exc, self._crashing)  # this commit holds intake until it returns
            return False
        if committed:
            consumer.committed_in_transactions(offsets)
        return committed

    def after_commit(self, cache: StateCache) -> None:
        if not self.transactions.staged:
            cache.trim()  # the staged states are in RocksDB now

    # Assignments.

    async def prepare_assignment(self, assigned: set[TP]) -> None:
        """Wait for the previous owners' transactions before restoring and seeking."""
        await self.transactions.fence({tp.partition for tp in assigned if tp.topic == self._input_topic})

    async def revoked(self) -> None:
        await self.transactions.close()

    def assigned(self, app: Any) -> None:
        """End restores that have read past their changelog's last record (only markers follow)."""
        watch = self._restore_watch
        if (watch is None or watch.done()) and not app.should_stop:
            # Started here, not as a service task: user services start only after the restore it ends.
            self._restore_watch = asyncio.ensure_future(release_restores(app))

    async def before_shutdown(self) -> None:
        # Left running, the restore watch outlives the consumer and fails once the event loop is closed.
        watch = self._restore_watch
        if watch is not None and not watch.done():
            watch.cancel()
            await asyncio.wait([watch])


def guarantee_for(processing_guarantee: str, *, bootstrap: str | Connection, group_id: str, input_topic: str,
                  write_interval_s: float,
                  current_epoch: Callable[[], int]) -> AtLeastOnce | ExactlyOnce:
    """The guarantee ``SEAM_PROCESSING_GUARANTEE`` names (``at_least_once`` or ``exactly_once``)."""
    if processing_guarantee == ExactlyOnce.name:
        return ExactlyOnce(bootstrap=bootstrap, group_id=group_id, input_topic=input_topic,
                           current_epoch=current_epoch)
    return AtLeastOnce(bootstrap=bootstrap, input_topic=input_topic, write_interval_s=write_interval_s)
