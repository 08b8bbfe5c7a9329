"""Ranking metrics for top-k recommendation, pure and vectorised over users.

Definitions (binary relevance; ``R_u`` the user's relevant items, ``rec_u`` the
ranked list, ``hit_i`` whether position ``i`` (1-based) is relevant):

* precision@k = |rec_u[:k] ∩ R_u| / k
* recall@k    = |rec_u[:k] ∩ R_u| / |R_u|
* NDCG@k      = DCG / IDCG, DCG = Σ_{i≤k} hit_i / log2(i + 1), IDCG = the DCG of a
  perfect list, Σ_{i≤min(k, |R_u|)} 1 / log2(i + 1)
* MAP@k       = Σ_{i≤k} hit_i · precision@i / min(k, |R_u|)
* hit rate@k  = 1 if any of the first k is relevant
* coverage@k  = |∪_u rec_u[:k]| / catalog size (over all evaluated users)

User metrics are averaged over users with at least one relevant item. A list
shorter than k (a padded ``-1``) simply has no hit there; precision still divides
by k, so recommending fewer items is not rewarded.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import scipy.sparse as sp

__all__ = [
    "METRICS",
    "metric_key",
    "parse_metric",
    "hits_matrix",
    "ranking_metrics",
    "precision_at_k",
    "recall_at_k",
    "ndcg_at_k",
    "average_precision_at_k",
    "hit_rate_at_k",
    "coverage_at_k",
]

METRICS: tuple[str, ...] = ("precision", "recall", "ndcg", "map", "hit_rate", "coverage")


def metric_key(name: str, k: int) -> str:
    """``ndcg`` + 10 -> ``ndcg_at_10`` (MLflow metric names cannot hold ``@``)."""
    return f"{name}_at_{k}"


def parse_metric(text: str) -> tuple[str, int]:
    """``ndcg@10`` or ``ndcg_at_10`` -> (``ndcg``, 10); raises on unknown names."""
    name, sep, k = text.replace("_at_", "@").partition("@")
    name = name.strip().lower()
    if not sep or not k.strip().isdigit() or name not in METRICS:
        raise ValueError(f"metric must look like 'ndcg@10' with a name in {METRICS}, got {text!r}")
    return name, int(k)


def hits_matrix(recommended: np.ndarray, relevant: sp.csr_matrix) -> np.ndarray:
    """Boolean (users x K): whether ``recommended[u, i]`` is in row ``u`` of ``relevant``.

    ``recommended`` holds item indices, ``-1`` for an empty slot.
    """
    recommended = np.asarray(recommended)
    if recommended.ndim != 2 or recommended.shape[0] != relevant.shape[0]:
        raise ValueError("recommended must be (users x K), aligned with relevant's rows")
    n, k = recommended.shape
    if n == 0 or k == 0:
        return np.zeros((n, k), dtype=bool)
    rel = relevant.tocsr()
    rows = np.repeat(np.arange(n), k)
    cols = recommended.ravel()
    valid = cols >= 0
    out = np.zeros(n * k, dtype=bool)
    if valid.any():
        values = np.asarray(rel[rows[valid], cols[valid]]).ravel()
        out[valid] = values > 0
    return out.reshape(n, k)


def ranking_metrics(
    recommended: np.ndarray,
    relevant: sp.csr_matrix,
    ks: Iterable[int],
    *,
    n_items: int | None = None,
) -> dict[str, float]:
    """Every metric of :data:`METRICS` at every k, averaged over users with relevant items.

    Parameters
    ----------
    recommended:
        (users x K) item indices, best first, ``-1`` padded; ``K >= max(ks)``.
    relevant:
        (users x items) CSR, non-zero where an item is relevant; rows aligned with
        ``recommended``.
    ks:
        Cut-offs.
    n_items:
        Catalog size for coverage (default: ``relevant.shape[1]``).

    Returns
    -------
    dict
        ``{"ndcg_at_10": ..., ...}`` plus ``users`` (how many users were averaged).
    """
    ks = sorted(set(int(k) for k in ks))
    recommended = np.asarray(recommended)
    if ks and recommended.shape[1] < ks[-1]:
        raise ValueError(f"need at least {ks[-1]} recommendations per user, got {recommended.shape[1]}")
    if ks:
        recommended = recommended[:, : ks[-1]]
    rel = relevant.tocsr()
    n_rel = np.diff(rel.indptr)
    users = n_rel > 0
    recs = recommended[users]
    hits = hits_matrix(recs, rel[users])
    n_rel = n_rel[users].astype(np.float64)
    catalog = n_items if n_items is not None else rel.shape[1]
    out: dict[str, float] = {"users": float(users.sum())}
    if not users.any():
        for k in ks:
            for name in METRICS:
                out[metric_key(name, k)] = 0.0
        return out
    kmax = ks[-1]
    discounts = 1.0 / np.log2(np.arange(2, kmax + 2))
    cum_hits = np.cumsum(hits, axis=1)
    prec_at_i = cum_hits / np.arange(1, kmax + 1)
    for k in ks:
        h = hits[:, :k]
        n_hit = h.sum(axis=1)
        dcg = (h * discounts[:k]).sum(axis=1)
        ideal_len = np.minimum(n_rel, k).astype(int)
        idcg = np.cumsum(discounts[:k])[ideal_len - 1]
        ap = (h * prec_at_i[:, :k]).sum(axis=1) / np.minimum(n_rel, k)
        shown = recs[:, :k]
        shown = shown[shown >= 0]
        out[metric_key("precision", k)] = float(np.mean(n_hit / k))
        out[metric_key("recall", k)] = float(np.mean(n_hit / n_rel))
        out[metric_key("ndcg", k)] = float(np.mean(dcg / idcg))
        out[metric_key("map", k)] = float(np.mean(ap))
        out[metric_key("hit_rate", k)] = float(np.mean(n_hit > 0))
        out[metric_key("coverage", k)] = float(len(np.unique(shown)) / catalog) if catalog else 0.0
    return out


# ------------------------------------------------------------- one-user helpers
def _one(recommended: Sequence[int], relevant: Iterable[int], k: int, name: str, n_items: int | None = None) -> float:
    rel = sorted(set(int(r) for r in relevant))
    items = max([*rel, *[int(x) for x in recommended], 0]) + 1
    matrix = sp.csr_matrix((np.ones(len(rel)), (np.zeros(len(rel), dtype=int), rel)), shape=(1, items))
    recs = np.full((1, max(k, len(recommended))), -1, dtype=np.int64)
    recs[0, : len(recommended)] = recommended
    return ranking_metrics(recs, matrix, [k], n_items=n_items or items)[metric_key(name, k)]


def precision_at_k(recommended: Sequence[int], relevant: Iterable[int], k: int) -> float:
    """Precision@k of one ranked list (see the module docstring)."""
    return _one(recommended, relevant, k, "precision")


def recall_at_k(recommended: Sequence[int], relevant: Iterable[int], k: int) -> float:
    """Recall@k of one ranked list."""
    return _one(recommended, relevant, k, "recall")


def ndcg_at_k(recommended: Sequence[int], relevant: Iterable[int], k: int) -> float:
    """NDCG@k of one ranked list (binary gains, log2 discount)."""
    return _one(recommended, relevant, k, "ndcg")


def average_precision_at_k(recommended: Sequence[int], relevant: Iterable[int], k: int) -> float:
    """AP@k of one ranked list (normalised by min(k, |relevant|))."""
    return _one(recommended, relevant, k, "map")


def hit_rate_at_k(recommended: Sequence[int], relevant: Iterable[int], k: int) -> float:
    """1.0 if any of the first k is relevant, else 0.0."""
    return _one(recommended, relevant, k, "hit_rate")


def coverage_at_k(recommended: np.ndarray, k: int, n_items: int) -> float:
    """Share of the catalog that appears in at least one top-k list."""
    recs = np.asarray(recommended)[:, :k]
    shown = recs[recs >= 0]
    return float(len(np.unique(shown)) / n_items) if n_items else 0.0
