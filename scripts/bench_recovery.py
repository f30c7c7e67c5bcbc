#!/usr/bin/env python3
"""Scale-out benchmark: time to recover from a worker's SIGKILL, and throughput with 1, 2, 3 workers.

    .venv/bin/python scripts/bench_recovery.py [--cards 100000] [--preload 300000] [--write docs/BENCHMARKS.md]

* Recovery, once per ``--standbys`` value: two workers build feature state for ``--cards`` cards from
  ``--preload`` transactions, then take a live stream of ``--rate`` transactions/s. One worker is
  SIGKILLed; the time to recover is the time from the kill to the first prediction on each of its
  partitions (all of them produced by the survivor). It breaks down into detection (the group waits
  ``SEAM_SESSION_TIMEOUT_S`` for the dead member) and the takeover: from the survivor's new assignment
  to that first prediction, which includes restoring the partitions' state from the changelog
  unless a standby replica kept it warm.
* Throughput, once per ``--workers`` value: that many workers share an 8-partition topic; the
  transactions are produced as fast as possible once the group has settled. Total and per-worker
  events/s come from the predictions' broker timestamps (first to last).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import re
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from bench_common import local_broker, publish
from rich.console import Console

from app.localhost import Subprocess, free_port, worker_argv, worker_env
from app.synthetic import TransactionGenerator
from app.topics import ensure_topics
from tables.kafka import assign_all, client_options

ROOT = Path(__file__).resolve().parent.parent
PARTITIONS = 8
console = Console()




@dataclass
class Group:
    """One consumer group's topics and its worker processes."""

    bootstrap: str
    workdir: Path
    env: dict[str, str]
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    procs: dict[str, tuple[Subprocess, int]] = field(default_factory=dict)

    @property
    def input(self) -> str:
        return f"bench-tx-{self.tag}"

    @property
    def predictions(self) -> str:
        return f"bench-pred-{self.tag}"

    async def create_topics(self) -> None:
        names = [self.input, self.predictions, f"bench-dlq-{self.tag}", f"bench-late-{self.tag}"]
        await ensure_topics(self.bootstrap, names, PARTITIONS)

    def start(self, name: str) -> None:
        port = free_port()
        env = worker_env({
            "SEAM_BROKER_URL": f"kafka://{self.bootstrap}", "SEAM_APP_ID": f"bench-{self.tag}",
            "SEAM_INPUT_TOPIC": self.input, "SEAM_PREDICTIONS_TOPIC": self.predictions,
            "SEAM_DLQ_TOPIC": f"bench-dlq-{self.tag}", "SEAM_LATE_TOPIC": f"bench-late-{self.tag}",
            "SEAM_TOPIC_PARTITIONS": str(PARTITIONS), "SEAM_DATA_DIR": str(self.workdir / name),
            "SEAM_WEB_PORT": str(port), **self.env})
        proc = Subprocess(worker_argv("info"), env, self.log(name), cwd=ROOT)
        self.procs[name] = (proc, port)

    def log(self, name: str) -> Path:
        return self.workdir / name / "worker.log"

    def get(self, name: str, path: str) -> dict[str, Any] | None:
        try:
            url = f"http://127.0.0.1:{self.procs[name][1]}{path}"
            with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 - loopback
                parsed: dict[str, Any] = json.loads(response.read())
                return parsed
        except (OSError, ValueError):
            return None

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.procs[name][1]}"

    def wait_settled(self, timeout_s: float = 180, standbys: bool = False) -> dict[str, list[int]]:
        """Wait until every worker is ready and agrees on the members; return each one's input partitions."""
        urls = sorted(self.url(name) for name in self.procs)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for name, (proc, _port) in self.procs.items():
                if not proc.running():
                    raise RuntimeError(f"worker {name} exited with {proc.proc.returncode}; see {self.log(name)}")
            views = [self.get(name, "/cluster/") for name in self.procs]
            ready = [self.get(name, "/ready/") for name in self.procs]
            if all(v and [m["url"] for m in v["workers"]] == urls and not v["unowned_input_partitions"]
                   and (not standbys or all(m["standby_partitions"] for m in v["workers"])) for v in views) \
                    and all(r and r["ready"] for r in ready):
                first = views[0]
                assert first is not None
                return {m["url"]: m["input_partitions"] for m in first["workers"]}
            time.sleep(0.5)
        raise RuntimeError(f"the group did not settle on {urls} within {timeout_s}s; logs in {self.workdir}")

    def stop(self) -> None:
        for proc, _port in self.procs.values():
            proc.terminate()  # all at once, then each waited for
        for proc, _port in self.procs.values():
            proc.stop()


def transactions(generator: TransactionGenerator, count: int) -> Iterator[tuple[bytes, bytes]]:
    for _ in range(count):
        tx = next(generator)[0]
        yield tx["card_id"].encode(), orjson.dumps(tx)


async def produce(bootstrap: str, topic: str, records: Iterator[tuple[bytes, bytes]],
                  rate: float | None = None, stop: threading.Event | None = None) -> int:
    """Send records (as fast as possible, or ``rate`` per second until ``stop``); wait for every ack."""
    producer = AIOKafkaProducer(**client_options(bootstrap), acks="all", linger_ms=10, max_batch_size=512 * 1024)
    await producer.start()
    sent, pending, started = 0, [], time.monotonic()
    try:
        for key, value in records:
            if stop is not None and stop.is_set():
                break
            pending.append(await producer.send(topic, value, key=key))
            sent += 1
            if len(pending) >= 20_000:
                await asyncio.gather(*pending)
                pending.clear()
            if rate is not None:
                await asyncio.sleep(max(0.0, started + sent / rate - time.monotonic()))
        await asyncio.gather(*pending)
    finally:
        await producer.stop()
    return sent


async def read_outputs(bootstrap: str, topic: str, expected: int, timeout_s: float) -> dict[int, list[int]]:
    """Broker timestamps (ms) of the records of ``topic``, per partition, once ``expected`` have been read."""
    consumer = AIOKafkaConsumer(**client_options(bootstrap), enable_auto_commit=False, fetch_max_bytes=64 << 20)
    await consumer.start()
    stamps: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
    try:
        await assign_all(consumer, bootstrap, [topic], from_end=False)
        deadline = time.monotonic() + timeout_s
        while sum(map(len, stamps.values())) < expected and time.monotonic() < deadline:
            for tp, records in (await consumer.getmany(timeout_ms=500, max_records=50_000)).items():
                stamps[tp.partition] += [r.timestamp for r in records]
    finally:
        await consumer.stop()
    return stamps


class FirstAfter:
    """Watch partitions of a topic from their current end for the first record stamped after ``since_ms``."""

    def __init__(self, bootstrap: str, topic: str, partitions: list[int], timeout_s: float) -> None:
        self.since_ms = 2**62
        self._first: dict[int, int] = {}
        self._positioned = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._watch(bootstrap, topic, partitions,
                                                                                timeout_s)))
        self._thread.start()
        if not self._positioned.wait(60):
            raise RuntimeError("could not position the watch on the predictions topic")

    async def _watch(self, bootstrap: str, topic: str, partitions: list[int], timeout_s: float) -> None:
        consumer = AIOKafkaConsumer(**client_options(bootstrap), enable_auto_commit=False)
        await consumer.start()
        try:
            tps = [tp for tp in await assign_all(consumer, bootstrap, [topic], from_end=True)
                   if tp.partition in partitions]
            consumer.assign(tps)
            for tp in tps:
                await consumer.seek_to_end(tp)
                await consumer.position(tp)
            self._positioned.set()
            deadline = time.monotonic() + timeout_s
            while len(self._first) < len(tps) and time.monotonic() < deadline:
                for tp, records in (await consumer.getmany(timeout_ms=200)).items():
                    after = [r.timestamp for r in records if r.timestamp > self.since_ms]
                    if after and tp.partition not in self._first:
                        self._first[tp.partition] = min(after)
        finally:
            self._positioned.set()
            await consumer.stop()

    def result(self) -> dict[int, int]:
        """Wait for the watch to end; the first timestamp (ms) after ``since_ms`` per partition seen."""
        self._thread.join()
        return self._first


LOG_TIME = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]")


def log_times(log: Path, needle: str) -> list[float]:
    """Epoch seconds of the worker log lines that contain ``needle``."""
    times = []
    for line in log.read_text(errors="replace").splitlines():
        match = LOG_TIME.match(line)
        if match and needle in line:
            times.append(datetime.datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp())
    return times


async def changelog_records(bootstrap: str, topic: str, partitions: list[int]) -> int:
    consumer = AIOKafkaConsumer(**client_options(bootstrap), enable_auto_commit=False)
    await consumer.start()
    try:
        tps = await assign_all(consumer, bootstrap, [topic], from_end=True)
        return sum([await consumer.position(tp) for tp in tps if tp.partition in partitions])
    finally:
        await consumer.stop()


def recovery_run(bootstrap: str, workdir: Path, standbys: int, args: argparse.Namespace) -> dict[str, Any]:
    group = Group(bootstrap, workdir / f"recovery-{standbys}", {
        "SEAM_STANDBY_REPLICAS": str(standbys), "SEAM_SESSION_TIMEOUT_S": str(args.session_timeout)})
    asyncio.run(group.create_topics())
    generator = TransactionGenerator(cards=args.cards, seed=5, id_prefix=f"r{standbys}", late_rate=0.0)
    stop = threading.Event()
    try:
        group.start("a")
        group.start("b")
        group.wait_settled(standbys=standbys > 0)
        console.print(f"[standbys={standbys}] preloading {args.preload:,} transactions over {args.cards:,} cards")
        asyncio.run(produce(bootstrap, group.input, transactions(generator, args.preload)))
        asyncio.run(read_outputs(bootstrap, group.predictions, args.preload, timeout_s=600))
        owners = group.wait_settled(standbys=standbys > 0)
        victim = owners[group.url("b")]
        live = threading.Thread(target=lambda: asyncio.run(produce(
            bootstrap, group.input, transactions(generator, 10**9), rate=args.rate, stop=stop)))
        live.start()
        time.sleep(3)
        watch = FirstAfter(bootstrap, group.predictions, victim, timeout_s=args.session_timeout + 300)
        killed_at = time.time()
        watch.since_ms = int(killed_at * 1000)
        group.procs["b"][0].kill()
        first = watch.result()
        stop.set()
        live.join()
        if len(first) < len(victim):
            raise RuntimeError(f"partitions {set(victim) - set(first)} did not recover; see {group.workdir}")
        assigned = [t for t in log_times(group.log("a"), "Setting newly assigned partitions") if t > killed_at]
        state = asyncio.run(changelog_records(bootstrap, f"bench-{group.tag}-card-state-changelog", victim))
    finally:
        stop.set()
        group.stop()
    recovered = [(first[p] / 1000 - killed_at) for p in victim]
    result = {"standbys": standbys, "partitions": len(victim), "changelog_records": state,
              "detect_s": assigned[0] - killed_at if assigned else float("nan"),
              "first_s": min(recovered), "all_s": max(recovered)}
    result["takeover_s"] = result["all_s"] - result["detect_s"]
    console.print(result)
    return result


def throughput_run(bootstrap: str, workdir: Path, workers: int, args: argparse.Namespace) -> dict[str, Any]:
    group = Group(bootstrap, workdir / f"throughput-{workers}", {})
    asyncio.run(group.create_topics())
    generator = TransactionGenerator(cards=5000, seed=1, id_prefix=f"t{workers}", late_rate=0.0)
    records = list(transactions(generator, args.records))
    try:
        for i in range(workers):
            group.start(f"w{i}")
        owners = group.wait_settled()
        asyncio.run(produce(bootstrap, group.input, iter(records)))
        stamps = asyncio.run(read_outputs(bootstrap, group.predictions, args.records, timeout_s=600))
    finally:
        group.stop()
    every = [t for ts in stamps.values() for t in ts]

    def rate(timestamps: list[int]) -> float:
        return (len(timestamps) - 1) / max(1e-3, (max(timestamps) - min(timestamps)) / 1000)

    per_worker = sorted(rate([t for p in parts for t in stamps[p]]) for parts in owners.values() if parts)
    result = {"workers": workers, "outputs": len(every), "total": rate(every), "per_worker": per_worker}
    console.print(result)
    return result


def markdown(recovery: list[dict[str, Any]], throughput: list[dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [
        "## Scaling out",
        "",
        f"Command: `.venv/bin/python scripts/bench_recovery.py --cards {args.cards} --preload {args.preload} "
        f"--rate {args.rate:g} --session-timeout {args.session_timeout:g} --records {args.records}`",
        f"Machine: {os.cpu_count()} CPUs, {platform.processor() or platform.machine()}, Python "
        f"{platform.python_version()}, one local Kafka broker; every worker on the same machine.",
        "",
        "### Time to recover from a worker's SIGKILL",
        "",
        f"Two workers, 8 partitions, state for {args.cards:,} cards built from {args.preload:,} transactions, "
        f"then {args.rate:g} transactions/s while one worker is killed. `SEAM_SESSION_TIMEOUT_S="
        f"{args.session_timeout:g}`.",
        "",
        "| standby replicas | partitions taken over | their changelog records | detected (new assignment) "
        "| first prediction | all partitions | takeover (assignment → all) |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in recovery:
        lines.append(f"| {r['standbys']} | {r['partitions']} | {r['changelog_records']:,} | {r['detect_s']:.1f} s "
                     f"| {r['first_s']:.1f} s | {r['all_s']:.1f} s | {r['takeover_s']:.1f} s |")
    lines += [
        "",
        "### Throughput with 1, 2 and 3 workers",
        "",
        f"{args.records:,} transactions (5,000 cards) on 8 partitions, produced as fast as possible once the "
        "group has settled; events/s from the predictions' broker timestamps.",
        "",
        "| workers | total events/s | per worker events/s |",
        "|---:|---:|---|",
    ]
    for r in throughput:
        lines.append(f"| {r['workers']} | {r['total']:,.0f} | {', '.join(f'{x:,.0f}' for x in r['per_worker'])} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cards", type=int, default=100_000)
    parser.add_argument("--preload", type=int, default=300_000)
    parser.add_argument("--rate", type=float, default=1000.0, help="live transactions/s around the kill")
    parser.add_argument("--session-timeout", type=float, default=6.0)
    parser.add_argument("--standbys", default="0,1", help="standby replica counts to measure recovery with")
    parser.add_argument("--workers", default="1,2,3", help="worker counts to measure throughput with")
    parser.add_argument("--records", type=int, default=100_000, help="transactions per throughput run")
    parser.add_argument("--port", type=int, default=int(os.environ.get("KAFKA_PORT", "9092")))
    parser.add_argument("--controller-port", type=int, default=0, help="default: --port + 1000")
    parser.add_argument("--write", type=Path, help="replace the 'Scaling out' section of this Markdown file")
    args = parser.parse_args()
    with local_broker(args.port, args.controller_port or args.port + 1000) as bootstrap, \
            tempfile.TemporaryDirectory(prefix="seam-bench-") as tmp:
        recovery = [recovery_run(bootstrap, Path(tmp), int(n), args) for n in args.standbys.split(",") if n]
        throughput = [throughput_run(bootstrap, Path(tmp), int(n), args) for n in args.workers.split(",") if n]
    publish(markdown(recovery, throughput, args), args.write, "## Scaling out")
    return 0


if __name__ == "__main__":
    sys.exit(main())
