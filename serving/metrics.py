"""Prometheus metrics of the serving layer, and the ASGI middleware that times requests.

Each app (and each test) owns a :class:`ServingMetrics`: plain in-process
numbers exposed through a custom collector in a ``CollectorRegistry`` of its
own. So two apps in one process never collide, recording costs a dict lookup,
and nothing depends on prometheus_client's process-wide value storage (which
Feast switches to multiprocess files by exporting ``PROMETHEUS_MULTIPROC_DIR``
as soon as ``feast.metrics`` is imported).

Several workers
---------------
With ``api_workers > 1`` the workers share one port, so a scrape reaches one of
them at random. Each worker then publishes its numbers to a folder of its own
server (``<run_dir>/api/metrics-<port>/<pid>.json``, written atomically every
``serving_refresh_seconds`` and at shutdown), and ``/metrics`` answers the sum
over every worker of this server: the answering worker's live numbers plus the
others' last published ones (at most ``serving_refresh_seconds`` old). Counters
and histograms of a worker that exited keep counting (they are cumulative, as in
prometheus_client's multiprocess mode); ``redis_up`` is the minimum over the
live workers, and ``shopstream_api_workers`` says how many reported.
``shopstream serve`` empties the folder before starting the workers.

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
``shopstream_api_workers``
    Workers whose numbers the answer includes (1 with a single worker).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from bisect import bisect_left
from collections.abc import Iterator
from pathlib import Path
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

from pipelines.infra.process import pid_alive

__all__ = ["ServingMetrics", "MetricsMiddleware", "CONTENT_TYPE_LATEST", "LATENCY_BUCKETS",
           "shared_metrics_dir"]

log = logging.getLogger(__name__)

LATENCY_BUCKETS = (
    0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
)
"""Seconds; fine-grained below 5 ms, where the API's targets are."""


def shared_metrics_dir(run_path: Path, port: int) -> Path:
    """The folder where the workers of the server on ``port`` publish their numbers."""
    return run_path / "api" / f"metrics-{port}"


class ServingMetrics(Collector):
    """The serving metrics: recorded in process, exposed in Prometheus' text format.

    Parameters
    ----------
    share_dir
        With several workers: the folder they publish to (:func:`shared_metrics_dir`);
        ``None`` (one worker): this process's numbers only.
    """

    def __init__(self, share_dir: Path | None = None) -> None:
        self.share_dir = share_dir
        self._pid = os.getpid()
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

    # --- sharing between workers ------------------------------------------
    def state(self) -> dict[str, Any]:
        """This process's numbers as JSON-able data (what :meth:`publish` writes)."""
        with self._lock:
            return {
                "pid": self._pid,
                "latency": [[*k, [*v[0]], v[1]] for k, v in self._latency.items()],
                "errors": [[*k, v] for k, v in self._errors.items()],
                "fallbacks": [[k, v] for k, v in self._fallbacks.items()],
                "redis_errors": [[k, v] for k, v in self._redis_errors.items()],
                "redis_up": self._redis_up,
            }

    def publish(self) -> None:
        """Write :meth:`state` to ``share_dir/<pid>.json`` atomically (no-op without a dir)."""
        if self.share_dir is None:
            return
        try:
            self.share_dir.mkdir(parents=True, exist_ok=True)
            tmp = self.share_dir / f".{self._pid}.json.tmp"
            tmp.write_text(json.dumps(self.state()))
            os.replace(tmp, self.share_dir / f"{self._pid}.json")
        except OSError as exc:  # metrics must never break serving
            log.warning("could not publish this worker's metrics to %s: %s", self.share_dir, exc)

    def _states(self) -> list[dict[str, Any]]:
        """This process's live state, then every other worker's last published one."""
        states = [self.state()]
        if self.share_dir is None:
            return states
        self.publish()
        for path in sorted(self.share_dir.glob("*.json")):
            if path.stem == str(self._pid):
                continue
            try:
                states.append(json.loads(path.read_text()))
            except (OSError, ValueError):
                continue  # being replaced right now, or unreadable: skip this scrape
        return states

    # --- exposition --------------------------------------------------------
    def collect(self) -> Iterator[Metric]:
        latency: dict[tuple[str, str, str], tuple[list[int], float]] = {}
        errors: dict[tuple[str, str], float] = {}
        fallbacks: dict[str, float] = {}
        redis_errors: dict[str, float] = {}
        redis_up: list[float] = []
        states = self._states()
        for state in states:
            for route, method, code, counts, total in state["latency"]:
                key = (route, method, code)
                old_counts, old_total = latency.get(key, ([0] * len(counts), 0.0))
                latency[key] = ([a + b for a, b in zip(old_counts, counts, strict=True)],
                                old_total + total)
            for route, code, value in state["errors"]:
                errors[(route, code)] = errors.get((route, code), 0.0) + value
            for name, value in state["fallbacks"]:
                fallbacks[name] = fallbacks.get(name, 0.0) + value
            for name, value in state["redis_errors"]:
                redis_errors[name] = redis_errors.get(name, 0.0) + value
            if state["pid"] == self._pid or pid_alive(int(state["pid"])):
                redis_up.append(float(state["redis_up"]))
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
                                "1 after a successful Redis round trip, 0 after a failed one "
                                "(the minimum over live workers).",
                                value=min(redis_up, default=self._redis_up))
        yield GaugeMetricFamily("shopstream_api_workers",
                                "Workers whose numbers this answer includes.",
                                value=len(redis_up))

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
