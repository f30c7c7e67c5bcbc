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

from tables.faust_compat import raw_get, raw_get_many
from tables.features import KeyState
from tables.key_store import Stored, changes, decode, decode_many, stored_key

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
        # memtables, so a worker's memory would grow with the state it has read back, far past the
        # state cache's bound. Each card-state partition gets SEAM_STATE_DB_MEMORY_MB: half block
        # cache, half write buffers (two of a quarter each); the watermarks' databases hold one key each.
        state_db = {
            "block_cache_size": db_memory_mb * MIB // 2,
            "write_buffer_size": db_memory_mb * MIB // 4,
            "max_write_buffer_number": 2,
        }
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
            options={"block_cache_size": MIB, "write_buffer_size": MIB, "max_write_buffer_number": 2},
            help="Highest event time seen per input partition.",
        )

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
