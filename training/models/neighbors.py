"""Item-to-item neighbours (cosine over co-occurrence), which also give "similar items".

``S = Xᵀ X`` normalised to cosine with a shrinkage term (pairs seen together by
few users are damped), pruned to each item's ``neighbors`` strongest partners; a
user's scores are ``x_u S``. Built as a sparse product in row blocks so memory is
bounded by the block, not the catalog squared.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

from training.data import TrainingData
from training.models.base import Recommender, top_k

__all__ = ["ItemKNN", "cosine_neighbors"]


def cosine_neighbors(x: sp.csr_matrix, neighbors: int, shrink: float, *, block: int = 2048) -> sp.csr_matrix:
    """Item x item CSR of the top ``neighbors`` shrunk cosine similarities per row (no diagonal).

    ``sim(i, j) = x_i · x_j / (|x_i| |x_j| + shrink)`` with ``x_i`` item i's user column.
    """
    xt = x.T.tocsr().astype(np.float32)
    n = xt.shape[0]
    norms = np.sqrt(np.asarray(xt.multiply(xt).sum(axis=1)).ravel()).astype(np.float32)
    rows, cols, vals = [], [], []
    k = min(neighbors, max(n - 1, 0))
    if k == 0:
        return sp.csr_matrix((n, n), dtype=np.float32)
    for start in range(0, n, block):
        stop = min(n, start + block)
        dots = (xt[start:stop] @ xt.T).toarray()
        denom = norms[start:stop, None] * norms[None, :] + shrink
        sims = np.divide(dots, denom, out=np.zeros_like(dots), where=denom > 0)
        sims[np.arange(stop - start), np.arange(start, stop)] = 0.0
        sims[sims <= 0] = -np.inf
        idx, val = top_k(sims, k)
        ok = idx >= 0
        r = np.repeat(np.arange(start, stop), k).reshape(-1, k)
        rows.append(r[ok])
        cols.append(idx[ok])
        vals.append(val[ok])
    return sp.csr_matrix(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(n, n), dtype=np.float32
    )


class ItemKNN(Recommender):
    """Item-based collaborative filtering with shrunk cosine similarity."""

    kind = "item_knn"
    default_params: dict[str, Any] = {"neighbors": 100, "shrink": 10.0}
    param_grid = [
        {"neighbors": 50, "shrink": 0.0},
        {"neighbors": 50, "shrink": 10.0},
        {"neighbors": 200, "shrink": 10.0},
        {"neighbors": 200, "shrink": 50.0},
    ]

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.similarity = sp.csr_matrix((0, 0), dtype=np.float32)

    def _fit(self, data: TrainingData) -> None:
        self.similarity = cosine_neighbors(
            data.matrix, int(self.params["neighbors"]), float(self.params["shrink"])
        )

    def score_users(self, users: np.ndarray) -> np.ndarray:
        # S holds item -> its neighbours; a user's score for j sums over her items i of S[i, j]
        return np.asarray((self.seen[np.asarray(users)] @ self.similarity).toarray(), dtype=np.float32)

    def similar_items(self, items: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        block = self.similarity[np.asarray(items, dtype=np.int64)].toarray()
        block[block <= 0] = -np.inf
        return top_k(block, k)

    def _state(self) -> dict[str, Any]:
        return {"similarity": self.similarity}

    def _load_state(self, arrays: dict[str, Any]) -> None:
        self.similarity = arrays["similarity"]
