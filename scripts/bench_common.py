"""What the benchmarks share: a local broker for the run, and writing their table into a Markdown file."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import kafka_local
from rich.console import Console

__all__ = ["local_broker", "publish", "replace_section"]

ROOT = Path(__file__).resolve().parent.parent


@contextmanager
def local_broker(port: int, controller_port: int) -> Iterator[str]:
    """Yield the bootstrap address of the broker on ``port``; start one (stopped and removed after) if none answers."""
    with kafka_local.broker_for(port, controller_port, ROOT / ".cache" / "kafka") as (broker, _started):
        yield broker.bootstrap


def replace_section(path: Path, heading: str, section: str) -> None:
    """Put ``section`` (which starts with ``heading``) where ``heading`` was, or at the end of ``path``."""
    text = path.read_text() if path.exists() else "# Benchmarks\n\n"
    head, found, rest = text.partition(heading)
    tail = rest[rest.find("\n## ") + 1:] if found and "\n## " in rest else ""
    path.write_text(head.rstrip() + "\n\n" + section + ("\n" + tail if tail else ""))


def publish(table: str, write: Path | None, heading: str) -> None:
    """Print a benchmark's Markdown table and, with ``--write``, replace its section in that file."""
    Console().print(table)
    if write is not None:
        replace_section(write, heading, table)
