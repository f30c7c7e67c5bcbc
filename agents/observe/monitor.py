"""What a worker's owners watch first, computed when ``/metrics`` is read: lag, state size, restores.

Nothing here runs on the hot path. :class:`WorkerCollector` asks a snapshot function (the scoring
service builds it from the consumer, the pipeline and the tables) for the numbers as they are now,
each time the page is read, and turns them into gauges:

* **Consumer lag** per input partition, in records: the end offset (the high watermark of the last
  fetch response) less the group's committed offset, as ``kafka-consumer-groups --describe`` shows it
  (``seam_consumer_lag_records``), and less the next offset this worker has yet to handle
  (``seam_consumer_unhandled_records``: what is still on the broker or in the fetch queue).
* **Consumer lag in seconds**: 0 when nothing is unhandled, else how long ago the last record
  handled from the partition reached the broker. The next record reached it no earlier, so this is
  an upper bound on the oldest unhandled record's age, and a close one while the worker is behind.
* **State** per input partition: the card-state table's RocksDB key estimate and its bytes (SST
  files and memtables), and while a restore runs, the changelog records it still has to read; and
  RocksDB's memory, all partitions together, against its budget.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

__all__ = ["InputPartition", "Lag", "Readiness", "Restore", "Snapshot", "StatePartition", "WorkerCollector", "lag",
           "readiness"]


@dataclass(frozen=True, slots=True)
class Readiness:
    """Whether a worker serves (``GET /ready/``), and what it waits for when it does not.

    ``waiting_for`` names what is missing: ``group`` (no assignment received yet), ``model`` (models not
    loaded and warmed, or a boundary not dispatching), ``rebalance`` (the group is rebalancing),
    ``restore`` (a partition's state is still being restored). A ready worker with no input partitions is
    a spare: it holds nothing, so a rolling restart may proceed through it.
    """

    input_partitions: tuple[int, ...]
    waiting_for: tuple[str, ...]

    @property
    def ready(self) -> bool:
        return not self.waiting_for

    @property
    def spare(self) -> bool:
        return self.ready and not self.input_partitions

    def as_dict(self) -> dict[str, object]:
        return {"ready": self.ready, "input_partitions": list(self.input_partitions), "spare": self.spare,
                "waiting_for": list(self.waiting_for)}


def readiness(*, joined: bool, models_running: bool, rebalancing: bool, restoring: bool,
              input_partitions: Sequence[int]) -> Readiness:
    """A worker's readiness from what it knows now."""
    missing = {"group": not joined, "model": not models_running, "rebalance": rebalancing, "restore": restoring}
    return Readiness(tuple(sorted(input_partitions)), tuple(name for name, absent in missing.items() if absent))


@dataclass(frozen=True, slots=True)
class InputPartition:
    """One owned input partition's offsets (``None``: not known yet)."""

    partition: int
    end_offset: int | None  # the offset the next record appended will get
    committed: int | None  # the group's committed offset: the next record to read after a restart
    handled: int | None  # the offset after the last record this worker handed to the pipeline
    handled_timestamp_ms: int | None  # that record's broker timestamp


@dataclass(frozen=True, slots=True)
class StatePartition:
    """One partition's card-state table on disk."""

    partition: int
    keys: int
    bytes: int


@dataclass(frozen=True, slots=True)
class Restore:
    """A changelog partition being restored and how many records it still has to read."""

    topic: str
    partition: int
    remaining: int


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The worker as it is now."""

    input_topic: str
    inputs: Sequence[InputPartition]
    state: Sequence[StatePartition] = ()
    restores: Sequence[Restore] = ()
    rebalancing: bool = False
    cache_hits: int = 0  # key lookups the state cache answered, since the worker started
    cache_misses: int = 0  # key lookups that read the table
    db_memory: Mapping[str, int] = field(default_factory=dict)  # RocksDB's memory in bytes, by kind
    db_memory_limit: int = 0  # and its budget (SEAM_STATE_DB_MEMORY_MB)
    fetch_wait_ms: int | None = None  # how long the broker may hold the next fetch (agents.ingest.pacing)


@dataclass(frozen=True, slots=True)
class Lag:
    """One partition's lag; ``None`` where it cannot be known yet."""

    records: int | None
    unhandled: int | None
    seconds: float | None


def lag(partition: InputPartition, now_ms: float) -> Lag:
    """The lag of ``partition`` at ``now_ms`` (see the module docstring)."""
    end, committed, handled = partition.end_offset, partition.committed, partition.handled
    records = None if end is None or committed is None else max(0, end - committed)
    position = handled if handled is not None else committed
    unhandled = None if end is None or position is None else max(0, end - position)
    seconds: float | None = None
    if unhandled == 0:
        seconds = 0.0
    elif unhandled is not None and partition.handled_timestamp_ms is not None:
        seconds = max(0.0, now_ms - partition.handled_timestamp_ms) / 1000
    return Lag(records, unhandled, seconds)


class WorkerCollector(Collector):
    """Gauges computed from a fresh :class:`Snapshot` at every scrape (none before the worker runs)."""

    def __init__(self, snapshot: Callable[[], Snapshot | None], *, clock: Callable[[], float] = time.time,
                 registry: CollectorRegistry | None = None) -> None:
        self._snapshot = snapshot
        self._clock = clock
        if registry is not None:
            registry.register(self)

    def describe(self) -> list[GaugeMetricFamily]:
        return []  # the families are only known by collecting; registering must not take a snapshot

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        snapshot = self._snapshot()
        if snapshot is None:
            return
        labels = ["topic", "partition"]
        owned = GaugeMetricFamily("seam_assigned_partitions", "Input partitions this worker owns (1 each).",
                                  labels=labels)
        records = GaugeMetricFamily("seam_consumer_lag_records", "End offset less the group's committed offset, "
                                    "per input partition.", labels=labels)
        unhandled = GaugeMetricFamily("seam_consumer_unhandled_records", "End offset less the next offset this "
                                      "worker has yet to handle, per input partition.", labels=labels)
        seconds = GaugeMetricFamily("seam_consumer_lag_seconds", "0 when caught up, else the age of the last "
                                    "record handled (an upper bound on the oldest unhandled record's age).",
                                    labels=labels)
        now_ms = self._clock() * 1000
        for partition in snapshot.inputs:
            values = [snapshot.input_topic, str(partition.partition)]
            owned.add_metric(values, 1)
            measured = lag(partition, now_ms)
            if measured.records is not None:
                records.add_metric(values, measured.records)
            if measured.unhandled is not None:
                unhandled.add_metric(values, measured.unhandled)
            if measured.seconds is not None:
                seconds.add_metric(values, measured.seconds)
        yield from (owned, records, unhandled, seconds)
        keys = GaugeMetricFamily("seam_state_keys", "Keys in the card-state table (RocksDB's estimate: key "
                                 "headers and sealed chunks), per partition.", labels=["partition"])
        size = GaugeMetricFamily("seam_state_bytes", "Bytes of the card-state table (SST files and memtables), "
                                 "per partition.", labels=["partition"])
        for state in snapshot.state:
            keys.add_metric([str(state.partition)], state.keys)
            size.add_metric([str(state.partition)], state.bytes)
        yield from (keys, size)
        if snapshot.db_memory_limit:
            memory = GaugeMetricFamily("seam_state_db_memory_bytes", "RocksDB's memory, all table partitions "
                                       "together, by kind: cache (blocks read back and the memtables' charge), "
                                       "memtables (counted in cache too), table_readers (index and filter blocks "
                                       "held by open files outside the cache).", labels=["kind"])
            for kind, held in sorted(snapshot.db_memory.items()):
                memory.add_metric([kind], held)
            yield memory
            yield GaugeMetricFamily("seam_state_db_memory_limit_bytes", "The block cache's capacity "
                                    "(SEAM_STATE_DB_MEMORY_MB), which the memtables are charged to.",
                                    value=snapshot.db_memory_limit)
        restore = GaugeMetricFamily("seam_restore_remaining_records", "Changelog records a running restore still "
                                    "has to read, per changelog partition.", labels=labels)
        for item in snapshot.restores:
            restore.add_metric([item.topic, str(item.partition)], item.remaining)
        yield restore
        yield GaugeMetricFamily("seam_rebalancing", "1 while the consumer group rebalances.",
                                value=1 if snapshot.rebalancing else 0)
        if snapshot.fetch_wait_ms is not None:
            yield GaugeMetricFamily("seam_fetch_wait_seconds", "How long the broker may hold the next fetch for "
                                    "records: SEAM_FETCH_MAX_WAIT_MS, growing to SEAM_FETCH_MAX_WAIT_BUSY_MS as the "
                                    "event loop gets busy.", value=snapshot.fetch_wait_ms / 1000)
        lookups = CounterMetricFamily("seam_state_cache_lookups", "Key states looked up by the pipeline, by "
                                      "result: hit (in memory) or miss (read from the table).", labels=["result"])
        lookups.add_metric(["hit"], snapshot.cache_hits)
        lookups.add_metric(["miss"], snapshot.cache_misses)
        yield lookups
