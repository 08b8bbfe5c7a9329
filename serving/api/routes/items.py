"""``GET /v1/items/{item_id}/similar``: items like this one."""

from __future__ import annotations

from fastapi import APIRouter

from serving.api.deps import ERROR_RESPONSES, ROUTE_DEPENDENCIES, ClientDep, ItemIdPath, KQuery
from serving.models import ErrorResponse, SimilarItemsResponse
from serving.validation import K_DEFAULT

__all__ = ["router"]

router = APIRouter(prefix="/v1/items", tags=["similar items"],
                   dependencies=ROUTE_DEPENDENCIES)


@router.get(
    "/{item_id}/similar",
    response_model=SimilarItemsResponse,
    responses={**ERROR_RESPONSES,
               404: {"model": ErrorResponse, "description": "The item is unknown to the store."}},
    summary="Items similar to an item",
)
async def get_similar_items(client: ClientDep, item_id: ItemIdPath, k: KQuery = K_DEFAULT) -> SimilarItemsResponse:
    """The live model's nearest items; for an item the model has no neighbours for, top
    sellers of its category then global. 404 when the store knows nothing of the item."""
    return await client.similar_items(item_id, k)
