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

from collections.abc import Sequence
from typing import Any, Protocol

from pipelines.settings import Settings
from serving.rerank import UserFeatures

__all__ = ["Cmd", "UserFeatureReader", "NoUserFeatures", "FeastUserFeatures", "default_reader"]

Cmd = tuple[Any, ...]
"""One Redis command as its raw arguments, e.g. ``("HMGET", key, field, ...)``; its reply
reaches the flow unparsed (bytes, lists of bytes, ``None``)."""


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


class FeastUserFeatures:
    """Reads ``user_activity`` straight from Feast's Redis layout with one ``HMGET``.

    The layout (key, field hashes, value protos) comes from
    :mod:`features.feast_layout`, the module the online writer encodes with;
    ``tests/integration/test_serving_features.py`` checks that what this
    reader returns equals ``FeatureStore.get_online_features``.

    Optional features are read when the view declares them:
    ``last_purchased_items`` (removes recent purchases) and ``region`` (the
    user's region for trending and cold start).
    """

    _WANTED = (
        "views_1h", "carts_1h", "purchases_1h", "last_event_time", "top_category",
        "category_affinity_ids", "category_affinity_weights", "last_viewed_items",
    )
    _OPTIONAL = ("last_purchased_items", "region")

    def __init__(self, spec: Any = None, project: str | None = None) -> None:
        from features import feast_layout

        self._layout = feast_layout
        self.spec = spec or feast_layout.USER_ACTIVITY
        self.project = project or feast_layout.PROJECT
        self.name = self.spec.name
        kinds = dict(self.spec.features)
        names = [n for n in self._WANTED if n in kinds] + [n for n in self._OPTIONAL if n in kinds]
        self._names: tuple[str, ...] = tuple(names)
        self._kinds = tuple(kinds[n] for n in names)
        self._fields: list[bytes] = [feast_layout.feature_field(self.name, n) for n in names]
        self._fields.append(feast_layout.timestamp_field(self.name))

    def command(self, user_id: str) -> Cmd:
        return ("HMGET", self.spec.redis_key(user_id, self.project), *self._fields)

    def decode(self, raw: Sequence[bytes | None] | None) -> UserFeatures | None:
        if not raw or raw[-1] is None:
            return None  # no row for this user (the timestamp is written with every row)
        from google.protobuf.timestamp_pb2 import Timestamp

        decode = self._layout.decode_value
        values = {name: decode(kind, data)
                  for name, kind, data in zip(self._names, self._kinds, raw, strict=False)}
        as_of = Timestamp.FromString(raw[-1]).ToMilliseconds()
        last_event = values.get("last_event_time")
        events_1h = sum(int(values.get(n) or 0) for n in ("views_1h", "carts_1h", "purchases_1h"))
        ids = values.get("category_affinity_ids") or []
        weights = values.get("category_affinity_weights") or []
        return UserFeatures(
            as_of_ms=as_of,
            last_event_time_ms=int(last_event.timestamp() * 1000) if last_event is not None else None,
            events_1h=events_1h,
            top_category=values.get("top_category") or None,
            category_affinity=tuple(zip(ids, (float(w) for w in weights), strict=False)),
            last_items_viewed=tuple(values.get("last_viewed_items") or ()),
            recent_purchases=tuple(values.get("last_purchased_items") or ()),
            region=values.get("region") or None,
        )


def default_reader(settings: Settings) -> UserFeatureReader:
    """The reader serving uses unless told otherwise: Feast's layout of ``user_activity``."""
    try:
        return FeastUserFeatures()
    except ImportError:  # pragma: no cover - feast is a core dependency
        return NoUserFeatures()
