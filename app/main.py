"""Build seam's Faust app from its settings and run its command line (``seam worker -l info``).

Importing this module (or any of seam's) reads no environment and builds nothing: :func:`create_app`
builds an app from a :class:`Settings` object, and :func:`main`, the ``seam`` command, reads the
settings from the ``SEAM_*`` variables first.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import sys
from typing import Any

import faust
from faust.types.auth import CredentialsT

from app.settings import Settings, SettingsError
from app.topics import declare_topics
from tables.kafka import Connection, Refused
from tables.spec import FeatureSpec, SpecError, load_spec

__all__ = ["SeamApp", "create_app", "main"]

logger = logging.getLogger(__name__)
_HELP = {"--help", "-h"}


class SeamApp(faust.App):
    """seam's Faust app: creates its topics when its worker starts, before the consumer subscribes.

    Topics are not created on ``worker_init`` (Faust runs that for every command, ``--help`` too) but
    when the app service first starts. Changelogs too: one created while the consumer runs is briefly
    seen with 0 partitions, and a table write at that moment fails Faust's partition check.
    """

    def __init__(self, settings: Settings, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seam_settings = settings

    async def on_first_start(self) -> None:
        await super().on_first_start()
        changelogs = [table.changelog_topic_name for table in self.tables.values()]
        try:
            await asyncio.to_thread(declare_topics, self.seam_settings, changelogs)
        except (SettingsError, Refused) as exc:  # the cluster's answer, in one line: what to fix
            logger.error("seam: %s", exc)
            raise SystemExit(f"seam: {exc}") from None


def broker_credentials(connection: Connection) -> CredentialsT | None:
    """Faust's credentials for ``connection`` (None on a plaintext cluster)."""
    if connection.sasl:
        return faust.SASLCredentials(username=connection.username, password=connection.password,
                                     ssl_context=connection.ssl_context(), mechanism=connection.sasl_mechanism)
    context = connection.ssl_context()
    return None if context is None else faust.SSLCredentials(context)


def create_app(settings: Settings, spec: FeatureSpec | None = None) -> faust.App:
    """A Faust app with seam's tables, scoring service, ingestion path, web views and commands, for ``spec``
    (default: the file ``SEAM_FEATURE_SPEC`` names)."""
    spec = load_spec(settings.feature_spec) if spec is None else spec
    from app import cli, views
    from app.logs import SeamWorker, logging_config
    from app.scoring import install
    from tables.state import StateTables

    # The app id names the consumer group and prefixes the changelog topics ("<id>-card-state-changelog");
    # changing it (or `version`) starts from empty state and the group's committed offsets are not reused.
    web_host = settings.web_host or socket.gethostname()
    app = SeamApp(
        settings,
        settings.app_id,
        version=1,
        Worker=SeamWorker,
        logging_config=logging_config(settings.log_format, f"http://{web_host}:{settings.web_port}"),
        broker=settings.broker_url,
        broker_credentials=broker_credentials(settings.kafka),
        store="rocksdb://",
        datadir=str(settings.data_dir),
        web_port=settings.web_port,
        web_bind=settings.web_bind,
        web_host=web_host,
        # Faust's /router/ and /table/ pages show the cluster's workers and any table's contents to whoever
        # reaches the port: off unless asked for (seam's own /features/ routes a key to its owner itself).
        web_router_enabled=settings.web_faust_pages,
        web_tables_enabled=settings.web_faust_pages,
        topic_partitions=settings.topic_partitions,
        topic_replication_factor=settings.topic_replication_factor,
        broker_max_poll_records=settings.max_poll_records,
        broker_commit_interval=settings.commit_interval_s,
        broker_session_timeout=settings.session_timeout_s,
        broker_heartbeat_interval=min(3.0, settings.session_timeout_s / 3),
        producer_acks=-1,
        # A few milliseconds of linger turn thousands of per-record produce requests into a few batches.
        producer_linger=0.005,
        producer_max_batch_size=256 * 1024,
        consumer_auto_offset_reset="earliest",
        key_serializer="raw",
        value_serializer="raw",
        # Unacknowledged records are redelivered anyway; waiting for them would only stall shutdown.
        stream_wait_empty=False,
        autodiscover=False,
        table_standby_replicas=settings.standby_replicas,
    )

    tables = StateTables(app, partitions=settings.topic_partitions, db_memory_mb=settings.state_db_memory_mb)
    scoring = install(app, settings, tables, spec)
    views.register(app, settings, scoring, tables)
    cli.register(app, settings)
    return app


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``seam`` console script: Faust's command line for an app built from ``SEAM_*``.

    Settings that do not parse stop every command with an error that names them, except a request for
    help, which is answered from the defaults.
    """
    args = sys.argv[1:] if argv is None else argv
    try:
        settings = Settings.from_env()
    except SettingsError as exc:
        if args and not _HELP & set(args):
            raise SystemExit(f"seam: {exc}") from None
        settings = Settings()
    try:
        spec = load_spec(settings.feature_spec)
    except SpecError as exc:
        if args and not _HELP & set(args):
            raise SystemExit(f"seam: SEAM_FEATURE_SPEC: {exc}") from None
        spec = None
    if settings.log_format == "json" and not {"-q", "--quiet"} & set(args):
        # Faust's own console output (its banner, "starting➢") is not a log record: JSON logs only.
        sys.argv = [sys.argv[0], "--quiet", *args]
    create_app(settings, spec).main()
