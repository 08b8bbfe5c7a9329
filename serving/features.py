"""Reading a user's entity features inside the serving pipeline.

Entity features live in Feast's own Redis layout (so that
``FeatureStore.get_online_features`` reads them). Serving does not go through
Feast at request time: it adds one ``HMGET`` to its pipelined round trip and
decodes the answer here into :class:`serving.rerank.UserFeatures`.

A :class:`UserFeatureReader` is the seam: ``command(user_id)`` names the Redis
command (or ``None`` when no features are configured) and ``decode(raw)``
turns its reply into features. :class:`NoUserFeatures` is used when the
feature repository is not available, so serving still answers (model order,
no personal boost).
"""

from __future__ import annotations

from typing import Any, Protocol

from pipelines.settings import Settings
from serving.rerank import UserFeatures

__all__ = ["Cmd", "UserFeatureReader", "NoUserFeatures", "default_reader"]

Cmd = tuple[str, tuple[Any, ...]]
"""One Redis command for a pipeline: (method name on the pipeline, positional args)."""


class UserFeatureReader(Protocol):
    """How serving reads one user's ``user_activity`` row within its pipeline."""

    name: str
    """Name of the feature view, used as the freshness entry of answers."""

    def command(self, user_id: str) -> Cmd | None: ...

    def decode(self, raw: Any) -> UserFeatures | None: ...


class NoUserFeatures:
    """A reader for deployments without entity features: reads nothing, knows nothing."""

    name = "user_activity"

    def command(self, user_id: str) -> Cmd | None:
        return None

    def decode(self, raw: Any) -> UserFeatures | None:
        return None


def default_reader(settings: Settings) -> UserFeatureReader:
    """The reader serving uses unless told otherwise."""
    return NoUserFeatures()
