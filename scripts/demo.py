#!/usr/bin/env python3
"""``make demo``: start a broker and one worker, score ~30 s of a live stream, print a summary.

The stream is an example spec's (``--spec``: ``specs/fraud.toml``, card transactions, by default;
``specs/sensors.toml``, sensor readings), produced by its synthetic generator and scored by its example
model (``models/<spec name>-mlp.onnx``). Everything the demo starts (the broker unless one was already
running, and the worker) is stopped before it exits, also on Ctrl-C. Options: ``--rate`` (events/s),
``--duration`` (s), ``--keys``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import kafka_local
import numpy as np
import orjson
from aiokafka import AIOKafkaConsumer
from rich.console import Console
from rich.live import Live
from rich.table import Table

from app.loadgen import produce
from app.localhost import Subprocess, interrupt_on_sigterm, worker_argv
from app.settings import Settings
from app.synthetic import Synthetic, generator_for
from app.topics import delete_topics
from bench.promtext import Histogram, fetch, histograms, merged
from specs import EXAMPLE_SPEC
from tables.kafka import assign_all, client_options
from tables.spec import FeatureSpec, SpecError, load_spec

ROOT = Path(__file__).resolve().parent.parent
console = Console()


class Tally:
    """What came back from the worker, for the live line and the summary.

    Every record must end in exactly one outcome: a prediction, a late record or a dead letter. An id with
    a second outcome (of any kind) is a repeat; an output the demo cannot tie to a record it sent is
    unmatched. Either fails the run, as does a record with no outcome.
    """

    def __init__(self, spec: FeatureSpec) -> None:
        self.id_field, self.label = spec.event_id, spec.label
        self.sent_ms: dict[str, int] = {}
        self.burst_ids: set[str] = set()
        self.caught = 0
        self.outcome: dict[str, str] = {}  # id -> "prediction", "late" or "dead letter"
        self.scored: dict[str, int] = {}
        self.repeats = 0
        self.unmatched = 0
        self.fraud = 0
        self.late = 0
        self.dead = 0
        self.latency_ms: list[float] = []
        self.batch_sizes: list[int] = []

    def _first(self, tx_id: object, kind: str) -> bool:
        """Record ``kind`` as ``tx_id``'s outcome; False (and counted) if it is not ours or already has one."""
        if not isinstance(tx_id, str) or tx_id not in self.sent_ms:
            self.unmatched += 1
            return False
        if tx_id in self.outcome:
            self.repeats += 1
            return False
        self.outcome[tx_id] = kind
        return True

    def on_prediction(self, record: dict[str, Any], kafka_ts: int) -> None:
        tx_id = record[self.id_field]
        if not self._first(tx_id, "prediction"):
            return
        self.scored[tx_id] = kafka_ts
        self.fraud += record[self.label]
        self.caught += record[self.label] and tx_id in self.burst_ids
        self.latency_ms.append(kafka_ts - self.sent_ms[tx_id])
        self.batch_sizes.append(record["timing"]["batch_size"])

    def on_late(self, record: dict[str, Any]) -> None:
        self.late += self._first(record.get("event", {}).get(self.id_field), "late")

    def on_dead_letter(self, record: dict[str, Any]) -> None:
        """A dead letter names its record by the id inside the original value, when that is readable."""
        try:
            tx_id = orjson.loads(record["value"]).get(self.id_field) if not record.get("value_base64") else None
        except (orjson.JSONDecodeError, AttributeError, KeyError, TypeError):
            tx_id = None
        self.dead += self._first(tx_id, "dead letter")

    @property
    def answered(self) -> int:
        return len(self.outcome)

    def percentile(self, q: float) -> float:
        return float(np.percentile(self.latency_ms, q)) if self.latency_ms else float("nan")

    def line(self, produced: int, total: int) -> str:
        mean_batch = float(np.mean(self.batch_sizes)) if self.batch_sizes else 0.0
        return (f"produced {produced}/{total}  scored {len(self.scored)}  {self.label} {self.fraud}  "
                f"late {self.late}  dead letters {self.dead}  "
                f"e2e p50 {self.percentile(50):.1f} ms  p99 {self.percentile(99):.1f} ms  "
                f"mean batch {mean_batch:.1f}")


async def consume(settings: Settings, tally: Tally, ready: asyncio.Event, stop: asyncio.Event) -> None:
    """Follow predictions, dead letters and late records from their current end."""
    consumer = AIOKafkaConsumer(**client_options(settings.kafka), enable_auto_commit=False)
    await consumer.start()
    try:
        topics = [settings.predictions_topic, settings.dlq_topic, settings.late_topic]
        await assign_all(consumer, settings.kafka, topics, from_end=True)
        ready.set()
        while not stop.is_set():
            for tp, records in (await consumer.getmany(timeout_ms=100)).items():
                for record in records:
                    value = orjson.loads(record.value)
                    if tp.topic == settings.predictions_topic:
                        tally.on_prediction(value, record.timestamp)
                    elif tp.topic == settings.late_topic:
                        tally.on_late(value)
                    else:
                        tally.on_dead_letter(value)
    finally:
        await consumer.stop()


class DemoFailed(Exception):
    """The demo cannot go on; the message says why and where the worker's log is."""


async def get_json(url: str) -> dict[str, Any] | None:
    try:
        async with aiohttp.ClientSession() as session, session.get(url, timeout=aiohttp.ClientTimeout(2)) as r:
            return await r.json() if r.status == 200 else None
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None


async def wait_for(url: str, worker: Subprocess, what: str, timeout_s: float = 120) -> dict[str, Any]:
    """The JSON of ``url`` once it answers 200; fails with the worker's log path if it exits or never does."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not worker.running():
            raise DemoFailed(f"the worker exited with {worker.proc.returncode}; see {worker.log_path}")
        body = await get_json(url)
        if body is not None:
            return body
        await asyncio.sleep(0.25)
    raise DemoFailed(f"the worker was not {what} after {timeout_s:.0f} s ({url}); see {worker.log_path}")


async def run(args: argparse.Namespace, settings: Settings, spec: FeatureSpec, web: str, worker: Subprocess) -> int:
    await wait_for(f"{web}/ready/", worker, "ready")  # in the group, model warmed, state restored
    model = await wait_for(f"{web}/model/", worker, "serving its model")
    if "model" not in model or "provider" not in model:
        raise DemoFailed(f"{web}/model/ answered {model}; see {worker.log_path}")
    console.print(f"worker ready: model {model['model']} on {model['provider']}, web {web}/model/")
    tally, ready, stop = Tally(spec), asyncio.Event(), asyncio.Event()
    consumer = asyncio.create_task(consume(settings, tally, ready, stop))
    await asyncio.wait([consumer, asyncio.create_task(ready.wait())], return_when=asyncio.FIRST_COMPLETED)
    if consumer.done():
        consumer.result()  # raises what stopped it
    seed = int(time.time())
    total = int(args.rate * args.duration)
    # Its event time ends by now: synthetic time runs ahead of the wall clock, and the worker refuses records
    # stamped far ahead of their Kafka timestamps (SEAM_MAX_FUTURE_S).
    generator = _Recording(generator_for(spec, keys=args.keys, seed=seed, id_prefix=f"demo{seed}",
                                         end_ms=int(time.time() * 1000), events=total, late_rate=0.0), tally)
    progress = {"sent": 0}
    with Live(tally.line(0, total), console=console, refresh_per_second=4) as live:
        producing = asyncio.create_task(produce(
            settings.kafka, settings.input_topic, rate=args.rate, duration_s=args.duration,
            generator=generator, key_field=spec.key, partitions=settings.topic_partitions,
            on_progress=lambda done, _total: progress.__setitem__("sent", done)))
        while not producing.done():
            if not worker.running():
                producing.cancel()
                raise DemoFailed(f"the worker exited with {worker.proc.returncode}; see {worker.log_path}")
            live.update(tally.line(progress["sent"], total))
            await asyncio.sleep(0.25)
        report = producing.result()
        deadline = time.monotonic() + 60
        while tally.answered < report.sent and time.monotonic() < deadline and worker.running():
            live.update(tally.line(report.sent, total))
            await asyncio.sleep(0.25)
        await asyncio.sleep(1.0)  # let repeats, if any, show up
        live.update(tally.line(report.sent, total))
    stats = (await get_json(f"{web}/model/") or {}).get("stats", {})
    try:
        worker_metrics = histograms(await asyncio.to_thread(fetch, f"{web}/metrics"))
    except OSError:
        worker_metrics = {}
    stop.set()
    await consumer
    code = summary(report.sent, tally, args, stats, model, web, worker_metrics, spec)
    if code:
        console.print(f"see the worker's log: {worker.log_path}")
    return code


class _Recording:
    """Wrap the generator to remember when each id was handed to the producer."""

    def __init__(self, generator: Synthetic, tally: Tally) -> None:
        self._generator = generator
        self._tally = tally

    def __iter__(self) -> _Recording:
        return self

    def __next__(self) -> tuple[dict[str, Any], bool]:
        tx, positive = next(self._generator)
        self._tally.sent_ms[tx[self._tally.id_field]] = int(time.time() * 1000)
        if positive:
            self._tally.burst_ids.add(tx[self._tally.id_field])
        return tx, positive


def worker_view(metrics: dict[Any, Histogram]) -> list[tuple[str, str]]:
    """The worker's own latency metrics: p50 / p99 as the upper bounds of their histogram buckets."""

    def ms(name: str, stage: str | None = None) -> str:
        labels = () if stage is None else (("stage", stage),)
        histogram = merged(metrics, name, labels)
        if histogram is None or not histogram.count:
            return "-"
        return f"p50 ≤ {histogram.quantile(0.5) * 1000:g} ms, p99 ≤ {histogram.quantile(0.99) * 1000:g} ms"

    lag = metrics.get(("seam_event_loop_lag_seconds", ()))
    return [
        ("worker: end to end", ms("seam_end_to_end_seconds")),
        ("worker: ingest / queue", f"{ms('seam_stage_seconds', 'ingest')} / {ms('seam_queue_delay_seconds')}"),
        ("worker: inference / delivery", f"{ms('seam_inference_seconds')} / {ms('seam_stage_seconds', 'delivery')}"),
        ("worker: event-loop lag", "-" if lag is None else f"max ≤ {lag.max_bound() * 1000:g} ms"),
        ("worker: state writes", ms("seam_state_flush_seconds")),
    ]


def summary(sent: int, tally: Tally, args: argparse.Namespace, stats: dict[str, Any], model: dict[str, Any],
            web: str, worker_metrics: dict[Any, Histogram] | None = None, spec: FeatureSpec | None = None) -> int:
    """Print the run's numbers; return 0 when every record got exactly one outcome."""
    spec = spec or load_spec(EXAMPLE_SPEC)
    scored = len(tally.scored)
    missing = sent - tally.answered
    latency = (f"p50 {tally.percentile(50):.1f} ms  p95 {tally.percentile(95):.1f} ms  "
               f"p99 {tally.percentile(99):.1f} ms  max {max(tally.latency_ms or [0]):.0f} ms")
    rows = [
        ("produced", f"{sent} {spec.name} records, open loop at {args.rate:.0f}/s for {args.duration:.0f} s"),
        ("outcomes", f"{scored} predictions, {tally.late} late, {tally.dead} dead letters; {missing} without "
                     f"an outcome, {tally.repeats} repeated, {tally.unmatched} not from this run's records"),
        (f"{spec.label} flagged", f"{tally.fraud} ({100 * tally.fraud / max(1, scored):.1f} %); the generator "
                                  f"labelled {len(tally.burst_ids)} positive, {tally.caught} of them flagged"),
        ("end-to-end latency", latency),
        ("model batches", f"{stats.get('batches', 0)}, mean size {stats.get('mean_batch_size', 0):.1f}, "
                          f"mean inference {stats.get('mean_infer_ms', 0):.2f} ms"),
        *worker_view(worker_metrics or {}),
        ("model", f"{model['model']} on {model['provider']}"),
        ("web (while a worker runs)", f"{web}/model/  {web}/features/<{spec.key}>/"),
    ]
    table = Table(title="seam demo summary", show_header=False)
    for name, value in rows:
        table.add_row(name, value)
    console.print(table)
    ok = missing == 0 and tally.repeats == 0 and tally.unmatched == 0
    console.print("[green]every record got exactly one outcome[/green]" if ok
                  else "[red]not every record got exactly one outcome[/red]")
    return 0 if ok else 1


def main() -> int:
    interrupt_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--duration", type=float, default=30.0)
    parser.add_argument("--keys", "--cards", type=int, default=2000, help="distinct keys (cards, devices)")
    parser.add_argument("--spec", type=Path, default=None,
                        help="an example feature spec (default: SEAM_FEATURE_SPEC, else specs/fraud.toml)")
    args = parser.parse_args()
    try:
        args.spec = Path(args.spec or os.environ.get("SEAM_FEATURE_SPEC") or EXAMPLE_SPEC).resolve()
        spec = load_spec(args.spec)
        generator_for(spec, keys=1, seed=0, start_ms=0)
    except (SpecError, LookupError) as exc:
        console.print(f"[red]demo failed:[/red] {exc}")
        return 2
    args.model = ROOT / "models" / f"{spec.name}-mlp.onnx"

    port = int(os.environ.get("KAFKA_PORT", "9092"))
    # A broker the demo starts itself lives in a temporary folder, removed when it stops; one that
    # already runs (make kafka-up) is only rid of the demo's topics at the end.
    with kafka_local.broker_for(port, int(os.environ.get("KAFKA_CONTROLLER_PORT", port + 1000)),
                                ROOT / ".cache" / "kafka") as (broker, started_broker):
        return demo(args, broker.bootstrap, own_broker=started_broker)


def demo(args: argparse.Namespace, bootstrap: str, *, own_broker: bool) -> int:
    """Run one worker on ``bootstrap`` under the demo's load; remove what the run created."""
    # Every run gets its own topics, consumer group and state: the synthetic clock runs hours ahead
    # of the wall clock, so a second run on the same topics would start behind the first run's
    # watermarks and all be late.
    run_id = time.strftime("%Y%m%d-%H%M%S")
    data_dir = ROOT / ".data" / "demo" / run_id
    data_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)  # the user's SEAM_* settings apply, except the ones the demo owns below
    env.update({"SEAM_BROKER_URL": f"kafka://{bootstrap}", "SEAM_APP_ID": f"seam-demo-{run_id}",
                "SEAM_DATA_DIR": str(data_dir), "SEAM_INPUT_TOPIC": f"demo-{run_id}-input",
                "SEAM_PREDICTIONS_TOPIC": f"demo-{run_id}-predictions", "SEAM_DLQ_TOPIC": f"demo-{run_id}-dlq",
                "SEAM_LATE_TOPIC": f"demo-{run_id}-late", "SEAM_FEATURE_LOG_TOPIC": f"demo-{run_id}-features",
                "SEAM_FEATURE_SPEC": str(args.spec)})
    if "SEAM_MODEL_PATH" not in os.environ:  # the spec's example model, unless the user names another
        env["SEAM_MODEL_PATH"] = str(args.model)
    spec = load_spec(args.spec)
    settings = Settings.from_env({k: v for k, v in env.items() if k.startswith("SEAM_")})
    web = f"http://{settings.web_host}:{settings.web_port}"
    log = data_dir / "worker.log"
    worker: Subprocess | None = None
    code = 1
    try:
        worker = Subprocess(worker_argv("info"), env, log)
        console.print(f"worker started (pid {worker.pid}, log {log})")
        code = asyncio.run(run(args, settings, spec, web, worker))
        return code
    except DemoFailed as exc:
        console.print(f"[red]demo failed:[/red] {exc}")
        return 1
    except KeyboardInterrupt:
        return 130
    finally:
        if worker is not None:
            worker.stop()
            console.print(f"worker stopped (pid {worker.pid})")
        if not own_broker:  # a broker of the demo's own goes away with its data
            asyncio.run(delete_topics(bootstrap, run_id))
        if code == 0:  # a failed run keeps its worker's log and state for a look
            shutil.rmtree(data_dir, ignore_errors=True)
        else:
            console.print(f"the worker's log and state stay in {data_dir}")

if __name__ == "__main__":
    sys.exit(main())
