"""The ``quix`` benchmark mode: the scoring job written with Quix Streams as its users would write it.

    python -m bench.quix_app

One ``StreamingDataFrame`` over the input topic: a stateful ``apply`` keeps each card's state in Quix's
RocksDB store (with its changelog topic), computes the features with :mod:`tables.features`, calls the
model for that one row, and returns the encoded output; three filtered branches send predictions, dead
letters and late records to their topics. The partition watermarks live in process memory (Quix state is
per message key), which only matters after a restart. Same environment variables as ``bench.faust_app``
(BENCH_BROKER may carry a ``kafka://`` prefix).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from quixstreams import Application, State, message_context

from bench.job import LATENESS_MS, encode_prediction, load_model, prepare, score_one
from tables.features import Watermark


def _is(kind: str) -> Callable[[tuple[str, bytes]], bool]:
    def check(out: tuple[str, bytes]) -> bool:
        return out[0] == kind

    return check


def main() -> None:
    """Build the Quix application from the environment and run it until SIGTERM."""
    broker = os.environ.get("BENCH_BROKER", "127.0.0.1:9092").replace("kafka://", "")
    app = Application(
        broker_address=broker,
        consumer_group=os.environ.get("BENCH_APP_ID", "bench-quix"),
        auto_offset_reset="earliest",
        state_dir=os.environ.get("BENCH_DATA_DIR", ".data/bench-quix"),
        commit_interval=1.0,
        loglevel="WARNING",
        processing_guarantee="at-least-once",
        producer_extra_config={"linger.ms": 5, "acks": "all"},
    )
    runtime = load_model(os.environ.get("BENCH_MODEL", "models/fraud-mlp.onnx"))
    source = os.environ.get("BENCH_INPUT", "transactions")
    input_topic = app.topic(source, key_deserializer="bytes", value_deserializer="bytes")
    outputs = {kind: app.topic(os.environ.get(name, kind), key_serializer="bytes", value_serializer="bytes")
               for kind, name in (("prediction", "BENCH_PREDICTIONS"), ("dead_letter", "BENCH_DLQ"),
                                  ("late", "BENCH_LATE"))}
    watermarks: dict[int, Watermark] = {}

    def score(value: bytes, key: bytes, timestamp: int, headers: Any, state: State) -> tuple[str, bytes]:
        context = message_context()
        partition = context.partition
        watermark = watermarks.setdefault(partition, Watermark(LATENESS_MS))
        done = prepare(value, key, topic=source, partition=partition, offset=context.offset, watermark=watermark,
                       load=lambda _card: state.get("card"), store=lambda _card, s: state.set("card", s))
        if done.kind != "prediction":
            return done.kind, done.value
        assert done.tx is not None
        result, infer_ms = score_one(runtime, done.features)
        return done.kind, encode_prediction(runtime.info, done.tx, done.features, result, infer_ms)

    def value(out: tuple[str, bytes]) -> bytes:
        return out[1]

    scored = app.dataframe(input_topic).apply(score, stateful=True, metadata=True)
    for kind, topic in outputs.items():
        scored.filter(_is(kind)).apply(value).to_topic(topic)
    app.run()


if __name__ == "__main__":
    main()
