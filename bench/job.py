"""The scoring job as the per-record baselines run it (``naive``, ``async``, ``quix``), and its reference.

Every mode computes the same thing as seam's pipeline: decode and validate with :mod:`agents.formats.codec`, route
events below their partition's watermark to the late topic, apply the event to its card's state with
:func:`tables.features.apply_event`, score the features, and encode the prediction with
:meth:`agents.formats.codec.Contract.prediction`. Only where the state lives and how the model is called differ.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from agents.formats.codec import (
    DEFAULT_CONTRACT,
    Event,
    Invalid,
    JsonInput,
    dead_letter,
    decode_feature_record,
    late_record,
)
from agents.model.runtime import ModelInfo, ModelRuntime
from tables.features import DEFAULT_SPEC, KeyState, Watermark, apply_event, as_lists, new_state

__all__ = ["LATENESS_MS", "SCORE_TOLERANCE", "THRESHOLD", "Expected", "Prepared", "compare", "encode_prediction",
           "load_model", "parse_prediction", "prepare", "reference", "score_one"]

LATENESS_MS = DEFAULT_SPEC.allowed_lateness_ms  # the example spec's
THRESHOLD = 0.5  # seam's default SEAM_FRAUD_THRESHOLD
_INPUT = JsonInput(DEFAULT_CONTRACT)
SCORE_TOLERANCE = 1e-6  # ONNX Runtime's one-row and batched kernels differ in the last bits of a float32


@dataclass(frozen=True, slots=True)
class Prepared:
    """One record after routing: a transaction with its features, or an encoded dead letter / late record."""

    kind: str  # "prediction", "dead_letter" or "late"
    tx: Event | None = None
    features: tuple[float, ...] = ()
    value: bytes = b""


def prepare(raw: bytes | None, key: bytes | None, *, topic: str, partition: int, offset: int,
            watermark: Watermark, load: Callable[[str], KeyState | None],
            store: Callable[[str, KeyState], None]) -> Prepared:
    """Route one record and, if it is on time, apply it to its card's state (read and written per record)."""
    tx = _INPUT.decode(raw)
    if isinstance(tx, Invalid):
        return Prepared("dead_letter", value=dead_letter(tx, topic=topic, partition=partition, offset=offset,
                                                         key=key, value=raw, routed_at_ms=int(time.time() * 1000)))
    if watermark.is_late(tx.ts):
        assert raw is not None and watermark.value is not None
        return Prepared("late", tx, value=late_record(tx, raw=raw, watermark=watermark.value, topic=topic,
                                                      partition=partition, offset=offset,
                                                      routed_at_ms=int(time.time() * 1000)))
    watermark.observe(tx.ts)
    state = load(tx.key)
    if state is None:  # the peers' stores keep states as JSON: lists, as a loaded state has them
        state = new_state()
        as_lists(state)
    applied = apply_event(state, tx.id, tx.ts, tx.values, allowed_lateness_ms=LATENESS_MS)
    store(tx.key, state)
    return Prepared("prediction", tx, applied.features)


def load_model(path: str) -> ModelRuntime:
    """Open the model as seam does (same session options, device policy and contract check)."""
    return ModelRuntime.load(path, feature_names=DEFAULT_SPEC.names, device="auto")


def score_one(runtime: ModelRuntime, features: tuple[float, ...]) -> tuple[float, float]:
    """One ``session.run`` for one row; return (score, milliseconds)."""
    started = time.perf_counter()
    score = float(runtime.predict(np.asarray([features], dtype=np.float32))[0])
    return score, (time.perf_counter() - started) * 1000


def encode_prediction(info: ModelInfo, tx: Event, features: tuple[float, ...], score: float,
                      infer_ms: float) -> bytes:
    """The record a peer writes for a batch of one: seam's prediction and its feature-log record in one."""
    record = orjson.loads(DEFAULT_CONTRACT.prediction(tx, score=score, threshold=THRESHOLD, model=info.tag,
                                                      queue_ms=0.0, infer_ms=infer_ms, batch_size=1))
    return orjson.dumps(record | {"features": features})


Expected = dict[str, tuple[tuple[float, ...], float]]


def reference(records: Iterable[tuple[int, bytes]], runtime: ModelRuntime) -> Expected:
    """Features and scores every mode must produce for ``(partition, value)`` records in arrival order."""
    watermarks: dict[int, Watermark] = {}
    states: dict[str, KeyState] = {}
    features: dict[str, tuple[float, ...]] = {}
    for partition, raw in records:
        watermark = watermarks.setdefault(partition, Watermark(LATENESS_MS))
        done = prepare(raw, None, topic="", partition=partition, offset=0, watermark=watermark,
                       load=states.get, store=states.__setitem__)
        if done.kind == "prediction":
            assert done.tx is not None
            features[done.tx.id] = done.features
    ids = list(features)
    matrix = np.asarray([features[i] for i in ids], dtype=np.float32).reshape(len(ids), len(DEFAULT_SPEC.names))
    scores = runtime.predict(matrix).tolist() if ids else []
    return {i: (features[i], s) for i, s in zip(ids, scores, strict=True)}


def parse_prediction(value: bytes, feature_log: Mapping[str, tuple[float, ...]]
                     ) -> tuple[str, tuple[float, ...], float, bool, str]:
    """(id, features in spec order, score, is_fraud, model) of a prediction record.

    A peer's record carries its features; seam's are in ``feature_log`` (id -> features) instead.
    """
    obj = orjson.loads(value)
    features = tuple(obj["features"]) if "features" in obj else feature_log.get(obj["id"], ())
    return obj["id"], features, obj["score"], obj["is_fraud"], obj["model"]


def feature_log_by_id(values: Iterable[bytes]) -> dict[str, tuple[float, ...]]:
    """id -> features of seam's feature-log records."""
    return {(record := decode_feature_record(value)).id: record.features for value in values}


def compare(expected: Expected, tag: str, values: Sequence[bytes],
            feature_log: Mapping[str, tuple[float, ...]] | None = None) -> dict[str, Any]:
    """Check prediction records against the reference: ids, features (exactly), scores, flags, model."""
    seen: dict[str, tuple[tuple[float, ...], float, bool, str]] = {}
    duplicates = 0
    for value in values:
        tx_id, features, score, is_fraud, model = parse_prediction(value, feature_log or {})
        duplicates += tx_id in seen
        seen.setdefault(tx_id, (features, score, is_fraud, model))
    known = [i for i in seen if i in expected]
    diffs = [abs(seen[i][1] - expected[i][1]) for i in known]
    return {
        "expected": len(expected), "answered": len(seen), "missing": len(expected) - len(known),
        "unexpected": len(seen) - len(known), "duplicates": duplicates,
        "feature_mismatches": sum(1 for i in known if seen[i][0] != expected[i][0]),
        "max_score_diff": float(max(diffs, default=0.0)),
        "score_mismatches": sum(d > SCORE_TOLERANCE for d in diffs),
        # A flag may differ only where the score sits within the tolerance of the threshold.
        "flag_mismatches": sum(1 for i in known if seen[i][2] != (expected[i][1] >= THRESHOLD)
                               and abs(expected[i][1] - THRESHOLD) > SCORE_TOLERANCE),
        "wrong_model": sum(1 for s in seen.values() if s[3] != tag),
    }
