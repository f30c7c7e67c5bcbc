"""Helpers for tests against the real broker: a worker subprocess, producing and collecting records, and what a
test does when a system program it drives is missing."""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from agents.formats.codec import FEATURE_RECORD_FORMAT, decode_feature_record
from app.localhost import Subprocess, in_ci, worker_argv, worker_env
from app.topics import ensure_topics
from specs import EXAMPLE_SPEC
from tables.features import DEFAULT_SPEC
from tables.kafka import Connection, assign_all, client_options

PASSTHROUGH = Path(__file__).resolve().parents[2] / "scripts" / "passthrough_app.py"


def program_missing(reason: str) -> NoReturn:
    """A program the test drives (a browser, Prometheus) is not here: fail in CI, skip elsewhere, saying why."""
    if in_ci():
        pytest.fail(f"{reason}; CI is set (CI={os.environ['CI']!r}), where `make system-tools` installs it, so the "
                    "test fails instead of skipping", pytrace=False)
    pytest.skip(reason)


@dataclass
class Topics:
    """One test's topic names and app id, unique per test."""

    input: str
    predictions: str
    dlq: str
    late: str
    app_id: str
    features: str

    @classmethod
    def unique(cls, suffix: str) -> Topics:
        return cls(f"tx-{suffix}", f"pred-{suffix}", f"dlq-{suffix}", f"late-{suffix}", f"seam-{suffix}",
                   f"feat-{suffix}")

    def env(self) -> dict[str, str]:
        return {
            "SEAM_INPUT_TOPIC": self.input,
            "SEAM_PREDICTIONS_TOPIC": self.predictions,
            "SEAM_DLQ_TOPIC": self.dlq,
            "SEAM_LATE_TOPIC": self.late,
            "SEAM_FEATURE_LOG_TOPIC": self.features,
            "SEAM_APP_ID": self.app_id,
        }


class Worker(Subprocess):
    """A ``seam worker`` subprocess with its own data folder, web port and log file."""

    def __init__(self, bootstrap: str, env: dict[str, str], data_dir: Path, web_port: int) -> None:
        self.web_port = web_port
        settings = {
            "SEAM_BROKER_URL": f"kafka://{bootstrap}",
            "SEAM_DATA_DIR": str(data_dir),
            "SEAM_WEB_PORT": str(web_port),
            "SEAM_TOPIC_PARTITIONS": "4",
            **env,
        }
        # Appended: a replacement worker on the same folder (a restart) keeps its predecessors' logs.
        super().__init__(worker_argv("info"), worker_env(settings), data_dir / "worker.log", append=True)

    def get(self, path: str, timeout_s: float = 2.0) -> tuple[int, bytes]:
        """GET a path from this worker's web server."""
        url = f"http://127.0.0.1:{self.web_port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 - loopback
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Wait until the model is loaded and the web server answers."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"worker exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if self.get("/model/")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.3)
        raise AssertionError(f"worker not ready after {timeout_s}s:\n{self.log_tail()}")



def passthrough_worker(bootstrap: str, *, app_id: str, input_topic: str, output_topic: str, data_dir: Path,
                       mode: str = "batch", extra_env: dict[str, str] | None = None) -> Subprocess:
    """Start ``scripts/passthrough_app.py`` (decode, produce a small record per input) as a worker."""
    env = dict(os.environ, PT_BROKER=f"kafka://{bootstrap}", PT_APP_ID=app_id, PT_INPUT=input_topic,
               PT_OUTPUT=output_topic, PT_DATA_DIR=str(data_dir), PT_MODE=mode, **(extra_env or {}))
    argv = [sys.executable, str(PASSTHROUGH), "worker", "-l", "info", "--without-web"]
    return Subprocess(argv, env, data_dir / "worker.log")


async def committed_offsets(bootstrap: str | Connection, group: str) -> dict[tuple[str, int], int]:
    """The consumer group's committed offsets."""
    admin = AIOKafkaAdminClient(**client_options(bootstrap))
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(group)
    finally:
        await admin.close()
    return {(tp.topic, tp.partition): meta.offset for tp, meta in offsets.items()}


async def end_offsets(bootstrap: str | Connection, topic: str) -> dict[tuple[str, int], int]:
    """Each partition's end offset (the offset the next record will get)."""
    consumer = AIOKafkaConsumer(**client_options(bootstrap), enable_auto_commit=False)
    await consumer.start()
    try:
        partitions = await assign_all(consumer, bootstrap, [topic], from_end=True)
        return {(tp.topic, tp.partition): await consumer.position(tp) for tp in partitions}
    finally:
        await consumer.stop()


async def produce_raw(bootstrap: str | Connection, topic: str, records: Iterable[tuple[Any, ...]]) -> int:
    """Send (key, value) or (key, value, headers) records in order and wait for every ack."""
    producer = AIOKafkaProducer(**client_options(bootstrap), acks="all", linger_ms=5)
    await producer.start()
    try:
        futures = [await producer.send(topic, record[1], key=record[0], headers=record[2] if len(record) > 2 else None)
                   for record in records]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()
    return len(futures)


def encode(tx: dict[str, Any]) -> tuple[bytes, bytes]:
    return tx["card_id"].encode(), orjson.dumps(tx)


def decode_output(key: bytes | None, value: bytes) -> dict[str, Any]:
    """A seam output as a dict: JSON, or a binary feature-log record (it starts with its format byte)."""
    if value[:1] == bytes([FEATURE_RECORD_FORMAT]):
        record = decode_feature_record(value)
        return {"id": record.id, "card_id": key.decode() if key else None, "ts": record.ts,
                "feature_set": record.feature_set, "features": list(record.features)}
    return dict(orjson.loads(value))


async def collect(
    bootstrap: str | Connection,
    topics: list[str],
    done: Callable[[dict[str, list[dict[str, Any]]]], bool],
    timeout_s: float,
    settle_s: float = 2.0,
    read_committed: bool = False,
    decode: Callable[[str, bytes | None, bytes], dict[str, Any]] | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """Read records from the start of ``topics`` until ``done`` holds (then ``settle_s``), each decoded by
    ``decode(topic, key, value)`` (default: :func:`decode_output`)."""
    consumer = AIOKafkaConsumer(**client_options(bootstrap), enable_auto_commit=False,
                                isolation_level="read_committed" if read_committed else "read_uncommitted")
    await consumer.start()
    out: dict[str, list[dict[str, Any]]] = {t: [] for t in topics}
    try:
        await assign_all(consumer, bootstrap, topics, from_end=False)
        deadline = time.monotonic() + timeout_s
        settle_until: float | None = None
        while time.monotonic() < (settle_until or deadline):
            batch = await consumer.getmany(timeout_ms=200)
            for tp, records in batch.items():
                out[tp.topic] += [
                    (decode_output(r.key, r.value) if decode is None else decode(tp.topic, r.key, r.value))
                    | {"_kafka_ts": r.timestamp} for r in records]
            if settle_until is None and done(out):
                settle_until = time.monotonic() + settle_s
    finally:
        await consumer.stop()
    return out


def outcomes_done(topics: Topics, ids: set[str]) -> Callable[[dict[str, list[dict[str, Any]]]], bool]:
    """Every id in ``ids`` is scored (with its feature-log record) or late."""

    def done(out: dict[str, list[dict[str, Any]]]) -> bool:
        scored = {p["id"] for p in out[topics.predictions]}
        return (scored | {r["event"]["id"] for r in out[topics.late]} >= ids
                and {f["id"] for f in out[topics.features]} >= scored)

    return done


async def collect_outcomes(bootstrap: str | Connection, topics: Topics, ids: set[str], timeout_s: float,
                           read_committed: bool = False) -> dict[str, list[dict[str, Any]]]:
    """Read predictions, feature log, late records and dead letters until every id in ``ids`` is scored or late."""
    return await collect(bootstrap, [topics.predictions, topics.features, topics.late, topics.dlq],
                         done=outcomes_done(topics, ids), timeout_s=timeout_s, read_committed=read_committed)


def with_features(out: dict[str, list[dict[str, Any]]], topics: Topics) -> list[dict[str, Any]]:
    """The predictions, each with the features of its feature-log record (by name), which must exist."""
    logged = {f["id"]: f for f in out[topics.features]}
    joined = []
    for p in out[topics.predictions]:
        record = logged[p["id"]]
        assert record["feature_set"] == DEFAULT_SPEC.version and record["card_id"] == p["card_id"], record
        joined.append(p | {"features": dict(zip(DEFAULT_SPEC.names, record["features"], strict=True))})
    return joined


# The synthetic streams of the SIGKILL tests run event time 100-1,000 times faster than the wall clock (0.2-2 s
# of it per record), so the few thousand records a kill can leave to replay span up to an hour of event time;
# in a real stream they span a commit interval's seconds. Their workers score redeliveries as the first time
# within an hour (the example spec: 10 minutes), and so do their references.
REPLAY_ALLOWANCE_MS = 3_600_000


def replay_allowance_spec(directory: Path) -> dict[str, str]:
    """A worker's setting for the example spec with a replay allowance of ``REPLAY_ALLOWANCE_MS``, written
    into ``directory``."""
    text, replaced = re.subn(r'(?m)^replay_allowance = "[^"]*"', f'replay_allowance = "{REPLAY_ALLOWANCE_MS}ms"',
                             EXAMPLE_SPEC.read_text(encoding="utf-8"))
    assert replaced == 1, "the example spec declares its replay allowance once"
    path = directory / "fraud-replay-allowance.toml"
    path.write_text(text, encoding="utf-8")
    return {"SEAM_FEATURE_SPEC": str(path)}


def prepare_topics(bootstrap: str | Connection, topics: Topics, partitions: int = 4) -> None:
    asyncio.run(ensure_topics(bootstrap, [topics.input, topics.predictions, topics.dlq, topics.late,
                                          topics.features], partitions))


KAFKA_LOCAL = Path(__file__).resolve().parents[2] / "scripts" / "kafka_local.py"


@dataclass
class Secured:
    """A secured broker (SASL_SSL, SCRAM-SHA-512, ACLs required): where it is, the CA its certificate chains to,
    and each principal's password (its super user ``admin`` too)."""

    bootstrap: str
    ca_file: Path
    run_dir: Path
    passwords: dict[str, str]

    def connection(self, user: str) -> Connection:
        return Connection(self.bootstrap, "SASL_SSL", "SCRAM-SHA-512", user, self.passwords[user], str(self.ca_file))

    def env(self, user: str, *, password: str | None = None) -> dict[str, str]:
        """A worker's or a command's settings as ``user`` (the password through a file, as a mounted secret)."""
        secret = self.run_dir / f"{user}-{secrets.token_hex(4)}.password"
        secret.write_text((self.passwords[user] if password is None else password) + "\n")
        return {"SEAM_BROKER_URL": f"kafka://{self.bootstrap}", "SEAM_SECURITY_PROTOCOL": "SASL_SSL",
                "SEAM_SASL_MECHANISM": "SCRAM-SHA-512", "SEAM_SASL_USERNAME": user,
                "SEAM_SASL_PASSWORD_FILE": str(secret), "SEAM_SSL_CA_FILE": str(self.ca_file)}

    def tools(self, lines: list[str]) -> subprocess.CompletedProcess[str]:
        """Kafka's tools, one command line after another in one JVM, as the broker's admin user."""
        port = self.bootstrap.rsplit(":", 1)[1]
        return subprocess.run([sys.executable, str(KAFKA_LOCAL), "tools"], input="\n".join(lines),
                              capture_output=True, text=True,
                              env=worker_env({"KAFKA_PORT": port, "KAFKA_RUN_DIR": str(self.run_dir)}))
