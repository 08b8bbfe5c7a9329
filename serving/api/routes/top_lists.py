"""The two list routes, ``/v1/top-sellers`` and ``/v1/trending``, built by one factory.

They take the same parameters and return the same model; only the client method, the
path and the documentation differ.
"""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter

from serving.api.deps import (
    ERROR_RESPONSES,
    ROUTE_DEPENDENCIES,
    CategoryQuery,
    ClientDep,
    KQuery,
    RegionQuery,
    WindowQuery,
)
from serving.models import TopItemsResponse
from serving.validation import K_DEFAULT

__all__ = ["top_items_router"]


def top_items_router(kind: Literal["top_sellers", "trending"], *, prefix: str, tag: str,
                     summary: str, description: str) -> APIRouter:
    """An ``APIRouter`` with ``GET {prefix}`` answering ``client.<kind>(window, category, region, k)``."""
    router = APIRouter(prefix=prefix, tags=[tag], dependencies=ROUTE_DEPENDENCIES)

    async def endpoint(
        client: ClientDep,
        window: WindowQuery = "1h",
        category: CategoryQuery = None,
        region: RegionQuery = None,
        k: KQuery = K_DEFAULT,
    ) -> TopItemsResponse:
        method = client.top_sellers if kind == "top_sellers" else client.trending
        return await method(window, category, region, k)

    endpoint.__name__ = f"get_{kind}"  # the OpenAPI operation id
    router.add_api_route("", endpoint, methods=["GET"], response_model=TopItemsResponse,
                         responses=ERROR_RESPONSES, summary=summary, description=description)
    return router
