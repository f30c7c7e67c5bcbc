"""Batch ingestion against the real broker: completeness, commits, failures, rebalancing."""

from __future__ import annotations

import asyncio
import subprocess
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from app.topics import ensure_topics
from tests.integration.kafka_helpers import (
    collect,
    committed_offsets,
    end_offsets,
    passthrough_worker,
    produce_raw,
)

pytestmark = pytest.mark.integration


def records(start: int, count: int) -> list[tuple[bytes, bytes]]:
    return [(f"k{i % 997}".encode(), orjson.dumps({"id": f"r-{i}"})) for i in range(start, start + count)]


def seen(outputs: list[dict[str, Any]]) -> Counter[tuple[int, int]]:
    return Counter((o["p"], o["o"]) for o in outputs)


async def wait_committed(bootstrap: str, group: str, topic: str, timeout_s: float = 30) -> dict[str, dict[Any, int]]:
    """Wait until the group's committed offsets reach every partition's end; return them."""
    ends = await end_offsets(bootstrap, topic)
    deadline = time.monotonic() + timeout_s
    committed: dict[Any, int] = {}
    while time.monotonic() < deadline:
        committed = {tp: off for tp, off in (await committed_offsets(bootstrap, group)).items() if tp[0] == topic}
        if committed == ends:
            break
        await asyncio.sleep(0.5)
    return {"ends": ends, "committed": committed}


def names(tag: str) -> tuple[str, str, str]:
    suffix = uuid.uuid4().hex[:8]
    return f"in-{tag}-{suffix}", f"out-{tag}-{suffix}", f"pt-{tag}-{suffix}"


def test_100k_records_each_handled_once_and_commits_reach_the_end(kafka_bootstrap: str, tmp_path: Path) -> None:
    total = 100_000
    source, sink, group = names("100k")
    asyncio.run(ensure_topics(kafka_bootstrap, [source, sink], partitions=8))
    asyncio.run(produce_raw(kafka_bootstrap, source, records(0, total)))
    worker = passthrough_worker(kafka_bootstrap, app_id=group, input_topic=source, output_topic=sink,
                                data_dir=tmp_path / "w1")
    try:
        out = asyncio.run(collect(kafka_bootstrap, [sink], lambda o: len(o[sink]) >= total, timeout_s=180))
        offsets = asyncio.run(wait_committed(kafka_bootstrap, group, source))
    finally:
        code = worker.stop()
    counts = seen(out[sink])
    assert len(counts) == total, worker.log_tail()
    assert max(counts.values()) == 1, "a record was handled twice"
    assert offsets["committed"] == offsets["ends"], offsets
    assert sum(offsets["ends"].values()) == total
    assert code == 0, worker.log_tail()


def test_handler_exception_is_reported_and_its_batch_not_acknowledged(kafka_bootstrap: str, tmp_path: Path) -> None:
    source, sink, group = names("fail")
    asyncio.run(ensure_topics(kafka_bootstrap, [source, sink], partitions=1))
    asyncio.run(produce_raw(kafka_bootstrap, source, records(0, 5000)))
    worker = passthrough_worker(kafka_bootstrap, app_id=group, input_topic=source, output_topic=sink,
                                data_dir=tmp_path / "w1", extra_env={"PT_FAIL_OFFSET": "3000"})
    try:
        code: int | None = worker.wait_exit(timeout_s=60)
    except subprocess.TimeoutExpired:
        code = None
    finally:
        worker.stop()
    log = worker.log_path.read_text(errors="replace")
    assert code is not None, f"the crashed worker had not exited after 60 s:\n{worker.log_tail(30)}"
    assert code != 0, "the worker must stop on a handler error, not swallow it"
    assert "Crashed reason=RuntimeError('PT_FAIL_OFFSET 3000 reached')" in log
    assert "batch handler failed" in log and "PT_FAIL_OFFSET 3000 reached" in log
    committed = asyncio.run(committed_offsets(kafka_bootstrap, group)).get((source, 0), -1)
    assert committed <= 3000, f"offset {committed} committed past the failed batch"
    out = asyncio.run(collect(kafka_bootstrap, [sink], lambda o: True, timeout_s=5, settle_s=1))
    assert (0, 3000) not in seen(out[sink])


def logged(worker: Any, text: str) -> bool:
    return text in worker.log_path.read_text(errors="replace")


def wait_for(what: str, condition: Any, workers: list[Any], timeout_s: float) -> None:
    """Wait until ``condition()`` holds; fail naming ``what``, with the workers' logs, after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline or not all(w.running() for w in workers):
            logs = "\n\n".join(w.log_tail(30) for w in workers)
            raise AssertionError(f"{what}: not within {timeout_s:.0f} s (or a worker exited)\n{logs}")
        time.sleep(0.2)


ASSIGNED = "Setting newly assigned partitions"


def test_two_workers_and_a_third_joining_lose_nothing(kafka_bootstrap: str, tmp_path: Path) -> None:
    least, step, partitions = 60_000, 5_000, 8
    source, sink, group = names("rebalance")
    asyncio.run(ensure_topics(kafka_bootstrap, [source, sink], partitions=partitions))

    def start(name: str) -> Any:
        return passthrough_worker(kafka_bootstrap, app_id=group, input_topic=source, output_topic=sink,
                                  data_dir=tmp_path / name)

    joined = threading.Event()
    produced = [0]  # records written so far (the thread's count)
    failed: list[BaseException] = []

    def produce_in_steps() -> None:
        # Steps of 5,000 with a pause: before the third worker joins, while it does and for two steps after it
        # holds partitions (at least 60,000 records in all), so its rebalance happens with records in flight.
        steps_after_join = 0
        try:
            while produced[0] < least or steps_after_join < 2:
                after_join = joined.is_set()
                asyncio.run(produce_raw(kafka_bootstrap, source, records(produced[0], step)))
                produced[0] += step
                steps_after_join += after_join
                if produced[0] >= 40 * step and not joined.is_set():
                    raise AssertionError(f"the third worker had not joined after {produced[0]} records")
                time.sleep(0.5)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            failed.append(exc)

    workers = [start("a"), start("b")]
    producer = threading.Thread(target=produce_in_steps)
    try:
        producer.start()
        # Consumption has started: both workers hold partitions and outputs arrive.
        wait_for("the first two workers assigned partitions", lambda: all(logged(w, ASSIGNED) for w in workers),
                 workers, timeout_s=90)
        started = asyncio.run(collect(kafka_bootstrap, [sink], lambda o: len(o[sink]) > 0, timeout_s=90,
                                      settle_s=0))
        assert started[sink], "no output from the first two workers"
        workers.append(start("c"))  # joins mid-stream: every worker goes through a rebalance
        wait_for("the third worker assigned partitions", lambda: bool(failed) or logged(workers[2], ASSIGNED),
                 workers, timeout_s=120)
        assert not failed, failed
        joined.set()
        producer.join()
        assert not failed, failed
        total = produced[0]
        out = asyncio.run(collect(kafka_bootstrap, [sink], lambda o: len(seen(o[sink])) >= total, timeout_s=240))
        offsets = asyncio.run(wait_committed(kafka_bootstrap, group, source, timeout_s=60))
    finally:
        joined.set()
        producer.join()
        codes = [w.stop() for w in workers]
    counts = seen(out[sink])
    logs = "\n\n".join(w.log_tail(30) for w in workers)
    assert len(counts) == total, f"lost {total - len(counts)} records\n{logs}"
    assert offsets["committed"] == offsets["ends"], offsets
    assert codes == [0, 0, 0], logs
    assert all(ASSIGNED in w.log_path.read_text() for w in workers)
    duplicates = sum(counts.values()) - total
    # In-flight batches are delivered and committed before partitions go, so a rebalance redelivers
    # little; thousands of duplicates would mean the revoke flush stopped working.
    assert duplicates < total * 0.02, f"{duplicates} duplicates"
    print(f"\nrebalance test: {total} records, {duplicates} duplicates")


def test_sigterm_in_the_middle_of_a_rebalance_exits_zero(kafka_bootstrap: str, tmp_path: Path) -> None:
    source, sink, group = names("sigterm")
    asyncio.run(ensure_topics(kafka_bootstrap, [source, sink], partitions=4))
    asyncio.run(produce_raw(kafka_bootstrap, source, records(0, 2_000)))

    def start(name: str) -> Any:
        return passthrough_worker(kafka_bootstrap, app_id=group, input_topic=source, output_topic=sink,
                                  data_dir=tmp_path / name, extra_env={"PT_REVOKE_DELAY_S": "4"})

    first = start("a")
    second = None
    try:
        asyncio.run(collect(kafka_bootstrap, [sink], lambda o: len(seen(o[sink])) >= 2_000, timeout_s=90,
                            settle_s=0))
        second = start("b")  # the first worker rebalances and holds in its revoke hook
        deadline = time.monotonic() + 60
        while "revoke hook holding" not in first.log_path.read_text(errors="replace"):
            assert time.monotonic() < deadline, first.log_tail()
            time.sleep(0.1)
        started = time.monotonic()
        first.terminate()
        code: int | None = first.wait_exit(timeout_s=40)
    except subprocess.TimeoutExpired:
        code = None
    finally:
        first.stop()
        if second is not None:
            second.stop()
    assert code == 0, f"exit code {code} (None: still running after 40 s)\n{first.log_tail(40)}"
    assert time.monotonic() - started < 40
    # It left the group as it stopped (its consumer closed on the consumer thread's loop), so its
    # partitions went to the other worker at once instead of after the session timeout.
    assert "LeaveGroup request succeeded" in first.log_path.read_text(errors="replace"), first.log_tail(40)

