#!/usr/bin/env python3
"""Hold one worker at a fixed open-loop rate for a while; report latency and memory minute by minute.

    .venv/bin/python scripts/soak.py --rate 3000 --cards 100000 --duration 1800   # the 30-minute run
    .venv/bin/python scripts/soak.py --rate 4000 --cards 20000 --duration 60      # a one-minute probe
    .venv/bin/python scripts/soak.py --duration 900 --time-lapse 32               # six horizons in 15 min
    .venv/bin/python scripts/soak.py --plot soak.png plain=a.json lapse=b.json     # p99 and RSS per window

It starts a local broker on ``--port`` unless one answers there (and stops only one it started), creates
fresh topics (outputs with ``LogAppendTime``), starts ``seam worker`` with ``--seam-env`` settings, sends
transactions on a fixed schedule, and measures each prediction's broker append time minus its input's
timestamp. Every ``--window`` seconds it prints p50/p99/max latency, the worker's resident memory, its CPU
time per event (all threads, and the event loop's: read from the kernel, so comparable on a busy machine),
its event-loop lag (``seam_event_loop_lag_seconds``) and its state cache (``seam_state_cached_*``). With
``--out`` the windows are also written as JSON. Everything started is stopped at the end, also on Ctrl-C, and
the run's topics are deleted (the worker's log and its last ``/metrics`` stay in its data directory).

A card's state keeps 71 minutes of its events (the example spec's horizon: lateness, replay allowance
and the longest window), so a real-time soak shorter than that never reaches a steady state.
``--time-lapse K`` runs event time K times faster than the wall clock from the start of the load (one
event per card per ``mean gap / K`` of wall time on average, the same rate), so a 15-minute run at K=32
covers six horizons: the states stop growing and
the worker must hold its tail and its memory flat from then on. The last line says whether it did:
the p99 of the last five windows against that of the first five (target: at most 10 ms more), and
resident memory over the last half of the run (target: at most 5 % growth).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from aiokafka import AIOKafkaConsumer

from app import localhost
from app.localhost import Subprocess, free_port, interrupt_on_sigterm, worker_argv, worker_env
from tables.kafka import client_options

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kafka_local  # noqa: E402

from app import loadgen  # noqa: E402
from app.synthetic import TransactionGenerator  # noqa: E402
from app.topics import delete_topics, ensure_topics  # noqa: E402
from bench.promtext import fetch, histograms  # noqa: E402
from tables.kafka import assign_all  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PARTITIONS = 4




def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu_seconds(pid: int) -> tuple[float, float]:
    """CPU time the process has used so far (every thread) and its main thread's (the event loop)."""
    return localhost.cpu_seconds(pid), localhost.cpu_seconds(pid, pid)


# The worker's metrics each window reports (cumulative): the state cache, RocksDB's memory, the fetch wait, the
# collector's pauses by generation, the model batches, and the state writes (their seconds: how busy the write
# behind is).
REPORTED = ("seam_state_cache", "seam_state_db_memory", "seam_fetch_wait_seconds", "seam_gc_pause_seconds_sum",
            "seam_gc_pause_seconds_count", "seam_batch_size_count", "seam_batch_size_sum",
            "seam_state_flush_seconds_sum", "seam_state_flush_seconds_count")


def scrape(url: str) -> dict[str, float]:
    """The sums, counts and gauges of a Prometheus text page (histogram buckets left out)."""
    out: dict[str, float] = {}
    with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310
        for line in response.read().decode().splitlines():
            if line.startswith("#") or "_bucket{" in line:
                continue
            name, _, value = line.rpartition(" ")
            with contextlib.suppress(ValueError):
                out[name] = float(value)
    return out


def loop_lag_max_ms(url: str) -> float:
    """The worst event-loop lag so far (the upper bound of the highest bucket with observations)."""
    try:
        lag = histograms(fetch(url)).get(("seam_event_loop_lag_seconds", ()))
    except OSError:
        return float("nan")
    return float("nan") if lag is None else lag.max_bound() * 1000


class Window:
    """Latencies observed in one window of the run."""

    def __init__(self) -> None:
        self.latency_ms: list[int] = []


async def follow(bootstrap: str, topic: str, sent_ms: dict[str, int], windows: list[Window], started: float,
                 window_s: float, stop: asyncio.Event) -> None:
    consumer = AIOKafkaConsumer(**client_options(bootstrap), enable_auto_commit=False)
    await consumer.start()
    try:
        await assign_all(consumer, bootstrap, [topic], from_end=False)
        while not stop.is_set():
            for records in (await consumer.getmany(timeout_ms=200)).values():
                for record in records:
                    tx_id = orjson.loads(record.value)["id"]
                    sent = sent_ms.pop(tx_id, None)
                    if sent is None:
                        continue  # a repeat
                    index = min(len(windows) - 1, int((sent / 1000 - started) // window_s))
                    windows[max(0, index)].latency_ms.append(record.timestamp - sent)
    finally:
        await consumer.stop()


async def produce(bootstrap: str, topic: str, rate: float, duration_s: float, cards: int,
                  sent_ms: dict[str, int], time_lapse: float, partitions: int) -> None:
    """Send ``rate`` transactions a second (:func:`app.loadgen.produce`); ``sent_ms[id]`` is each one's broker
    append time once acknowledged (a batch's records share it: the topic's ``LogAppendTime``)."""
    generator = TransactionGenerator(cards=cards, seed=7, id_prefix=f"soak{uuid.uuid4().hex[:6]}",
                                     start_ms=int(time.time() * 1000), late_rate=0.0)
    origin_ms = int(time.time() * 1000)
    # Event time runs K times faster than the wall clock and reaches it at the end of the run: never ahead
    # of the records' Kafka timestamps (the worker refuses those: SEAM_MAX_FUTURE_S).
    event_origin_ms = origin_ms - int(duration_s * 1000 * (time_lapse - 1))

    def time_lapsed() -> Iterator[tuple[dict[str, Any], bool]]:
        for tx, positive in generator:
            # Event time = now (times K from the start): the horizon fills as in production, K times faster.
            tx["ts"] = event_origin_ms + int((time.time() * 1000 - origin_ms) * time_lapse)
            yield tx, positive

    def acknowledged(records: list[dict[str, Any]], appended_ms: int) -> None:
        for tx in records:
            if tx["id"] in sent_ms:
                sent_ms[tx["id"]] = appended_ms

    await loadgen.produce(bootstrap, topic, rate=rate, duration_s=duration_s, generator=time_lapsed(),
                          partitions=partitions, on_sent=lambda tx, now_ms: sent_ms.__setitem__(tx["id"], now_ms),
                          on_acked=acknowledged)


async def run(args: argparse.Namespace, bootstrap: str) -> list[dict[str, Any]]:
    suffix = uuid.uuid4().hex[:8]
    source, sink = f"soak-tx-{suffix}", f"soak-pred-{suffix}"
    names = {"dlq": f"soak-dlq-{suffix}", "late": f"soak-late-{suffix}", "feat": f"soak-feat-{suffix}"}
    await ensure_topics(bootstrap, [], args.partitions, log_append_time=[source, sink, *names.values()])
    port = free_port()
    data = Path(args.data_dir) / suffix
    env = worker_env({
        "SEAM_BROKER_URL": f"kafka://{bootstrap}", "SEAM_APP_ID": f"soak-{suffix}", "SEAM_INPUT_TOPIC": source,
        "SEAM_PREDICTIONS_TOPIC": sink, "SEAM_DLQ_TOPIC": names["dlq"], "SEAM_LATE_TOPIC": names["late"],
        "SEAM_DATA_DIR": str(data), "SEAM_WEB_PORT": str(port), "SEAM_TOPIC_PARTITIONS": str(args.partitions),
    } | dict(item.split("=", 1) for item in args.seam_env))
    if "feature_log_topic" in (args.worker_root / "app" / "settings.py").read_text() and \
            "SEAM_FEATURE_LOG_TOPIC" not in env:
        env["SEAM_FEATURE_LOG_TOPIC"] = names["feat"]
    worker = Subprocess(worker_argv("warn"), env, data / "worker.log", cwd=args.worker_root)
    metrics_url = f"http://127.0.0.1:{port}/metrics"
    try:
        deadline = time.monotonic() + 120
        while True:
            with contextlib.suppress(OSError), urllib.request.urlopen(f"http://127.0.0.1:{port}/ready/",  # noqa: S310
                                                                     timeout=2) as r:
                if r.status == 200:
                    break
            if not worker.running() or time.monotonic() > deadline:
                raise SystemExit(f"soak: the worker is not ready; see {data / 'worker.log'}")
            await asyncio.sleep(0.5)
        windows = [Window() for _ in range(int(np.ceil(args.duration / args.window)))]
        sent_ms: dict[str, int] = {}
        stop = asyncio.Event()
        started = time.time()
        following = asyncio.create_task(follow(bootstrap, sink, sent_ms, windows, started, args.window, stop))
        producing = asyncio.create_task(produce(bootstrap, source, args.rate, args.duration, args.cards, sent_ms,
                                                args.time_lapse, args.partitions))
        report: list[dict[str, Any]] = []
        cpu_before = cpu_seconds(worker.pid)
        per_window = args.rate * args.window
        for index in range(len(windows)):
            await asyncio.sleep(max(0.0, started + (index + 1) * args.window - time.time()))
            cpu = cpu_seconds(worker.pid)
            report.append({"window": index, "rss_mb": round(rss_mb(worker.pid), 1),
                           # CPU per event offered in the window: the whole worker, and its event loop's thread
                           "cpu_us_per_event": round((cpu[0] - cpu_before[0]) / per_window * 1e6, 1),
                           "loop_cpu_us_per_event": round((cpu[1] - cpu_before[1]) / per_window * 1e6, 1),
                           "loop_lag_max_ms_so_far": loop_lag_max_ms(metrics_url),
                           **{k: v for k, v in scrape(metrics_url).items() if k.startswith(REPORTED)}})
            cpu_before = cpu
        await producing
        await asyncio.sleep(args.drain)
        with contextlib.suppress(OSError), urllib.request.urlopen(metrics_url, timeout=2) as response:  # noqa: S310
            (data / "metrics.txt").write_bytes(response.read())
        stop.set()
        await following
        for row, window in zip(report, windows, strict=True):
            lat = np.asarray(window.latency_ms or [0])
            row |= {"answered": len(window.latency_ms), "p50_ms": float(np.percentile(lat, 50)),
                    "p99_ms": float(np.percentile(lat, 99)), "max_ms": float(lat.max())}
            print(json.dumps(row), flush=True)
        unanswered = len(sent_ms)
        print(json.dumps({"unanswered": unanswered, "sent": int(args.rate * args.duration)}), flush=True)
        print(json.dumps(verdict(windows, report)), flush=True)
        return report
    finally:
        worker.stop()
        # Its topics hold every input and output of the run (a 30-minute run: gigabytes): a broker that outlives
        # the run would keep them for the retention's week.
        with contextlib.suppress(Exception):  # bounded: a broker gone by now must not hold the exit
            await asyncio.wait_for(delete_topics(bootstrap, suffix), 60)


def verdict(windows: list[Window], report: list[dict[str, Any]], span: int = 5) -> dict[str, Any]:
    """The soak's targets: the last ``span`` windows' p99 against the first ``span`` windows', and RSS growth
    over the second half of the run."""
    def p99(part: list[Window]) -> float:
        latencies = [ms for window in part for ms in window.latency_ms]
        return float(np.percentile(latencies, 99)) if latencies else float("nan")

    first, last = p99(windows[:span]), p99(windows[-span:])
    half, end = report[len(report) // 2]["rss_mb"], report[-1]["rss_mb"]
    growth = end / half - 1 if half else float("nan")
    return {"p99_first_ms": round(first, 1), "p99_last_ms": round(last, 1), "tail_flat": last <= first + 10.0,
            "rss_half_mb": half, "rss_end_mb": end, "rss_growth_last_half": round(growth, 3),
            "memory_flat": growth <= 0.05}


def plot(out: Path, runs: list[str]) -> None:
    """p99 and resident memory per window of earlier runs (``NAME=FILE``, as ``--out`` wrote them), one figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (p99, rss) = plt.subplots(1, 2, figsize=(11, 4))
    for run in runs:
        name, _, path = run.partition("=")
        rows = json.loads(Path(path).read_text())
        windows = [row["window"] + 1 for row in rows]
        answered = [row for row in rows if row.get("answered", 1)]  # a window with no input answered has no p99
        p99.plot([row["window"] + 1 for row in answered], [row["p99_ms"] for row in answered], marker=".", label=name)
        rss.plot(windows, [row["rss_mb"] for row in rows], marker=".", label=name)
    p99.set(xlabel="window (minute)", ylabel="p99 ms", yscale="log", title="p99 latency per window")
    rss.set(xlabel="window (minute)", ylabel="MB", title="worker resident memory")
    for ax in (p99, rss):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> None:
    interrupt_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=3000.0, help="events per second, open loop")
    parser.add_argument("--duration", type=float, default=1800.0, help="seconds of load")
    parser.add_argument("--cards", type=int, default=100_000)
    parser.add_argument("--partitions", type=int, default=PARTITIONS,
                        help="partitions of the input topic (and so of every output and changelog topic)")
    parser.add_argument("--window", type=float, default=60.0, help="seconds per reported window")
    parser.add_argument("--drain", type=float, default=5.0, help="seconds to wait for the last answers")
    parser.add_argument("--port", type=int, default=int(os.environ.get("KAFKA_PORT", "9092")))
    parser.add_argument("--data-dir", default=str(ROOT / ".data" / "soak"))
    parser.add_argument("--seam-env", action="append", default=[], metavar="SEAM_NAME=VALUE")
    parser.add_argument("--out", type=Path, help="write the windows as JSON here")
    parser.add_argument("--time-lapse", type=float, default=1.0, metavar="K",
                        help="event time runs K times faster than the wall clock (K >= 1)")
    parser.add_argument("--worker-root", type=Path, default=ROOT,
                        help="run the worker from this checkout (to compare versions in one environment)")
    parser.add_argument("--plot", type=Path, metavar="PNG", help="only plot earlier runs given as NAME=FILE")
    parser.add_argument("runs", nargs="*", metavar="NAME=FILE", help="with --plot: the runs' --out files")
    args = parser.parse_args()
    if args.plot:
        plot(args.plot, args.runs)
        return
    if args.time_lapse < 1:
        parser.error("--time-lapse must be >= 1")
    started_broker = False
    if subprocess.run([sys.executable, kafka_local.__file__, "status", "--port", str(args.port)],
                      capture_output=True).returncode != 0:
        subprocess.run([sys.executable, kafka_local.__file__, "up", "--port", str(args.port)], check=True)
        started_broker = True
    try:
        report = asyncio.run(run(args, f"127.0.0.1:{args.port}"))
        if args.out:
            args.out.write_text(json.dumps(report, indent=1))
    finally:
        if started_broker:
            subprocess.run([sys.executable, kafka_local.__file__, "down", "--port", str(args.port)])


if __name__ == "__main__":
    main()
