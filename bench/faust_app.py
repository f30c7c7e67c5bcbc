"""The ``naive`` and ``async`` benchmark modes: the scoring job as a first Faust implementation writes it.

    python -m bench.faust_app worker -l warn --without-web

* ``naive``: one agent, one event at a time: state read and written per event in a RocksDB table, then
  ``session.run`` for that one row, blocking the event loop, then ``topic.send``; Faust acknowledges each
  event when the agent takes the next.
* ``async``: the same, but each row's ``session.run`` goes to a thread pool and at most
  ``BENCH_ASYNC_CAPACITY`` calls are in flight (like Flink's AsyncFunction capacity); no batching. Each event
  is acknowledged once its prediction is delivered, so outputs may leave out of order.

Environment: BENCH_MODE (naive, async), BENCH_BROKER (kafka://...), BENCH_APP_ID, BENCH_INPUT,
BENCH_PREDICTIONS, BENCH_DLQ, BENCH_LATE, BENCH_DATA_DIR, BENCH_MODEL, BENCH_ASYNC_CAPACITY (100),
BENCH_ASYNC_THREADS (4).
"""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import faust

from bench.job import LATENESS_MS, Prepared, encode_prediction, load_model, prepare, score_one
from tables.features import KeyState, Watermark

MODE = os.environ.get("BENCH_MODE", "naive")
CAPACITY = int(os.environ.get("BENCH_ASYNC_CAPACITY", "100"))
THREADS = int(os.environ.get("BENCH_ASYNC_THREADS", "4"))

app = faust.App(
    os.environ.get("BENCH_APP_ID", "bench-naive"),
    broker=os.environ.get("BENCH_BROKER", "kafka://127.0.0.1:9092"),
    store="rocksdb://",
    datadir=os.environ.get("BENCH_DATA_DIR", ".data/bench"),
    topic_partitions=8,
    broker_max_poll_records=2000,
    producer_acks=-1,
    producer_linger=0.005,
    consumer_auto_offset_reset="earliest",
    key_serializer="raw",
    value_serializer="raw",
    stream_wait_empty=False,
    autodiscover=False,
)
input_topic = app.topic(os.environ.get("BENCH_INPUT", "transactions"))
topics = {kind: app.topic(os.environ.get(name, kind)) for kind, name in
          (("prediction", "BENCH_PREDICTIONS"), ("dead_letter", "BENCH_DLQ"), ("late", "BENCH_LATE"))}
card_state = app.Table("card-state", key_type=bytes, partitions=8)
watermarks = app.Table("watermarks", key_type=bytes, partitions=8)
_watermarks: dict[int, Watermark] = {}
runtime = load_model(os.environ.get("BENCH_MODEL", "models/fraud-mlp.onnx"))


def _load(card_id: str) -> KeyState | None:
    state: KeyState | None = card_state.get(card_id.encode())
    return state


def _store(card_id: str, state: KeyState) -> None:
    card_state[card_id.encode()] = state


def _prepare(event: Any) -> Prepared:
    msg = event.message
    watermark = _watermarks.get(msg.partition)
    if watermark is None:
        watermark = _watermarks[msg.partition] = Watermark(LATENESS_MS, watermarks.get(b"max_ts"))
    before = watermark.max_ts
    done = prepare(msg.value, msg.key, topic=msg.topic, partition=msg.partition, offset=msg.offset,
                   watermark=watermark, load=_load, store=_store)
    if watermark.max_ts != before:
        watermarks[b"max_ts"] = watermark.max_ts
    return done


async def _send(done: Prepared, key: bytes | None, score: float = 0.0, infer_ms: float = 0.0) -> Any:
    if done.kind == "prediction":
        assert done.tx is not None
        value = encode_prediction(runtime.info, done.tx, done.features, score, infer_ms)
        return await topics["prediction"].send(key=done.tx.key.encode(), value=value)
    return await topics[done.kind].send(key=key, value=done.value)


@app.on_partitions_revoked.connect  # type: ignore[arg-type]
async def _forget_watermarks(sender: Any, revoked: Any, **kwargs: Any) -> None:
    _watermarks.clear()


if MODE == "naive":

    @app.agent(input_topic)  # type: ignore[arg-type]  # Stream, not StreamT: noack()/events() are on Stream
    async def score_naive(stream: faust.Stream[bytes]) -> None:
        """Per event: state, one blocking session.run, send."""
        async for event in stream.events():
            done = _prepare(event)
            if done.kind == "prediction":
                score, infer_ms = score_one(runtime, done.features)
                await _send(done, event.message.key, score, infer_ms)
            else:
                await _send(done, event.message.key)

else:
    pool = ThreadPoolExecutor(THREADS, thread_name_prefix="bench-infer")

    @app.agent(input_topic)  # type: ignore[arg-type]  # Stream, not StreamT: noack()/events() are on Stream
    async def score_async(stream: faust.Stream[bytes]) -> None:
        """Per event: state on the loop, session.run in a thread pool, at most CAPACITY in flight."""
        loop = asyncio.get_running_loop()
        capacity = asyncio.Semaphore(CAPACITY)

        async def finish(event: Any, done: Prepared, call: asyncio.Future[tuple[float, float]]) -> None:
            try:
                score, infer_ms = await call
                await (await _send(done, event.message.key, score, infer_ms))
                event.ack()
            finally:
                capacity.release()

        async for event in stream.noack().events():
            done = _prepare(event)
            await capacity.acquire()
            if done.kind == "prediction":
                call = loop.run_in_executor(pool, score_one, runtime, done.features)
            else:
                call = loop.create_future()
                call.set_result((0.0, 0.0))
            asyncio.ensure_future(finish(event, done, call))


if __name__ == "__main__":
    app.main()
