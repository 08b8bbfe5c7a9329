"""A fast path for the hottest route, in front of FastAPI: ``GET /v1/users/{id}/recommendations``.

FastAPI's per-request machinery (dependency solving, parameter models, response
validation) costs about as much CPU as the recommendation itself (one Redis round
trip and the re-ranking). This ASGI layer answers the *plain* requests of that route
directly -- the same client call, the same response model serialized by pydantic --
and hands every other request to FastAPI unchanged: other routes, and any request of
this route it does not accept outright (a parameter FastAPI might read differently, a
bad value, a missing or wrong API key, a repeated or unknown parameter). So FastAPI stays the
single source of the route's contract (OpenAPI docs, 401/422 answers and their
messages); the fast path only ever answers what FastAPI would answer with a 200, and
errors raised by the client (503) are rendered by the app's own error function.

``tests/integration/test_api.py`` checks that both paths give the same answers.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qsl

from serving.api.deps import API_KEY_HEADER, key_digest
from serving.errors import ServingError
from serving.validation import ID_PATTERN, K_DEFAULT, K_MAX, K_MIN, OPTIONAL_ID_PATTERN

__all__ = ["RecommendationsFastPath", "ROUTE_TEMPLATE"]

ROUTE_TEMPLATE = "/v1/users/{user_id}/recommendations"
_PREFIX, _SUFFIX = "/v1/users/", "/recommendations"
_ID = re.compile(ID_PATTERN)
_OPTIONAL_ID = re.compile(OPTIONAL_ID_PATTERN)
_BOOLS = {"true": True, "false": False, "1": True, "0": False}
_KNOWN = frozenset({"k", "exclude_purchased", "region"})
_API_KEY = API_KEY_HEADER.lower().encode("latin-1")
_JSON_HEADERS = [(b"content-type", b"application/json")]

ASGIApp = Callable[[dict[str, Any], Any, Any], Awaitable[None]]
ErrorRenderer = Callable[[ServingError], Any]


class _Route:
    """What :class:`serving.metrics.MetricsMiddleware` reads from ``scope["route"]``."""

    path = ROUTE_TEMPLATE


_ROUTE = _Route()


class RecommendationsFastPath:
    """Pure ASGI middleware: plain recommendation requests answered here, the rest by ``app``.

    Parameters
    ----------
    app
        The FastAPI app's inner ASGI stack.
    render_error
        Turns a :class:`~serving.errors.ServingError` raised by the client into the
        app's JSON error response (the app's own exception handler function).
    """

    def __init__(self, app: ASGIApp, render_error: ErrorRenderer) -> None:
        self.app = app
        self.render_error = render_error

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "GET":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        if not (path.startswith(_PREFIX) and path.endswith(_SUFFIX)):
            await self.app(scope, receive, send)
            return
        args = self._plain_request(scope, path)
        if args is None:
            await self.app(scope, receive, send)  # FastAPI decides (and words any error)
            return
        scope["route"] = _ROUTE
        client = scope["app"].state.client
        user_id, k, exclude_purchased, region = args
        try:
            answer = await client.recommendations(user_id, k, exclude_purchased=exclude_purchased,
                                                  region=region)
        except ServingError as exc:
            response = self.render_error(exc)
            await response(scope, receive, send)
            return
        body = answer.__pydantic_serializer__.to_json(answer)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [*_JSON_HEADERS, (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    @staticmethod
    def _plain_request(scope: dict[str, Any], path: str) -> tuple[str, int, bool, str | None] | None:
        """``(user_id, k, exclude_purchased, region)`` when FastAPI would surely accept the
        request as given, else ``None``."""
        if scope.get("root_path"):
            return None  # mounted under a prefix: leave path handling to Starlette
        user_id = path[len(_PREFIX):-len(_SUFFIX)]
        if not _ID.fullmatch(user_id):
            return None
        expected = scope["app"].state.api_key_digest
        if expected is not None:
            given = next((v for n, v in scope["headers"] if n == _API_KEY), None)
            if given is None or not hmac.compare_digest(
                    key_digest(given.decode("latin-1")), expected):
                return None
        k, exclude_purchased, region = K_DEFAULT, True, None
        query: bytes = scope["query_string"]
        if query:
            seen: set[str] = set()
            for name, value in parse_qsl(query.decode("latin-1"), keep_blank_values=True):
                if name not in _KNOWN or name in seen:
                    return None  # unknown (FastAPI says 422) or repeated: FastAPI's own rules
                seen.add(name)
                if name == "k":
                    if not (value.isascii() and value.isdigit()) or not K_MIN <= int(value) <= K_MAX:
                        return None
                    k = int(value)
                elif name == "exclude_purchased":
                    flag = _BOOLS.get(value.lower())
                    if flag is None:
                        return None
                    exclude_purchased = flag
                elif name == "region":
                    if not _OPTIONAL_ID.fullmatch(value):
                        return None
                    region = value or None
        return user_id, k, exclude_purchased, region
