"""The record formats a worker reads and writes: JSON (the default) or Avro through a schema registry.

``SEAM_INPUT_FORMAT`` picks one for the whole worker: its input is decoded with it, and its predictions,
feature log and shadow scores are written in it (the JSON path writes its feature log in seam's compact
binary layout, :func:`agents.formats.codec.feature_record`). Dead letters and late records stay JSON envelopes
in both: they carry the original bytes (base64 when not text) and where they came from.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from agents.formats import codec
from agents.formats.avro import AvroEncoder, AvroInput, SchemaCache, SchemaRegistry
from agents.formats.codec import DEFAULT_CONTRACT, MAX_RECORD_BYTES, Contract, Event, Invalid

__all__ = ["RecordFormat", "avro_format", "json_format"]


class PredictionEncoder(Protocol):
    def __call__(self, tx: Event, *, score: float, threshold: float, model: str, queue_ms: float,
                 infer_ms: float, batch_size: int) -> bytes: ...


class FeatureEncoder(Protocol):
    def __call__(self, tx: Event, *, feature_set: str, features: Sequence[float]) -> bytes: ...


class ShadowEncoder(Protocol):
    def __call__(self, tx: Event, *, score: float, model: str) -> bytes: ...


@dataclass(frozen=True, slots=True)
class RecordFormat:
    """How records are decoded and outputs encoded; ``prepare`` (if any) runs on a batch's values first."""

    name: str
    contract: Contract
    decode: Callable[[bytes | None], Event | Invalid]
    prediction: PredictionEncoder
    feature_record: FeatureEncoder
    shadow_score: ShadowEncoder
    prepare: Callable[[Iterable[bytes | None]], Awaitable[None]] | None = None
    close: Callable[[], Awaitable[None]] | None = None

    @property
    def text_input(self) -> bool:
        """Whether input values are JSON text (late records embed them as they are)."""
        return self.name == "json"


def json_format(contract: Contract = DEFAULT_CONTRACT, max_record_bytes: int = MAX_RECORD_BYTES) -> RecordFormat:
    """JSON objects in, JSON predictions and shadow scores out (the feature log in seam's binary layout)."""
    return RecordFormat("json", contract, codec.JsonInput(contract, max_record_bytes).decode, contract.prediction,
                        codec.feature_record, contract.shadow_score)


async def avro_format(registry: SchemaRegistry, *, subjects: dict[str, str], contract: Contract,
                      timeout_s: float, max_record_bytes: int = MAX_RECORD_BYTES,
                      on_lookup: Callable[[str], None] | None = None) -> RecordFormat:
    """Avro in and out: writer schemas fetched by id from ``registry``; the spec's output schemas registered
    under ``subjects`` (schema name -> subject) before anything is written. The format closes the registry."""
    try:
        outputs = await AvroEncoder.register(registry, subjects, contract, timeout_s)
    except BaseException:
        await registry.close()
        raise
    cache = SchemaCache(registry.schema, timeout_s=timeout_s, on_lookup=on_lookup, contract=contract)
    reader = AvroInput(cache, max_record_bytes)
    return RecordFormat("avro", contract, reader.decode, outputs.prediction, outputs.feature_record,
                        outputs.shadow_score, prepare=reader.prepare, close=registry.close)
