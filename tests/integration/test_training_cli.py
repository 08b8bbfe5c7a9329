"""`shopstream train` as a user runs it: real Online Retail data, SQLite MLflow store, real Redis."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from features.online_keys import live_model_key
from pipelines.settings import Settings

pytestmark = pytest.mark.integration

RETAIL = Path(__file__).resolve().parents[3] / "shared" / "data" / "online_retail_2010-12_2011-01.csv"


def _cli(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ,
           "SHOPSTREAM_DATA_DIR": settings.data_dir,
           "SHOPSTREAM_RUN_DIR": str(settings.run_path),
           "SHOPSTREAM_REDIS_URL": settings.redis_url,
           "COLUMNS": "120"}
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


def test_train_without_events_says_what_is_missing(make_settings: Callable[..., Settings], tmp_path: Path) -> None:
    settings = make_settings(data_dir=str(tmp_path / "empty"))
    result = _cli(settings, "train", "--model", "popularity")
    assert result.returncode == 1
    assert "no events in the offline store" in result.stderr and "--events" in result.stderr
    bad = _cli(settings, "train", "--model", "svd")
    assert bad.returncode == 2 and "unknown model 'svd'" in bad.stderr
    nothing = _cli(settings, "train", "rollback")
    assert nothing.returncode == 2 and "nothing to roll back" in nothing.stderr
