"""Avro records in the Confluent wire format, with their schemas in a schema registry.

A record's value is a zero magic byte, the writer schema's registry id (4 bytes, big-endian), then the
Avro binary encoding of the datum (no container header): what Confluent's serializers write and read.

* :class:`SchemaRegistry`: the registry's Confluent-compatible REST API (fetch a schema by id, register
  one under a subject).
* :class:`SchemaCache`: writer schemas by id, fetched once. Lookups of ids it does not hold wait for the
  registry up to ``timeout_s`` (retrying); an id the registry does not know is remembered for
  ``UNKNOWN_RECHECK_S``, a registry that did not answer for ``RETRY_AFTER_S``: records meanwhile get
  the refusal at once instead of each waiting (the outage policy: see the README's "Avro" section).
* :class:`AvroInput`: resolves a batch's schema ids, then decodes each record with fastavro and validates
  it as the JSON path does (:meth:`agents.formats.codec.Contract.validate`). Never raises on bad input.
* :func:`schema_for`: the schemas a feature spec implies: ``input`` (what producers write and
  ``seam produce`` registers), and the outputs ``prediction``, ``features`` and ``shadow-score``.
* :class:`AvroEncoder`: the output schemas, checked against what seam writes, registered under
  ``<topic>-value``, and their encoders.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import io
import json
import logging
import ssl
import struct
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from fastavro import parse_schema, schemaless_reader, schemaless_writer
from fastavro.validation import validate

from agents.formats.codec import DEFAULT_CONTRACT, MAX_RECORD_BYTES, Contract, Event, Invalid
from tables.spec import FeatureSpec

__all__ = [
    "AvroInput",
    "AvroEncoder",
    "AvroWriter",
    "RegistryUnavailable",
    "SchemaCache",
    "SchemaRegistry",
    "WriterSchema",
    "declares_contract",
    "frame",
    "input_writer",
    "schema_for",
    "writer_schema",
]

logger = logging.getLogger(__name__)

MAGIC = 0
HEADER_BYTES = 5
CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
UNKNOWN_SCHEMA = 40403  # the Confluent API's error code for a schema id it does not have
MAX_ANSWER_BYTES = 4 << 20  # the most of a registry answer read (a schema is kilobytes)


def frame(schema_id: int, payload: bytes) -> bytes:
    """A record value in the Confluent wire format."""
    return bytes((MAGIC,)) + schema_id.to_bytes(4, "big") + payload


_AVRO_TYPES = {"float": "double", "int": "long", "bool": "boolean", "string": "string"}
OUTPUTS = ("prediction", "features", "shadow-score")


def schema_for(name: str, spec: FeatureSpec) -> dict[str, Any]:
    """The Avro schema ``name`` of ``spec``: ``input`` (a record of its id, key, time and fields), or one of
    :data:`OUTPUTS` (each starts with the input's id, key and time)."""
    head = [{"name": spec.event_id, "type": "string", "doc": "The event's id (1-128 characters)."},
            {"name": spec.key, "type": "string", "doc": "The key state is kept by (1-128 characters); the Kafka key."},
            {"name": spec.event_time, "type": "long" if spec.time_format == "epoch_ms" else "string",
             "doc": "Event time, epoch milliseconds." if spec.time_format == "epoch_ms" else
             "Event time, ISO-8601 with a zone."}]
    if name == "input":
        fields = [{"name": f.name, "type": ["null", _AVRO_TYPES[f.type]], "default": None} if f.optional
                  else {"name": f.name, "type": _AVRO_TYPES[f.type]} for f in spec.fields]
        return {"type": "record", "name": spec.avro_record, "namespace": "seam",
                "doc": f"An input event of feature spec {spec.name!r}. Producers may add fields (with defaults): "
                       "seam reads the ones below.", "fields": head + fields}
    head[2] = {"name": spec.event_time, "type": "long", "doc": "The event's time, epoch milliseconds."}
    if name == "prediction":
        timing = {"type": "record", "name": "Timing", "fields": [
            {"name": "queue_ms", "type": "double", "doc": "Time in the model boundary's queue."},
            {"name": "infer_ms", "type": "double", "doc": "The batch's inference time."},
            {"name": "batch_size", "type": "int"}]}
        return {"type": "record", "name": "Prediction", "namespace": "seam", "doc": "One scored event.",
                "fields": [*head, {"name": "score", "type": "double"},
                           {"name": spec.label, "type": "boolean", "doc": "score >= the worker's threshold."},
                           {"name": "model", "type": "string", "doc": "The model that scored it: name@version."},
                           {"name": "timing", "type": timing}]}
    if name == "features":
        features = {"type": "record", "name": "Features",
                    "fields": [{"name": feature, "type": "double"} for feature in spec.names]}
        return {"type": "record", "name": "FeatureRecord", "namespace": "seam",
                "doc": "The features a prediction was scored with (the feature log), the spec's names in model order.",
                "fields": [*head, {"name": "feature_set", "type": "string",
                                   "doc": "<count>-<digest of the names>, as tables.spec.feature_set_version."},
                           {"name": "features", "type": features}]}
    if name == "shadow-score":
        return {"type": "record", "name": "ShadowScore", "namespace": "seam",
                "doc": "A shadow model's score for an event, for offline comparison.",
                "fields": [*head, {"name": "score", "type": "double"}, {"name": "model", "type": "string"}]}
    raise ValueError(f"no schema {name!r}: the schemas are input, {', '.join(OUTPUTS)}")


class RegistryUnavailable(Exception):  # noqa: N818 - a condition, named for what it says
    """The registry did not answer (refused, timed out, or answered with a server error)."""


async def _read_at_most(response: aiohttp.ClientResponse, limit: int, what: str) -> bytes:
    """The body of ``response``, unless it is longer than ``limit`` bytes (then it is not read further)."""
    if response.content_length is not None and response.content_length > limit:
        raise RegistryUnavailable(f"{what}: an answer of more than {limit} bytes, not read")
    body = bytearray()
    while chunk := await response.content.read(limit + 1 - len(body)):
        body += chunk
        if len(body) > limit:
            raise RegistryUnavailable(f"{what}: an answer of more than {limit} bytes, not read")
    return bytes(body)


class SchemaRegistry:
    """A Confluent-compatible schema registry at ``url`` (Apicurio's ``.../apis/ccompat/v6``, Confluent's root)."""

    def __init__(self, url: str, *, username: str = "", password: str = "", ca_file: str = "") -> None:
        """``username`` and ``password``: the registry's basic auth; ``ca_file``: the CA of its certificate."""
        self.url = url.rstrip("/")
        self._auth = aiohttp.BasicAuth(username, password) if username else None
        self._ssl = ssl.create_default_context(cafile=ca_file) if ca_file else None
        self._session: aiohttp.ClientSession | None = None

    def __repr__(self) -> str:  # never the password
        return f"<SchemaRegistry {self.url}{' as ' + self._auth.login if self._auth else ''}>"

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(ssl=self._ssl) if self._ssl is not None else None
            self._session = aiohttp.ClientSession(headers={"Accept": CONTENT_TYPE}, auth=self._auth,
                                                  connector=connector)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _call(self, method: str, path: str, timeout_s: float, body: Any = None) -> tuple[int, Any]:
        try:
            async with self._client().request(
                    method, self.url + path, timeout=aiohttp.ClientTimeout(total=timeout_s),
                    data=None if body is None else orjson.dumps(body),
                    headers=None if body is None else {"Content-Type": CONTENT_TYPE}) as response:
                text = await _read_at_most(response, MAX_ANSWER_BYTES, f"{method} {self.url}{path}")
                status = response.status
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise RegistryUnavailable(f"{method} {self.url}{path}: {exc!r}") from exc
        if status >= 500:
            raise RegistryUnavailable(f"{method} {self.url}{path}: HTTP {status} {text[:200]!r}")
        try:
            return status, orjson.loads(text) if text else None
        except orjson.JSONDecodeError as exc:
            raise RegistryUnavailable(f"{method} {self.url}{path}: not JSON: {text[:200]!r}") from exc

    async def schema(self, schema_id: int, timeout_s: float = 2.0) -> tuple[str, str] | None:
        """The schema registered with ``schema_id`` as (type, text), or None if the registry has no such id."""
        status, body = await self._call("GET", f"/schemas/ids/{schema_id}", timeout_s)
        if status == 404 or (isinstance(body, dict) and body.get("error_code") == UNKNOWN_SCHEMA):
            return None
        if status != 200 or not isinstance(body, dict) or not isinstance(body.get("schema"), str):
            raise RegistryUnavailable(f"schema {schema_id}: unexpected answer HTTP {status} {body!r:.200}")
        return str(body.get("schemaType") or "AVRO"), body["schema"]

    async def register(self, subject: str, schema: dict[str, Any], timeout_s: float = 5.0) -> int:
        """Register ``schema`` (Avro) under ``subject``; return its id (the existing one if it is registered)."""
        status, body = await self._call("POST", f"/subjects/{subject}/versions", timeout_s,
                                        {"schema": json.dumps(schema, separators=(",", ":"))})
        if status != 200 or not isinstance(body, dict) or not isinstance(body.get("id"), int):
            raise ValueError(f"the registry refused the schema for subject {subject!r}: HTTP {status} {body!r}")
        return int(body["id"])


@dataclass(frozen=True, slots=True)
class _Refused:
    """A schema id whose records are refused until ``until`` (then looked up again)."""

    invalid: Invalid
    until: float


Fetch = Callable[[int, float], Awaitable[tuple[str, str] | None]]  # (schema id, timeout) -> (type, text) or None


@dataclass(frozen=True, slots=True)
class WriterSchema:
    """A producer's schema as records of it are decoded: parsed for fastavro, and whether it declares the
    contract's fields with their types (then only their values are checked)."""

    parsed: Any
    typed: bool


# The Avro types that give the Python types a spec's field type needs (a float field also takes integers).
_READS = {"float": ("double", "float", "long", "int"), "int": ("long", "int"), "bool": ("boolean",),
          "string": ("string",)}


def writer_schema(schema: Any, contract: Contract = DEFAULT_CONTRACT) -> WriterSchema:
    """Parse a writer schema for decoding. An event time declared as ``timestamp-millis`` is read as the long it
    is on the wire (epoch milliseconds), not converted to a datetime."""
    if isinstance(schema, dict) and schema.get("type") == "record" and isinstance(schema.get("fields"), list):
        fields = [dict(f, type=f["type"]["type"]) if f.get("name") == contract.event_time
                  and isinstance(f.get("type"), dict) and f["type"].get("logicalType") == "timestamp-millis"
                  else f for f in schema["fields"]]
        schema = dict(schema, fields=fields)
    return WriterSchema(parse_schema(schema), declares_contract(schema, contract))


def declares_contract(schema: Any, contract: Contract = DEFAULT_CONTRACT) -> bool:
    """Whether a record schema declares every field of the contract with a type that fits it (a required field
    without null; an optional one with or without)."""
    if not isinstance(schema, dict) or schema.get("type") != "record" or not isinstance(schema.get("fields"), list):
        return False
    types = {f.get("name"): f.get("type") for f in schema["fields"] if isinstance(f, dict)}
    time_types = ("string",) if contract.iso_time else ("long", "int")
    required: list[tuple[str, tuple[str, ...]]] = [
        (contract.event_id, ("string",)), (contract.key, ("string",)), (contract.event_time, time_types)]
    required += [(f.name, _READS[f.type]) for f in contract.spec.fields if not f.optional]
    if any(types.get(name) not in allowed for name, allowed in required):
        return False
    for f in contract.spec.fields:
        if f.optional and f.name in types:
            declared = types[f.name]
            options = declared if isinstance(declared, list) else [declared]
            if any(option not in ("null", *_READS[f.type]) for option in options):
                return False
    return True


class SchemaCache:
    """Writer schemas fetched once (parsed for fastavro, by their wire-format header); refusals by id, for a while."""

    UNKNOWN_RECHECK_S = 60.0  # an id the registry did not have is asked for again after this
    RETRY_AFTER_S = 5.0  # after the registry did not answer, ids it was asked for are refused this long
    ATTEMPT_TIMEOUT_S = 2.0
    # Records naming random schema ids would cost one registry request each: while this many ids turned out
    # unknown within UNKNOWN_RECHECK_S or are being looked up, further new ids are refused without asking
    # (for RETRY_AFTER_S, as when the registry does not answer; the dead letters can be replayed).
    UNKNOWN_BUDGET = 32
    MAX_REFUSED = 4096  # refusals kept (the oldest go first): ids seen once do not pile up

    def __init__(self, fetch: Fetch, *, timeout_s: float, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 on_lookup: Callable[[str], None] | None = None, contract: Contract = DEFAULT_CONTRACT) -> None:
        self._fetch = fetch
        self.contract = contract
        self.timeout_s = timeout_s
        self._clock = clock
        self._sleep = sleep
        self._on_lookup = on_lookup
        # The wire-format header (magic byte and id) of every schema found -> the schema: what decoding reads.
        self.by_header: dict[bytes, WriterSchema] = {}
        self.refused: dict[int, _Refused] = {}  # ids whose records are refused for now (oldest first)
        self._lookups: dict[int, asyncio.Future[None]] = {}
        self._unknown: collections.deque[float] = collections.deque()  # when lookups found an id unknown

    def needs(self, schema_id: int) -> bool:
        """Whether ``schema_id`` must be looked up before its records can be decoded."""
        if frame(schema_id, b"") in self.by_header:
            return False
        refusal = self.refused.get(schema_id)
        return refusal is None or refusal.until <= self._clock()

    async def resolve(self, schema_ids: Iterable[int]) -> None:
        """Look up the ids that need it (concurrently; one request per id however many ask)."""
        waits = []
        for schema_id in schema_ids:
            if not self.needs(schema_id):
                continue
            lookup = self._lookups.get(schema_id)
            if lookup is None:
                if self._over_unknown_budget():
                    message = (f"schema id {schema_id} was not looked up: {len(self._unknown)} ids were unknown to "
                               f"the schema registry in the last {self.UNKNOWN_RECHECK_S:g} s and "
                               f"{len(self._lookups)} are being looked up")
                    self._refuse(schema_id, Invalid("unknown_schema_id", message), self._clock() + self.RETRY_AFTER_S)
                    continue
                lookup = self._lookups[schema_id] = asyncio.ensure_future(self._look_up(schema_id))
                lookup.add_done_callback(functools.partial(self._looked_up, schema_id))
            waits.append(lookup)
        if waits:
            await asyncio.gather(*waits)

    def _looked_up(self, schema_id: int, _done: asyncio.Future[None]) -> None:
        self._lookups.pop(schema_id, None)

    async def _look_up(self, schema_id: int) -> None:
        deadline = self._clock() + self.timeout_s
        delay, error = 0.05, ""
        while True:
            remaining = deadline - self._clock()
            try:
                found = await self._fetch(schema_id, max(0.05, min(self.ATTEMPT_TIMEOUT_S, remaining)))
            except RegistryUnavailable as exc:
                error = str(exc)
            else:
                self._found(schema_id, found)
                return
            remaining = deadline - self._clock()
            if remaining <= 0:
                break
            await self._sleep(min(delay, remaining))
            delay = min(delay * 2, 1.0)
        logger.warning("schema registry unavailable: schema id %d not fetched within %.1f s (%s); its records go "
                       "to the dead-letter topic for %.0f s, then it is asked for again", schema_id, self.timeout_s,
                       error, self.RETRY_AFTER_S)
        self._count("unavailable")
        self._refuse(schema_id, Invalid(
            "registry_unavailable", f"schema id {schema_id}: the schema registry did not answer within "
                                    f"{self.timeout_s:g} s ({error})"), self._clock() + self.RETRY_AFTER_S)

    def _over_unknown_budget(self) -> bool:
        """Whether ``UNKNOWN_BUDGET`` ids turned out unknown within the last ``UNKNOWN_RECHECK_S`` or are being
        looked up (such ids are refused for ``RETRY_AFTER_S``, then may be asked for)."""
        unknown, oldest = self._unknown, self._clock() - self.UNKNOWN_RECHECK_S
        while unknown and unknown[0] <= oldest:
            unknown.popleft()
        return len(unknown) + len(self._lookups) >= self.UNKNOWN_BUDGET

    def _refuse(self, schema_id: int, invalid: Invalid, until: float) -> None:
        refused = self.refused
        refused.pop(schema_id, None)
        refused[schema_id] = _Refused(invalid, until)  # to the end: the newest refusal
        while len(refused) > self.MAX_REFUSED:
            del refused[next(iter(refused))]

    def _found(self, schema_id: int, found: tuple[str, str] | None) -> None:
        if found is None:
            logger.warning("schema id %d is not in the schema registry; its records go to the dead-letter topic",
                           schema_id)
            self._count("unknown")
            self._unknown.append(self._clock())
            self._refuse(schema_id, Invalid("unknown_schema_id",
                                            f"schema id {schema_id} is not in the schema registry"),
                         self._clock() + self.UNKNOWN_RECHECK_S)
            return
        kind, text = found
        try:
            if kind.upper() != "AVRO":
                raise ValueError(f"a {kind} schema, not Avro")
            parsed = writer_schema(json.loads(text), self.contract)
        except Exception as exc:  # noqa: BLE001 - not JSON, not a schema fastavro can read
            self._count("unsupported")
            self._refuse(schema_id, Invalid("unsupported_schema", f"schema id {schema_id} cannot be read: {exc}"),
                         float("inf"))
            return
        self._count("found")
        self.refused.pop(schema_id, None)
        self.by_header[frame(schema_id, b"")] = parsed
        logger.info("schema id %d fetched from the schema registry", schema_id)

    def _count(self, result: str) -> None:
        if self._on_lookup is not None:
            self._on_lookup(result)


class AvroInput:
    """Decodes Confluent-framed Avro input records (their schemas looked up per batch, before decoding)."""

    def __init__(self, cache: SchemaCache, max_bytes: int = MAX_RECORD_BYTES) -> None:
        self.cache = cache
        self.contract = cache.contract
        self.max_bytes = max_bytes

    async def prepare(self, values: Iterable[bytes | None]) -> None:
        """Fetch the writer schemas these values name that are not cached (waits for the registry)."""
        known, needs = self.cache.by_header, self.cache.needs
        headers = {value[:HEADER_BYTES] for value in values if value is not None and len(value) > HEADER_BYTES}
        missing = [schema_id for header in headers if header not in known
                   and header[0] == MAGIC and needs(schema_id := _schema_id(header))]
        if missing:
            await self.cache.resolve(missing)

    def decode(self, raw: bytes | None) -> Event | Invalid:
        """Decode and validate one record value (its schema resolved by :meth:`prepare`); never raises."""
        if raw is None or len(raw) == 0:
            return Invalid("empty_value", "record has no value")
        size = len(raw)
        if size > self.max_bytes:
            return Invalid("too_large", f"value is {size} bytes, the limit is {self.max_bytes}")
        schema = self.cache.by_header.get(raw[:HEADER_BYTES])
        if schema is None:
            return self._not_decodable(raw)
        stream = io.BytesIO(raw)
        stream.seek(HEADER_BYTES)
        try:
            obj = schemaless_reader(stream, schema.parsed, None)
        except Exception as exc:  # noqa: BLE001 - any malformed payload (EOF, bad UTF-8, bad union index)
            return Invalid("undecodable", f"not an Avro record of schema id {_schema_id(raw)}: {exc!r}")
        if stream.tell() != size:
            return Invalid("undecodable", f"{size - stream.tell()} bytes left after the Avro record of schema id "
                                          f"{_schema_id(raw)}")
        if schema.typed:  # a record schema with the contract's types
            return self.contract.validate(obj, typed=True)  # type: ignore[arg-type]
        if not isinstance(obj, dict):
            return Invalid("not_a_record", f"schema id {_schema_id(raw)} is not a record schema")
        return self.contract.validate(obj)

    def _not_decodable(self, raw: bytes) -> Invalid:
        """Why a value whose header names no schema found cannot be decoded."""
        if len(raw) <= HEADER_BYTES or raw[0] != MAGIC:
            return Invalid("not_framed", "not in the Confluent wire format (a zero byte, a 4-byte schema id, "
                                         f"then the Avro record): {len(raw)} bytes starting {raw[:HEADER_BYTES]!r}")
        schema_id = _schema_id(raw)
        refusal = self.cache.refused.get(schema_id)
        if refusal is not None:
            return refusal.invalid
        return Invalid("registry_unavailable", f"schema id {schema_id} was not looked up")


def _schema_id(raw: bytes) -> int:
    return int.from_bytes(raw[1:HEADER_BYTES], "big")


class AvroWriter:
    """Encodes data of one registered schema in the Confluent wire format."""

    __slots__ = ("schema_id", "_header", "_schema")

    def __init__(self, schema_id: int, schema: dict[str, Any]) -> None:
        self.schema_id = schema_id
        self._header = frame(schema_id, b"")
        self._schema = parse_schema(schema)

    def __call__(self, datum: dict[str, Any]) -> bytes:
        stream = io.BytesIO(self._header)
        stream.seek(HEADER_BYTES)
        schemaless_writer(stream, self._schema, datum)
        return stream.getvalue()


async def input_writer(registry_url: str, subject: str, spec: FeatureSpec, timeout_s: float = 10.0) -> AvroWriter:
    """A producer's encoder of input events (dicts) with ``spec``'s input schema, registered under ``subject`` first."""
    registry = SchemaRegistry(registry_url)
    try:
        schema = schema_for("input", spec)
        return AvroWriter(await registry.register(subject, schema, timeout_s), schema)
    finally:
        await registry.close()


class AvroEncoder:
    """seam's output records in Avro: the spec's output schemas (:func:`schema_for`), registered under
    ``<topic>-value``.

    Encoded field by field for these schemas (a third of fastavro's cost per record: no dict built, no
    generic dispatch), and checked byte for byte against fastavro's encoding of the same schemas at start
    (:meth:`check`): an encoder that drifted from its schema refuses to start.
    """

    def __init__(self, ids: dict[str, int], contract: Contract) -> None:
        self.contract = contract
        self._features = struct.Struct(f"<{len(contract.spec.names)}d")
        self._headers = {name: frame(schema_id, b"") for name, schema_id in ids.items()}
        self._last: tuple[Event | None, bytes] = (None, b"")

    @classmethod
    def check(cls, contract: Contract) -> None:
        """Refuse to start if what seam writes is not what its schemas say (the spec's names, in order, included)."""
        spec = contract.spec
        outputs = cls(dict.fromkeys(OUTPUTS, 1), contract)
        reference = {name: AvroWriter(1, schema_for(name, spec)) for name in OUTPUTS}
        count = len(spec.names)
        values = tuple(float(i) - count / 2 for i in range(count))
        for tx, score in ((Event("e-1", "c-1", 1_700_000_000_000, ()), 0.25),
                          (Event("é" * 70, "ç-💳", 9_999_999_999_999, ()), 0.75)):
            samples = {
                "prediction": (outputs.prediction(tx, score=score, threshold=0.5, model="model@12", queue_ms=1.5,
                                                  infer_ms=0.1234, batch_size=300),
                               _prediction_datum(contract, tx, score, 0.5, "model@12", 1.5, 0.1234, 300)),
                "features": (outputs.feature_record(tx, feature_set="15-abc", features=values),
                             _head(contract, tx) | {"feature_set": "15-abc",
                                                    "features": dict(zip(spec.names, values, strict=True))}),
                "shadow-score": (outputs.shadow_score(tx, score=score, model="model@2"),
                                 _head(contract, tx) | {"score": score, "model": "model@2"}),
            }
            for name, (written, datum) in samples.items():
                validate(datum, parse_schema(schema_for(name, spec)), raise_errors=True, strict=True)
                if written != reference[name](datum):
                    raise ValueError(f"the {name} schema does not match what seam writes for it "
                                     "(agents.formats.avro.AvroEncoder): change both together")

    @classmethod
    async def register(cls, registry: SchemaRegistry, subjects: dict[str, str], contract: Contract,
                       timeout_s: float) -> AvroEncoder:
        """Check the schemas, register each under its subject (schema name -> subject), retrying up to ``timeout_s``."""
        cls.check(contract)
        deadline = time.monotonic() + timeout_s
        ids = {}
        for name, subject in subjects.items():
            while True:
                try:
                    ids[name] = await registry.register(subject, schema_for(name, contract.spec))
                    break
                except RegistryUnavailable:
                    if time.monotonic() >= deadline:
                        raise
                    await asyncio.sleep(0.5)
            logger.info("output schema %s registered under %s as id %d", name, subject, ids[name])
        return cls(ids, contract)

    def prediction(self, tx: Event, *, score: float, threshold: float, model: str, queue_ms: float,
                   infer_ms: float, batch_size: int) -> bytes:
        """The prediction schema."""
        return b"".join((self._headers["prediction"], self._start(tx), _DOUBLE.pack(score),
                         b"\x01" if score >= threshold else b"\x00", _tag(model),
                         _TWO_DOUBLES.pack(round(queue_ms, 3), round(infer_ms, 3)), _long(batch_size)))

    def feature_record(self, tx: Event, *, feature_set: str, features: Sequence[float]) -> bytes:
        """The features schema."""
        return b"".join((self._headers["features"], self._start(tx), _tag(feature_set),
                         self._features.pack(*features)))

    def shadow_score(self, tx: Event, *, score: float, model: str) -> bytes:
        """The shadow-score schema."""
        return b"".join((self._headers["shadow-score"], self._start(tx), _DOUBLE.pack(score), _tag(model)))

    def _start(self, tx: Event) -> bytes:
        """The fields every output schema starts with: id, key, time (a prediction and its feature-log record
        are encoded one after the other: the second reuses them)."""
        last, start = self._last
        if tx is not last:
            start = _string(tx.id) + _string(tx.key) + _long(tx.ts)
            self._last = (tx, start)
        return start


# Avro's binary encoding: int and long as zig-zag varints, string as its UTF-8 length (a long) and bytes,
# double as 8 bytes little-endian, boolean as one byte, a record as its fields in order.
_BYTE = [bytes((n,)) for n in range(128)]
_DOUBLE = struct.Struct("<d")
_TWO_DOUBLES = struct.Struct("<dd")


def _varint(n: int) -> bytes:
    if n < 0x80:
        return _BYTE[n]
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _long(value: int) -> bytes:
    return _varint((value << 1) ^ (value >> 63))


def _string(text: str) -> bytes:
    data = text.encode()
    return _varint(len(data) << 1) + data


@functools.lru_cache(maxsize=64)
def _tag(text: str) -> bytes:
    """A string that repeats on every record (a model's tag, the feature set)."""
    return _string(text)


def _head(contract: Contract, tx: Event) -> dict[str, Any]:
    return {contract.event_id: tx.id, contract.key: tx.key, contract.event_time: tx.ts}


def _prediction_datum(contract: Contract, tx: Event, score: float, threshold: float, model: str, queue_ms: float,
                      infer_ms: float, batch_size: int) -> dict[str, Any]:
    return _head(contract, tx) | {"score": score, contract.label: score >= threshold, "model": model,
                                  "timing": {"queue_ms": round(queue_ms, 3), "infer_ms": round(infer_ms, 3),
                                             "batch_size": batch_size}}
