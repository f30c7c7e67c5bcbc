"""The commit protocol: every step of a commit, for both guarantees, in order, in one method.

:meth:`Checkpoint.commit` is the whole of it; read it top to bottom. Four things start a commit, and
each calls it with its reason: Faust's commit timer (``SEAM_COMMIT_INTERVAL_S``) and Faust's own stop
(``"faust"``, or ``"stop"`` once the worker stops), acknowledgements piling up under at least once
(``"acks"``, in the background), and a revocation (``"revocation"``, before the partitions go). What
differs between the guarantees is one object chosen when the app is built
(:mod:`agents.commit.guarantee`); the consumer (:class:`agents.ingest.consumer.BatchConsumer`) only
hands Faust's calls on to here and answers which offsets may be committed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Literal, Protocol

from faust.types import TP

from agents.observe.metrics import BoundaryMetrics
from tables.cache import StateCache
from tables.faust_compat import drain_producer_buffer

__all__ = ["Checkpoint", "Guarantee", "Offsets", "Reason", "SkipCommit", "Work"]

logger = logging.getLogger(__name__)

Reason = Literal["faust", "acks", "revocation", "stop"]
REVOKE_FLUSH_TIMEOUT_S = 10.0  # what is in flight when partitions are revoked gets this long to be delivered
STOP_COMMIT_TIMEOUT_S = 5.0  # a commit while the worker stops gets this long, then is skipped


class SkipCommit(Exception):  # noqa: N818 - a control-flow signal, not an error
    """Raised by a commit's step when committing now would be unsafe; the commit is skipped."""


class Work(Protocol):
    """What a commit reads of the work in flight (seam's: :class:`app.scoring.ScoringService`)."""

    metrics: BoundaryMetrics

    @property
    def cache(self) -> StateCache | None:
        """The state whose changes a commit writes; None before the worker is ready."""

    @property
    def should_stop(self) -> bool: ...

    async def deliver_in_flight(self) -> None:
        """Hand everything taken so far to the outputs (the model boundary scores what it holds)."""

    async def delivered(self) -> None:
        """Return once every output sent so far is acknowledged."""

    async def crash(self, reason: BaseException) -> None: ...


class Offsets(Protocol):
    """What a commit asks of the consumer (:class:`agents.ingest.consumer.BatchConsumer`)."""

    @property
    def stopping(self) -> bool: ...

    def committable_offsets(self) -> dict[TP, int]:
        """Each partition's offset up to which every record is done (:mod:`agents.ingest.acks`)."""

    async def commit_group_offsets(self, offsets: Mapping[TP, int]) -> bool:
        """Commit ``offsets`` as the consumer group's (Faust's offset commit)."""

    def committed_in_transactions(self, offsets: Mapping[TP, int]) -> None:
        """Record ``offsets`` as committed by transactions."""


class Guarantee(Protocol):
    """What one processing guarantee does in a commit's steps (:mod:`agents.commit.guarantee`)."""

    cuts: bool  # a commit holds intake: no record is handled while it runs
    commits_on_acks: bool  # acknowledgements piling up start a commit
    read_committed: bool  # the consumer reads only committed records
    paused_s: float  # how long the last state write waited for scoring between its steps (see write_state)

    async def prepare_assignment(self, assigned: set[TP]) -> None: ...

    async def drain(self, work: Work) -> None: ...

    async def write_state(self, cache: StateCache, work: Work, *, paced: bool = False) -> int:
        """Write the cache's changes; ``paced``: records are scored meanwhile, so leave them most of the loop."""

    async def commit_offsets(self, consumer: Offsets, offsets: Mapping[TP, int], work: Work) -> bool: ...

    def after_commit(self, cache: StateCache) -> None: ...


class Checkpoint:
    """One worker's commits: :meth:`commit`, and the intake lock the consumer hands batches over under."""

    def __init__(self, app: Any, guarantee: Guarantee, work: Work) -> None:
        self._app = app  # its consumer answers the offsets (created by Faust when the worker starts)
        self.guarantee = guarantee
        self._work = work
        self._one_at_a_time = asyncio.Lock()
        # Held by the consumer around every batch it hands over; a commit that cuts holds it throughout.
        self.intake = asyncio.Lock()

    @property
    def commits_on_acks(self) -> bool:
        return self.guarantee.commits_on_acks

    @property
    def read_committed(self) -> bool:
        return self.guarantee.read_committed

    async def prepare_assignment(self, assigned: set[TP]) -> None:
        """Before a new assignment is restored and sought (exactly once: fenced)."""
        await self.guarantee.prepare_assignment(assigned)

    async def commit(self, reason: Reason, *, then: Callable[[], None] | None = None) -> bool:
        """Commit what is done; return whether offsets were committed.

        ``then`` (a revocation: forget the revoked partitions) runs last, before intake opens again,
        whether or not the commit went through. A step that raises :class:`SkipCommit` ends the commit
        there: nothing after it happens, and the records it covered are delivered again.
        """
        consumer: Offsets = self._app.consumer
        work, guarantee = self._work, self.guarantee
        revoking = reason == "revocation"
        # 10. Bounded while stopping: the producer or the consumer thread may be gone, and not
        #     committing is safe (the records are delivered again). Set below, once it applies.
        bound = asyncio.timeout(None)
        started = 0.0
        try:
            async with bound:
                if consumer.stopping and not revoking:
                    bound.reschedule(asyncio.get_running_loop().time() + STOP_COMMIT_TIMEOUT_S)
                # 1. One at a time: a step may yield mid-write, and no other commit runs meanwhile.
                async with self._one_at_a_time:
                    started = time.perf_counter()
                    # 2. Intake held: exactly once (a commit is a cut) and before a revocation (a batch
                    #    handed over now would be acknowledged too late, or by an owner no longer).
                    async with self.intake if guarantee.cuts or revoking else contextlib.nullcontext():
                        try:
                            cache = work.cache
                            if revoking:
                                # 3a. Revocation: what is in flight is delivered, within its own bound.
                                await self._deliver_in_flight()
                                if consumer.stopping:
                                    bound.reschedule(asyncio.get_running_loop().time() + STOP_COMMIT_TIMEOUT_S)
                            if cache is not None:
                                # 3. Drain: exactly once, the boundary scores and hands over what it
                                #    holds, and every output sent so far is delivered, so every record
                                #    taken is acknowledged; at least once, nothing (offsets count only
                                #    what is acknowledged).
                                await guarantee.drain(work)
                                # 4. State: at least once, what the write behind has not written yet, as
                                #    changelog records, all acknowledged, then into the local stores
                                #    (the keys stay cached until then); exactly once, staged in each
                                #    partition's transaction.
                                writes = await guarantee.write_state(
                                    cache, work, paced=not (revoking or consumer.stopping))
                                paused_s = guarantee.paused_s  # read before any other write can run
                                # 5. Faust's own producer buffer, drained completely (its flush gives
                                #    up after 0.1 s without progress).
                                await drain_producer_buffer(self._app, _buffer_stopped)
                                # Slow is what the commit itself took, not the time it left to scoring.
                                elapsed_ms = (time.perf_counter() - started - paused_s) * 1000
                                (logger.warning if elapsed_ms > 250 else logger.debug)(
                                    "commit (%s): %d table writes in %.1f ms (and %.1f ms paused for scoring)",
                                    reason, writes, elapsed_ms, paused_s * 1000)
                            # 6. Offsets: each partition's first offset not done, that is neither
                            #    acknowledged (every output of the record delivered, its state written
                            #    in step 4 or before) nor skipped by the broker.
                            offsets = consumer.committable_offsets()
                            # 7. Commit: at least once, the group's offsets; exactly once, each
                            #    partition's transaction with its offset, then its staged state into
                            #    the local stores.
                            committed = await guarantee.commit_offsets(consumer, offsets, work)
                            # 8. Trim: the state cache may drop clean states again (exactly once; at
                            #    least once trimmed in step 4).
                            if committed and cache is not None:
                                guarantee.after_commit(cache)
                        except SkipCommit as skipped:
                            logger.info("commit (%s) skipped: %s", reason, skipped)
                            committed = False
                        finally:
                            # 9. Then: a revocation forgets what was done in the revoked partitions.
                            if then is not None:
                                then()
        except TimeoutError:
            if not bound.expired():
                raise
            logger.warning("commit while stopping took over %.0fs; skipped (those records are delivered again)",
                           STOP_COMMIT_TIMEOUT_S)
            return False
        if committed:
            work.metrics.commit.observe(time.perf_counter() - started)
        return committed

    async def _deliver_in_flight(self) -> None:
        try:
            await asyncio.wait_for(self._work.deliver_in_flight(), REVOKE_FLUSH_TIMEOUT_S)
        except TimeoutError:
            logger.warning("in-flight batches not delivered within %.0fs of revocation; they will be delivered "
                           "again", REVOKE_FLUSH_TIMEOUT_S)


def _buffer_stopped(size: int) -> None:
    # Faust's producer stopped with records in its buffer: they cannot go out, so neither may offsets.
    raise SkipCommit(f"{size} changelog records could not be sent")
