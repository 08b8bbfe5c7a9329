"""Prometheus metrics of the serving layer, and the ASGI middleware that times requests.

Each app (and each test) owns a :class:`ServingMetrics`: plain in-process
numbers exposed through a custom collector in a ``CollectorRegistry`` of its
own. So two apps in one process never collide, recording costs a dict lookup,
and nothing depends on prometheus_client's process-wide value storage (which
Feast switches to multiprocess files by exporting ``PROMETHEUS_MULTIPROC_DIR``
as soon as ``feast.metrics`` is imported). With ``api_workers > 1`` every
uvicorn worker exposes its own numbers; scrape each worker or run one worker
per container (the usual Kubernetes setup).

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

import threading
import time
from bisect import bisect_left
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

__all__ = ["ServingMetrics", "MetricsMiddleware", "CONTENT_TYPE_LATEST", "LATENCY_BUCKETS"]

LATENCY_BUCKETS = (
    0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
)
"""Seconds; fine-grained below 5 ms, where the API's targets are."""


class ServingMetrics(Collector):
    """The serving metrics: recorded in process, exposed in Prometheus' text format."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # (route, method, status) -> [per-bucket counts (last: +Inf), sum of seconds]
        self._latency: dict[tuple[str, str, str], list[Any]] = {}
        self._errors: dict[tuple[str, str], float] = {}
        self._fallbacks: dict[str, float] = {}
        self._redis_errors: dict[str, float] = {}
        self._redis_up = 1.0
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    # --- recording ---------------------------------------------------------
    def observe(self, route: str, method: str, status: int, seconds: float) -> None:
        """One HTTP request's latency (by route template, never the raw path)."""
        code = str(status)
        bucket = bisect_left(LATENCY_BUCKETS, seconds)
        with self._lock:
            series = self._latency.get((route, method, code))
            if series is None:
                series = self._latency[(route, method, code)] = [[0] * (len(LATENCY_BUCKETS) + 1), 0.0]
            series[0][bucket] += 1
            series[1] += seconds
            if status >= 500:
                self._errors[(route, code)] = self._errors.get((route, code), 0.0) + 1

    def fallback(self, reason: str) -> None:
        with self._lock:
            self._fallbacks[reason] = self._fallbacks.get(reason, 0.0) + 1

    def redis_error(self, kind: str) -> None:
        with self._lock:
            self._redis_errors[kind] = self._redis_errors.get(kind, 0.0) + 1

    def set_redis_up(self, up: bool) -> None:
        self._redis_up = 1.0 if up else 0.0

    # --- exposition --------------------------------------------------------
    def collect(self) -> Iterator[Metric]:
        with self._lock:
            latency = {k: ([*v[0]], v[1]) for k, v in self._latency.items()}
            errors = dict(self._errors)
            fallbacks = dict(self._fallbacks)
            redis_errors = dict(self._redis_errors)
        histogram = HistogramMetricFamily(
            "shopstream_api_request_duration_seconds",
            "API request latency by route template, method and status.",
            labels=["route", "method", "status"],
        )
        for labels, (counts, total) in sorted(latency.items()):
            cumulative, running = [], 0
            for le, n in zip((*map(str, LATENCY_BUCKETS), "+Inf"), counts, strict=True):
                running += n
                cumulative.append((le, running))
            histogram.add_metric(list(labels), cumulative, total)
        yield histogram
        yield _counter("shopstream_api_errors", "API responses with a 5xx status.",
                       ["route", "status"], {k: v for k, v in errors.items()})
        yield _counter("shopstream_serving_fallbacks", "Answers that used a fallback, by reason.",
                       ["reason"], {(k,): v for k, v in fallbacks.items()})
        yield _counter("shopstream_serving_redis_errors", "Failed Redis round trips, by kind.",
                       ["kind"], {(k,): v for k, v in redis_errors.items()})
        yield GaugeMetricFamily("shopstream_serving_redis_up",
                                "1 after a successful Redis round trip, 0 after a failed one.",
                                value=self._redis_up)

    def render(self) -> bytes:
        """The text exposition format."""
        return generate_latest(self.registry)


def _counter(name: str, doc: str, labels: list[str], values: dict[tuple[str, ...], float]) -> Metric:
    family = CounterMetricFamily(name, doc, labels=labels)
    for key, value in sorted(values.items()):
        family.add_metric(list(key), value)
    return family


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
