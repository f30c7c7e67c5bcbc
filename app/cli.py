"""seam's own commands beside Faust's (``seam produce``, ``seam bench``), added to an app by :func:`register`."""

from __future__ import annotations

import time

import faust
from faust.cli import AppCommand, option
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from app.loadgen import produce
from app.settings import Settings
from app.synthetic import TransactionGenerator

__all__ = ["register"]


def register(app: faust.App, settings: Settings) -> None:
    """Add ``seam produce`` and ``seam bench`` to ``app``'s command line."""

    @app.command(
        option("--rate", type=float, default=1000.0, show_default=True, help="Transactions per second."),
        option("--duration", type=float, default=30.0, show_default=True, help="Seconds to produce for."),
        option("--cards", type=int, default=1000, show_default=True, help="Distinct cards."),
        option("--seed", type=int, default=None, help="Random seed (default: time based)."),
        option("--topic", default=None, help="Topic (default: SEAM_INPUT_TOPIC)."),
        option("--late-rate", type=float, default=0.001, show_default=True,
               help="Share of events that arrive minutes late."),
        option("--start-ms", type=int, default=None,
               help="Event time of the first transaction (default: now). Synthetic event time runs far "
                    "ahead of the wall clock; a later run on the same topic needs a later start."),
        name="produce",
    )
    async def produce_command(
        self: AppCommand, rate: float, duration: float, cards: int, seed: int | None,
        topic: str | None, late_rate: float, start_ms: int | None,
    ) -> None:
        """Produce realistic synthetic transactions at a fixed rate (open loop)."""
        seed = int(time.time()) if seed is None else seed
        start_ms = int(time.time() * 1000) if start_ms is None else start_ms
        generator = TransactionGenerator(cards=cards, seed=seed, id_prefix=f"tx{seed}", start_ms=start_ms,
                                         late_rate=late_rate)
        target = topic or settings.input_topic
        columns = (TextColumn("producing"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
        with Progress(*columns) as progress:
            task = progress.add_task("produce", total=int(rate * duration))
            report = await produce(
                settings.broker_bootstrap, target, rate=rate, duration_s=duration, generator=generator,
                partitions=settings.topic_partitions,
                on_progress=lambda done, _total: progress.update(task, completed=done))
        self.say(f"sent {report.sent} transactions ({report.fraud} in fraud bursts) to {target!r} "
                 f"in {report.elapsed_s:.1f}s ({report.rate:.0f}/s); last event time {generator.last_ts_ms} "
                 f"(pass a later --start-ms to a next run on this topic)")


    @app.command(
        option("--quick", is_flag=True, default=False, help="Small and short: checks the harness, not speed."),
        option("--out", default=None, help="Folder for the JSON results and the plots (default: .data/bench)."),
        option("--write", default=None, help="Replace the 'End to end' section of this Markdown file."),
        option("--models", default=None, help="Comma separated: default, bench."),
        option("--modes", default=None, help="Comma separated subset of the modes (default: all)."),
        name="bench",
    )
    async def bench_command(
        self: AppCommand, quick: bool, out: str | None, write: str | None, models: str | None, modes: str | None,
    ) -> None:
        """Benchmark seam against its baselines and ceilings on the configured broker (see docs/BENCHMARKS.md)."""
        try:
            from bench import cli as bench_cli
        except ImportError as exc:  # an install without the benchmark package or its extra
            raise SystemExit(f"seam bench needs the source checkout with the bench extra installed: {exc}") from None
        argv = ["--bootstrap", settings.broker_bootstrap, *(["--quick"] if quick else [])]
        for name, value in (("--out", out), ("--write", write), ("--models", models), ("--modes", modes)):
            argv += [name, value] if value else []
        args = bench_cli.build_parser().parse_args(argv)
        await bench_cli.run(args, "seam bench " + " ".join(argv[2:]), settings.broker_bootstrap)
