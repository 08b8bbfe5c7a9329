"""`shopstream train` as a user runs it: real Online Retail data, real Redis, and a SQLite MLflow
store or a real MLflow tracking server."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from features.online_keys import live_model_key
from pipelines.settings import Settings

pytestmark = pytest.mark.integration

RETAIL = Path(__file__).resolve().parents[3] / "shared" / "data" / "online_retail_2010-12_2011-01.csv"


def _cli(settings: Settings, *args: str, **env_extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ,
           "SHOPSTREAM_DATA_DIR": settings.data_dir,
           "SHOPSTREAM_RUN_DIR": str(settings.run_path),
           "SHOPSTREAM_REDIS_URL": settings.redis_url,
           "COLUMNS": "120", **env_extra}
    return subprocess.run([sys.executable, "-m", "pipelines.cli", *args], env=env, capture_output=True,
                          text=True, timeout=600, cwd=str(Path(__file__).resolve().parents[2]))


@pytest.mark.skipif(not RETAIL.exists(), reason="the shared Online Retail file is not present")
def test_train_on_online_retail_registers_publishes_and_rolls_back(
    make_settings: Callable[..., Settings], tmp_path: Path, redis_client: Any
) -> None:
    settings = make_settings(data_dir=str(tmp_path / "data"))
    first = _cli(settings, "train", "--events", str(RETAIL), "--model", "popularity")
    assert first.returncode == 0, first.stderr
    second = _cli(settings, "train", "--events", str(RETAIL), "--model", "ease")
    assert second.returncode == 0, second.stderr
    out = second.stdout
    assert "Test metrics @10" in out and "ease" in out and "popularity" in out
    assert "registered shopstream-recommender version 2: promoted" in out
    assert "live in Redis: version 2" in out and "MLflow run " in out
    assert redis_client.get(live_model_key()) == b"2"

    back = _cli(settings, "train", "rollback")
    assert back.returncode == 0, back.stderr
    assert "champion 2 -> 1 (live in Redis)" in back.stdout
    assert redis_client.get(live_model_key()) == b"1"


def test_train_without_events_says_what_is_missing(make_settings: Callable[..., Settings], tmp_path: Path,
                                                  redis_server: Any) -> None:
    settings = make_settings(data_dir=str(tmp_path / "empty"))
    result = _cli(settings, "train", "--model", "popularity")
    assert result.returncode == 1
    assert "no events in the offline store" in result.stderr and "--events" in result.stderr
    bad = _cli(settings, "train", "--model", "svd")
    assert bad.returncode == 2 and "unknown model 'svd'" in bad.stderr
    nothing = _cli(settings, "train", "rollback")
    assert nothing.returncode == 2 and "nothing to roll back" in nothing.stderr


@pytest.fixture()
def tracking_server(tmp_path: Path) -> Iterator[str]:
    """``mlflow server`` on a free port (its own SQLite store, artifacts served by it)."""
    from tests.conftest import free_port

    port = free_port()
    home = tmp_path / "mlflow-server"
    home.mkdir()
    with open(home / "server.log", "wb") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
             "--workers", "1", "--backend-store-uri", f"sqlite:///{home / 'mlflow.db'}",
             "--artifacts-destination", str(home / "artifacts")],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2):  # noqa: S310 - local
                    break
            except OSError:
                assert server.poll() is None, (home / "server.log").read_text()[-2000:]
                assert time.monotonic() < deadline, "mlflow server not up within 120 s"
                time.sleep(0.5)
        yield url
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=30)


@pytest.mark.skipif(not RETAIL.exists(), reason="the shared Online Retail file is not present")
def test_train_against_a_tracking_server_registers_and_publishes(
    make_settings: Callable[..., Settings], tmp_path: Path, redis_client: Any, tracking_server: str
) -> None:
    """The registry of a tracking server refused the version of a logged model without its
    id ("The model_id request parameter must identify the resource that contains the
    source"), which the SQLite store let pass: training against a server never registered."""
    settings = make_settings(data_dir=str(tmp_path / "data"))
    env = {"SHOPSTREAM_MLFLOW_TRACKING_URI": tracking_server}
    first = _cli(settings, "train", "--events", str(RETAIL), "--model", "popularity", **env)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "registered shopstream-recommender version 1: promoted" in first.stdout
    assert "live in Redis: version 1" in first.stdout
    assert f"{tracking_server}/#/experiments/" in first.stdout.replace("\n", "")
    assert redis_client.get(live_model_key()) == b"1"
    # the model comes back through the server's artifact proxy to be scored again
    score = _cli(settings, "train", "score", **env)
    assert score.returncode == 0, score.stderr[-3000:]
    assert "version 1 live in Redis" in score.stdout
    # everything went to the server: its store has the run, the local default was not made
    assert not (tmp_path / "data" / "mlflow").exists()
    assert any((tmp_path / "mlflow-server" / "artifacts").rglob("MLmodel"))
