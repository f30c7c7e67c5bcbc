"""Smoke test of the benchmark harness (``seam bench --quick``) against the real broker.

It checks the harness, never timing: every mode answered every pre-loaded input with exactly the features
and (within float32 rounding) the scores of the reference, the latency phase ran, and the files were written.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.harness import CEILING, MODES, SECURED
from tests.integration.kafka_helpers import Secured

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PNG = b"\x89PNG\r\n\x1a\n"


def test_quick_bench_runs_every_mode_with_identical_predictions(
        kafka_bootstrap: str, secured: Secured, tmp_path: Path) -> None:
    doc = tmp_path / "BENCHMARKS.md"
    doc.write_text("# Benchmarks\n\nintro\n\n## Ingestion\n\nkept\n")
    # The SASL_SSL mode on the session's secured broker, as its super user (no ACL to look up: TLS and SASL alone)
    password = tmp_path / "admin.password"
    password.write_text(secured.passwords["admin"])
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--bootstrap", kafka_bootstrap, "--out", str(tmp_path),
         "--write", str(doc), "--secured-bootstrap", secured.bootstrap, "--secured-password-file", str(password),
         "--secured-ca", str(secured.ca_file)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    results = json.loads((tmp_path / "bench-results.json").read_text())

    modes = results["modes"]["default"]
    assert set(modes) == set(MODES) - {CEILING}
    for mode, entry in modes.items():
        check = entry["correctness"]
        assert check["expected"] == results["plan"]["sat_records"], mode
        assert check["missing"] == check["unexpected"] == 0, (mode, check)
        assert check["feature_mismatches"] == check["score_mismatches"] == check["flag_mismatches"] == 0, (mode, check)
        assert check["wrong_model"] == 0, (mode, check)
        assert entry["saturation"]["drained"] and entry["saturation"]["events_per_s"] > 0, (mode, entry)
        (phase,) = entry["latency"]
        # A mode that saturates below the offered rate is reported as overloaded instead of measured.
        overloaded = phase["offered_per_s"] > entry["saturation"]["events_per_s"]
        assert phase.get("overloaded", False) == overloaded, (mode, phase)
        if not overloaded:
            assert phase["sent"] > 0 and phase["answered"] > 0 and "p99_ms" in phase, (mode, phase)
    assert not modes["seam-adaptive"]["latency"][0].get("overloaded")
    # The modes the others are read against drain the backlog once per pass, each on a fresh worker.
    for entry in (modes["seam-adaptive"], results["ceiling_a"]):
        assert len(entry["saturation"]["passes"]) == results["plan"]["sat_passes"] == 2, entry["saturation"]
    assert "passes" not in modes["seam-fixed"]["saturation"]
    # SASL_SSL on a secured broker of the run's own, at seam adaptive's offered rate, compared with it
    assert modes[SECURED]["latency"][0]["offered_per_s"] == modes["seam-adaptive"]["latency"][0]["offered_per_s"]
    (cost,) = results["tls_cost"]
    assert cost["model"] == "default" and cost["saturation_ratio"] > 0 and len(cost["points"]) == 1
    # seam's own stage times for the phase, read from the worker's /metrics before and after it
    stages = modes["seam-adaptive"]["latency"][0]["worker"]
    assert {"end_to_end", "ingest", "queue", "inference", "delivery"} <= set(stages), stages
    assert stages["end_to_end"]["p99_ms"] >= stages["queue"]["p50_ms"] > 0, stages
    # What the worker's process spent per event over the phase, and the generator's cores meanwhile (from the kernel)
    phase = modes["seam-adaptive"]["latency"][0]
    assert phase["worker_cpu_us_per_event"] > 0 and phase["generator_cores"] > 0, phase
    ceiling = results["ceiling_a"]
    assert ceiling["saturation"]["outputs"] == results["plan"]["ceiling_records"]
    # The offered rate is half of seam adaptive's saturation (measured on 5,000 records, twenty model batches: a
    # burst of a few cannot make it look twice as fast as the passthrough), so the passthrough keeps up with it.
    (phase,) = ceiling["latency"]
    assert not phase.get("overloaded") and phase["answered"] > 0, (phase, ceiling["saturation"])

    # ONNX Runtime alone: both models, every batch size from 1 to 2048.
    assert set(results["ort"]) == {"default", "bench"}
    for rows in results["ort"].values():
        assert [r["batch_size"] for r in rows] == [2**i for i in range(12)]
        assert all(r["rows_per_s"] > 0 for r in rows)
    assert results["models"]["bench"]["tag"] == "fraud-mlp-bench@1"
    assert {t["target"].split(" (")[0] for t in results["targets"]} >= {"seam ≥ 25 % of ceiling A"}

    for name in ("bench-p99.png", "bench-saturation.png", "bench-ort.png"):
        assert (tmp_path / name).read_bytes()[:8] == PNG, name
    text = doc.read_text()
    assert text.startswith("# Benchmarks\n\nintro\n\n## Ingestion\n\nkept\n")
    assert "## End to end" in text and "| seam adaptive |" in text and "bench-p99.png" in text
    assert "### Where the time goes, by stage" in text
    assert "### What TLS costs" in text and "| seam adaptive, SASL_SSL |" in text
