"""Dependencies injected into the routes: the client, the API-key check, typed parameters.

Parameters are declared once here as ``Annotated`` types so every route
validates ids, ``k`` and windows the same way (:mod:`serving.validation`);
FastAPI rejects bad values with a 422 before a handler runs, and the app's
handler turns that into a stable message.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Annotated, Any, Literal

from fastapi import Depends, HTTPException, Path, Query, Request, Security, status
from fastapi.exceptions import RequestValidationError
from fastapi.security import APIKeyHeader

from serving.client import AsyncServingClient
from serving.metrics import ServingMetrics
from serving.models import ErrorResponse
from serving.validation import (
    ID_PATTERN,
    ID_RULE,
    K_MAX,
    K_MIN,
    MAX_ID_LENGTH,
    OPTIONAL_ID_PATTERN,
)

__all__ = [
    "API_KEY_HEADER",
    "ClientDep",
    "MetricsDep",
    "require_api_key",
    "known_query_only",
    "ROUTE_DEPENDENCIES",
    "WindowQuery",
    "KQuery",
    "CategoryQuery",
    "RegionQuery",
    "UserIdPath",
    "ItemIdPath",
    "ERROR_RESPONSES",
    "key_digest",
]

API_KEY_HEADER = "X-API-Key"
INVALID_KEY_MESSAGE = "missing or invalid API key: send it in the X-API-Key header"

_api_key_header = APIKeyHeader(
    name=API_KEY_HEADER,
    auto_error=False,
    description="Required on every route but /healthz when the server has an API key configured.",
)


def key_digest(key: str) -> bytes:
    """SHA-256 of a key: compared in constant time, so neither content nor length leaks."""
    return hashlib.sha256(key.encode("utf-8")).digest()


async def require_api_key(
    request: Request, api_key: Annotated[str | None, Security(_api_key_header)]
) -> None:
    """401 unless the ``X-API-Key`` header matches the configured key (no key configured: open)."""
    expected: bytes | None = request.app.state.api_key_digest
    if expected is None:
        return
    if api_key is None or not hmac.compare_digest(key_digest(api_key), expected):
        raise HTTPException(
            status_code=status.HTTP_401_UNAUTHORIZED,
            detail=INVALID_KEY_MESSAGE,
            headers={"WWW-Authenticate": "APIKey"},
        )


_QUERY_NAMES = "_shopstream_query_names"
"""Attribute a route keeps its query parameters' names in (computed on its first request):
on the route itself, so it lives and dies with it (an ``id()`` may be reused once a route
of another app is gone; starlette's routes define ``__eq__``, so they cannot key a dict)."""


def _route_query(route: Any) -> tuple[str, ...]:
    """The query parameters a route takes, its dependencies' included, in signature order."""
    known: tuple[str, ...] | None = getattr(route, _QUERY_NAMES, None)
    if known is None:
        names: dict[str, None] = {}
        todo = [route.dependant]  # the route's own parameters and its dependencies'
        while todo:
            dependant = todo.pop()
            names.update((field.alias, None) for field in dependant.query_params)
            todo.extend(reversed(dependant.dependencies))
        known = tuple(names)
        setattr(route, _QUERY_NAMES, known)
    return known


async def known_query_only(request: Request) -> None:
    """422 for a query parameter the route does not take: ``?n=5`` or ``?limit=5`` for
    ``k`` was ignored, and the caller got ten items without a word. The message lists the
    parameters the route takes."""
    route = request.scope.get("route")
    if route is None or not request.query_params:
        return
    known = _route_query(route)
    unknown = [name for name in dict.fromkeys(request.query_params) if name not in known]
    if unknown:
        takes = ", ".join(known) or "none"
        raise RequestValidationError([
            {"loc": ("query", name), "type": "extra_forbidden", "input": request.query_params[name],
             "msg": f"not a parameter of this route (it takes: {takes})"}
            for name in unknown])


ROUTE_DEPENDENCIES = [Depends(require_api_key), Depends(known_query_only)]
"""What every ``/v1`` router runs before its handler: the key first, so a caller without
one learns nothing of the parameters."""


async def get_client(request: Request) -> AsyncServingClient:
    return request.app.state.client  # type: ignore[no-any-return]


async def get_metrics(request: Request) -> ServingMetrics:
    return request.app.state.metrics  # type: ignore[no-any-return]


ClientDep = Annotated[AsyncServingClient, Depends(get_client)]
MetricsDep = Annotated[ServingMetrics, Depends(get_metrics)]

WindowQuery = Annotated[
    Literal["1h", "24h"], Query(description="Sliding window the list covers.")
]
KQuery = Annotated[int, Query(ge=K_MIN, le=K_MAX, description=f"Number of items, {K_MIN}..{K_MAX}.")]
CategoryQuery = Annotated[
    str | None,
    Query(max_length=MAX_ID_LENGTH, pattern=OPTIONAL_ID_PATTERN,
          description=f"Category id ({ID_RULE}); omit for all categories."),
]
RegionQuery = Annotated[
    str | None,
    Query(max_length=MAX_ID_LENGTH, pattern=OPTIONAL_ID_PATTERN,
          description=f"Region, e.g. `United Kingdom` ({ID_RULE}); omit for all regions."),
]
UserIdPath = Annotated[
    str, Path(max_length=MAX_ID_LENGTH, pattern=ID_PATTERN, description=f"User id ({ID_RULE}).")
]
ItemIdPath = Annotated[
    str, Path(max_length=MAX_ID_LENGTH, pattern=ID_PATTERN, description=f"Item id ({ID_RULE}).")
]

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorResponse, "description": "Missing or invalid `X-API-Key` (when configured)."},
    422: {"model": ErrorResponse, "description": "A parameter is invalid; `detail` says which and why."},
    503: {"model": ErrorResponse,
          "description": "Redis did not answer within the deadline and nothing suitable is "
                         "remembered; retry after the `Retry-After` seconds."},
}
