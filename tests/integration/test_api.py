"""The HTTP API (FastAPI TestClient, real redis-server): answers, bad input, API key, ops routes."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from features import online_keys
from pipelines.settings import Settings
from serving.app import create_app
from tests.integration.test_serving_data import (
    COLD_USER,
    KNOWN_ITEM_WITHOUT_NEIGHBOURS,
    KNOWN_USER,
    NEW_USER,
    TOLERANT_TIMEOUTS,
    UK,
    UNKNOWN_ITEM,
    SeededStore,
    seed_store,
)

pytestmark = pytest.mark.integration


@pytest.fixture()
def serving_settings(make_settings: Any) -> Settings:
    """The session's servers with :data:`TOLERANT_TIMEOUTS`."""
    return make_settings(**TOLERANT_TIMEOUTS)

API_KEY = "test-key-3f9a1c"


@pytest.fixture()
def seeded(serving_settings: Settings, redis_client: Any) -> SeededStore:
    return seed_store(redis_client, serving_settings)


@pytest.fixture()
def http(serving_settings: Settings, seeded: SeededStore) -> Iterator[TestClient]:
    with TestClient(create_app(serving_settings)) as client:
        yield client


@pytest.fixture()
def keyed_http(make_settings: Any, seeded: SeededStore) -> Iterator[TestClient]:
    with TestClient(create_app(make_settings(api_key=API_KEY, **TOLERANT_TIMEOUTS))) as client:
        yield client


def _ids(body: dict[str, Any]) -> list[str]:
    return [i["item_id"] for i in body["items"]]


def test_get_top_sellers_global_by_default(http: TestClient, seeded: SeededStore) -> None:
    response = http.get("/v1/top-sellers", params={"k": 3})
    assert response.status_code == 200
    body = response.json()
    assert _ids(body) == ["85123A", "22423", "85099B"]
    assert body["window"] == "1h" and body["scope"] == "global" and body["degraded"] is False
    assert body["model_version"] == "v1"
    assert {i["source"] for i in body["items"]} == {"top_sellers_global"}
    fresh = body["freshness"]["top_sellers"]
    assert fresh["as_of"].startswith(seeded.as_of.strftime("%Y-%m-%dT%H:%M:%S"))
    assert isinstance(fresh["age_ms"], int) and fresh["age_ms"] >= 0


def test_get_top_sellers_by_category_and_region(http: TestClient) -> None:
    body = http.get("/v1/top-sellers", params={"window": "24h", "category": "BAGS", "region": UK}).json()
    assert _ids(body) == ["20725", "85099B"]
    assert body["scope"] == "category_region" and body["category"] == "BAGS" and body["region"] == UK
    assert {i["source"] for i in body["items"]} == {"top_sellers_category_region"}


def test_get_top_sellers_empty_parameters_mean_global(http: TestClient) -> None:
    body = http.get("/v1/top-sellers?category=&region=&k=2").json()
    assert body["scope"] == "global" and _ids(body) == ["85123A", "22423"]


def test_get_trending_by_region(http: TestClient) -> None:
    body = http.get("/v1/trending", params={"region": UK, "k": 2}).json()
    assert _ids(body) == ["47566", "85099B"] and body["kind"] == "trending"
    assert {i["source"] for i in body["items"]} == {"trending"}


def test_get_recommendations_for_a_known_user(http: TestClient) -> None:
    response = http.get(f"/v1/users/{KNOWN_USER}/recommendations", params={"k": 8, "region": UK})
    assert response.status_code == 200
    body = response.json()
    assert body["user_id"] == KNOWN_USER and body["known_user"] is True
    assert body["model_version"] == "v1" and body["degraded"] is False
    assert len(body["items"]) == 8 and len(set(_ids(body))) == 8
    assert body["items"][0]["source"] == "model"
    assert {i["source"] for i in body["items"]} == {"model", "trending"}
    assert body["freshness"]["user_activity"]["age_ms"] >= 0
    assert "trending" in body["freshness"]


def test_get_recommendations_for_a_cold_start_user(http: TestClient) -> None:
    body = http.get(f"/v1/users/{COLD_USER}/recommendations", params={"region": UK, "k": 5}).json()
    assert body["known_user"] is False
    assert body["items"][0] == {"item_id": "20725", "score": 20.0, "source": "top_sellers_category_region"}


def test_get_recommendations_for_a_user_nobody_knows(http: TestClient) -> None:
    body = http.get(f"/v1/users/{NEW_USER}/recommendations?k=3").json()
    assert body["known_user"] is False and len(body["items"]) == 3
    assert body["items"][0]["source"] == "top_sellers_global"


def test_get_recommendations_with_a_space_in_the_user_id(http: TestClient) -> None:
    # "United Kingdom"-style ids are valid; such a user is simply unknown here.
    response = http.get("/v1/users/United%20Kingdom/recommendations")
    assert response.status_code == 200 and response.json()["user_id"] == "United Kingdom"


def _without_ages(body: dict[str, Any]) -> dict[str, Any]:
    return dict(body, freshness={k: v["as_of"] for k, v in body["freshness"].items()})


@pytest.mark.parametrize("query", [
    {"k": "5", "region": UK},                                   # answered by the fast path
    {"k": "5", "region": UK, "exclude_purchased": "yes"},       # a spelling only FastAPI reads
    {"k": "+5", "region": UK},                                  # idem
])
def test_recommendations_fast_path_and_fastapi_give_the_same_answer(
    http: TestClient, query: dict[str, str]
) -> None:
    # the fast path (serving/api/fast.py) answers plain requests and hands the rest to FastAPI
    plain = http.get(f"/v1/users/{KNOWN_USER}/recommendations", params={"k": "5", "region": UK})
    other = http.get(f"/v1/users/{KNOWN_USER}/recommendations", params=query)
    assert plain.status_code == other.status_code == 200
    assert plain.headers["content-type"] == other.headers["content-type"] == "application/json"
    assert _without_ages(plain.json()) == _without_ages(other.json())
    assert list(plain.json()) == list(other.json())  # same fields, same order


def test_recommendations_edge_parameters_keep_fastapis_rules(http: TestClient) -> None:
    base = f"/v1/users/{KNOWN_USER}/recommendations"
    assert http.get(base + "?k=100").status_code == 200
    assert http.get(base + "?region=").json()["user_id"] == KNOWN_USER  # empty: not given
    assert len(http.get(base + "?k=2&k=3").json()["items"]) == 3  # repeated: the last wins
    assert http.get(base + "?exclude_purchased=FALSE").status_code == 200
    for bad, param in (("k=101", "k"), ("k=1.5", "k"), ("exclude_purchased=maybe", "exclude_purchased"),
                       ("region=%2F", "region")):
        response = http.get(f"{base}?{bad}")
        assert response.status_code == 422, bad
        assert response.json()["errors"][0]["param"] == param
    assert http.get("/v1/users/a%2Fb/recommendations").status_code in (404, 422)
    assert http.post(base).status_code == 405


def test_get_similar_items(http: TestClient) -> None:
    body = http.get("/v1/items/85123A/similar", params={"k": 2}).json()
    assert _ids(body) == ["71053", "21730"] and body["model_version"] == "v1"
    fallback = http.get(f"/v1/items/{KNOWN_ITEM_WITHOUT_NEIGHBOURS}/similar").json()
    assert fallback["items"][0]["source"] == "top_sellers_category"


def test_get_similar_items_of_an_unknown_item_is_404(http: TestClient) -> None:
    response = http.get(f"/v1/items/{UNKNOWN_ITEM}/similar")
    assert response.status_code == 404
    assert response.json() == {
        "detail": "unknown item: the online store has no similar items and no metadata for it"
    }


@pytest.mark.parametrize(
    ("url", "param", "message"),
    [
        ("/v1/top-sellers?k=0", "k", "k must be an integer from 1 to 100"),
        ("/v1/top-sellers?k=101", "k", "k must be an integer from 1 to 100"),
        ("/v1/top-sellers?k=ten", "k", "k must be an integer from 1 to 100"),
        ("/v1/trending?window=7d", "window", "window must be one of 1h, 24h"),
        ("/v1/trending?window=24h", "window", "trending is computed for window 1h only"),
        ("/v1/top-sellers?category=a%2Fb", "category", "category must be 1-64 characters"),
        ("/v1/top-sellers?region=" + "x" * 65, "region", "region must be 1-64 characters"),
        ("/v1/users/" + "u" * 65 + "/recommendations", "user_id", "user_id must be 1-64 characters"),
        ("/v1/users/%20u1/recommendations", "user_id", "user_id must be 1-64 characters"),
        ("/v1/users/u%2A/recommendations", "user_id", "user_id must be 1-64 characters"),
        ("/v1/users/u1/recommendations?exclude_purchased=maybe", "exclude_purchased",
         "exclude_purchased must be true or false"),
        ("/v1/items/a%3Bb/similar?k=-1", "k", "k must be an integer from 1 to 100"),
    ],
)
def test_bad_parameters_are_422_with_a_message(http: TestClient, url: str, param: str, message: str) -> None:
    response = http.get(url)
    assert response.status_code == 422
    body = response.json()
    assert message in body["detail"]
    assert param in {e["param"] for e in body["errors"]}


@pytest.mark.parametrize(("url", "unknown", "takes"), [
    ("/v1/top-sellers?n=5", ["n"], "window, category, region, k"),
    ("/v1/trending?limit=5&k=2", ["limit"], "window, category, region, k"),
    (f"/v1/users/{KNOWN_USER}/recommendations?k=5&top_n=3&n=3", ["top_n", "n"],
     "k, exclude_purchased, region"),  # not answered by the fast path: FastAPI says no
    ("/v1/items/85123A/similar?count=2", ["count"], "k"),
])
def test_an_unknown_query_parameter_is_422_naming_it_and_what_the_route_takes(
        http: TestClient, url: str, unknown: list[str], takes: str) -> None:
    """Ignored, ``?n=5`` answered ten items without a word."""
    response = http.get(url)
    assert response.status_code == 422, response.text
    body = response.json()
    assert [e["param"] for e in body["errors"]] == unknown
    for name in unknown:
        assert f"{name}: not a parameter of this route (it takes: {takes})" in body["detail"]


def test_an_unknown_query_parameter_without_the_api_key_is_401(keyed_http: TestClient) -> None:
    assert keyed_http.get("/v1/top-sellers?n=5").status_code == 401
    keyed = keyed_http.get("/v1/top-sellers?n=5", headers={"X-API-Key": API_KEY})
    assert keyed.status_code == 422 and keyed.json()["errors"][0]["param"] == "n"


def test_missing_or_wrong_api_key_is_401(keyed_http: TestClient) -> None:
    for headers in ({}, {"X-API-Key": "wrong"}, {"X-API-Key": API_KEY + "x"}, {"X-API-Key": ""}):
        for url in ("/v1/top-sellers", f"/v1/users/{KNOWN_USER}/recommendations",
                    "/v1/items/85123A/similar", "/v1/trending", "/readyz", "/metrics"):
            response = keyed_http.get(url, headers=headers)
            assert response.status_code == 401, (url, headers)
            assert response.json() == {"detail": "missing or invalid API key: send it in the X-API-Key header"}


def test_right_api_key_is_accepted_and_healthz_stays_open(keyed_http: TestClient) -> None:
    ok = keyed_http.get("/v1/top-sellers", headers={"X-API-Key": API_KEY})
    assert ok.status_code == 200 and ok.json()["items"]
    assert keyed_http.get("/healthz").json() == {"status": "ok"}
    assert keyed_http.get("/readyz", headers={"X-API-Key": API_KEY}).status_code == 200


def test_api_keys_never_reach_the_logs(keyed_http: TestClient, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    keyed_http.get("/v1/top-sellers", headers={"X-API-Key": "guess-" + API_KEY})
    keyed_http.get("/v1/top-sellers", headers={"X-API-Key": API_KEY})
    assert API_KEY not in caplog.text


def test_healthz_and_readyz(http: TestClient, redis_client: Any) -> None:
    assert http.get("/healthz").json() == {"status": "ok"}
    ready = http.get("/readyz")
    assert ready.status_code == 200
    assert ready.json() == {"status": "ready", "redis": True, "model_version": "v1", "detail": None}
    redis_client.delete(online_keys.live_model_key())
    not_ready = http.get("/readyz")
    assert not_ready.status_code == 503
    assert not_ready.json()["detail"] == "no live model: the live model pointer is not set"


def _sample(text: str, series: str) -> float:
    """The value of one series in Prometheus text (0 when absent)."""
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_metrics_have_latency_per_route_and_fallbacks(http: TestClient) -> None:
    route = "/v1/users/{user_id}/recommendations"
    count = f'shopstream_api_request_duration_seconds_count{{method="GET",route="{route}",status="200"}}'
    cold = 'shopstream_serving_fallbacks_total{reason="cold_start"}'
    http.get(f"/v1/users/{NEW_USER}/recommendations")
    http.get(f"/v1/users/{KNOWN_USER}/recommendations")
    http.get("/v1/top-sellers?k=0")
    http.get("/no/such/route")
    text = http.get("/metrics").text
    # Exact per app, even after Feast exported PROMETHEUS_MULTIPROC_DIR in this process
    # (the Feast equivalence test imports feast.metrics).
    assert _sample(text, count) == 2
    assert _sample(text, cold) == 1
    assert 'route="/v1/top-sellers",status="422"' in text
    assert 'route="unmatched",status="404"' in text
    assert 'le="0.001",method="GET",route="/v1/users/{user_id}/recommendations"' in text
    assert "shopstream_serving_redis_up 1.0" in text
    assert NEW_USER not in text and KNOWN_USER not in text  # ids never become labels


def test_openapi_documents_every_route(http: TestClient) -> None:
    spec = http.get("/openapi.json").json()
    assert set(spec["paths"]) >= {
        "/v1/top-sellers", "/v1/trending", "/v1/users/{user_id}/recommendations",
        "/v1/items/{item_id}/similar", "/healthz", "/readyz", "/metrics",
    }
    recs = spec["paths"]["/v1/users/{user_id}/recommendations"]["get"]
    assert {"401", "422", "503"} <= set(recs["responses"])
    k = next(p for p in recs["parameters"] if p["name"] == "k")
    assert k["schema"]["minimum"] == 1 and k["schema"]["maximum"] == 100
    assert "APIKeyHeader" in spec["components"]["securitySchemes"]
    assert http.get("/docs").status_code == 200
