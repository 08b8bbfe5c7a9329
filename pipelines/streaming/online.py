"""The stream's online path for one micro-batch: tiles -> features -> Redis (+ snapshots).

Called from the micro-batch query's ``foreachBatch`` with the batch's on-time
events and the event-time clock ``T`` after the batch:

1. tile deltas of the events (:mod:`features.tiles`), merged into the tile
   store in Redis, idempotently per batch (:class:`pipelines.stream_state.TileStore`);
2. features of every touched user and item as of ``T``
   (:func:`features.windows.finalize_user_features` / ``finalize_item_features``),
   written in Feast's Redis layout (:mod:`pipelines.online_writer`), event
   timestamp ``T``;
3. top sellers and trending of every scope, as of ``T``, from the sales tiles of
   the 24h window (:func:`features.windows.finalize_top_items`), replaced
   atomically -- when the batch had purchases or the window slid;
4. item metadata (category, region, latest price);
5. when ``T`` entered a new tile (the slide cadence): feature snapshots to the
   offline store of every entity touched since the previous snapshot, as of
   ``T``, in the backfill's format (:func:`pipelines.offline_store.write_snapshots`).

The same finalize functions run in the backfill, so a streamed value and a
batch recomputation over the same events agree (``shopstream verify``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, Any

from features.feast_layout import ITEM_STATS, USER_ACTIVITY
from features.tiles import item_metadata, item_tiles, sales_tiles, user_tiles
from features.windows import (
    LONG_WINDOW,
    WINDOW_SECONDS,
    finalize_item_features,
    finalize_top_items,
    finalize_user_features,
)
from pipelines import offline_store, online_writer
from pipelines.connections import redis_client, redis_kwargs
from pipelines.settings import Settings
from pipelines.stream_state import ITEM, USER, TileStore

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from pipelines.stream_state import BatchLog

__all__ = ["OnlineFeatures", "DIRTY_TTL_SECONDS"]

log = logging.getLogger(__name__)

DIRTY_TTL_SECONDS = 24 * 3600
"""TTL of the per-tile sets of touched entities (snapshots read them within a slide)."""


def _write_entities_partition(rows: Iterator[Any], *, redis_kwargs: dict[str, Any],
                              ttl_seconds: int) -> None:
    """One partition of (kind, user | item | meta) rows -> the online writer's pipelined writes."""
    import redis

    buckets: dict[str, list[Any]] = {USER_ACTIVITY.name: [], ITEM_STATS.name: [], "item_meta": []}
    for row in rows:
        kind = row["kind"]
        column = {USER_ACTIVITY.name: "user", ITEM_STATS.name: "item"}.get(kind, "meta")
        buckets[kind].append(row[column])
    client = redis.Redis(**redis_kwargs)
    try:
        for spec in (USER_ACTIVITY, ITEM_STATS):
            if buckets[spec.name]:
                online_writer.write_entity_rows(client, spec, buckets[spec.name],
                                                ttl_seconds=ttl_seconds)
        if buckets["item_meta"]:
            online_writer.write_item_metadata(client, buckets["item_meta"],
                                              ttl_seconds=ttl_seconds)
    finally:
        client.close()


def _as_datetime(us: int) -> datetime:
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=us)


class OnlineFeatures:
    """Per-batch online update (see the module docstring); lives on the driver."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.slide = settings.feature_slide_seconds
        self.store = TileStore(
            redis_kwargs(settings, timeout_ms=max(settings.redis_socket_timeout_ms, 10_000)),
            slide_seconds=self.slide,
            last_items_n=settings.feature_last_items_n,
            long_window_seconds=WINDOW_SECONDS[LONG_WINDOW],
            ttl_seconds=settings.online_ttl_seconds,
            dirty_ttl_seconds=DIRTY_TTL_SECONDS,
        )

    def apply(self, spark: SparkSession, events: DataFrame, *, batch_id: int, as_of_us: int,
              prev_as_of_us: int | None, has_events: bool, has_purchases: bool,
              snapshot_tile: int | None, snapshots: bool,
              batch_log: BatchLog | None = None) -> int | None:
        """Update Redis for one batch; returns the tile of the latest snapshot.

        Parameters
        ----------
        events
            The batch's on-time, deduplicated, valid events.
        as_of_us, prev_as_of_us
            The clock ``T`` after this batch and after the previous one (epoch µs).
        has_events, has_purchases
            Whether ``events`` has rows / purchases (known from the batch's stats).
        snapshot_tile
            Tile of the clock at the previous snapshot (``None``: none yet).
        """
        s = self.settings
        current = self.store.tile_of(as_of_us)
        prev_tile = self.store.tile_of(prev_as_of_us) if prev_as_of_us is not None else None
        slid = prev_tile != current
        due = snapshots and snapshot_tile is not None and current > snapshot_tile
        if snapshot_tile is None:
            snapshot_tile = current
        if not has_events and not slid and not due:
            return snapshot_tile

        as_of = _as_datetime(as_of_us)
        extra = None
        if due:
            assert snapshot_tile is not None
            first = max(snapshot_tile, current - WINDOW_SECONDS[LONG_WINDOW])
            generations = range(first, current + 1, self.slide)
            extra = self.store.dirty_entities(spark, USER.name, generations).unionByName(
                self.store.dirty_entities(spark, ITEM.name, generations))

        merged = self.store.apply(
            spark, batch_id=batch_id, as_of_us=as_of_us, prev_as_of_us=prev_as_of_us,
            user_delta=user_tiles(events, slide_seconds=self.slide,
                                  last_items_n=s.feature_last_items_n),
            item_delta=item_tiles(events, slide_seconds=self.slide),
            sales_delta=sales_tiles(events, slide_seconds=self.slide),
            extra_keys=extra,
        )
        cached: list[DataFrame] = []
        try:
            users = finalize_user_features(merged.users, as_of, slide_seconds=self.slide,
                                           last_items_n=s.feature_last_items_n)
            items = finalize_item_features(merged.items, as_of, slide_seconds=self.slide)
            if due:
                users, items = users.persist(), items.persist()
                cached += [users, items]
            self._write_entities(users, items, item_metadata(events) if has_events else None)
            top = None
            if has_purchases or slid or due:
                top = finalize_top_items(merged.sales, as_of, slide_seconds=self.slide,
                                         top_n=s.feature_top_n).persist()
                cached.append(top)
                self._write_top(top)
            if due:
                self._snapshot(users, items, top, batch_id, batch_log)
                snapshot_tile = current
        finally:
            for frame in cached:
                frame.unpersist()
            merged.release()
        return snapshot_tile

    def _write_entities(self, users: DataFrame, items: DataFrame,
                        metadata: DataFrame | None) -> None:
        """User and item features (Feast layout) and item metadata, in one Spark job."""
        from pyspark.sql import functions as F

        frames = [
            users.select(F.lit(USER_ACTIVITY.name).alias("kind"),
                         F.struct(USER_ACTIVITY.join_key, *USER_ACTIVITY.feature_names,
                                  "event_timestamp").alias("user")),
            items.select(F.lit(ITEM_STATS.name).alias("kind"),
                         F.struct(ITEM_STATS.join_key, *ITEM_STATS.feature_names,
                                  "event_timestamp").alias("item")),
        ]
        if metadata is not None:
            frames.append(metadata.select(F.lit("item_meta").alias("kind"),
                                          F.struct("*").alias("meta")))
        rows = frames[0]
        for frame in frames[1:]:
            rows = rows.unionByName(frame, allowMissingColumns=True)
        rows.foreachPartition(partial(
            _write_entities_partition,
            redis_kwargs=redis_kwargs(self.settings,
                                      timeout_ms=max(self.settings.redis_socket_timeout_ms, 10_000)),
            ttl_seconds=self.settings.online_ttl_seconds))

    def _write_top(self, top: DataFrame) -> None:
        """Replace every top list at once (small: scopes x N rows, collected)."""
        rows = top.collect()
        if not rows:
            return
        client = redis_client(self.settings, timeout_ms=max(self.settings.redis_socket_timeout_ms,
                                                             10_000))
        try:
            online_writer.write_top_items(client, rows, top_n=self.settings.feature_top_n,
                                          prune=True)
        finally:
            client.close()

    def _snapshot(self, users: DataFrame, items: DataFrame, top: DataFrame | None,
                  batch_id: int, batch_log: BatchLog | None) -> None:
        """Append the snapshot rows; a replayed batch that finds its marker skips this."""
        if batch_log is not None and batch_log.marked("snapshot", batch_id):
            return
        offline_store.write_snapshots(users, self.settings, USER_ACTIVITY.name)
        offline_store.write_snapshots(items, self.settings, ITEM_STATS.name)
        if top is not None:
            offline_store.write_snapshots(top, self.settings, "top_items")
        if batch_log is not None:
            batch_log.mark("snapshot", batch_id)
