"""Avro input and outputs against the real broker and the real schema registry, written and read with Confluent's
own serializer and deserializer (confluent-kafka)."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import math
import re
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.serialization import MessageField, SerializationContext
from fastavro import parse_schema, schemaless_reader

from agents.formats.avro import frame, schema_for
from app.localhost import free_port, worker_env
from app.synthetic import TransactionGenerator
from tables.features import DEFAULT_SPEC
from tables.kafka import assign_all
from tests.integration.kafka_helpers import (
    Topics,
    Worker,
    collect,
    decode_output,
    encode,
    prepare_topics,
    produce_raw,
    with_features,
)

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
V1 = schema_for("input", DEFAULT_SPEC)
# The next version a producer moves to: a field added with a default (backward compatible).
V2 = dict(V1, fields=[*V1["fields"], {"name": "channel", "type": "string", "default": "online"}])
# A field added without a default: records written with the older versions cannot be read with it.
V3 = dict(V1, fields=[*V1["fields"], {"name": "terminal", "type": "string"}])


def serializer(client: SchemaRegistryClient, schema: dict[str, Any], topic: str) -> Callable[[dict[str, Any]], bytes]:
    serialize = AvroSerializer(client, json.dumps(schema))
    context = SerializationContext(topic, MessageField.VALUE)
    return lambda datum: serialize(datum, context)


def output_decoder(client: SchemaRegistryClient, avro_topics: set[str]
                   ) -> Callable[[str, bytes | None, bytes], dict[str, Any]]:
    """Avro outputs through Confluent's deserializer (writer schema by id from the registry); JSON envelopes as JSON."""
    deserialize = AvroDeserializer(client)

    def decode(topic: str, _key: bytes | None, value: bytes) -> dict[str, Any]:
        if topic in avro_topics:
            datum = deserialize(value, SerializationContext(topic, MessageField.VALUE))
            return dict(datum) | {"_schema_id": int.from_bytes(value[1:5], "big")}
        return dict(orjson.loads(value))

    return decode


async def read_input(bootstrap: str, topic: str, expected: int) -> dict[bytes, tuple[int, int]]:
    """Each input value's (partition, offset)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    positions: dict[bytes, tuple[int, int]] = {}
    try:
        await assign_all(consumer, bootstrap, [topic], from_end=False)
        while len(positions) < expected:
            for tp, records in (await consumer.getmany(timeout_ms=500)).items():
                positions.update({r.value: (tp.partition, r.offset) for r in records if r.value is not None})
    finally:
        await consumer.stop()
    return positions


def dead_value(letter: dict[str, Any]) -> bytes:
    return base64.b64decode(letter["value"]) if letter["value_base64"] else letter["value"].encode()


def scored(out: dict[str, list[dict[str, Any]]], topics: Topics, ids: set[str]) -> bool:
    return ({p["id"] for p in out[topics.predictions]} >= ids and {f["id"] for f in out[topics.features]} >= ids)


def test_avro_records_are_scored_like_their_json_twins_and_bad_ones_dead_lettered_exactly_once(
        kafka_bootstrap: str, schema_registry: str, tmp_path: Path) -> None:
    suffix = uuid.uuid4().hex[:10]
    avro, twin = Topics.unique(f"avro-{suffix}"), Topics.unique(f"json-{suffix}")
    for topics in (avro, twin):
        prepare_topics(kafka_bootstrap, topics)
    client = SchemaRegistryClient({"url": schema_registry})
    subject = f"{avro.input}-value"
    write_v1 = serializer(client, V1, avro.input)
    generator = TransactionGenerator(cards=30, seed=16, late_rate=0.0, id_prefix="av")
    phase1 = [next(generator)[0] for _ in range(300)]
    phase2 = [next(generator)[0] | {"channel": "pos"} for _ in range(300)]
    first = [(e["card_id"].encode(), write_v1(e)) for e in phase1]
    client.set_compatibility(subject, "BACKWARD")
    good = first[0][1]
    # Records that must not be scored, each with the reason it must be dead-lettered for.
    bad_phase1 = {
        frame(999_001, good[5:]): "unknown_schema_id",
        good[:-4]: "undecodable",
        orjson.dumps(phase1[1] | {"id": "json-1"}): "not_framed",
        write_v1(phase1[2] | {"id": "nan-1", "amount": math.nan}): "not_finite",
        write_v1(phase1[3] | {"id": "sec-1", "ts": phase1[3]["ts"] // 1000}): "out_of_range",
    }
    records1 = first[:100] + [(b"c-bad", value) for value in bad_phase1] + first[100:]
    # The Avro worker exactly once (its outputs in transactions), the JSON twin at least once.
    env = {"SEAM_INPUT_FORMAT": "avro", "SEAM_SCHEMA_REGISTRY_URL": schema_registry, "SEAM_MAX_WAIT_MS": "5",
           "SEAM_PROCESSING_GUARANTEE": "exactly_once"}
    workers = [Worker(kafka_bootstrap, avro.env() | env, tmp_path / "avro", free_port()),
               Worker(kafka_bootstrap, twin.env(), tmp_path / "json", free_port())]
    try:
        for worker in workers:
            worker.wait_ready()
        asyncio.run(produce_raw(kafka_bootstrap, avro.input, records1))
        asyncio.run(produce_raw(kafka_bootstrap, twin.input, [encode(e) for e in phase1]))
        ids1 = {e["id"] for e in phase1}
        decode = output_decoder(client, {avro.predictions, avro.features})
        out1 = asyncio.run(collect(kafka_bootstrap, [avro.predictions, avro.features], decode=decode,
                                   done=lambda o: scored(o, avro, ids1), timeout_s=60, settle_s=0,
                                   read_committed=True))
        assert {p["id"] for p in out1[avro.predictions]} >= ids1
        # The producer moves to the next version while the worker runs; an incompatible one is refused.
        write_v2 = serializer(client, V2, avro.input)
        second = [(e["card_id"].encode(), write_v2(e)) for e in phase2]
        with pytest.raises(SchemaRegistryError) as refused:
            serializer(client, V3, avro.input)(phase2[0] | {"terminal": "t-1"})
        assert refused.value.http_status_code == 409
        bad_phase2 = {frame(999_002, second[0][1][5:]): "unknown_schema_id",
                      second[1][1][:7]: "undecodable"}
        records2 = second[:150] + [(b"c-bad", value) for value in bad_phase2] + second[150:]
        asyncio.run(produce_raw(kafka_bootstrap, avro.input, records2))
        asyncio.run(produce_raw(kafka_bootstrap, twin.input, [encode(e) for e in phase2]))
        ids = ids1 | {e["id"] for e in phase2}
        bad = bad_phase1 | bad_phase2
        out = asyncio.run(collect(
            kafka_bootstrap, [avro.predictions, avro.features, avro.dlq, avro.late, twin.predictions, twin.features],
            decode=lambda topic, key, value: (decode(topic, key, value) if topic.startswith(("pred-avro", "feat-avro"))
                                              else orjson.loads(value) if topic != twin.features
                                              else decode_output(key, value)),
            done=lambda o: scored(o, avro, ids) and scored(o, twin, ids) and len(o[avro.dlq]) >= len(bad),
            timeout_s=90, read_committed=True))
        metrics = workers[0].get("/metrics")[1].decode()
    finally:
        codes = [worker.stop() for worker in workers]
    assert codes == [0, 0], [worker.log_tail() for worker in workers]

    # Every valid record is scored, with the features (and score) of its JSON twin.
    assert out[avro.late] == []
    avro_scored, twin_scored = with_avro_features(out, avro), {p["id"]: p for p in with_features(out, twin)}
    assert set(avro_scored) == set(twin_scored) == ids
    assert len(out[avro.predictions]) == len(out[avro.features]) == len(ids), "exactly once: no repeats"
    for event_id, prediction in avro_scored.items():
        expected = twin_scored[event_id]
        assert prediction["features"] == expected["features"], event_id
        assert prediction["score"] == pytest.approx(expected["score"], abs=1e-6)
        assert (prediction["card_id"], prediction["ts"], prediction["model"]) == (
            expected["card_id"], expected["ts"], expected["model"])
    # Each bad record is in the dead-letter topic with its reason, its original bytes and its source offset.
    positions = asyncio.run(read_input(kafka_bootstrap, avro.input, len(records1) + len(records2)))
    letters = {dead_value(d): d for d in out[avro.dlq]}
    assert set(letters) == set(bad)
    for value, reason in bad.items():
        letter = letters[value]
        assert letter["reason"] == reason, letter
        assert (letter["topic"], letter["partition"], letter["offset"]) == (avro.input, *positions[value])
    assert "schema id 999001 is not in the schema registry" in letters[frame(999_001, good[5:])]["message"]
    # Outputs are registered under their topics' subjects and carry those ids.
    for topic in (avro.predictions, avro.features):
        registered = client.get_latest_version(f"{topic}-value").schema_id
        assert {record["_schema_id"] for record in out[topic]} == {registered}
    assert out[avro.features][0]["feature_set"] == DEFAULT_SPEC.version
    assert client.get_latest_version(subject).version == 2
    found = re.search(r'^seam_schema_lookups_total\{result="found"\} (\S+)$', metrics, re.M)
    unknown = re.search(r'^seam_schema_lookups_total\{result="unknown"\} (\S+)$', metrics, re.M)
    assert found and float(found.group(1)) == 2 and unknown and float(unknown.group(1)) == 2, metrics
    assert 'seam_dead_letters_total{reason="undecodable"} 2.0' in metrics


def with_avro_features(out: dict[str, list[dict[str, Any]]], topics: Topics) -> dict[str, dict[str, Any]]:
    logged = {f["id"]: f for f in out[topics.features]}
    joined = {}
    for p in out[topics.predictions]:
        record = logged[p["id"]]
        assert list(record["features"]) == list(DEFAULT_SPEC.names)
        assert (record["card_id"], record["ts"]) == (p["card_id"], p["ts"])
        joined[p["id"]] = p | {"features": record["features"]}
    return joined


class RegistryLink:
    """A TCP relay between the worker and the registry that can be cut: while cut it takes connections and bytes
    and answers nothing (a registry that does not answer), on connections old and new; restored, it relays again.
    The registry keeps its schemas (it keeps them in memory only: restarting it would lose them)."""

    def __init__(self, target_port: int) -> None:
        self.port, self._target = free_port(), target_port
        self.cut = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def __enter__(self) -> RegistryLink:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(10)
        return self

    def __exit__(self, *_: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", self.port)

    async def _relay(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", self._target)

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            try:
                while data := await source.read(65536):
                    if not self.cut.is_set():
                        sink.write(data)
                        await sink.drain()
            finally:
                sink.close()

        await asyncio.gather(pipe(client_reader, upstream_writer), pipe(upstream_reader, client_writer),
                             return_exceptions=True)


def test_while_the_registry_is_down_only_records_of_schemas_not_seen_yet_are_dead_lettered_and_replayed_after(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    """The registry stops answering: records of schemas the worker has are scored, the others dead-lettered
    (registry_unavailable). It answers again: `seam dlq replay` sends those letters back once, and every one
    is scored."""
    port, run_dir = free_port(), tmp_path / "registry"
    registry_local = [sys.executable, str(ROOT / "scripts" / "registry_local.py")]
    options = ["--port", str(port), "--run-dir", str(run_dir)]
    subprocess.run([*registry_local, "up", *options], check=True, capture_output=True)
    with RegistryLink(port) as link:
        _outage_and_replay(kafka_bootstrap, tmp_path, f"http://127.0.0.1:{port}/apis/ccompat/v6",
                           f"http://127.0.0.1:{link.port}/apis/ccompat/v6", link, [*registry_local, "down", *options])


def _outage_and_replay(kafka_bootstrap: str, tmp_path: Path, url: str, worker_url: str, link: RegistryLink,
                       registry_down: list[str]) -> None:
    topics = Topics.unique(f"outage-{uuid.uuid4().hex[:8]}")
    prepare_topics(kafka_bootstrap, topics)
    client = SchemaRegistryClient({"url": url})
    write_v1, write_v2 = serializer(client, V1, topics.input), serializer(client, V2, topics.input)
    generator = TransactionGenerator(cards=20, seed=4, late_rate=0.0, id_prefix="out")
    before = [next(generator)[0] for _ in range(100)]
    during_v1 = [next(generator)[0] for _ in range(100)]
    during_v2 = [next(generator)[0] | {"channel": "pos"} for _ in range(50)]
    env = {"SEAM_INPUT_FORMAT": "avro", "SEAM_SCHEMA_REGISTRY_URL": worker_url, "SEAM_SCHEMA_REGISTRY_TIMEOUT_S": "1"}
    worker = Worker(kafka_bootstrap, topics.env() | env, tmp_path / "worker", free_port())
    try:
        worker.wait_ready()
        decode = output_decoder(client, {topics.predictions, topics.features})
        asyncio.run(produce_raw(kafka_bootstrap, topics.input, [(e["card_id"].encode(), write_v1(e)) for e in before]))
        first = {e["id"] for e in before}
        asyncio.run(collect(kafka_bootstrap, [topics.predictions], decode=decode, settle_s=0, timeout_s=60,
                            done=lambda o: {p["id"] for p in o[topics.predictions]} >= first))
        v2_values = [(e["card_id"].encode(), write_v2(e)) for e in during_v2]  # registered while it was up
        link.cut.set()
        records = [(e["card_id"].encode(), write_v1(e)) for e in during_v1[:50]] + v2_values[:25] + [
            (e["card_id"].encode(), write_v1(e)) for e in during_v1[50:]] + v2_values[25:]
        asyncio.run(produce_raw(kafka_bootstrap, topics.input, records))
        scored_ids = first | {e["id"] for e in during_v1}
        out = asyncio.run(collect(
            kafka_bootstrap, [topics.predictions, topics.dlq], decode=lambda t, k, v: (
                orjson.loads(v) if t == topics.dlq else _plain(v)),
            done=lambda o: len({p["id"] for p in o[topics.predictions]}) >= len(scored_ids)
            and len(o[topics.dlq]) >= len(during_v2), timeout_s=90))
        assert {p["id"] for p in out[topics.predictions]} == scored_ids
        letters = out[topics.dlq]
        assert {d["reason"] for d in letters} == {"registry_unavailable"}, letters[:3]
        assert sorted(dead_value(d) for d in letters) == sorted(value for _key, value in v2_values)
        assert "did not answer within 1 s" in letters[0]["message"]
        # After the outage: the registry answers again. The worker asks for a schema it could not get again some
        # seconds after the failure (and within a budget of such asks per minute): a record of it sent before is a
        # dead letter again, so probe until one is decoded. A probe is stamped below the watermark: decoded, it
        # goes to the late topic, and it moves no watermark the records to replay are held to.
        link.cut.clear()
        probes, letters_so_far = [], len(letters)
        while not probes or probes[-1][1] == "dead":
            probe = during_v2[0] | {"id": f"out-probe-{len(probes)}", "ts": before[0]["ts"] - 3_600_000}
            asyncio.run(produce_raw(kafka_bootstrap, topics.input, [(probe["card_id"].encode(), write_v2(probe))]))
            seen = asyncio.run(collect(
                kafka_bootstrap, [topics.late, topics.dlq], decode=lambda t, k, v: orjson.loads(v), settle_s=0,
                timeout_s=60, done=lambda o, n=letters_so_far, i=probe["id"]: len(o[topics.dlq]) > n
                or any(r["event"]["id"] == i for r in o[topics.late])))
            decoded = any(r["event"]["id"] == probe["id"] for r in seen[topics.late])
            probes.append((probe["id"], "late" if decoded else "dead"))
            letters_so_far = len(seen[topics.dlq])
        dead = len(during_v2) + len(probes) - 1
        cli_env = worker_env(topics.env() | env | {"SEAM_BROKER_URL": f"kafka://{kafka_bootstrap}"})

        def replay() -> str:
            done = subprocess.run([sys.executable, "-m", "app", "dlq", "replay", "--reason", "registry_unavailable"],
                                  env=cli_env, cwd=ROOT, capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, done.stderr
            return done.stdout
        assert f"replayed {dead} dead letters (registry_unavailable: {dead})" in replay()
        assert "replayed 0 dead letters" in replay()  # once: the second run starts after the first
        everyone = scored_ids | {e["id"] for e in during_v2}
        after = asyncio.run(collect(
            kafka_bootstrap, [topics.predictions, topics.dlq, topics.late], decode=lambda t, k, v: (
                orjson.loads(v) if t != topics.predictions else _plain(v)),
            done=lambda o: {p["id"] for p in o[topics.predictions]} >= everyone
            and len(o[topics.late]) >= len(probes), timeout_s=90))
    finally:
        code = worker.stop()
        subprocess.run(registry_down, capture_output=True)
    assert code == 0, worker.log_tail()
    assert {p["id"] for p in after[topics.predictions]} == everyone
    # No new dead letter: every replayed record was decoded, the outage's scored, the probes late (as stamped).
    assert len(after[topics.dlq]) == dead
    assert sorted(r["event"]["id"] for r in after[topics.late]) == sorted(probe for probe, _ in probes)


def _plain(value: bytes) -> dict[str, Any]:
    """A prediction read with seam's own schema (the registry is down: Confluent's deserializer would ask it)."""
    datum = schemaless_reader(io.BytesIO(value[5:]), parse_schema(schema_for("prediction", DEFAULT_SPEC)), None)
    assert isinstance(datum, dict)
    return datum
