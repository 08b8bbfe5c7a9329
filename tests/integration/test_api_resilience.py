"""Redis stopped or hung: the API keeps answering (degraded, or 503) without hanging, and
recovers by itself. Each test runs its own redis-server so stopping it harms nobody.

Bounds: every answer while Redis is down must come within ``ANSWER_BOUND_S`` (the
serving deadline is 500 ms and the socket timeout 250 ms here; the bound is generous for
a shared 2-core machine, and far below a hang); recovery must happen within
``RECOVERY_BOUND_S`` of Redis coming back (breaker cool-down 200 ms here).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from pipelines.connections import redis_client
from pipelines.infra import RedisServer
from pipelines.settings import Settings
from serving.app import create_app
from serving.client import ServingClient
from tests.conftest import free_port
from tests.integration.test_serving_data import DE, KNOWN_USER, seed_store

pytestmark = pytest.mark.integration

ANSWER_BOUND_S = 2.0
RECOVERY_BOUND_S = 10.0


@pytest.fixture()
def own_redis(make_settings: Callable[..., Settings], tmp_path: Any) -> Iterator[tuple[Settings, RedisServer]]:
    settings = make_settings(
        redis_url=f"redis://127.0.0.1:{free_port()}/0",
        run_dir=str(tmp_path / "run"),
        serving_breaker_cooldown_ms=200,
        # Short enough to show that nothing hangs, long enough that a stall of the shared
        # machine does not fail the "before" requests.
        redis_socket_timeout_ms=250,
        serving_deadline_ms=500,
    )
    server = RedisServer(settings)
    server.start()
    client = redis_client(settings, timeout_ms=2000)
    seed_store(client, settings)
    client.close()
    try:
        yield settings, server
    finally:
        pid = server.process.pid
        if pid:
            try:
                os.kill(pid, signal.SIGCONT)  # in case a test left it stopped
            except ProcessLookupError:
                pass
        server.stop()


def _timed_get(http: TestClient, url: str) -> tuple[httpx.Response, float]:
    start = time.perf_counter()
    response = http.get(url)
    return response, time.perf_counter() - start


def _wait_recovered(http: TestClient, url: str) -> httpx.Response:
    deadline = time.monotonic() + RECOVERY_BOUND_S
    while True:
        response = http.get(url)
        if response.status_code == 200 and response.json()["degraded"] is False:
            return response
        if time.monotonic() > deadline:
            raise AssertionError(f"not recovered within {RECOVERY_BOUND_S} s: {response.text}")
        time.sleep(0.1)


def test_redis_stopped_answers_from_memory_then_recovers(own_redis: tuple[Settings, RedisServer]) -> None:
    settings, server = own_redis
    with TestClient(create_app(settings)) as http:
        before = http.get("/v1/top-sellers?k=5").json()
        region_before = http.get(f"/v1/top-sellers?window=24h&region={DE}").json()
        assert before["degraded"] is False

        server.stop()

        top, took = _timed_get(http, "/v1/top-sellers?k=5")
        assert took < ANSWER_BOUND_S
        assert top.status_code == 200
        body = top.json()
        assert body["degraded"] is True
        assert body["items"] == before["items"]
        assert body["freshness"]["memory"]["age_ms"] >= 0

        region, took = _timed_get(http, f"/v1/top-sellers?window=24h&region={DE}")
        assert took < ANSWER_BOUND_S and region.json()["items"] == region_before["items"]
        assert region.json()["degraded"] is True and region.json()["scope"] == "region"

        # A scope never read before: the global list, saying so.
        other, _ = _timed_get(http, "/v1/top-sellers?window=1h&category=PARTY")
        assert other.status_code == 200
        assert other.json()["degraded"] is True and other.json()["scope"] == "global"

        recs, took = _timed_get(http, f"/v1/users/{KNOWN_USER}/recommendations?k=4")
        assert took < ANSWER_BOUND_S and recs.status_code == 200
        assert recs.json()["degraded"] is True and recs.json()["model_version"] == "v1"
        assert {i["source"] for i in recs.json()["items"]} == {"top_sellers_global"}

        similar, took = _timed_get(http, "/v1/items/85123A/similar")
        assert took < ANSWER_BOUND_S and similar.json()["degraded"] is True

        ready, took = _timed_get(http, "/readyz")
        assert took < ANSWER_BOUND_S and ready.status_code == 503 and ready.json()["redis"] is False
        assert http.get("/healthz").status_code == 200

        metrics = http.get("/metrics").text
        assert "shopstream_serving_redis_up 0.0" in metrics
        assert 'shopstream_serving_fallbacks_total{reason="degraded"}' in metrics

        server.start()
        recovered = _wait_recovered(http, "/v1/top-sellers?k=5").json()
        assert recovered["items"] == before["items"]
        assert http.get(f"/v1/users/{KNOWN_USER}/recommendations").json()["known_user"] is True
        assert http.get("/readyz").status_code == 200


def test_redis_down_at_start_is_503_until_it_comes_up(own_redis: tuple[Settings, RedisServer]) -> None:
    settings, server = own_redis
    server.stop()
    with TestClient(create_app(settings)) as http:
        response, took = _timed_get(http, "/v1/top-sellers")
        assert took < ANSWER_BOUND_S
        assert response.status_code == 503
        assert response.headers["Retry-After"] == "1"
        assert response.json()["detail"] == (
            "top sellers are unavailable: the online store did not answer in time and no "
            "earlier answer is kept in memory; retry shortly"
        )
        recs, took = _timed_get(http, f"/v1/users/{KNOWN_USER}/recommendations")
        assert took < ANSWER_BOUND_S and recs.status_code == 503
        assert "recommendations are unavailable" in recs.json()["detail"]

        server.start()
        assert _wait_recovered(http, "/v1/top-sellers").json()["items"]


def test_hung_redis_times_out_instead_of_hanging(own_redis: tuple[Settings, RedisServer]) -> None:
    settings, server = own_redis
    pid = server.process.pid
    assert pid is not None
    with TestClient(create_app(settings)) as http:
        before = http.get(f"/v1/users/{KNOWN_USER}/recommendations?k=4").json()
        assert before["degraded"] is False
        os.kill(pid, signal.SIGSTOP)  # accepts connections, never answers
        try:
            for _ in range(3):
                response, took = _timed_get(http, f"/v1/users/{KNOWN_USER}/recommendations?k=4")
                assert took < ANSWER_BOUND_S
                assert response.status_code == 200 and response.json()["degraded"] is True
            assert 'kind="timeout"' in http.get("/metrics").text
        finally:
            os.kill(pid, signal.SIGCONT)
        recovered = _wait_recovered(http, f"/v1/users/{KNOWN_USER}/recommendations?k=4")
        assert recovered.json()["known_user"] is True


def test_in_process_client_degrades_and_recovers(own_redis: tuple[Settings, RedisServer]) -> None:
    settings, server = own_redis
    with ServingClient(settings) as client:
        assert client.warm() is True
        fresh = client.top_sellers("24h", k=3)
        server.stop()
        start = time.perf_counter()
        degraded = client.top_sellers("24h", k=3)
        assert time.perf_counter() - start < ANSWER_BOUND_S
        assert degraded.degraded and [i.item_id for i in degraded.items] == [i.item_id for i in fresh.items]
        assert client.ready().redis is False
        server.start()
        deadline = time.monotonic() + RECOVERY_BOUND_S
        while client.top_sellers("24h", k=3).degraded:
            assert time.monotonic() < deadline, "in-process client did not recover"
            time.sleep(0.1)
