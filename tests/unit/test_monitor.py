"""Unit tests for agents.observe.monitor: lag from offsets and timestamps, and the gauges on the page."""

from __future__ import annotations

import numpy as np
from prometheus_client import CollectorRegistry, generate_latest

from agents.observe.metrics import BoundaryMetrics
from agents.observe.monitor import (
    InputPartition,
    Lag,
    Restore,
    Snapshot,
    StatePartition,
    WorkerCollector,
    lag,
    readiness,
)


def test_lag_counts_from_the_committed_and_the_handled_offsets() -> None:
    behind = InputPartition(0, end_offset=1_000, committed=900, handled=950, handled_timestamp_ms=10_000)
    assert lag(behind, now_ms=12_500) == Lag(records=100, unhandled=50, seconds=2.5)
    caught_up = InputPartition(1, end_offset=1_000, committed=990, handled=1_000, handled_timestamp_ms=10_000)
    assert lag(caught_up, now_ms=99_000) == Lag(records=10, unhandled=0, seconds=0.0)


def test_lag_before_anything_is_known() -> None:
    assert lag(InputPartition(0, None, None, None, None), now_ms=1.0) == Lag(None, None, None)
    # Nothing handled since the assignment: the committed offset is where handling resumes.
    fresh = InputPartition(0, end_offset=500, committed=200, handled=None, handled_timestamp_ms=None)
    assert lag(fresh, now_ms=1.0) == Lag(records=300, unhandled=300, seconds=None)
    # No commit yet (a new group): Kafka's tools show no lag either; what is unhandled still counts.
    new_group = InputPartition(0, end_offset=500, committed=None, handled=100, handled_timestamp_ms=0)
    assert lag(new_group, now_ms=4_000) == Lag(records=None, unhandled=400, seconds=4.0)


def test_a_clock_behind_the_broker_never_gives_a_negative_lag() -> None:
    ahead = InputPartition(0, end_offset=10, committed=0, handled=5, handled_timestamp_ms=2_000)
    assert lag(ahead, now_ms=1_000).seconds == 0.0


def page(snapshot: Snapshot | None, now: float = 20.0) -> list[str]:
    registry = CollectorRegistry()
    WorkerCollector(lambda: snapshot, clock=lambda: now, registry=registry)
    return [line for line in generate_latest(registry).decode().splitlines() if line and not line.startswith("#")]


def test_the_collector_exposes_a_snapshot_taken_at_each_scrape() -> None:
    snapshot = Snapshot(
        "tx", [InputPartition(0, 100, 90, 95, 18_000), InputPartition(2, None, None, None, None)],
        state=[StatePartition(0, keys=12, bytes=4096)], restores=[Restore("seam-card-state-changelog", 2, 7)],
        rebalancing=True, db_memory={"cache": 3_000, "memtables": 1_000, "table_readers": 20}, db_memory_limit=8_192,
        fetch_wait_ms=25)
    lines = page(snapshot)
    assert 'seam_assigned_partitions{partition="0",topic="tx"} 1.0' in lines
    assert 'seam_assigned_partitions{partition="2",topic="tx"} 1.0' in lines
    assert 'seam_consumer_lag_records{partition="0",topic="tx"} 10.0' in lines
    assert 'seam_consumer_unhandled_records{partition="0",topic="tx"} 5.0' in lines
    assert 'seam_consumer_lag_seconds{partition="0",topic="tx"} 2.0' in lines
    assert not any('partition="2"' in line and "lag" in line for line in lines)  # unknown: no sample, not 0
    assert 'seam_state_keys{partition="0"} 12.0' in lines
    assert 'seam_state_bytes{partition="0"} 4096.0' in lines
    assert 'seam_restore_remaining_records{partition="2",topic="seam-card-state-changelog"} 7.0' in lines
    assert "seam_rebalancing 1.0" in lines
    assert 'seam_state_db_memory_bytes{kind="cache"} 3000.0' in lines
    assert 'seam_state_db_memory_bytes{kind="memtables"} 1000.0' in lines
    assert 'seam_state_db_memory_bytes{kind="table_readers"} 20.0' in lines
    assert "seam_state_db_memory_limit_bytes 8192.0" in lines
    assert "seam_fetch_wait_seconds 0.025" in lines
    assert not any(line.startswith("seam_fetch_wait") for line in page(Snapshot("tx", [])))  # not known: no sample


def test_no_snapshot_no_samples() -> None:
    assert page(None) == []


def test_model_metrics_carry_the_model_and_its_version() -> None:
    metrics = BoundaryMetrics()
    model_metrics = metrics.for_model("fraud-mlp", "3", "CPUExecutionProvider", "primary")
    model_metrics.on_batch(4, [0.001] * 4, 0.002, failed_rows=1, deadline_misses=2, target_size=8, arrived_late=1)
    lines = generate_latest(metrics.registry).decode().splitlines()
    model = 'model="fraud-mlp",version="3"'
    info = 'seam_model_info{model="fraud-mlp",provider="CPUExecutionProvider",role="primary",version="3"} 1.0'
    assert info in lines
    assert f'seam_batch_size_count{{{model}}} 1.0' in lines
    assert f'seam_queue_delay_seconds_count{{{model}}} 4.0' in lines
    assert f'seam_inference_seconds_count{{{model}}} 1.0' in lines
    assert f'seam_inference_failed_rows_total{{{model}}} 1.0' in lines
    assert f'seam_adaptive_batch_target{{{model}}} 8.0' in lines
    assert 'seam_deadline_misses_total{model="fraud-mlp",stage="ingest",version="3"} 1.0' in lines
    assert 'seam_deadline_misses_total{model="fraud-mlp",stage="boundary",version="3"} 1.0' in lines


def test_each_model_of_a_deployment_has_its_own_series_and_a_retired_one_leaves_the_info() -> None:
    metrics = BoundaryMetrics()
    primary = metrics.for_model("fraud-mlp", "1", "CPUExecutionProvider", "primary")
    canary = metrics.for_model("fraud-mlp", "2", "CPUExecutionProvider", "canary")
    shadow = metrics.for_model("fraud-mlp", "3", "CPUExecutionProvider", "shadow")
    primary.on_batch(4, [0.001] * 4, 0.002, 0, 0, 8)
    canary.on_batch(1, [0.001], 0.002, 0, 0, 8)
    shadow.on_batch(2, [0.5] * 2, 0.002, 0, deadline_misses=2, target_size=8)
    canary.scores.observe_many(np.asarray([0.01, 0.97], dtype=np.float32))
    canary.retire()
    lines = generate_latest(metrics.registry).decode().splitlines()
    assert 'seam_batch_size_count{model="fraud-mlp",version="1"} 1.0' in lines
    assert 'seam_batch_size_count{model="fraud-mlp",version="2"} 1.0' in lines
    assert 'seam_scores_count{model="fraud-mlp",version="2"} 2.0' in lines
    assert 'seam_scores_bucket{le="0.05",model="fraud-mlp",version="2"} 1.0' in lines
    assert not [line for line in lines if line.startswith("seam_model_info") and 'version="2"' in line]
    assert [line for line in lines if line.startswith("seam_model_info") and 'role="shadow"' in line]
    # A shadow keeps no deadline: its late rows are no misses.
    assert [line for line in lines if line.startswith("seam_deadline_misses_total") and 'version="3"' in line] == [
        f'seam_deadline_misses_total{{model="fraud-mlp",stage="{stage}",version="3"}} 0.0'
        for stage in ("ingest", "boundary")]


def test_deadline_misses_are_one_warning_per_interval() -> None:
    from agents.observe.metrics import BreachLog

    now = [0.0]
    log = BreachLog(interval_s=10.0, clock=lambda: now[0])
    log.sla_s = 0.05
    assert log.record(100, misses=3, arrived_late=2) is None  # within the interval: counted, not logged
    now[0] = 4.0
    assert log.record(50, misses=0, arrived_late=0) is None
    now[0] = 10.5
    message = log.record(50, misses=1, arrived_late=0)
    assert message == ("SLA: 4 of 200 records scored in the last 10 s missed their 50 ms deadline "
                       "(2 already late at the boundary, 2 lost there); they were scored")
    now[0] = 21.0
    assert log.record(500, misses=0, arrived_late=0) is None  # a quiet interval says nothing


def test_readiness_names_what_it_waits_for() -> None:
    starting = readiness(joined=False, models_running=False, rebalancing=False, restoring=False, input_partitions=[])
    assert not starting.ready and starting.waiting_for == ("group", "model")
    loading = readiness(joined=True, models_running=False, rebalancing=False, restoring=False, input_partitions=[2])
    assert loading.as_dict() == {"ready": False, "input_partitions": [2], "spare": False, "waiting_for": ["model"]}
    restoring = readiness(joined=True, models_running=True, rebalancing=True, restoring=True, input_partitions=[1])
    assert restoring.waiting_for == ("rebalance", "restore")
    serving = readiness(joined=True, models_running=True, rebalancing=False, restoring=False,
                        input_partitions=[3, 0])
    assert serving.as_dict() == {"ready": True, "input_partitions": [0, 3], "spare": False, "waiting_for": []}


def test_a_ready_worker_without_partitions_is_a_spare() -> None:
    spare = readiness(joined=True, models_running=True, rebalancing=False, restoring=False, input_partitions=[])
    assert spare.ready and spare.spare
    not_yet = readiness(joined=False, models_running=True, rebalancing=False, restoring=False, input_partitions=[])
    assert not not_yet.ready and not not_yet.spare


def test_cache_lookups_are_counters_by_result() -> None:
    registry = CollectorRegistry()
    WorkerCollector(lambda: Snapshot("tx", [], cache_hits=90, cache_misses=10), registry=registry)
    page = generate_latest(registry).decode()
    assert 'seam_state_cache_lookups_total{result="hit"} 90.0' in page
    assert 'seam_state_cache_lookups_total{result="miss"} 10.0' in page
