#!/usr/bin/env python3
"""Model-boundary benchmark: batch size and queue delay against offered load, no Kafka.

    .venv/bin/python scripts/bench_boundary.py [--rates 200,2000,10000,40000] [--seconds 4] [--model PATH]

Feature vectors arrive open loop (on a fixed schedule, whatever the boundary does) at each rate;
the real ONNX model scores them on the inference thread. For each rate, in one run: mean batch
size, p50/p99 queue delay (arrival at the boundary to dispatch), p99 boundary latency (arrival to
scores delivered) and SLA misses, for the adaptive batcher and for fixed bounds.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

import numpy as np

from agents.model.boundary import BatchResult, ModelBoundary
from agents.model.runtime import ModelRuntime
from tables.features import DEFAULT_SPEC

ROOT = Path(__file__).resolve().parent.parent


async def run_rate(runtime: ModelRuntime, rate: float, seconds: float, adaptive: bool, args: argparse.Namespace
                   ) -> dict[str, float]:
    latencies: list[float] = []
    sizes: list[int] = []
    queue: list[float] = []
    misses = 0

    async def deliver(result: BatchResult[float]) -> None:
        nonlocal misses
        now = time.monotonic()
        latencies.extend(now - arrived for arrived in result.items)
        sizes.append(len(result.items))
        queue.extend(result.queue_ms)
        misses += result.deadline_misses

    boundary: ModelBoundary[float] = ModelBoundary(
        runtime.predict, deliver, max_batch_size=args.max_batch_size, max_wait_ms=args.max_wait_ms,
        max_inflight_batches=2, sla_ms=args.sla_ms, adaptive=adaptive)
    runtime.warmup([1, 8, args.max_batch_size])
    dispatcher = asyncio.create_task(boundary.run())
    rows = np.random.default_rng(1).random((1024, len(DEFAULT_SPEC.names))).astype(np.float32).tolist()
    total = int(rate * seconds)
    started = time.monotonic()
    for i in range(total):
        delay = started + i / rate - time.monotonic()
        if delay > 0.0005:
            await asyncio.sleep(delay)
        await boundary.submit(rows[i % len(rows)], time.monotonic())
    await boundary.flush()
    dispatcher.cancel()
    boundary.close()
    achieved = total / (time.monotonic() - started)
    return {
        "rate": rate, "achieved": achieved, "mean_batch": float(np.mean(sizes)),
        "queue_p50_ms": float(np.percentile(queue, 50)), "queue_p99_ms": float(np.percentile(queue, 99)),
        "latency_p99_ms": float(np.percentile(latencies, 99)) * 1000, "sla_misses": misses / total,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="200,2000,10000,40000")
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--model", type=Path, default=ROOT / "models" / "fraud-mlp.onnx")
    parser.add_argument("--max-batch-size", type=int, default=256)
    parser.add_argument("--max-wait-ms", type=float, default=5.0)
    parser.add_argument("--sla-ms", type=float, default=50.0)
    args = parser.parse_args()
    runtime = ModelRuntime.load(args.model, feature_names=DEFAULT_SPEC.names, device="auto")
    print(f"model {runtime.info.tag} on {runtime.info.provider}; max_batch_size {args.max_batch_size}, "
          f"max_wait_ms {args.max_wait_ms}, sla_ms {args.sla_ms}")
    print("| batcher | offered/s | achieved/s | mean batch | queue p50 ms | queue p99 ms | latency p99 ms "
          "| SLA misses |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for adaptive in (True, False):
        for rate in (float(r) for r in args.rates.split(",")):
            r = asyncio.run(run_rate(runtime, rate, args.seconds, adaptive, args))
            print(f"| {'adaptive' if adaptive else 'fixed'} | {rate:,.0f} | {r['achieved']:,.0f} | "
                  f"{r['mean_batch']:.1f} | {r['queue_p50_ms']:.2f} | {r['queue_p99_ms']:.2f} | "
                  f"{r['latency_p99_ms']:.2f} | {100 * r['sla_misses']:.2f} % |", flush=True)


if __name__ == "__main__":
    main()
