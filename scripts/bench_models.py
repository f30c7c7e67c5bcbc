#!/usr/bin/env python3
"""Model deployments measured: end-to-end p99 around a swap against before it, and what a shadow model costs.

    .venv/bin/python scripts/bench_models.py [--records 60000] [--load 0.5] [--write docs/BENCHMARKS.md]

* **Shadow cost**: saturation (``--records`` pre-loaded transactions, events/s between the 10th and 90th
  percentile of the predictions' broker timestamps) of one ``seam worker`` serving the default model
  alone, then with a second version as its shadow, alternately (``--pairs`` times each).
* **Swap**, ``--swaps`` times: a fresh worker under open-loop load at ``--load`` of the median
  saturation without a shadow; after ``--warmup`` + ``--seconds`` of load, ``seam model deploy`` of the
  second version (the control topic's record, as the command writes it). p99 end to end (the
  prediction's broker append time minus the input's) over the inputs sent in the ``--seconds`` before
  the command and in the ``--seconds`` from it.

The second version is trained for the run (``scripts/train_model.py --version 2``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from bench_common import local_broker, publish

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agents.model import control  # noqa: E402
from agents.model.deployment import ModelRef, deploy, initial, set_shadow  # noqa: E402
from app.loadgen import produce  # noqa: E402
from app.synthetic import TransactionGenerator  # noqa: E402
from app.topics import delete_topics, ensure_topics  # noqa: E402
from bench.harness import Run, drain, steady_rate  # noqa: E402
from bench.kafka import OffsetWatch, end_offsets, produce_inputs, read_range  # noqa: E402

DEFAULT_MODEL = ROOT / "models" / "fraud-mlp.onnx"
HEADING = "## Model deployments"


def _id(value: bytes) -> str:
    return str(orjson.loads(value)["id"])


def new_run(bootstrap: str, workdir: Path) -> Run:
    run = Run("seam-adaptive", "default", DEFAULT_MODEL, bootstrap, workdir)
    run.seam_env = {"SEAM_MODEL_CONTROL_TOPIC": run.topic("ctl"), "SEAM_SHADOW_TOPIC": run.topic("shadow")}
    return run


async def saturation(bootstrap: str, workdir: Path, inputs: list[tuple[bytes, bytes]], shadow: Path | None) -> float:
    run = new_run(bootstrap, workdir)
    await run.create_topics()
    try:
        if shadow is not None:
            topic = run.seam_env["SEAM_MODEL_CONTROL_TOPIC"]
            await ensure_topics(bootstrap, [], 1, compacted=[topic])
            await control.write(bootstrap, topic, set_shadow(initial(ModelRef.of(DEFAULT_MODEL)), ModelRef.of(shadow)))
        outputs = await drain(run, inputs, 180)
        if shadow is not None:
            shadowed = sum((await end_offsets(bootstrap, run.topic("shadow"))).values())
            print(f"  shadow scores: {shadowed:,} of {len(inputs):,} rows", flush=True)
        rate, _span = steady_rate(sorted(ts for ts, _ in outputs))
        return rate
    finally:
        run.stop()
        await delete_topics(bootstrap, run.suffix)


async def swap(bootstrap: str, workdir: Path, rate: float, seconds: float, v2: Path, warm_s: float) -> dict[str, Any]:
    run = new_run(bootstrap, workdir)
    await run.create_topics()
    try:
        worker = run.start()
        generator = TransactionGenerator(cards=5000, seed=3, late_rate=0.0, id_prefix="swap")
        async with OffsetWatch(bootstrap, run.topic("pred")) as watch:
            probe = next(generator)[0]
            await produce_inputs(bootstrap, run.topic("tx"), [(probe["card_id"].encode(), orjson.dumps(probe))])
            while await watch.total() < 1:
                worker.check()
                await asyncio.sleep(0.2)
            load_started = time.time()
            command_at: list[float] = []

            async def command() -> None:
                await asyncio.sleep(warm_s + seconds)
                command_at.append(time.time())
                await control.change(bootstrap, run.seam_env["SEAM_MODEL_CONTROL_TOPIC"],
                                     lambda: initial(ModelRef.of(DEFAULT_MODEL)),
                                     lambda current: deploy(current, ModelRef.of(v2)))

            task = asyncio.ensure_future(command())
            await produce(bootstrap, run.topic("tx"), rate=rate, duration_s=warm_s + 2 * seconds + 0.5,
                          generator=generator, partitions=8)
            await task
            sent_total = sum((await end_offsets(bootstrap, run.topic("tx"))).values())
            deadline = time.monotonic() + 30
            while await watch.total() < sent_total and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            outputs = await read_range(bootstrap, run.topic("pred"), {}, await watch.offsets())
        inputs = await read_range(bootstrap, run.topic("tx"), {}, await end_offsets(bootstrap, run.topic("tx")))
        appended = {_id(v): ts for ts, v in inputs}
        latency: dict[str, tuple[int, int, str]] = {}
        for ts, value in outputs:
            record = orjson.loads(value)
            latency.setdefault(record["id"], (appended[record["id"]], ts - appended[record["id"]], record["model"]))
        at_ms = command_at[0] * 1000
        before = [lat for sent, lat, _m in latency.values() if at_ms - seconds * 1000 <= sent < at_ms]
        around = [lat for sent, lat, _m in latency.values() if at_ms <= sent < at_ms + seconds * 1000]
        models = sorted({m for sent, _lat, m in latency.values() if sent >= at_ms})
        by_second: dict[int, list[int]] = {}
        for sent, lat, _m in latency.values():
            if at_ms - seconds * 1000 <= sent < at_ms + seconds * 1000:
                by_second.setdefault(int((sent - at_ms) // 1000), []).append(lat)
        return {"rate": rate, "before_p99": float(np.percentile(before, 99)),
                "around_p99": float(np.percentile(around, 99)), "before_p50": float(np.percentile(before, 50)),
                "around_p50": float(np.percentile(around, 50)), "before_n": len(before), "around_n": len(around),
                "unanswered": len(appended) - len(latency), "models_after": models,
                "load_started": load_started,
                "p99_by_second": [round(float(np.percentile(v, 99))) for _s, v in sorted(by_second.items())]}
    finally:
        run.stop()
        await delete_topics(bootstrap, run.suffix)


async def measure(args: argparse.Namespace, bootstrap: str, workdir: Path) -> str:
    v2 = workdir / "fraud-mlp-2.onnx"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "train_model.py"), "--version", "2", "--seed", "11",
                    "--out", str(v2)], check=True, capture_output=True)
    generator = TransactionGenerator(cards=5000, seed=1, late_rate=0.0, id_prefix="sat")
    inputs = [(t["card_id"].encode(), orjson.dumps(t)) for t in (next(generator)[0] for _ in range(args.records))]
    plain: list[float] = []
    shadowed: list[float] = []
    for pair in range(args.pairs):
        for label, shadow, into in (("alone", None, plain), ("with a shadow", v2, shadowed)):
            rate = await saturation(bootstrap, workdir, inputs, shadow)
            into.append(rate)
            print(f"saturation {label} (pair {pair + 1}): {rate:,.0f} events/s", flush=True)
    load = args.rate or args.load * float(np.median(plain))
    swaps = []
    for index in range(args.swaps):
        result = await swap(bootstrap, workdir, load, args.seconds, v2, args.warmup)
        swaps.append(result)
        print(f"swap {index + 1} at {load:,.0f}/s: p99 {result['before_p99']:.0f} ms before, "
              f"{result['around_p99']:.0f} ms around (models after the command: {result['models_after']})", flush=True)
    ratios = [r["around_p99"] / r["before_p99"] for r in swaps]
    cost = 1 - float(np.mean(shadowed)) / float(np.mean(plain))
    machine = f"{os.cpu_count()} CPUs, {platform.machine()}, Python {platform.python_version()}, one local Kafka broker"
    pairs = " / ".join(f"{a:,.0f} vs {b:,.0f}" for a, b in zip(plain, shadowed, strict=True))
    return "\n".join([
        HEADING, "",
        f"Command: `.venv/bin/python scripts/bench_models.py --records {args.records} --load {args.load} "
        f"--seconds {args.seconds:g} --warmup {args.warmup:g} --pairs {args.pairs} --swaps {args.swaps}` "
        "(`make bench-models`)",
        f"Machine: {machine}; the default model `fraud-mlp@1` and a second version `fraud-mlp@2` "
        "(`scripts/train_model.py --version 2 --seed 11`).", "",
        "| measurement | value |", "|---|---:|",
        f"| saturation, default model alone (mean of {args.pairs}) | {np.mean(plain):,.0f} events/s |",
        f"| saturation with `fraud-mlp@2` as its shadow (mean of {args.pairs}) | {np.mean(shadowed):,.0f} events/s |",
        f"| what the shadow costs | {cost:.1%} |",
        f"| load for the swaps ({args.load:.0%} of the median saturation alone) | {load:,.0f} events/s |",
        f"| p99 end to end, {args.seconds:g} s before `seam model deploy` (each swap) | "
        + " / ".join(f"{r['before_p99']:.0f}" for r in swaps) + " ms |",
        f"| p99 end to end, {args.seconds:g} s from the command (the swap inside) | "
        + " / ".join(f"{r['around_p99']:.0f}" for r in swaps) + " ms |",
        "| ratio (goal ≤ 1.10) | " + " / ".join(f"{r:.2f}" for r in ratios) + " |",
        "| p50 before / around | " + ", ".join(f"{r['before_p50']:.0f} / {r['around_p50']:.0f}" for r in swaps)
        + " ms |",
        f"| inputs unanswered | {sum(r['unanswered'] for r in swaps)} |", "",
        f"p99 per second of the inputs' send time, from {args.seconds:g} s before the command to {args.seconds:g} s "
        "after it: " + "; ".join(", ".join(map(str, r["p99_by_second"])) for r in swaps)
        + f" ms (each worker had taken load for {args.warmup:g} s before the first of them). "
        f"Saturation pairs (alone vs with a shadow, in run order): {pairs} events/s. The predictions after the "
        f"command came from {', '.join(swaps[-1]['models_after'])}; the shadow wrote one score per row it took "
        "(it drops rows rather than slow the primary, counted in `seam_shadow_dropped_rows`). A shadow is a second "
        "inference per row and a second output record per row (its score); on this 2-core machine both share the "
        "cores with the event loop, the Kafka client and the broker, so its cost here is an upper bound of what it "
        "costs on a host with cores or a GPU to spare.",
        ""])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=60_000)
    parser.add_argument("--pairs", type=int, default=2, help="saturation runs alone and with a shadow, each")
    parser.add_argument("--swaps", type=int, default=2, help="swap runs, each on a fresh worker")
    parser.add_argument("--load", type=float, default=0.5, help="the swap's load, a fraction of saturation")
    parser.add_argument("--rate", type=float, default=0.0, help="the swaps' load in events/s (default: --load)")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=15.0, help="seconds of load before the measured ones")
    parser.add_argument("--port", type=int, default=int(os.environ.get("KAFKA_PORT", "9092")))
    parser.add_argument("--write", type=Path, default=None, help="replace this section of a Markdown file")
    args = parser.parse_args()
    with local_broker(args.port, args.port + 1000) as bootstrap, \
            tempfile.TemporaryDirectory(prefix="seam-bench-") as tmp:
        table = asyncio.run(measure(args, bootstrap, Path(tmp)))
    publish(table, args.write, HEADING)


if __name__ == "__main__":
    main()
