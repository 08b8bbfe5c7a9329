"""``GET /metrics``: Prometheus text exposition of :class:`serving.metrics.ServingMetrics`."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Response

from serving.api.deps import MetricsDep, require_api_key
from serving.metrics import CONTENT_TYPE_LATEST

__all__ = ["router"]

router = APIRouter(tags=["ops"], dependencies=[Depends(require_api_key)])


@router.get("/metrics", response_class=Response, summary="Prometheus metrics",
            responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}})
async def metrics(metrics: MetricsDep) -> Response:
    """Latency histogram per route, fallbacks, Redis errors, 5xx counts."""
    return Response(content=metrics.render(), media_type=CONTENT_TYPE_LATEST)
