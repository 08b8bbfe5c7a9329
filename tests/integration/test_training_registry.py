"""The gated registry end to end: real SQLite MLflow store, real redis-server, offline-store events.

A worse model stays ``challenger``, a better one becomes ``champion`` and goes live in
Redis in one pointer switch, rollback restores the previous champion and the pointer
follows; every run names the data it read.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlflow
import pytest
from mlflow import MlflowClient

from features.online_keys import REC_TTL, similar_items_key, user_recs_key
from pipelines.offline_store import events_path
from pipelines.settings import Settings
from training.data import content_digest
from training.experiment import (
    TrainOptions,
    TrainReport,
    promote_version,
    rollback_champion,
    run_training,
)
from training.registry import CHALLENGER, CHAMPION, PREVIOUS, alias_version
from training.sample import sample_events, write_offline_events
from training.scoring import live_version, previous_version
from training.tracking import configure_tracking

pytestmark = pytest.mark.integration


@pytest.fixture()
def train_settings(make_settings: Callable[..., Settings], tmp_path: Path, redis_client: Any) -> Settings:
    """A fresh data dir (offline store + SQLite MLflow store) per test, on the session's Redis."""
    settings = make_settings(
        data_dir=str(tmp_path / "data"),
        model_name=f"rec-{uuid.uuid4().hex[:8]}",
        train_eval_ks=[5, 10],
        train_score_top_n=20,
    )
    events = sample_events(users=150, items=60, categories=5, events=5000, days=8.0, seed=5)
    write_offline_events(events, events_path(settings))
    configure_tracking(settings)
    return settings


def _train(settings: Settings, *models: str, **options: Any) -> TrainReport:
    with mlflow.start_run():
        return run_training(settings, TrainOptions(models=list(models), **options))


def _alias(settings: Settings, alias: str) -> str | None:
    version = alias_version(MlflowClient(), settings.model_name, alias)
    return str(version.version) if version else None


def test_gate_promotes_better_keeps_worse_and_rollback_restores(train_settings: Settings, redis_client: Any) -> None:
    s = train_settings
    # 1. the first version becomes champion and goes live
    first = _train(s, "popularity")
    assert first.version == "1" and first.decision is not None and first.decision.promote
    assert _alias(s, CHAMPION) == "1" and live_version(redis_client) == "1"
    user = str(first.split.train.user_ids[0])
    assert redis_client.zcard(user_recs_key("1", user)) == 20
    assert 0 < redis_client.ttl(user_recs_key("1", user)) <= REC_TTL

    # 2. a better model beats it on the same test split: champion, live, old one is previous
    better = _train(s, "ease")
    assert better.version == "2" and better.best == "ease"
    assert better.decision.promote and better.decision.champion_value == pytest.approx(
        first.result("popularity").test_metrics["ndcg_at_10"])
    assert (_alias(s, CHAMPION), _alias(s, PREVIOUS), _alias(s, CHALLENGER)) == ("2", "1", "2")
    assert (live_version(redis_client), previous_version(redis_client)) == ("2", "1")
    top = redis_client.zrevrange(user_recs_key("2", user), 0, -1)
    seen = {str(i) for i in better.split.train.frame.loc[better.split.train.frame["user_id"] == user, "item_id"]}
    assert top and not {t.decode() for t in top} & seen
    item = str(better.split.train.item_ids[0])
    assert redis_client.zcard(similar_items_key("2", item)) > 0

    # 3. a worse model stays challenger; nothing live changes
    worse = _train(s, "popularity")
    assert worse.version == "3" and not worse.decision.promote
    assert (_alias(s, CHAMPION), _alias(s, CHALLENGER)) == ("2", "3")
    assert live_version(redis_client) == "2"
    tags = MlflowClient().get_model_version(s.model_name, "3").tags
    assert tags["gate.decision"] == "kept as challenger" and tags["gate.metric"] == "ndcg@10"

    # 4. rollback: champion and live pointer back to version 1, instantly (its lists still live)
    assert rollback_champion(s) == ("2", "1")
    assert (_alias(s, CHAMPION), _alias(s, PREVIOUS)) == ("1", "2")
    assert (live_version(redis_client), previous_version(redis_client)) == ("1", "2")
    assert redis_client.zcard(user_recs_key("1", user)) == 20
    loaded = mlflow.pyfunc.load_model(f"models:/{s.model_name}@{CHAMPION}")
    assert loaded.unwrap_python_model().recommender.kind == "popularity"

    # 5. a manual promotion of the challenger skips the gate and goes live
    assert promote_version(s) == ("1", "3")
    assert (_alias(s, CHAMPION), live_version(redis_client), previous_version(redis_client)) == ("3", "3", "1")


def test_margin_keeps_a_slightly_better_model_as_challenger(
    make_settings: Callable[..., Settings], train_settings: Settings, redis_client: Any
) -> None:
    _train(train_settings, "popularity")
    strict = make_settings(**{**train_settings.model_dump(), "train_promotion_margin": 100.0})
    report = _train(strict, "ease")
    assert not report.decision.promote and "+ 10000.0%" in report.decision.reason
    assert _alias(strict, CHAMPION) == "1" and live_version(redis_client) == "1"


def test_run_records_datasets_models_metrics_and_plots(train_settings: Settings, redis_client: Any) -> None:
    report = _train(train_settings, "popularity", "item_knn", since="2026-10-02T00:00:00Z",
                    until="2026-10-08T00:00:00Z", register=False)
    assert report.version is None and live_version(redis_client) is None
    run = MlflowClient().get_run(report.run_id)
    by_context = {next(t.value for t in i.tags if t.key == "mlflow.data.context"): i.dataset
                  for i in run.inputs.dataset_inputs}
    assert set(by_context) == {"training", "validation", "testing"}
    rows = {next(t.value for t in i.tags if t.key == "mlflow.data.context"): int(next(t.value for t in i.tags if t.key == "rows"))
            for i in run.inputs.dataset_inputs}
    assert rows["training"] == len(report.split.train.frame) and rows["testing"] == len(report.split.test_frame)
    train_ds = by_context["training"]
    assert train_ds.digest == content_digest(report.split.train.frame)
    assert by_context["testing"].digest == content_digest(report.split.test_frame)
    assert train_ds.name.startswith("interactions-train[2026-10-02")
    assert events_path(train_settings) in train_ds.source
    params = run.data.params
    assert params["data.kind"] == "offline-store" and params["data.since"].startswith("2026-10-02")
    assert int(params["data.files"]) == len(report.interactions.source.files) > 0
    assert params["split.split"] == "time"
    for kind in ("popularity", "item_knn"):
        assert 0.0 <= run.data.metrics[f"{kind}/ndcg_at_10"] <= 1.0
        assert f"{kind}/coverage_at_5" in run.data.metrics
    artifacts = {a.path for a in MlflowClient().list_artifacts(report.run_id, "plots")}
    assert {"plots/metrics_per_k.png", "plots/metrics_per_model_at_10.png"} <= artifacts
    table = mlflow.artifacts.load_text(f"runs:/{report.run_id}/comparison/comparison.csv")
    assert table.splitlines()[0].startswith("model,precision_at_5")
    model = mlflow.pyfunc.load_model(report.model_uris["item_knn"])
    out = model.predict(__import__("pandas").DataFrame({"user_id": [str(report.split.train.user_ids[0])]}),
                        params={"k": 3})
    assert len(out) == 3


def test_rollback_rescores_a_version_whose_lists_expired(train_settings: Settings, redis_client: Any) -> None:
    first = _train(train_settings, "popularity")
    _train(train_settings, "ease")
    user = str(first.split.train.user_ids[0])
    # version 1's lists are gone (as after REC_TTL): rollback must not switch to nothing
    expired = list(redis_client.scan_iter(match=user_recs_key("1", "") + "*", count=1000))
    expired += list(redis_client.scan_iter(match=similar_items_key("1", "") + "*", count=1000))
    assert expired
    redis_client.delete(*expired)
    assert rollback_champion(train_settings) == ("2", "1")
    assert (live_version(redis_client), previous_version(redis_client)) == ("1", "2")
    assert redis_client.zcard(user_recs_key("1", user)) == 20
