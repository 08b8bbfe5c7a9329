"""Serving on a store written by the real pipelines, end to end.

Events (``training.sample.sample_events``, shifted to end minutes ago) go through

* the **backfill** (:func:`pipelines.backfill.run_backfill`, Spark, materialized to
  Redis: ``user_activity`` in Feast's layout, top sellers / trending, item metadata);
* **training** (a fitted ``item_knn`` recommender from :mod:`training.models`) and its
  **batch scoring** (:func:`training.scoring.write_recommendations`) plus the atomic
  live switch (:func:`training.scoring.switch_live`).

Then the API is checked against what those wrote, read independently: a known
user's answer equals :func:`serving.rerank.rerank` applied to the candidates in Redis
and the features Feast's own ``get_online_features`` returns; a user held out of
training gets cold-start top sellers of their category; similar items are the
model's neighbours.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient

from features import online_keys
from pipelines.settings import Settings
from tests.integration.test_serving_data import TOLERANT_TIMEOUTS

pytestmark = [pytest.mark.integration, pytest.mark.slow]

VERSION = "1"
STEP = 60
DATABASE = 5


def _held_out(user_id: str) -> bool:
    return user_id.endswith("7")


@pytest.fixture(scope="module")
def pipeline_settings(make_settings: Any, redis_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Settings:
    """Settings on a Redis database of this module's own (other tests flush database 0)."""
    base = make_settings()
    host, port = base.redis_address
    data = tmp_path_factory.mktemp("serving_pipelines")
    return make_settings(redis_url=f"redis://{host}:{port}/{DATABASE}", data_dir=str(data / "data"),
                         **TOLERANT_TIMEOUTS)


@pytest.fixture(scope="module")
def redis_client(pipeline_settings: Settings) -> Any:
    from pipelines.connections import redis_client as make_client

    client = make_client(pipeline_settings, timeout_ms=5000)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


@pytest.fixture(scope="module")
def pipeline_store(pipeline_settings: Settings, redis_client: Any, spark: Any,
                   tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Backfill + training + scoring, once for the module (the backfill is a Spark job)."""
    backfill = pytest.importorskip("pipelines.backfill")
    from training.data import interactions_from_events, make_training_data
    from training.models import make_model
    from training.sample import sample_events
    from training.scoring import switch_live, write_recommendations

    settings = pipeline_settings
    tmp_path = tmp_path_factory.mktemp("serving_pipelines_events")
    now = datetime.now(UTC)
    days = 1.5
    start = now - timedelta(days=days) - timedelta(minutes=3)
    events = sample_events(users=150, items=80, categories=6, events=5000, days=days,
                           start=start.isoformat())
    source = tmp_path / "events.parquet"
    # Spark reads microsecond timestamps (pandas writes nanoseconds by default).
    events.assign(event_time=events["event_time"].astype("datetime64[us, UTC]")).to_parquet(source)
    as_of = datetime.fromtimestamp(int(now.timestamp()) // STEP * STEP, tz=UTC)
    result = backfill.run_backfill(settings, since=as_of, until=as_of, step_seconds=STEP,
                                   source=str(source), materialize=True, spark=spark)
    assert result.online.get("user_activity", 0) > 0

    train_events = events[~events["user_id"].map(_held_out)]
    frame, _ = interactions_from_events(train_events, settings.train_event_weights)
    model = make_model("item_knn").fit(make_training_data(frame))
    write_recommendations(redis_client, model, VERSION, top_n=settings.train_score_top_n)
    switch_live(redis_client, VERSION)
    return {"settings": settings, "events": events, "model": model, "as_of": as_of}


def _features_from_feast(settings: Settings, user_id: str) -> Any:
    """The user's features as Feast's own online read returns them."""
    from pipelines.feast_store import feature_store
    from serving.rerank import UserFeatures

    names = ["views_1h", "carts_1h", "purchases_1h", "last_event_time", "top_category",
             "category_affinity_ids", "category_affinity_weights", "last_viewed_items",
             "last_purchased_items"]
    row = feature_store(settings, apply=False).get_online_features(
        features=[f"user_activity:{n}" for n in names], entity_rows=[{"user_id": user_id}],
    ).to_dict(include_event_timestamps=True)
    value = {n: row[n][0] for n in names}
    last = value["last_event_time"]
    last_ms = None if last is None else int(
        (last if isinstance(last, datetime) else datetime.fromtimestamp(last, UTC)).replace(
            tzinfo=UTC).timestamp() * 1000)
    ts_seconds = row["views_1h__ts"][0]  # Feast returns the row's event timestamp in seconds
    return UserFeatures(
        as_of_ms=int(ts_seconds) * 1000 if ts_seconds else None,
        last_event_time_ms=last_ms,
        events_1h=sum(int(value[n] or 0) for n in ("views_1h", "carts_1h", "purchases_1h")),
        top_category=value["top_category"],
        category_affinity=tuple(zip(value["category_affinity_ids"] or [],
                                    value["category_affinity_weights"] or [], strict=True)),
        last_items_viewed=tuple(value["last_viewed_items"] or ()),
        recent_purchases=tuple(value["last_purchased_items"] or ()),
    )


def test_known_user_answer_is_rerank_of_what_the_pipelines_wrote(
    pipeline_store: dict[str, Any], redis_client: Any
) -> None:
    from serving.app import create_app
    from serving.rerank import RerankParams, rerank

    settings: Settings = pipeline_store["settings"]
    model = pipeline_store["model"]
    region = "United Kingdom"
    users = [u for u in model.user_ids.tolist() if redis_client.exists(online_keys.user_recs_key(VERSION, u))]
    assert users
    with TestClient(create_app(settings)) as http:
        checked = bought = 0
        for user in users[:15]:
            body = http.get(f"/v1/users/{user}/recommendations", params={"k": 10, "region": region}).json()
            now_ms = time.time_ns() // 1_000_000
            assert body["known_user"] is True and body["model_version"] == VERSION
            assert body["degraded"] is False
            # The same answer from the pure re-ranker fed by independent reads.
            candidates = [(m.decode(), s) for m, s in redis_client.zrevrange(
                online_keys.user_recs_key(VERSION, user), 0, settings.serving_candidates - 1, withscores=True)]
            features = _features_from_feast(settings, user)
            wanted = {c[0] for c in candidates} | set(features.last_items_viewed)
            categories = {i: (c.decode() if c else None) for i, c in zip(
                wanted, (redis_client.hget(online_keys.item_meta_key(i), "category_id") for i in wanted),
                strict=True)}
            trending = [(m.decode(), s) for m, s in redis_client.zrevrange(
                online_keys.trending_key(settings.serving_trending_window, online_keys.scope_region(region)),
                0, 29, withscores=True)]
            expected = rerank(candidates, features=features, item_categories=categories, trending=trending,
                              k=10, now_ms=now_ms,
                              params=RerankParams(category_boost=settings.serving_category_boost,
                                                  trending_share=settings.serving_trending_share))
            assert [(i["item_id"], i["source"]) for i in body["items"]] == [
                (i.item_id, i.source) for i in expected]
            # exclude_purchased (the default): nothing the user bought in the last 24h
            assert not {i["item_id"] for i in body["items"]} & set(features.recent_purchases)
            bought += bool(features.recent_purchases)
            assert body["freshness"]["user_activity"]["as_of"].startswith(
                pipeline_store["as_of"].strftime("%Y-%m-%dT%H:%M"))
            checked += 1
        assert checked
        assert bought, "no checked user bought anything in the last 24h: exclusion untested"


def test_held_out_user_gets_top_sellers_of_their_category(
    pipeline_store: dict[str, Any], redis_client: Any
) -> None:
    from serving.app import create_app

    settings: Settings = pipeline_store["settings"]
    events = pipeline_store["events"]
    cold = sorted({u for u in events["user_id"] if _held_out(u)})
    with TestClient(create_app(settings)) as http:
        seen = 0
        for user in cold:
            features = _features_from_feast(settings, user)
            if not features.top_category:
                continue  # no activity in the last 24h: nothing personal to fall back on
            body = http.get(f"/v1/users/{user}/recommendations", params={"k": 5}).json()
            assert body["known_user"] is False
            first = body["items"][0]
            assert first["source"] in ("top_sellers_category", "top_sellers_category_region")
            category = redis_client.hget(online_keys.item_meta_key(first["item_id"]), "category_id")
            assert category.decode() in {c for c, _ in features.category_affinity} | {features.top_category}
            seen += 1
        assert seen


def test_similar_items_are_the_models_neighbours(pipeline_store: dict[str, Any]) -> None:
    from serving.app import create_app

    settings: Settings = pipeline_store["settings"]
    model = pipeline_store["model"]
    with TestClient(create_app(settings)) as http:
        checked = 0
        for index in range(10):
            item = str(model.item_ids[index])
            idx, val = model.similar_items([index], 30)
            neighbours = {str(model.item_ids[i]): float(v) for i, v in zip(idx[0], val[0], strict=True) if i >= 0}
            if not neighbours:
                continue
            body = http.get(f"/v1/items/{item}/similar", params={"k": 5}).json()
            served = [(i["item_id"], i["score"]) for i in body["items"]]
            assert {i["source"] for i in body["items"]} == {"model"}
            # The model's nearest items, best first (ties may come in any order).
            assert len(served) == min(5, len(neighbours))
            assert [s for _, s in served] == sorted(neighbours.values(), reverse=True)[: len(served)]
            assert all(abs(neighbours[i] - s) < 1e-6 for i, s in served)
            checked += 1
        assert checked


def test_top_sellers_are_the_backfills_lists(pipeline_store: dict[str, Any], redis_client: Any) -> None:
    from serving.app import create_app

    settings: Settings = pipeline_store["settings"]
    with TestClient(create_app(settings)) as http:
        body = http.get("/v1/top-sellers", params={"window": "24h", "k": 10}).json()
    stored = redis_client.zrevrange(online_keys.top_sellers_key("24h", online_keys.scope_global()), 0, 9,
                                    withscores=True)
    assert [(i["item_id"], i["score"]) for i in body["items"]] == [(m.decode(), s) for m, s in stored]
    assert body["items"], "the backfill wrote no top sellers"
    assert body["freshness"]["top_sellers"]["as_of"].startswith(
        pipeline_store["as_of"].strftime("%Y-%m-%dT%H:%M"))
