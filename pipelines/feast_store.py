"""Feast for shopstream: the definitions (built from paths) and a FeatureStore built from settings.

Feast describes every entity feature once, for both stores:

* entities ``user`` (join key ``user_id``) and ``item`` (``item_id``);
* file sources over the offline feature snapshots
  (:func:`pipelines.offline_store.snapshot_path`: ``features/user_activity``,
  ``features/item_stats``; ``event_timestamp`` + ``created`` columns);
* push sources ``user_activity_push`` / ``item_stats_push`` backed by them (the
  stream can push through Feast; the fast path writes the same Redis layout
  itself, :mod:`pipelines.online_writer`);
* feature views ``user_activity`` and ``item_stats`` (:data:`FEATURE_VIEW_TTL`),
  whose schemas are generated from :mod:`features.feast_layout`, the same specs
  the online writer encodes with;
* the feature service ``ranking_v1`` for the ranking model (a new model that
  needs other features gets ``ranking_v2``; ``v1`` stays for the model in use).

:func:`feature_store` builds the :class:`feast.RepoConfig` from
:class:`~pipelines.settings.Settings` -- registry file under the data dir, Redis
connection string with password / ACL user / TLS from settings, file offline
store -- and applies the definitions, so nothing reads ``os.environ`` but
Settings. The ``feast`` CLI instead reads ``feature_repo/feature_store.yaml``
(``${ENV}`` substitution) and ``feature_repo/definitions.py``; print the
variables it needs with::

    eval "$(python -m pipelines.feast_store env)"
    cd feature_repo && feast apply && feast feature-views list
"""

from __future__ import annotations

import shlex
import sys
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from features.feast_layout import (
    ENTITY_KEY_SERIALIZATION_VERSION,
    ITEM_STATS,
    PROJECT,
    USER_ACTIVITY,
    FeatureKind,
    ViewSpec,
)
from pipelines.offline_store import snapshot_path
from pipelines.settings import Settings

if TYPE_CHECKING:
    from feast import FeatureStore, RepoConfig

__all__ = [
    "FEATURE_VIEW_TTL",
    "RANKING_SERVICE",
    "RANKING_V1_USER_FEATURES",
    "FeastDefinitions",
    "build_definitions",
    "definitions_for",
    "redis_connection_string",
    "registry_path",
    "repo_config",
    "feature_store",
    "historical_features",
    "cli_environment",
]

FEATURE_VIEW_TTL = timedelta(days=2)
"""How far back a snapshot row stays valid for a point-in-time lookup: the 24h
window plus a day of slack for a slow snapshot cadence (the backfill writes one
all-zero row when an entity leaves the 24h window, so zeros, not stale counts,
are read until then)."""
RANKING_SERVICE = "ranking_v1"
RANKING_V1_USER_FEATURES: tuple[str, ...] = tuple(
    name for name in USER_ACTIVITY.feature_names if name != "last_purchased_items")
"""The ``user_activity`` features of ``ranking_v1``: those the view had when v1 was defined
(``last_purchased_items``, added later for serving, is not in it; a model that needs it gets
``ranking_v2``)."""


def _feast_type(kind: FeatureKind) -> Any:
    from feast.types import Array, Float64, Int64, String, UnixTimestamp

    return {
        "int64": Int64,
        "double": Float64,
        "string": String,
        "timestamp": UnixTimestamp,
        "string_list": Array(String),
        "double_list": Array(Float64),
    }[kind]


class FeastDefinitions(NamedTuple):
    """Every object ``feast apply`` registers for shopstream."""

    user: Any
    item: Any
    user_source: Any
    item_source: Any
    user_push: Any
    item_push: Any
    user_activity: Any
    item_stats: Any
    ranking_v1: Any

    @property
    def objects(self) -> list[Any]:
        return list(self)


def _view(spec: ViewSpec, entity: Any, source: Any, ttl: timedelta) -> Any:
    from feast import FeatureView, Field

    return FeatureView(
        name=spec.name,
        entities=[entity],
        ttl=ttl,
        schema=[Field(name=name, dtype=_feast_type(kind)) for name, kind in spec.features],
        source=source,
        online=True,
        description=spec.description,
        tags={"team": "shopstream", "computed_by": "features.windows"},
    )


def build_definitions(
    user_activity_path: str,
    item_stats_path: str,
    *,
    ttl: timedelta = FEATURE_VIEW_TTL,
) -> FeastDefinitions:
    """Feast objects whose file sources read the given snapshot folders (Parquet, partitioned)."""
    from feast import Entity, FeatureService, FileSource, PushSource, ValueType

    user = Entity(name=USER_ACTIVITY.entity, join_keys=[USER_ACTIVITY.join_key],
                  value_type=ValueType.STRING, description="A shopper (user_id of the events).")
    item = Entity(name=ITEM_STATS.entity, join_keys=[ITEM_STATS.join_key],
                  value_type=ValueType.STRING, description="A catalogue item (item_id).")
    sources = {}
    for spec, path in ((USER_ACTIVITY, user_activity_path), (ITEM_STATS, item_stats_path)):
        sources[spec.name] = FileSource(
            name=f"{spec.name}_snapshots",
            path=path,
            timestamp_field="event_timestamp",
            created_timestamp_column="created",
            description=f"Offline snapshots of {spec.name} (backfill and stream).",
        )
    user_push = PushSource(name=f"{USER_ACTIVITY.name}_push", batch_source=sources[USER_ACTIVITY.name])
    item_push = PushSource(name=f"{ITEM_STATS.name}_push", batch_source=sources[ITEM_STATS.name])
    user_activity = _view(USER_ACTIVITY, user, user_push, ttl)
    item_stats = _view(ITEM_STATS, item, item_push, ttl)
    ranking_v1 = FeatureService(
        name=RANKING_SERVICE,
        features=[user_activity[list(RANKING_V1_USER_FEATURES)], item_stats],
        description="Features of the ranking model, version 1 (user activity + item stats).",
        tags={"model": "ranking", "version": "1"},
    )
    return FeastDefinitions(user, item, sources[USER_ACTIVITY.name], sources[ITEM_STATS.name],
                            user_push, item_push, user_activity, item_stats, ranking_v1)


def definitions_for(settings: Settings) -> FeastDefinitions:
    """:func:`build_definitions` over this deployment's snapshot folders."""
    return build_definitions(
        snapshot_path(settings, USER_ACTIVITY.name), snapshot_path(settings, ITEM_STATS.name)
    )


def redis_connection_string(settings: Settings) -> str:
    """Feast's ``host:port,db=N[,username=..,password=..,ssl=true,...]`` from settings.

    Feast splits it on commas and ``=``, so a password containing a comma cannot
    be expressed; that is rejected here rather than misparsed.
    """
    host, port = settings.redis_address
    parts = [f"{host}:{port}", f"db={settings.redis_db}"]
    secret = settings.redis_secret()
    if settings.redis_username:
        parts.append(f"username={settings.redis_username}")
    if secret:
        if "," in secret:
            raise ValueError("a Redis password containing ',' cannot be passed to Feast")
        parts.append(f"password={secret}")
    if settings.redis_tls:
        parts.append("ssl=true")
        parts.append(f"ssl_cert_reqs={'required' if settings.redis_tls_ca_cert else 'none'}")
        for name, value in (("ssl_ca_certs", settings.redis_tls_ca_cert),
                            ("ssl_certfile", settings.redis_tls_cert),
                            ("ssl_keyfile", settings.redis_tls_key)):
            if value:
                parts.append(f"{name}={value}")
    return ",".join(parts)


def registry_path(settings: Settings) -> str:
    """The Feast registry file, under the data dir."""
    return settings.data_path("feast", "registry.db")


def repo_config(settings: Settings) -> RepoConfig:
    """The :class:`feast.RepoConfig` equivalent of ``feature_repo/feature_store.yaml``."""
    from feast import RepoConfig
    from feast.repo_config import RegistryConfig

    registry = registry_path(settings)
    if settings.is_local_data_dir:
        Path(registry).parent.mkdir(parents=True, exist_ok=True)
    return RepoConfig(
        project=PROJECT,
        provider="local",
        registry=RegistryConfig(registry_type="file", path=registry, cache_ttl_seconds=60),
        online_store={
            "type": "redis",
            "connection_string": redis_connection_string(settings),
            "key_ttl_seconds": settings.online_ttl_seconds,
        },
        offline_store={"type": "file"},
        entity_key_serialization_version=ENTITY_KEY_SERIALIZATION_VERSION,
        repo_path=Path(__file__).resolve().parent.parent / "feature_repo",
    )


def feature_store(settings: Settings, *, apply: bool = True) -> FeatureStore:
    """A :class:`feast.FeatureStore` for these settings; ``apply`` registers the definitions.

    ``apply`` is idempotent (an unchanged definition is a no-op in the registry).
    """
    from feast import FeatureStore

    store = FeatureStore(config=repo_config(settings))
    if apply:
        store.apply(definitions_for(settings).objects)
    return store


def _refs_by_view(store: FeatureStore, features: Any) -> dict[str, list[str]]:
    """``{view: [feature, ...]}`` from a FeatureService, its name, or ``view:feature`` refs."""
    if isinstance(features, str):
        features = store.get_feature_service(features)
    by_view: dict[str, list[str]] = {}
    if hasattr(features, "feature_view_projections"):
        for projection in features.feature_view_projections:
            by_view.setdefault(projection.name_to_use(), []).extend(
                f.name for f in projection.features)
        return by_view
    for ref in features:
        view, _, name = ref.partition(":")
        by_view.setdefault(view, []).append(name)
    return by_view


def historical_features(
    store: FeatureStore,
    entity_df: Any,
    features: Any,
    *,
    full_feature_names: bool = True,
) -> Any:
    """Point-in-time feature values for every row of ``entity_df``, in its order.

    A thin layer over ``FeatureStore.get_historical_features`` that keeps its
    semantics (per row, each view's latest snapshot with ``event_timestamp <=``
    the row's timestamp and within the view's TTL, ties by ``created``) and
    fixes two behaviours of Feast 0.67's file (Dask) offline store that lose
    training rows:

    * rows sharing a view's join key and timestamp are collapsed into one
      (feast-dev/feast#6787), e.g. one user scored against many items at once;
    * a row whose entity has snapshots, but none at or before its timestamp
      within the TTL, is dropped instead of getting nulls.

    So each view is asked once for the *distinct* (join key, timestamp) pairs,
    and its answer is left-joined back: one output row per input row, nulls where
    no snapshot applies, never a value from after the row's timestamp.

    Parameters
    ----------
    store
        From :func:`feature_store`.
    entity_df
        pandas DataFrame with the join keys of the requested views and
        ``event_timestamp``; other columns are kept as they are.
    features
        A FeatureService (or its name, e.g. ``"ranking_v1"``) or ``view:feature`` refs.
    full_feature_names
        Name columns ``view__feature`` (needed when views share feature names).
    """
    import warnings

    import pandas as pd

    out = entity_df.reset_index(drop=True).copy()
    out["event_timestamp"] = pd.to_datetime(out["event_timestamp"], utc=True).astype(
        "datetime64[ns, UTC]")
    for view_name, names in _refs_by_view(store, features).items():
        view = store.get_feature_view(view_name)
        keys = [column.name for column in view.entity_columns]
        pairs = out[[*keys, "event_timestamp"]].drop_duplicates().reset_index(drop=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # dask's pandas downcasting notes
            got = store.get_historical_features(
                entity_df=pairs, features=[f"{view_name}:{n}" for n in names],
                full_feature_names=full_feature_names,
            ).to_df()
        got["event_timestamp"] = pd.to_datetime(got["event_timestamp"], utc=True).astype(
            "datetime64[ns, UTC]")
        columns = [f"{view_name}__{n}" if full_feature_names else n for n in names]
        out = out.merge(got[[*keys, "event_timestamp", *columns]],
                        on=[*keys, "event_timestamp"], how="left")
    return out


def cli_environment(settings: Settings) -> dict[str, str]:
    """The variables ``feature_repo/feature_store.yaml`` substitutes, from settings.

    Contains the Redis password when one is set: meant for ``eval``, not for logs.
    """
    return {
        # absolute, so definitions.py (run with cwd=feature_repo) finds the same snapshots
        "SHOPSTREAM_DATA_DIR": settings.data_path(),
        "FEAST_SHOPSTREAM_REGISTRY": registry_path(settings),
        "FEAST_SHOPSTREAM_REDIS": redis_connection_string(settings),
        "FEAST_SHOPSTREAM_KEY_TTL": str(settings.online_ttl_seconds),
    }


def _main(argv: list[str]) -> int:
    if argv[1:] != ["env"]:
        sys.stderr.write("usage: python -m pipelines.feast_store env\n")
        return 2
    for name, value in cli_environment(Settings()).items():
        sys.stdout.write(f"export {name}={shlex.quote(value)}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv))
