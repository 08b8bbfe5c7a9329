"""The pyfunc wrapper: saved as an MLflow model from code, loaded back, answering requests."""

from __future__ import annotations

from pathlib import Path

import mlflow
import pandas as pd
import pytest

from training.data import interactions_from_events, make_training_data
from training.models import EASE, RegionalPopularity
from training.pyfunc import MODEL_CODE, SIGNATURE, input_example, pip_requirements, save_artifact

WEIGHTS = {"view": 1.0, "add_to_cart": 3.0, "purchase": 5.0}


@pytest.fixture(scope="module")
def data():  # type: ignore[no-untyped-def]
    rows = [
        ("u1", "a", "view", "UK"), ("u1", "b", "view", "UK"), ("u2", "a", "view", "UK"),
        ("u2", "c", "purchase", "UK"), ("u3", "b", "view", "FR"), ("u3", "c", "view", "FR"),
        ("u4", "d", "purchase", "FR"), ("u4", "c", "view", "FR"),
    ]
    frame = pd.DataFrame(rows, columns=["user_id", "item_id", "event_type", "region"])
    frame["event_time"] = pd.Timestamp("2024-01-01", tz="UTC")
    clean, _ = interactions_from_events(frame, WEIGHTS)
    return make_training_data(clean)


def _save(model, tmp_path: Path) -> str:  # type: ignore[no-untyped-def]
    path = tmp_path / "model"
    mlflow.pyfunc.save_model(
        path,
        python_model=str(MODEL_CODE),
        artifacts={"recommender": str(save_artifact(model, tmp_path / "artifact"))},
        signature=SIGNATURE,
        input_example=(input_example(model), {"k": 2}),
        pip_requirements=pip_requirements(),
    )
    return str(path)


def test_pyfunc_recommends_for_known_and_unknown_users(data, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    loaded = mlflow.pyfunc.load_model(_save(EASE(l2=1.0).fit(data), tmp_path))
    assert loaded.metadata.signature == SIGNATURE
    out = loaded.predict(pd.DataFrame({"user_id": ["u1", "nobody"]}), params={"k": 2})
    assert list(out.columns) == ["query_user_id", "query_item_id", "item_id", "score", "rank"]
    u1 = out[out["query_user_id"] == "u1"]
    assert not set(u1["item_id"]) & {"a", "b"}             # seen items are excluded
    assert u1["rank"].tolist() == list(range(1, len(u1) + 1))
    nobody = out[out["query_user_id"] == "nobody"]
    assert nobody["item_id"].tolist() == ["c", "a"]         # fallback: most users first
    with_seen = loaded.predict(pd.DataFrame({"user_id": ["u1"]}), params={"k": 4, "exclude_seen": False})
    assert set(with_seen["item_id"]) >= {"a", "b"}


def test_pyfunc_similar_items_and_regional_fallback(data, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    loaded = mlflow.pyfunc.load_model(_save(RegionalPopularity().fit(data), tmp_path))
    # in FR, d has one purchase (weight 5), c two views (1 + 1), b one view
    out = loaded.predict(pd.DataFrame({"user_id": ["new-fr"], "region": ["FR"]}), params={"k": 3})
    assert out["item_id"].tolist() == ["d", "c", "b"]
    similar = loaded.predict(pd.DataFrame({"item_id": ["a", "zzz"]}), params={"k": 2})
    assert set(similar["query_item_id"]) == {"a"} and "a" not in set(similar["item_id"])


def test_pyfunc_rejects_input_that_breaks_the_signature(data, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    loaded = mlflow.pyfunc.load_model(_save(EASE().fit(data), tmp_path))
    with pytest.raises(mlflow.exceptions.MlflowException):
        loaded.predict(pd.DataFrame({"user_id": ["u1"]}), params={"k": "ten"})
