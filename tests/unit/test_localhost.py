"""What a failed child process's log shows: its tail, and the cause that scrolled out of it."""

from __future__ import annotations

import sys
from pathlib import Path

from app.localhost import Subprocess


def _finished(tmp_path: Path, lines: list[str]) -> Subprocess:
    child = Subprocess([sys.executable, "-c", "pass"], {}, tmp_path / "child.log")
    assert child.wait_exit(60) == 0 and child.stop() == 0
    (tmp_path / "child.log").write_text("\n".join(lines) + "\n")
    return child


def test_the_first_traceback_is_shown_above_a_tail_it_scrolled_out_of(tmp_path: Path) -> None:
    traceback = ["Traceback (most recent call last):", '  File "x.py", line 1, in f', "KafkaError: closed"]
    child = _finished(tmp_path, ["started", "sending", *traceback, *(f"retry {i}" for i in range(100))])
    shown = child.log_tail(lines=5, traceback_lines=3).splitlines()
    assert shown == ["[the log's first traceback, line 3:]", "started", "sending", *traceback,
                     "[... the log's last 5 lines:]", *(f"retry {i}" for i in range(95, 100))]


def test_a_tail_that_holds_the_traceback_or_has_none_is_just_the_tail(tmp_path: Path) -> None:
    lines = [f"line {i}" for i in range(10)] + ["Traceback (most recent call last):", "ValueError: x"]
    assert _finished(tmp_path, lines).log_tail(lines=4).splitlines() == lines[-4:]
    quiet = [f"line {i}" for i in range(10)]
    assert _finished(tmp_path / "quiet", quiet).log_tail(lines=3).splitlines() == quiet[-3:]
