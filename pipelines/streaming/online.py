"""The stream's online path for one micro-batch: tiles -> features -> Redis (+ snapshots).

Called from the micro-batch query's ``foreachBatch`` with the batch's on-time
events and the event-time clock ``T`` after the batch:

1. one Spark job: the batch's tiles (:func:`features.tiles.keyed_tiles`, one
   aggregation partitioned by key, handed to Python as Arrow) merged into the
   tile store in Redis idempotently per batch, and the touched users' and
   items' features as of ``T`` written in Feast's layout
   (:class:`pipelines.stream_state.TileStore`), with item metadata;
2. when the batch had purchases or the window slid: the top sellers and trending
   lists of every scope, recomputed from a base over the window's closed tiles
   plus its open ones (:func:`pipelines.stream_state.top_partition`) and replaced
   atomically (:func:`pipelines.online_writer.write_top_items`). This runs on the
   driver beside the *next* micro-batch (:meth:`OnlineFeatures.finish_top`): it
   was a third of a small batch's time, and the features of step 1, which the
   batch's freshness is about, are written before it;
3. when ``T`` entered a new tile (the slide cadence): the features as of ``T``
   of every entity touched since the previous snapshot, and the top lists, go to
   the offline store in the backfill's format (:func:`pipelines.offline_store.write_snapshots`).

The feature rules are :mod:`features.windows`' (their Python twin runs on the
executors, :mod:`pipelines.streaming.pyfeatures`), so a streamed value and the
backfill's recomputation over the same events agree (``shopstream verify``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from features.feast_layout import ITEM_STATS, USER_ACTIVITY, ViewSpec
from features.windows import LONG_WINDOW, TOP_ITEM_COLUMNS, WINDOW_SECONDS
from pipelines import offline_store
from pipelines.connections import redis_kwargs
from pipelines.settings import Settings
from pipelines.spark import inheriting
from pipelines.stream_state import ITEM, JSON_OPTIONS, USER, TileStore, release

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from pipelines.stream_state import BatchLog

__all__ = ["OnlineFeatures", "DIRTY_TTL_SECONDS", "view_schema"]

log = logging.getLogger(__name__)

DIRTY_TTL_SECONDS = 24 * 3600
"""TTL of the per-tile sets of touched entities (snapshots read them within a slide)."""
_SPARK_TYPES = {"int64": "bigint", "double": "double", "string": "string",
                "timestamp": "timestamp", "string_list": "array<string>",
                "double_list": "array<double>"}
_TOP_SCHEMA = ("kind string, window string, category_id string, region string, item_id string, "
               "score double, rank int, event_timestamp timestamp")


def view_schema(spec: ViewSpec) -> str:
    """DDL of a feature view's rows: join key, features, event timestamp."""
    cols = [f"{spec.join_key} string"]
    cols += [f"{name} {_SPARK_TYPES[kind]}" for name, kind in spec.features]
    cols.append("event_timestamp timestamp")
    return ", ".join(cols)


class OnlineFeatures:
    """Per-batch online update (see the module docstring); lives on the driver."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.slide = settings.feature_slide_seconds
        self.store = TileStore(
            redis_kwargs(settings, timeout_ms=max(settings.redis_socket_timeout_ms, 10_000)),
            slide_seconds=self.slide,
            last_items_n=settings.feature_last_items_n,
            top_n=settings.feature_top_n,
            long_window_seconds=WINDOW_SECONDS[LONG_WINDOW],
            ttl_seconds=settings.online_ttl_seconds,
            dirty_ttl_seconds=DIRTY_TTL_SECONDS,
        )
        self._top_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="top-lists")
        self._pending_top: Future[None] | None = None
        self._top_redo = True  # a new process redoes the lists: a crash may have lost a run

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
        force_top = self.finish_top()
        current = self.store.tile_of(as_of_us)
        prev_tile = self.store.tile_of(prev_as_of_us) if prev_as_of_us is not None else None
        slid = prev_tile != current
        due = snapshots and snapshot_tile is not None and current > snapshot_tile
        if snapshot_tile is None:
            snapshot_tile = current
        if not has_events and not slid and not due and not force_top:
            return snapshot_tile

        extra = None
        if due:
            first = max(snapshot_tile, current - WINDOW_SECONDS[LONG_WINDOW])
            generations = range(first, current + 1, self.slide)
            extra = self.store.dirty_entities(spark, USER, generations).unionByName(
                self.store.dirty_entities(spark, ITEM, generations))
        # tiles before the one of the late cut (previous clock - allowed lateness) are
        # final: no later batch accepts an event for them
        open_from = None if prev_as_of_us is None else self.store.tile_of(
            prev_as_of_us - self.settings.feature_allowed_lateness_seconds * 1_000_000)
        emitted = None
        if has_events or slid or due:
            emitted = self.store.apply(spark, events, batch_id=batch_id, as_of_us=as_of_us,
                                       extra_keys=extra, emit=due, open_from=open_from)
        top = None
        # the snapshot's Parquet writes are small jobs that mostly wait (planning, task
        # launch, commit): they run beside each other and beside the top-list task
        pool = ThreadPoolExecutor(max_workers=3, thread_name_prefix="snapshot") if due else None
        try:
            writes = []
            snapshot = due and not (batch_log is not None and batch_log.marked("snapshot", batch_id))
            if snapshot and pool is not None:
                writes = [pool.submit(inheriting(spark, self._write_view), emitted, spec)
                          for spec in (USER_ACTIVITY, ITEM_STATS)]
            if due:
                top = self.store.write_top(spark, batch_id=batch_id, as_of_us=as_of_us, emit=True,
                                           open_from=open_from)
                self._top_redo = False
            elif has_purchases or slid or force_top:
                self.submit_top(self.store.write_top_here, batch_id=batch_id, as_of_us=as_of_us,
                                open_from=open_from)
            if snapshot and pool is not None and top is not None:
                writes.append(pool.submit(inheriting(spark, self._write_top), spark, top))
            for write in writes:
                write.result()
            if due:
                if snapshot and batch_log is not None:
                    batch_log.mark("snapshot", batch_id)  # a replay of this batch skips it
                snapshot_tile = current
        finally:
            if pool is not None:
                pool.shutdown(wait=True)
            if emitted is not None:
                release(emitted)
            if top is not None:
                top.unpersist()
        return snapshot_tile

    def finish_top(self) -> bool:
        """Wait for the top lists of the previous batch; True when they must be redone.

        A batch's top lists (unless it writes a snapshot) are recomputed beside the
        next micro-batch, one at a time: the item and user features, which the
        batch's freshness is about, are in Redis before. The lists are a full
        recomputation from the tiles (the base moves in one transaction), so a run
        that was lost (a crash, Redis away for a moment) is simply redone: by the
        first batch of a process, and by the batch after a failed run.
        """
        pending, self._pending_top = self._pending_top, None
        if pending is not None:
            try:
                pending.result()
            except Exception as exc:
                from pipelines.stream import is_redis_outage

                if not is_redis_outage(exc):
                    raise
                log.warning("stream: the previous batch's top lists were not written (Redis "
                            "unreachable: %s); the next batch writes them", exc)
                self._top_redo = True
        return self._top_redo

    def submit_top(self, write: Callable[..., None], **kwargs: Any) -> None:
        """Start a top-list run beside the next batch (after :meth:`finish_top`)."""
        self._pending_top = self._top_pool.submit(write, **kwargs)
        self._top_redo = False  # until the run is seen to fail

    def close(self) -> None:
        """Finish the pending top lists (the query stopped) and free the thread."""
        try:
            self.finish_top()
        finally:
            self._top_pool.shutdown(wait=True)

    def _write_view(self, emitted: Any, spec: ViewSpec) -> None:
        """Append one feature view's snapshot rows (the emitted ``(view, JSON)`` rows)."""
        from pyspark.sql import functions as F

        frame = emitted.where(F.col("view") == spec.name).select(
            F.from_json("value", view_schema(spec), JSON_OPTIONS).alias("r")).select("r.*")
        offline_store.write_snapshots(frame.withColumn("created", F.current_timestamp()),
                                      self.settings, spec.name)

    def _write_top(self, spark: SparkSession, top: Any) -> None:
        """Append the top lists' snapshot rows."""
        from pyspark.sql import functions as F

        frame = spark.createDataFrame(top, "view string, value string").select(
            F.from_json("value", _TOP_SCHEMA, JSON_OPTIONS).alias("r")).select("r.*")
        frame = frame.withColumn("created", F.current_timestamp())
        offline_store.write_snapshots(frame.select(*TOP_ITEM_COLUMNS), self.settings, "top_items")
