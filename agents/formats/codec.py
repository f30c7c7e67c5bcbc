"""Decode and validate raw input records by their feature spec; encode predictions and dead letters (pure code).

A :class:`Contract` is what a spec (:mod:`tables.spec`) asks of an input record: its key, event id and
event time, and its declared fields with their types and bounds. It turns a decoded record (JSON or
Avro) into an :class:`Event`, or says why not with an :class:`Invalid` (a dead-letter reason), and it
names the fields of the outputs (predictions and shadow scores carry the spec's id, key and time).
"""

from __future__ import annotations

import base64
import json
import struct
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson

from tables.features import DEFAULT_SPEC
from tables.spec import MAX_ID_CHARS, FeatureSpec, Field, check_value

__all__ = [
    "DEFAULT_CONTRACT",
    "Contract",
    "Event",
    "Invalid",
    "JsonInput",
    "Original",
    "dead_letter",
    "dead_letter_key",
    "original_of",
    "headers_record",
    "late_record",
    "FeatureRecord",
    "decode_feature_record",
    "feature_record",
]

MAX_RECORD_BYTES = 64 * 1024
# Event times from 2001-09-09 to 2286-11-20 in epoch milliseconds: rejects seconds and microseconds.
MIN_TS_MS = 1_000_000_000_000
MAX_TS_MS = 9_999_999_999_999
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MILLISECOND = timedelta(milliseconds=1)


@dataclass(frozen=True, slots=True)
class Event:
    """A validated input record: ``ts`` is its event time in epoch milliseconds, ``values`` the values of
    its spec's stored fields (``spec.stored``, in order; numbers as floats) that its features read."""

    id: str
    key: str
    ts: int
    values: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Invalid:
    """Why a record was rejected: a stable ``reason`` code and a human ``message``."""

    reason: str
    message: str


def _acceptor(contract: Contract) -> Callable[[dict[str, Any]], Event | None]:
    """The contract's checks compiled into one function of a decoded record: its :class:`Event` where every value
    has exactly its declared type (an ``int`` also where a number is declared) and lies within its bounds, else
    None, and :meth:`Contract.checked` says why (or accepts what this leaves to it: a non-ASCII value of a string
    field, a ``str`` subclass).

    Checking an example transaction field by field through :func:`tables.spec.check_value` took 2.9 µs of the
    4.1 µs its JSON took to decode; in one pass 1.6 of 2.7. The checks here are the same comparisons against the
    same bounds, so what this accepts :meth:`Contract.checked` accepts too, as the same event
    (``tests/unit/test_codec.py`` holds them to each other).
    """
    spec = contract.spec
    constants: dict[str, Any] = {"Event": Event, "intern": sys.intern, "iso_ms": _iso_ms}
    lines = ["def accept(obj):", "    get = obj.get"]
    requirements = []
    for var, name in (("i", contract.event_id), ("k", contract.key)):
        lines.append(f"    {var} = get({name!r})")
        # (an unpaired surrogate is not printable)
        requirements.append(f"type({var}) is str and 0 < len({var}) <= {MAX_ID_CHARS} and {var}.isprintable()")
    lines.append(f"    t = get({contract.event_time!r})")
    if contract.iso_time:
        lines.append("    t = iso_ms(t)")
    requirements.append(f"type(t) is int and {MIN_TS_MS} <= t <= {MAX_TS_MS}")
    lines.append(f"    if not ({' and '.join(requirements)}):")
    lines.append("        return None")
    values = ["None"] * len(spec.stored)
    for index, (field, numeric, slot) in enumerate(contract._fields):
        var = f"v{index}"
        lines.append(f"    {var} = get({field.name!r})")
        fits = _fits(field, var, index, constants)
        if field.optional:
            # A missing optional field takes its default unchecked, as Contract.checked takes it.
            default = field.default
            if default is not None:
                constants[f"d{index}"] = float(default) if numeric else sys.intern(default)
            lines += [f"    if {var} is None:", f"        {var} = {f'd{index}' if default is not None else 'None'}",
                      f"    elif not ({fits}):", "        return None"]
        else:
            lines += [f"    if not ({fits}):", "        return None"]
        if slot >= 0:
            # Numbers stored as floats, strings as one object each (a default already is).
            convert = f"{var} = {'float' if numeric else 'intern'}({var})"
            lines.append(f"    else:\n        {convert}" if field.optional else f"    {convert}")
            values[slot] = var
    lines.append(f"    return Event(i, k, t, ({''.join(f'{v}, ' for v in values)}))")
    exec("\n".join(lines), constants)  # noqa: S102 - source built above from the spec's names and bounds
    return constants["accept"]  # type: ignore[no-any-return]


def _fits(field: Field, var: str, index: int, constants: dict[str, Any]) -> str:
    """An expression: whether ``var`` has exactly ``field``'s type and lies within its bounds."""
    kind = field.type
    if kind == "string":
        return f"type({var}) is str and 0 < len({var}) <= {field.max_chars} and {var}.isascii()"
    if kind == "bool":
        return f"type({var}) is bool"
    constants[f"lo{index}"], constants[f"hi{index}"] = field.bounds  # check_value's bounds, all of them
    types = f"type({var}) is int" if kind == "int" else f"(type({var}) is float or type({var}) is int)"
    return f"{types} and lo{index} <= {var} <= hi{index}"


def _iso_ms(value: Any) -> int | str:
    """An ISO-8601 time with a zone (``2026-12-02T13:35:14.250+00:00``, ``...Z``) in epoch ms, or why not."""
    if not isinstance(value, str):
        return f"must be an ISO-8601 time with a zone, got {type(value).__name__}"
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return f"{value[:64]!r} is not an ISO-8601 time"
    if parsed.tzinfo is None:
        return f"{value[:64]!r} has no zone (add Z or +hh:mm)"
    return (parsed - _EPOCH) // _MILLISECOND  # exact: whole milliseconds, rounded down


class Contract:
    """What a feature spec asks of an input record, and the names its outputs carry."""

    __slots__ = ("_accept", "_fields", "event_id", "event_time", "iso_time", "key", "label", "spec")

    def __init__(self, spec: FeatureSpec) -> None:
        self.spec = spec
        self.event_id, self.key, self.event_time = spec.event_id, spec.key, spec.event_time
        self.iso_time = spec.time_format == "iso8601"
        self.label = spec.label
        slots = {name: index for index, name in enumerate(spec.stored)}
        # (field, numeric, its slot in Event.values or -1): checked in declaration order.
        self._fields = tuple((f, f.type != "string", slots.get(f.name, -1)) for f in spec.fields)
        self._accept = _acceptor(self)

    def validate(self, obj: dict[str, Any], *, typed: bool = False) -> Event | Invalid:
        """Check a decoded record (JSON or Avro) against the contract; never raises.

        ``typed``: the record was decoded with a schema that declares the contract's fields with their
        types (an Avro writer schema, see :func:`agents.formats.avro.declares_contract`): only values are checked.
        """
        event = self._accept(obj)  # the common case, a record that passes every check, in one pass
        return event if event is not None else self.checked(obj, typed=typed)

    def checked(self, obj: dict[str, Any], *, typed: bool = False) -> Event | Invalid:
        """:meth:`validate` check by check, in declaration order: the first check that fails says why."""
        event_id: Any = obj.get(self.event_id)
        key: Any = obj.get(self.key)
        ts: Any = obj.get(self.event_time)
        for name, value in ((self.event_id, event_id), (self.key, key), (self.event_time, ts)):
            if value is None:
                return Invalid("missing_field", f"required field {name!r} is missing")
        for name, value in ((self.event_id, event_id), (self.key, key)):
            if not typed and not isinstance(value, str):
                return Invalid("wrong_type", f"{name!r} must be a string, got {type(value).__name__}")
            if not 0 < len(value) <= MAX_ID_CHARS:
                return Invalid("out_of_range", f"{name!r} must have 1..{MAX_ID_CHARS} characters")
            if not value.isascii() and not _is_utf8(value):
                return Invalid("invalid_json", f"{name!r} contains an unpaired surrogate escape")
            if not value.isprintable():
                return Invalid("unprintable", f"{name!r} holds {_first_unprintable(value)}: keys and ids must be "
                                              "printable text (no control, format or separator character but the "
                                              "space)")
        if self.iso_time:
            parsed = _iso_ms(ts)
            if isinstance(parsed, str):
                return Invalid("wrong_type" if not isinstance(ts, str) else "out_of_range",
                               f"{self.event_time!r} {parsed}")
            ts = parsed
        elif not typed and (isinstance(ts, bool) or not isinstance(ts, int)):
            return Invalid("wrong_type",
                           f"{self.event_time!r} must be an integer (epoch ms), got {type(ts).__name__}")
        if not MIN_TS_MS <= ts <= MAX_TS_MS:
            return Invalid("out_of_range", f"{self.event_time!r} {ts} is not an epoch-millisecond time")
        values: list[Any] = [None] * len(self.spec.stored)
        for field, numeric, slot in self._fields:
            value = obj.get(field.name)
            if value is None:
                if not field.optional:
                    return Invalid("missing_field", f"required field {field.name!r} is missing")
                value = field.default
                if value is None:
                    continue
            else:
                problem = check_value(field, value)
                if problem is not None:
                    return Invalid(problem[0], f"{field.name!r} {problem[1]}")
                if not numeric and not value.isascii() and not _is_utf8(value):
                    return Invalid("invalid_json", f"{field.name!r} contains an unpaired surrogate escape")
            if slot >= 0:
                # Numbers as floats; strings repeat across events and stay in states for hours: one object each.
                values[slot] = float(value) if numeric else sys.intern(value)
        return Event(event_id, key, ts, tuple(values))

    def prediction(self, tx: Event, *, score: float, threshold: float, model: str, queue_ms: float,
                   infer_ms: float, batch_size: int) -> bytes:
        """Encode one prediction record, JSON (its features go to the feature log: :func:`feature_record`)."""
        return orjson.dumps({
            self.event_id: tx.id,
            self.key: tx.key,
            self.event_time: tx.ts,
            "score": score,
            self.label: score >= threshold,
            "model": model,
            "timing": {"queue_ms": round(queue_ms, 3), "infer_ms": round(infer_ms, 3), "batch_size": batch_size},
        })

    def shadow_score(self, tx: Event, *, score: float, model: str) -> bytes:
        """Encode one shadow model's score, JSON (keyed like the prediction it shadows, for offline comparison)."""
        return orjson.dumps({self.event_id: tx.id, self.key: tx.key, self.event_time: tx.ts, "score": score,
                             "model": model})

    def fields_of(self, tx: Event) -> dict[str, Any]:
        """The event as a record of the spec's names: id, key, time (epoch ms) and the stored fields."""
        return {self.event_id: tx.id, self.key: tx.key, self.event_time: tx.ts,
                **dict(zip(self.spec.stored, tx.values, strict=True))}


DEFAULT_CONTRACT = Contract(DEFAULT_SPEC)


class JsonInput:
    """Decodes JSON input records (values of at most ``max_bytes``) by a contract."""

    __slots__ = ("contract", "max_bytes")

    def __init__(self, contract: Contract = DEFAULT_CONTRACT, max_bytes: int = MAX_RECORD_BYTES) -> None:
        self.contract = contract
        self.max_bytes = max_bytes

    def decode(self, raw: bytes | None) -> Event | Invalid:
        """Decode and validate one record value; never raises on bad input."""
        if raw is None or len(raw) == 0:
            return Invalid("empty_value", "record has no value")
        if len(raw) > self.max_bytes:
            return Invalid("too_large", f"value is {len(raw)} bytes, the limit is {self.max_bytes}")
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            # NaN, Infinity and overflowing numbers are not JSON, but producers that write them (Python's
            # json module does by default) deserve the precise reason; only this rare path pays for it.
            try:
                obj = json.loads(raw)
            except (ValueError, RecursionError):
                return Invalid("invalid_json", f"not valid JSON: {exc}")
        if not isinstance(obj, dict):
            return Invalid("not_an_object", f"expected a JSON object, got {type(obj).__name__}")
        return self.contract.validate(obj)


def _first_unprintable(text: str) -> str:
    position, character = next((i, c) for i, c in enumerate(text) if not c.isprintable())
    return f"U+{ord(character):04X} at position {position}"


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _text_or_base64(raw: bytes | None) -> tuple[str | None, bool]:
    if raw is None:
        return None, False
    try:
        return raw.decode("utf-8"), False
    except UnicodeDecodeError:
        return base64.b64encode(raw).decode("ascii"), True


DEAD_LETTER_VALUE_BYTES = 16 * 1024
# A dead letter's Kafka key is the original key cut to this, and so is the key inside it: an input record's
# key can be as large as the broker accepts, and its dead letter (the key twice, escaped in JSON) must fit too.
DEAD_LETTER_KEY_BYTES = 1024
# A record's Kafka headers go into its dead letter or late record (names and base64 values) up to this many
# bytes of names and values; the rest are left out and the record says so.
HEADER_BYTES = 4096


def headers_record(headers: Sequence[tuple[str, bytes | None]]) -> tuple[list[list[str | None]], bool]:
    """A record's Kafka headers as JSON (``[name, base64 value]`` pairs, in order) and whether some were left out
    (beyond ``HEADER_BYTES``)."""
    kept: list[list[str | None]] = []
    size = 0
    for name, value in headers:
        size += len(name) + (len(value) if value else 0)
        if size > HEADER_BYTES:
            return kept, True
        kept.append([name, None if value is None else base64.b64encode(value).decode("ascii")])
    return kept, False


def dead_letter_key(key: bytes | None) -> bytes | None:
    """The Kafka key of a record's dead letter: its key, cut to ``DEAD_LETTER_KEY_BYTES``."""
    return key if key is None or len(key) <= DEAD_LETTER_KEY_BYTES else key[:DEAD_LETTER_KEY_BYTES]


def dead_letter(
    invalid: Invalid,
    *,
    topic: str,
    partition: int,
    offset: int,
    key: bytes | None,
    value: bytes | None,
    routed_at_ms: int,
    max_value_bytes: int = DEAD_LETTER_VALUE_BYTES,
    headers: Sequence[tuple[str, bytes | None]] = (),
) -> bytes:
    """Encode a dead-letter record: the reason, the source position and the original bytes.

    A value larger than ``max_value_bytes`` is cut to that size (``value_truncated``, with the full
    ``value_size``), and a key larger than ``DEAD_LETTER_KEY_BYTES`` likewise (``key_truncated``,
    ``key_size``): a dead letter must itself fit in a Kafka record (at most about 6 × 17 KiB, every byte
    escaped in JSON), and the whole original stays readable at its source topic, partition and offset.
    """
    key_size = None if key is None else len(key)
    key_truncated = key_size is not None and key_size > DEAD_LETTER_KEY_BYTES
    key_text, key_b64 = _text_or_base64(dead_letter_key(key))
    size = None if value is None else len(value)
    truncated = size is not None and size > max_value_bytes
    value_text, value_b64 = _text_or_base64(value[:max_value_bytes] if truncated and value else value)
    kept_headers, headers_truncated = headers_record(headers)
    return orjson.dumps({
        "reason": invalid.reason,
        "message": invalid.message,
        "topic": topic,
        "partition": partition,
        "offset": offset,
        "key": key_text,
        "key_base64": key_b64,
        "key_size": key_size,
        "key_truncated": key_truncated,
        "value": value_text,
        "value_base64": value_b64,
        "value_size": size,
        "value_truncated": truncated,
        "headers": kept_headers,
        "headers_truncated": headers_truncated,
        "routed_at": routed_at_ms,
    })


@dataclass(frozen=True, slots=True)
class Original:
    """The input record a dead letter keeps, as it was: what a replay sends again."""

    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]


def original_of(letter: dict[str, Any]) -> Original | str:
    """The record a dead letter (:func:`dead_letter`'s JSON) was made from, or why it cannot be sent again whole
    (its key or value was cut to fit, or its headers)."""
    for part in ("key", "value", "headers"):
        if letter.get(f"{part}_truncated"):
            return f"{part}_truncated"

    def raw(text: str | None, b64: bool) -> bytes | None:
        return None if text is None else base64.b64decode(text) if b64 else text.encode("utf-8")

    headers = [(name, None if value is None else base64.b64decode(value)) for name, value in letter.get("headers", [])]
    return Original(raw(letter.get("key"), bool(letter.get("key_base64"))),
                    raw(letter.get("value"), bool(letter.get("value_base64"))), headers)


_FEATURE_HEADER = struct.Struct("<B6sqH")  # format, feature-set digest, event time (ms), feature count
FEATURE_RECORD_FORMAT = 1


@dataclass(frozen=True, slots=True)
class FeatureRecord:
    """A decoded feature-log record (the event's key is the record's Kafka key)."""

    id: str
    ts: int
    feature_set: str
    features: tuple[float, ...]


def feature_record(tx: Event, *, feature_set: str, features: Sequence[float]) -> bytes:
    """Encode the features a prediction was scored with, in the feature set's order (the feature log).

    Binary, little-endian: format byte (1), the feature set's 6-byte digest, event time (int64 ms),
    feature count (uint16), the features (float64 each), then the event id (UTF-8, the rest).
    About 150 bytes for 15 features; :func:`decode_feature_record` reads it back.
    """
    count, digest = feature_set.split("-", 1)
    return (_FEATURE_HEADER.pack(FEATURE_RECORD_FORMAT, bytes.fromhex(digest), tx.ts, int(count))
            + struct.pack(f"<{len(features)}d", *features) + tx.id.encode())


def decode_feature_record(value: bytes) -> FeatureRecord:
    """Read a feature-log record written by :func:`feature_record`."""
    version, digest, ts, count = _FEATURE_HEADER.unpack_from(value)
    if version != FEATURE_RECORD_FORMAT:
        raise ValueError(f"unknown feature record format {version}")
    start = _FEATURE_HEADER.size
    features = struct.unpack_from(f"<{count}d", value, start)
    return FeatureRecord(value[start + 8 * count:].decode(), ts, f"{count}-{digest.hex()}", features)


def late_record(
    tx: Event,
    *,
    raw: bytes,
    watermark: int,
    topic: str,
    partition: int,
    offset: int,
    routed_at_ms: int,
    raw_is_json: bool = True,
    contract: Contract = DEFAULT_CONTRACT,
    headers: Sequence[tuple[str, bytes | None]] = (),
) -> bytes:
    """Encode a late event: the original record, why it was not applied, and where it came from.

    ``raw_is_json``: the record is embedded as it came; otherwise (Avro) as the event's fields by the
    spec's names (:meth:`Contract.fields_of`), with the original bytes in ``value_base64``.
    """
    record: dict[str, Any] = {
        "reason": "late",
        "message": f"event time {tx.ts} is below the partition watermark {watermark}",
        "watermark": watermark,
        "topic": topic,
        "partition": partition,
        "offset": offset,
        "event": orjson.Fragment(raw) if raw_is_json else contract.fields_of(tx),
        "routed_at": routed_at_ms,
    }
    if headers:
        record["headers"], record["headers_truncated"] = headers_record(headers)
    if not raw_is_json:
        record["value_base64"] = base64.b64encode(raw).decode("ascii")
    return orjson.dumps(record)
