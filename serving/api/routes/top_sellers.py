"""``GET /v1/top-sellers``: best sellers by units in a window, per scope."""

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

router = APIRouter(prefix="/v1/top-sellers", tags=["top sellers"],
                   dependencies=[Depends(require_api_key)])


@router.get("", response_model=TopItemsResponse, responses=ERROR_RESPONSES,
            summary="Top sellers of a window, globally or per category / region")
async def get_top_sellers(
    client: ClientDep,
    window: WindowQuery = "1h",
    category: CategoryQuery = None,
    region: RegionQuery = None,
    k: KQuery = K_DEFAULT,
) -> TopItemsResponse:
    """Items ranked by units sold in the last ``window``, for the scope the filters name
    (global when neither ``category`` nor ``region`` is given; both: category x region).
    An unknown scope is an empty list. ``degraded`` answers come from memory."""
    return await client.top_sellers(window, category, region, k)
