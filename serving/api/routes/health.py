"""``/healthz`` (the process is alive, always open) and ``/readyz`` (it can serve)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Response, status

from serving.api.deps import ClientDep, require_api_key
from serving.models import ErrorResponse, HealthResponse, ReadyResponse

__all__ = ["router"]

router = APIRouter(tags=["ops"])


@router.get("/healthz", response_model=HealthResponse, summary="Liveness")
async def healthz() -> HealthResponse:
    """Always 200 while the process runs; needs no API key and touches nothing."""
    return HealthResponse()


@router.get(
    "/readyz",
    response_model=ReadyResponse,
    dependencies=[Depends(require_api_key)],
    responses={503: {"model": ReadyResponse, "description": "Not ready."},
               401: {"model": ErrorResponse, "description": "Missing or invalid API key."}},
    summary="Readiness",
)
async def readyz(client: ClientDep, response: Response) -> ReadyResponse:
    """200 when Redis answers within the deadline and a live model pointer is set, else 503."""
    ready = await client.ready()
    if ready.status != "ready":
        response.status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    return ready
