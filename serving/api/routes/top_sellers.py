"""``GET /v1/top-sellers``: best sellers by units in a window, per scope."""

from __future__ import annotations

from serving.api.routes.top_lists import top_items_router

__all__ = ["router"]

router = top_items_router(
    "top_sellers", prefix="/v1/top-sellers", tag="top sellers",
    summary="Top sellers of a window, globally or per category / region",
    description="Items ranked by units sold in the last ``window``, for the scope the filters "
    "name (global when neither ``category`` nor ``region`` is given; both: category x region). "
    "An unknown scope is an empty list. ``degraded`` answers come from memory.",
)
