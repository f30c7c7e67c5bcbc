"""The commit protocol: every step of a commit, for both guarantees, in order, in one place.

:class:`agents.ingest.BatchConsumer` decides *when* to commit (every ``SEAM_COMMIT_INTERVAL_S``, when
acknowledgements pile up, before partitions are revoked, when stopping), runs one commit at a time,
and under exactly once holds intake for the whole commit. :class:`Checkpoint` is *what* a commit does.

At least once (``before_offsets``, then Faust's offset commit)::

    1. write state   the state cache's changes, in steps of at most 2 ms of work (records are scored
                     between them); the keys written stay cached
    2. changelog     the changelog records, in batches per partition on their own producer, all
                     acknowledged, then the writes into the local RocksDB stores and the cache may
                     trim; a failure stops the worker and no later commit happens
    3. Faust buffer  anything in Faust's own producer buffer, drained completely
    4. offsets       (Faust) the contiguous acknowledged offsets: every output of each record is
                     acknowledged (``acks=all``) and step 1 wrote the epoch its state change was in

Between commits, :meth:`Checkpoint.write_behind` runs steps 1-2 every ``SEAM_STATE_WRITE_INTERVAL_S``,
so a commit finds little left to write.

Exactly once (``before_offsets``, then ``commit_transactions``; intake is held throughout)::

    1. drain         the model boundary scores and hands over what it holds
    2. outputs       every output sent so far is delivered, so every record taken is acknowledged
    3. write state   the state cache's changes are staged in their partitions' transactions
    4. offsets       each partition's transaction gets its committable offset and commits
    5. local stores  the staged writes reach RocksDB with their changelog offsets, after the commit
    6. trim          the state cache may drop clean states again (they are in RocksDB now)
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any, Protocol

from faust.types import TP

from agents.ingest import SkipCommit
from agents.metrics import BoundaryMetrics
from agents.models import ModelSet
from agents.pipeline import Pipeline
from agents.transactions import TransactionalOutputs
from app.faust_compat import drain_producer_buffer
from tables.cache import StateCache
from tables.changelog import ChangelogWriter

__all__ = ["Checkpoint", "Scoring"]

logger = logging.getLogger(__name__)

STEP_S = 0.002  # the most state-writing work in one event-loop turn


class Scoring(Protocol):
    """What a checkpoint reads of the scoring service (it creates them when the worker starts)."""

    pipeline: Pipeline | None
    models: ModelSet | None
    metrics: BoundaryMetrics

    @property
    def should_stop(self) -> bool: ...

    async def crash(self, reason: BaseException) -> None: ...


class Checkpoint:
    """One worker's commits: at least once through a changelog writer, or exactly once in transactions."""

    def __init__(self, scoring: Scoring, app: Any, *, changelog: ChangelogWriter | None = None,
                 transactions: TransactionalOutputs | None = None, write_interval_s: float = 0.25) -> None:
        if (changelog is None) == (transactions is None):
            raise ValueError("a checkpoint writes state through a changelog writer or through transactions")
        self._scoring = scoring
        self._app = app
        self._changelog = changelog
        self._transactions = transactions
        self._write_interval_s = write_interval_s
        self._writing = asyncio.Lock()  # one state write at a time: behind, or in a commit
        self._crashing: set[asyncio.Task[None]] = set()

    async def before_offsets(self) -> None:
        """Everything a commit does before its offsets (raises SkipCommit when they must not go)."""
        pipeline = self._scoring.pipeline
        if pipeline is None:
            return
        started = time.perf_counter()
        if self._transactions is not None:
            models = self._scoring.models
            if models is not None:
                await models.flush()  # 1. drain
            await pipeline.delivered()  # 2. outputs
            writes = pipeline.cache.flush(trim=False)  # 3. staged: RocksDB gets them after the commit
            self._observe(pipeline.cache, writes, time.perf_counter() - started)
        else:
            async with self._writing:  # 1-2. what the writer behind has not written yet
                writes = await self._write_state(pipeline.cache)
        await self._drain_faust_buffer()  # 3. (at least once)
        elapsed_ms = (time.perf_counter() - started) * 1000
        log = logger.warning if elapsed_ms > 250 else logger.debug
        log("state flush: %d table writes in %.1f ms", writes, elapsed_ms)

    async def commit_transactions(self, offsets: Mapping[TP, int]) -> bool:
        """Exactly once, steps 4-6: commit each partition's transaction with its offset, then trim."""
        assert self._transactions is not None
        committed = await self._transactions.commit(offsets)  # 4. offsets, 5. local stores
        pipeline = self._scoring.pipeline
        if pipeline is not None and not self._transactions.staged:
            pipeline.cache.trim()  # 6.
        return committed

    async def write_behind(self) -> None:
        """At least once: every write interval, write what changed (steps 1-2), until the worker stops."""
        if self._changelog is None:
            return
        while not self._scoring.should_stop:
            await asyncio.sleep(self._write_interval_s)
            pipeline = self._scoring.pipeline
            if pipeline is None or self._app.rebalancing or pipeline.cache.dirty_keys() == 0:
                continue
            async with self._writing:
                try:
                    await self._write_state(pipeline.cache)
                except SkipCommit:
                    return  # the worker is stopping (see _write_state)

    async def _write_state(self, cache: StateCache) -> int:
        changelog = self._changelog
        assert changelog is not None
        writes = 0
        started = step_started = time.perf_counter()
        # 1. write state: the keys written stay cached (no trim) until step 2 has stored them.
        for written in cache.flushing(trim=False):
            writes = written
            if time.perf_counter() - step_started > STEP_S:
                await asyncio.sleep(0)  # let records be scored: a state write never stalls predictions
                step_started = time.perf_counter()
        try:
            await changelog.flush()  # 2. changelog, then the local stores
        except BaseException as exc:
            if self._scoring.should_stop:  # stopping under a pending write: the records come again
                raise SkipCommit(f"changelog records not sent while stopping: {exc!r}") from exc
            if not isinstance(exc, Exception):
                raise
            # The acknowledgements are released but their state is not in the changelog: stop. The
            # crash is not awaited here: stopping commits too, and this may run inside a commit.
            task = asyncio.ensure_future(self._scoring.crash(exc))
            self._crashing.add(task)
            task.add_done_callback(self._crashing.discard)
            raise SkipCommit(f"changelog records could not be sent: {exc!r}") from exc
        cache.trim()  # the written states are in RocksDB now: clean ones may be dropped
        self._observe(cache, writes, time.perf_counter() - started)
        return writes

    async def _drain_faust_buffer(self) -> None:
        # Faust's own table writes (none on seam's path, but the buffer is Faust's) go through its
        # producer buffer, whose flush gives up after 0.1 s without progress: drain it completely.
        def stopping(size: int) -> None:  # the records cannot go out, so neither may offsets
            raise SkipCommit(f"{size} changelog records could not be sent")

        await drain_producer_buffer(self._app, stopping)

    def _observe(self, cache: StateCache, writes: int, seconds: float) -> None:
        metrics = self._scoring.metrics
        metrics.state_flush.observe(seconds)
        metrics.state_writes.inc(writes)
        metrics.cached_keys.set(cache.cached_keys())
        metrics.cached_events.set(cache.last_events_held)
        metrics.cached_bytes.set(cache.last_bytes_held)
