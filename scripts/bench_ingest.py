#!/usr/bin/env python3
"""Ingestion benchmark: seam's batch ingestion against Faust's ``stream.take()`` and raw aiokafka.

    .venv/bin/python scripts/bench_ingest.py [--records 200000] [--pipeline] [--write docs/BENCHMARKS.md]

All modes do the same work on the same pre-produced topic (8 partitions, one broker, one run):
consume, decode the JSON value, produce a small record per input, acknowledge after delivery.

* ``aiokafka``: a raw aiokafka consume → decode → produce loop (the ceiling);
* ``faust take()``: a Faust agent over ``stream.take_events(512)``;
* ``seam batch``: a Faust app on seam's batch ingestion (``agents.ingest``).

With ``--pipeline`` it also runs the full seam worker (features, table, model, predictions) on
synthetic transactions with ``SEAM_INGEST=batch`` and ``SEAM_INGEST=stream``. Throughput is measured
from the output records' broker timestamps (first to last), so start-up time is excluded.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import tempfile
import uuid
from pathlib import Path

import orjson
from bench_common import local_broker, publish
from rich.console import Console

from app.localhost import Subprocess, free_port, worker_argv
from app.synthetic import TransactionGenerator
from app.topics import ensure_topics
from bench.kafka import output_span, produce_inputs, raw_passthrough

ROOT = Path(__file__).resolve().parent.parent
console = Console()
PARTITIONS = 8


async def measure(bootstrap: str, name: str, source: str, n: int, start: object, workdir: Path) -> dict[str, object]:
    sink = f"bench-out-{uuid.uuid4().hex[:8]}"
    await ensure_topics(bootstrap, [sink], PARTITIONS)
    proc = None
    task = None
    if callable(start):
        task = asyncio.create_task(start(sink))
    else:
        argv, env = start  # type: ignore[misc]
        proc = Subprocess(argv, {**env, "PT_OUTPUT": sink, "SEAM_PREDICTIONS_TOPIC": sink},
                          workdir / f"{name.replace(' ', '_')}.log")
    try:
        count, span = await output_span(bootstrap, sink, n, timeout_s=600)
    finally:
        if proc is not None:
            proc.stop()
        if task is not None:
            task.cancel()
    rate = (count - 1) / span if count > 1 else 0.0
    console.print(f"  {name:<28} {count:>8} outputs  {rate:>10,.0f} events/s")
    return {"mode": name, "outputs": count, "events_per_s": round(rate)}


async def main_async(args: argparse.Namespace, bootstrap: str, workdir: Path) -> list[dict[str, object]]:
    n = args.records
    source = f"bench-in-{uuid.uuid4().hex[:8]}"
    await ensure_topics(bootstrap, [source], PARTITIONS)
    console.print(f"producing {n:,} records to {source} ...")
    await produce_inputs(bootstrap, source, [(f"k{i % 997}".encode(), orjson.dumps({"id": f"r-{i}", "amount": i}))
                                             for i in range(n)])
    base_env = {k: v for k, v in os.environ.items() if not k.startswith(("SEAM_", "PT_"))}

    def passthrough(mode: str) -> tuple[list[str], dict[str, str]]:
        env = {**base_env, "PT_BROKER": f"kafka://{bootstrap}", "PT_APP_ID": f"bench-{mode}-{uuid.uuid4().hex[:6]}",
               "PT_INPUT": source, "PT_MODE": mode, "PT_DATA_DIR": str(workdir / mode)}
        return [sys.executable, str(ROOT / "scripts" / "passthrough_app.py"), "worker", "-l", "warn",
                "--without-web"], env

    results = [
        await measure(bootstrap, "aiokafka passthrough", source, n,
                      lambda sink: raw_passthrough(bootstrap, source, sink, n), workdir),
        await measure(bootstrap, "faust take(512)", source, n, passthrough("take"), workdir),
        await measure(bootstrap, "seam batch ingestion", source, n, passthrough("batch"), workdir),
    ]
    if args.pipeline:
        tx_topic = f"bench-tx-{uuid.uuid4().hex[:8]}"
        await ensure_topics(bootstrap, [tx_topic], PARTITIONS)
        generator = TransactionGenerator(cards=5000, seed=1, late_rate=0.0, id_prefix="bench")
        transactions = [next(generator)[0] for _ in range(args.pipeline_records)]
        await produce_inputs(bootstrap, tx_topic, [(t["card_id"].encode(), orjson.dumps(t)) for t in transactions])
        for ingest in ("batch", "stream"):
            suffix = uuid.uuid4().hex[:6]
            env = {**base_env, "SEAM_BROKER_URL": f"kafka://{bootstrap}", "SEAM_APP_ID": f"bench-seam-{suffix}",
                   "SEAM_INPUT_TOPIC": tx_topic, "SEAM_DLQ_TOPIC": f"bench-dlq-{suffix}",
                   "SEAM_LATE_TOPIC": f"bench-late-{suffix}", "SEAM_INGEST": ingest,
                   "SEAM_DATA_DIR": str(workdir / f"seam-{ingest}"), "SEAM_WEB_PORT": str(free_port())}
            argv = worker_argv("warn")
            results.append(await measure(bootstrap, f"seam pipeline, {ingest}", tx_topic, len(transactions),
                                         (argv, env), workdir))
    return results




def markdown(results: list[dict[str, object]], args: argparse.Namespace) -> str:
    ceiling = float(results[0]["events_per_s"])  # type: ignore[arg-type]
    take = float(results[1]["events_per_s"])  # type: ignore[arg-type]
    lines = [
        "## Ingestion",
        "",
        f"Command: `.venv/bin/python scripts/bench_ingest.py --records {args.records}"
        + (f" --pipeline --pipeline-records {args.pipeline_records}" if args.pipeline else "") + "`",
        f"Machine: {os.cpu_count()} CPUs, {platform.processor() or platform.machine()}, Python "
        f"{platform.python_version()}, one local Kafka broker; all modes in one run, same topic.",
        "",
        "| mode | events/s | vs aiokafka | vs take() |",
        "|---|---:|---:|---:|",
    ]
    for r in results:
        rate = float(r["events_per_s"])  # type: ignore[arg-type]
        lines.append(f"| {r['mode']} | {rate:,.0f} | {rate / ceiling:.2f} | {rate / take:.1f}× |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--pipeline", action="store_true", help="also run the full seam pipeline, both paths")
    parser.add_argument("--pipeline-records", type=int, default=60_000)
    parser.add_argument("--write", type=Path, help="replace the Ingestion section of this Markdown file")
    args = parser.parse_args()
    port = int(os.environ.get("KAFKA_PORT", "9092"))
    with local_broker(port, port + 1000) as bootstrap, tempfile.TemporaryDirectory(prefix="seam-bench-") as tmp:
        results = asyncio.run(main_async(args, bootstrap, Path(tmp)))
    publish(markdown(results, args), args.write, "## Ingestion")
    return 0


if __name__ == "__main__":
    sys.exit(main())
