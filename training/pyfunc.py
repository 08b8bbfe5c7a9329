"""Every recommender as an MLflow pyfunc: ``mlflow.pyfunc.load_model(...).predict(df)``.

The :class:`RecommenderModel` holds no state of its own: the fitted model is an
artifact folder (numpy/scipy files, see :meth:`Recommender.save`) that
``load_context`` reads. It is logged as *model from code*
(``training/pyfunc_model.py``), so nothing is pickled and the artifact is
inspectable. The loading process needs this package (``shopstream``) installed,
as the batch scorer and the API have.

Input: one query per row, either ``user_id`` (recommendations for a user; an
unknown user gets the regional or global best sellers, ``region`` optional) or
``item_id`` (similar items). Params: ``k`` (default 10) and ``exclude_seen``.
Output: one row per recommended item, ``query_user_id``, ``query_item_id``,
``item_id``, ``score``, ``rank`` (1 = best).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlflow.pyfunc
import numpy as np
import pandas as pd
from mlflow.models import ModelSignature
from mlflow.types import ColSpec, ParamSchema, ParamSpec, Schema

from training.models import Recommender

__all__ = ["RecommenderModel", "SIGNATURE", "ARTIFACT_KEY", "MODEL_CODE", "input_example", "pip_requirements"]

ARTIFACT_KEY = "recommender"
MODEL_CODE = Path(__file__).with_name("pyfunc_model.py")
"""Models-from-code entry point logged with every model (no pickled Python object)."""
OUTPUT_COLUMNS = ["query_user_id", "query_item_id", "item_id", "score", "rank"]

SIGNATURE = ModelSignature(
    inputs=Schema([
        ColSpec("string", "user_id", required=False),
        ColSpec("string", "item_id", required=False),
        ColSpec("string", "region", required=False),
    ]),
    outputs=Schema([
        ColSpec("string", "query_user_id", required=False),
        ColSpec("string", "query_item_id", required=False),
        ColSpec("string", "item_id"),
        ColSpec("double", "score"),
        ColSpec("long", "rank"),
    ]),
    params=ParamSchema([
        ParamSpec("k", "long", 10),
        ParamSpec("exclude_seen", "boolean", True),
    ]),
)


class RecommenderModel(mlflow.pyfunc.PythonModel):
    """pyfunc wrapper around a saved :class:`~training.models.Recommender`."""

    def __init__(self) -> None:
        self.recommender: Recommender | None = None

    def load_context(self, context: mlflow.pyfunc.PythonModelContext) -> None:
        self.recommender = Recommender.load(context.artifacts[ARTIFACT_KEY])

    def predict(
        self,
        context: mlflow.pyfunc.PythonModelContext | None,
        model_input: pd.DataFrame,
        params: dict[str, Any] | None = None,
    ) -> pd.DataFrame:
        if self.recommender is None:
            raise RuntimeError("model not loaded: load it with mlflow.pyfunc.load_model")
        params = params or {}
        k = int(params.get("k", 10))
        exclude_seen = bool(params.get("exclude_seen", True))
        rec = self.recommender
        frame = model_input.reset_index(drop=True)
        users = _column(frame, "user_id")
        items = _column(frame, "item_id")
        regions = _column(frame, "region")
        parts: list[pd.DataFrame] = []
        user_rows = [i for i, u in enumerate(users) if u is not None]
        if user_rows:
            answers = rec.recommend_ids(
                [users[i] for i in user_rows], k,
                regions=[regions[i] for i in user_rows], exclude_seen=exclude_seen,
            )
            for row, (ids, scores) in zip(user_rows, answers, strict=True):
                parts.append(_rows(users[row], None, ids, scores))
        item_rows = [i for i, it in enumerate(items) if it is not None and users[i] is None]
        if item_rows:
            index = {v: j for j, v in enumerate(rec.item_ids)}
            known = [i for i in item_rows if items[i] in index]
            if known:
                idx, val = rec.similar_items(np.array([index[items[i]] for i in known]), k)
                for row, r_idx, r_val in zip(known, idx, val, strict=True):
                    ok = r_idx >= 0
                    parts.append(_rows(None, items[row], rec.item_ids[r_idx[ok]].tolist(),
                                       r_val[ok].astype(float).tolist()))
        if not parts:
            return pd.DataFrame({c: pd.Series(dtype=t) for c, t in
                                 zip(OUTPUT_COLUMNS, ["object", "object", "object", "float64", "int64"], strict=True)})
        return pd.concat(parts, ignore_index=True)[OUTPUT_COLUMNS]


def _column(frame: pd.DataFrame, name: str) -> list[str | None]:
    if name not in frame.columns:
        return [None] * len(frame)
    return [None if (v is None or (isinstance(v, float) and np.isnan(v)) or v == "") else str(v)
            for v in frame[name].tolist()]


def _rows(user: str | None, item: str | None, ids: list[str], scores: list[float]) -> pd.DataFrame:
    n = len(ids)
    return pd.DataFrame({
        "query_user_id": [user] * n,
        "query_item_id": [item] * n,
        "item_id": ids,
        "score": np.asarray(scores, dtype=np.float64),
        "rank": np.arange(1, n + 1, dtype=np.int64),
    })


def input_example(model: Recommender, n: int = 2) -> pd.DataFrame:
    """A small request: the first users the model knows (recommendations)."""
    users = [str(u) for u in model.user_ids[:n]] or ["unknown-user"]
    return pd.DataFrame({"user_id": users})


def pip_requirements() -> list[str]:
    """Pinned runtime requirements (no inference: it would import the model in a subprocess)."""
    from importlib.metadata import version

    return [f"{pkg}=={version(pkg)}" for pkg in ("mlflow", "numpy", "scipy", "pandas", "scikit-learn")]


def save_artifact(model: Recommender, folder: str | Path) -> Path:
    """Save the fitted model where :func:`mlflow.pyfunc.log_model` picks it up as the artifact."""
    return model.save(Path(folder) / ARTIFACT_KEY)
