"""Ceiling B: ONNX Runtime alone, no Kafka: rows/s and latency per call for batch sizes 1 to 2048."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from bench.job import load_model
from tables.features import DEFAULT_SPEC

__all__ = ["BATCH_SIZES", "measure_model"]

BATCH_SIZES = tuple(2**i for i in range(12))  # 1 .. 2048


def measure_model(path: str, seconds_per_size: float, on_size: Callable[[int], None] | None = None,
                  ) -> list[dict[str, float]]:
    """Call the model back to back for each batch size (at least 5 calls); report rows/s and call latency."""
    runtime = load_model(path)
    rng = np.random.default_rng(0)
    width = len(DEFAULT_SPEC.names)
    rows = []
    for size in BATCH_SIZES:
        batch = (rng.random((size, width)) * 100).astype(np.float32)
        runtime.predict(batch)  # first call allocates
        calls: list[float] = []
        started = time.perf_counter()
        while len(calls) < 5 or time.perf_counter() - started < seconds_per_size:
            t0 = time.perf_counter()
            runtime.predict(batch)
            calls.append(time.perf_counter() - t0)
        ms = np.asarray(calls) * 1000
        rows.append({"batch_size": size, "calls": len(calls),
                     "rows_per_s": round(size * len(calls) / ms.sum() * 1000),
                     "p50_ms": round(float(np.percentile(ms, 50)), 4),
                     "p99_ms": round(float(np.percentile(ms, 99)), 4)})
        if on_size is not None:
            on_size(size)
    return rows
