"""Popularity, globally and per region: the baseline every other model must beat.

Each item scores the (optionally time-decayed) sum of its interaction weights, so
a purchase counts more than a view and, with a half-life, last week's best sellers
outrank last quarter's. The regional variant ranks by the share of the user's
region, blended with the global share so that a small region still gets a full
list.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from training.data import TrainingData
from training.models.base import Recommender

__all__ = ["Popularity", "RegionalPopularity", "decayed_item_weights"]


def decayed_item_weights(
    frame: pd.DataFrame, n_items: int, half_life_days: float | None, *, now: pd.Timestamp | None = None,
    group: np.ndarray | None = None, n_groups: int = 1,
) -> np.ndarray:
    """Sum of event weights per item (per group), each halved every ``half_life_days``.

    Returns an (n_groups x n_items) float64 array (one row without ``group``).
    """
    out = np.zeros((n_groups, n_items), dtype=np.float64)
    if frame.empty:
        return out
    w = frame["weight"].to_numpy(np.float64)
    if half_life_days:
        now = now if now is not None else frame["event_time"].max()
        age_days = (now - frame["event_time"]).dt.total_seconds().to_numpy() / 86400.0
        w = w * np.power(0.5, age_days / half_life_days)
    rows = group if group is not None else np.zeros(len(frame), dtype=np.int64)
    np.add.at(out, (rows, frame["item_idx"].to_numpy()), w)
    return out


class Popularity(Recommender):
    """Most popular items for everyone (time-decayed interaction weight)."""

    kind = "popularity"
    default_params: dict[str, Any] = {"half_life_days": None}
    param_grid = [{"half_life_days": None}, {"half_life_days": 7.0}, {"half_life_days": 30.0}]

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.scores = np.empty(0, dtype=np.float32)

    def _fit(self, data: TrainingData) -> None:
        w = decayed_item_weights(data.frame, data.n_items, self.params["half_life_days"])[0]
        self.scores = (w / w.sum() if w.sum() > 0 else w).astype(np.float32)

    def score_users(self, users: np.ndarray) -> np.ndarray:
        return np.broadcast_to(self.scores, (len(users), self.n_items))

    def fallback_scores(self, n: int, region: str | None = None) -> np.ndarray:
        return np.broadcast_to(self.scores, (n, self.n_items))

    def _state(self) -> dict[str, Any]:
        return {"scores": self.scores}

    def _load_state(self, arrays: dict[str, Any]) -> None:
        self.scores = arrays["scores"]


class RegionalPopularity(Recommender):
    """Most popular items in the user's region, blended with the global ranking.

    ``score = (1 - global_weight) * region_share + global_weight * global_share``.
    """

    kind = "popularity_region"
    default_params: dict[str, Any] = {"half_life_days": None, "global_weight": 0.2}
    param_grid = [
        {"half_life_days": None, "global_weight": 0.2},
        {"half_life_days": 7.0, "global_weight": 0.2},
        {"half_life_days": 30.0, "global_weight": 0.5},
    ]

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.regions = np.empty(0, dtype=str)
        self.region_scores = np.empty((0, 0), dtype=np.float32)
        self.global_scores = np.empty(0, dtype=np.float32)

    def _fit(self, data: TrainingData) -> None:
        regions, codes = np.unique(data.frame["region"].astype(str).to_numpy(), return_inverse=True)
        per_region = decayed_item_weights(
            data.frame, data.n_items, self.params["half_life_days"], group=codes, n_groups=len(regions)
        )
        totals = per_region.sum(axis=1, keepdims=True)
        share = np.divide(per_region, totals, out=np.zeros_like(per_region), where=totals > 0)
        glob = per_region.sum(axis=0)
        glob = glob / glob.sum() if glob.sum() > 0 else glob
        g = float(self.params["global_weight"])
        self.regions = regions.astype(str)
        self.global_scores = glob.astype(np.float32)
        self.region_scores = ((1 - g) * share + g * glob).astype(np.float32)

    def _region_rows(self, regions: np.ndarray) -> np.ndarray:
        regions = np.asarray(regions, dtype=str)
        if not len(self.regions):
            return np.full(len(regions), -1, dtype=np.int64)
        pos = np.clip(np.searchsorted(self.regions, regions), 0, len(self.regions) - 1)
        return np.where(self.regions[pos] == regions, pos, -1)

    def score_users(self, users: np.ndarray) -> np.ndarray:
        rows = self._region_rows(self.user_region[np.asarray(users, dtype=np.int64)])
        out = np.empty((len(users), self.n_items), dtype=np.float32)
        known = rows >= 0
        out[known] = self.region_scores[rows[known]]
        out[~known] = self.global_scores
        return out

    def fallback_scores(self, n: int, region: str | None = None) -> np.ndarray:
        if region is not None:
            row = self._region_rows(np.array([region]))[0]
            if row >= 0:
                return np.broadcast_to(self.region_scores[row], (n, self.n_items))
        return np.broadcast_to(self.global_scores, (n, self.n_items))

    def _state(self) -> dict[str, Any]:
        return {"regions": self.regions, "region_scores": self.region_scores, "global_scores": self.global_scores}

    def _load_state(self, arrays: dict[str, Any]) -> None:
        self.regions = arrays["regions"]
        self.region_scores = arrays["region_scores"]
        self.global_scores = arrays["global_scores"]
