"""Decode and validate raw transaction records; encode predictions and dead letters (pure code)."""

from __future__ import annotations

import base64
import dataclasses
import json
import math
import struct
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

__all__ = [
    "Invalid",
    "JsonInput",
    "Transaction",
    "dead_letter",
    "decode_transaction",
    "late_record",
    "FeatureRecord",
    "decode_feature_record",
    "feature_record",
    "prediction",
    "shadow_score",
    "validate_transaction",
]

MAX_RECORD_BYTES = 64 * 1024
MAX_ID_CHARS = 128
# Event times from 2001-09-09 to 2286-11-20 in epoch milliseconds: rejects seconds and microseconds.
MIN_TS_MS = 1_000_000_000_000
MAX_TS_MS = 9_999_999_999_999
MAX_ABS_AMOUNT = 1e12


@dataclass(frozen=True, slots=True)
class Transaction:
    """A validated card transaction; ``ts`` is its event time in epoch milliseconds."""

    id: str
    card_id: str
    ts: int
    amount: float
    merchant_id: str
    country: str | None


@dataclass(frozen=True, slots=True)
class Invalid:
    """Why a record was rejected: a stable ``reason`` code and a human ``message``."""

    reason: str
    message: str


class JsonInput:
    """Decodes JSON transaction records (values of at most ``max_bytes``)."""

    __slots__ = ("max_bytes",)

    def __init__(self, max_bytes: int = MAX_RECORD_BYTES) -> None:
        self.max_bytes = max_bytes

    def decode(self, raw: bytes | None) -> Transaction | Invalid:
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
        return validate_transaction(obj)


def decode_transaction(raw: bytes | None, max_bytes: int = MAX_RECORD_BYTES) -> Transaction | Invalid:
    """Decode one JSON record value; never raises on bad input."""
    return JsonInput(max_bytes).decode(raw)


def validate_transaction(obj: dict[str, Any], *, typed: bool = False) -> Transaction | Invalid:
    """Check a decoded record (JSON or Avro) against the transaction contract; never raises.

    ``typed``: the record was decoded with a schema that declares the contract's fields with their types
    (an Avro writer schema, see :func:`agents.avro.declares_contract`): only their values are checked.
    """
    if not typed:
        for name in ("id", "card_id", "ts", "amount", "merchant_id"):
            if name not in obj or obj[name] is None:
                return Invalid("missing_field", f"required field {name!r} is missing")
        for name in ("id", "card_id", "merchant_id"):
            value = obj[name]
            if not isinstance(value, str):
                return Invalid("wrong_type", f"{name!r} must be a string, got {type(value).__name__}")
            if not value.isascii() and not _is_utf8(value):
                return Invalid("invalid_json", f"{name!r} contains an unpaired surrogate escape")
        ts = obj["ts"]
        if isinstance(ts, bool) or not isinstance(ts, int):
            return Invalid("wrong_type", f"'ts' must be an integer (epoch ms), got {type(ts).__name__}")
        amount = obj["amount"]
        if isinstance(amount, bool) or not isinstance(amount, int | float):
            return Invalid("wrong_type", f"'amount' must be a number, got {type(amount).__name__}")
        country = obj.get("country")
        if country is not None and not isinstance(country, str):
            return Invalid("wrong_type", f"'country' must be a string, got {type(country).__name__}")
    else:
        ts, amount, country = obj["ts"], obj["amount"], obj.get("country")
    event_id, card_id, merchant_id = obj["id"], obj["card_id"], obj["merchant_id"]
    if not (0 < len(event_id) <= MAX_ID_CHARS and 0 < len(card_id) <= MAX_ID_CHARS
            and 0 < len(merchant_id) <= MAX_ID_CHARS):
        name = next(n for n, v in (("id", event_id), ("card_id", card_id), ("merchant_id", merchant_id))
                    if not 0 < len(v) <= MAX_ID_CHARS)
        return Invalid("out_of_range", f"{name!r} must have 1..{MAX_ID_CHARS} characters")
    if not MIN_TS_MS <= ts <= MAX_TS_MS:
        return Invalid("out_of_range", f"'ts' {ts} is not an epoch-millisecond time")
    if isinstance(amount, int) and abs(amount) > MAX_ABS_AMOUNT:
        return Invalid("out_of_range", f"'amount' exceeds {MAX_ABS_AMOUNT:g} in magnitude")
    amount = float(amount)
    if not math.isfinite(amount):
        return Invalid("not_finite", f"'amount' must be finite, got {amount}")
    if abs(amount) > MAX_ABS_AMOUNT:
        return Invalid("out_of_range", f"'amount' {amount} exceeds {MAX_ABS_AMOUNT:g} in magnitude")
    # Merchant ids repeat across events and stay in card states for hours: one string object each.
    return Transaction(event_id, card_id, ts, amount, sys.intern(merchant_id), country)


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
) -> bytes:
    """Encode a dead-letter record: the reason, the source position and the original bytes.

    A value larger than ``max_value_bytes`` is cut to that size (``value_truncated``, with the full
    ``value_size``): a dead letter must itself fit in a Kafka record, and the whole original stays
    readable at its source topic, partition and offset.
    """
    key_text, key_b64 = _text_or_base64(key)
    size = None if value is None else len(value)
    truncated = size is not None and size > max_value_bytes
    value_text, value_b64 = _text_or_base64(value[:max_value_bytes] if truncated and value else value)
    return orjson.dumps({
        "reason": invalid.reason,
        "message": invalid.message,
        "topic": topic,
        "partition": partition,
        "offset": offset,
        "key": key_text,
        "key_base64": key_b64,
        "value": value_text,
        "value_base64": value_b64,
        "value_size": size,
        "value_truncated": truncated,
        "routed_at": routed_at_ms,
    })


def prediction(
    tx: Transaction,
    *,
    score: float,
    threshold: float,
    model: str,
    queue_ms: float,
    infer_ms: float,
    batch_size: int,
) -> bytes:
    """Encode one prediction record (its features go to the feature log: :func:`feature_record`)."""
    return orjson.dumps({
        "id": tx.id,
        "card_id": tx.card_id,
        "ts": tx.ts,
        "score": score,
        "is_fraud": score >= threshold,
        "model": model,
        "timing": {"queue_ms": round(queue_ms, 3), "infer_ms": round(infer_ms, 3), "batch_size": batch_size},
    })


def shadow_score(tx: Transaction, *, score: float, model: str) -> bytes:
    """Encode one shadow model's score (keyed by card like the prediction it shadows, for offline comparison)."""
    return orjson.dumps({"id": tx.id, "card_id": tx.card_id, "ts": tx.ts, "score": score, "model": model})


_FEATURE_HEADER = struct.Struct("<B6sqH")  # format, feature-set digest, event time (ms), feature count
FEATURE_RECORD_FORMAT = 1


@dataclass(frozen=True, slots=True)
class FeatureRecord:
    """A decoded feature-log record (its key, the card id, is the record's key)."""

    id: str
    ts: int
    feature_set: str
    features: tuple[float, ...]


def feature_record(tx: Transaction, *, feature_set: str, features: Sequence[float]) -> bytes:
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
    tx: Transaction,
    *,
    raw: bytes,
    watermark: int,
    topic: str,
    partition: int,
    offset: int,
    routed_at_ms: int,
    raw_is_json: bool = True,
) -> bytes:
    """Encode a late event: the original record, why it was not applied, and where it came from.

    ``raw_is_json``: the record is embedded as it came; otherwise (Avro) as the transaction's fields,
    with the original bytes in ``value_base64``.
    """
    record: dict[str, Any] = {
        "reason": "late",
        "message": f"event time {tx.ts} is below the partition watermark {watermark}",
        "watermark": watermark,
        "topic": topic,
        "partition": partition,
        "offset": offset,
        "event": orjson.Fragment(raw) if raw_is_json else dataclasses.asdict(tx),
        "routed_at": routed_at_ms,
    }
    if not raw_is_json:
        record["value_base64"] = base64.b64encode(raw).decode("ascii")
    return orjson.dumps(record)
