"""Unit tests for tables.state: every RocksDB database a worker opens shares one memory budget (real rocksdict,
no broker)."""

from __future__ import annotations

import random
import time
from pathlib import Path

import faust
import pytest

from agents.ingest.consumer import table_partition
from tables import features
from tables.cache import StateCache
from tables.faust_compat import rocksdb_partition
from tables.features import DEFAULT_SPEC, KeyState, apply_event, new_state
from tables.key_store import Packed, Stored, changes, stored_key
from tables.state import MIB, StateTables
from tables.tiles import Events


def tables(tmp_path: Path, db_memory_mb: int) -> StateTables:
    app = faust.App(f"state-tables-{id(object())}", broker="kafka://127.0.0.1:1", store="rocksdb://",
                    datadir=str(tmp_path), autodiscover=False)
    return StateTables(app, partitions=4, db_memory_mb=db_memory_mb)


def test_every_partition_of_both_tables_is_opened_within_one_budget(tmp_path: Path) -> None:
    state = tables(tmp_path, db_memory_mb=8)
    store = state.state_table.data
    value = bytes(range(256)) * 16  # 4 KB
    for partition in range(4):
        db = rocksdb_partition(store, partition)
        for i in range(400):
            db.put(b"%d-%05d" % (partition, i), value)
    memory = state.db_memory()
    # 6.4 MB written: the memtables of all four hold what is not flushed yet, charged to the one cache.
    assert 0 < memory["memtables"] < len(value) * 1_600
    assert memory["cache"] >= memory["memtables"]
    for partition in range(4):
        rocksdb_partition(store, partition).flush()
    # Flushed memtables are released in the background: wait for it, not for a fixed time.
    deadline = time.monotonic() + 30
    while (flushed := state.db_memory())["memtables"] >= 64 * 1024:
        assert time.monotonic() < deadline, flushed
        time.sleep(0.01)
    # Reading back fills the same cache, whichever partition is read, and never past the budget.
    for partition in range(4):
        db = rocksdb_partition(store, partition)
        assert db.get([b"%d-%05d" % (partition, i) for i in range(400)]) == [value] * 400
    read = state.db_memory()
    assert read["cache"] > flushed["cache"]
    assert read["cache"] <= state.db_memory_limit == 8 * MIB
    # The files' index and filter blocks are held beside the cache, and reported.
    assert read["table_readers"] > 0
    # The watermarks' databases are within the same budget.
    rocksdb_partition(state.watermarks.data, 0).put(b"max_ts", value * 64)
    assert state.db_memory()["memtables"] >= len(value) * 64


def test_a_hot_key_tiles_over_its_chunks_in_rocksdb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker's read path: a hot key's state cache writes it into the real RocksDB table, and the key reads
    its tiles back from there (``StateTables.read_events`` under the partition's scope), scoring every event as
    the untiled state does."""
    monkeypatch.setattr(features, "SPILL_EVENTS", 64)
    monkeypatch.setattr(features, "INDEX_AFTER", 0)
    state = tables(tmp_path, db_memory_mb=8)
    db = rocksdb_partition(state.state_table.data, 1)
    reads = []

    def store_state(key: str, key_state: KeyState, stored: Stored, touched: set[int]) -> int:
        writes = changes(stored_key(key), key_state, stored, touched)
        for raw, value in writes:  # as the guarantee's writes reach the table once acknowledged
            if value is None:
                db.delete(raw)
            else:
                db.put(raw, value)
        return len(writes)

    def read_events(key: str, stored: Packed, lo: int, hi: int) -> Events:
        reads.append((lo, hi))
        return state.read_events(key, stored, lo, hi)

    cache = StateCache(load_state=state.load_state, store_state=store_state, load_watermark=lambda: None,
                       store_watermark=lambda _ts: None, scope=lambda p: table_partition("input", p),
                       allowed_lateness_ms=DEFAULT_SPEC.allowed_lateness_ms, read_events=read_events)
    plain = new_state()
    rng = random.Random(3)
    for i in range(2 * 100 * 60):  # two events a second for 100 minutes of event time
        ts = 1_764_500_000_000 + i * 500 - rng.randrange(0, 2_000)
        values = (float(rng.randrange(1, 50_000)) / 100, f"m{rng.randrange(20)}")
        with table_partition("input", 1):
            key_state = cache.state(1, "hot")
            got = apply_event(key_state, f"e{i}", ts, values, allowed_lateness_ms=60_000)
        cache.touch(1, "hot", ts)
        want = apply_event(plain, f"e{i}", ts, values, allowed_lateness_ms=60_000)
        assert got == want, i
        if i % 40 == 39:  # a write behind every 20 s of event time
            cache.flush()
    key_state = cache.state(1, "hot")
    assert key_state.tiles is not None and len(key_state.tiles) > len(key_state["ts"])
    assert reads  # the hour's edge read its tiles back from RocksDB
