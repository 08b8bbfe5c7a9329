"""The HTTP API's app factory: ``create_app(settings)``.

::

    uvicorn --factory serving.app:create_app_from_env      # or: shopstream serve

The app holds one :class:`~serving.client.AsyncServingClient` (one Redis
pool) for its lifetime, warms it at start-up (live model pointer, last known
global top sellers) and keeps that memory fresh in the background every
``serving_refresh_seconds``, so a Redis outage right after start still has
something to serve. Routes live in :mod:`serving.api.routes`, one router per
resource; errors are JSON ``{"detail": ...}`` with stable messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from pipelines.settings import Settings
from serving.api.deps import key_digest
from serving.api.fast import RecommendationsFastPath
from serving.api.routes import ROUTERS
from serving.client import AsyncServingClient
from serving.errors import InvalidParameter, ServingError
from serving.metrics import MetricsMiddleware, ServingMetrics, shared_metrics_dir
from serving.overload import OverloadGuard
from serving.validation import message_for

__all__ = ["create_app", "create_app_from_env", "error_response"]

log = logging.getLogger(__name__)

REFRESH_STOP_SECONDS = 5.0
"""How long a stopping worker waits for its refresher (uvicorn's graceful limit is 10 s)."""

DESCRIPTION = """
Top sellers, trending items, per-user recommendations and similar items for the
storefront, read from the Redis online store that the streaming job keeps seconds fresh.

* Every answer names the live `model_version`, the `freshness` of its inputs
  (as-of time and age in ms) and each item's `source`.
* `degraded: true` means Redis did not answer in time and the list comes from the last
  known top sellers kept in memory; 503 means nothing suitable was remembered.
* Send `X-API-Key` when the server has a key configured (all routes but `/healthz`).
"""

TAGS = [
    {"name": "top sellers", "description": "Best sellers per window and scope."},
    {"name": "trending", "description": "Items selling above their daily pace."},
    {"name": "recommendations", "description": "Per-user recommendations, re-ranked at request time."},
    {"name": "similar items", "description": "Items like an item."},
    {"name": "ops", "description": "Liveness, readiness and Prometheus metrics."},
]


async def _keep_warm(client: AsyncServingClient, metrics: ServingMetrics, interval_s: float,
                     stop: asyncio.Event) -> None:
    """Refresh until ``stop`` is set. The event, not only ``Task.cancel()``, ends the loop:
    a cancellation that lands inside a Redis call can be lost (seen as a worker that never
    finished its shutdown, still refreshing after SIGTERM)."""
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval_s)
        if stop.is_set():
            return
        try:
            await client.warm()
        except Exception:  # noqa: BLE001 - the refresher must outlive any one failure
            log.exception("refreshing the in-memory top sellers failed")
        metrics.publish()  # for the other workers' /metrics (no-op with one worker)


def create_app(settings: Settings) -> FastAPI:
    """Build the API for ``settings`` (Redis address, timeouts, API key, re-ranking knobs).

    With ``api_workers > 1`` the workers' ``/metrics`` answer the sum over all of them
    (:mod:`serving.metrics`).
    """
    metrics = ServingMetrics(
        share_dir=shared_metrics_dir(settings.run_path, settings.api_port)
        if settings.api_workers > 1 else None)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        client = AsyncServingClient(settings, metrics=metrics)
        app.state.client = client
        if not await client.warm():
            log.warning("online store %s not reachable at start-up; serving will retry",
                        settings.redis_url_redacted)
        # Everything loaded so far (FastAPI, redis-py, Feast's protobufs) lives as long as
        # the process: keep it out of the garbage collector's full passes, which otherwise
        # walk it and show up as latency spikes.
        gc.collect()
        gc.freeze()
        metrics.publish()
        stop = asyncio.Event()
        refresher = asyncio.create_task(
            _keep_warm(client, metrics, settings.serving_refresh_seconds, stop))
        try:
            yield
        finally:
            stop.set()
            refresher.cancel()
            # bounded: a refresh stuck in a Redis call must not hold the worker's shutdown
            await asyncio.wait({refresher}, timeout=REFRESH_STOP_SECONDS)
            await client.aclose()
            metrics.publish()  # a stopping worker's counts stay in the sum

    app = FastAPI(
        title="shopstream serving API",
        version="1",
        description=DESCRIPTION,
        openapi_tags=TAGS,
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.api_key_digest = (
        key_digest(settings.api_key.get_secret_value()) if settings.api_key is not None else None
    )
    # innermost first: the fast path sits inside the metrics middleware, so it is timed too
    app.add_middleware(RecommendationsFastPath, render_error=error_response)
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    # Outermost: past 2x the Redis pool in flight, answer 503 at once (serving/overload.py).
    app.add_middleware(OverloadGuard, max_in_flight=2 * settings.serving_redis_max_connections)
    app.add_exception_handler(RequestValidationError, _validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(ServingError, _serving_error)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, _internal_error)
    for router in ROUTERS:
        app.include_router(router)
    return app


def create_app_from_env() -> FastAPI:
    """Factory for ``uvicorn --factory`` and multi-worker runs: settings from the environment."""
    return create_app(Settings())


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    errors = []
    for err in exc.errors():
        loc = err.get("loc") or ()
        param = str(loc[-1]) if loc else "request"
        errors.append({"param": param, "message": message_for(param) or f"{param}: {err.get('msg')}"})
    detail = "; ".join(dict.fromkeys(e["message"] for e in errors)) or "invalid request"
    return JSONResponse(status_code=status.HTTP_422_UNPROCESSABLE_CONTENT,
                        content={"detail": detail, "errors": errors})


def error_response(exc: ServingError) -> JSONResponse:
    """The JSON answer to a :class:`~serving.errors.ServingError` (422, 404, 503 + Retry-After)."""
    headers = {"Retry-After": "1"} if exc.status_code == status.HTTP_503_SERVICE_UNAVAILABLE else None
    content: dict[str, object] = {"detail": exc.message}
    if isinstance(exc, InvalidParameter):
        content["errors"] = [{"param": exc.param, "message": exc.message}]
    return JSONResponse(status_code=exc.status_code, content=content, headers=headers)


async def _serving_error(request: Request, exc: ServingError) -> JSONResponse:
    return error_response(exc)


async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return JSONResponse(status_code=status.HTTP_500_INTERNAL_SERVER_ERROR,
                        content={"detail": "internal error"})
