"""The stream's online path for one micro-batch: tiles -> features -> Redis (+ snapshots).

Called from the micro-batch query's ``foreachBatch`` with the batch's on-time
events and the event-time clock ``T`` after the batch:

1. one Spark job: the batch's tiles (:func:`pipelines.stream_state.keyed_rows`: the
   rows of :func:`features.tiles.keyed_tiles`, folded per partition by key, handed to
   Python as Arrow) merged into the
   tile store in Redis idempotently per batch, and the touched users' and
   items' features as of ``T`` written in Feast's layout
   (:class:`pipelines.stream_state.TileStore`), with item metadata;
2. when the batch had purchases or the window slid: the top sellers and trending
   lists of every scope, recomputed from a base over the window's closed tiles
   plus its open ones (:func:`pipelines.stream_state.write_top_lists`) and replaced
   atomically (:func:`pipelines.online_writer.write_top_items`). This runs on the
   driver beside the *next* micro-batch (:meth:`OnlineFeatures.finish_top`): it
   was a third of a small batch's time, and the features of step 1, which the
   batch's freshness is about, are written before it;
3. when ``T`` entered a new tile (the slide cadence): a feature snapshot of the
   entities touched since the previous one and of the top lists, read back from
   Redis as serving sees them and appended to the offline store in the backfill's
   format (:mod:`pipelines.streaming.snapshot`). It too runs beside the following
   micro-batches, one at a time, and never holds one up.

The feature rules are :mod:`features.windows`' (their Python twin runs on the
executors, :mod:`pipelines.streaming.pyfeatures`), so a streamed value and the
backfill's recomputation over the same events agree (``shopstream verify``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from features import online_keys
from features.windows import LONG_WINDOW, WINDOW_SECONDS
from pipelines.connections import redis_kwargs
from pipelines.settings import Settings
from pipelines.spark import detached
from pipelines.stream import redis_outage_of
from pipelines.stream_state import DIRTY_TTL_SECONDS, SNAPSHOT_MARK, SnapshotMark, TileStore

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from pipelines.stream_state import BatchLog

__all__ = ["OnlineFeatures"]

log = logging.getLogger(__name__)

_SNAPSHOT_GROUP = "shopstream-snapshot"
"""Spark job group of the snapshot jobs: their own, so stopping the query lets them finish."""


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
        self._snapshot_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="snapshot")
        self._snapshots: list[tuple[Future[None], SnapshotMark, SnapshotMark | None]] = []
        self._snapshot_check = True  # a new process checks that the last snapshot was written
        self._claimed: str | None = None  # the checkpoint run this process recorded in Redis

    def apply(self, spark: SparkSession, events: DataFrame, *, batch_id: int, as_of_us: int,
              prev_as_of_us: int | None, has_events: bool, has_purchases: bool,
              snapshot: SnapshotMark | None, snapshots: bool,
              batch_log: BatchLog | None = None) -> SnapshotMark:
        """Update Redis for one batch; returns the latest snapshot asked for.

        Parameters
        ----------
        events
            The batch's on-time, deduplicated, valid events.
        as_of_us, prev_as_of_us
            The clock ``T`` after this batch and after the previous one (epoch µs).
        has_events, has_purchases
            Whether ``events`` has rows / purchases (known from the batch's stats).
        snapshot
            The latest snapshot asked for before this batch (``None``: none yet).
        """
        force_top = self.finish_top()
        self._check_snapshots(spark, batch_log)
        run = batch_log.run_id() if batch_log is not None else ""
        if run and self._claimed != run:
            self._claim(run)
        current = self.store.tile_of(as_of_us)
        prev_tile = self.store.tile_of(prev_as_of_us) if prev_as_of_us is not None else None
        slid = prev_tile != current
        if snapshot is None:
            snapshot = SnapshotMark(current)
        if self._snapshot_check:
            self._snapshot_check = False
            if (snapshots and snapshot.batch_id is not None and snapshot.first is not None
                    and batch_log is not None
                    and not batch_log.marked(SNAPSHOT_MARK, snapshot.batch_id)):
                log.info("stream: the snapshot asked for by batch %d was not written "
                         "(the process stopped first); writing it now", snapshot.batch_id)
                self._submit_snapshot(spark, batch_log, snapshot, None)
        due = snapshots and current > snapshot.tile
        if not has_events and not slid and not due and not force_top:
            return snapshot

        # tiles before the one of the late cut (previous clock - allowed lateness) are
        # final: no later batch accepts an event for them
        open_from = None if prev_as_of_us is None else self.store.tile_of(
            prev_as_of_us - self.settings.feature_allowed_lateness_seconds * 1_000_000)
        if has_events or slid:
            self.store.apply(spark, events, batch_id=batch_id, as_of_us=as_of_us,
                             open_from=open_from, run=run)
        if has_purchases or slid or force_top:
            self.submit_top(self.store.write_top_here, batch_id=batch_id, as_of_us=as_of_us,
                            open_from=open_from)
        if due:
            # the entities touched while the clock was in the tiles since the last one
            # (their sets are complete: this batch's touches go to the current tile's)
            first = max(snapshot.tile, current - WINDOW_SECONDS[LONG_WINDOW])
            previous, snapshot = snapshot, SnapshotMark(current, first, batch_id)
            if not (batch_log is not None and batch_log.marked(SNAPSHOT_MARK, batch_id)):
                self._submit_snapshot(spark, batch_log, snapshot, previous)
        return snapshot

    def _claim(self, run: str) -> None:
        """Record this checkpoint's run as the tiles' writer, and say so when another was.

        The tiles' markers keep a new checkpoint's batches apart from an earlier one's
        (:func:`pipelines.stream_state.merged_already`), so its events are added to
        the tiles that one left. That is right when it reads on where the other
        stopped (``startingOffsets`` latest, or a new topic); when it reads again
        what the other counted (a wiped checkpoint started from earliest), those
        events count twice. The job cannot tell which, so the operator is told.
        """
        previous = self.store.claim(run)
        self._claimed = run
        if previous is not None and previous != run:
            log.warning(
                "stream: Redis holds tiles written by another checkpoint (run %s); this one "
                "(run %s, under %s) adds its events to them. If it reads again events the "
                "other already counted (a wiped checkpoint started from earliest), they "
                "count twice: then stop it, delete the stream's keys (%s*, %s*) and start it "
                "again.", previous, run, self.settings.checkpoint_path,
                online_keys.key("tiles", ""), online_keys.key("stream", ""))

    def _submit_snapshot(self, spark: SparkSession, batch_log: BatchLog | None,
                         mark: SnapshotMark, previous: SnapshotMark | None) -> None:
        """Queue the snapshot ``mark`` (one runs at a time, beside the micro-batches)."""
        future = self._snapshot_pool.submit(
            detached(spark, self._write_snapshot, _SNAPSHOT_GROUP), spark, batch_log, mark,
            previous)
        self._snapshots.append((future, mark, previous))

    def _write_snapshot(self, spark: SparkSession, batch_log: BatchLog | None,
                        mark: SnapshotMark, previous: SnapshotMark | None) -> None:
        from pipelines.streaming.snapshot import write_served_snapshot

        assert mark.first is not None and mark.batch_id is not None
        batch_id = mark.batch_id

        def done() -> None:
            if batch_log is not None:
                batch_log.mark(SNAPSHOT_MARK, batch_id)
                if previous is not None and previous.batch_id is not None:
                    batch_log.unmark(SNAPSHOT_MARK, previous.batch_id)  # no restart checks it

        # staged under (checkpoint's run id, batch id): batch ids restart on a new checkpoint
        stage = batch_id if batch_log is None else f"{batch_log.run_id()}-{batch_id}"
        write_served_snapshot(spark, self.settings, self.store.redis_kwargs,
                              range(mark.first, mark.tile, self.slide), stage, done)

    def _check_snapshots(self, spark: SparkSession, batch_log: BatchLog | None) -> None:
        """Collect finished snapshots: one that failed because Redis was away is queued
        again; any other failure fails the calling batch (or the stop)."""
        pending, again = [], []
        for future, mark, previous in self._snapshots:
            if not future.done():
                pending.append((future, mark, previous))
            elif (outage := redis_outage_of(future)) is not None:
                log.warning("stream: the snapshot of batch %s was not written (Redis "
                            "unreachable: %s); trying again", mark.batch_id, outage)
                again.append((mark, previous))
        self._snapshots = pending
        for mark, previous in again:
            self._submit_snapshot(spark, batch_log, mark, previous)

    def finish_top(self) -> bool:
        """Wait for the top lists of the previous batch; True when they must be redone.

        A batch's top lists are recomputed beside the next micro-batch, one at a
        time: the item and user features, which the batch's freshness is about, are
        in Redis before. The lists are a full recomputation from the tiles (the base
        moves in one transaction), so a run that was lost (a crash, Redis away for a
        moment) is simply redone: by the first batch of a process, and by the batch
        after a failed run.
        """
        pending, self._pending_top = self._pending_top, None
        if pending is not None and (outage := redis_outage_of(pending)) is not None:
            log.warning("stream: the previous batch's top lists were not written (Redis "
                        "unreachable: %s); the next batch writes them", outage)
            self._top_redo = True
        return self._top_redo

    def submit_top(self, write: Callable[..., None], **kwargs: Any) -> None:
        """Start a top-list run beside the next batch (after :meth:`finish_top`)."""
        self._pending_top = self._top_pool.submit(write, **kwargs)
        self._top_redo = False  # until the run is seen to fail

    def close(self) -> None:
        """The query stopped: finish the pending top lists and snapshots, free the threads."""
        try:
            self.finish_top()
        finally:
            self._top_pool.shutdown(wait=True)
            self._snapshot_pool.shutdown(wait=True)
        snapshots, self._snapshots = self._snapshots, []
        for future, mark, _ in snapshots:
            if (outage := redis_outage_of(future)) is not None:
                # not marked done: the next process that starts on this checkpoint writes it
                log.warning("stream: the snapshot of batch %s was not written (Redis "
                            "unreachable: %s); the next start writes it", mark.batch_id, outage)

