"""``python -m bench`` / ``seam bench`` / ``make bench``: run the benchmark and write its results.

    .venv/bin/python -m bench                       # full run (~10 min on 2 cores); local broker on $KAFKA_PORT
    .venv/bin/python -m bench --quick               # smoke-sized run, default model only (~1 min)
    .venv/bin/python -m bench --out docs --write docs/BENCHMARKS.md   # what `make bench` runs

Without ``--bootstrap`` it uses the broker of ``scripts/kafka_local.py`` on ``$KAFKA_PORT`` (9092), starting
it if it is not running and stopping it afterwards if it started it. The SASL_SSL mode (``seam-sasl-ssl``)
runs on a second, secured local broker (``kafka_local.py up --secure`` on free ports) that the run starts
and stops (``--secured-bootstrap`` and the other ``--secured-*`` options name a SASL_SSL cluster already
running instead); without the JDK's ``keytool`` that broker cannot make its certificates, and the mode is
skipped with a message saying so. It writes ``bench-results.json`` and
the plots (``bench-*.png``) into ``--out`` and, with ``--write``, replaces the "End to end" section of that
Markdown file.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from app.localhost import interrupt_on_sigterm
from bench.harness import MODES, ROOT, SECURED, Plan, run_all
from bench.secured import MissingKeytool, SecuredBroker
from tables.kafka import Connection

__all__ = ["BENCH_MODEL", "build_parser", "ensure_bench_model", "main", "run"]

DEFAULT_MODEL = ROOT / "models" / "fraud-mlp.onnx"
BENCH_MODEL = ROOT / "models" / "fraud-mlp-bench.onnx"
BENCH_MODEL_ARGS = ["--bench-depth", "2000", "--name", "fraud-mlp-bench", "--out", str(BENCH_MODEL)]
KAFKA_LOCAL = ROOT / "scripts" / "kafka_local.py"
console = Console(stderr=True)


def ensure_bench_model() -> Path:
    """Build the benchmark model with the model script if it is missing (deterministic, ~5 s)."""
    if not BENCH_MODEL.exists():
        console.print(f"building the benchmark model {BENCH_MODEL.name} ...")
        subprocess.run([sys.executable, str(ROOT / "scripts" / "train_model.py"), *BENCH_MODEL_ARGS], check=True,
                       cwd=ROOT)
    return BENCH_MODEL


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small and short: checks the harness, not speed")
    parser.add_argument("--bootstrap", help="use this broker (host:port) instead of the local one")
    parser.add_argument("--secured-bootstrap", metavar="HOST:PORT",
                        help="the SASL_SSL mode's cluster (default: a secured local broker the run starts), as "
                             "--secured-user with the password in --secured-password-file, trusting --secured-ca")
    parser.add_argument("--secured-user", default="admin", help="with --secured-bootstrap: the SCRAM user (one the "
                        "cluster's ACLs let create, read and write the run's topics and groups)")
    parser.add_argument("--secured-password-file", type=Path, help="with --secured-bootstrap: the user's password")
    parser.add_argument("--secured-ca", type=Path, help="with --secured-bootstrap: the CA of the brokers' certificates")
    parser.add_argument("--secured-mechanism", default="SCRAM-SHA-512", help="with --secured-bootstrap (default: "
                        "%(default)s)")
    parser.add_argument("--out", type=Path, default=ROOT / ".data" / "bench", help="folder for JSON and plots")
    parser.add_argument("--write", type=Path, help="replace the 'End to end' section of this Markdown file")
    parser.add_argument("--models", help="comma separated: default, bench (default: both; with --quick: default)")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma separated subset of {','.join(MODES)}")
    parser.add_argument("--seam-env", action="append", default=[], metavar="SEAM_NAME=VALUE",
                        help="a setting for the seam modes (repeatable), e.g. SEAM_MAX_INFLIGHT_BATCHES=8")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    parser.add_argument("--report-only", type=Path, metavar="JSON",
                        help="measure nothing: write the plots and Markdown of an earlier results file")
    return parser


def make_plan(args: argparse.Namespace) -> Plan:
    paths = {"default": DEFAULT_MODEL, "bench": BENCH_MODEL}
    names = [m for m in (args.models or ("default" if args.quick else "default,bench")).split(",") if m]
    unknown = [m for m in names if m not in paths] + [m for m in args.modes.split(",") if m and m not in MODES]
    if unknown:
        raise SystemExit(f"bench: unknown model or mode {unknown}")
    ensure_bench_model()
    modes = tuple(m for m in MODES if m in args.modes.split(","))
    models = {m: paths[m] for m in names}
    seam_env = dict(item.split("=", 1) for item in args.seam_env)
    if any(not name.startswith("SEAM_") for name in seam_env):
        raise SystemExit(f"bench: --seam-env takes SEAM_NAME=VALUE, got {args.seam_env}")
    if args.quick:
        return Plan(models, paths, modes, quick=True, sat_records=5_000, sat_cap_s=30.0, sat_passes=2,
                    ceiling_records=20_000,
                    loads=(0.5,), load_seconds=1.5, warmup_s=0.5, drain_cap_s=2.0, ort_seconds=0.02, cards=500,
                    capacity_probes=1,
                    seam_env=seam_env)
    return Plan(models, paths, modes, seam_env=seam_env)


class LocalBroker:
    """The broker of ``scripts/kafka_local.py`` on $KAFKA_PORT; started (and later stopped) only if needed."""

    def __init__(self) -> None:
        self.port = int(os.environ.get("KAFKA_PORT", "9092"))
        self.started = False
        self.run_dir: Path | None = None  # a broker started here keeps its data there, removed after

    def _call(self, action: str) -> subprocess.CompletedProcess[str]:
        where = ["--run-dir", str(self.run_dir)] if self.run_dir is not None else []
        return subprocess.run([sys.executable, str(KAFKA_LOCAL), action, "--port", str(self.port), *where],
                              capture_output=True, text=True, cwd=ROOT)

    def __enter__(self) -> str:
        if self._call("status").returncode != 0:
            self.run_dir = Path(tempfile.mkdtemp(prefix="seam-bench-kafka-"))
            up = self._call("up")
            if up.returncode != 0:
                raise SystemExit(f"bench: could not start Kafka:\n{up.stdout}{up.stderr}")
            self.started = True
        return f"127.0.0.1:{self.port}"

    def __exit__(self, *exc: object) -> None:
        if self.started:
            self._call("down")
        if self.run_dir is not None:
            shutil.rmtree(self.run_dir, ignore_errors=True)


def given_cluster(args: argparse.Namespace) -> Connection:
    """The SASL_SSL mode's cluster named by ``--secured-*`` (one already running)."""
    if args.secured_password_file is None:
        raise SystemExit("bench: --secured-bootstrap needs --secured-password-file")
    try:
        password = args.secured_password_file.read_text().rstrip("\r\n")
    except OSError as exc:
        raise SystemExit(f"bench: cannot read --secured-password-file: {exc.strerror}") from None
    return Connection(args.secured_bootstrap, "SASL_SSL", args.secured_mechanism, args.secured_user, password,
                      str(args.secured_ca or ""))


async def run(args: argparse.Namespace, command: str, bootstrap: str) -> dict[str, Any]:
    """Run the plan against ``bootstrap``; write the JSON, the plots and the Markdown section."""
    from bench import report

    plan = make_plan(args)
    started = time.monotonic()
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    skipped: dict[str, str] = {}
    with contextlib.ExitStack() as stack:
        secured: Connection | None = None
        if SECURED in plan.modes and args.secured_bootstrap:
            secured = given_cluster(args)
        elif SECURED in plan.modes:
            # Up for the whole run, so that every mode shares the machine with the same two brokers.
            try:
                secured = stack.enter_context(SecuredBroker())
            except MissingKeytool as exc:
                skipped[SECURED] = str(exc)
                console.print(f"bench: skipping {SECURED}: {exc}")
                plan = dataclasses.replace(plan, modes=tuple(m for m in plan.modes if m != SECURED))
            except RuntimeError as exc:
                raise SystemExit(f"bench: {exc}") from None
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="seam-bench-"))
        progress = stack.enter_context(Progress(*columns, console=console))
        results = await run_all(plan, bootstrap, Path(tmp), progress, progress.console.print, secured)
    if skipped:
        results["skipped"] = skipped
    results["plan"] = {name: getattr(plan, name) for name in (
        "quick", "sat_records", "sat_cap_s", "sat_passes", "ceiling_records", "load_seconds", "warmup_s",
        "drain_cap_s", "cards", "capacity_probes")}
    results["plan"]["loads"] = list(plan.loads)
    results["plan"]["seam_env"] = plan.seam_env
    results["command"] = command
    results["duration_s"] = round(time.monotonic() - started, 1)
    results["machine"] = report.machine()
    results["models"] = {name: report.model_info(path) for name, path in plan.ort_models.items()}
    results["targets"] = report.targets(results)
    results["tls_cost"] = report.tls_cost(results)
    args.out.mkdir(parents=True, exist_ok=True)
    report.write_json(results, args.out / "bench-results.json")
    if not args.no_plots:
        report.plots(results, args.out)
    if args.write:
        report.write_markdown(results, args.write, args.out)
    print(report.markdown(results, args.out))
    return results


def main(argv: list[str] | None = None) -> int:
    interrupt_on_sigterm()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.report_only:
        from bench import report

        results = json.loads(args.report_only.read_text())
        args.out.mkdir(parents=True, exist_ok=True)
        if not args.no_plots:
            report.plots(results, args.out)
        if args.write:
            report.write_markdown(results, args.write, args.out)
        print(report.markdown(results, args.out))
        return 0
    command = " ".join([".venv/bin/python -m bench", shlex.join(argv)]).strip()
    if args.bootstrap:
        asyncio.run(run(args, command, args.bootstrap))
        return 0
    with LocalBroker() as bootstrap:
        asyncio.run(run(args, command, bootstrap))
    return 0
