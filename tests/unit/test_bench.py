"""The benchmark's own logic: the correctness check, latency percentiles with unanswered inputs, Markdown."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from agents.formats.codec import feature_record
from app.settings import Settings
from app.synthetic import TransactionGenerator
from bench import report
from bench.capacity import kept_up, next_probe, p99_by_second
from bench.harness import (
    SECURED,
    combined_saturation,
    drain_cpu_per_event,
    latency_percentiles,
    steady_rate,
    worker_stages,
)
from bench.job import (
    THRESHOLD,
    compare,
    encode_prediction,
    feature_log_by_id,
    load_model,
    prepare,
    reference,
    score_one,
)
from bench.report import markdown, replace_section, tls_cost
from bench.secured import MissingKeytool, SecuredBroker, worker_settings
from tables.features import DEFAULT_SPEC, Watermark
from tables.kafka import Connection

MODEL = Path(__file__).resolve().parents[2] / "models" / "fraud-mlp.onnx"


@pytest.fixture(scope="module")
def scored() -> tuple[dict, str, list[bytes]]:
    """Reference results for 300 transactions and the prediction records a correct per-record mode writes."""
    runtime = load_model(str(MODEL))
    generator = TransactionGenerator(cards=20, seed=3, late_rate=0.0)
    records = [(hash(t["card_id"]) % 4, orjson.dumps(t)) for t, _ in (next(generator) for _ in range(300))]
    expected = reference(records, runtime)
    watermarks: dict[int, Watermark] = {}
    states: dict = {}
    values = []
    for partition, raw in records:
        done = prepare(raw, None, topic="t", partition=partition, offset=0,
                       watermark=watermarks.setdefault(partition, Watermark(60_000)),
                       load=states.get, store=states.__setitem__)
        assert done.tx is not None
        score, infer_ms = score_one(runtime, done.features)
        values.append(encode_prediction(runtime.info, done.tx, done.features, score, infer_ms))
    return expected, runtime.info.tag, values


def test_per_record_predictions_match_the_reference(scored: tuple[dict, str, list[bytes]]) -> None:
    expected, tag, values = scored
    result = compare(expected, tag, values)
    assert result["expected"] == 300 and result["answered"] == 300
    assert result["missing"] == result["unexpected"] == result["duplicates"] == 0
    assert result["feature_mismatches"] == result["score_mismatches"] == result["flag_mismatches"] == 0
    assert result["wrong_model"] == 0


def test_compare_reads_seams_features_from_its_feature_log(scored: tuple[dict, str, list[bytes]]) -> None:
    expected, tag, values = scored
    records = [orjson.loads(v) for v in values]
    predictions = [orjson.dumps({k: v for k, v in r.items() if k != "features"}) for r in records]
    feature_log = feature_log_by_id(
        feature_record(SimpleNamespace(id=r["id"], ts=r["ts"]), feature_set=DEFAULT_SPEC.version,  # type: ignore[arg-type]
                       features=r["features"]) for r in records)
    assert compare(expected, tag, predictions, feature_log)["feature_mismatches"] == 0
    feature_log[records[0]["id"]] = (0.0,) * len(records[0]["features"])
    assert compare(expected, tag, predictions, feature_log)["feature_mismatches"] == 1
    assert compare(expected, tag, predictions)["feature_mismatches"] == len(values)  # no features at all


def test_compare_counts_every_kind_of_difference(scored: tuple[dict, str, list[bytes]]) -> None:
    expected, tag, values = scored
    bad_features = orjson.loads(values[0])
    bad_features["features"][0] += 1  # count_60
    bad_score = orjson.loads(values[1])
    bad_score["score"] = 1.0 - bad_score["score"]
    bad_score["is_fraud"] = bad_score["score"] >= THRESHOLD
    other_model = orjson.loads(values[2]) | {"model": "other@1"}
    stranger = orjson.loads(values[3]) | {"id": "not-an-input"}
    tampered = [orjson.dumps(bad_features), orjson.dumps(bad_score), orjson.dumps(other_model),
                orjson.dumps(stranger), *values[4:-1], values[5]]
    result = compare(expected, tag, tampered)
    assert result["feature_mismatches"] == 1
    assert result["score_mismatches"] == 1 and result["max_score_diff"] > 0.01
    assert result["wrong_model"] == 1
    assert result["unexpected"] == 1
    assert result["missing"] == 2  # values[3] became the stranger, values[-1] was dropped
    assert result["duplicates"] == 1


def test_latency_percentiles_flag_lower_bounds() -> None:
    answered = list(range(1, 101))  # 1..100 ms
    assert latency_percentiles(answered, [])["p99_ms"] == 100  # the nearest rank at or above
    assert latency_percentiles(answered, [])["lower_bound"] == []
    # 5 of 105 inputs never answered, 5000 ms old at the cutoff: p99 and p99.9 reach into them, p50 does not.
    result = latency_percentiles(answered, [5000] * 5)
    assert result["p50_ms"] == 53
    assert result["p99_ms"] == 5000 and set(result["lower_bound"]) == {"p99", "p99.9"}


def test_steady_rate_leaves_out_the_ramp_at_either_end() -> None:
    # 1,000 outputs a second for 10 s, after a slow first second (a few outputs) and before a slow tail.
    steady = list(range(1_000, 11_000))
    stamps = sorted([0, 500, 900] + steady + [12_000, 15_000])
    rate, span_s = steady_rate(stamps)
    assert rate == pytest.approx(1_000, rel=0.01)
    assert span_s == pytest.approx(8.0, rel=0.01)
    assert steady_rate([5]) == (0.0, 0.0)
    assert steady_rate([0, 1_000])[0] == pytest.approx(1.0)


def test_saturation_of_several_passes_is_their_median_and_the_last_passs_run() -> None:
    def drained(rate: int, span_s: float, *, done: bool = True, cpu: float | None = 50.0) -> dict[str, Any]:
        return {"events_per_s": rate, "span_s": span_s, "outputs": 100, "drained": done,
                "worker_cpu_us_per_event": cpu}

    only = drained(15_000, 5.0)
    assert combined_saturation([only]) == only  # one pass: as measured, no list of one
    combined = combined_saturation([drained(21_540, 3.7, cpu=41.0), drained(13_741, 5.8, cpu=62.5),
                                    drained(16_316, 4.9, cpu=None)])
    # The middle rate, not the mean (17,199) nor the last; the rest is the last pass's, whose worker takes the load.
    # The CPU per event is the median of the passes that measured it.
    assert combined == {"events_per_s": 16_316, "span_s": 4.9, "outputs": 100, "drained": True,
                        "passes": [21_540, 13_741, 16_316], "worker_cpu_us_per_event": 51.8}
    assert combined_saturation([drained(10_000, 5.0), drained(12_001, 4.0)])["events_per_s"] == 11_000
    assert not combined_saturation([drained(9_000, 6.0, done=False), drained(12_000, 4.0)])["drained"]


def test_the_cpu_of_a_drain_counts_between_a_tenth_and_nine_tenths_of_its_outputs() -> None:
    # (outputs so far, CPU seconds): start-up costs 2 s before the first output, the steady part 50 µs an output,
    # the tail (the last outputs, then idle) more per output; only the middle counts.
    samples = [(0, 1.0), (0, 3.0), (5_000, 3.5), (20_000, 4.25), (60_000, 6.25), (90_000, 7.75), (99_000, 8.5),
               (100_000, 9.0)]
    assert drain_cpu_per_event(samples) == 50.0
    assert drain_cpu_per_event([]) is None
    assert drain_cpu_per_event([(0, 1.0), (0, 2.0)]) is None  # nothing came out
    assert drain_cpu_per_event([(0, 1.0), (100, 2.0)]) is None  # no two polls within the middle
    assert drain_cpu_per_event([(0, float("nan")), (20, float("nan")), (80, float("nan")), (100, float("nan"))]) \
        is None  # no CPU times (no /proc)


def test_replace_section_keeps_the_other_sections(tmp_path: Path) -> None:
    doc = tmp_path / "B.md"
    doc.write_text("# Benchmarks\n\nintro\n\n## Ingestion\n\nold\n\n## Feature engine\n\nkept\n")
    replace_section(doc, "## Ingestion", "## Ingestion\n\nnew\n")
    replace_section(doc, "## End to end", "## End to end\n\nadded\n")
    text = doc.read_text()
    assert "old" not in text and "## Ingestion\n\nnew\n\n## Feature engine\n\nkept\n" in text
    assert text.startswith("# Benchmarks\n\nintro\n") and text.endswith("## End to end\n\nadded\n")


def test_histograms_are_read_back_from_a_metrics_page() -> None:
    from prometheus_client import CollectorRegistry, Histogram, generate_latest

    from bench.promtext import histograms

    registry = CollectorRegistry()
    stage = Histogram("seam_stage_seconds", "x", ["stage"], buckets=(0.01, 0.05, 0.1), registry=registry)
    for value in [0.005] * 98 + [0.07, 0.07]:
        stage.labels("ingest").observe(value)
    read = histograms(generate_latest(registry).decode())[("seam_stage_seconds", (("stage", "ingest"),))]
    assert read.count == 100
    assert read.quantile(0.5) == 0.01 and read.quantile(0.99) == 0.1
    assert read.max_bound() == 0.1


def test_a_phase_is_what_a_histogram_observed_between_two_reads() -> None:
    from prometheus_client import CollectorRegistry, Histogram, generate_latest

    from bench.promtext import since

    registry = CollectorRegistry()
    lag = Histogram("seam_event_loop_lag_seconds", "x", buckets=(0.01, 0.05, 0.1), registry=registry)
    for value in [0.08] * 10:
        lag.observe(value)
    before = generate_latest(registry).decode()
    for value in [0.005] * 99 + [0.03]:
        lag.observe(value)
    observed = since(generate_latest(registry).decode(), before)
    phase = observed[("seam_event_loop_lag_seconds", ())]
    assert phase.count == 100
    assert phase.max_bound() == 0.05 and phase.quantile(0.5) == 0.01
    assert worker_stages(observed) == {"loop_lag_max_ms": 50.0}


def test_a_stage_past_the_last_bucket_is_a_lower_bound_that_json_can_hold(tmp_path: Path) -> None:
    from prometheus_client import CollectorRegistry, Histogram, generate_latest

    from bench.promtext import histograms
    from bench.report import _stages, write_json

    registry = CollectorRegistry()
    flush = Histogram("seam_state_flush_seconds", "x", buckets=(0.01, 0.05), registry=registry)
    for value in [0.005] * 90 + [0.2] * 10:  # the slowest tenth beyond the last finite bucket
        flush.observe(value)
    stages = worker_stages(histograms(generate_latest(registry).decode()))
    assert stages == {"state_writes": {"p50_ms": 10.0, "p99_ms": 50.0, "above": ["p99_ms"]}}
    point = {"load": 0.25, "offered_per_s": 1000, "worker": stages}
    write_json({"modes": {"default": {"seam-adaptive": {"latency": [point]}}}}, tmp_path / "results.json")
    row = _stages({"modes": {"default": {"seam-adaptive": {"latency": [point]}}}})[-2]
    assert "| > 50.0 |" in row


def _phase(offered: int, by_second: list[float], unanswered: int = 0) -> dict[str, object]:
    return {"offered_per_s": offered, "unanswered": unanswered, "p99_ms_by_second": by_second}


def test_a_phase_kept_up_when_everything_was_answered_and_its_tail_did_not_climb() -> None:
    assert kept_up(_phase(1000, [40, 60, 45, 50, 90]))  # 90 <= 60 + 50
    assert not kept_up(_phase(1000, [40, 60, 45, 80, 111]))  # the queue grew: 111 > 60 + 50
    assert not kept_up(_phase(1000, [40, 40, 40], unanswered=1))
    assert not kept_up({"load": 0.8, "offered_per_s": 9000, "overloaded": True})


def test_a_phase_is_judged_by_its_whole_seconds_only() -> None:
    # Sent over 3.2 s from 1,000 ms: seconds 0-2 are whole, the fourth (0.2 s, after the load stopped) is not.
    sent = {f"tx-{i}": 1000 + i * 10 for i in range(321)}
    climbing = {tx: (sent_ms - 1000) // 10 for tx, sent_ms in sent.items()}  # the queue grows all the time
    climbing.update({f"tx-{i}": 5 for i in range(300, 321)})  # ...but the last few, alone, are answered fast
    by_second = p99_by_second(sent, climbing, 1000)
    assert len(by_second) == 3 and by_second[-1] > by_second[0] + 150
    assert not kept_up(_phase(1000, by_second))
    assert p99_by_second(sent, {"tx-0": 7, "tx-99": 9, "tx-320": 400}, 1000) == [9.0]  # unanswered: left out
    assert p99_by_second({}, {}, 0) == []


def test_the_capacity_bracket_lies_between_the_fastest_kept_up_and_the_slowest_above_it() -> None:
    points = [_phase(2000, [20, 20, 30]), _phase(4000, [30, 30, 40]), _phase(6000, [30, 200, 900]),
              _phase(8000, [30, 30, 40], unanswered=5)]
    assert next_probe(points, 10_000) == (4000, 6000)
    assert next_probe(points[:2], 10_000) == (4000, 10_000)  # all kept up: up to its saturation
    assert next_probe([_phase(2000, [20, 500, 900])], 10_000) == (0, 2000)


def _mode(events_per_s: int, *points: dict[str, Any]) -> dict[str, Any]:
    return {"saturation": {"events_per_s": events_per_s}, "latency": list(points)}


def _point(load: float, offered: int, p99_ms: float, *, lower_bound: bool = False) -> dict[str, Any]:
    return {"load": load, "offered_per_s": offered, "p99_ms": p99_ms, "unanswered": int(lower_bound),
            "lower_bound": ["p99"] if lower_bound else []}


def test_tls_cost_compares_sasl_ssl_with_plaintext_at_each_load() -> None:
    plain = _mode(10_000, _point(0.25, 2_500, 20.0), _point(0.5, 5_000, 30.0), _point(0.8, 8_000, 60.0))
    secured = _mode(7_500, _point(0.25, 2_500, 24.5), _point(0.5, 5_000, 900.0, lower_bound=True),
                    {"load": 0.8, "offered_per_s": 8_000, "overloaded": True})
    results = {"modes": {"default": {"seam-adaptive": plain, SECURED: secured}, "bench": {"seam-adaptive": plain}}}
    assert report.SECURED == SECURED  # the report reads results files without the harness
    (cost,) = tls_cost(results)  # the bench model has no SASL_SSL run: nothing to compare
    assert cost["model"] == "default" and cost["saturation_ratio"] == 0.75
    assert cost["plaintext_per_s"] == 10_000 and cost["sasl_ssl_per_s"] == 7_500
    low, middle, high = cost["points"]
    assert low["p99_difference_ms"] == 4.5 and low["plaintext_p99_ms"] == 20.0 and low["sasl_ssl_p99_ms"] == 24.5
    # A lower bound says how far it got at least, not by how much it differs.
    assert middle["p99_difference_ms"] is None and middle["sasl_ssl_lower_bound"]
    assert high["sasl_ssl_overloaded"] and high["sasl_ssl_p99_ms"] is None and high["p99_difference_ms"] is None


def test_the_markdown_says_what_tls_costs() -> None:
    plain = _mode(10_000, _point(0.5, 5_000, 30.0))
    results = {
        "machine": {"cpus": 2, "cpu": "x", "memory_gib": 1, "python": "3", "kafka": "4", "load_average": [0.0]},
        "plan": {"sat_records": 1, "cards": 1, "ceiling_records": 1, "sat_cap_s": 1, "loads": [0.5],
                 "load_seconds": 1, "drain_cap_s": 1},
        "command": "bench", "duration_s": 1, "targets": [], "ort": {"default": [{"batch_size": 1, "rows_per_s": 1,
                                                                                "p50_ms": 1, "p99_ms": 1}]},
        "models": {"default": {"tag": "m@1"}},
        "modes": {"default": {"seam-adaptive": plain, SECURED: _mode(8_000, _point(0.5, 5_000, 42.3))}},
    }
    text = markdown(results)
    assert "### What TLS costs" in text and "second, secured broker" in text
    assert "saturation **80%** of plaintext's (8,000 vs 10,000 events/s); p99 +12.3 ms at 50%" in text
    assert "| default | 50% | 5,000 | 30.0 | 42.3 | +12.3 |" in text
    assert "| seam adaptive, SASL_SSL | 8,000 | 0.80 |" in text
    assert "Saturation passes" not in text and "median of the passes" not in text  # one pass each: nothing to say
    plain["saturation"]["passes"] = [9_000, 10_000, 12_500]
    results["plan"]["sat_passes"] = 3
    text = markdown(results)
    assert "Saturation passes, events/s (the table shows their median): seam adaptive 9,000 / 10,000 / 12,500." in text
    assert "drain it 3 times, each time a fresh worker on fresh topics" in text
    assert "CPU per event" not in text  # not measured (no /proc): nothing to say
    plain["saturation"]["worker_cpu_us_per_event"] = 50.0
    plain["latency"][0] |= {"worker_cpu_us_per_event": 65.0, "generator_cores": 0.214}
    assert "seam adaptive 50.0 µs draining, 50% 65.0 (1.30×); generator 0.21." in markdown(results)
    results["modes"]["default"].pop(SECURED)
    results["skipped"] = {SECURED: "no keytool"}
    assert "### What TLS costs\n\nNot measured in this run: no keytool." in markdown(results)


def test_a_worker_connects_as_the_connection_does_with_its_password_in_a_file(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("not read here")
    connection = Connection("127.0.0.1:9999", "SASL_SSL", "SCRAM-SHA-512", "admin", "s3cr3t", str(ca))
    env = worker_settings(connection, tmp_path)
    assert "s3cr3t" not in "".join(env.values())
    assert Settings.from_env(env).kafka == connection
    assert worker_settings(Connection("127.0.0.1:9092"), tmp_path) == {
        "SEAM_BROKER_URL": "kafka://127.0.0.1:9092", "SEAM_SECURITY_PROTOCOL": "PLAINTEXT"}


def test_without_keytool_the_secured_broker_says_so_before_starting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("bench.secured.shutil.which", lambda _name: None)
    broker = SecuredBroker()
    with pytest.raises(MissingKeytool, match="keytool"), broker:
        pass
    assert broker.run_dir is None  # nothing made, nothing to remove
