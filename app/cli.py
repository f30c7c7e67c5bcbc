"""seam's own commands beside Faust's (``seam produce``)."""

from __future__ import annotations

import time

from faust.cli import AppCommand, option
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from app.loadgen import produce
from app.main import app, settings
from app.synthetic import TransactionGenerator

__all__ = ["produce_command"]


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
