"""The live dashboard in a real browser: its numbers move under load and match the worker's /metrics."""

from __future__ import annotations

import asyncio
import os
import re
import threading
import time
import uuid
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.loadgen import produce
from app.localhost import free_port
from app.synthetic import TransactionGenerator
from tests.integration.browser import chromium
from tests.integration.kafka_helpers import Topics, Worker, prepare_topics, produce_raw

pytestmark = pytest.mark.integration

RATE, LOAD_S = 400, 14
SCREENSHOT = os.environ.get("DASHBOARD_SCREENSHOT")  # also save the screenshot there (docs/dashboard.png)


def samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    return [(s.labels, s.value) for family in text_string_to_metric_families(text) for s in family.samples
            if s.name == name]


def total(text: str, name: str, **where: str) -> float:
    return sum(value for labels, value in samples(text, name) if all(labels.get(k) == v for k, v in where.items()))


def shown(driver, element_id: str) -> float:  # type: ignore[no-untyped-def]
    text = driver.find_element("id", element_id).text.replace(",", "")
    return float(text) if text not in ("", "–") else float("nan")


def wait_for(condition, timeout_s: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def test_dashboard_is_live_and_matches_metrics(kafka_bootstrap: str, tmp_path: Path) -> None:
    topics = Topics.unique(uuid.uuid4().hex[:10])
    prepare_topics(kafka_bootstrap, topics)
    load_error: list[BaseException] = []

    def load() -> None:
        generator = TransactionGenerator(cards=500, seed=3, late_rate=0.02, id_prefix="db")
        try:
            asyncio.run(produce(kafka_bootstrap, topics.input, rate=RATE, duration_s=LOAD_S, generator=generator,
                                partitions=4))
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            load_error.append(exc)

    with chromium() as driver:  # before the worker starts: where there is no browser, no worker is left running
        worker = Worker(kafka_bootstrap, topics.env(), tmp_path / "worker", free_port())
        try:
            worker.wait_ready()
            asyncio.run(produce_raw(kafka_bootstrap, topics.input, [(b"card-x", b"{not json"), (b"card-y", b"[]")]))
            loader = threading.Thread(target=load)
            loader.start()
            load_started = time.monotonic()
            driver.get(f"http://127.0.0.1:{worker.web_port}/dashboard/")
            updated = lambda: int(driver.find_element("tag name", "body").get_attribute("data-updated"))  # noqa: E731
            first = wait_for(lambda: shown(driver, "events-scored-total") > 0 and shown(driver, "events-scored-total"),
                             60, "the page to show predictions delivered")
            seen_at = updated()
            wait_for(lambda: updated() > seen_at, 10, "the page to update by itself")
            second = wait_for(lambda: shown(driver, "events-scored-total") > first and
                              shown(driver, "events-scored-total"), 10, "predictions delivered to rise on the page")
            assert second > first
            wait_for(lambda: driver.find_element("css selector", "#lag tbody td").text.isdigit(), 10,
                     "the lag table to list partitions")
            rate_in = wait_for(lambda: shown(driver, "rate-in") > 0 and shown(driver, "rate-in"), 10,
                               "a throughput on the page")
            assert 100 < rate_in < 2000, rate_in  # RATE events/s offered
            driver.save_screenshot(str(tmp_path / "dashboard.png"))
            if SCREENSHOT:  # with as much of the load's history on the charts as there will be
                loader.join(max(0.0, load_started + LOAD_S - 1.5 - time.monotonic()))
                driver.save_screenshot(SCREENSHOT)
            loader.join(60)
            assert not load_error, load_error
            # Once the load has stopped and every prediction is out, the page shows what /metrics says.
            def settled() -> str | None:
                before = worker.get("/metrics")[1].decode()
                time.sleep(1.0)
                after = worker.get("/metrics")[1].decode()
                done = total(after, "seam_events_in_total") >= RATE * LOAD_S + 2
                still = total(before, "seam_events_out_total") == total(after, "seam_events_out_total")
                return after if done and still else None
            metrics = wait_for(settled, 60, "every input answered")
            since = int(time.time() * 1000)
            wait_for(lambda: updated() > since, 10, "a page update after the metrics settled")
            assert shown(driver, "events-scored-total") == total(metrics, "seam_events_out_total",
                                                                 topic_kind="prediction")
            assert shown(driver, "events-in-total") == total(metrics, "seam_events_in_total")
            owned = sorted(int(labels["partition"]) for labels, _ in samples(metrics, "seam_assigned_partitions"))
            assert owned == [0, 1, 2, 3]
            assert driver.find_element("id", "owned").text == "input partitions 0, 1, 2, 3"
            lag_rows = driver.find_elements("css selector", "#lag tbody tr")
            assert [row.find_elements("tag name", "td")[0].text for row in lag_rows] == ["0", "1", "2", "3"]
            assert sum(float(row.find_elements("tag name", "td")[1].text.replace(",", "")) for row in lag_rows) == \
                total(metrics, "seam_consumer_lag_records")
            (model_labels, _), = samples(metrics, "seam_model_info")
            assert driver.find_element("id", "model").text == \
                f"model {model_labels['model']}@{model_labels['version']} on {model_labels['provider']}"
            # Traffic and scores per version: the one version serving, as many rows as its scores on /metrics.
            headers = [th.text for th in driver.find_elements("css selector", "#models thead th")]
            assert headers == ["version", "role", "rows / s", "rows", "mean score", "score p99", "score > 0.5"], headers
            assert driver.find_element("css selector", "#models").find_element("xpath", "..").text.splitlines()[1] \
                .startswith(headers[0]), "nothing stray between the table's heading and the table"
            model_rows = driver.find_elements("css selector", "#models tbody tr")
            cells = [[td.text for td in row.find_elements("tag name", "td")] for row in model_rows]
            tag = f"{model_labels['model']}@{model_labels['version']}"
            assert [c[:2] for c in cells] == [[tag, "primary"]], cells
            assert float(cells[0][3].replace(",", "")) == total(metrics, "seam_scores_count") == \
                total(metrics, "seam_events_out_total", topic_kind="prediction")
            assert driver.find_element("id", "revision").text == "deployment 0"
            # Every scored input looked its card up once: a hit or a table read.
            assert total(metrics, "seam_state_cache_lookups_total") >= total(
                metrics, "seam_events_out_total", topic_kind="prediction") > 0
            cache_line = driver.find_element("id", "cache").text
            assert cache_line.startswith("state cache: ") and "table reads p99" in cache_line, cache_line
            assert re.search(r"RocksDB memory [0-9.,]+ of 64 MiB", cache_line), cache_line
            cache_limit = total(metrics, "seam_state_cache_limit_bytes")
            assert cache_limit > 0
            assert re.search(rf"^state cache: [0-9.,]+ of {int(cache_limit / 1048576 + 0.5):,} MiB, ", cache_line), \
                cache_line
            rejects = driver.find_element("id", "rejects").text
            assert "dead letter: invalid_json" in rejects and "dead letter: not_an_object" in rejects
            assert total(metrics, "seam_dead_letters_total") == 2
            cluster = wait_for(lambda: "this one" in driver.find_element("id", "cluster").text and
                               driver.find_element("id", "cluster").text, 10, "the cluster table")
            assert "0, 1, 2, 3" in cluster
        finally:
            assert worker.stop() == 0, worker.log_tail()
