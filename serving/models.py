"""Response models shared by the in-process client and the HTTP API.

The client returns these objects and the API serializes the same objects, so a
notebook and a storefront see one shape. Every answer names the live model
version, whether it is ``degraded`` (served from memory because Redis was
unreachable) and how fresh the data behind it was.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "Source",
    "Freshness",
    "RankedItem",
    "TopItemsResponse",
    "RecommendationsResponse",
    "SimilarItemsResponse",
    "HealthResponse",
    "ReadyResponse",
    "ErrorResponse",
    "ParamError",
]

Source = Literal[
    "model",
    "trending",
    "top_sellers_category_region",
    "top_sellers_category",
    "top_sellers_region",
    "top_sellers_global",
]
"""Where an item came from: the live model's candidates, the user's regional trending
list, or a top-sellers list of the named scope (fallbacks and cold start)."""


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Freshness(_Model):
    """How old one input of the answer was when it was served."""

    as_of: datetime | None = Field(
        description="When the input was last computed (UTC); null when unknown."
    )
    age_ms: int | None = Field(description="Milliseconds between as_of and serving; null when unknown.")


class RankedItem(_Model):
    """One item of an answer; the list order is the ranking."""

    item_id: str
    score: float = Field(
        description="The score from the item's source (model score, units sold, trending "
        "score, similarity); comparable only within one source."
    )
    source: Source


class _Answer(_Model):
    model_version: str | None = Field(
        description="The live model version when the answer was built (null: no model live)."
    )
    degraded: bool = Field(
        default=False,
        description="True when Redis could not be read in time and the answer comes from "
        "the last known top sellers kept in memory.",
    )
    freshness: dict[str, Freshness] = Field(
        default_factory=dict,
        description="Age of each input, by name: `top_sellers` / `trending` lists and the "
        "top-sellers scopes used, the user's `user_activity` features, `model` (when the live "
        "version was switched in), `memory` (when degraded: when it was last read from Redis).",
    )
    items: list[RankedItem]


class TopItemsResponse(_Answer):
    """Top sellers or trending items of one window and scope."""

    kind: Literal["top_sellers", "trending"]
    window: str
    scope: str = Field(description="global, category, region or category_region.")
    category: str | None = None
    region: str | None = None


class RecommendationsResponse(_Answer):
    """A user's recommendations, re-ranked with their fresh features."""

    user_id: str
    known_user: bool = Field(
        description="True when the live model has candidates for the user; false means "
        "the items are top sellers from the user's recent categories and region, then global."
    )


class SimilarItemsResponse(_Answer):
    """Items similar to one item (or, when the model has none, top sellers of its category)."""

    item_id: str


class HealthResponse(_Model):
    status: Literal["ok"] = "ok"


class ReadyResponse(_Model):
    status: Literal["ready", "not_ready"]
    redis: bool = Field(description="Redis answered a PING within the deadline.")
    model_version: str | None = Field(description="The live model pointer, if present.")
    detail: str | None = None


class ParamError(_Model):
    param: str
    message: str


class ErrorResponse(_Model):
    """Every error body: a stable, human-readable ``detail``; ``errors`` lists bad parameters."""

    detail: str
    errors: list[ParamError] | None = None
