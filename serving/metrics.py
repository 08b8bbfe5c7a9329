"""Prometheus metrics of the serving layer, and the ASGI middleware that times requests.

Each app (and each test) owns a :class:`ServingMetrics` with its own
``CollectorRegistry``, so two apps in one process never collide. With
``api_workers > 1`` every uvicorn worker exposes its own numbers; scrape each
worker or run one worker per container (the usual Kubernetes setup).

Series
------
``shopstream_api_request_duration_seconds{route,method,status}``
    Histogram of the time from request to response start, by route *template*
    (``/v1/users/{user_id}/recommendations``, never the raw path, so user ids
    do not become labels).
``shopstream_api_errors_total{route,status}``
    Responses with status >= 500.
``shopstream_serving_fallbacks_total{reason}``
    ``cold_start`` (user unknown to the model), ``degraded`` (answered from
    memory), ``unknown_item``, ``similar_top_sellers``.
``shopstream_serving_redis_errors_total{kind}``
    ``timeout``, ``connection``, ``response``.
``shopstream_serving_redis_up``
    1 after a successful Redis round trip, 0 after a failed one.
"""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

__all__ = ["ServingMetrics", "MetricsMiddleware", "CONTENT_TYPE_LATEST"]

LATENCY_BUCKETS = (
    0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
)
"""Seconds; fine-grained below 5 ms, where the API's targets are."""


class ServingMetrics:
    """The serving metrics, registered in a registry of their own."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self.latency = Histogram(
            "shopstream_api_request_duration_seconds",
            "API request latency by route template, method and status.",
            ["route", "method", "status"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.errors = Counter(
            "shopstream_api_errors",
            "API responses with a 5xx status.",
            ["route", "status"],
            registry=self.registry,
        )
        self.fallbacks = Counter(
            "shopstream_serving_fallbacks",
            "Answers that used a fallback, by reason.",
            ["reason"],
            registry=self.registry,
        )
        self.redis_errors = Counter(
            "shopstream_serving_redis_errors",
            "Failed Redis round trips, by kind.",
            ["kind"],
            registry=self.registry,
        )
        self.redis_up = Gauge(
            "shopstream_serving_redis_up",
            "1 after a successful Redis round trip, 0 after a failed one.",
            registry=self.registry,
        )
        self.redis_up.set(1)

    def observe(self, route: str, method: str, status: int, seconds: float) -> None:
        code = str(status)
        self.latency.labels(route, method, code).observe(seconds)
        if status >= 500:
            self.errors.labels(route, code).inc()

    def render(self) -> bytes:
        """The text exposition format."""
        return generate_latest(self.registry)


class MetricsMiddleware:
    """Pure ASGI middleware (no ``BaseHTTPMiddleware`` overhead) timing each HTTP request."""

    def __init__(self, app: Any, metrics: ServingMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        recorded = False

        async def send_and_time(message: dict[str, Any]) -> None:
            nonlocal recorded
            if message["type"] == "http.response.start" and not recorded:
                recorded = True
                self._record(scope, message["status"], start)
            await send(message)

        try:
            await self.app(scope, receive, send_and_time)
        except BaseException:
            if not recorded:
                self._record(scope, 500, start)
            raise

    def _record(self, scope: dict[str, Any], status: int, start: float) -> None:
        route = scope.get("route")
        template = getattr(route, "path", None) or "unmatched"
        self.metrics.observe(template, scope.get("method", "GET"), status, time.perf_counter() - start)
