#!/usr/bin/env python3
"""Avro input against JSON input: the whole pipeline's saturation, and what decoding and encoding cost per record.

    .venv/bin/python scripts/bench_formats.py [--records 60000] [--pairs 3] [--write docs/BENCHMARKS.md]

* **Saturation**, ``--pairs`` times each, alternately: ``--records`` pre-loaded transactions (the same ones,
  as JSON, then as Confluent-framed Avro), one fresh ``seam worker`` on fresh topics
  (``SEAM_INPUT_FORMAT=json`` / ``avro``), events/s between the 10th and 90th percentile of the predictions'
  broker timestamps. Every input must get a prediction and none may go to the dead-letter topic.
* **Per record**, in this process (no broker): best of ``--repeat`` passes over ``--micro-records`` of the
  same transactions, µs per record, of decode + validate (``codec.JsonInput.decode`` against
  ``AvroInput.decode``, its schema cached) and of encoding a prediction and its feature-log record
  (``Contract.prediction`` + ``codec.feature_record`` against ``AvroEncoder``).
* **Latency**, ``--latency-pairs`` times each: open-loop load at 25, 50 and 80 % of JSON's mean saturation,
  ``--seconds`` each, on one fresh worker per run; p50/p99 of the prediction's broker append time minus its
  input's.

The schema registry is a local Apicurio Registry (``scripts/registry_local.py``, in memory) started for the
run on a free port and stopped after it, unless ``--registry URL`` names one.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import numpy as np
import orjson
from bench_common import local_broker, publish
from fastavro import parse_schema, schemaless_reader

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agents.formats import codec  # noqa: E402
from agents.formats.avro import AvroEncoder, AvroInput, SchemaCache, input_writer, schema_for  # noqa: E402
from agents.formats.codec import DEFAULT_CONTRACT, Event  # noqa: E402
from app.loadgen import produce  # noqa: E402
from app.localhost import free_port  # noqa: E402
from app.synthetic import TransactionGenerator  # noqa: E402
from app.topics import delete_topics  # noqa: E402
from bench.harness import Run, drain, steady_rate  # noqa: E402
from bench.kafka import OffsetWatch, end_offsets, produce_inputs, read_range  # noqa: E402
from tables.features import DEFAULT_SPEC  # noqa: E402

DEFAULT_MODEL = ROOT / "models" / "fraud-mlp.onnx"
HEADING = "## Avro input"
REGISTRY = ROOT / "scripts" / "registry_local.py"
SUBJECT = "bench-formats-tx-value"  # the inputs' schema, registered once: workers look it up by id
DRAIN_CAP_S = 180.0
LOADS = (0.25, 0.5, 0.8)  # open-loop latency levels, fractions of JSON's mean saturation


@contextmanager
def schema_registry(url: str | None, run_dir: Path) -> Iterator[str]:
    """Yield ``url``, or start a local registry on a free port (stopped, by its PID file, after)."""
    if url:
        yield url
        return
    port = str(free_port())
    try:
        subprocess.run([sys.executable, str(REGISTRY), "up", "--port", port, "--run-dir", str(run_dir)], check=True)
        yield f"http://127.0.0.1:{port}/apis/ccompat/v6"
    finally:
        subprocess.run([sys.executable, str(REGISTRY), "down", "--port", port, "--run-dir", str(run_dir)],
                       check=False)


async def saturation(bootstrap: str, workdir: Path, inputs: list[tuple[bytes, bytes]], env: dict[str, str],
                     magic: bytes) -> float:
    """One fresh worker's saturation on ``inputs``; every input answered, nothing dead-lettered, or it raises."""
    run = Run("seam-adaptive", "default", DEFAULT_MODEL, bootstrap, workdir)
    run.seam_env = dict(env)
    label = env["SEAM_INPUT_FORMAT"]
    await run.create_topics()
    try:
        outputs = await drain(run, inputs, DRAIN_CAP_S)
        assert run.worker is not None
        if len(outputs) < len(inputs):
            raise RuntimeError(f"{label}: {len(outputs):,} predictions of {len(inputs):,} inputs after "
                               f"{DRAIN_CAP_S:.0f} s:\n{run.worker.log_tail(30)}")
        dead = sum((await end_offsets(bootstrap, run.topic("dlq"))).values())
        if dead:
            raise RuntimeError(f"{label}: {dead:,} inputs went to the dead-letter topic:\n{run.worker.log_tail(30)}")
        wrong = sum(1 for _, value in outputs if value[:1] != magic)
        if wrong:
            raise RuntimeError(f"{label}: {wrong:,} predictions do not start with {magic!r} (not {label})")
        rate, _span = steady_rate(sorted(ts for ts, _ in outputs))
        return rate
    finally:
        run.stop()
        await delete_topics(bootstrap, run.suffix)


def _reader(name: str) -> Callable[[bytes], str]:
    """The event id of a record value: JSON, or Confluent-framed Avro of seam's schema ``name``."""
    schema = parse_schema(schema_for(name, DEFAULT_SPEC))

    def event_id(value: bytes) -> str:
        if value[:1] == b"{":
            return str(orjson.loads(value)["id"])
        datum = schemaless_reader(io.BytesIO(value[5:]), schema, None)
        assert isinstance(datum, dict)
        return str(datum["id"])

    return event_id


async def latency(bootstrap: str, workdir: Path, env: dict[str, str], encode: Callable[[dict[str, Any]], bytes],
                  rates: Sequence[float], seconds: float) -> list[dict[str, float]]:
    """p50/p99 end to end (the prediction's broker append time minus its input's) at each open-loop rate, one
    fresh worker taking the rates one after the other (``seconds`` each)."""
    run = Run("seam-adaptive", "default", DEFAULT_MODEL, bootstrap, workdir)
    run.seam_env = dict(env)
    await run.create_topics()
    input_id, output_id = _reader("transaction"), _reader("prediction")
    try:
        worker = run.start()
        # Generated and encoded before the load starts: the load generator shares the cores with the worker, and
        # encoding while it sends would charge one format's encoder to the worker it measures.
        generator = TransactionGenerator(cards=5000, seed=3, late_rate=0.0, id_prefix="lat")
        planned = [next(generator) for _ in range(1 + int(sum(rates) * seconds) + len(rates))]
        encoded = {tx["id"]: encode(tx) for tx, _fraud in planned}
        ahead = iter(planned)
        async with OffsetWatch(bootstrap, run.topic("pred")) as watch:
            probe = next(ahead)[0]
            await produce_inputs(bootstrap, run.topic("tx"), [(probe["card_id"].encode(), encoded[probe["id"]])])
            while await watch.total() < 1:
                worker.check()
                await asyncio.sleep(0.2)
            phases = []
            for rate in rates:
                started = time.time() * 1000
                await produce(bootstrap, run.topic("tx"), rate=rate, duration_s=seconds,
                              generator=cast(TransactionGenerator, ahead), partitions=8,
                              encode=lambda tx: encoded[tx["id"]])
                phases.append((rate, started, time.time() * 1000))
            sent = sum((await end_offsets(bootstrap, run.topic("tx"))).values())
            deadline = time.monotonic() + DRAIN_CAP_S
            while await watch.total() < sent and time.monotonic() < deadline:
                worker.check()
                await asyncio.sleep(0.2)
            outputs = await read_range(bootstrap, run.topic("pred"), {}, await watch.offsets())
        inputs = await read_range(bootstrap, run.topic("tx"), {}, await end_offsets(bootstrap, run.topic("tx")))
    finally:
        run.stop()
        await delete_topics(bootstrap, run.suffix)
    appended = {input_id(value): ts for ts, value in inputs}
    answered: dict[str, int] = {}
    for ts, value in outputs:
        event = output_id(value)
        answered.setdefault(event, ts - appended[event])
    results = []
    for rate, start, end in phases:
        lat = [answered[e] for e, ts in appended.items() if start <= ts < end and e in answered]
        missing = sum(1 for e, ts in appended.items() if start <= ts < end and e not in answered)
        results.append({"rate": rate, "p50": float(np.percentile(lat, 50)), "p99": float(np.percentile(lat, 99)),
                        "n": len(lat), "unanswered": missing})
    return results


def best_us(step: Callable[[], Any], records: int, repeat: int) -> float:
    """The fastest of ``repeat`` calls of ``step`` (one pass over ``records`` records), in µs per record."""
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        step()
        best = min(best, time.perf_counter() - started)
    return best * 1e6 / records


async def per_record(json_values: Sequence[bytes], avro_values: Sequence[bytes], repeat: int) -> dict[str, float]:
    """µs per record: decode + validate, and a prediction + its feature-log record encoded, in each format."""
    schema_text = json.dumps(schema_for("input", DEFAULT_SPEC))

    async def fetch(schema_id: int, timeout_s: float) -> tuple[str, str] | None:
        return "AVRO", schema_text

    reader, json_input = AvroInput(SchemaCache(fetch, timeout_s=5.0)), codec.JsonInput()
    await reader.prepare(avro_values)
    from_json = [json_input.decode(v) for v in json_values]
    from_avro = [reader.decode(v) for v in avro_values]
    if from_json != from_avro or not all(isinstance(tx, Event) for tx in from_json):
        bad = next(i for i, (a, b) in enumerate(zip(from_json, from_avro, strict=True))
                   if a != b or not isinstance(a, Event))
        raise RuntimeError(f"record {bad}: JSON decodes to {from_json[bad]!r}, Avro to {from_avro[bad]!r}")
    txs: list[Event] = [tx for tx in from_json if isinstance(tx, Event)]
    rng = random.Random(5)
    features = [tuple(rng.uniform(0, 500) for _ in DEFAULT_SPEC.names) for _ in txs]
    feature_set = DEFAULT_SPEC.version
    outputs = AvroEncoder({"prediction": 1, "features": 2, "shadow-score": 3}, DEFAULT_CONTRACT)

    def encode_json() -> None:
        for tx, row in zip(txs, features, strict=True):
            DEFAULT_CONTRACT.prediction(tx, score=0.0123, threshold=0.5, model="fraud-mlp@1", queue_ms=1.2345,
                                        infer_ms=0.6789, batch_size=256)
            codec.feature_record(tx, feature_set=feature_set, features=row)

    def encode_avro() -> None:
        for tx, row in zip(txs, features, strict=True):
            outputs.prediction(tx, score=0.0123, threshold=0.5, model="fraud-mlp@1", queue_ms=1.2345, infer_ms=0.6789,
                               batch_size=256)
            outputs.feature_record(tx, feature_set=feature_set, features=row)

    n = len(txs)
    return {
        "json_decode": best_us(lambda: [json_input.decode(v) for v in json_values], n, repeat),
        "avro_decode": best_us(lambda: [reader.decode(v) for v in avro_values], n, repeat),
        "json_encode": best_us(encode_json, n, repeat),
        "avro_encode": best_us(encode_avro, n, repeat),
        "json_bytes": sum(map(len, json_values)) / n,
        "avro_bytes": sum(map(len, avro_values)) / n,
    }


async def measure(args: argparse.Namespace, bootstrap: str, registry_url: str, workdir: Path) -> str:
    generator = TransactionGenerator(cards=5000, seed=1, late_rate=0.0, id_prefix="fmt")
    transactions = [next(generator)[0] for _ in range(args.records)]
    writer = await input_writer(registry_url, SUBJECT, DEFAULT_SPEC)
    json_inputs = [(t["card_id"].encode(), orjson.dumps(t)) for t in transactions]
    avro_inputs = [(t["card_id"].encode(), writer(t)) for t in transactions]
    print(f"inputs: {args.records:,} transactions; Avro schema id {writer.schema_id} ({SUBJECT})", flush=True)

    micro_n = min(args.micro_records, args.records)
    micro = await per_record([v for _, v in json_inputs[:micro_n]], [v for _, v in avro_inputs[:micro_n]],
                             args.repeat)
    print(f"per record (µs, best of {args.repeat} over {micro_n:,}): decode JSON {micro['json_decode']:.2f}, "
          f"Avro {micro['avro_decode']:.2f}; encode JSON {micro['json_encode']:.2f}, Avro {micro['avro_encode']:.2f}",
          flush=True)

    formats = (
        ("json", json_inputs, {"SEAM_INPUT_FORMAT": "json"}, b"{"),
        ("avro", avro_inputs, {"SEAM_INPUT_FORMAT": "avro", "SEAM_SCHEMA_REGISTRY_URL": registry_url}, b"\x00"),
    )
    # Unmeasured: the first worker of a run (and the broker's first topics) pays for warming up.
    for name, inputs, env, magic in formats:
        rate = await saturation(bootstrap, workdir, inputs[:args.warmup_records], env, magic)
        print(f"warm-up {name}: {rate:,.0f} events/s (not counted)", flush=True)
    rates: dict[str, list[float]] = {"json": [], "avro": []}
    order: list[str] = []
    for pair in range(args.pairs):
        # JSON first in odd pairs, Avro first in even ones: a drift of the machine's speed favours neither.
        for name, inputs, env, magic in (formats if pair % 2 == 0 else formats[::-1]):
            rate = await saturation(bootstrap, workdir, inputs, env, magic)
            rates[name].append(rate)
            order.append(f"{name} {rate:,.0f}")
            print(f"saturation {name} (pair {pair + 1}): {rate:,.0f} events/s", flush=True)

    json_mean, avro_mean = float(np.mean(rates["json"])), float(np.mean(rates["avro"]))
    loads = [fraction * json_mean for fraction in LOADS]
    encoders: dict[str, Callable[[dict[str, Any]], bytes]] = {"json": orjson.dumps, "avro": writer}
    tails: dict[str, list[list[dict[str, float]]]] = {"json": [], "avro": []}
    for pair in range(args.latency_pairs):
        for name, _inputs, env, _magic in (formats if pair % 2 == 0 else formats[::-1]):
            phases = await latency(bootstrap, workdir, env, encoders[name], loads, args.seconds)
            tails[name].append(phases)
            print(f"latency {name} (pair {pair + 1}): " + ", ".join(
                f"{p['rate']:,.0f}/s p99 {p['p99']:.0f} ms" for p in phases), flush=True)
            if any(p["unanswered"] for p in phases):
                raise RuntimeError(f"{name}: inputs without a prediction: {[p['unanswered'] for p in phases]}")

    def p99s(name: str, index: int) -> str:
        return " / ".join(f"{runs[index]['p99']:.0f}" for runs in tails[name])
    decode_diff = micro["avro_decode"] - micro["json_decode"]
    encode_diff = micro["avro_encode"] - micro["json_encode"]
    budget_us = 1e6 / json_mean if json_mean else float("nan")
    machine = (f"{os.cpu_count()} CPUs, {platform.machine()}, Python {platform.python_version()}, one local Kafka "
               "broker, a local Apicurio Registry (in memory)")
    pairs = ", ".join(order)
    return "\n".join([
        HEADING, "",
        f"Command: `.venv/bin/python scripts/bench_formats.py --records {args.records} --pairs {args.pairs} "
        f"--latency-pairs {args.latency_pairs} --seconds {args.seconds:g}` "
        "(`make bench-formats`)",
        f"Machine: {machine}; the default model `fraud-mlp@1`.", "",
        "| measurement | JSON | Avro | Avro against JSON |", "|---|---:|---:|---:|",
        f"| saturation, mean of {args.pairs} (events/s) | {json_mean:,.0f} | {avro_mean:,.0f} | "
        f"{avro_mean / json_mean if json_mean else float('nan'):.3f}× |",
        f"| decode + validate, µs per record | {micro['json_decode']:.2f} | {micro['avro_decode']:.2f} | "
        f"{decode_diff:+.2f} µs |",
        f"| encode a prediction + its feature-log record, µs per record | {micro['json_encode']:.2f} | "
        f"{micro['avro_encode']:.2f} | {encode_diff:+.2f} µs |",
        *(f"| p99 end to end at {fraction:.0%} of JSON's saturation ({load:,.0f}/s), ms, each run | "
          f"{p99s('json', i)} | {p99s('avro', i)} | |" for i, (fraction, load) in enumerate(zip(LOADS, loads,
                                                                                           strict=True))),
        f"| input value, bytes per record (mean) | {micro['json_bytes']:.1f} | {micro['avro_bytes']:.1f} | "
        f"{micro['avro_bytes'] - micro['json_bytes']:+.1f} |", "",
        f"Saturation runs in run order (events/s; pairs alternate which format goes first, after an unmeasured "
        f"warm-up of {args.warmup_records:,} inputs each): {pairs}. Each run: {args.records:,} pre-loaded "
        "inputs, a fresh worker on fresh topics, events/s between the 10th and 90th percentile of the predictions' "
        "broker timestamps; every input had a prediction and none went to the dead-letter topic. The Avro worker "
        "writes its predictions and feature log in Avro too; the JSON worker writes JSON predictions and its "
        f"feature log in seam's binary layout. Per record: in one process, no broker, best of {args.repeat} passes "
        f"over {micro_n:,} of the same transactions (Avro decoding with the writer schema cached). Decode and "
        f"encode together differ by {decode_diff + encode_diff:+.2f} µs per record, "
        f"{(decode_diff + encode_diff) / budget_us:+.1%} of the {budget_us:.0f} µs per record at JSON saturation "
        "(10⁶ / events/s). Latency: open-loop load (`app.loadgen`, JSON or Avro records) at each rate for "
        f"{args.seconds:g} s on one fresh worker per run, the rates one after the other; p99 of the prediction's "
        "broker append time minus its input's, over the inputs sent in that rate's seconds.",
        ""])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=60_000)
    parser.add_argument("--pairs", type=int, default=3, help="saturation runs with JSON and with Avro input, each")
    parser.add_argument("--latency-pairs", type=int, default=2, help="open-loop latency runs per format")
    parser.add_argument("--seconds", type=float, default=15.0, help="seconds of load at each latency level")
    parser.add_argument("--warmup-records", type=int, default=10_000, help="inputs of the unmeasured first runs")
    parser.add_argument("--micro-records", type=int, default=20_000, help="records of the per-record measurement")
    parser.add_argument("--repeat", type=int, default=5, help="passes of the per-record measurement (the best counts)")
    parser.add_argument("--port", type=int, default=int(os.environ.get("KAFKA_PORT", "9092")))
    parser.add_argument("--controller-port", type=int, default=None, help="default: --port + 1000")
    parser.add_argument("--registry", default=None, help="a schema registry's Confluent-compatible base URL to use "
                                                         "(default: start a local one)")
    parser.add_argument("--write", type=Path, default=None, help="replace this section of a Markdown file")
    args = parser.parse_args()
    controller = args.controller_port if args.controller_port is not None else args.port + 1000
    with local_broker(args.port, controller) as bootstrap, \
            tempfile.TemporaryDirectory(prefix="seam-bench-") as tmp, \
            schema_registry(args.registry, Path(tmp) / "registry") as registry_url:
        table = asyncio.run(measure(args, bootstrap, registry_url, Path(tmp)))
    publish(table, args.write, HEADING)


if __name__ == "__main__":
    main()
