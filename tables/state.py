"""Per-card feature state, in a RocksDB-backed Faust table with a changelog topic for recovery."""

from __future__ import annotations

from app.main import app, settings
from tables.features import CardState

__all__ = ["card_state", "load_state", "store_state"]

# Key: card id (UTF-8 bytes); value: the compact state dict of tables.features (JSON, Faust's table
# value serializer). Its partitions follow the input topic's: a card's state lives in the partition
# its transactions arrive on.
card_state = app.Table(
    "card-state",
    partitions=settings.topic_partitions,
    help="Compact per-card event-time state for the feature spec.",
)


def load_state(card_id: str) -> CardState | None:
    """Read one card's state from the table (this worker's partitions)."""
    state: CardState | None = card_state.get(card_id.encode())
    return state


def store_state(card_id: str, state: CardState) -> None:
    """Write one card's state; must run while a source event is current (it sets the partition)."""
    card_state[card_id.encode()] = state
