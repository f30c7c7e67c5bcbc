"""Unit tests for tables.state: every RocksDB database a worker opens shares one memory budget (real rocksdict,
no broker)."""

from __future__ import annotations

import time
from pathlib import Path

import faust

from tables.faust_compat import rocksdb_partition
from tables.state import MIB, StateTables


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
