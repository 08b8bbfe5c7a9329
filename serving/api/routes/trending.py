"""``GET /v1/trending``: items selling faster than their daily pace."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from serving.api.deps import (
    ERROR_RESPONSES,
    CategoryQuery,
    ClientDep,
    KQuery,
    RegionQuery,
    WindowQuery,
    require_api_key,
)
from serving.models import TopItemsResponse
from serving.validation import K_DEFAULT

__all__ = ["router"]

router = APIRouter(prefix="/v1/trending", tags=["trending"],
                   dependencies=[Depends(require_api_key)])


@router.get("", response_model=TopItemsResponse, responses=ERROR_RESPONSES,
            summary="Trending items, globally or per category / region")
async def get_trending(
    client: ClientDep,
    window: WindowQuery = "1h",
    category: CategoryQuery = None,
    region: RegionQuery = None,
    k: KQuery = K_DEFAULT,
) -> TopItemsResponse:
    """Items ranked by trending score -- the last hour's units against the item's 24h pace,
    ``(units_1h + 1) / (units_24h / 24 + 1)`` -- for a scope. Only ``window=1h`` exists
    (the score already compares the hour with the day); ``24h`` is a 422."""
    return await client.trending(window, category, region, k)
