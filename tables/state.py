"""Per-key feature state and per-partition watermarks, in RocksDB-backed Faust tables.

Both tables follow the input topic's partitioning: a key's state and a partition's watermark live
in the partition the key's transactions arrive on, and each has a changelog topic
(``<app id>-card-state-changelog``, ``<app id>-watermarks-changelog``) from which a worker restores
them when it gains the partition. Reads and writes must run while a source partition is current (a
Faust event, or ``agents.ingest.table_partition``).
"""

from __future__ import annotations

from typing import Any

import faust
import rocksdict

from tables.faust_compat import raw_get, raw_get_many, rocksdb_partitions, share_rocksdb_memory
from tables.features import KeyState
from tables.key_store import Packed, Stored, changes, decode, decode_many, events_between, stored_key
from tables.tiles import Events

__all__ = ["LAYOUT_KEY", "WATERMARK_KEY", "StateTables"]

MIB = 1024 * 1024
# One key per partition of the watermarks table: the highest event time seen on it.
WATERMARK_KEY = b"max_ts"
# And the layout its key states hold (tables.spec.FeatureSpec.layout): what spec they can serve.
LAYOUT_KEY = b"layout"


class StateTables:
    """The ``card-state`` and ``watermarks`` tables of one app, and how a key's state is read and written."""

    def __init__(self, app: faust.App, *, partitions: int, db_memory_mb: int) -> None:
        # Faust's RocksDB defaults give every partition's database a 2 GiB block cache and three 64 MiB
        # memtables, so a worker's memory would grow with the state it read back, and with the partitions it
        # holds. Every database of both tables (each partition a worker opens, active or standby) shares one
        # budget, SEAM_STATE_DB_MEMORY_MB: one block cache of that size, charged for the memtables too, which
        # one write buffer manager keeps under half of it. A database flushes its memtable at an eighth of the
        # budget, or earlier when the memtables of all of them reach that half. Index and filter blocks stay
        # with each open file (``table_readers`` below, 0.1-1.5 MB in the soaks): held in a cache this size,
        # they evicted each other and every read of an evicted one stalled the loop (p99 1.3-1.9 s).
        budget = db_memory_mb * MIB
        self.db_memory_limit = budget
        self.db_cache = rocksdict.Cache(budget)
        self.db_write_buffers = rocksdict.WriteBufferManager.new_write_buffer_manager_with_cache(
            budget // 2, False, self.db_cache)
        state_db = {"write_buffer_size": budget // 8, "max_write_buffer_number": 2}
        # Keys: a key id (UTF-8) for the key's header, and key id + NUL + chunk for each sealed
        # chunk of its events; values: JSON (see tables.key_store), raw bytes in store and changelog.
        self.state_table: Any = app.Table(
            "card-state",  # named by earlier seams: its changelog holds every deployed worker's state
            partitions=partitions,
            key_type=bytes,
            value_type=bytes,
            options=state_db,
            help="Per-key event-time state for the feature spec: a header with the newest events, and chunks.",
        )
        self.watermarks: Any = app.Table(
            "watermarks",
            partitions=partitions,
            key_type=bytes,
            options={"write_buffer_size": MIB, "max_write_buffer_number": 2},
            help="Highest event time seen per input partition.",
        )
        for table in (self.state_table, self.watermarks):
            share_rocksdb_memory(table.data, self.db_cache, self.db_write_buffers)

    def db_memory(self) -> dict[str, int]:
        """The bytes RocksDB holds in memory now, all partitions of both tables together, by kind: ``cache``
        (blocks read back and the memtables' charge: at most ``db_memory_limit``), ``memtables`` (also counted
        in ``cache``), ``table_readers`` (the index and filter blocks open files hold outside the cache)."""
        readers = sum(db.property_int_value("rocksdb.estimate-table-readers-mem") or 0
                      for table in (self.state_table, self.watermarks)
                      for db in rocksdb_partitions(table.data).values())
        return {"cache": self.db_cache.get_usage(), "memtables": self.db_write_buffers.get_usage(),
                "table_readers": readers}

    def load_state(self, key: str) -> tuple[KeyState, Stored] | None:
        """Read one key's state and what the table holds of it (None if the key is unknown)."""
        raw = stored_key(key)
        table = self.state_table
        header = raw_get(table, raw)
        return None if header is None else decode(header, lambda k: raw_get(table, k), raw)

    def load_states(self, keys: list[str]) -> list[tuple[KeyState, Stored] | None]:
        """:meth:`load_state` for several keys of the current partition, in two batched reads."""
        table = self.state_table
        return decode_many([stored_key(key) for key in keys], lambda raw: raw_get_many(table, raw))

    def read_events(self, key: str, stored: Packed, lo: int, hi: int) -> Events:
        """A key's events with ``lo <= ts < hi`` from its sealed chunks in the current partition (a tiled key's)."""
        table = self.state_table
        return events_between(stored_key(key), stored, lo, hi, lambda raw: raw_get_many(table, raw))

    def store_state(self, key: str, state: KeyState, stored: Stored, touched: set[int]) -> int:
        """Write what changed in one key's state since ``stored`` (Faust table writes); return the records."""
        writes = changes(stored_key(key), state, stored, touched)
        for raw, value in writes:
            if value is None:
                self.state_table.pop(raw, None)
            else:
                self.state_table[raw] = value
        return len(writes)

    def load_watermark(self) -> int | None:
        """Read the current partition's highest event time."""
        max_ts: int | None = self.watermarks.get(WATERMARK_KEY)
        return max_ts

    def store_watermark(self, max_ts: int) -> None:
        """Write the current partition's highest event time."""
        self.watermarks[WATERMARK_KEY] = max_ts

    def load_layout(self) -> str | None:
        """Read the layout the current partition's states were written in (None before any was recorded)."""
        layout: str | None = self.watermarks.get(LAYOUT_KEY)
        return layout

    def store_layout(self, layout: str) -> None:
        """Record the layout the current partition's states are written in."""
        self.watermarks[LAYOUT_KEY] = layout
