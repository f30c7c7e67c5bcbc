"""Prometheus for real: promtool checks the shipped configuration, the server scrapes a live worker, and
every query of the shipped Grafana dashboard runs against what it scraped."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.loadgen import produce
from app.localhost import free_port
from app.synthetic import TransactionGenerator
from tests.conftest import ROOT
from tests.integration.kafka_helpers import Topics, Worker, prepare_topics, program_missing

pytestmark = pytest.mark.integration

MONITORING = ROOT / "docs" / "monitoring"


def query(server: str, expr: str) -> dict[str, Any]:
    url = f"{server}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
    with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 - the local server
        answer: dict[str, Any] = json.load(response)
    return answer


def metric(text: str, name: str) -> float:
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


def test_prometheus_scrapes_a_worker_and_the_dashboard_queries_run(kafka_bootstrap: str, tmp_path: Path) -> None:
    prometheus, promtool = shutil.which("prometheus"), shutil.which("promtool")
    if not (prometheus and promtool):
        program_missing("no prometheus/promtool here (Debian: apt-get install prometheus; make test installs it "
                        "where it can)")
    checked = subprocess.run([promtool, "check", "config", str(MONITORING / "prometheus.yml")],
                             capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr

    topics = Topics.unique(uuid.uuid4().hex[:10])
    prepare_topics(kafka_bootstrap, topics)
    worker = Worker(kafka_bootstrap, topics.env(), tmp_path / "worker", free_port())
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        f"  - job_name: seam\n    static_configs: [{{targets: ['127.0.0.1:{worker.web_port}']}}]\n")
    checked = subprocess.run([promtool, "check", "config", str(config)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    port = free_port()
    server = f"http://127.0.0.1:{port}"
    log = (tmp_path / "prometheus.log").open("wb")
    process: subprocess.Popen[bytes] | None = None
    try:
        worker.wait_ready()
        process = subprocess.Popen(
            [prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"], stdout=log, stderr=subprocess.STDOUT)
        up: list[dict[str, Any]] = []
        deadline = time.monotonic() + 60
        while not up and time.monotonic() < deadline and process.poll() is None:
            with contextlib.suppress(OSError):  # not listening yet
                up = query(server, 'up{job="seam"} == 1')["data"]["result"]
            time.sleep(0.3)
        assert up, f"Prometheus did not scrape the worker: {(tmp_path / 'prometheus.log').read_text()}"
        generator = TransactionGenerator(cards=200, seed=9, id_prefix="pm")
        # Scraped while the load runs, so rates over the last minute have samples to work with.
        asyncio.run(produce(kafka_bootstrap, topics.input, rate=500, duration_s=5, generator=generator, partitions=4))
        deadline = time.monotonic() + 60
        scraped: list[dict[str, Any]] = []
        while time.monotonic() < deadline and process.poll() is None:
            try:
                scraped = query(server, 'seam_events_in_total{job="seam"}')["data"]["result"]
                rising = query(server, "sum(rate(seam_events_in_total[1m])) > 0")["data"]["result"]
            except OSError:
                scraped = rising = []
            if scraped and rising and float(scraped[0]["value"][1]) >= 2500:
                break
            time.sleep(0.5)
        assert process.poll() is None, (tmp_path / "prometheus.log").read_text()
        assert scraped, "Prometheus never scraped seam_events_in_total"
        value = float(scraped[0]["value"][1])
        assert 2500 <= value <= metric(worker.get("/metrics")[1].decode(), "seam_events_in_total")
        lag = query(server, "sum by (partition) (seam_consumer_lag_records)")["data"]["result"]
        assert sorted(int(series["metric"]["partition"]) for series in lag) == [0, 1, 2, 3]
        # Every panel of the shipped Grafana dashboard asks Prometheus something it can answer.
        dashboard = json.loads((MONITORING / "grafana" / "dashboards" / "seam.json").read_text())
        expressions = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
        assert len(expressions) >= 12
        for expr in expressions:
            answer = query(server, expr)
            assert answer["status"] == "success", (expr, answer)
        empty = [expr for expr in expressions if not query(server, expr)["data"]["result"]
                 and "dead_letters" not in expr and "late_records" not in expr and "deadline" not in expr]
        assert not empty, f"dashboard queries with no data from a live worker: {empty}"
    finally:
        if process is not None:
            process.terminate()
            process.wait(30)
        log.close()
        assert worker.stop() == 0, worker.log_tail()
