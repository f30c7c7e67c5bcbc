"""The control topic: deployments as records in a compacted topic that every worker follows.

One key (``deployment``), the newest record wins: compaction keeps it, a worker that starts later
reads it first, and ``seam model ...`` commands read it, change it (:mod:`agents.model.deployment`) and
write the next revision. Revisions only increase: a record whose revision is not above the highest read
so far (an old record written again, a producer other than ``seam model``) is refused like an unusable
one, and the models served stay. Workers read it with a consumer of their own, outside the consumer group:
every replica reads every record.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from agents.model.deployment import Deployment, DeploymentError
from tables.kafka import Connection, assign_all, client_options

__all__ = ["KEY", "ControlFollower", "change", "decode", "encode", "read_latest", "write"]

logger = logging.getLogger(__name__)

KEY = b"deployment"


def encode(deployment: Deployment) -> bytes:
    return orjson.dumps(deployment.as_dict())


def decode(value: bytes | None) -> Deployment:
    """A record's deployment; raises :class:`DeploymentError` for one that cannot be used."""
    if value is None:
        raise DeploymentError("the deployment record was deleted (a tombstone)")
    try:
        data = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise DeploymentError(f"the deployment record is not JSON: {exc}") from None
    return Deployment.from_dict(data)


class ControlFollower:
    """Reads the control topic from its start, then follows it: each new record, in log order."""

    def __init__(self, bootstrap: str | Connection, topic: str) -> None:
        self.bootstrap, self.topic = bootstrap, topic
        self._consumer: AIOKafkaConsumer | None = None
        self.highest_revision: int | None = None  # of the deployments read so far

    async def start(self) -> None:
        consumer = AIOKafkaConsumer(**client_options(self.bootstrap), enable_auto_commit=False, group_id=None,
                                    client_id=f"seam-control-{self.topic}")
        await consumer.start()
        try:
            await assign_all(consumer, self.bootstrap, [self.topic], from_end=False)
        except BaseException:
            await consumer.stop()
            raise
        self._consumer = consumer

    async def stop(self) -> None:
        if self._consumer is not None:
            await self._consumer.stop()
            self._consumer = None

    async def catch_up(self, timeout_s: float = 30.0) -> Deployment | DeploymentError | None:
        """Read every record written so far; the newest one's deployment (None if there is none)."""
        consumer = self._require()
        partitions = list(consumer.assignment())
        ends = await consumer.end_offsets(partitions)
        latest: Deployment | DeploymentError | None = None
        deadline = time.monotonic() + timeout_s
        while [tp for tp in partitions if await consumer.position(tp) < ends[tp]]:
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading the control topic {self.topic!r} took over {timeout_s:.0f} s")
            for records in (await consumer.getmany(timeout_ms=500)).values():
                for record in records:
                    latest = self._read(record.key, record.value, latest)
        return latest

    async def next(self, timeout_s: float = 1.0) -> Deployment | DeploymentError | None:
        """The newest deployment among the records that arrive within ``timeout_s`` (None: none arrived)."""
        consumer = self._require()
        latest: Deployment | DeploymentError | None = None
        for records in (await consumer.getmany(timeout_ms=int(timeout_s * 1000))).values():
            for record in records:
                latest = self._read(record.key, record.value, latest)
        return latest

    def _read(self, key: bytes | None, value: bytes | None,
              latest: Deployment | DeploymentError | None) -> Deployment | DeploymentError | None:
        """The deployment a record makes the newest one: its own, or a refusal (an unusable record), or
        ``latest`` again for a record of another key. A revision not above the highest read so far leaves
        ``latest`` the newest when it is a deployment (a worker starting reads past it to what the others
        serve), else it is a refusal (a running worker reports it and keeps its models)."""
        parsed = _parse(key, value, latest)
        if parsed is latest or not isinstance(parsed, Deployment):
            return parsed
        highest = self.highest_revision
        if highest is not None and parsed.revision <= highest:
            refusal = DeploymentError(f"revision {parsed.revision} does not follow revision {highest}: "
                                      "deployment revisions only increase (seam model writes the next one)")
            logger.warning("control topic: %s; revision %d stays the newest", refusal, highest)
            return latest if isinstance(latest, Deployment) else refusal
        self.highest_revision = parsed.revision
        return parsed

    def _require(self) -> AIOKafkaConsumer:
        if self._consumer is None:
            raise RuntimeError("the control topic follower is not started")
        return self._consumer


def _parse(key: bytes | None, value: bytes | None,
           latest: Deployment | DeploymentError | None) -> Deployment | DeploymentError | None:
    if key != KEY:
        logger.warning("control topic: ignored a record with key %r (only %r is read)", key, KEY)
        return latest
    try:
        return decode(value)
    except DeploymentError as exc:
        return exc


async def read_latest(bootstrap: str | Connection, topic: str) -> Deployment | None:
    """The deployment the control topic holds now (None if it holds none); raises for an unusable one."""
    follower = ControlFollower(bootstrap, topic)
    await follower.start()
    try:
        latest = await follower.catch_up()
    finally:
        await follower.stop()
    if isinstance(latest, DeploymentError):
        raise latest
    return latest


async def write(bootstrap: str | Connection, topic: str, deployment: Deployment) -> None:
    """Write ``deployment`` as the control topic's newest record and wait for the broker to have it."""
    producer = AIOKafkaProducer(**client_options(bootstrap), acks="all", enable_idempotence=True)
    await producer.start()
    try:
        await (await producer.send(topic, encode(deployment), key=KEY))
    finally:
        await producer.stop()


async def change(bootstrap: str | Connection, topic: str, base: Callable[[], Deployment],
                 transition: Callable[[Deployment], Deployment]) -> Deployment:
    """Read the current deployment (``base()`` when the topic has none), apply ``transition``, write the result.

    One writer at a time is assumed (an operator's command); two commands at once both write, and the
    later record in the log is the deployment.
    """
    current = await read_latest(bootstrap, topic)
    updated = transition(current if current is not None else base())
    await write(bootstrap, topic, updated)
    return updated
