"""Load shedding: a bound on the requests the API works on at once.

Past ``max_in_flight`` requests in progress in this worker, a new request is
answered at once with ``503 Service Unavailable``, ``Retry-After: 1`` and a JSON
``{"detail": "overloaded"}`` body, on the same keep-alive connection, without
running the app. So under a load above what the server sustains, the requests it
can serve keep a bounded latency and the others get a fast, explicit error instead
of a queue that grows until every answer is late.

The bound defaults to twice the Redis pool size (``serving_redis_max_connections``):
requests past that would only wait for a Redis connection. Liveness and metrics
(``/healthz``, ``/metrics``) are never shed, so an overloaded server is not
mistaken for a dead one.

This is a pure ASGI middleware (no per-request objects beyond a counter), so a
refusal costs a fraction of a served request. uvicorn's own ``limit_concurrency``
(``SHOPSTREAM_API_LIMIT_CONCURRENCY``) also counts idle keep-alive connections and
closes the connection it refuses; both can be used.
"""

from __future__ import annotations

from typing import Any

__all__ = ["OverloadGuard", "EXEMPT_PATHS"]

EXEMPT_PATHS: frozenset[str] = frozenset({"/healthz", "/metrics"})

_BODY = b'{"detail":"overloaded"}'
_HEADERS = [
    (b"content-type", b"application/json"),
    (b"content-length", str(len(_BODY)).encode()),
    (b"retry-after", b"1"),
]


class OverloadGuard:
    """ASGI middleware: at most ``max_in_flight`` HTTP requests in progress at once."""

    def __init__(self, app: Any, max_in_flight: int) -> None:
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        self.app = app
        self.max_in_flight = max_in_flight
        self.in_flight = 0
        self.shed = 0
        """Requests refused since start (also exported as a metric by the app, if it likes)."""

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("path") in EXEMPT_PATHS:
            await self.app(scope, receive, send)
            return
        if self.in_flight >= self.max_in_flight:
            self.shed += 1
            await send({"type": "http.response.start", "status": 503, "headers": _HEADERS})
            await send({"type": "http.response.body", "body": _BODY})
            return
        self.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1
