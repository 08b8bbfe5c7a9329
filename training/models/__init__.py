"""Recommenders, each fitted on scipy sparse matrices and fast on two cores.

========================  ====================================================
kind                      model
========================  ====================================================
``popularity``            most popular items (time-decayed): the baseline
``popularity_region``     most popular in the user's region, blended with global
``item_knn``              item-item cosine neighbours (also "similar items")
``ease``                  linear item-item model in closed form (EASE)
``als``                   implicit matrix factorisation (ALS + conjugate gradient)
``ltr``                   gradient-boosted re-ranker over the others' candidates
========================  ====================================================
"""

from __future__ import annotations

from training.models.als import ALS
from training.models.base import Recommender
from training.models.ease import EASE
from training.models.ltr import LearningToRank
from training.models.neighbors import ItemKNN
from training.models.popularity import Popularity, RegionalPopularity

__all__ = [
    "MODELS",
    "BASELINE",
    "Recommender",
    "Popularity",
    "RegionalPopularity",
    "ItemKNN",
    "EASE",
    "ALS",
    "LearningToRank",
    "model_class",
    "make_model",
]

MODELS: dict[str, type[Recommender]] = {
    cls.kind: cls
    for cls in (Popularity, RegionalPopularity, ItemKNN, EASE, ALS, LearningToRank)
}
"""Every model kind, in the order ``--model all`` trains them (the re-ranker last)."""

BASELINE = "popularity"


def model_class(kind: str) -> type[Recommender]:
    """The class for a model kind; raises ``ValueError`` naming the known kinds."""
    try:
        return MODELS[kind]
    except KeyError:
        raise ValueError(f"unknown model {kind!r}; expected one of {sorted(MODELS)}") from None


def make_model(kind: str, **params: object) -> Recommender:
    """An unfitted model of ``kind`` with ``params`` over its defaults."""
    return model_class(kind)(**params)
