"""Avro in the Confluent wire format: the schema cache's lookups and refusals (injected clock, no registry),
decoding and validating records, and seam's output schemas."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import math
from typing import Any

import pytest
from fastavro import parse_schema, schemaless_reader, schemaless_writer

from agents.formats.avro import (
    AvroEncoder,
    AvroInput,
    AvroWriter,
    RegistryUnavailable,
    SchemaCache,
    frame,
    schema_for,
    writer_schema,
)
from agents.formats.codec import DEFAULT_CONTRACT, Contract, Event, Invalid, late_record
from agents.formats.record_format import json_format
from tables.features import DEFAULT_SPEC
from tests.specs import fraud_like

TX: dict[str, Any] = {"id": "e-1", "card_id": "c-1", "ts": 1_764_633_600_000, "amount": 12.5, "merchant_id": "m-1",
      "country": "DE"}
V1 = schema_for("input", DEFAULT_SPEC)
V2 = dict(V1, fields=[*V1["fields"], {"name": "channel", "type": "string", "default": "online"}])


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        await asyncio.sleep(0)


class Registry:
    """Schemas by id; ``down`` makes every fetch fail as an unreachable registry does."""

    def __init__(self, clock: Clock, schemas: dict[int, tuple[str, str]]) -> None:
        self.clock, self.schemas, self.down, self.calls = clock, schemas, False, 0

    async def fetch(self, schema_id: int, timeout_s: float) -> tuple[str, str] | None:
        self.calls += 1
        await asyncio.sleep(0)
        if self.down:
            self.clock.now += timeout_s
            raise RegistryUnavailable("connection refused")
        return self.schemas.get(schema_id)


def avro(schema_id: int, schema: dict[str, Any], datum: dict[str, Any]) -> bytes:
    return AvroWriter(schema_id, schema)(datum)


def reader(registry: Registry, clock: Clock, timeout_s: float = 3.0) -> AvroInput:
    results: list[str] = []
    cache = SchemaCache(registry.fetch, timeout_s=timeout_s, clock=clock, sleep=clock.sleep, on_lookup=results.append)
    cache.results = results  # type: ignore[attr-defined]
    return AvroInput(cache)


def schemas() -> dict[int, tuple[str, str]]:
    return {1: ("AVRO", json.dumps(V1)), 2: ("AVRO", json.dumps(V2)), 3: ("PROTOBUF", "syntax = 'proto3';"),
            4: ("AVRO", '"string"')}


async def decode(input_: AvroInput, *values: bytes) -> list[Event | Invalid]:
    await input_.prepare(values)
    return [input_.decode(value) for value in values]


async def test_records_decode_and_validate_as_their_json_twins() -> None:
    clock = Clock()
    input_ = reader(Registry(clock, schemas()), clock)
    [tx] = await decode(input_, avro(1, V1, TX))
    assert tx == json_format().decode(json.dumps(TX).encode())
    assert tx == Event("e-1", "c-1", TX["ts"], (12.5, "m-1"))


async def test_a_newer_writer_schema_with_a_field_added_decodes_without_a_restart() -> None:
    clock = Clock()
    registry = Registry(clock, schemas())
    input_ = reader(registry, clock)
    first, second = await decode(input_, avro(1, V1, TX), avro(2, V2, dict(TX, id="e-2", channel="pos")))
    assert isinstance(first, Event) and isinstance(second, Event) and second.id == "e-2"
    assert registry.calls == 2
    await decode(input_, avro(2, V2, dict(TX, channel="pos")), avro(1, V1, TX))
    assert registry.calls == 2, "schemas are fetched once"


async def test_bad_records_get_their_own_reasons() -> None:
    clock = Clock()
    input_ = reader(Registry(clock, schemas()), clock)
    good = avro(1, V1, TX)
    cases = {
        b"": "empty_value",
        json.dumps(TX).encode(): "not_framed",
        b"\x00\x00\x00": "not_framed",
        b"\x01" + good[1:]: "not_framed",
        frame(99, good[5:]): "unknown_schema_id",
        good[: len(good) // 2]: "undecodable",
        good + b"\x00": "undecodable",
        frame(1, b"\x02\xff\xfe" + good[7:]): "undecodable",  # not UTF-8
        frame(3, good[5:]): "unsupported_schema",
        avro(4, {"type": "string"}, "text"): "not_a_record",  # type: ignore[arg-type]
        avro(1, V1, dict(TX, amount=math.nan)): "not_finite",
        avro(1, V1, dict(TX, ts=1_764_633_600)): "out_of_range",
        avro(1, V1, dict(TX, card_id="")): "out_of_range",
        b"\x00" * 70_000: "too_large",
    }
    results = await decode(input_, *cases)
    assert [r.reason if isinstance(r, Invalid) else r for r in results] == list(cases.values())
    assert "schema id 99 is not in the schema registry" in results[4].message  # type: ignore[union-attr]


async def test_a_schema_is_fetched_once_however_many_batches_ask_at_the_same_time() -> None:
    clock = Clock()
    registry = Registry(clock, schemas())
    input_ = reader(registry, clock)
    values = [avro(1, V1, TX), avro(2, V2, dict(TX, channel="x"))]
    await asyncio.gather(*(input_.prepare(values) for _ in range(5)))
    assert registry.calls == 2
    assert input_.cache.results == ["found", "found"]  # type: ignore[attr-defined]


async def test_an_unreachable_registry_is_retried_until_the_timeout_then_its_ids_are_refused_for_a_while() -> None:
    clock = Clock()
    registry = Registry(clock, schemas())
    input_ = reader(registry, clock, timeout_s=3.0)
    cached, new = avro(1, V1, TX), avro(2, V2, dict(TX, channel="x"))
    await decode(input_, cached)
    registry.down = True
    started = clock.now
    results = await decode(input_, cached, new)
    waited = clock.now - started
    assert isinstance(results[0], Event), "a cached schema needs no registry"
    assert isinstance(results[1], Invalid) and results[1].reason == "registry_unavailable"
    assert 3.0 <= waited < 3.0 + SchemaCache.ATTEMPT_TIMEOUT_S + 1.0 and registry.calls > 2, (waited, registry.calls)
    # Meanwhile its records are refused at once, without asking again.
    calls = registry.calls
    assert (await decode(input_, new))[0].reason == "registry_unavailable"  # type: ignore[union-attr]
    assert registry.calls == calls
    # After RETRY_AFTER_S it is asked for again; the registry is back.
    registry.down = False
    clock.now += SchemaCache.RETRY_AFTER_S
    assert isinstance((await decode(input_, new))[0], Event)
    assert input_.cache.results == ["found", "unavailable", "found"]  # type: ignore[attr-defined]


async def test_an_unknown_id_is_asked_for_again_later() -> None:
    clock = Clock()
    registry = Registry(clock, {})
    input_ = reader(registry, clock)
    value = avro(7, V1, TX)
    assert (await decode(input_, value))[0].reason == "unknown_schema_id"  # type: ignore[union-attr]
    assert (await decode(input_, value))[0].reason == "unknown_schema_id"  # type: ignore[union-attr]
    assert registry.calls == 1
    registry.schemas[7] = ("AVRO", json.dumps(V1))
    clock.now += SchemaCache.UNKNOWN_RECHECK_S
    assert isinstance((await decode(input_, value))[0], Event)


def read(name: str, value: bytes, schema_id: int) -> dict[str, Any]:
    assert value[:5] == frame(schema_id, b"")
    datum = schemaless_reader(io.BytesIO(value[5:]), parse_schema(schema_for(name, DEFAULT_SPEC)), None)
    assert isinstance(datum, dict)
    return datum


def test_outputs_are_written_in_their_schemas_with_their_ids() -> None:
    outputs = AvroEncoder({"prediction": 11, "features": 12, "shadow-score": 13}, DEFAULT_CONTRACT)
    tx = Event("e-1", "c-1", TX["ts"], (12.5, "m-1"))
    prediction = read("prediction", outputs.prediction(tx, score=0.75, threshold=0.5, model="fraud-mlp@1",
                                                       queue_ms=1.23456, infer_ms=0.5, batch_size=3), 11)
    assert prediction == {"id": "e-1", "card_id": "c-1", "ts": TX["ts"], "score": 0.75, "is_fraud": True,
                          "model": "fraud-mlp@1", "timing": {"queue_ms": 1.235, "infer_ms": 0.5, "batch_size": 3}}
    values = tuple(float(i) for i in range(len(DEFAULT_SPEC.names)))
    features = read("features", outputs.feature_record(tx, feature_set=DEFAULT_SPEC.version, features=values), 12)
    assert features["features"] == dict(zip(DEFAULT_SPEC.names, values, strict=True))
    assert features["feature_set"] == DEFAULT_SPEC.version and features["card_id"] == "c-1"
    shadow = read("shadow-score", outputs.shadow_score(tx, score=0.25, model="fraud-mlp@2"), 13)
    assert shadow == {"id": "e-1", "card_id": "c-1", "ts": TX["ts"], "score": 0.25, "model": "fraud-mlp@2"}


def test_the_example_spec_derives_the_schemas_seam_registered_before_specs() -> None:
    """What producers of the example stream and readers of its outputs registered stays compatible: same names,
    types and order (the schema files of earlier seams, docs aside)."""
    def fields(name: str) -> list[tuple[str, Any]]:
        return [(f["name"], f["type"]) for f in schema_for(name, DEFAULT_SPEC)["fields"]]

    assert schema_for("input", DEFAULT_SPEC)["name"] == "Transaction"
    assert fields("input") == [("id", "string"), ("card_id", "string"), ("ts", "long"), ("amount", "double"),
                               ("merchant_id", "string"), ("country", ["null", "string"])]
    assert [name for name, _ in fields("prediction")] == ["id", "card_id", "ts", "score", "is_fraud", "model",
                                                          "timing"]
    assert fields("shadow-score") == [("id", "string"), ("card_id", "string"), ("ts", "long"), ("score", "double"),
                                      ("model", "string")]
    features = dict(fields("features"))["features"]
    assert [(f["name"], f["type"]) for f in features["fields"]] == [(n, "double") for n in DEFAULT_SPEC.names]
    AvroEncoder.check(DEFAULT_CONTRACT)


def test_another_spec_gets_schemas_of_its_own_names() -> None:
    spec = fraud_like((30,), 30, 30)
    other = dict(schema_for("features", spec)["fields"][4]["type"])
    assert [f["name"] for f in other["fields"]] == list(spec.names)
    AvroEncoder.check(Contract(spec))


def test_a_late_avro_record_carries_its_fields_and_its_original_bytes() -> None:
    raw = avro(1, V1, TX)
    tx = Event("e-1", "c-1", TX["ts"], (12.5, "m-1"))
    record = json.loads(late_record(tx, raw=raw, watermark=TX["ts"] + 1, topic="tx", partition=2, offset=9,
                                    routed_at_ms=0, raw_is_json=False))
    assert record["event"] == {name: TX[name] for name in ("id", "card_id", "ts", "amount", "merchant_id")}
    assert record["offset"] == 9
    assert base64.b64decode(record["value_base64"]) == raw


def test_the_writer_matches_fastavro_and_the_framing() -> None:
    stream = io.BytesIO()
    schemaless_writer(stream, parse_schema(V1), TX)
    assert avro(258, V1, TX) == b"\x00\x00\x00\x01\x02" + stream.getvalue()


def test_a_schema_changed_without_its_encoder_refuses_to_start(monkeypatch: pytest.MonkeyPatch) -> None:
    import agents.formats.avro

    original = agents.formats.avro.schema_for

    def reordered(name: str, spec: Any) -> dict[str, Any]:
        schema = original(name, spec)
        if name == "prediction":  # the same fields, score and is_fraud swapped
            fields = schema["fields"]
            schema["fields"] = [*fields[:3], fields[4], fields[3], *fields[5:]]
        return schema

    monkeypatch.setattr(agents.formats.avro, "schema_for", reordered)
    with pytest.raises(ValueError, match=r"the prediction schema does not match what seam writes"):
        AvroEncoder.check(DEFAULT_CONTRACT)


def test_writer_schemas_that_declare_the_contract_skip_the_type_checks_and_others_get_them() -> None:
    assert writer_schema(V1).typed and writer_schema(V2).typed
    as_text = dict(V1, fields=[dict(f, type="string") if f["name"] == "amount" else f for f in V1["fields"]])
    without = dict(V1, fields=[f for f in V1["fields"] if f["name"] != "merchant_id"])
    assert not writer_schema(as_text).typed and not writer_schema(without).typed
    clock = Clock()
    input_ = reader(Registry(clock, {5: ("AVRO", json.dumps(as_text)), 6: ("AVRO", json.dumps(without))}), clock)
    text_amount, no_merchant = asyncio.run(decode(
        input_, avro(5, as_text, dict(TX, amount="12.5")),
        avro(6, without, {k: v for k, v in TX.items() if k != "merchant_id"})))
    assert (text_amount.reason, no_merchant.reason) == ("wrong_type", "missing_field")  # type: ignore[union-attr]


def test_an_event_time_declared_as_timestamp_millis_is_read_as_epoch_milliseconds() -> None:
    logical = dict(V1, fields=[dict(f, type={"type": "long", "logicalType": "timestamp-millis"})
                               if f["name"] == "ts" else f for f in V1["fields"]])
    clock = Clock()
    input_ = reader(Registry(clock, {8: ("AVRO", json.dumps(logical))}), clock)
    [tx] = asyncio.run(decode(input_, avro(8, logical, TX)))
    assert isinstance(tx, Event) and tx.ts == TX["ts"]


async def test_random_schema_ids_cost_the_registry_a_bounded_number_of_requests() -> None:
    """A producer writing random ids: UNKNOWN_BUDGET of them are asked for in a minute, the rest refused at once
    (replayable dead letters); a minute later new ids are asked for again; refusals kept stay bounded."""
    clock = Clock()
    registry = Registry(clock, schemas())
    input_ = reader(registry, clock)
    budget = SchemaCache.UNKNOWN_BUDGET
    values = [avro(1000 + i, V1, TX) for i in range(3 * budget)]
    results = await decode(input_, *values)
    assert registry.calls == budget
    assert all(isinstance(r, Invalid) and r.reason == "unknown_schema_id" for r in results)
    assert sum("was not looked up" in r.message for r in results if isinstance(r, Invalid)) == 2 * budget
    # Meanwhile a real new schema waits too (its records are dead letters to replay), until the minute is over.
    assert (await decode(input_, avro(1, V1, TX)))[0].reason == "unknown_schema_id"  # type: ignore[union-attr]
    assert registry.calls == budget
    clock.now += SchemaCache.UNKNOWN_RECHECK_S + 1
    assert isinstance((await decode(input_, avro(1, V1, TX)))[0], Event)
    assert registry.calls == budget + 1
    cache = input_.cache
    cache.MAX_REFUSED = 10  # type: ignore[misc]
    await decode(input_, *(avro(9000 + i, V1, TX) for i in range(20)))
    assert len(cache.refused) <= 10


async def test_a_registry_answer_larger_than_the_limit_is_not_read() -> None:
    """An answer of more than MAX_ANSWER_BYTES (a broken or hostile registry) is refused, not read into memory."""
    from aiohttp import web

    from agents.formats.avro import MAX_ANSWER_BYTES, SchemaRegistry

    async def huge(request: web.Request) -> web.Response:
        return web.Response(body=b'{"schema": "' + b"x" * (MAX_ANSWER_BYTES + 10) + b'"}',
                            content_type="application/json")

    app = web.Application()
    app.router.add_get("/schemas/ids/{id}", huge)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    registry = SchemaRegistry(f"http://127.0.0.1:{port}")
    try:
        with pytest.raises(RegistryUnavailable, match="an answer of more than"):
            await registry.schema(1, timeout_s=10)
    finally:
        await registry.close()
        await runner.cleanup()
