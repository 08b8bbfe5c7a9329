"""The interface every recommender implements, and what they share.

A recommender is fitted on a :class:`~training.data.TrainingData` (a user x item
CSR matrix plus the interaction frame) and then answers two questions over its own
index spaces: *top-k items for these users* (``recommend``) and *items similar to
these items* (``similar_items``). Subclasses only provide ``_fit`` and
``score_users`` (a dense block of scores); ranking, excluding what a user has
already seen, the cold-start fallback and saving/loading are done here once.

State is saved as plain numpy/scipy files (``.npz``) plus a JSON header, so a
model artifact holds no pickled code and loads in any process that has this
package (the pyfunc wrapper ships the package with the model).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, ClassVar, Self

import numpy as np
import scipy.sparse as sp

from training.data import TrainingData

__all__ = ["Recommender", "top_k", "cosine_top_k"]

_log = logging.getLogger(__name__)

_SCORE_BLOCK = 20_000_000
"""Upper bound on floats in one dense (users x items) score block (80 MB in float32)."""


def top_k(scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Row-wise top-k of a dense score block: (indices, scores), best first.

    Entries of ``-inf`` are never returned; their slots hold index ``-1`` and score
    ``nan``, so a row with fewer than k candidates is padded, not filled with junk.
    """
    n, m = scores.shape
    k_eff = min(k, m)
    idx = np.full((n, k), -1, dtype=np.int64)
    val = np.full((n, k), np.nan, dtype=np.float32)
    if n == 0 or k_eff == 0:
        return idx, val
    part = np.argpartition(-scores, k_eff - 1, axis=1)[:, :k_eff]
    part_scores = np.take_along_axis(scores, part, axis=1)
    # stable tie-break on item index so results are reproducible
    order = np.lexsort((part, -part_scores), axis=1)
    part = np.take_along_axis(part, order, axis=1)
    part_scores = np.take_along_axis(part_scores, order, axis=1)
    ok = np.isfinite(part_scores)
    idx[:, :k_eff] = np.where(ok, part, -1)
    val[:, :k_eff] = np.where(ok, part_scores, np.nan)
    return idx, val


def cosine_top_k(vectors: np.ndarray | sp.spmatrix, items: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Nearest items by cosine between rows of ``vectors`` (the item itself excluded)."""
    if sp.issparse(vectors):
        norms = np.sqrt(np.asarray(vectors.multiply(vectors).sum(axis=1)).ravel())
    else:
        norms = np.linalg.norm(vectors, axis=1)
    norms = np.where(norms > 0, norms, 1.0)
    out_idx, out_val = [], []
    block = max(1, _SCORE_BLOCK // max(1, vectors.shape[0]))
    for start in range(0, len(items), block):
        chunk = items[start : start + block]
        q = vectors[chunk]
        sims = q @ vectors.T
        sims = sims.toarray() if sp.issparse(sims) else np.asarray(sims)
        sims = (sims / norms[chunk, None] / norms[None, :]).astype(np.float32)
        sims[np.arange(len(chunk)), chunk] = -np.inf
        sims[sims <= 0] = -np.inf
        i, v = top_k(sims, k)
        out_idx.append(i)
        out_val.append(v)
    if not out_idx:
        return np.empty((0, k), np.int64), np.empty((0, k), np.float32)
    return np.vstack(out_idx), np.vstack(out_val)


class Recommender:
    """Base class: fit on :class:`TrainingData`, recommend and find similar items.

    Class attributes
    ----------------
    kind:
        Registry name (``popularity``, ``item_knn``, ``ease``, ``als``, ``ltr``, ...).
    default_params:
        Hyperparameters and their defaults.
    param_grid:
        Candidates tried on the validation split (each merged over the defaults).
    """

    kind: ClassVar[str] = "base"
    default_params: ClassVar[dict[str, Any]] = {}
    param_grid: ClassVar[list[dict[str, Any]]] = [{}]

    def __init__(self, **params: Any) -> None:
        unknown = set(params) - set(self.default_params)
        if unknown:
            raise ValueError(f"{self.kind}: unknown parameter(s) {sorted(unknown)}")
        self.params: dict[str, Any] = {**self.default_params, **params}
        self.user_ids: np.ndarray = np.empty(0, dtype=str)
        self.item_ids: np.ndarray = np.empty(0, dtype=str)
        self.user_region: np.ndarray = np.empty(0, dtype=str)
        self.seen: sp.csr_matrix = sp.csr_matrix((0, 0), dtype=np.float32)
        self.item_popularity: np.ndarray = np.empty(0, dtype=np.float32)
        self.fitted_at: str = ""

    # ------------------------------------------------------------------ fitting
    def fit(self, data: TrainingData) -> Self:
        """Fit on ``data`` (pure: no I/O, no tracking); returns ``self``."""
        self.user_ids = np.asarray(data.user_ids, dtype=str)
        self.item_ids = np.asarray(data.item_ids, dtype=str)
        self.user_region = np.asarray(data.user_region, dtype=str)
        self.seen = data.matrix
        # distinct users per item: the cold-start fallback and a feature for re-ranking
        binary = self.seen.copy()
        binary.data[:] = 1.0
        self.item_popularity = np.asarray(binary.sum(axis=0)).ravel().astype(np.float32)
        end = data.end_time
        self.fitted_at = end.isoformat() if end is not None and end == end else ""
        self._fit(data)
        return self

    def _fit(self, data: TrainingData) -> None:
        raise NotImplementedError

    @property
    def n_users(self) -> int:
        return len(self.user_ids)

    @property
    def n_items(self) -> int:
        return len(self.item_ids)

    # ------------------------------------------------------------------ scoring
    def score_users(self, users: np.ndarray) -> np.ndarray:
        """Dense float32 scores (len(users) x n_items); higher is better, ``-inf`` = never."""
        raise NotImplementedError

    def fallback_scores(self, n: int, region: str | None = None) -> np.ndarray:
        """Scores for users the model has never seen: most popular items."""
        return np.broadcast_to(self.item_popularity, (n, self.n_items)).astype(np.float32)

    def recommend(
        self, users: np.ndarray, k: int, *, exclude_seen: bool = True
    ) -> tuple[np.ndarray, np.ndarray]:
        """Top-k item indices and scores for user indices, best first, ``-1`` padded."""
        users = np.asarray(users, dtype=np.int64)
        out_idx = np.full((len(users), k), -1, dtype=np.int64)
        out_val = np.full((len(users), k), np.nan, dtype=np.float32)
        block = max(1, _SCORE_BLOCK // max(1, self.n_items))
        for start in range(0, len(users), block):
            chunk = users[start : start + block]
            scores = np.array(self.score_users(chunk), dtype=np.float32, copy=True)
            if exclude_seen and self.seen.nnz:
                seen = self.seen[chunk].tocoo()
                scores[seen.row, seen.col] = -np.inf
            idx, val = top_k(scores, k)
            out_idx[start : start + len(chunk)] = idx
            out_val[start : start + len(chunk)] = val
        return out_idx, out_val

    def recommend_ids(
        self, user_ids: list[str], k: int, *, regions: list[str | None] | None = None,
        exclude_seen: bool = True,
    ) -> list[tuple[list[str], list[float]]]:
        """External ids in, external ids out; unknown users get the popularity fallback."""
        index = {u: i for i, u in enumerate(self.user_ids)}
        known = [(pos, index[u]) for pos, u in enumerate(user_ids) if u in index]
        result: list[tuple[list[str], list[float]]] = [([], [])] * len(user_ids)
        if known:
            idx, val = self.recommend(np.array([u for _, u in known]), k, exclude_seen=exclude_seen)
            for (pos, _), row_i, row_v in zip(known, idx, val, strict=True):
                ok = row_i >= 0
                result[pos] = (self.item_ids[row_i[ok]].tolist(), row_v[ok].astype(float).tolist())
        for pos, user in enumerate(user_ids):
            if user not in index:
                region = regions[pos] if regions else None
                i, v = top_k(np.array(self.fallback_scores(1, region), dtype=np.float32), k)
                ok = i[0] >= 0
                result[pos] = (self.item_ids[i[0][ok]].tolist(), v[0][ok].astype(float).tolist())
        return result

    def similar_items(self, items: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Most similar items per item index (itself excluded), best first, ``-1`` padded.

        Default: cosine between the items' user columns (co-occurrence). Models with
        their own item-item structure (neighbours, EASE weights, factors) override it.
        """
        return cosine_top_k(self.seen.T.tocsr(), np.asarray(items, dtype=np.int64), k)

    # ------------------------------------------------------------------ persistence
    def _state(self) -> dict[str, np.ndarray | sp.spmatrix]:
        """Model-specific arrays to save (dense or sparse)."""
        return {}

    def _load_state(self, arrays: dict[str, Any]) -> None:
        """Restore model-specific arrays (inverse of :meth:`_state`)."""

    def _extra_save(self, path: Path) -> None:
        """Hook for state that is not arrays (e.g. nested models)."""

    def _extra_load(self, path: Path) -> None:
        """Inverse of :meth:`_extra_save`."""

    def save(self, path: str | Path) -> Path:
        """Write the fitted model to a folder: ``meta.json``, ``dense.npz``, one ``.npz`` per sparse."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        state: dict[str, Any] = {
            "user_ids": self.user_ids.astype(str),
            "item_ids": self.item_ids.astype(str),
            "user_region": self.user_region.astype(str),
            "item_popularity": self.item_popularity,
            "seen": self.seen,
            **self._state(),
        }
        dense = {k: v for k, v in state.items() if not sp.issparse(v)}
        sparse = {k: v for k, v in state.items() if sp.issparse(v)}
        np.savez(path / "dense.npz", **dense)
        for name, matrix in sparse.items():
            sp.save_npz(path / f"sparse_{name}.npz", matrix.tocsr(), compressed=False)
        meta = {
            "kind": self.kind,
            "params": self.params,
            "fitted_at": self.fitted_at,
            "sparse": sorted(sparse),
        }
        (path / "meta.json").write_text(json.dumps(meta, indent=2, default=str))
        self._extra_save(path)
        return path

    @classmethod
    def load(cls, path: str | Path) -> Recommender:
        """Load any saved recommender (the class is picked from ``meta.json``)."""
        from training.models import model_class

        path = Path(path)
        meta = json.loads((path / "meta.json").read_text())
        klass = model_class(meta["kind"])
        model = klass(**meta["params"])
        with np.load(path / "dense.npz", allow_pickle=False) as npz:
            arrays: dict[str, Any] = {k: npz[k] for k in npz.files}
        for name in meta.get("sparse", []):
            arrays[name] = sp.load_npz(path / f"sparse_{name}.npz").tocsr()
        model.user_ids = arrays.pop("user_ids")
        model.item_ids = arrays.pop("item_ids")
        model.user_region = arrays.pop("user_region")
        model.item_popularity = arrays.pop("item_popularity")
        model.seen = arrays.pop("seen")
        model.fitted_at = meta.get("fitted_at", "")
        model._load_state(arrays)
        model._extra_load(path)
        return model

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.params.items())})"
