"""``GET /v1/trending``: items selling faster than their daily pace."""

from __future__ import annotations

from serving.api.routes.top_lists import top_items_router

__all__ = ["router"]

router = top_items_router(
    "trending", prefix="/v1/trending", tag="trending",
    summary="Trending items, globally or per category / region",
    description="Items ranked by trending score -- the last hour's units against the item's 24h "
    "pace, ``(units_1h + 1) / (units_24h / 24 + 1)`` -- for a scope. Only ``window=1h`` exists "
    "(the score already compares the hour with the day); ``24h`` is a 422.",
)
