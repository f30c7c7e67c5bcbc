"""Web views served by every worker on Faust's built-in web server."""

from __future__ import annotations

from faust.web import Request, Response, View

from agents.score import scoring
from app.main import app, settings
from tables.state import card_state, load_state

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


@app.page("/features/{card_id}/")
class CardFeaturesView(View):
    """The stored event-time state of one card, answered by the worker that owns its partition."""

    @app.table_route(table=card_state, match_info="card_id")  # type: ignore[arg-type]
    async def get(self, request: Request, card_id: str) -> Response:
        state = load_state(card_id)
        if state is None:
            return self.notfound(f"no state for card {card_id!r}")
        return self.json({"card_id": card_id, "state": state})
