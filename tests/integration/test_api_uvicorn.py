"""``shopstream serve``: a real uvicorn process on a free port, configured only by settings.

Bounds: the server must answer ``/healthz`` within ``STARTUP_BOUND_S`` of being started
(imports of FastAPI, Feast's protobufs and uvicorn on a shared 2-core machine) and exit
within ``SHUTDOWN_BOUND_S`` of SIGTERM.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from pipelines.settings import Settings
from tests.conftest import free_port
from tests.integration.test_serving_data import COLD_USER, KNOWN_USER, UK, seed_store

pytestmark = pytest.mark.integration

STARTUP_BOUND_S = 120.0
SHUTDOWN_BOUND_S = 20.0
API_KEY = "uvicorn-test-key-7d2e"


def _serve(settings: Settings, cwd: Path, **extra_env: str) -> subprocess.Popen[bytes]:
    # Nothing from this process's environment that configures the server: SHOPSTREAM_*,
    # and the multiprocess dir Feast exports when feast.metrics is imported here.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SHOPSTREAM_", "PROMETHEUS_MULTIPROC"))}
    env.update(
        SHOPSTREAM_REDIS_URL=settings.redis_url,
        SHOPSTREAM_API_HOST="127.0.0.1",
        SHOPSTREAM_API_PORT=str(settings.api_port),
        SHOPSTREAM_DATA_DIR=settings.data_dir,
        SHOPSTREAM_RUN_DIR=str(settings.run_path),
        # generous timeouts: a stall of the shared machine is not an outage here
        SHOPSTREAM_REDIS_SOCKET_TIMEOUT_MS="1000",
        SHOPSTREAM_SERVING_DEADLINE_MS="3000",
        **extra_env,
    )
    log = (cwd / "serve.log").open("wb")
    # cwd without a .env file: the process is configured by the environment alone.
    return subprocess.Popen([sys.executable, "-m", "pipelines.cli", "serve"], cwd=cwd, env=env,
                            stdout=log, stderr=subprocess.STDOUT)


def _wait_healthy(proc: subprocess.Popen[bytes], base: str, log: Path) -> None:
    deadline = time.monotonic() + STARTUP_BOUND_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"serve exited with {proc.returncode}:\n{log.read_text()}")
        try:
            if httpx.get(f"{base}/healthz", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"serve not healthy within {STARTUP_BOUND_S} s:\n{log.read_text()}")


def _stop(proc: subprocess.Popen[bytes]) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=SHUTDOWN_BOUND_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError(f"serve did not stop within {SHUTDOWN_BOUND_S} s of SIGTERM") from None


@pytest.fixture()
def served(make_settings: Callable[..., Settings], redis_client: Any, tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    settings = make_settings(api_port=free_port())
    seed_store(redis_client, settings)
    proc = _serve(settings, tmp_path, SHOPSTREAM_API_KEY=API_KEY)
    base = f"http://127.0.0.1:{settings.api_port}"
    try:
        _wait_healthy(proc, base, tmp_path / "serve.log")
        yield base, proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_serve_answers_over_http(served: tuple[str, subprocess.Popen[bytes]], tmp_path: Path) -> None:
    base, proc = served
    headers = {"X-API-Key": API_KEY}
    with httpx.Client(base_url=base, timeout=5.0) as http:
        assert http.get("/v1/top-sellers").status_code == 401
        top = http.get("/v1/top-sellers", params={"k": 3}, headers=headers)
        assert top.status_code == 200
        assert [i["item_id"] for i in top.json()["items"]] == ["85123A", "22423", "85099B"]
        recs = http.get(f"/v1/users/{KNOWN_USER}/recommendations", params={"region": UK},
                        headers=headers).json()
        assert recs["known_user"] is True and recs["model_version"] == "v1"
        # All 8 model candidates plus the one UK trending item they do not already hold.
        assert len(recs["items"]) == 9 and recs["items"][0]["source"] == "model"
        cold = http.get(f"/v1/users/{COLD_USER}/recommendations", headers=headers).json()
        assert cold["known_user"] is False
        assert http.get("/v1/top-sellers?k=500", headers=headers).status_code == 422
        assert http.get("/readyz", headers=headers).json()["status"] == "ready"
        assert "shopstream_api_request_duration_seconds" in http.get("/metrics", headers=headers).text
        assert http.get("/openapi.json").status_code == 200
    # uvicorn shuts down gracefully, then re-raises SIGTERM so the exit status says why.
    assert _stop(proc) in (0, -signal.SIGTERM)
    log = (tmp_path / "serve.log").read_text()
    assert "Application shutdown complete" in log
    assert API_KEY not in log
    assert "API key required" in log


def test_serve_with_two_workers(make_settings: Callable[..., Settings], redis_client: Any,
                                tmp_path: Path) -> None:
    settings = make_settings(api_port=free_port())
    seed_store(redis_client, settings)
    proc = _serve(settings, tmp_path, SHOPSTREAM_API_WORKERS="2", SHOPSTREAM_SERVING_REFRESH_SECONDS="0.5")
    base = f"http://127.0.0.1:{settings.api_port}"
    try:
        _wait_healthy(proc, base, tmp_path / "serve.log")
        with httpx.Client(base_url=base, timeout=5.0) as http:
            for _ in range(6):
                body = http.get(f"/v1/users/{KNOWN_USER}/recommendations").json()
                assert body["known_user"] is True and body["model_version"] == "v1"
            # /metrics, whichever worker answers, sums both workers (each publishes its
            # numbers every serving_refresh_seconds, here 0.5 s)
            route = "/v1/users/{user_id}/recommendations"
            count = (f'shopstream_api_request_duration_seconds_count{{method="GET",'
                     f'route="{route}",status="200"}} ')
            deadline = time.monotonic() + 30
            while True:
                text = http.get("/metrics").text
                lines = dict(line.rsplit(" ", 1) for line in text.splitlines()
                             if line and not line.startswith("#"))
                if float(lines.get(count.strip(), 0)) == 6 and float(lines["shopstream_api_workers"]) == 2:
                    break
                assert time.monotonic() < deadline, text
                time.sleep(0.2)
        assert _stop(proc) in (0, -signal.SIGTERM)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
