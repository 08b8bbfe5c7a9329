"""EASE: a linear item-item model with a closed-form solution (Steck, WWW 2019).

Solves ``min_B |X - X B|² + λ|B|²`` subject to ``diag(B) = 0``:
``P = (XᵀX + λI)⁻¹``, ``B = -P / diag(P)`` (column-wise), ``diag(B) = 0``. One
dense inversion of the item Gram matrix, so the catalog is capped at
``max_items`` (the most popular ones; the rest are never recommended by EASE —
a larger catalog wants the neighbour model or factorisation instead).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.linalg as sla

from training.data import TrainingData
from training.models.base import Recommender, top_k

__all__ = ["EASE", "ease_weights"]


def ease_weights(gram: np.ndarray, lam: float) -> np.ndarray:
    """The EASE weight matrix from a Gram matrix ``XᵀX`` and L2 strength ``lam``."""
    g = np.array(gram, dtype=np.float64, copy=True)
    g[np.diag_indices_from(g)] += lam
    p = sla.inv(g, overwrite_a=True, check_finite=False)
    b = -p / np.diag(p)[None, :]
    b[np.diag_indices_from(b)] = 0.0
    return b


class EASE(Recommender):
    """Embarrassingly shallow autoencoder: ``score_u = x_u B``."""

    kind = "ease"
    default_params: dict[str, Any] = {"l2": 100.0, "max_items": 5000}
    param_grid = [{"l2": 10.0}, {"l2": 50.0}, {"l2": 200.0}, {"l2": 1000.0}]

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.items = np.empty(0, dtype=np.int64)
        self.weights = np.empty((0, 0), dtype=np.float32)

    def _fit(self, data: TrainingData) -> None:
        x = data.matrix
        cap = int(self.params["max_items"])
        if x.shape[1] > cap:
            self.items = np.sort(np.argsort(-self.item_popularity, kind="stable")[:cap])
        else:
            self.items = np.arange(x.shape[1])
        xs = x[:, self.items].astype(np.float64)
        gram = (xs.T @ xs).toarray()
        self.weights = ease_weights(gram, float(self.params["l2"])).astype(np.float32)

    def score_users(self, users: np.ndarray) -> np.ndarray:
        xs = self.seen[np.asarray(users)][:, self.items]
        part = np.asarray(xs @ self.weights, dtype=np.float32)
        if len(self.items) == self.n_items:
            return part
        out = np.full((len(users), self.n_items), -np.inf, dtype=np.float32)
        out[:, self.items] = part
        return out

    def similar_items(self, items: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Items j with the largest weight ``B[i, j]`` (how much i predicts j)."""
        items = np.asarray(items, dtype=np.int64)
        pos = np.searchsorted(self.items, items)
        pos = np.clip(pos, 0, max(len(self.items) - 1, 0))
        inside = (len(self.items) > 0) & (self.items[pos] == items)
        block = np.full((len(items), self.n_items), -np.inf, dtype=np.float32)
        block[np.ix_(np.flatnonzero(inside), self.items)] = self.weights[pos[inside]]
        block[block <= 0] = -np.inf
        return top_k(block, k)

    def _state(self) -> dict[str, Any]:
        return {"items": self.items, "weights": self.weights}

    def _load_state(self, arrays: dict[str, Any]) -> None:
        self.items = arrays["items"]
        self.weights = arrays["weights"]
