"""Create seam's topics before a worker subscribes to them.

A topic created while the consumer is already subscribed is only picked up at its next metadata
refresh (minutes), so a worker declares every topic it reads or writes before Faust starts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError, TopicAuthorizationFailedError

from app.settings import Settings, SettingsError
from tables.kafka import Connection, Refused, check, client_options, refused

__all__ = ["declare_topics", "delete_topics", "ensure_topics"]


async def ensure_topics(
    bootstrap: str | Connection, topics: Sequence[str], partitions: int, replication: int = 1, *,
    compacted: Sequence[str] = (), log_append_time: Sequence[str] = (),
) -> None:
    """Create the topics that do not exist yet: ``compacted`` ones with cleanup.policy=compact,
    ``log_append_time`` ones with their timestamps set by the broker (latency measurements).

    The one place seam, its tests, the benchmark and the scripts create topics.
    """
    configs: dict[str, dict[str, str]] = {name: {} for name in topics}
    configs |= {name: {"cleanup.policy": "compact"} for name in compacted}
    configs |= {name: {"message.timestamp.type": "LogAppendTime"} for name in log_append_time}
    admin = AIOKafkaAdminClient(**client_options(bootstrap))
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        missing = [NewTopic(name, partitions, replication, topic_configs=config)
                   for name, config in configs.items() if name not in existing]
        if missing:
            response = await admin.create_topics(missing)
            for name, code, *rest in response.topic_errors:
                if code == TopicAuthorizationFailedError.errno:
                    raise refused(TopicAuthorizationFailedError(), bootstrap, f"creating topic {name!r}")
                # Another worker may have created it between the listing and the request.
                if code not in (0, TopicAlreadyExistsError.errno):
                    message = rest[0] if rest else ""
                    raise RuntimeError(f"creating topic {name!r} failed: error {code} {message}")
    finally:
        await admin.close()


def declare_topics(settings: Settings, changelogs: list[str], timeout_s: float = 60.0) -> None:
    """Create the input, output and table changelog topics; callable before Faust's loop runs."""
    names = [settings.input_topic, settings.predictions_topic, settings.dlq_topic, settings.late_topic,
             settings.shadow_topic, *([settings.feature_log_topic] if settings.feature_log_topic else [])]

    async def create() -> None:
        connection = settings.kafka
        try:
            await check(connection)
        except Refused as exc:
            raise SettingsError(f"{exc}; check SEAM_SASL_USERNAME, SEAM_SASL_PASSWORD (or SEAM_SASL_PASSWORD_FILE) "
                                "and SEAM_SASL_MECHANISM") from None
        except ConnectionError as exc:
            raise SettingsError(f"{exc}; check SEAM_BROKER_URL and SEAM_SECURITY_PROTOCOL (and, with TLS, "
                                "SEAM_SSL_CA_FILE)") from None
        await ensure_topics(connection, names, settings.topic_partitions,
                            settings.topic_replication_factor, compacted=changelogs)
        # One partition: one record (the deployment), read in full by every worker and command.
        await ensure_topics(connection, [], 1, settings.topic_replication_factor,
                            compacted=[settings.model_control_topic])

    # Its own thread and loop: Faust's loop is not running yet and must not be replaced.
    with ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(asyncio.run, create()).result(timeout=timeout_s)


async def delete_topics(bootstrap: str | Connection, containing: str) -> list[str]:
    """Delete every topic whose name contains ``containing`` (a run's own id); return their names."""
    admin = AIOKafkaAdminClient(**client_options(bootstrap))
    await admin.start()
    try:
        names = sorted(t for t in await admin.list_topics() if containing in t)
        if names:
            await admin.delete_topics(names, timeout_ms=30_000)
    finally:
        await admin.close()
    return names
