"""Honest evaluation: hyperparameters on a validation split, numbers on the test split.

``evaluate`` is pure: a fitted model and a :class:`~training.data.Split` in, a flat
``dict[str, float]`` out (every metric at every k, computed on the split's users
with relevant test items, with the items each user saw in training excluded from
both the recommendations and the relevance). ``select_and_fit`` tunes one model
kind on a validation split carved from the training part, refits the winner on the
whole training part and evaluates it once on the test split.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from training.data import Split
from training.metrics import METRICS, metric_key, parse_metric, ranking_metrics
from training.models import Recommender, make_model, model_class

__all__ = ["ModelResult", "evaluate", "evaluate_external", "select_and_fit", "comparison_table"]

_log = logging.getLogger(__name__)

Configure = Callable[[Recommender], Recommender]
"""Hook applied to every new model before fitting (e.g. attach a feature provider)."""


def evaluate(model: Recommender, split: Split, ks: Iterable[int]) -> dict[str, float]:
    """Every metric at every k of ``model`` on ``split``'s test part.

    The model must have been fitted on ``split.train`` (same index spaces).
    """
    ks = sorted(set(ks))
    users = split.eval_users
    recs, _ = model.recommend(users, ks[-1], exclude_seen=True)
    return ranking_metrics(recs, split.test[users], ks, n_items=split.train.n_items)


@dataclass
class ModelResult:
    """One model kind's outcome in a training run."""

    kind: str
    params: dict[str, Any]
    model: Recommender
    test_metrics: dict[str, float]
    validation_metrics: dict[str, float]
    fit_seconds: float
    tuning: list[dict[str, Any]] = field(default_factory=list)

    def metric(self, name: str, *, on: str = "test") -> float:
        metric, k = parse_metric(name)
        source = self.test_metrics if on == "test" else self.validation_metrics
        return float(source.get(metric_key(metric, k), float("nan")))


def select_and_fit(
    kind: str,
    split: Split,
    validation: Split | None,
    *,
    ks: Sequence[int],
    metric: str = "ndcg@10",
    fixed: Mapping[str, Any] | None = None,
    configure: Configure | None = None,
    grid: Sequence[Mapping[str, Any]] | None = None,
) -> ModelResult:
    """Tune ``kind`` on ``validation`` (by ``metric``), refit on ``split.train``, test once.

    Parameters
    ----------
    kind:
        Model kind (see :data:`training.models.MODELS`).
    split:
        The train/test split; its test part is used exactly once, after tuning.
    validation:
        A split carved from ``split.train``; ``None`` skips tuning (defaults are used).
    ks:
        Cut-offs for the test metrics.
    metric:
        Tuning criterion, e.g. ``ndcg@10``.
    fixed:
        Parameters every candidate gets (e.g. the tuned components of the re-ranker).
    configure:
        Applied to each new model before fitting.
    grid:
        Candidates to try (default: the model's ``param_grid``).
    """
    name, k = parse_metric(metric)
    key = metric_key(name, k)
    fixed = dict(fixed or {})
    configure = configure or (lambda m: m)
    candidates = [dict(c) for c in (grid if grid is not None else model_class(kind).param_grid)] or [{}]
    tuning: list[dict[str, Any]] = []
    best_params: dict[str, Any] = {**candidates[0], **fixed}
    best_val: dict[str, float] = {}
    if validation is not None and len(candidates) >= 1:
        best_score = -np.inf
        for cand in candidates:
            params = {**cand, **fixed}
            started = time.perf_counter()
            try:
                model = configure(make_model(kind, **params)).fit(validation.train)
                scores = evaluate(model, validation, [k])
            except ValueError as exc:  # e.g. a re-ranker without positives on a tiny split
                _log.warning("%s %s failed on the validation split: %s", kind, cand, exc)
                tuning.append({**cand, key: float("nan"), "seconds": time.perf_counter() - started})
                continue
            tuning.append({**cand, key: scores[key], "seconds": time.perf_counter() - started})
            _log.debug("%s %s: validation %s=%.4f", kind, cand, key, scores[key])
            if scores[key] > best_score:
                best_score, best_params, best_val = scores[key], params, scores
    started = time.perf_counter()
    model = configure(make_model(kind, **best_params)).fit(split.train)
    fit_seconds = time.perf_counter() - started
    test = evaluate(model, split, ks)
    return ModelResult(kind, model.params, model, test, best_val, fit_seconds, tuning)


def comparison_table(results: Sequence[ModelResult], ks: Sequence[int]) -> pd.DataFrame:
    """One row per model: every test metric at every k, validation score and fit time."""
    rows = []
    for r in results:
        row: dict[str, Any] = {"model": r.kind}
        for k in sorted(ks):
            for name in METRICS:
                row[metric_key(name, k)] = r.test_metrics.get(metric_key(name, k), float("nan"))
        for key, value in r.validation_metrics.items():
            if key != "users":
                row[f"validation_{key}"] = value
        row["eval_users"] = r.test_metrics.get("users", 0.0)
        row["fit_seconds"] = r.fit_seconds
        rows.append(row)
    return pd.DataFrame(rows).set_index("model")


def evaluate_external(model: Recommender, split: Split, ks: Iterable[int]) -> dict[str, float]:
    """Evaluate a model fitted on *other* data (e.g. the registered champion) on ``split``.

    Users and items are matched by external id. Items the user interacted with in
    ``split.train`` are dropped from the model's list (as :func:`evaluate` excludes
    them); items unknown to the split's catalog stay in place as misses, since that is
    what the model would show. Users the model does not know get its fallback list.
    """
    ks = sorted(set(ks))
    kmax = ks[-1]
    users = split.eval_users
    if not len(users):
        return ranking_metrics(np.full((0, kmax), -1), split.test[users], ks, n_items=split.train.n_items)
    seen = split.train.matrix
    fetch = kmax + int(np.diff(seen.indptr)[users].max())
    answers = model.recommend_ids(
        [str(u) for u in split.train.user_ids[users]], fetch,
        regions=[str(r) for r in split.train.user_region[users]], exclude_seen=True,
    )
    index = split.train.item_index
    recs = np.full((len(users), kmax), -1, dtype=np.int64)
    for row, (u, (ids, _)) in enumerate(zip(users, answers, strict=True)):
        seen_items = set(seen.indices[seen.indptr[u] : seen.indptr[u + 1]].tolist())
        kept = [index.get(i, -1) for i in ids]
        kept = [i for i in kept if i not in seen_items or i < 0][:kmax]
        recs[row, : len(kept)] = kept
    return ranking_metrics(recs, split.test[users], ks, n_items=split.train.n_items)
