"""Run every benchmark mode on one broker (SASL_SSL: on a second one), one after the other; collect the results.

Per pipeline mode and model, one worker process on fresh topics:

1. **Saturation:** the same pre-loaded transactions (``Plan.sat_records``) wait in the input topic when the
   worker starts; throughput is outputs over the span of their broker timestamps, from the 10th to the 90th
   percentile of them, so start-up and the ramp of the first and last batches are excluded. A mode that has
   not drained them after ``Plan.sat_cap_s`` is measured on what it produced by then. The modes the others are
   measured against (:data:`REFERENCE_MODES`) drain that backlog ``Plan.sat_passes`` times, each time a fresh
   worker on fresh topics, and their saturation is the median (:func:`combined_saturation`): a pass lasts a
   few seconds, and on a shared machine one pass can run a fifth faster or slower than the next.
2. **Latency:** open-loop load (``app.loadgen``: a fixed schedule, whether or not the mode keeps up) at
   fractions of seam's (adaptive) saturation rate for this model, ``Plan.load_seconds`` each. Latency is the
   prediction's broker append time minus the input record's timestamp. Inputs still unanswered
   ``Plan.drain_cap_s`` after the load stops count at their age then, as lower bounds.
3. **Live capacity** (seam adaptive): the highest open-loop rate at which its lag stays bounded
   (:func:`kept_up`), bisected in ``Plan.capacity_probes`` more phases between the highest load point that
   kept up and the lowest that did not (or its own saturation rate). Backlog saturation says how fast a
   worker drains a queue; live capacity says how much live traffic it can take.

A backlog left by a mode that could not keep up is deleted from the input topic (``delete_records``) before
the next phase, so each phase starts from an empty queue. A run's topics are deleted when it ends, so every
mode meets a broker holding the same topics. An unmeasured seam run comes first, so that no mode pays for the
broker's own warm-up.

The SASL_SSL mode (:data:`SECURED`) is seam adaptive on a second, secured broker (:mod:`bench.secured`), run
right after seam adaptive on the plaintext one and loaded at the same rates: every client of that run, the
harness's own included, connects through its :class:`tables.kafka.Connection`. It gets an unmeasured warm-up
run of its own too.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import math
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from rich.progress import Progress, TaskID

from app.loadgen import produce
from app.localhost import Subprocess, cpu_seconds, free_port, worker_argv, worker_env
from app.synthetic import TransactionGenerator
from app.topics import ensure_topics
from bench.capacity import next_probe, p99_by_second
from bench.job import Expected, compare, feature_log_by_id, load_model, reference
from bench.kafka import (
    PARTITIONS,
    OffsetWatch,
    OutputRecord,
    delete_topics,
    drop_backlog,
    end_offsets,
    produce_inputs,
    read_range,
)
from bench.ort import BATCH_SIZES, measure_model
from bench.promtext import Histogram, fetch, merged, since
from bench.secured import worker_settings
from tables.kafka import Connection, partition_of

__all__ = ["MODES", "SECURED", "Plan", "run_all"]

ROOT = Path(__file__).resolve().parent.parent
CEILING = "ceiling-a"
SECURED = "seam-sasl-ssl"  # seam adaptive on the secured broker: what TLS and SASL cost
MODES = (CEILING, "seam-adaptive", SECURED, "seam-no-metrics", "seam-fixed", "seam-exactly-once", "seam-stream",
         "async", "naive", "quix")
# Whose saturation the others are measured against: seam adaptive's sets the live loads and the live capacity's
# share, ceiling A's the ratio to the passthrough. They take the median of Plan.sat_passes passes.
REFERENCE_MODES = (CEILING, "seam-adaptive")
PERCENTILES = {"p50": 50.0, "p95": 95.0, "p99": 99.0, "p99.9": 99.9}


@dataclass(frozen=True)
class Plan:
    """What one run measures and for how long."""

    models: dict[str, Path]
    ort_models: dict[str, Path]
    modes: tuple[str, ...] = MODES
    quick: bool = False
    sat_records: int = 100_000
    sat_cap_s: float = 6.0
    sat_passes: int = 3  # backlog drains of a reference mode, each on a fresh worker: its saturation is their median
    ceiling_records: int = 150_000
    loads: tuple[float, ...] = (0.25, 0.5, 0.8)
    capacity_probes: int = 3  # bisection phases for seam adaptive's live capacity (0: none)
    load_seconds: float = 6.0
    warmup_s: float = 1.0
    drain_cap_s: float = 3.0
    ort_seconds: float = 0.25
    cards: int = 5000
    seed: int = 1
    start_timeout_s: float = 90.0
    seam_env: dict[str, str] = field(default_factory=dict)  # extra SEAM_* settings for the seam modes


class Worker(Subprocess):
    """A benchmark process with its log file, stopped by PID (SIGTERM, then SIGKILL)."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path) -> None:
        super().__init__(argv, env, log, cwd=ROOT, append=True)

    def check(self) -> None:
        if not self.running():
            raise RuntimeError(f"{self.log_path.stem} exited with {self.proc.returncode}:\n{self.log_tail(30)}")


@dataclass
class Run:
    """One mode with one model on its own topics."""

    mode: str
    model: str
    model_path: Path
    bootstrap: str | Connection
    workdir: Path
    seam_env: dict[str, str] = field(default_factory=dict)
    suffix: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    worker: Worker | None = None
    web_port: int | None = None  # a seam worker's web port (its /metrics), set at each start

    @property
    def app_id(self) -> str:
        return f"bench-{self.mode}-{self.model}-{self.suffix}"

    def topic(self, kind: str) -> str:
        return f"bench-{kind}-{self.mode}-{self.model}-{self.suffix}"

    async def create_topics(self) -> None:
        changelogs = [f"{self.app_id}-{t}-changelog" for t in ("card-state", "watermarks")]
        await ensure_topics(self.bootstrap, [], PARTITIONS, compacted=changelogs,
                            log_append_time=[self.topic(k) for k in ("tx", "pred", "dlq", "late")])

    def start(self) -> Worker:
        """Start the mode's process (again, after stop(): same state folder, group and topics)."""
        self.worker = Worker(*self._command(), self.workdir / f"{self.mode}-{self.model}.log")
        return self.worker

    def stop(self) -> None:
        if self.worker is not None:
            self.worker.stop()
            self.worker = None

    def _command(self) -> tuple[list[str], dict[str, str]]:
        base = worker_env({}, drop=("SEAM_", "BENCH_"))
        data = self.workdir / self.app_id
        data.mkdir(parents=True, exist_ok=True)
        connection = Connection.of(self.bootstrap)
        if not self.mode.startswith("seam") and connection.security_protocol != "PLAINTEXT":
            raise ValueError(f"{self.mode} runs on a plaintext broker only, not {connection.security_protocol}")
        if self.mode == CEILING:
            argv = [sys.executable, "-m", "bench.passthrough", connection.bootstrap, self.topic("tx"),
                    self.topic("pred"), str(10**12)]
            return argv, base
        if self.mode.startswith("seam"):
            self.web_port = free_port()
            env = base | worker_settings(connection, data) | {
                "SEAM_APP_ID": self.app_id,
                "SEAM_INPUT_TOPIC": self.topic("tx"), "SEAM_PREDICTIONS_TOPIC": self.topic("pred"),
                "SEAM_DLQ_TOPIC": self.topic("dlq"), "SEAM_LATE_TOPIC": self.topic("late"),
                "SEAM_FEATURE_LOG_TOPIC": self.topic("feat"), "SEAM_DATA_DIR": str(data),
                "SEAM_WEB_PORT": str(self.web_port), "SEAM_MODEL_PATH": str(self.model_path),
                "SEAM_TOPIC_PARTITIONS": str(PARTITIONS),
                "SEAM_ADAPTIVE_BATCHING": "false" if self.mode == "seam-fixed" else "true",
                "SEAM_INGEST": "stream" if self.mode == "seam-stream" else "batch",
                "SEAM_PROCESSING_GUARANTEE": "exactly_once" if self.mode == "seam-exactly-once" else "at_least_once",
                "SEAM_METRICS": "false" if self.mode == "seam-no-metrics" else "true",
            } | self.seam_env
            return worker_argv("warn"), env
        env = base | {
            "BENCH_MODE": self.mode, "BENCH_BROKER": f"kafka://{connection.bootstrap}", "BENCH_APP_ID": self.app_id,
            "BENCH_INPUT": self.topic("tx"), "BENCH_PREDICTIONS": self.topic("pred"), "BENCH_DLQ": self.topic("dlq"),
            "BENCH_LATE": self.topic("late"), "BENCH_DATA_DIR": str(data), "BENCH_MODEL": str(self.model_path),
        }
        if self.mode == "quix":
            return [sys.executable, "-m", "bench.quix_app"], env
        return [sys.executable, "-m", "bench.faust_app", "worker", "-l", "warn", "--without-web"], env




# (name in the results, series on a worker's /metrics page): where a prediction's time goes, by stage.
STAGES = (
    ("end_to_end", ("seam_end_to_end_seconds", ())),
    ("ingest", ("seam_stage_seconds", (("stage", "ingest"),))),
    ("queue", ("seam_queue_delay_seconds", ())),
    ("inference", ("seam_inference_seconds", ())),
    ("delivery", ("seam_stage_seconds", (("stage", "delivery"),))),
    ("state_writes", ("seam_state_flush_seconds", ())),
)


def worker_stages(observed: dict[tuple[str, tuple[tuple[str, str], ...]], Histogram]) -> dict[str, Any]:
    """A phase's stage times from the worker's own histograms, in ms (bucket upper bounds: each is a "≤")."""
    out: dict[str, Any] = {}
    for name, key in STAGES:
        series = merged(observed, *key)
        if series is not None and series.count:
            out[name] = _bounds(series, {"p50_ms": series.quantile(0.5), "p99_ms": series.quantile(0.99)})
    lag = observed.get(("seam_event_loop_lag_seconds", ()))
    if lag is not None and lag.count:
        out |= _bounds(lag, {"loop_lag_max_ms": lag.max_bound()})
    return out


def _bounds(series: Histogram, seconds: dict[str, float]) -> dict[str, Any]:
    """``seconds`` in ms; one past the last finite bucket as that bucket's bound, named in ``"above"`` (a "more
    than", where the others are "at most"): JSON has no infinity."""
    last = max((bound for bound, _ in series.buckets if math.isfinite(bound)), default=0.0)
    out: dict[str, Any] = {name: (value if math.isfinite(value) else last) * 1000 for name, value in seconds.items()}
    above = [name for name, value in seconds.items() if math.isinf(value)]
    return out | {"above": above} if above else out


async def _metrics_page(run: Run) -> str | None:
    """The seam worker's /metrics page now (None for the other modes, or if it does not answer)."""
    if run.web_port is None or not run.mode.startswith("seam"):
        return None
    try:
        return await asyncio.to_thread(fetch, f"http://127.0.0.1:{run.web_port}/metrics")
    except OSError:
        return None


async def drain(run: Run, inputs: list[tuple[bytes, bytes]], cap_s: float) -> list[OutputRecord]:
    """Pre-load ``inputs`` into ``run``'s input topic, start its worker and wait until it has written a prediction per
    input (or ``cap_s`` passed); return the predictions (broker timestamp, value). The worker is left running."""
    await produce_inputs(run.bootstrap, run.topic("tx"), inputs)
    worker = run.start()
    async with OffsetWatch(run.bootstrap, run.topic("pred")) as watch:
        deadline = time.monotonic() + cap_s
        while await watch.total() < len(inputs) and time.monotonic() < deadline:
            worker.check()
            await asyncio.sleep(0.2)
        return await read_range(run.bootstrap, run.topic("pred"), {}, await watch.offsets())


def steady_rate(stamps: list[int], trim: float = 0.1) -> tuple[float, float]:
    """Outputs per second between the ``trim`` and ``1 - trim`` quantiles of their (sorted) timestamps in ms,
    and that span in seconds: the ramp-up after the first fetch and the tail of the last batches are left out."""
    if len(stamps) < 2:
        return 0.0, 0.0
    first, last = int(len(stamps) * trim), max(int(len(stamps) * trim) + 1, int(len(stamps) * (1 - trim)) - 1)
    last = min(last, len(stamps) - 1)
    span_s = max(1e-3, (stamps[last] - stamps[first]) / 1000)
    return (last - first) / span_s, span_s


def _round(value: float, digits: int = 1) -> float | None:
    """``value`` rounded, or None where it is not a number (no CPU time where the kernel does not say)."""
    return round(value, digits) if math.isfinite(value) else None


def drain_cpu_per_event(samples: list[tuple[int, float]], trim: float = 0.1) -> float | None:
    """The worker's CPU µs per output while it drained a backlog: between the polls at which ``trim`` and ``1 -
    trim`` of the outputs had come (as :func:`steady_rate` leaves out the start and the tail), from ``samples``
    of (outputs so far, the worker's CPU seconds then)."""
    if not samples or samples[-1][0] <= 0:
        return None
    total = samples[-1][0]
    after_start = [s for s in samples if s[0] >= trim * total]
    before_end = [s for s in samples if s[0] <= (1 - trim) * total]
    if not after_start or not before_end or before_end[-1][0] <= after_start[0][0]:
        return None
    (first, cpu_first), (last, cpu_last) = after_start[0], before_end[-1]
    return _round((cpu_last - cpu_first) / (last - first) * 1e6)


def combined_saturation(passes: list[dict[str, Any]]) -> dict[str, Any]:
    """The last pass's saturation (its worker goes on to the load phases) with the median rate of all ``passes``,
    each pass's rate in order, whether every pass drained its backlog, and the median of the worker's CPU per
    event while draining."""
    last = passes[-1]
    if len(passes) == 1:
        return last
    cpu = [p["worker_cpu_us_per_event"] for p in passes if p.get("worker_cpu_us_per_event") is not None]
    return {**last, "events_per_s": round(statistics.median(p["events_per_s"] for p in passes)),
            "passes": [p["events_per_s"] for p in passes], "drained": all(p["drained"] for p in passes),
            "worker_cpu_us_per_event": round(statistics.median(cpu), 1) if cpu else None}


def _id_of(value: bytes) -> str:
    return str(orjson.loads(value)["id"])


class Bench:
    """Runs the plan against one broker (and the SASL_SSL mode against ``secured``); ``results`` is the JSON
    document."""

    def __init__(self, plan: Plan, bootstrap: str, workdir: Path, progress: Progress,
                 secured: Connection | None = None) -> None:
        self.plan, self.bootstrap, self.workdir, self.progress = plan, bootstrap, workdir, progress
        self.secured = secured
        generator = TransactionGenerator(cards=plan.cards, seed=plan.seed, late_rate=0.0, id_prefix="bench")
        n = max(plan.sat_records, plan.ceiling_records if CEILING in plan.modes else 0)
        transactions = [next(generator)[0] for _ in range(n)]
        self.inputs = [(t["card_id"].encode(), orjson.dumps(t)) for t in transactions]
        self.partitions = [partition_of(key, PARTITIONS) for key, _ in self.inputs]
        self.after_inputs = generator  # the load phases continue the same stream
        self.saturation: dict[str, float] = {}
        self._references: dict[tuple[str, int], Expected] = {}
        self._tags: dict[str, str] = {}
        pipelines = len([m for m in plan.modes if m != CEILING])
        steps = 2 * (pipelines * len(plan.models) + (CEILING in plan.modes))
        self.overall = progress.add_task("benchmark", total=steps)

    def _tick(self, task: TaskID, _size: int) -> None:
        self.progress.advance(task)

    def _advance(self, weight: float = 1.0) -> None:
        self.progress.advance(self.overall, weight)

    def ort_ceiling(self) -> dict[str, list[dict[str, float]]]:
        out = {}
        for name, path in self.plan.ort_models.items():
            task = self.progress.add_task(f"ONNX Runtime alone, {name}", total=len(BATCH_SIZES))
            out[name] = measure_model(str(path), self.plan.ort_seconds, functools.partial(self._tick, task))
            self.progress.remove_task(task)
        return out

    async def mode(self, mode: str, model: str, loads_from: str, *, passes: int | None = None) -> dict[str, Any]:
        """Saturation, correctness and latency of one mode with one model (``passes``: backlog drains, by default
        ``Plan.sat_passes`` for a reference mode and one for the others; the last one's worker takes the load)."""
        target: str | Connection = self.bootstrap
        if mode == SECURED:
            if self.secured is None:
                raise ValueError(f"{SECURED} needs the secured broker's connection")
            target = self.secured
        if passes is None:
            passes = self.plan.sat_passes if mode in REFERENCE_MODES else 1
        started = time.monotonic()
        count = self.plan.ceiling_records if mode == CEILING else self.plan.sat_records
        earlier = [await self._saturation_pass(mode, model, target, count) for _ in range(passes - 1)]
        run = await self._backlogged_run(mode, model, target, count)
        try:
            async with OffsetWatch(run.bootstrap, run.topic("pred")) as watch:
                result = await self._saturate(run, watch, count)
                result["saturation"] = combined_saturation([*earlier, result["saturation"]])
                self._advance()
                own = result["saturation"]["events_per_s"]
                if mode != CEILING:
                    self.saturation.setdefault(f"{mode}/{model}", own)
                base = self.saturation.get(loads_from, 0.0)
                generator = copy.deepcopy(self.after_inputs)
                backlog = not result["saturation"]["drained"]
                result["latency"] = []
                for fraction in self.plan.loads if base else ():
                    rate = fraction * base
                    self._advance(1 / len(self.plan.loads))
                    if round(rate) > own:
                        # Above the mode's own saturation rate its queue grows for as long as the load lasts:
                        # any latency measured would only say how long the phase ran.
                        result["latency"].append({"load": fraction, "offered_per_s": round(rate), "overloaded": True})
                        continue
                    if backlog:
                        await self._restart(run, watch, generator)
                    point = await self._load(run, watch, generator, fraction, rate)
                    result["latency"].append(point)
                    backlog = point["unanswered"] > 0
                if mode == "seam-adaptive" and base and self.plan.capacity_probes:
                    probes = list(result["latency"])
                    for _ in range(self.plan.capacity_probes):
                        low, high = next_probe(probes, own)
                        if backlog:
                            await self._restart(run, watch, generator)
                        point = await self._load(run, watch, generator, (low + high) / 2 / base, (low + high) / 2)
                        probes.append(point)
                        backlog = point["unanswered"] > 0
                    low, high = next_probe(probes, own)
                    result["live_capacity"] = {"events_per_s": round(low), "did_not_keep_up_at": round(high),
                                               "of_saturation": round(low / own, 3) if own else None,
                                               "probes": probes[len(result["latency"]):]}
        finally:
            run.stop()
            await delete_topics(run.bootstrap, run.suffix)
        result["wall_s"] = round(time.monotonic() - started, 1)
        return result

    async def _backlogged_run(self, mode: str, model: str, target: str | Connection, count: int) -> Run:
        """A run on fresh topics whose worker starts with the first ``count`` inputs waiting for it."""
        run = Run(mode, model, self.plan.models[model], target, self.workdir, self.plan.seam_env)
        await run.create_topics()
        await produce_inputs(run.bootstrap, run.topic("tx"), self.inputs[:count])
        run.start()
        return run

    async def _saturation_pass(self, mode: str, model: str, target: str | Connection, count: int) -> dict[str, Any]:
        """One backlog drain on a fresh worker and fresh topics, deleted after it: its saturation (no check)."""
        run = await self._backlogged_run(mode, model, target, count)
        try:
            async with OffsetWatch(run.bootstrap, run.topic("pred")) as watch:
                return (await self._saturate(run, watch, count, check=False))["saturation"]
        finally:
            run.stop()
            await delete_topics(run.bootstrap, run.suffix)

    async def warm_up(self, model: str) -> None:
        """An unmeasured seam run, the same as the measured ones, before them.

        The first runs on a freshly started broker pay for its warm-up (the group coordinator's
        offsets topic, the JVM compiling its fetch and produce paths at the rates it meets). seam
        adaptive runs first (its saturation sets the load levels), so it alone would pay. A short
        warm-up (20,000 inputs, one 3 s phase at a quarter of the load) was not enough: run next,
        adaptive's p99 was 64 / 124 / 1,572 ms at 25 / 50 / 80 % load, and the same build run again
        after fixed bounds 40 / 84 / 350 ms (fixed bounds in between: 43 / 104 / 1,118 ms).
        The secured broker, a broker of its own, gets the same warm-up.
        """
        for mode in ("seam-adaptive", SECURED) if SECURED in self.plan.modes else ("seam-adaptive",):
            await self.mode(mode, model, f"{mode}/{model}", passes=1)
            self.saturation.pop(f"{mode}/{model}", None)

    async def _restart(self, run: Run, watch: OffsetWatch, generator: TransactionGenerator) -> None:
        """Start the next phase from an empty queue: delete the backlog, restart the worker, wait for it."""
        await drop_backlog(run.bootstrap, run.topic("tx"))
        run.stop()  # also drops what the worker had fetched but not processed
        worker = run.start()
        before = await watch.total()
        probe = next(generator)[0]
        await produce_inputs(run.bootstrap, run.topic("tx"), [(probe["card_id"].encode(), orjson.dumps(probe))])
        deadline = time.monotonic() + self.plan.start_timeout_s
        while await watch.total() <= before:
            worker.check()
            if time.monotonic() > deadline:
                raise RuntimeError(f"{run.mode} did not come back after a restart (log: {worker.log_path})")
            await asyncio.sleep(0.2)

    async def _saturate(self, run: Run, watch: OffsetWatch, count: int, *, check: bool = True) -> dict[str, Any]:
        task = self.progress.add_task(f"{run.mode} ({run.model}): saturation", total=count)
        deadline = time.monotonic() + self.plan.start_timeout_s
        first_seen = None
        total = 0
        samples: list[tuple[int, float]] = []  # (outputs so far, the worker's CPU seconds then)
        while total < count:
            assert run.worker is not None
            run.worker.check()
            total = await watch.total()
            samples.append((total, cpu_seconds(run.worker.pid)))
            self.progress.update(task, completed=total)
            now = time.monotonic()
            if total and first_seen is None:
                first_seen = now
            if (first_seen is None and now > deadline) or (first_seen and now - first_seen > self.plan.sat_cap_s):
                break
            await asyncio.sleep(0.2)
        self.progress.remove_task(task)
        if first_seen is None:
            raise RuntimeError(f"{run.mode} produced nothing in {self.plan.start_timeout_s:.0f} s ({run.workdir})")
        outputs = await read_range(run.bootstrap, run.topic("pred"), {}, await watch.offsets())
        rate, span_s = steady_rate(sorted(ts for ts, _ in outputs))
        result: dict[str, Any] = {"saturation": {
            "events_per_s": round(rate), "inputs": count, "outputs": len(outputs),
            "span_s": round(span_s, 3), "drained": len(outputs) >= count,
            "worker_cpu_us_per_event": drain_cpu_per_event(samples)}}
        if check and run.mode != CEILING:
            feature_log = None
            if run.mode.startswith("seam") and self.plan.seam_env.get("SEAM_FEATURE_LOG_TOPIC", "on"):
                # seam writes features to a feature log of their own (unless it is turned off)
                topic = run.topic("feat")
                ends = await end_offsets(run.bootstrap, topic)
                deadline = time.monotonic() + 10
                # The feature log's records are batched apart from the predictions': they can land a little
                # after the predictions they belong to.
                while sum(ends.values()) < len(outputs) and time.monotonic() < deadline:
                    await asyncio.sleep(0.1)
                    ends = await end_offsets(run.bootstrap, topic)
                feature_log = feature_log_by_id(v for _, v in await read_range(run.bootstrap, topic, {}, ends))
            result["correctness"] = self.check(run.model, [v for _, v in outputs], count, feature_log)
        return result

    def check(self, model: str, values: list[bytes], count: int,
              feature_log: dict[str, tuple[float, ...]] | None = None) -> dict[str, Any]:
        """Compare a mode's predictions with the reference features and scores of the inputs it answered."""
        expected = self._reference(model, count)
        return compare(expected, self._tags[model], values, feature_log)

    def _reference(self, model: str, count: int) -> Expected:
        key = (model, count)
        if key not in self._references:
            runtime = load_model(str(self.plan.models[model]))
            self._tags[model] = runtime.info.tag
            self._references[key] = reference(
                zip(self.partitions[:count], (v for _, v in self.inputs[:count]), strict=True), runtime)
        return self._references[key]

    async def _load(self, run: Run, watch: OffsetWatch, generator: TransactionGenerator, fraction: float,
                    rate: float) -> dict[str, Any]:
        label = f"{run.mode} ({run.model}): {fraction:.0%} load, {rate:,.0f}/s"
        task = self.progress.add_task(label, total=int(rate * (self.plan.warmup_s + self.plan.load_seconds)))
        start, in_start = await watch.offsets(), await end_offsets(run.bootstrap, run.topic("tx"))
        metrics_before = await _metrics_page(run)
        sent: dict[str, int] = {}
        # The first warmup_s seconds at this rate are not measured: the worker has just drained a backlog.
        # They count from the first record sent (the generator prepares the phase's records before that).
        measure_from_ms: int | None = None

        def on_sent(tx: dict[str, Any], ts_ms: int) -> None:
            nonlocal measure_from_ms
            if measure_from_ms is None:
                measure_from_ms = ts_ms + int(self.plan.warmup_s * 1000)
            if ts_ms >= measure_from_ms:
                sent[tx["id"]] = ts_ms

        # Every record is drawn and encoded before the schedule starts: the generator shares the two cores
        # with the worker it measures, and sending is then all it does meanwhile.
        assert run.worker is not None
        worker_cpu = cpu_seconds(run.worker.pid)
        report = await produce(run.bootstrap, run.topic("tx"), rate=rate,
                               duration_s=self.plan.warmup_s + self.plan.load_seconds, generator=generator,
                               partitions=PARTITIONS, on_sent=on_sent, prepare=True,
                               on_progress=lambda done, _total: self.progress.update(task, completed=done))
        assert measure_from_ms is not None
        self.progress.remove_task(task)
        # The generator's cores while its schedule ran (this process), and the worker's CPU per event over the
        # phase (what it answered within the drain cap counts its work too).
        generator_cores = report.cpu_s / report.elapsed_s if report.elapsed_s else 0.0
        deadline = time.monotonic() + self.plan.drain_cap_s
        while time.monotonic() < deadline and await watch.total() - sum(start.values()) < report.sent:
            run.worker.check()
            await asyncio.sleep(0.1)
        worker_cpu = cpu_seconds(run.worker.pid) - worker_cpu
        cutoff_ms = int(time.time() * 1000)
        metrics_after = await _metrics_page(run)
        outputs = await read_range(run.bootstrap, run.topic("pred"), start, await watch.offsets())
        # The inputs' own broker timestamps: latency starts when the input record reached Kafka.
        inputs = await read_range(run.bootstrap, run.topic("tx"), in_start,
                                  await end_offsets(run.bootstrap, run.topic("tx")))
        appended = {tx_id: ts for ts, tx_id in ((ts, _id_of(v)) for ts, v in inputs) if tx_id in sent}
        answered: dict[str, int] = {}
        for ts, value in outputs:
            tx_id = _id_of(value)
            if tx_id in appended and tx_id not in answered:
                answered[tx_id] = ts - appended[tx_id]
        censored = [cutoff_ms - ts for tx_id, ts in appended.items() if tx_id not in answered]
        lag = np.asarray([appended[i] - sent[i] for i in appended], dtype=np.float64)
        result = {"load": fraction, "offered_per_s": round(rate), "sent": len(sent),
                  "send_rate": round(report.rate), "answered": len(answered), "unanswered": len(censored),
                  "send_lag_ms": {"p50": float(np.percentile(lag, 50)), "p99": float(np.percentile(lag, 99))}
                  if len(lag) else {},
                  "p99_ms_by_second": p99_by_second(sent, answered, measure_from_ms),
                  "worker_cpu_us_per_event": _round(worker_cpu / report.sent * 1e6) if report.sent else None,
                  "generator_cores": round(generator_cores, 3),
                  **latency_percentiles(list(answered.values()), censored)}
        if metrics_before is not None and metrics_after is not None:
            result["worker"] = worker_stages(since(metrics_after, metrics_before))
        return result


def latency_percentiles(observed: list[int], censored: list[int]) -> dict[str, Any]:
    """Percentiles over answered latencies and unanswered inputs' ages (lower bounds, flagged)."""
    values = np.asarray(observed + censored, dtype=np.float64)
    if not len(values):
        return {}
    out: dict[str, Any] = {"max_ms": float(values.max()), "lower_bound": []}
    for name, q in PERCENTILES.items():
        out[f"{name}_ms"] = round(float(np.percentile(values, q, method="higher")), 2)
        # The percentile is only a lower bound once it reaches into the unanswered inputs.
        if len(censored) > (1 - q / 100) * len(values):
            out["lower_bound"].append(name)
    return out


async def run_all(plan: Plan, bootstrap: str, workdir: Path, progress: Progress,
                  log: Callable[[str], None], secured: Connection | None = None) -> dict[str, Any]:
    """Ceiling B, then per model: seam adaptive, SASL_SSL (on ``secured``), ceiling A (first model only), the
    other modes."""
    bench = Bench(plan, bootstrap, workdir, progress, secured)
    results: dict[str, Any] = {"ort": bench.ort_ceiling(), "modes": {}}
    if not plan.quick:
        await bench.warm_up(next(iter(plan.models)))
    for index, model in enumerate(plan.models):
        # SASL_SSL right after the plaintext run it is compared with, so the machine has the least time to drift.
        order = [m for m in ("seam-adaptive", SECURED, CEILING) if m in plan.modes and (index == 0 or m != CEILING)]
        order += [m for m in plan.modes if m not in order and m != CEILING]
        results["modes"][model] = {}
        for mode in order:
            anchor = f"seam-adaptive/{model}"
            results["modes"][model][mode] = result = await bench.mode(mode, model, anchor)
            sat = result["saturation"]
            log(f"{mode:<14} {model:<8} {sat['events_per_s']:>8,} events/s  "
                + "  ".join(f"{p['load']:.0%}: p99 {p.get('p99_ms', float('nan')):,.1f} ms" for p in result["latency"]))
    if CEILING in plan.modes:
        results["ceiling_a"] = results["modes"][next(iter(plan.models))].pop(CEILING)
    return results
