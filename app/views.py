"""Web views served by every worker on Faust's built-in web server (added to an app by :func:`register`)."""

from __future__ import annotations

import asyncio
from importlib import resources
from typing import Any

import aiohttp
import faust
from faust.web import Request, Response, View
from faust.web.exceptions import ServiceUnavailable
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from yarl import URL

from agents.model.runtime import runtime_package
from app.cluster import describe_cluster, local_view
from app.scoring import ScoringService
from app.settings import Settings
from tables.faust_compat import group_distribution
from tables.features import latest_features
from tables.kafka import partition_of
from tables.state import StateTables

__all__ = ["PEER_TIMEOUT_S", "forward_get", "register"]

PEER_TIMEOUT_S = 2.0


async def forward_get(client: aiohttp.ClientSession, owner: URL, path_qs: str,
                      timeout_s: float = PEER_TIMEOUT_S) -> tuple[int, bytes, str]:
    """GET ``path_qs`` from the worker at ``owner`` for a caller: within ``timeout_s``, with none of the
    caller's headers (no cookie or credential of theirs reaches another worker), no redirect followed.
    Returns (status, body, content type); 504 if the owner did not answer in time, 502 if it could not be reached."""
    url = owner.with_path("/").join(URL(path_qs))
    try:
        async with client.get(url, headers={"Accept": "application/json"}, allow_redirects=False,
                              timeout=aiohttp.ClientTimeout(total=timeout_s)) as response:
            return response.status, await response.read(), response.content_type
    except TimeoutError:
        return 504, f'{{"error": "the owner {owner} did not answer within {timeout_s:.0f} s"}}'.encode(), \
            "application/json"
    except aiohttp.ClientError as exc:
        return 502, f'{{"error": "the owner {owner} could not be reached: {type(exc).__name__}"}}'.encode(), \
            "application/json"


def register(app: faust.App, settings: Settings, scoring: ScoringService, tables: StateTables) -> None:
    """Serve seam's pages on ``app``'s web server: /model/, /healthz, /ready/, /batcher/, /metrics, /dashboard/,
    /features/, /cluster/."""
    dashboard = resources.files("app").joinpath("static/dashboard.html").read_text(encoding="utf-8")

    @app.page("/model/")
    class ModelView(View):
        """The primary model this worker serves (the provider it really runs on, the boundary's counters), and
        its whole deployment: revision, primary, canary and its share, shadow, the last deployment refused."""

        async def get(self, request: Request) -> Response:
            runtime, boundary, models = scoring.runtime, scoring.boundary, scoring.models
            if runtime is None or boundary is None or models is None:
                return self.json({"status": "loading"}, status=503)
            info = runtime.info
            return self.json({
                "model": info.tag,
                "deployment": models.describe(),
                "path": info.path,
                "provider": info.provider,
                "runtime": runtime_package(),
                "feature_names": list(info.feature_names),
                "max_batch_size": settings.max_batch_size,
                "max_wait_ms": settings.max_wait_ms,
                "max_inflight_batches": settings.max_inflight_batches,
                "waiting": boundary.waiting,
                "stats": boundary.stats.as_dict(),
            })


    @app.page("/healthz")
    class HealthView(View):
        """200 while the worker process runs and serves requests (liveness; readiness is /ready/)."""

        async def get(self, request: Request) -> Response:
            return self.json({"alive": True})


    @app.page("/dashboard/")
    class DashboardView(View):
        """A live page of this worker's metrics (it reads /metrics and /cluster/ every few seconds)."""

        async def get(self, request: Request) -> Response:
            return self.html(dashboard)


    @app.page("/ready/")
    class ReadyView(View):
        """200 while this worker serves: in the group, its models loaded, warmed and dispatching, no rebalance
        or restore running (a spare with no partitions included); else 503 with what it waits for."""

        async def get(self, request: Request) -> Response:
            state = scoring.readiness()
            return self.json(state.as_dict(), status=200 if state.ready else 503)


    @app.page("/batcher/")
    class BatcherView(View):
        """The boundary's live settings, its adaptive estimates and recent batch statistics."""

        async def get(self, request: Request) -> Response:
            boundary = scoring.boundary
            if boundary is None:
                return self.json({"status": "loading"}, status=503)
            batcher = boundary.batcher
            a_s, b_s = batcher.latency.coefficients()
            return self.json({
                "max_batch_size": batcher.max_batch_size,
                "max_wait_ms": batcher.max_wait_s * 1000,
                "sla_ms": None if batcher.sla_s is None else batcher.sla_s * 1000,
                "max_inflight_batches": settings.max_inflight_batches,
                "adaptive": batcher.adaptive,
                "target_batch_size": batcher.target_size(),
                "arrival_rate_per_s": batcher.rate.rate(),
                "inference_ms_model": {"per_call": a_s * 1000, "per_row": b_s * 1000},
                "waiting": boundary.waiting,
                "stats": boundary.stats.as_dict(),
            })


    @app.page("/metrics")
    class MetricsView(View):
        """Prometheus metrics of this worker."""

        async def get(self, request: Request) -> Response:
            # aiohttp refuses a charset inside content_type; the exposition format is ASCII anyway.
            content_type = CONTENT_TYPE_LATEST.split("; charset")[0]
            return self.bytes(generate_latest(scoring.metrics.registry), content_type=content_type)


    def key_partition(key: str) -> int:
        """The input partition of a key (Kafka's default partitioner, as Faust routes)."""
        return partition_of(key.encode(), settings.topic_partitions)

    spec = scoring.spec

    def owner_of(key: str) -> URL | None:
        """The advertised URL of the group member that owns ``key``'s partition now; None: this worker."""
        try:
            owner: URL = app.router.key_store(tables.state_table.name, key)
        except KeyError:  # no assignment yet (a rebalance): nobody owns it right now
            raise ServiceUnavailable() from None
        me = URL(str(app.conf.canonical_url))
        return None if (owner.host, owner.port) == (me.host, me.port) else owner

    @app.page("/features/{key}/")
    class KeyFeaturesView(View):
        """A key's features as of its latest applied event and its partition's watermark (owner answers)."""

        async def get(self, request: Request, key: str) -> Response:
            owner = owner_of(key)
            if owner is not None:
                status, body, content_type = await forward_get(app.http_client, owner, request.url.path_qs)
                return self.bytes(body, content_type=content_type, status=status)
            pipeline = scoring.pipeline
            if pipeline is None:
                return self.json({"status": "loading"}, status=503)
            partition = key_partition(key)
            state = pipeline.cache.peek(partition, key)
            latest = latest_features(state, spec) if state is not None else None
            if state is None or latest is None:
                return self.notfound(f"no state for {spec.key} {key!r}")
            event_id, features = latest
            return self.json({
                spec.key: key,
                "partition": partition,
                "event_id": event_id,
                "features": dict(zip(spec.names, features, strict=True)),
                "watermark": pipeline.cache.watermark(partition).value,
                "events_in_state": len(state["ts"]),
                "served_by": str(app.conf.canonical_url),
            })


    def _own_assignment() -> dict[str, Any]:
        assignor = app.assignor
        actives: dict[str, list[int]] = {}
        standbys: dict[str, list[int]] = {}
        for tp in assignor.assigned_actives():
            actives.setdefault(tp.topic, []).append(tp.partition)
        # Faust's assignment also names standbys of the input topic; only changelog standbys are read.
        changelogs = app.tables.changelog_topics
        for tp in assignor.assigned_standbys():
            if tp.topic in changelogs:
                standbys.setdefault(tp.topic, []).append(tp.partition)
        return local_view(str(app.conf.canonical_url), app.consumer_generation_id, actives, standbys)


    async def _peer_view(url: str) -> dict[str, Any] | str:
        """A member's own assignment (``?scope=local``), or why it could not be had."""
        try:
            async with app.http_client.get(f"{url.rstrip('/')}/cluster/", params={"scope": "local"},
                                           timeout=aiohttp.ClientTimeout(total=PEER_TIMEOUT_S)) as response:
                if response.status != 200:
                    return f"HTTP {response.status}"
                view: dict[str, Any] = await response.json()
                return view
        except (aiohttp.ClientError, TimeoutError) as exc:
            return f"unreachable: {exc!r}"


    @app.page("/cluster/")
    class ClusterView(View):
        """The workers this one knows and the partitions each owns, active and standby."""

        async def get(self, request: Request) -> Response:
            own = _own_assignment()
            if request.query.get("scope") == "local":
                return self.json(own)
            assignor = app.assignor
            changelogs, external = group_distribution(assignor)
            peers = sorted((set(changelogs) | set(external)) - {own["url"]})
            answers = await asyncio.gather(*(_peer_view(url) for url in peers))
            return self.json(describe_cluster(
                self_url=own["url"], generation=own["generation"], input_topic=settings.input_topic,
                input_partitions=settings.topic_partitions, changelog_distribution=changelogs,
                external_distribution=external, peer_views={own["url"]: own, **dict(zip(peers, answers, strict=True))},
            ) | {"standby_replicas": app.conf.table_standby_replicas})
