"""Kafka plumbing every layer shares: how a client connects, the default partitioner, filling record
batches, whole-topic assignment.

It sits in the bottom layer (``tables/`` writes changelogs as well), so every client seam makes (Faust's,
the outputs', the changelog's, the transactions', the control topic's, the commands' and the benchmark's)
connects the same way, and the outputs, the changelog writer, the load generator, the web views and the
benchmark all partition and batch records the same way.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka import errors as kafka_errors
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.conn import create_conn
from aiokafka.partitioner import murmur2

__all__ = ["PROTOCOLS", "REFUSALS", "SASL_MECHANISMS", "Connection", "Refused", "append", "assign_all", "check",
           "client_options", "partition_counts", "partition_of", "refused"]

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


@dataclass(frozen=True)
class Connection:
    """How a client reaches the cluster: its bootstrap servers and, on a secured cluster, TLS and SASL.

    The secrets (the SASL password, the key's password) never appear in its ``repr``.
    """

    bootstrap: str
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str = ""
    username: str = ""
    password: str = field(default="", repr=False)
    ca_file: str = ""  # the CA that signed the brokers' certificates (empty: the system's)
    cert_file: str = ""  # the client's own certificate, for mutual TLS
    key_file: str = ""
    key_password: str = field(default="", repr=False)

    @classmethod
    def of(cls, target: str | Connection) -> Connection:
        """``target`` itself, or a plaintext connection to the bootstrap servers it names."""
        return cls(target) if isinstance(target, str) else target

    def __post_init__(self) -> None:
        if self.security_protocol not in PROTOCOLS:
            raise ValueError(f"security protocol must be one of {', '.join(PROTOCOLS)}, got {self.security_protocol!r}")
        if self.sasl:
            if self.sasl_mechanism not in SASL_MECHANISMS:
                raise ValueError(f"{self.security_protocol} needs a SASL mechanism, one of "
                                 f"{', '.join(SASL_MECHANISMS)}; got {self.sasl_mechanism!r}")
            if not self.username or not self.password:
                raise ValueError(f"{self.security_protocol} needs a user name and a password")
        if bool(self.cert_file) != bool(self.key_file):
            raise ValueError("mutual TLS needs both a certificate file and its key file")

    @property
    def sasl(self) -> bool:
        return self.security_protocol.startswith("SASL_")

    @property
    def tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context of a client (None without TLS): the brokers' certificates checked, host names too."""
        if not self.tls:
            return None
        context = ssl.create_default_context(cafile=self.ca_file or None)
        if self.cert_file:
            context.load_cert_chain(self.cert_file, self.key_file, password=self.key_password or None)
        return context

    def options(self) -> dict[str, Any]:
        """The keyword arguments of an aiokafka client (producer, consumer, admin) for this connection."""
        options: dict[str, Any] = {"bootstrap_servers": self.bootstrap, "security_protocol": self.security_protocol}
        if self.tls:
            options["ssl_context"] = self.ssl_context()
        if self.sasl:
            options |= {"sasl_mechanism": self.sasl_mechanism, "sasl_plain_username": self.username,
                        "sasl_plain_password": self.password}
        return options


class Refused(Exception):
    """The cluster refused this client: its credentials, or an operation its ACLs do not grant."""


# What a broker answers when the client's principal may not do what it asked (Kafka's ACLs), and the
# refusals a client can meet: those, and its credentials refused.
NOT_AUTHORIZED = (kafka_errors.TopicAuthorizationFailedError, kafka_errors.GroupAuthorizationFailedError,
                  kafka_errors.ClusterAuthorizationFailedError, kafka_errors.TransactionalIdAuthorizationFailed)
REFUSALS = (*NOT_AUTHORIZED, kafka_errors.SaslAuthenticationFailed)
TOPIC_AUTHORIZATION_FAILED = kafka_errors.TopicAuthorizationFailedError.errno


def refused(exc: BaseException, target: str | Connection, what: str) -> Refused:
    """A :class:`Refused` that says in one line who was refused ``what`` and why (never a secret)."""
    connection = Connection.of(target)
    who = f"user {connection.username!r}" if connection.sasl else "this client"
    reason = getattr(exc, "message", "") or type(exc).__name__
    if isinstance(exc, NOT_AUTHORIZED):
        reason = f"not authorized ({type(exc).__name__}: the cluster's ACLs do not grant it)"
    return Refused(f"the cluster at {connection.bootstrap} refused {who} {what}: {reason}")


async def check(target: str | Connection, timeout_s: float = 10.0) -> None:
    """Connect to a bootstrap server and, on a secured cluster, authenticate; raise :class:`Refused` if the
    credentials are refused, ``ConnectionError`` if no server answers (the first one's error)."""
    connection = Connection.of(target)
    options = connection.options()
    del options["bootstrap_servers"]
    first: BaseException | None = None
    for server in connection.bootstrap.split(","):
        host, _, port = server.strip().rpartition(":")
        try:
            conn = await asyncio.wait_for(create_conn(host.strip("[]"), int(port), **options), timeout_s)
        except kafka_errors.SaslAuthenticationFailed as exc:
            raise refused(exc, connection, f"as {connection.security_protocol} {connection.sasl_mechanism}") from None
        except (OSError, TimeoutError, ssl.SSLError, kafka_errors.KafkaError) as exc:
            first = first or exc
            continue
        conn.close()
        return
    raise ConnectionError(f"no broker of {connection.bootstrap} answered over {connection.security_protocol}: "
                          f"{first!r}")


def client_options(target: str | Connection, **options: Any) -> dict[str, Any]:
    """An aiokafka client's keyword arguments: ``target``'s connection (a bootstrap string: plaintext), ``options``."""
    connection = Connection.of(target)
    return connection.options() | options



class Batch(Protocol):
    """A record batch being filled (aiokafka's ``BatchBuilder``): ``append`` returns None once it is full."""

    def append(self, *, timestamp: int | None, key: bytes | None, value: bytes | None) -> object | None: ...


BatchT = TypeVar("BatchT", bound=Batch)


def partition_of(key: bytes, partitions: int) -> int:
    """The partition Kafka's default partitioner (Java's and aiokafka's) gives ``key``: murmur2, positive, modulo."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def append(batch: BatchT, new_batch: Callable[[], BatchT], key: bytes | None, value: bytes | None,
           timestamp: int | None = None) -> tuple[BatchT, BatchT | None]:
    """Append a record to ``batch`` or, once it is full, to a new one from ``new_batch``.

    Returns the batch now open and the full one to send (``None`` if there is none). A record that does
    not fit in an empty batch raises ``ValueError``.
    """
    if batch.append(key=key, value=value, timestamp=timestamp) is not None:
        return batch, None
    fresh = new_batch()
    if fresh.append(key=key, value=value, timestamp=timestamp) is None:
        raise ValueError(f"a record of {len(key or b'') + len(value or b'')} bytes does not fit in a batch")
    return fresh, batch


async def partition_counts(bootstrap: str | Connection, topics: list[str]) -> dict[str, int]:
    """Ask the cluster how many partitions each topic has; raises ``LookupError`` for a missing one."""
    admin = AIOKafkaAdminClient(**client_options(bootstrap))
    await admin.start()
    try:
        described = await admin.describe_topics(topics)
    finally:
        await admin.close()
    denied = sorted(t["topic"] for t in described if t.get("error_code") == TOPIC_AUTHORIZATION_FAILED)
    if denied:
        raise refused(kafka_errors.TopicAuthorizationFailedError(), bootstrap, f"describing topics {denied}")
    counts = {t["topic"]: len(t["partitions"]) for t in described if not t.get("error_code")}
    missing = [t for t in topics if t not in counts]
    if missing:
        raise LookupError(f"topics {missing} do not exist")
    return counts


async def assign_all(
    consumer: AIOKafkaConsumer, bootstrap: str | Connection, topics: list[str], *, from_end: bool,
) -> list[TopicPartition]:
    """Assign every partition of ``topics`` (which must exist) and seek to their start or end."""
    counts = await partition_counts(bootstrap, topics)
    partitions = [TopicPartition(t, p) for t in topics for p in range(counts[t])]
    consumer.assign(partitions)
    if from_end:
        await consumer.seek_to_end(*partitions)
        for tp in partitions:
            await consumer.position(tp)  # resolve the end now, not at the first fetch
    else:
        await consumer.seek_to_beginning(*partitions)
    return partitions
