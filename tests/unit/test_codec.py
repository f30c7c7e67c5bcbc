"""Unit tests for agents.formats.codec: validation reason codes, dead letters, predictions, late records."""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from agents.formats.codec import (
    DEAD_LETTER_KEY_BYTES,
    DEFAULT_CONTRACT,
    HEADER_BYTES,
    MAX_RECORD_BYTES,
    Contract,
    Event,
    FeatureRecord,
    Invalid,
    JsonInput,
    Original,
    dead_letter,
    dead_letter_key,
    decode_feature_record,
    feature_record,
    headers_record,
    late_record,
    original_of,
)
from specs import SPECS
from tables.features import DEFAULT_SPEC
from tables.spec import MAX_ID_CHARS, load_spec, parse_spec

TS = 1_764_500_000_123
prediction = DEFAULT_CONTRACT.prediction


def decode_transaction(raw: bytes | None, max_bytes: int = MAX_RECORD_BYTES) -> Event | Invalid:
    """Decode a record of the example spec (card transactions) as a JSON worker does."""
    return JsonInput(DEFAULT_CONTRACT, max_bytes).decode(raw)


def transaction(id: str, card_id: str, ts: int, amount: float, merchant_id: str,  # noqa: A002 - the field's name
                country: str | None = None) -> Event:
    """The event a card transaction of the example spec becomes (its stored fields: amount and merchant)."""
    return Event(id, card_id, ts, (float(amount), merchant_id))
PROPERTY = hsettings(max_examples=300, derandomize=True, database=None, deadline=None)
REASONS = {
    "empty_value",
    "unprintable",
    "too_large",
    "invalid_json",
    "not_an_object",
    "missing_field",
    "wrong_type",
    "out_of_range",
    "not_finite",
}


@pytest.fixture
def record() -> Callable[..., dict[str, Any]]:
    """Factory: a valid transaction dict, with overrides; pass ``drop=[...]`` to remove fields."""

    def make(drop: tuple[str, ...] = (), **overrides: Any) -> dict[str, Any]:
        obj: dict[str, Any] = {
            "id": "tx-1",
            "card_id": "c-1",
            "ts": TS,
            "amount": 12.5,
            "merchant_id": "m-1",
            "country": "DE",
        }
        obj.update(overrides)
        for name in drop:
            obj.pop(name)
        return obj

    return make


def encode(obj: Any) -> bytes:
    """JSON-encode like a Python producer would (NaN/Infinity allowed)."""
    return json.dumps(obj).encode()


def reason(raw: bytes | None, **kwargs: Any) -> str:
    """Decode and return the Invalid reason (fails the test on an Event)."""
    result = decode_transaction(raw, **kwargs)
    assert isinstance(result, Invalid), result
    assert result.message
    return result.reason


# --- valid records --------------------------------------------------------------------------------


def test_valid_record_decodes(record: Callable[..., dict[str, Any]]) -> None:
    """A valid record becomes an Event with the same values."""
    tx = decode_transaction(encode(record()))
    assert tx == transaction(
        id="tx-1", card_id="c-1", ts=TS, amount=12.5, merchant_id="m-1", country="DE"
    )


def test_integer_amount_becomes_float(record: Callable[..., dict[str, Any]]) -> None:
    """An integer amount is accepted and stored as float."""
    tx = decode_transaction(encode(record(amount=7)))
    assert isinstance(tx, Event)
    amount = tx.values[DEFAULT_SPEC.stored.index("amount")]
    assert amount == 7.0 and type(amount) is float


def test_country_is_optional(record: Callable[..., dict[str, Any]]) -> None:
    """A missing or null country is accepted (no feature reads it), a country that is not a string is not."""
    for obj in (record(drop=("country",)), record(country=None)):
        tx = decode_transaction(encode(obj))
        assert tx == decode_transaction(encode(record()))
    wrong = decode_transaction(encode(record(country=49)))
    assert isinstance(wrong, Invalid) and wrong.reason == "wrong_type" and "country" in wrong.message


def test_unknown_fields_are_ignored(record: Callable[..., dict[str, Any]]) -> None:
    """Extra fields of any type do not affect the result."""
    obj = record(extra={"nested": [1, 2]}, flag=True, note=None, score=1e300)
    assert decode_transaction(encode(obj)) == decode_transaction(encode(record()))


def test_boundary_values_are_accepted(record: Callable[..., dict[str, Any]]) -> None:
    """Limits are inclusive: 128-char ids, ts range ends, amount +-1e12; zero/negative ok."""
    for obj in (
        record(id="x" * MAX_ID_CHARS, card_id="c" * MAX_ID_CHARS, merchant_id="m" * MAX_ID_CHARS),
        record(ts=1_000_000_000_000),
        record(ts=9_999_999_999_999),
        record(amount=1e12),
        record(amount=-1e12),
        record(amount=0),
        record(amount=-3.25),
    ):
        assert isinstance(decode_transaction(encode(obj)), Event), obj


def test_value_of_exactly_max_bytes_is_accepted(record: Callable[..., dict[str, Any]]) -> None:
    """The size limit is inclusive."""
    raw = encode(record())
    assert isinstance(decode_transaction(raw, max_bytes=len(raw)), Event)


def test_whitespace_and_unicode_ids(record: Callable[..., dict[str, Any]]) -> None:
    """Non-ASCII ids are fine, and so is JSON with surrounding whitespace."""
    raw = b"  \n" + encode(record(id="tx-\u00e9\u4e2d", card_id="karte-\u00fc")) + b"\n "
    tx = decode_transaction(raw)
    assert isinstance(tx, Event)
    assert tx.id == "tx-\u00e9\u4e2d"
    assert tx.key == "karte-\u00fc"


# --- each reason code -----------------------------------------------------------------------------


@pytest.mark.parametrize("raw", [b"", None])
def test_empty_value(raw: bytes | None) -> None:
    """No value at all, or zero bytes."""
    assert reason(raw) == "empty_value"


def test_too_large(record: Callable[..., dict[str, Any]]) -> None:
    """A value above max_bytes is rejected before parsing, with the sizes in the message."""
    raw = encode(record())
    result = decode_transaction(raw, max_bytes=len(raw) - 1)
    assert isinstance(result, Invalid)
    assert result.reason == "too_large"
    assert str(len(raw)) in result.message
    big = encode(record(pad="x" * MAX_RECORD_BYTES))
    assert reason(big) == "too_large"


@pytest.mark.parametrize(
    "raw",
    [
        b"{",
        b'{"id": "a",',
        b"not json",
        b"\xff\xfe\x00garbage",
        b"{'id': 'a'}",
        b"{}}",
        b'{"a":1,}',
    ],
)
def test_invalid_json(raw: bytes) -> None:
    """Bytes that are not JSON."""
    assert reason(raw) == "invalid_json"


@pytest.mark.parametrize("raw", [b"[1, 2, 3]", b'"text"', b"42", b"null", b"true", b"[]"])
def test_not_an_object(raw: bytes) -> None:
    """JSON that is not an object."""
    assert reason(raw) == "not_an_object"


@pytest.mark.parametrize("name", ["id", "card_id", "ts", "amount", "merchant_id"])
def test_missing_field(record: Callable[..., dict[str, Any]], name: str) -> None:
    """Each required field, absent or null, is missing_field naming it."""
    for obj in (record(drop=(name,)), record(**{name: None})):
        result = decode_transaction(encode(obj))
        assert isinstance(result, Invalid)
        assert result.reason == "missing_field"
        assert name in result.message


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"ts": "1764500000123"}, "ts"),
        ({"ts": "yesterday"}, "ts"),
        ({"ts": 1764500000123.0}, "ts"),
        ({"ts": True}, "ts"),
        ({"amount": True}, "amount"),
        ({"amount": "12.5"}, "amount"),
        ({"amount": [1]}, "amount"),
        ({"id": 12345}, "id"),
        ({"card_id": 7}, "card_id"),
        ({"merchant_id": ["m"]}, "merchant_id"),
        ({"country": 49}, "country"),
    ],
)
def test_wrong_type(
    record: Callable[..., dict[str, Any]], overrides: dict[str, Any], field: str
) -> None:
    """Fields of the wrong JSON type, naming the field."""
    result = decode_transaction(encode(record(**overrides)))
    assert isinstance(result, Invalid)
    assert result.reason == "wrong_type"
    assert field in result.message


@pytest.mark.parametrize(
    "overrides",
    [
        {"ts": 1_764_500_000},  # seconds, not milliseconds
        {"ts": 1_764_500_000_123_000},  # microseconds
        {"ts": 0},
        {"ts": -1},
        {"ts": 999_999_999_999},
        {"ts": 10_000_000_000_000},
        {"id": ""},
        {"card_id": ""},
        {"merchant_id": ""},
        {"id": "x" * (MAX_ID_CHARS + 1)},
        {"card_id": "c" * (MAX_ID_CHARS + 1)},
        {"amount": 1e12 + 1},
        {"amount": -2e12},
    ],
)
def test_out_of_range(record: Callable[..., dict[str, Any]], overrides: dict[str, Any]) -> None:
    """Values of the right type outside their allowed range."""
    assert reason(encode(record(**overrides))) == "out_of_range"


@pytest.mark.parametrize("literal", [b"NaN", b"1e999", b"-1e999", b"Infinity", b"-Infinity"])
def test_not_finite(literal: bytes) -> None:
    """NaN and infinite amounts (non-standard JSON some producers write) are not_finite."""
    raw = (
        b'{"id": "a", "card_id": "c", "ts": 1764500000123, "amount": '
        + literal
        + b', "merchant_id": "m"}'
    )
    assert reason(raw) == "not_finite"


def test_huge_integer_amount_does_not_raise() -> None:
    """An integer amount too large for a float is rejected, not raised (decode never raises)."""
    raw = (
        b'{"id": "a", "card_id": "c", "ts": 1764500000123, "amount": 1'
        + b"0" * 400
        + b', "merchant_id": "m"}'
    )
    result = decode_transaction(raw)  # OverflowError here would crash the scoring agent
    assert isinstance(result, Invalid)
    assert result.reason in {"out_of_range", "not_finite"}


def test_decoded_transactions_can_always_be_encoded() -> None:
    """A record decoded to an Event must be encodable as a prediction (lone surrogates)."""
    raw = (
        b'{"id": "\\ud800", "card_id": "c", "ts": 1764500000123, "amount": 1.0, "merchant_id": "m"}'
    )
    result = decode_transaction(raw)
    if isinstance(result, Event):
        # Accepting it means the scoring path must be able to write its prediction and features.
        decode_feature_record(feature_record(result, feature_set="1-0123456789ab", features=(1.0,)))
        prediction(
            result,
            score=0.5,
            threshold=0.5,
            model="m@1",
            queue_ms=0.0,
            infer_ms=0.0,
            batch_size=1,
        )
    else:
        assert result.reason in REASONS


# --- dead letters ---------------------------------------------------------------------------------


def test_dead_letter_fields() -> None:
    """A dead letter carries the reason, the source position and the original text."""
    out = orjson.loads(
        dead_letter(
            Invalid("invalid_json", "not valid JSON: boom"),
            topic="transactions",
            partition=3,
            offset=41,
            key=b"c-1",
            value=b'{"id": ',
            routed_at_ms=1_764_500_000_999,
        )
    )
    assert out == {
        "reason": "invalid_json",
        "message": "not valid JSON: boom",
        "topic": "transactions",
        "partition": 3,
        "offset": 41,
        "key": "c-1",
        "key_base64": False,
        "key_size": 3,
        "key_truncated": False,
        "value": '{"id": ',
        "value_base64": False,
        "value_size": 7,
        "value_truncated": False,
        "headers": [],
        "headers_truncated": False,
        "routed_at": 1_764_500_000_999,
    }


def test_dead_letters_and_late_records_carry_the_record_s_headers_for_a_replay() -> None:
    """Kafka headers (names, base64 values, a null value, in order) go into the dead letter and the late record,
    up to HEADER_BYTES of them; beyond, the rest are left out and the record says so."""
    headers = [("trace-id", b"\x00\x01abc"), ("source", b"pos-7"), ("empty", None)]
    letter = orjson.loads(dead_letter(Invalid("invalid_json", "x"), topic="t", partition=0, offset=1, key=None,
                                      value=b"{", routed_at_ms=1, headers=headers))
    assert [[name, None if value is None else base64.b64decode(value)] for name, value in letter["headers"]] == [
        ["trace-id", b"\x00\x01abc"], ["source", b"pos-7"], ["empty", None]]
    assert letter["headers_truncated"] is False
    late = orjson.loads(late_record(make_tx(), raw=b'{"id": "tx-9"}', watermark=TS, topic="t", partition=0, offset=2,
                                    routed_at_ms=1, headers=headers))
    assert late["headers"] == letter["headers"] and late["headers_truncated"] is False
    many = [(f"h{i}", b"v" * 100) for i in range(100)]
    kept, truncated = headers_record(many)
    assert truncated and 0 < len(kept) < 100 and sum(len(n) + 100 for n, _ in kept) <= HEADER_BYTES
    assert "headers" not in orjson.loads(late_record(make_tx(), raw=b"{}", watermark=TS, topic="t", partition=0,
                                                     offset=3, routed_at_ms=1))


@pytest.mark.parametrize("fill", [b"k", b"\x00", b"\xff"])
def test_the_dead_letter_of_a_huge_key_fits_the_broker_limit_whatever_its_bytes(fill: bytes) -> None:
    """A key of 900 KB (the broker takes records of up to 1 MiB) and an empty value: the letter, and its own Kafka
    key, keep a 1 KiB preview and the full size, so the letter stays far under the broker's limit even when every
    byte is escaped in JSON (a NUL becomes six characters) or the key is not text (base64)."""
    key = fill * 900_000
    letter = dead_letter(Invalid("empty_value", "record has no value"), topic="t", partition=0, offset=9, key=key,
                         value=None, routed_at_ms=1)
    out = orjson.loads(letter)
    assert len(letter) < 16 * 1024
    assert out["key_truncated"] is True and out["key_size"] == len(key)
    preview = base64.b64decode(out["key"]) if out["key_base64"] else out["key"].encode()
    assert preview == key[:DEAD_LETTER_KEY_BYTES] == dead_letter_key(key)
    assert dead_letter_key(b"c-1") == b"c-1" and dead_letter_key(None) is None


@pytest.mark.parametrize(("key", "shown"), [("c-\x00-1", "U+0000 at position 2"), ("c\n", "U+000A at position 1"),
                                           ("\u200bc", "U+200B at position 0"), ("c\x7f", "U+007F at position 1")])
def test_keys_and_ids_must_be_printable(record: Callable[..., dict[str, Any]], key: str, shown: str) -> None:
    """A control, format or separator character in a key or an id is refused, named and placed; a space is fine."""
    for field in ("card_id", "id"):
        result = decode_transaction(encode(record(**{field: key})))
        assert isinstance(result, Invalid) and result.reason == "unprintable", result
        assert field in result.message and shown in result.message
    assert isinstance(decode_transaction(encode(record(card_id="card 42"))), Event)


def test_dead_letter_of_a_huge_value_is_truncated_and_says_so() -> None:
    """A 1 MB value keeps a 16 KiB preview, its full size and a flag; the letter stays small."""
    value = b'{"padding": "' + b"x" * 1_000_000 + b'"}'
    letter = dead_letter(Invalid("too_large", "too big"), topic="t", partition=0, offset=9, key=None,
                         value=value, routed_at_ms=1)
    out = orjson.loads(letter)
    assert len(letter) < 20_000
    assert out["value_truncated"] is True and out["value_size"] == len(value)
    assert out["value"] == value[:16 * 1024].decode()


def test_dead_letter_base64_for_non_utf8() -> None:
    """Non-UTF-8 key and value are base64 encoded and flagged; decoding gives the original bytes."""
    key, value = b"\xff\x00key", b"\xff\xfe\x00garbage\x80"
    out = orjson.loads(
        dead_letter(
            Invalid("invalid_json", "x"),
            topic="t",
            partition=0,
            offset=0,
            key=key,
            value=value,
            routed_at_ms=1,
        )
    )
    assert out["value_base64"] is True
    assert out["key_base64"] is True
    assert base64.b64decode(out["value"]) == value
    assert base64.b64decode(out["key"]) == key


def test_dead_letter_without_key_or_value() -> None:
    """A tombstone (no key, no value) becomes nulls, not base64."""
    out = orjson.loads(
        dead_letter(
            Invalid("empty_value", "record has no value"),
            topic="t",
            partition=1,
            offset=2,
            key=None,
            value=None,
            routed_at_ms=3,
        )
    )
    assert out["key"] is None and out["key_base64"] is False
    assert out["value"] is None and out["value_base64"] is False
    assert out["reason"] == "empty_value"


@PROPERTY
@given(st.binary(max_size=200), st.one_of(st.none(), st.binary(max_size=50)))
def test_dead_letter_round_trips_any_bytes(value: bytes, key: bytes | None) -> None:
    """Whatever the bytes, the dead letter is JSON and restores them exactly."""
    out = orjson.loads(
        dead_letter(
            Invalid("invalid_json", "x"),
            topic="t",
            partition=0,
            offset=9,
            key=key,
            value=value,
            routed_at_ms=1,
        )
    )
    restored = base64.b64decode(out["value"]) if out["value_base64"] else out["value"].encode()
    assert restored == value
    if key is None:
        assert out["key"] is None
    else:
        assert (base64.b64decode(out["key"]) if out["key_base64"] else out["key"].encode()) == key


# --- predictions and late records -----------------------------------------------------------------


def make_tx(**overrides: Any) -> Event:
    """An Event for encoding tests."""
    values: dict[str, Any] = {
        "id": "tx-9",
        "card_id": "c-9",
        "ts": TS,
        "amount": 99.5,
        "merchant_id": "m-9",
        "country": None,
    }
    values.update(overrides)
    return transaction(**values)


def test_prediction_fields() -> None:
    """A prediction has the event's identity, score, decision, model and timing (features go elsewhere)."""
    out = orjson.loads(
        prediction(
            make_tx(),
            score=0.875,
            threshold=0.5,
            model="fraud-mlp@1",
            queue_ms=1.23456,
            infer_ms=0.98765,
            batch_size=17,
        )
    )
    assert out == {
        "id": "tx-9",
        "card_id": "c-9",
        "ts": TS,
        "score": 0.875,
        "is_fraud": True,
        "model": "fraud-mlp@1",
        "timing": {"queue_ms": 1.235, "infer_ms": 0.988, "batch_size": 17},
    }


def test_feature_record_round_trips_compactly() -> None:
    """A feature-log record names the event, its time, its feature set, and the values in the set's order."""
    value = feature_record(make_tx(), feature_set="3-0123456789ab", features=(1.0, 2.5, -1.0))
    assert decode_feature_record(value) == FeatureRecord("tx-9", TS, "3-0123456789ab", (1.0, 2.5, -1.0))
    assert len(value) == 17 + 3 * 8 + len("tx-9")


@given(st.text(min_size=1, max_size=40), st.lists(st.floats(allow_nan=False), min_size=15, max_size=15))
def test_any_id_and_features_round_trip(event_id: str, values: list[float]) -> None:
    tx = make_tx(id=event_id)
    record = decode_feature_record(feature_record(tx, feature_set=DEFAULT_SPEC.version, features=values))
    assert record == FeatureRecord(event_id, TS, DEFAULT_SPEC.version, tuple(values))


def test_an_unknown_feature_record_format_is_refused() -> None:
    value = bytearray(feature_record(make_tx(), feature_set="1-0123456789ab", features=(1.0,)))
    value[0] = 9
    with pytest.raises(ValueError, match="format 9"):
        decode_feature_record(bytes(value))


@pytest.mark.parametrize(
    ("score", "flag"), [(0.5, True), (0.4999, False), (0.0, False), (1.0, True)]
)
def test_prediction_threshold_is_inclusive(score: float, flag: bool) -> None:
    """is_fraud is score >= threshold."""
    out = orjson.loads(
        prediction(
            make_tx(),
            score=score,
            threshold=0.5,
            model="m",
            queue_ms=0,
            infer_ms=0,
            batch_size=1,
        )
    )
    assert out["is_fraud"] is flag


def test_late_record_fields(record: Callable[..., dict[str, Any]]) -> None:
    """A late record embeds the original event as JSON, with the watermark and position."""
    raw = encode(record(ts=TS - 120_000))
    tx = decode_transaction(raw)
    assert isinstance(tx, Event)
    watermark = TS - 60_000
    out = orjson.loads(
        late_record(
            tx,
            raw=raw,
            watermark=watermark,
            topic="transactions",
            partition=5,
            offset=77,
            routed_at_ms=TS + 1,
        )
    )
    assert out["reason"] == "late"
    assert out["watermark"] == watermark
    assert str(tx.ts) in out["message"] and str(watermark) in out["message"]
    assert (out["topic"], out["partition"], out["offset"], out["routed_at"]) == (
        "transactions",
        5,
        77,
        TS + 1,
    )
    assert out["event"] == json.loads(raw)  # embedded as an object, not a string
    assert set(out) == {
        "reason",
        "message",
        "watermark",
        "topic",
        "partition",
        "offset",
        "event",
        "routed_at",
    }


# --- properties: decode never raises --------------------------------------------------------------


@PROPERTY
@given(st.binary(max_size=300))
def test_decode_never_raises_on_arbitrary_bytes(raw: bytes) -> None:
    """Any bytes give an Event or an Invalid with a known reason."""
    result = decode_transaction(raw)
    assert isinstance(result, Event | Invalid)
    if isinstance(result, Invalid):
        assert result.reason in REASONS


json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.integers(min_value=1_000_000_000_000, max_value=9_999_999_999_999),  # plausible ts
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
id_values = st.one_of(st.text(min_size=0, max_size=140), json_values)
objects = st.fixed_dictionaries(
    {},
    optional={
        "id": id_values,
        "card_id": id_values,
        "merchant_id": id_values,
        "ts": json_values,
        "amount": json_values,
        "country": st.one_of(st.none(), st.text(max_size=3), json_values),
    },
).flatmap(
    lambda required: st.dictionaries(st.text(max_size=10), json_values, max_size=3).map(
        lambda extra: {**extra, **required}
    )
)

# Mostly valid records with arbitrary values mixed in, so that many decode to Events.
near_valid = st.fixed_dictionaries(
    {
        "id": st.one_of(st.text(min_size=1, max_size=MAX_ID_CHARS), id_values),
        "card_id": st.one_of(st.text(min_size=1, max_size=MAX_ID_CHARS), id_values),
        "merchant_id": st.one_of(st.text(min_size=1, max_size=MAX_ID_CHARS), id_values),
        "ts": st.one_of(
            st.integers(min_value=1_000_000_000_000, max_value=9_999_999_999_999), json_values
        ),
        "amount": st.one_of(
            st.floats(min_value=-1e12, max_value=1e12), st.integers(-(10**12), 10**12), json_values
        ),
    },
    optional={"country": st.one_of(st.none(), st.text(max_size=3), json_values)},
)


@PROPERTY
@given(st.one_of(objects, near_valid))
def test_decode_never_raises_on_arbitrary_objects(obj: dict[str, Any]) -> None:
    """Any JSON object gives an Event (with valid values) or an Invalid with a known reason."""
    result = decode_transaction(encode(obj))
    assert isinstance(result, Event | Invalid)
    if isinstance(result, Invalid):
        assert result.reason in REASONS
    else:
        assert math.isfinite(result.values[0])
        assert 1 <= len(result.id) <= MAX_ID_CHARS
        assert result.id == obj["id"] and result.ts == obj["ts"]


@PROPERTY
@given(st.recursive(json_scalars, lambda c: st.lists(c, max_size=4), max_leaves=10))
def test_non_objects_are_never_transactions(value: Any) -> None:
    """JSON that is not an object is never accepted."""
    result = decode_transaction(encode(value))
    assert isinstance(result, Invalid)
    assert result.reason in {"not_an_object", "invalid_json"}


@PROPERTY
@given(st.binary(max_size=200), st.one_of(st.none(), st.binary(max_size=50)),
       st.lists(st.tuples(st.text(max_size=8), st.one_of(st.none(), st.binary(max_size=20))), max_size=4))
def test_a_dead_letter_gives_back_the_record_it_was_made_from(value: bytes, key: bytes | None,
                                                              headers: list[tuple[str, bytes | None]]) -> None:
    """original_of (what `seam dlq replay` sends) inverts dead_letter: key, value and headers, byte for byte."""
    letter = orjson.loads(dead_letter(Invalid("registry_unavailable", "x"), topic="t", partition=0, offset=9, key=key,
                                      value=value, routed_at_ms=1, headers=headers))
    assert original_of(letter) == Original(key, value, headers)


def test_a_dead_letter_cut_to_fit_is_not_given_back_as_the_original() -> None:
    """A value or key cut to fit cannot be sent again as it was: original_of says what was cut."""
    cut_value = orjson.loads(dead_letter(Invalid("too_large", "x"), topic="t", partition=0, offset=1, key=b"k",
                                         value=b"v" * (64 << 10), routed_at_ms=1))
    cut_key = orjson.loads(dead_letter(Invalid("empty_value", "x"), topic="t", partition=0, offset=1,
                                       key=b"k" * (DEAD_LETTER_KEY_BYTES + 1), value=b"{}", routed_at_ms=1))
    many = [("h", b"x" * 1000)] * (HEADER_BYTES // 1000 + 2)
    cut_headers = orjson.loads(dead_letter(Invalid("wrong_type", "x"), topic="t", partition=0, offset=1, key=b"k",
                                           value=b"{}", routed_at_ms=1, headers=many))
    assert [original_of(d) for d in (cut_value, cut_key, cut_headers)] == [
        "value_truncated", "key_truncated", "headers_truncated"]


def _exactly(result: Event | Invalid | None) -> Any:
    """``result`` with each value's type and its sign of zero: two results compare equal only if they are the same."""
    if isinstance(result, Event):
        return "event", result.id, result.key, result.ts, tuple((type(v), repr(v)) for v in result.values)
    return result


SENSORS = Contract(load_spec(SPECS / "sensors.toml"))
iso_times = st.datetimes(min_value=datetime(2001, 9, 10), max_value=datetime(2286, 11, 19),
                         timezones=st.just(UTC)).map(lambda t: t.isoformat().replace("+00:00", "Z"))
COUNTS = Contract(parse_spec("""
name = "counts"
key = "k"
event_id = "id"
event_time = "ts"
[fields]
count = { type = "int", min = 0, max = 1000 }
flag = { type = "bool" }
level = { type = "int", optional = true, default = 3 }
ratio = { type = "float" }
[[features]]
name = "count_sum"
op = "sum"
field = "count"
window = "1m"
[[features]]
name = "flag_mean"
op = "mean"
field = "flag"
window = "1m"
[[features]]
name = "level_last"
op = "last"
field = "level"
[[features]]
name = "ratio_max"
op = "max"
field = "ratio"
window = "1m"
"""))
# Records that pass, and the same records with one field spoiled: removed, or given a value near or past what its
# check allows (out of range by one, unprintable, an unpaired surrogate, too long, NaN, the wrong type).
printable = st.text(st.characters(min_codepoint=32, max_codepoint=126), min_size=1, max_size=MAX_ID_CHARS)


def odd_text(max_chars: int = MAX_ID_CHARS) -> st.SearchStrategy[Any]:
    edges = st.sampled_from(["\ud800", "a\udfff", "tab\there", "\x00", "é", "", "x" * max_chars, "x" * (max_chars + 1)])
    return st.one_of(edges, edges, edges, st.text(max_size=max_chars + 2), json_values)


epoch_ms = st.integers(min_value=1_000_000_000_000, max_value=9_999_999_999_999)
odd_epoch_ms = st.one_of(*[st.sampled_from([999_999_999_999, 10_000_000_000_000, True, 1.7e12, "1700000000000"])] * 3,
                         json_values)


def odd_number(low: float, high: float) -> st.SearchStrategy[Any]:
    edges = st.sampled_from([low, high, int(low), int(high), (low + high) / 2, math.nextafter(low, -math.inf),
                             math.nextafter(high, math.inf), int(low) - 1, int(high) + 1, -0.0, math.nan, math.inf,
                             -math.inf, 10**400, -(10**400), True, False, "1"])
    return st.one_of(edges, edges, edges, json_values)


def one_spoiled(valid: st.SearchStrategy[dict[str, Any]],
                spoilers: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[dict[str, Any]]:
    def spoil(obj: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
        return st.sampled_from(sorted(spoilers)).flatmap(lambda name: st.one_of(
            st.just({k: v for k, v in obj.items() if k != name}),
            spoilers[name].map(lambda value: {**obj, name: value})))
    return st.one_of(valid, *[valid.flatmap(spoil)] * 3)


transactions = one_spoiled(st.fixed_dictionaries(
    {"id": printable, "card_id": printable, "ts": epoch_ms, "merchant_id": printable,
     "amount": st.one_of(st.floats(min_value=-1e12, max_value=1e12), st.integers(-(10**12), 10**12))},
    optional={"country": st.one_of(st.none(), printable)}),
    {"id": odd_text(), "card_id": odd_text(), "ts": odd_epoch_ms, "merchant_id": odd_text(), "country": odd_text(),
     "amount": odd_number(-1e12, 1e12)})
readings = one_spoiled(st.fixed_dictionaries(
    {"reading_id": printable, "device_id": printable, "ts": iso_times,
     "temperature": st.one_of(st.floats(min_value=-60, max_value=200), st.integers(-60, 200)),
     "vibration": st.one_of(st.floats(min_value=0, max_value=100), st.integers(0, 100)),
     "site": st.text(st.characters(min_codepoint=32, max_codepoint=126), min_size=1, max_size=64)},
    optional={"status": st.one_of(st.none(), st.text(st.characters(min_codepoint=32, max_codepoint=126),
                                                     min_size=1, max_size=16))}),
    {"reading_id": odd_text(), "device_id": odd_text(), "ts": st.one_of(odd_epoch_ms, st.just("2026-12-02T13:35:14")),
     "temperature": odd_number(-60, 200), "vibration": odd_number(0, 100), "site": odd_text(64),
     "status": odd_text(16)})
counts = one_spoiled(st.fixed_dictionaries(
    {"id": printable, "k": printable, "ts": epoch_ms, "count": st.integers(0, 1000), "flag": st.booleans(),
     "ratio": st.floats(allow_nan=False, allow_infinity=False)},
    optional={"level": st.one_of(st.none(), st.integers())}),
    {"id": odd_text(), "k": odd_text(), "ts": odd_epoch_ms, "count": odd_number(0, 1000),
     "flag": st.sampled_from([0, 1, 1.0, None, "true"]), "level": odd_number(-5, 5),
     "ratio": odd_number(-1.7976931348623157e308, 1.7976931348623157e308)})


@hsettings(PROPERTY, max_examples=600)
@given(st.one_of(objects, transactions), readings, counts)
def test_the_one_pass_check_gives_what_the_field_by_field_checks_give(
        transaction_obj: dict[str, Any], reading: dict[str, Any], count: dict[str, Any]) -> None:
    """What a contract accepts in one pass is exactly the event its checks, field by field, make (also where a
    schema declared the types); anything else is left to them, so every record gets their verdict and reason."""
    for contract, obj in ((DEFAULT_CONTRACT, transaction_obj), (SENSORS, reading), (COUNTS, count)):
        assert _exactly(contract.validate(obj)) == _exactly(contract.checked(obj))
        accepted = contract._accept(obj)
        if accepted is not None:
            for typed in (False, True):
                assert _exactly(accepted) == _exactly(contract.checked(obj, typed=typed))


def test_the_one_pass_check_takes_the_common_records(record: Callable[..., dict[str, Any]]) -> None:
    """Records as producers write them pass in one pass, integers for numbers and missing optional fields too."""
    for obj in (record(), record(amount=42), record(country=None), {**record(), "extra": [1, 2]}):
        assert _exactly(DEFAULT_CONTRACT._accept(obj)) == _exactly(DEFAULT_CONTRACT.checked(obj))
    reading = {"reading_id": "r-1", "device_id": "dev-1", "ts": "2026-12-02T13:35:14.250Z", "temperature": 41.5,
               "vibration": 2, "site": "site-3"}
    for obj in (reading, {**reading, "status": "warn"}):
        accepted = SENSORS._accept(obj)
        assert accepted is not None and _exactly(accepted) == _exactly(SENSORS.checked(obj))
    assert SENSORS._accept(reading).values[2] == "ok"  # type: ignore[union-attr] # the default
    # A number without bounds is still held to a float's range, as the checks hold it.
    counted = {"id": "i", "k": "k", "ts": TS, "count": 3, "flag": True, "ratio": 0.25}
    for ratio in (10**400, -(10**400), 2**1024, -(2**1024), 2**1023, 0.5):
        obj = {**counted, "ratio": ratio}
        assert _exactly(COUNTS.validate(obj)) == _exactly(COUNTS.checked(obj))
