"""Per-card feature state and per-partition watermarks, in RocksDB-backed Faust tables.

Both tables follow the input topic's partitioning: a card's state and a partition's watermark live
in the partition the card's transactions arrive on, and each has a changelog topic
(``<app id>-card-state-changelog``, ``<app id>-watermarks-changelog``) from which a worker restores
them when it gains the partition. Reads and writes must run while a source partition is current (a
Faust event, or ``agents.ingest.table_partition``).
"""

from __future__ import annotations

from app.main import app, settings
from tables.features import CardState, upgrade_state

__all__ = ["card_state", "load_state", "load_watermark", "store_state", "store_watermark", "watermarks"]

# Key: card id (UTF-8 bytes, raw in the changelog); value: the compact state dict of tables.features (JSON).
card_state = app.Table(
    "card-state",
    partitions=settings.topic_partitions,
    key_type=bytes,
    help="Compact per-card event-time state for the feature spec.",
)

# One key per partition: the highest event time seen on it (the watermark is that minus lateness).
watermarks = app.Table(
    "watermarks",
    partitions=settings.topic_partitions,
    key_type=bytes,
    help="Highest event time seen per input partition.",
)
WATERMARK_KEY = b"max_ts"


def load_state(card_id: str) -> CardState | None:
    """Read one card's state (upgraded if an earlier seam wrote it)."""
    state: CardState | None = card_state.get(card_id.encode())
    return None if state is None else upgrade_state(state)


def store_state(card_id: str, state: CardState) -> None:
    """Write one card's state."""
    card_state[card_id.encode()] = state


def load_watermark() -> int | None:
    """Read the current partition's highest event time."""
    max_ts: int | None = watermarks.get(WATERMARK_KEY)
    return max_ts


def store_watermark(max_ts: int) -> None:
    """Write the current partition's highest event time."""
    watermarks[WATERMARK_KEY] = max_ts
