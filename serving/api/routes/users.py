"""``GET /v1/users/{user_id}/recommendations``: the live model's picks, re-ranked now."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from serving.api.deps import (
    ERROR_RESPONSES,
    ROUTE_DEPENDENCIES,
    ClientDep,
    KQuery,
    RegionQuery,
    UserIdPath,
)
from serving.models import RecommendationsResponse
from serving.validation import K_DEFAULT

__all__ = ["router"]

router = APIRouter(prefix="/v1/users", tags=["recommendations"],
                   dependencies=ROUTE_DEPENDENCIES)


@router.get("/{user_id}/recommendations", response_model=RecommendationsResponse,
            responses=ERROR_RESPONSES, summary="Recommendations for a user")
async def get_recommendations(
    client: ClientDep,
    user_id: UserIdPath,
    k: KQuery = K_DEFAULT,
    exclude_purchased: Annotated[
        bool, Query(description="Remove items the user bought recently.")
    ] = True,
    region: RegionQuery = None,
) -> RecommendationsResponse:
    """The live model's candidates for the user, re-ranked with the user's features of
    the last seconds: categories active in the last hour are boosted, recent purchases
    removed, items trending in ``region`` mixed in. A user the model does not know
    (``known_user: false``) gets top sellers of their recent categories and region, then
    global. Each item names its ``source``."""
    return await client.recommendations(user_id, k, exclude_purchased=exclude_purchased, region=region)
