"""Web views served by every worker on Faust's built-in web server."""

from __future__ import annotations

from aiokafka.partitioner import murmur2
from faust.web import Request, Response, View

from agents.score import scoring
from app.main import app, settings
from tables.features import DEFAULT_SPEC, latest_features
from tables.state import card_state

__all__ = ["CardFeaturesView", "ModelView"]


@app.page("/model/")
class ModelView(View):
    """The model this worker serves, the provider it really runs on, and the boundary's counters."""

    async def get(self, request: Request) -> Response:
        runtime, boundary = scoring.runtime, scoring.boundary
        if runtime is None or boundary is None:
            return self.json({"status": "loading"}, status=503)
        info = runtime.info
        return self.json({
            "model": info.tag,
            "path": info.path,
            "provider": info.provider,
            "feature_names": list(info.feature_names),
            "max_batch_size": settings.max_batch_size,
            "max_wait_ms": settings.max_wait_ms,
            "max_inflight_batches": settings.max_inflight_batches,
            "waiting": boundary.waiting,
            "stats": boundary.stats.as_dict(),
        })


def card_partition(card_id: str) -> int:
    """The input partition of a card keyed by its id (Kafka's default partitioner, as Faust routes)."""
    return (murmur2(card_id.encode()) & 0x7FFFFFFF) % settings.topic_partitions


@app.page("/features/{card_id}/")
class CardFeaturesView(View):
    """A card's features as of its latest applied event and its partition's watermark (owner answers)."""

    @app.table_route(table=card_state, match_info="card_id")  # type: ignore[arg-type]
    async def get(self, request: Request, card_id: str) -> Response:
        pipeline = scoring.pipeline
        if pipeline is None:
            return self.json({"status": "loading"}, status=503)
        partition = card_partition(card_id)
        state = pipeline.cache.peek(partition, card_id)
        latest = latest_features(state) if state is not None else None
        if state is None or latest is None:
            return self.notfound(f"no state for card {card_id!r}")
        event_id, features = latest
        return self.json({
            "card_id": card_id,
            "partition": partition,
            "event_id": event_id,
            "features": dict(zip(DEFAULT_SPEC.names, features, strict=True)),
            "watermark": pipeline.cache.watermark(partition).value,
            "events_in_state": len(state["ts"]),
            "served_by": app.conf.canonical_url.host,
        })
