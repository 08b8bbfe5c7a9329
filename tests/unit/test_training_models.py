"""Recommenders: hand-checkable fits, exclusion of seen items, persistence, and beating popularity."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from training.data import (
    Split,
    TrainingData,
    interactions_from_events,
    make_split,
    make_training_data,
    validation_split,
)
from training.evaluate import evaluate, evaluate_external, select_and_fit
from training.models import (
    ALS,
    EASE,
    MODELS,
    ItemKNN,
    LearningToRank,
    Popularity,
    Recommender,
    RegionalPopularity,
    make_model,
)
from training.models.base import top_k
from training.models.ease import ease_weights
from training.sample import sample_events

WEIGHTS = {"view": 1.0, "add_to_cart": 3.0, "purchase": 5.0}
LIGHT_LTR = {
    "components": {"ease": {"l2": 50.0}, "item_knn": {"neighbors": 30}, "popularity": {}},
    "candidates": 20, "max_iter": 60, "max_users": 400,
}


def _data(rows: list[tuple[str, str, str, str, str]]) -> TrainingData:
    frame = pd.DataFrame(rows, columns=["user_id", "item_id", "event_time", "event_type", "region"])
    frame["event_time"] = pd.to_datetime(frame["event_time"], utc=True)
    clean, _ = interactions_from_events(frame, WEIGHTS)
    return make_training_data(clean)


@pytest.fixture(scope="module")
def split() -> Split:
    events = sample_events(users=200, items=80, categories=6, events=8000, days=10.0, seed=11)
    frame, _ = interactions_from_events(events, WEIGHTS)
    return make_split(frame, "time", test_fraction=0.2)


def test_top_k_orders_breaks_ties_by_index_and_pads() -> None:
    scores = np.array([[0.1, 0.5, 0.5, -np.inf], [-np.inf, -np.inf, 2.0, -np.inf]], dtype=np.float32)
    idx, val = top_k(scores, 3)
    assert idx.tolist() == [[1, 2, 0], [2, -1, -1]]
    assert np.isnan(val[1, 1]) and val[0, 0] == pytest.approx(0.5)


def test_popularity_ranks_by_weight_and_excludes_seen() -> None:
    data = _data([
        ("u1", "a", "2024-01-01", "view", "UK"), ("u2", "a", "2024-01-01", "view", "UK"),
        ("u2", "b", "2024-01-01", "purchase", "UK"), ("u3", "c", "2024-01-01", "view", "FR"),
    ])
    model = Popularity().fit(data)
    # weights: a = 2 views = 2, b = one purchase = 5, c = 1
    idx, _ = model.recommend(np.array([2]), 3)   # u3 saw c
    assert data.item_ids[idx[0][idx[0] >= 0]].tolist() == ["b", "a"]
    idx, _ = model.recommend(np.array([2]), 3, exclude_seen=False)
    assert data.item_ids[idx[0]].tolist() == ["b", "a", "c"]


def test_regional_popularity_prefers_the_users_region() -> None:
    data = _data([
        ("u1", "a", "2024-01-01", "purchase", "UK"), ("u2", "a", "2024-01-01", "purchase", "UK"),
        ("u3", "f", "2024-01-01", "view", "FR"), ("u4", "f", "2024-01-01", "view", "FR"),
        ("u5", "x", "2024-01-01", "view", "FR"),
    ])
    model = RegionalPopularity(global_weight=0.2).fit(data)
    idx, _ = model.recommend(np.array([4]), 1)  # u5 (FR) has seen x
    assert data.item_ids[idx[0, 0]] == "f"
    # an unknown user from the UK gets the UK list through the fallback
    assert model.recommend_ids(["nobody"], 1, regions=["UK"])[0][0] == ["a"]


def test_ease_weights_match_the_closed_form_for_two_items() -> None:
    # G = [[a, c], [c, b]]; B[0, 1] = c / (a + l2) and B[1, 0] = c / (b + l2), zero diagonal
    a, b, c, l2 = 4.0, 9.0, 2.0, 1.0
    weights = ease_weights(np.array([[a, c], [c, b]]), l2)
    np.testing.assert_allclose(weights, [[0.0, c / (a + l2)], [c / (b + l2), 0.0]])


def test_item_knn_similarity_is_shrunk_cosine() -> None:
    data = _data([
        ("u1", "a", "2024-01-01", "view", "UK"), ("u1", "b", "2024-01-01", "view", "UK"),
        ("u2", "a", "2024-01-01", "view", "UK"), ("u2", "b", "2024-01-01", "view", "UK"),
        ("u3", "a", "2024-01-01", "view", "UK"), ("u3", "c", "2024-01-01", "view", "UK"),
    ])
    model = ItemKNN(neighbors=5, shrink=1.0).fit(data)
    v = np.log1p(1.0)  # one view
    a, b, c = 3 * v * v, 2 * v * v, v * v   # squared norms of the item columns
    expected_ab = 2 * v * v / (np.sqrt(a * b) + 1.0)
    expected_ac = v * v / (np.sqrt(a * c) + 1.0)
    sim = model.similarity.toarray()
    assert sim[0, 1] == pytest.approx(expected_ab, rel=1e-5)
    assert sim[0, 2] == pytest.approx(expected_ac, rel=1e-5)
    assert sim[0, 0] == 0.0
    idx, _ = model.similar_items(np.array([0]), 2)
    assert data.item_ids[idx[0]].tolist() == ["b", "c"]


def test_als_recovers_two_taste_groups() -> None:
    rows = []
    for u in range(20):
        group = "xy" if u < 10 else "pq"
        items = [f"{group}{k}" for k in range(6)]
        for k, item in enumerate(items):
            if (u + k) % 6 != 0:  # each user misses one item of her group
                rows.append((f"u{u:02d}", item, "2024-01-01", "view", "UK"))
    data = _data(rows)
    # a toy problem from a near-zero start: give CG enough steps to converge (the default 3
    # is tuned for warm-started large problems)
    model = ALS(factors=4, reg=0.1, alpha=10.0, iterations=15, cg_steps=8).fit(data)
    idx, _ = model.recommend(np.arange(data.n_users), 1)
    for u, item in enumerate(data.item_ids[idx[:, 0]]):
        missing = [i for i in range(6) if (u + i) % 6 == 0][0]
        group = "xy" if u < 10 else "pq"
        assert item == f"{group}{missing}"


@pytest.mark.parametrize("kind", [k for k in MODELS if k != "ltr"])
def test_models_never_recommend_seen_items_and_survive_save_load(kind: str, split: Split, tmp_path: Path) -> None:
    model = make_model(kind).fit(split.train)
    users = np.arange(0, split.train.n_users, 7)
    idx, val = model.recommend(users, 10)
    seen = split.train.matrix
    for u, row in zip(users, idx, strict=True):
        assert not set(row[row >= 0]) & set(seen.indices[seen.indptr[u]: seen.indptr[u + 1]])
    valid = idx >= 0
    assert np.all(np.diff(np.where(valid, val, -np.inf), axis=1)[valid[:, 1:]] <= 1e-6)
    loaded = Recommender.load(model.save(tmp_path / kind))
    assert type(loaded) is type(model) and loaded.params == model.params
    idx2, val2 = loaded.recommend(users, 10)
    np.testing.assert_array_equal(idx, idx2)
    np.testing.assert_allclose(val, val2, rtol=1e-5)
    sim_idx, _ = loaded.similar_items(np.array([0, 1]), 5)
    assert sim_idx.shape == (2, 5) and 0 not in sim_idx[0]


def test_personal_models_beat_popularity_on_users_with_favourite_categories(split: Split) -> None:
    ks = [10]
    pop = evaluate(Popularity().fit(split.train), split, ks)["ndcg_at_10"]
    ease = evaluate(EASE(l2=50.0).fit(split.train), split, ks)["ndcg_at_10"]
    knn = evaluate(ItemKNN(neighbors=50).fit(split.train), split, ks)["ndcg_at_10"]
    assert ease > pop * 1.2 and knn > pop * 1.2


def test_learning_to_rank_reranks_candidates_and_round_trips(split: Split, tmp_path: Path) -> None:
    model = LearningToRank(**LIGHT_LTR).fit(split.train)
    assert "category_share" in model.feature_names and "ease_score" in model.feature_names
    metrics = evaluate(model, split, [10])
    pop = evaluate(Popularity().fit(split.train), split, [10])
    assert metrics["ndcg_at_10"] > pop["ndcg_at_10"]
    loaded = Recommender.load(model.save(tmp_path / "ltr"))
    users = np.arange(0, split.train.n_users, 5)
    np.testing.assert_array_equal(model.recommend(users, 10)[0], loaded.recommend(users, 10)[0])


def test_learning_to_rank_uses_provider_features_as_of_the_label_cutoff(split: Split) -> None:
    seen_times: list[pd.Timestamp] = []

    def provider(users: np.ndarray, items: np.ndarray, at: pd.Timestamp) -> tuple[pd.DataFrame, pd.DataFrame]:
        seen_times.append(at)
        return (pd.DataFrame({"user_activity__views_24h": np.arange(len(users), dtype=float)}, index=users),
                pd.DataFrame({"item_stats__views_24h": np.ones(len(items))}, index=items))

    model = LearningToRank(**LIGHT_LTR).with_features(provider).fit(split.train)
    assert model.feature_names[-2:] == ["user_activity__views_24h", "item_stats__views_24h"]
    # first call: features for the label period's start (inside training); then as of the end
    assert seen_times[0] < split.train.end_time < seen_times[1]
    assert model.user_external.shape == (split.train.n_users, 1)


def test_select_and_fit_tunes_on_validation_only(split: Split) -> None:
    val = validation_split(split)
    result = select_and_fit("ease", split, val, ks=[5, 10], grid=[{"l2": 5.0}, {"l2": 80.0}])
    assert len(result.tuning) == 2
    best = max(result.tuning, key=lambda r: r["ndcg_at_10"])
    assert result.params["l2"] == best["l2"]
    assert result.validation_metrics["ndcg_at_10"] == pytest.approx(best["ndcg_at_10"])
    assert set(result.test_metrics) >= {"ndcg_at_5", "ndcg_at_10", "coverage_at_10"}


def test_evaluate_external_matches_evaluate_for_the_same_model(split: Split) -> None:
    model = EASE(l2=50.0).fit(split.train)
    own = evaluate(model, split, [10])
    external = evaluate_external(model, split, [10])
    assert external["ndcg_at_10"] == pytest.approx(own["ndcg_at_10"])
