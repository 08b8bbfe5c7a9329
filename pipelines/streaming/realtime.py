"""The online path in Spark's Real-time Mode (``trigger(realTime=...)``, Spark 4.1+; stateful in 4.3).

A second query beside the micro-batch one (which keeps the quarantine, the raw
events and the snapshots)::

    Kafka -> verdict (features.validation) -> valid events
      -> watermark(event_time, allowed lateness) -> dropDuplicates(event_id, event_time)
      -> one aggregation: per (kind, key, tile) the full tile of users, items and sales
         (update mode: every change is emitted at once, through a pipelined shuffle)
      -> foreach writer: full tiles to Redis (idempotent overwrite), the clock T,
         features of the touched entities as of T (Feast's layout), top lists

Why one aggregation: Real-time Mode (like every update-mode query) runs a single
streaming aggregation per query, and a second query would read Kafka again, so
the three tile tables are one ``groupBy(kind, key, window)`` over events
exploded into their three roles (:func:`features.tiles.keyed_tiles`, which the
micro-batch path uses as well).

The writer runs on the executors, one row at a time, so the finalize step is
the Python twin of :mod:`features.windows` (:mod:`pipelines.streaming.pyfeatures`,
shared with the micro-batch path; agreement tests).
Rows are buffered and flushed every ``FLUSH_SECONDS`` by a thread in the writer
(pipelined writes, no round trip per row).

Requirements found on Spark 4.3.0 with the 4.2.0 Kafka connector:

* a stateful Real-time query needs all its stages' tasks at once: Kafka
  partitions + shuffle partitions per stateful stage; at ``local[2]`` with a
  2-partition topic it fails with ``CONCURRENT_SCHEDULER_INSUFFICIENT_SLOT``
  ("needs 4 concurrent task slots ... only 2 are currently free"), so this mode
  runs the query with 1 shuffle partition and needs ``local[N]``, N >= 6 (4
  for it, 2 for the micro-batch query);
* ``dropDuplicatesWithinWatermark`` is rejected
  (``STREAMING_REAL_TIME_MODE.OPERATOR_OR_SINK_NOT_IN_ALLOWLIST``:
  ``StreamingDeduplicateWithinWatermarkExec``), hence ``dropDuplicates`` with the
  event time in the key and an event-time watermark;
* ``foreachBatch`` is not a Real-time sink; ``foreach`` is.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import orjson

from features.windows import LONG_WINDOW, WINDOW_SECONDS
from pipelines.settings import Settings
from pipelines.streaming.pyfeatures import (
    TILE_OF_ROW,
    ItemMetadata,
    finalize_item,
    finalize_user,
    from_us,
    tile_of,
    top_items,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery

__all__ = [
    "QUERY_NAME",
    "FLUSH_SECONDS",
    "RealtimeWriter",
    "RealtimeQuery",
    "start_realtime",
    "rt_tiles_key",
    "rt_clock_key",
    "required_slots",
    "check_slots",
]

log = logging.getLogger(__name__)

QUERY_NAME = "shopstream-online-rtm"
FLUSH_SECONDS = 0.01
"""The writer's flush cadence: buffered tiles go to Redis at most this long after arriving."""
TOP_EVERY_SECONDS = 0.25
"""Top lists are recomputed at most this often per writer task (they read every sales tile)."""


# -------------------------------------------------------------------- keys
def rt_tiles_key(kind: str, key: str) -> str:
    """Tiles of one key written by the Real-time path (full tiles, overwritten)."""
    from features import online_keys

    return online_keys.key("tiles", "rt", kind, online_keys.encode_part(key))


def rt_clock_key() -> str:
    """The Real-time path's event-time clock (max event time written, epoch µs)."""
    from features import online_keys

    return online_keys.key("stream", "rt", "clock")


# ------------------------------------------------------------------ writer
def _encode_tile(row: Mapping[str, Any]) -> str:
    return orjson.dumps(row).decode()


def _decode_tile(text: bytes | str) -> dict[str, Any]:
    return orjson.loads(text)


def _to_python(value: Any) -> Any:
    if hasattr(value, "asDict"):
        return {k: _to_python(v) for k, v in value.asDict().items()}
    if isinstance(value, list):
        return [_to_python(v) for v in value]
    return value


_CLOCK_LUA = """
local stored = redis.call('GET', KEYS[1])
if (not stored) or tonumber(ARGV[1]) > tonumber(stored) then
  redis.call('SET', KEYS[1], ARGV[1])
  return ARGV[1]
end
return stored
"""
"""Advance the clock to max(stored, new); returns it as the stored string (exact digits)."""


class RealtimeWriter:
    """``foreach`` writer: buffers tile rows, flushes them to Redis from a thread every few ms.

    Picklable (plain settings values); the client and the thread are created in
    :meth:`open`, on the executor. A replayed row overwrites a tile with the same
    full value, so at-least-once delivery is harmless.
    """

    def __init__(self, settings: Settings) -> None:
        from pipelines.connections import redis_kwargs

        self.redis_kwargs = redis_kwargs(settings, timeout_ms=max(settings.redis_socket_timeout_ms,
                                                                  5000))
        self.slide = settings.feature_slide_seconds
        self.last_items_n = settings.feature_last_items_n
        self.top_n = settings.feature_top_n
        self.ttl = settings.online_ttl_seconds

    # -- ForeachWriter protocol
    def open(self, partition_id: int, epoch_id: int) -> bool:
        import redis

        self._client = redis.Redis(**self.redis_kwargs)
        self._clock = self._client.register_script(_CLOCK_LUA)
        self._lock = threading.Lock()
        self._buffer: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._last_top = 0.0
        self._top_dirty = False
        self._latencies: list[float] = []
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return True

    def process(self, row: Any) -> None:
        if self._error is not None:
            raise self._error
        with self._lock:
            self._buffer.append(_to_python(row))

    def close(self, error: BaseException | None) -> None:
        self._stop.set()
        self._thread.join()
        try:
            if error is None and self._error is None:
                self.flush(final=True)
                self._report()
        finally:
            self._client.close()
        if self._error is not None and error is None:
            raise self._error

    # -- the flusher
    def _run(self) -> None:
        while not self._stop.wait(FLUSH_SECONDS):
            try:
                self.flush()
            except BaseException as exc:  # noqa: BLE001 - surfaced by process()/close()
                self._error = exc
                return

    def flush(self, final: bool = False) -> None:
        """Write the buffered tiles and the touched entities' features; the top lists too
        when due. ``final`` (the task's last flush) writes them whenever this or an earlier
        flush changed a sales tile: the rows that arrive while the task closes must reach
        the lists, not wait for a next flush that never comes."""
        from features.feast_layout import ITEM_STATS, USER_ACTIVITY
        from pipelines import online_writer

        with self._lock:
            rows, self._buffer = self._buffer, []
        if not rows and not self._top_dirty:
            return
        latest: dict[tuple[str, str, int], dict[str, Any]] = {}
        for row in rows:  # update mode: a later row of a tile replaces an earlier one
            latest[(row["kind"], row["key"], row["tile_start"])] = row
        client = self._client
        touched: dict[str, set[str]] = {"user": set(), "item": set()}
        meta = ItemMetadata()
        max_us = 0
        with client.pipeline(transaction=False) as pipe:
            for (kind, key, tile), row in latest.items():
                max_us = max(max_us, int(row["max_us"]))
                value = _encode_tile(TILE_OF_ROW[kind](row))
                if kind == "sales":
                    pipe.hset(rt_tiles_key("sales", str(tile)), key, value)
                    pipe.expire(rt_tiles_key("sales", str(tile)), self.ttl)
                    self._top_dirty = True
                    continue
                pipe.hset(rt_tiles_key(kind, key), str(tile), value)
                pipe.expire(rt_tiles_key(kind, key), self.ttl)
                touched[kind].add(key)
                if kind == "item":
                    meta.add(row)
            pipe.execute()
        clock_us = int(self._clock(keys=[rt_clock_key()], args=[max_us]))
        as_of = from_us(clock_us)

        users = sorted(touched["user"])
        items = sorted(touched["item"])
        with client.pipeline(transaction=False) as pipe:
            for key in users:
                pipe.hgetall(rt_tiles_key("user", key))
            for key in items:
                pipe.hgetall(rt_tiles_key("item", key))
            stored = pipe.execute()
        user_rows = [finalize_user(key, [_decode_tile(v) for v in m.values()], as_of,
                                   slide_seconds=self.slide, last_items_n=self.last_items_n)
                     for key, m in zip(users, stored[:len(users)], strict=True)]
        item_rows = [finalize_item(key, [_decode_tile(v) for v in m.values()], as_of,
                                   slide_seconds=self.slide)
                     for key, m in zip(items, stored[len(users):], strict=True)]
        if user_rows:
            online_writer.write_entity_rows(client, USER_ACTIVITY, user_rows,
                                            ttl_seconds=self.ttl)
        if item_rows:
            online_writer.write_entity_rows(client, ITEM_STATS, item_rows, ttl_seconds=self.ttl)
        metadata = meta.rows()
        if metadata:
            online_writer.write_item_metadata(client, metadata, ttl_seconds=self.ttl)
        done = time.time()
        self._latencies.extend(done - r["max_us"] / 1e6 for r in latest.values())
        if self._top_dirty and (final or done - self._last_top >= TOP_EVERY_SECONDS):
            self._write_top(as_of)

    def _write_top(self, as_of: datetime) -> None:
        from pipelines import online_writer

        current = tile_of(as_of, self.slide)
        starts = range(current - WINDOW_SECONDS[LONG_WINDOW] + self.slide, current + 1, self.slide)
        with self._client.pipeline(transaction=False) as pipe:
            for start in starts:
                pipe.hgetall(rt_tiles_key("sales", str(start)))
            stored = pipe.execute()
        sales = [_decode_tile(v) for mapping in stored for v in mapping.values()]
        rows = top_items(sales, as_of, slide_seconds=self.slide, top_n=self.top_n)
        if rows:
            online_writer.write_top_items(self._client, rows, top_n=self.top_n, prune=True)
        self._last_top = time.time()
        self._top_dirty = False

    def _report(self) -> None:
        """Freshness of this task's RTM batch into the progress hash (``rt_`` fields)."""
        if not self._latencies:
            return
        from features.online_keys import stream_progress_key

        values = sorted(self._latencies)

        def pct(p: float) -> float:
            return values[min(len(values) - 1, int(p * len(values)))]

        self._client.hset(stream_progress_key(), mapping={
            "rt_freshness_p50_s": f"{pct(0.5):.3f}", "rt_freshness_p99_s": f"{pct(0.99):.3f}",
            "rt_freshness_max_s": f"{values[-1]:.3f}", "rt_tiles_written": str(len(values)),
            "rt_updated": datetime.now(UTC).isoformat()})


# ------------------------------------------------------------------- query
class RealtimeQuery:
    """The running Real-time query, with the hooks :func:`pipelines.stream.run_stream` uses."""

    def __init__(self, query: StreamingQuery) -> None:
        self.query = query

    def caught_up(self) -> bool:
        if self.query.exception() is not None:
            raise self.query.exception()  # type: ignore[misc]
        progress = self.query.lastProgress
        return progress is not None and not progress.get("numInputRows", 0)

    def stop(self) -> None:
        if self.query.isActive:
            self.query.stop()


def required_slots(settings: Settings) -> int:
    """Task slots Real-time Mode holds (Kafka partitions + 2 one-partition stateful stages)
    plus what the micro-batch query beside it needs: its two Parquet sinks run as
    concurrent jobs, each on its shuffle partitions (with fewer free slots the pipelined
    stage group fails with CONCURRENT_SCHEDULER_INSUFFICIENT_SLOT, seen in a test run)."""
    return settings.kafka_topic_partitions + 2 + 2 * settings.spark_shuffle_partitions


def check_slots(spark: SparkSession, settings: Settings) -> None:
    """Fail early, with the fix, when the cluster cannot hold both queries' tasks."""
    slots = spark.sparkContext.defaultParallelism
    master = spark.sparkContext.master
    if master.startswith("local"):
        inner = master[len("local"):].strip("[]").split(",")[0] or "1"
        slots = (os.cpu_count() or 1) if inner == "*" else int(inner)
    need = required_slots(settings)
    if slots < need:
        raise RuntimeError(
            f"Real-time Mode needs {need} concurrent task slots ({settings.kafka_topic_partitions} "
            f"Kafka partitions + 2 stateful stages, plus 2 x {settings.spark_shuffle_partitions} for "
            f"the micro-batch query's two sinks) but {master} has {slots}; Spark would fail with "
            "CONCURRENT_SCHEDULER_INSUFFICIENT_SLOT. Set SHOPSTREAM_SPARK_MASTER=local["
            f"{need}] (threads; they may exceed the cores) or add executors.")


def start_realtime(spark: SparkSession, settings: Settings) -> RealtimeQuery:
    """Start the Real-time online query (see the module docstring); returns at once."""
    from pyspark.sql import functions as F

    from features.events import VALID_COLUMNS
    from features.tiles import keyed_tiles
    from features.validation import with_verdict
    from pipelines.stream import RAW_COLUMNS, query_checkpoint

    raw = (spark.readStream.format("kafka").options(**settings.spark_kafka_options())
           .option("subscribe", settings.kafka_topic_events)
           .option("startingOffsets", settings.stream_starting_offsets).load())
    checked = with_verdict(raw.select(*RAW_COLUMNS), now=F.col("timestamp"),
                           check_key=settings.stream_check_key)
    events = (checked.where(F.col("reason").isNull()).select(*VALID_COLUMNS)
              .withWatermark("event_time", f"{settings.feature_allowed_lateness_seconds} seconds")
              .dropDuplicates(["event_id", "event_time"]))
    tiles = keyed_tiles(events, slide_seconds=settings.feature_slide_seconds,
                        last_items_n=settings.feature_last_items_n)
    # one shuffle partition per stateful stage: the query holds Kafka partitions + 2 slots
    previous = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.shuffle.partitions", "1")
    try:
        query = (
            tiles.writeStream.queryName(QUERY_NAME)
            .outputMode("update")
            .option("checkpointLocation", query_checkpoint(settings, QUERY_NAME))
            .foreach(RealtimeWriter(settings))
            .trigger(realTime=f"{settings.stream_realtime_checkpoint_seconds} seconds")
            .start()
        )
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", previous)
    log.info("real-time online query %s started (checkpoint every %ss)", QUERY_NAME,
             settings.stream_realtime_checkpoint_seconds)
    return RealtimeQuery(query)
