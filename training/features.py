"""Ranking features from Feast: point-in-time correct rows for (user, item, timestamp).

:func:`ranking_features` is the general form: an entity frame of ``user_id``,
``item_id`` and ``event_timestamp`` rows in, the feature service's features (as
known at each row's timestamp, never later) out, through Feast's
``get_historical_features`` over the offline store's snapshots.

The re-ranker needs the same user features for many items and the same item
features for many users, at one time. :func:`feast_feature_provider` therefore
asks Feast for ``max(users, items)`` rows that pair every user and every item at
least once and splits the answer back into a per-user and a per-item table -- one
retrieval instead of users x items rows, with the same point-in-time semantics.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pipelines.settings import Settings
from training.models.ltr import FeatureProvider

__all__ = ["ranking_features", "entity_features", "numeric_features", "snapshot_entities", "feast_feature_provider"]

_log = logging.getLogger(__name__)


def ranking_features(store: Any, rows: pd.DataFrame, service: str) -> pd.DataFrame:
    """Feature-service values for each (user_id, item_id, event_timestamp) row.

    Column names are ``<feature_view>__<feature>`` (Feast's full feature names), so
    user and item features with the same name (``views_1h``) stay apart.
    """
    missing = {"user_id", "item_id", "event_timestamp"} - set(rows.columns)
    if missing:
        raise ValueError(f"entity rows need columns user_id, item_id, event_timestamp; missing {sorted(missing)}")
    entity_df = rows[["user_id", "item_id", "event_timestamp"]].copy()
    entity_df["event_timestamp"] = pd.to_datetime(entity_df["event_timestamp"], utc=True)
    job = store.get_historical_features(
        entity_df=entity_df,
        features=store.get_feature_service(service),
        full_feature_names=True,
    )
    with warnings.catch_warnings():
        # dask (under Feast's file offline store) warns about pandas downcasting on every join
        warnings.simplefilter("ignore", FutureWarning)
        return job.to_df()


def numeric_features(frame: pd.DataFrame, at: pd.Timestamp) -> pd.DataFrame:
    """Model-ready columns: numbers as float, timestamps as hours before ``at``; the rest dropped."""
    out = {}
    for col in frame.columns:
        values = frame[col]
        if pd.api.types.is_bool_dtype(values) or pd.api.types.is_numeric_dtype(values):
            out[col] = values.astype(float)
        elif pd.api.types.is_datetime64_any_dtype(values):
            ts = pd.to_datetime(values, utc=True)
            out[f"{col}_hours_ago"] = (at - ts).dt.total_seconds() / 3600.0
    return pd.DataFrame(out, index=frame.index)


def entity_features(
    store: Any, user_ids: Sequence[str], item_ids: Sequence[str], at: pd.Timestamp, service: str,
    *, user_view: str = "user_activity", item_view: str = "item_stats",
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per-user and per-item feature tables as of ``at`` (one Feast retrieval, see module doc)."""
    users = np.asarray(user_ids, dtype=object)
    items = np.asarray(item_ids, dtype=object)
    n = max(len(users), len(items))
    if n == 0:
        return pd.DataFrame(), pd.DataFrame()
    at = pd.Timestamp(at)
    at = at.tz_localize("UTC") if at.tzinfo is None else at.tz_convert("UTC")
    rows = pd.DataFrame({
        "user_id": users[np.arange(n) % max(len(users), 1)] if len(users) else "",
        "item_id": items[np.arange(n) % max(len(items), 1)] if len(items) else "",
        "event_timestamp": at,
    })
    result = ranking_features(store, rows, service)
    user_cols = [c for c in result.columns if c.startswith(f"{user_view}__")]
    item_cols = [c for c in result.columns if c.startswith(f"{item_view}__")]
    user_df = numeric_features(result[["user_id", *user_cols]].drop_duplicates("user_id").set_index("user_id"), at)
    item_df = numeric_features(result[["item_id", *item_cols]].drop_duplicates("item_id").set_index("item_id"), at)
    return user_df, item_df


def snapshot_entities(path: str, join_key: str) -> set[str]:
    """The entity ids that have at least one row in a snapshot folder (one column read)."""
    import pyarrow.dataset as ds

    table = ds.dataset(path, format="parquet", partitioning="hive").to_table(columns=[join_key])
    return set(table.column(join_key).unique().to_pylist())


def feast_feature_provider(settings: Settings, service: str | None = None) -> FeatureProvider:
    """A :data:`~training.models.ltr.FeatureProvider` backed by Feast's offline store.

    Raises ``FileNotFoundError`` when there are no feature snapshots yet (nothing to
    retrieve) and ``ImportError`` when Feast is not installed, so callers can go on
    without external features and say so.
    """
    from pipelines.feast_store import feature_store
    from pipelines.offline_store import snapshot_path

    service = service or settings.train_feature_service
    for view in ("user_activity", "item_stats"):
        path = snapshot_path(settings, view)
        if settings.is_local_data_dir and not any(Path(path).rglob("*.parquet")):
            raise FileNotFoundError(f"no Feast feature snapshots at {path} (run `shopstream backfill`)")
    store = feature_store(settings)
    store.get_feature_service(service)  # fail early on an unknown service
    # Feast's file (dask) offline store cannot sort a join in which an entity has no
    # snapshot row at all (a null `created`), so only entities with snapshots are
    # asked for; the others simply have no features (NaN for the re-ranker).
    known_users = snapshot_entities(snapshot_path(settings, "user_activity"), "user_id")
    known_items = snapshot_entities(snapshot_path(settings, "item_stats"), "item_id")

    def provide(user_ids: np.ndarray, item_ids: np.ndarray, at: pd.Timestamp) -> tuple[pd.DataFrame, pd.DataFrame]:
        users = [u for u in map(str, user_ids) if u in known_users]
        items = [i for i in map(str, item_ids) if i in known_items]
        _log.info("feast: %s features for %d of %d users, %d of %d items as of %s",
                  service, len(users), len(user_ids), len(items), len(item_ids), at)
        if not users or not items:
            return pd.DataFrame(index=pd.Index([], name="user_id")), pd.DataFrame(index=pd.Index([], name="item_id"))
        return entity_features(store, users, items, at, service)

    return provide
