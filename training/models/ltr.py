"""Learning to rank: a gradient-boosted re-ranker over the other models' candidates.

Two stages, both fitted on training data only:

1. *Candidates.* Each component model (EASE, item neighbours, ALS, popularity, ...)
   proposes its top ``candidates`` unseen items per user; the union is re-ranked.
2. *Re-ranker.* A :class:`~sklearn.ensemble.HistGradientBoostingClassifier` scores
   each (user, item) candidate from the components' scores and ranks, user and item
   activity computed from the interactions, and (when a feature provider is given)
   the Feast feature service's user and item features as of the prediction time.

To learn stage 2 without peeking at the test period, ``fit`` splits its own input
by time: components are fitted on the first ``1 - label_fraction`` of it, the
re-ranker learns which of their candidates the users went on to interact with in
the last ``label_fraction``, and then the components are refitted on all of it for
inference. Early stopping on a share of those training rows picks the number of
boosting rounds. NaN features (a missing Feast value) are handled natively.
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import scipy.sparse as sp

from training.data import TrainingData
from training.models.base import Recommender

__all__ = ["LearningToRank", "FeatureProvider", "activity_features", "category_affinity"]

_log = logging.getLogger(__name__)

FeatureProvider = Callable[[np.ndarray, np.ndarray, pd.Timestamp], tuple[pd.DataFrame, pd.DataFrame]]
"""``(user_ids, item_ids, as_of) -> (user_features, item_features)``, frames indexed by id
with numeric columns, values as known at ``as_of`` (point-in-time correct)."""

_USER_ACTIVITY = ["user_events", "user_items", "user_days_since_last"]
_ITEM_ACTIVITY = ["item_users", "item_weight_7d", "item_days_since_last"]


def activity_features(data: TrainingData, at: pd.Timestamp) -> tuple[np.ndarray, np.ndarray]:
    """Per-user and per-item activity from the interactions before ``at``.

    Returns (n_users x 3, n_items x 3) float32: events, distinct items, days since the
    last event per user; distinct users, weight in the last 7 days, days since the last
    event per item (NaN where there is none).
    """
    frame = data.frame[data.frame["event_time"] < at]
    users = np.full((data.n_users, 3), np.nan, dtype=np.float32)
    items = np.full((data.n_items, 3), np.nan, dtype=np.float32)
    if frame.empty:
        return users, items
    age = ((at - frame["event_time"]).dt.total_seconds() / 86400.0).to_numpy()
    u = frame["user_idx"].to_numpy()
    i = frame["item_idx"].to_numpy()
    g = pd.DataFrame({"u": u, "i": i, "age": age, "w": frame["weight"].to_numpy()})
    by_u = g.groupby("u").agg(n=("i", "size"), d=("i", "nunique"), last=("age", "min"))
    users[by_u.index.to_numpy()] = by_u[["n", "d", "last"]].to_numpy(np.float32)
    recent = g[g["age"] <= 7.0].groupby("i")["w"].sum()
    by_i = g.groupby("i").agg(n=("u", "nunique"), last=("age", "min"))
    items[by_i.index.to_numpy(), 0] = by_i["n"].to_numpy(np.float32)
    items[by_i.index.to_numpy(), 2] = by_i["last"].to_numpy(np.float32)
    items[:, 1] = 0.0
    items[recent.index.to_numpy(), 1] = recent.to_numpy(np.float32)
    return users, items


def category_affinity(data: TrainingData, at: pd.Timestamp) -> tuple[sp.csr_matrix, np.ndarray]:
    """Each user's share of interaction weight per category, and each item's category.

    Returns (n_users x n_categories CSR of shares, item -> category code or -1). Empty
    when the interactions carry no ``category_id``. The pair feature "how much of this
    user's activity is in this item's category" is ``shares[u, category[i]]``.
    """
    frame = data.frame[data.frame["event_time"] < at]
    if "category_id" not in frame.columns or frame.empty:
        return sp.csr_matrix((data.n_users, 0), dtype=np.float32), np.full(data.n_items, -1, dtype=np.int64)
    cats = frame["category_id"].astype("string").fillna("")
    codes, uniques = pd.factorize(cats)
    by_item = (pd.DataFrame({"i": frame["item_idx"].to_numpy(), "c": codes})
               .groupby(["i", "c"]).size().rename("n").reset_index()
               .sort_values(["i", "n", "c"], ascending=[True, False, True]).drop_duplicates("i"))
    item_cat = np.full(data.n_items, -1, dtype=np.int64)
    item_cat[by_item["i"].to_numpy()] = by_item["c"].to_numpy()
    m = sp.csr_matrix((frame["weight"].to_numpy(np.float32), (frame["user_idx"].to_numpy(), codes)),
                      shape=(data.n_users, len(uniques)))
    m.sum_duplicates()
    totals = np.asarray(m.sum(axis=1)).ravel()
    totals[totals == 0] = 1.0
    shares = sp.diags(1.0 / totals).dot(m).tocsr().astype(np.float32)
    return shares, item_cat


class LearningToRank(Recommender):
    """Candidates from component models, re-ranked by gradient boosting."""

    kind = "ltr"
    default_params: dict[str, Any] = {
        "components": {
            "ease": {}, "item_knn": {}, "als": {}, "popularity": {}, "popularity_region": {},
        },
        "candidates": 30,
        "label_fraction": 0.2,
        "max_users": 3000,
        "learning_rate": 0.1,
        "max_iter": 200,
        "max_leaf_nodes": 31,
        "seed": 42,
        "feature_service": None,
    }
    param_grid = [{}]

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.components: dict[str, Recommender] = {}
        self.ranker: Any = None
        self.feature_names: list[str] = []
        self.user_activity = np.empty((0, 3), dtype=np.float32)
        self.item_activity = np.empty((0, 3), dtype=np.float32)
        self.user_external = np.empty((0, 0), dtype=np.float32)
        self.item_external = np.empty((0, 0), dtype=np.float32)
        self.external_user_names: list[str] = []
        self.external_item_names: list[str] = []
        self.feature_provider: FeatureProvider | None = None
        self.user_category = sp.csr_matrix((0, 0), dtype=np.float32)
        self.item_category = np.empty(0, dtype=np.int64)

    def with_features(self, provider: FeatureProvider | None) -> LearningToRank:
        """Use ``provider`` (e.g. Feast historical features) for user and item features."""
        self.feature_provider = provider
        return self

    # ------------------------------------------------------------------ stage 1
    def _fit_components(self, data: TrainingData) -> dict[str, Recommender]:
        from training.models import make_model

        return {kind: make_model(kind, **p).fit(data) for kind, p in self.params["components"].items()}

    def _candidates(self, comps: dict[str, Recommender], users: np.ndarray) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
        """Union of the components' top-C unseen items: (pair_users, pair_items, rank per component)."""
        c = int(self.params["candidates"])
        n_items = self.n_items
        lists = {kind: model.recommend(users, c, exclude_seen=True)[0] for kind, model in comps.items()}
        keys_all = []
        for idx in lists.values():
            rows = np.repeat(users, c).reshape(-1, c)
            ok = idx >= 0
            keys_all.append(rows[ok].astype(np.int64) * n_items + idx[ok])
        keys = np.unique(np.concatenate(keys_all)) if keys_all else np.empty(0, np.int64)
        ranks: dict[str, np.ndarray] = {}
        for kind, idx in lists.items():
            rows = np.repeat(users, c).reshape(-1, c)
            pos = np.tile(np.arange(1, c + 1), (len(users), 1))
            ok = idx >= 0
            k = rows[ok].astype(np.int64) * n_items + idx[ok]
            order = np.argsort(k)
            k, p = k[order], pos[ok][order]
            if not len(k):
                ranks[kind] = np.full(len(keys), c + 1, dtype=np.float32)
                continue
            where = np.clip(np.searchsorted(k, keys), 0, len(k) - 1)
            ranks[kind] = np.where(k[where] == keys, p[where], c + 1).astype(np.float32)
        return keys // n_items, keys % n_items, ranks

    # ------------------------------------------------------------------ features
    def _features(
        self, comps: dict[str, Recommender], pair_users: np.ndarray, pair_items: np.ndarray,
        ranks: dict[str, np.ndarray], user_act: np.ndarray, item_act: np.ndarray,
        user_ext: np.ndarray, item_ext: np.ndarray,
        user_cat: sp.csr_matrix, item_cat: np.ndarray,
    ) -> np.ndarray:
        cols: list[np.ndarray] = []
        block_users = np.unique(pair_users)
        for kind, model in comps.items():
            scores = np.empty(len(pair_users), dtype=np.float32)
            step = max(1, 5_000_000 // max(1, self.n_items))
            for s in range(0, len(block_users), step):
                chunk = block_users[s : s + step]
                dense = np.asarray(model.score_users(chunk), dtype=np.float32)
                sel = (pair_users >= chunk[0]) & (pair_users <= chunk[-1])
                row = np.searchsorted(chunk, pair_users[sel])
                scores[sel] = dense[row, pair_items[sel]]
            scores[~np.isfinite(scores)] = np.nan
            cols += [scores, ranks[kind]]
        cols += [user_act[pair_users, j] for j in range(user_act.shape[1])]
        cols += [item_act[pair_items, j] for j in range(item_act.shape[1])]
        if user_cat.shape[1]:
            cat = item_cat[pair_items]
            known = cat >= 0
            share = np.full(len(pair_users), np.nan, dtype=np.float32)
            share[known] = np.asarray(user_cat[pair_users[known], cat[known]]).ravel()
            cols.append(share)
        if user_ext.size:
            cols += [user_ext[pair_users, j] for j in range(user_ext.shape[1])]
        if item_ext.size:
            cols += [item_ext[pair_items, j] for j in range(item_ext.shape[1])]
        return np.column_stack(cols).astype(np.float32) if cols else np.empty((len(pair_users), 0), np.float32)

    def _external(self, data: TrainingData, at: pd.Timestamp) -> tuple[np.ndarray, np.ndarray]:
        """Provider features aligned to the model's user and item indices (NaN where missing)."""
        if self.feature_provider is None:
            return np.empty((data.n_users, 0), np.float32), np.empty((data.n_items, 0), np.float32)
        users_df, items_df = self.feature_provider(np.asarray(data.user_ids), np.asarray(data.item_ids), at)
        users_df = users_df.select_dtypes("number")
        items_df = items_df.select_dtypes("number")
        if not self.external_user_names and not self.external_item_names:
            self.external_user_names = [str(c) for c in users_df.columns]
            self.external_item_names = [str(c) for c in items_df.columns]
        u = users_df.reindex(index=pd.Index(data.user_ids), columns=self.external_user_names)
        i = items_df.reindex(index=pd.Index(data.item_ids), columns=self.external_item_names)
        return u.to_numpy(np.float32), i.to_numpy(np.float32)

    # ------------------------------------------------------------------ fitting
    def _fit(self, data: TrainingData) -> None:
        from sklearn.ensemble import HistGradientBoostingClassifier

        times = data.frame["event_time"].sort_values(kind="stable")
        if len(times) < 10:
            raise ValueError("ltr: too few interactions to learn a re-ranker")
        cutoff = times.iloc[int(len(times) * (1.0 - float(self.params["label_fraction"])))]
        base = data.before(cutoff)
        label_frame = data.frame[data.frame["event_time"] >= cutoff]
        comps = self._fit_components(base)
        labels = sp.csr_matrix(
            (np.ones(len(label_frame), np.float32),
             (label_frame["user_idx"].to_numpy(), label_frame["item_idx"].to_numpy())),
            shape=(data.n_users, data.n_items),
        )
        labels.sum_duplicates()
        warm = np.diff(base.matrix.indptr) > 0
        users = np.flatnonzero((np.diff(labels.indptr) > 0) & warm)
        rng = np.random.default_rng(int(self.params["seed"]))
        if len(users) > int(self.params["max_users"]):
            users = np.sort(rng.choice(users, int(self.params["max_users"]), replace=False))
        self.external_user_names, self.external_item_names = [], []
        u_ext, i_ext = self._external(base, cutoff)
        u_act, i_act = activity_features(base, cutoff)
        u_cat, i_cat = category_affinity(base, cutoff)
        pu, pi, ranks = self._candidates(comps, users)
        x = self._features(comps, pu, pi, ranks, u_act, i_act, u_ext, i_ext, u_cat, i_cat)
        y = (np.asarray(labels[pu, pi]).ravel() > 0).astype(np.int8)
        self.feature_names = (
            [f"{k}_{what}" for k in comps for what in ("score", "rank")]
            + _USER_ACTIVITY + _ITEM_ACTIVITY + (["category_share"] if u_cat.shape[1] else [])
            + self.external_user_names + self.external_item_names
        )
        _log.info("ltr: %d candidate rows for %d users, %d positives", len(y), len(users), int(y.sum()))
        if y.sum() == 0 or y.sum() == len(y):
            raise ValueError("ltr: the label period gives no positive (or no negative) candidates")
        self.ranker = HistGradientBoostingClassifier(
            learning_rate=float(self.params["learning_rate"]),
            max_iter=int(self.params["max_iter"]),
            max_leaf_nodes=int(self.params["max_leaf_nodes"]),
            early_stopping=True,
            validation_fraction=0.15,
            n_iter_no_change=15,
            random_state=int(self.params["seed"]),
        ).fit(x, y)
        # inference: components on all of the data, features as of its end
        self.components = self._fit_components(data)
        end = data.end_time + pd.Timedelta(microseconds=1)
        self.user_activity, self.item_activity = activity_features(data, end)
        self.user_category, self.item_category = category_affinity(data, end)
        if u_cat.shape[1] == 0:  # keep the feature set the ranker was trained on
            self.user_category = sp.csr_matrix((data.n_users, 0), dtype=np.float32)
        self.user_external, self.item_external = self._external(data, end)

    def refresh_features(self, provider: FeatureProvider, at: pd.Timestamp) -> None:
        """Replace the stored provider features by values as of ``at`` (before batch scoring)."""
        if not (self.external_user_names or self.external_item_names):
            return
        users_df, items_df = provider(self.user_ids, self.item_ids, at)
        self.user_external = users_df.reindex(
            index=pd.Index(self.user_ids), columns=self.external_user_names).to_numpy(np.float32)
        self.item_external = items_df.reindex(
            index=pd.Index(self.item_ids), columns=self.external_item_names).to_numpy(np.float32)

    # ------------------------------------------------------------------ scoring
    def score_users(self, users: np.ndarray) -> np.ndarray:
        users = np.asarray(users, dtype=np.int64)
        out = np.full((len(users), self.n_items), -np.inf, dtype=np.float32)
        if not len(users):
            return out
        order = np.argsort(users, kind="stable")
        sorted_users = users[order]
        uniq = np.unique(sorted_users)
        pu, pi, ranks = self._candidates(self.components, uniq)
        if not len(pu):
            return out
        x = self._features(self.components, pu, pi, ranks, self.user_activity, self.item_activity,
                           self.user_external, self.item_external, self.user_category, self.item_category)
        p = self.ranker.predict_proba(x)[:, 1].astype(np.float32)
        dense = np.full((len(uniq), self.n_items), -np.inf, dtype=np.float32)
        dense[np.searchsorted(uniq, pu), pi] = p
        return dense[np.searchsorted(uniq, users)]

    def feature_importance(self) -> dict[str, float]:
        """Number of splits per feature: a cheap look at what the re-ranker uses."""
        counts = np.zeros(len(self.feature_names))
        for trees in getattr(self.ranker, "_predictors", []):
            for tree in trees:
                nodes = tree.nodes
                feats = nodes["feature_idx"][~nodes["is_leaf"].astype(bool)]
                np.add.at(counts, feats, 1)
        return dict(zip(self.feature_names, counts.tolist(), strict=True))

    # ------------------------------------------------------------------ persistence
    def _state(self) -> dict[str, Any]:
        return {
            "user_activity": self.user_activity,
            "item_activity": self.item_activity,
            "user_external": self.user_external,
            "item_external": self.item_external,
            "user_category": self.user_category,
            "item_category": self.item_category,
        }

    def _load_state(self, arrays: dict[str, Any]) -> None:
        for name in ("user_activity", "item_activity", "user_external", "item_external",
                     "user_category", "item_category"):
            setattr(self, name, arrays[name])

    def _extra_save(self, path: Path) -> None:
        import json

        for kind, model in self.components.items():
            model.save(path / "components" / kind)
        # scikit-learn estimators persist with pickle (the format sklearn documents);
        # the file never leaves the model artifact that this package wrote.
        (path / "ranker.pkl").write_bytes(pickle.dumps(self.ranker, protocol=5))
        (path / "ltr.json").write_text(json.dumps({
            "feature_names": self.feature_names,
            "external_user_names": self.external_user_names,
            "external_item_names": self.external_item_names,
            "components": list(self.components),
        }))

    def _extra_load(self, path: Path) -> None:
        import json

        meta = json.loads((path / "ltr.json").read_text())
        self.feature_names = meta["feature_names"]
        self.external_user_names = meta["external_user_names"]
        self.external_item_names = meta["external_item_names"]
        self.components = {kind: Recommender.load(path / "components" / kind) for kind in meta["components"]}
        self.ranker = pickle.loads((path / "ranker.pkl").read_bytes())  # noqa: S301 - own artifact
