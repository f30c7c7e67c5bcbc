"""Unit tests for app.logs: no spinner (the root logger keeps its level), JSON lines."""

from __future__ import annotations

import asyncio
import logging
import sys

import faust
import orjson

from app.logs import JsonFormatter, SeamWorker, logging_config


def test_the_worker_leaves_the_root_logger_at_the_level_asked_for() -> None:
    """Faust's spinner would set the root logger to DEBUG at -l warn; seam's worker has none."""
    loop = asyncio.new_event_loop()
    try:
        worker = SeamWorker(faust.App("seam-test-logs", autodiscover=False), loglevel="warn", loop=loop)
        root = logging.getLogger()
        before = root.level
        root.setLevel(logging.WARN)
        try:
            worker.on_setup_root_logger(root, logging.WARN)
            assert root.level == logging.WARN
            assert worker.spinner is None
        finally:
            root.setLevel(before)
    finally:
        loop.close()


def test_a_record_is_one_json_line() -> None:
    formatter = JsonFormatter(worker="http://w1:6066")
    record = logging.LogRecord("app.scoring", logging.INFO, __file__, 1, "rebalance: %s", ("done",), None)
    record.created = 1_796_160_000.25
    line = formatter.format(record)
    assert "\n" not in line
    assert orjson.loads(line) == {"time": "2026-12-01T21:20:00.250Z", "level": "INFO", "logger": "app.scoring",
                                  "message": "rebalance: done", "worker": "http://w1:6066"}
    try:
        raise ValueError("bad\nthing")
    except ValueError:
        failed = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    entry = orjson.loads(formatter.format(failed))
    assert entry["level"] == "ERROR" and "ValueError: bad\nthing" in entry["error"]


def test_text_keeps_faust_s_format() -> None:
    assert logging_config("text") is None
    config = logging_config("json", "http://w1:6066")
    assert config is not None and config["merge"] is True
    assert config["handlers"]["default"]["formatter"] == "json"
