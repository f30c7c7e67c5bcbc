"""How a worker logs: Faust's worker without its terminal spinner, and optionally one JSON object per line.

Faust's worker draws a progress spinner on every log record when its level is WARN or above, and to
see every record it sets the root logger to DEBUG: every library then builds a log record for each
debug call (aiokafka one per message sent) only for the handler to drop it. :class:`SeamWorker`
has no spinner, so the root logger stays at the level ``-l`` asks for.

``SEAM_LOG_FORMAT=json`` writes each record as one JSON object per line, for log collectors:
``{"time": "2026-12-01T21:30:05.123Z", "level": "INFO", "logger": "app.scoring", "message": "...",
"worker": "<canonical url>"}`` plus ``"error"`` (the formatted exception) when there is one.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import faust
import orjson

from tables.faust_compat import without_spinner

__all__ = ["JsonFormatter", "SeamWorker", "logging_config"]


class SeamWorker(faust.Worker):
    """Faust's worker without the terminal spinner (which would set the root logger to DEBUG)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        without_spinner(self)


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def __init__(self, worker: str = "") -> None:
        super().__init__()
        self._worker = worker

    def format(self, record: logging.LogRecord) -> str:
        seconds = record.created
        entry: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{int(seconds % 1 * 1000):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if self._worker:
            entry["worker"] = self._worker
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["error"] = record.exc_text
        return orjson.dumps(entry, default=str).decode()


def logging_config(log_format: str, worker: str = "") -> dict[str, Any] | None:
    """The ``logging_config`` for Faust's worker: ``None`` keeps Faust's own (text) format."""
    if log_format == "text":
        return None
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "merge": True,  # onto mode's configuration: the root level stays the one -l gives
        "formatters": {"json": {"()": JsonFormatter, "worker": worker}},
        "handlers": {"default": {"class": "logging.StreamHandler", "formatter": "json",
                                 "stream": "ext://sys.stdout"}},
    }
