"""Which recommendation requests the fast path answers itself (the rest go to FastAPI)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from serving.api.deps import key_digest
from serving.api.fast import RecommendationsFastPath


def _scope(path: str, query: bytes = b"", headers: list[tuple[bytes, bytes]] | None = None,
           key: str | None = None, root_path: str = "") -> dict[str, Any]:
    state = SimpleNamespace(api_key_digest=key_digest(key) if key else None)
    return {"type": "http", "method": "GET", "path": path, "query_string": query,
            "headers": headers or [], "root_path": root_path, "app": SimpleNamespace(state=state)}


def _plain(scope: dict[str, Any]) -> Any:
    return RecommendationsFastPath._plain_request(scope, scope["path"])


@pytest.mark.parametrize(("query", "expected"), [
    (b"", ("u123", 10, True, None)),
    (b"k=5&region=United%20Kingdom", ("u123", 5, True, "United Kingdom")),
    (b"k=5&region=United+Kingdom&exclude_purchased=false", ("u123", 5, False, "United Kingdom")),
    (b"region=", ("u123", 10, True, None)),
])
def test_plain_requests_are_answered_here(query: bytes, expected: tuple) -> None:
    assert _plain(_scope("/v1/users/u123/recommendations", query)) == expected


@pytest.mark.parametrize("query", [b"k=0", b"k=101", b"k=+5", b"k=1.5", b"k=%EF%BC%95",
                                   b"exclude_purchased=yes", b"region=%2F", b"k=2&k=3",
                                   b"region=&other=x", b"n=5"])  # unknown: FastAPI's 422
def test_anything_doubtful_goes_to_fastapi(query: bytes) -> None:
    assert _plain(_scope("/v1/users/u123/recommendations", query)) is None


def test_bad_ids_prefixes_and_keys_go_to_fastapi() -> None:
    assert _plain(_scope("/v1/users/a/b/recommendations")) is None
    assert _plain(_scope("/v1/users/ bad/recommendations")) is None
    assert _plain(_scope("/v1/users/u1/recommendations", root_path="/api")) is None
    keyed = "/v1/users/u1/recommendations"
    assert _plain(_scope(keyed, key="s3cret")) is None
    assert _plain(_scope(keyed, headers=[(b"x-api-key", b"wrong")], key="s3cret")) is None
    assert _plain(_scope(keyed, headers=[(b"x-api-key", b"s3cret")], key="s3cret")) == (
        "u1", 10, True, None)
