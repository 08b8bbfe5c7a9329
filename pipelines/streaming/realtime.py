"""The online path in Spark's Real-time Mode (``trigger(realTime=...)``, Spark 4.1+; stateful in 4.3).

A second query beside the micro-batch one (which keeps the quarantine and the raw
events)::

    Kafka -> verdict (features.validation) -> valid events
      -> watermark(event_time, allowed lateness) -> dropDuplicates(event_id, event_time)
      -> each event once per role (user, item, sale) with its source partition and offset
      -> Kafka sink: role rows as JSON on ``<kafka_topic_rt_tiles>.roles``, keyed by (kind, key)
    TileFeed (a thread of the driver): role rows folded into full tiles, each applied once
      (:mod:`pipelines.streaming.folding`) -> Redis (idempotent overwrite), the clock T,
      features of the touched entities as of T (Feast's layout), top lists;
      when T enters a new tile, a feature snapshot (below)
    (``stream_realtime_feeds`` > 1: feeds side by side, each on its share of the topic's
      partitions, the others processes: :mod:`pipelines.streaming.feed_process`)
    (``stream_realtime_shape=tiles``: the query aggregates instead, one aggregation per
      (kind, key, tile) in update mode through a pipelined shuffle, and sends full tiles
      to ``kafka_topic_rt_tiles``: :func:`realtime_tiles`, twice the query's CPU)

Why the tiles shape has one aggregation: Real-time Mode (like every update-mode query)
runs a single streaming aggregation per query, and a second query would read Kafka
again, so the three tile tables are one ``groupBy(kind, key, window)`` over events
exploded into their three roles (:func:`features.tiles.keyed_tiles`, which the
micro-batch path uses as well).

Why a Kafka hop instead of a Python ``foreach`` writer: PySpark's ``foreach``
hands rows to Python through ``SerDeUtil.AutoBatchedPickler``, which doubles its
batch until a pickled batch reaches 1 MB and waits for the batch to fill; in a
Real-time query that held tiles back for tens of seconds (a probe purchase took
~41 s to reach Redis at 100 events/s, ~10 s at 1,000/s). Kafka is a JVM sink that
Real-time Mode supports, so tiles leave Spark as they are computed; the feed
polls them within milliseconds. Tiles are full values keyed by (kind, key), so
per-key order is kept and a replay (after a restart of either side) rewrites
the same values: at-least-once is exact. Role rows are increments, so the fold skips
what it applied before by their source offsets (:mod:`pipelines.streaming.folding`).

Feature snapshots: the feed adds the entities it touches to the set of the clock's
tile (as the micro-batch path does, :func:`pipelines.stream_state.dirty_key`); when
a flush moves the clock into a new tile, a Lua script records, atomically with the
new boundary, a snapshot asked for (the tiles since the last boundary) in a Redis
hash. The Parquet sinks' process writes it, not this driver
(:mod:`pipelines.streaming.rt_snapshots`: who writes which, and why;
:func:`pipelines.streaming.snapshot.write_served_snapshot`: staged, moved in, then the
request is deleted), so a request a crash or a Redis outage interrupted is written by
the next start, once.

The finalize step is the Python twin of :mod:`features.windows`
(:mod:`pipelines.streaming.pyfeatures`, shared with the micro-batch path;
agreement tests).

Requirements found on Spark 4.3.0 with the 4.2.0 Kafka connector:

* a stateful Real-time query needs all its stages' tasks at once: Kafka
  partitions + shuffle partitions per stateful stage; at ``local[2]`` with a
  2-partition topic it fails with ``CONCURRENT_SCHEDULER_INSUFFICIENT_SLOT``
  ("needs 4 concurrent task slots ... only 2 are currently free"), so this mode
  runs the query with 1 shuffle partition and needs ``local[N]`` (see
  :func:`required_slots`);
* ``dropDuplicatesWithinWatermark`` is rejected
  (``STREAMING_REAL_TIME_MODE.OPERATOR_OR_SINK_NOT_IN_ALLOWLIST``:
  ``StreamingDeduplicateWithinWatermarkExec``), hence ``dropDuplicates`` with the
  event time in the key and an event-time watermark;
* ``foreachBatch`` is not a Real-time sink; ``foreach`` and Kafka are.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import orjson

from features.windows import LONG_WINDOW, WINDOW_SECONDS
from pipelines.connections import kafka_topic_id
from pipelines.redis_batch import CommandBatch, as_dict
from pipelines.settings import Settings
from pipelines.spark import STREAM_POOL, quiet_loggers, scheduler_pool
from pipelines.stream import StreamFailed, is_kafka_outage, is_redis_outage
from pipelines.stream_metrics import REALTIME_QUERY_NAME
from pipelines.stream_state import DIRTY_TTL_SECONDS, dirty_key
from pipelines.streaming.folding import RoleFolder
from pipelines.streaming.heap import GcPauses, HeapFreezer, YoungThreshold
from pipelines.streaming.pyfeatures import (
    TILE_OF_ROW,
    ItemMetadata,
    RunningItems,
    RunningUsers,
    SalesTotals,
    from_us,
    tile_of,
)
from pipelines.streaming.rt_snapshots import AskedSnapshots, rt_snapshot_keys

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

__all__ = [
    "QUERY_NAME",
    "POLL_MS",
    "RealtimeWriter",
    "apply_rows",
    "write_top",
    "one_shuffle_partition",
    "TileFeed",
    "Feeds",
    "feed_partitions",
    "ensure_topic",
    "tile_messages",
    "RealtimeQuery",
    "start_realtime",
    "tile_sink_options",
    "feed_topic",
    "realtime_checkpoint",
    "rt_tiles_key",
    "rt_clock_key",
    "rt_snapshot_keys",
    "required_slots",
    "check_slots",
    "SlotsError",
]

log = logging.getLogger(__name__)

QUERY_NAME = REALTIME_QUERY_NAME
POLL_MS = 20
"""The feed's Kafka poll timeout: tiles reach Redis at most about this long after arriving."""
TOP_EVERY_SECONDS = 0.25
"""Top lists are ranked at most this often."""
TOP_SHARE = 0.1
"""...and spend at most this share of the feed's time while tiles are waiting: after a
ranking that took ``d`` seconds the next waits ``d / TOP_SHARE`` (the ranking covers
every item sold in the day: about 0.1 s for 12,000 sales keys, so about once a second
then), so tiles keep flowing however large the day gets. A burst after an epoch boundary
drains in backlog / (capacity - load): the features come first, the lists at most a
second or so behind. When nothing is waiting (a final flush) dirty lists are written at
once. At 0.2 the lists took 12.5 % of a drain (``benchmarks/tile_feed.py``, py-spy)."""
COMMIT_SECONDS = 1.0
"""How often the feed commits its Kafka offsets while tiles keep coming (and at once when it
has caught up or stops). A synchronous commit took about 7 ms of the feed's loop on this
machine: at 50 flushes a second, a third of its time waiting, and 50 offset writes a second
for the broker. A replay after a crash is at most this much longer, and harmless: tiles are
full values."""
MAX_FLUSH_ROWS = 30_000
"""The most tile rows one flush takes (one Kafka poll). Caught up, a flush holds the
``MIN_CYCLE_S`` the query sent; behind (after an epoch boundary, a start, a pause) it
takes up to this many, and the larger the flush, the more rows of one tile it merges
before writing (update mode sends a full tile per event) and the more entities it
finalizes once for many rows. Draining 45,762 live-like tile rows (from micro-batches of
100 events), alternating: 10,000 rows and kafka-python's 1 MiB fetch, 10.9-11.6k rows/s;
10,000 rows and ``FETCH_PARTITION_BYTES``, 15.8-16.7k; 30,000 rows and that fetch,
17.6-18.0k (``benchmarks/tile_feed.py``'s rows: 7.3-8.4k, 10.5-11.1k, 12.5-14.1k). A
flush of 30,000 rows takes about 2 s: it only comes when the feed is that far behind."""
FETCH_PARTITION_BYTES = 8 * 1024 * 1024
"""The feed's consumer fetches up to this much per partition (kafka-python's 1 MiB default
is about 2,200 tile rows: a poll then held a few thousand rows however far behind the
feed was, so ``MAX_FLUSH_ROWS`` was never reached)."""
REPORT_SECONDS = 5.0
"""How often the feed writes its freshness figures to the progress hash."""
MIN_CYCLE_S = 0.02
"""The shortest loop of the feed while tiles keep coming: after a flush that took less, it
waits the rest before polling, so a flush carries about this much of the query's output.
Each flush costs about 1.6 ms of fixed work (the clock, three Redis round trips, the Kafka
poll) besides its rows. Replaying live tiles at 2,000 rows/s, a loop with no floor ran
3x as many flushes for 30 % more CPU per row and no steadier a p99 (0.17-0.43 s against
0.21-0.22 s at 20 ms); 40 ms was no cheaper (``benchmarks/tile_feed.py`` drains a
backlog, where flushes are large anyway)."""


# -------------------------------------------------------------------- keys
@lru_cache(maxsize=1 << 16)
def rt_tiles_key(kind: str, key: str) -> str:
    """Tiles of one key written by the Real-time path (full tiles, overwritten).

    Cached: a flush names each touched key's tiles several times, and percent-encoding
    it took 7 % of the feed's time under cProfile."""
    from features import online_keys

    return online_keys.key("tiles", "rt", kind, online_keys.encode_part(key))


def rt_clock_key() -> str:
    """The Real-time path's event-time clock (max event time written, epoch µs)."""
    from features import online_keys

    return online_keys.key("stream", "rt", "clock")


# ------------------------------------------------------------------ writer
@lru_cache(maxsize=1 << 14)
def _scope(category_id: str | None, region: str | None) -> str:
    """A top list's scope name, cached: each top write names every list's scope."""
    from features import online_keys

    return online_keys.scope_for(category_id, region)


def write_top(client: Any, totals: SalesTotals, as_of: datetime, *, top_n: int,
              written: Any) -> int:
    """The first feed's top write: the lists of ``totals`` (only those whose units changed
    ranked again, :meth:`SalesTotals.top_lists`) to Redis as of ``as_of``, pruning lists of
    scopes with no sales left; ``written`` (a
    :class:`pipelines.online_writer.TopListsWritten`) spares unchanged lists. One function
    for the feed and the tile feed bench. Returns the lists written."""
    from pipelines import online_writer

    lists = {(kind, window, _scope(cat, reg)): members for (kind, window, cat, reg), members
             in totals.top_lists(top_n=top_n).items()}
    return online_writer.write_top_lists(client, lists, online_writer.epoch_ms(as_of),
                                         top_n=top_n, prune=True, written=written)


def _encode_tile(row: Mapping[str, Any]) -> bytes:
    return orjson.dumps(row)  # bytes, as Redis stores them: no str to encode again


def _decode_tile(text: bytes | str) -> dict[str, Any]:
    return orjson.loads(text)


_CLOCK_LUA = """
local stored = redis.call('GET', KEYS[1])
if (not stored) or tonumber(ARGV[1]) > tonumber(stored) then
  redis.call('SET', KEYS[1], ARGV[1])
  return ARGV[1]
end
return stored
"""
"""Advance the clock to max(stored, new); returns it as the stored string (exact digits)."""

_SNAPSHOT_DUE_LUA = """
local stored = redis.call('GET', KEYS[1])
if not stored then
  redis.call('SET', KEYS[1], ARGV[1])
  return 0
end
if tonumber(ARGV[1]) > tonumber(stored) then
  local first = stored
  if tonumber(ARGV[2]) > tonumber(stored) then first = ARGV[2] end
  redis.call('HSET', KEYS[2], ARGV[1], first)
  redis.call('SET', KEYS[1], ARGV[1])
  return 1
end
return 0
"""
"""The clock is in tile ARGV[1]: past the last boundary, ask for the snapshot of the tiles
since it (not before ARGV[2]) and move the boundary, in one step; 1 when one was asked for."""


@dataclass
class _TileWrites:
    """What :meth:`RealtimeWriter.flush`'s first round trip wrote and read back.

    ``sales`` and ``items`` hold (tile or key, the new tile, the index of the reply
    holding the value it replaced); ``sales_reads`` the sales tiles read whole, in
    reply order from 0.
    """

    sales_reads: list[int]
    sales: list[tuple[int, dict[str, Any], int]] = field(default_factory=list)
    items: list[tuple[str, dict[str, Any], int]] = field(default_factory=list)
    touched: dict[str, set[str]] = field(default_factory=lambda: {"user": set(), "item": set()})
    meta: ItemMetadata = field(default_factory=ItemMetadata)
    replies: list[Any] = field(default_factory=list)

    def item_changes(self) -> dict[str, dict[int, tuple[dict[str, Any] | None, dict[str, Any]]]]:
        """Per item, this flush's tiles: start -> (the value it replaced, the new one)."""
        changes: dict[str, dict[int, tuple[dict[str, Any] | None, dict[str, Any]]]] = {}
        for key, new, at in self.items:
            old = self.replies[at]
            changes.setdefault(key, {})[int(new["tile_start"])] = (
                _decode_tile(old) if old else None, new)
        return changes


class RealtimeWriter:
    """Full tile rows -> Redis: tiles, the clock, the touched entities' features, top lists.

    Driven by :class:`TileFeed` (one thread): :meth:`add` buffers rows, :meth:`flush`
    writes them. A replayed row overwrites a tile with the same full value, so
    at-least-once delivery is harmless.
    """

    def __init__(self, settings: Settings, *, sales: bool = True, feed: int = 0) -> None:
        """``sales``: this writer keeps the sales totals and the top lists (one feed of
        several does: :func:`feed_partitions`); ``feed``: its index, which names its
        figures in the progress hash and its textfile."""
        from pipelines.connections import redis_kwargs

        self.redis_kwargs = redis_kwargs(settings, timeout_ms=max(settings.redis_socket_timeout_ms,
                                                                  5000))
        self.slide = settings.feature_slide_seconds
        self.last_items_n = settings.feature_last_items_n
        self.top_n = settings.feature_top_n
        self.ttl = settings.online_ttl_seconds
        self.user_cache_tiles = settings.stream_realtime_user_cache_tiles
        self.sales = sales
        self.feed = feed
        self._foreign_sales = 0
        from pipelines.stream_metrics import realtime_textfile_path

        self.textfile = realtime_textfile_path(settings, feed)
        self.gc_pauses: GcPauses | None = None  # set by the feed while it runs
        self._client: Any = None
        # when a sales tile first changed after the last top write (the lists lag from then)
        self._dirty_since: float | None = None

    @property
    def client(self) -> Any:
        """The writer's Redis client (the feed's fold reads and writes through it too)."""
        return self._client

    def connect(self) -> None:
        import redis

        self._client = redis.Redis(**self.redis_kwargs)
        self._clock = self._client.register_script(_CLOCK_LUA)
        self._buffer: list[dict[str, Any]] = []
        self._next_top = 0.0
        self.top_dirty = False
        # what the last top write wrote: unchanged lists are only stamped (and forgotten
        # with a reconnect, which may follow a Redis restart)
        from pipelines.online_writer import TopListsWritten

        self._top_written = TopListsWritten()
        self._top_s: list[float] = []  # each top write's time, for the report
        self._top_lag: list[float] = []  # from the first sale not ranked to the write's end
        self._latencies: list[float] = []
        # where the freshness goes: Spark's part (tile sent minus its newest event), the
        # feed's (tile sent -> written); Kafka's message timestamp is the send time
        self._query_s: list[float] = []
        self._feed_s: list[float] = []
        self._sent: list[float] = []
        # rebuilt from the stored tiles by the next flush: after an outage a pipeline may
        # have written tiles whose changes never reached the totals
        self._totals: SalesTotals | None = None
        self._items = RunningItems(self.slide)
        self._items_tile = 0
        self._users = RunningUsers(self.slide, max_tiles=self.user_cache_tiles,
                                   max_idle_s=self.ttl / 2)
        # tiles out of every window found by a load, deleted with the next features: a
        # user or item hash keeps the key TTL (days) from its last write, not a window
        self._stale: list[tuple[str, list[Any]]] = []

    def disconnect(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def add(self, row: dict[str, Any], sent_s: float | None = None) -> None:
        """One tile row as the feed decodes it (a plain dict, as :func:`tile_messages` sends);
        ``sent_s``: when the query sent it (its Kafka timestamp, epoch seconds)."""
        self._buffer.append(row)
        if sent_s is not None:
            self._sent.append(sent_s)
            self._query_s.append(sent_s - int(row["max_us"]) / 1e6)

    def flush(self, final: bool = False) -> None:
        """Write the buffered tiles and the touched entities' features; the top lists too
        when due. ``final`` (nothing more is waiting) writes them whenever this or an
        earlier flush changed a sales tile: rows after a throttled top write must reach
        the lists, not wait for a next flush that may never come.

        Four round trips: the clock; the tiles (with the values they replace and the
        sales tiles leaving the windows); what the touched entities' features need;
        the features and item metadata. The top lists, when due, after.
        """
        from features.feast_layout import ITEM_STATS, USER_ACTIVITY
        from pipelines import online_writer

        rows, self._buffer = self._buffer, []
        if not rows and not self.top_dirty:
            return
        latest: dict[tuple[str, str, int], dict[str, Any]] = {}
        for row in rows:  # update mode: a later row of a tile replaces an earlier one
            latest[(row["kind"], row["key"], row["tile_start"])] = row
        max_us = max((int(row["max_us"]) for row in latest.values()), default=0)
        # the clock first: a sales tile's change goes to the windows holding it as of the clock
        as_of = from_us(int(self._clock(keys=[rt_clock_key()], args=[max_us])))
        current = tile_of(as_of, self.slide)
        written = self._write_tiles(latest, current)
        if self.sales:
            self._update_totals(written, current)
        if current > self._items_tile:
            self._items.forget_before(current)
            self._users.trim(current, time.monotonic())
            self._items_tile = current
        user_rows, item_rows, stamped = self._touched_rows(written, current, as_of)
        # round trip 3: the features (never over a later one another writer stored) and
        # the item metadata
        batch = CommandBatch(self._client)
        for spec, feature_rows in ((USER_ACTIVITY, user_rows), (ITEM_STATS, item_rows)):
            encoded = online_writer.encode_entity_rows(spec, feature_rows)
            online_writer.add_entity_writes(batch, encoded,
                                            online_writer.not_older(encoded, stamped), self.ttl)
        for row in written.meta.rows():
            online_writer.add_item_metadata(batch, row, self.ttl)
        for name, fields in self._stale:
            batch.add("HDEL", name, *fields)
        self._stale = []
        batch.execute()
        done = time.time()
        self._latencies.extend(done - r["max_us"] / 1e6 for r in latest.values())
        self._feed_s.extend(done - sent for sent in self._sent)
        self._sent = []
        if self.top_dirty and (final or done >= self._next_top):
            self._write_top(as_of)

    def _write_tiles(self, latest: Mapping[tuple[str, str, int], dict[str, Any]],
                     current: int) -> _TileWrites:
        """Round trip 1: write the tiles, reading in the same pipeline what each sales and
        item tile replaces and the sales tiles the totals need (those leaving a window,
        or the whole window when there are no totals yet), all before the writes."""
        totals = self._totals
        reads = ([] if not self.sales else list(SalesTotals.window_tiles(current, self.slide))
                 if totals is None else totals.leaving(current))
        out = _TileWrites(sales_reads=reads)
        batch = CommandBatch(self._client)
        add, ttl, now = batch.add, self.ttl, time.monotonic()
        for start in reads:
            add("HGETALL", rt_tiles_key("sales", str(start)))
        for (kind, key, tile), row in latest.items():
            tile_value = TILE_OF_ROW[kind](row)
            value = _encode_tile(tile_value)
            if kind == "sales":
                name = rt_tiles_key("sales", str(tile))
                if self.sales:
                    out.sales.append((tile, tile_value, add("HGET", name, key)))
                    if not self.top_dirty:
                        self._dirty_since = time.time()
                    self.top_dirty = True
                else:
                    self._foreign_sale(key)
                add("HSET", name, key, value)
                add("EXPIRE", name, ttl)
                continue
            name = rt_tiles_key(kind, key)
            if kind == "user":
                self._users.put(key, tile_value, current, now)
            elif kind == "item":
                out.items.append((key, tile_value, add("HGET", name, str(tile))))
                out.meta.add(row)
            add("HSET", name, str(tile), value)
            add("EXPIRE", name, ttl)
            out.touched[kind].add(key)
        out.replies = batch.execute()
        return out

    def _foreign_sale(self, key: str) -> None:
        """A sales tile reached a feed that keeps no totals: sent to another partition than
        :data:`SALES_PARTITION` (by a query older than that rule, still in the topic). Its
        tile is written; the top lists miss its change until the sales feed next rebuilds
        its totals from the stored tiles (at its start, or after a Redis outage)."""
        self._foreign_sales += 1
        if self._foreign_sales == 1:
            log.warning("real-time tile feed #%d: sales tile %s is not on partition %d; it is "
                        "written, but the top lists take its change only when the sales feed "
                        "next rebuilds its totals (its next start)", self.feed, key,
                        SALES_PARTITION)

    def _update_totals(self, written: _TileWrites, current: int) -> None:
        """Move the sales totals to the clock's tile, then add each new sales tile's change."""
        replies = written.replies
        read = {start: [_decode_tile(v) for v in as_dict(replies[i]).values()]
                for i, start in enumerate(written.sales_reads)}
        if self._totals is None:
            self._totals = SalesTotals.from_tiles(
                [t for tiles in read.values() for t in tiles], current, self.slide)
        else:
            self._totals.advance(current, read)
        for tile, new, at in written.sales:
            old = replies[at]
            self._totals.change(tile, (new["item_id"], new["category_id"], new["region"]),
                                int(new["units"]) - (int(_decode_tile(old)["units"]) if old else 0))

    def _touched_rows(self, written: _TileWrites, current: int, as_of: datetime
                      ) -> tuple[list[dict[str, Any]], list[dict[str, Any]],
                                 dict[bytes, bytes | None]]:
        """Round trip 2: mark the touched entities for the snapshot (and ask for one when
        the clock entered a new tile), read what their features need and the event
        timestamps their stored features have; their rows as of the clock, and those
        timestamps by Feast key. A user is finalized from its running sums, its tiles read
        from Redis on its first touch only (:class:`RunningUsers`); a known item from its
        running sums, reading only the tiles leaving its windows."""
        from features.feast_layout import ITEM_STATS, USER_ACTIVITY, timestamp_field

        running = self._items
        users = sorted(written.touched["user"])
        items = sorted(written.touched["item"])
        item_reads: list[tuple[str, list[int] | None, int | None]] = []
        batch = CommandBatch(self._client)
        # a snapshot due now covers the tiles before this one, whose sets are complete
        # (this flush and the next ones add to this tile's or later ones); it is
        # written after this flush (TileFeed), so it reads this flush's rows
        batch.add("EVAL", _SNAPSHOT_DUE_LUA, 2, *rt_snapshot_keys(), current,
                  current - WINDOW_SECONDS[LONG_WINDOW])
        for kind, keys in (("user", users), ("item", items)):
            if keys:
                batch.add("SADD", dirty_key(kind, current), *keys)
                batch.add("EXPIRE", dirty_key(kind, current), DIRTY_TTL_SECONDS)
        marks = len(batch)
        loads = [key for key in users if not self._users.known(key)]  # the others are kept
        for key in loads:
            batch.add("HGETALL", rt_tiles_key("user", key))
        for key in items:  # a known item reads only the tiles leaving its windows, a new one all
            if running.known(key):
                starts = running.leaving(key, current)
                item_reads.append((key, starts, len(batch) if starts else None))
                if starts:
                    batch.add("HMGET", rt_tiles_key("item", key), *[str(t) for t in starts])
            else:
                item_reads.append((key, None, len(batch)))
                batch.add("HGETALL", rt_tiles_key("item", key))
        stamps = len(batch)
        feast_keys: list[bytes] = []
        for spec, keys in ((USER_ACTIVITY, users), (ITEM_STATS, items)):
            field_name = timestamp_field(spec.name)
            for key in keys:
                feast_keys.append(spec.redis_key(key))
                batch.add("HGET", feast_keys[-1], field_name)
        replies = batch.execute()
        stamped = dict(zip(feast_keys, replies[stamps:], strict=True))
        if replies[0]:
            log.info("real-time: the clock entered tile %d; its feature snapshot is asked for",
                     current)
        now = time.monotonic()
        horizon = current - WINDOW_SECONDS[LONG_WINDOW]
        for key, stored in zip(loads, replies[marks:marks + len(loads)], strict=True):
            self._users.load(key, self._live_tiles("user", key, stored, horizon), current, now)
        user_rows = [self._users.finalize(key, as_of, last_items_n=self.last_items_n)
                     for key in users]
        self._users.bound()
        changes = written.item_changes()
        item_rows = []
        for key, starts, at in item_reads:
            if starts is None:  # rebuilt from what is stored now, this flush's tiles included
                assert at is not None
                running.rebuild(key, self._live_tiles("item", key, replies[at], horizon),
                                current)
            else:
                mine = changes.get(key, {})
                now = dict(zip(starts, replies[at], strict=True)) if at is not None else {}
                leaving: dict[int, dict[str, Any]] = {}
                for start in starts:  # as the sums hold them: before this flush's writes
                    if start in mine:
                        if mine[start][0] is not None:
                            leaving[start] = mine[start][0]
                    elif now.get(start) is not None:
                        leaving[start] = _decode_tile(now[start])
                running.advance(key, current, leaving)
                for old, new in mine.values():
                    running.replace(key, old, new)
            item_rows.append(running.finalize(key, as_of))
        return user_rows, item_rows, stamped

    def _live_tiles(self, kind: str, key: str, stored: Any, horizon: int
                    ) -> list[dict[str, Any]]:
        """The tiles of an ``HGETALL`` reply in some window (after ``horizon``), decoded; the
        others are only queued for deletion (up to a week of them, for an active entity)."""
        live, stale = [], []
        for start, value in as_dict(stored).items():
            if int(start) > horizon:
                live.append(_decode_tile(value))
            else:
                stale.append(start)
        if stale:
            self._stale.append((rt_tiles_key(kind, key), stale))
        return live

    def _write_top(self, as_of: datetime) -> None:
        """Rank the lists from the running totals (:class:`SalesTotals`, kept by
        :meth:`flush`), not from every sales tile of the window; only the lists whose
        units changed since the last top write are ranked again."""
        assert self._totals is not None  # a flush made them before any top write
        started = time.time()
        write_top(self._client, self._totals, as_of, top_n=self.top_n,
                  written=self._top_written)
        end = time.time()
        self._next_top = end + max(TOP_EVERY_SECONDS, (end - started) / TOP_SHARE)
        self.top_dirty = False
        self._top_s.append(end - started)
        if self._dirty_since is not None:
            self._top_lag.append(end - self._dirty_since)
            self._dirty_since = None

    def report(self) -> None:
        """Freshness of the tiles written since the last report into the progress hash
        (``rt_`` fields: event time of a tile's newest event -> written), and its two
        parts, so a lag names its place: ``rt_query_*`` (newest event -> the query sent
        the tile) and ``rt_feed_*`` (sent -> written to Redis by the feed). The same
        figures go to the Prometheus textfile ``<name>_rt.prom`` beside the job's."""
        if not self._latencies:
            return
        from features.online_keys import stream_progress_key
        from pipelines.stream_metrics import (
            realtime_fields,
            realtime_prometheus_text,
            write_textfile,
        )

        now = datetime.now(UTC)
        tiles = len(self._latencies)
        parts = {part: _percentiles(values) for part, values in (
            ("total", self._latencies), ("query", self._query_s), ("feed", self._feed_s))
            if values}
        self._latencies, self._query_s, self._feed_s = [], [], []
        fields = {"rt_tiles_written": str(tiles), "rt_updated": now.isoformat(),
                  **(self.gc_pauses.take() if self.gc_pauses is not None else {}),
                  # the user cache (RunningUsers): loads growing as fast as touches mean
                  # it is too small for the active users
                  "rt_users_cached": str(len(self._users)),
                  "rt_user_tiles_cached": str(self._users.tile_count),
                  "rt_user_loads": str(self._users.loads)}
        for part, values in parts.items():
            name = "freshness" if part == "total" else part
            fields.update({f"rt_{name}_{q}_s": f"{v:.3f}"
                           for q, v in zip(("p50", "p99", "max"), values, strict=True)})
        top = self._top_figures()
        fields.update({f"rt_top_{name}": f"{v:.3f}" if name.endswith("_s") else f"{v:.0f}"
                       for name, v in top.items()})
        if self.textfile is not None:
            try:
                write_textfile(self.textfile, realtime_prometheus_text(parts, tiles, now,
                                                                       feed=self.feed, top=top))
            except OSError as exc:  # figures are not worth the feed
                log.warning("real-time: could not write %s: %s", self.textfile, exc)
        self._client.hset(stream_progress_key(), mapping=realtime_fields(fields, self.feed))

    def _top_figures(self) -> dict[str, float]:
        """The top writes since the last report: how many, their time (p50, max) and the
        longest a sales tile's change waited for the top lists (``lag_max_s``: from the
        flush that first changed a sales tile after a top write to the end of the next;
        the top sellers are that much behind the tiles, on top of the tiles' freshness);
        none when there were none (feeds other than the first, which keeps the lists)."""
        if not self._top_s:
            return {}
        p50, _, most = _percentiles(self._top_s)
        figures = {"writes": float(len(self._top_s)), "write_p50_s": p50, "write_max_s": most}
        if self._top_lag:
            figures["lag_max_s"] = max(self._top_lag)
        self._top_s, self._top_lag = [], []
        return figures


def _percentiles(values: list[float]) -> tuple[float, float, float]:
    """p50, p99 and max of ``values`` (not empty)."""
    ordered = sorted(values)

    def pct(p: float) -> float:
        return ordered[min(len(ordered) - 1, int(p * len(ordered)))]

    return pct(0.5), pct(0.99), ordered[-1]


def apply_rows(writer: RealtimeWriter, folder: RoleFolder | None,
               rows: Iterable[tuple[int, bytes, float]]) -> int:
    """A feed's step for one poll: ``rows`` ((tile partition, message value, sent at, epoch
    seconds)) into Redis. Full tiles (``folder`` is ``None``) are written as they are; role
    rows (the ``roles`` shape) are folded first, then written, then the fold's rows and marks
    stored (:meth:`pipelines.streaming.folding.RoleFolder.persist`), in that order so a crash
    between folds again onto what is stored. One function for the feed and the tile feed
    bench, which must measure the feed's own steps. Returns the role rows skipped as applied
    before."""
    if folder is None:
        for _, value, sent_s in rows:
            writer.add(orjson.loads(value), sent_s)
        writer.flush()
        return 0
    before = folder.skipped
    folded = folder.fold(writer.client, rows)
    for tile in folded:
        writer.add(tile.row, tile.sent_s)
    writer.flush()
    folder.persist(writer.client)
    return folder.skipped - before


class TileFeed:
    """Applies the Real-time query's tiles from Kafka to Redis: a thread of the driver.

    Offsets are committed (consumer group ``<query>-feed``) only after the rows they
    cover are in Redis; a restart, or a Redis outage (the feed seeks back to its last
    commit and retries for ``stream_redis_outage_seconds``), replays full tiles,
    which rewrite the same values.

    The feature snapshots it asks for are written by another process
    (:mod:`pipelines.streaming.rt_snapshots`).
    """

    def __init__(self, settings: Settings, *, new_checkpoint: bool = False, index: int = 0,
                 feeds: int = 1, stop: threading.Event | None = None,
                 abandoned: Callable[[], bool] | None = None) -> None:
        """``new_checkpoint``: the query starts on a checkpoint of its own for the first
        time, so tiles already in the topic that the feed has not applied were sent by
        an earlier query (see :meth:`_warn_unread`). ``index`` of ``feeds``: this feed
        applies the tile topic's partitions ``p`` with ``p % feeds == index``
        (:func:`feed_partitions`); feed 0 also keeps the sales totals and the top lists.
        ``stop``: the event that asks it to stop (a process's signal handler sets it);
        ``abandoned``: true when it must stop without writing what the topic holds (its
        driver died: the next start's feed applies the rest from the committed offsets)."""
        self.settings = settings
        self.new_checkpoint = new_checkpoint
        self.topic = feed_topic(settings)
        self.index, self.feeds = index, feeds
        self.writer = RealtimeWriter(settings, sales=index == 0, feed=index)
        # the roles shape: rows to fold into tiles before the writer takes them
        self.folder: RoleFolder | None = None
        if settings.stream_realtime_shape == "roles":
            events = settings.kafka_topic_events
            self.folder = RoleFolder(settings, topic_id=lambda: kafka_topic_id(settings, events))
        self._stop = stop or threading.Event()
        self._abandoned = abandoned or (lambda: False)
        self._idle = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="rt-tile-feed", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def caught_up(self) -> bool:
        """Every tile the query has sent so far is in Redis."""
        self.check()
        return self._idle.is_set()

    def check(self) -> None:
        if self._error is not None:
            raise StreamFailed(f"real-time tile feed failed: {self._error}") from self._error

    def stop(self, timeout_s: float = 120.0) -> None:
        """Write what the topic holds, then stop."""
        self._stop.set()
        self._thread.join(timeout_s)
        self.check()

    def run(self) -> None:
        """The feed's loop in the calling thread, until :attr:`stop` is set and the topic's
        tiles are written (a feed process's main thread; :meth:`start` runs it in one of its
        own). Raises what stopped it."""
        self._run()
        self.check()

    def _run(self) -> None:
        from kafka import TopicPartition
        from kafka.errors import KafkaTimeoutError

        from pipelines.connections import kafka_consumer, kafka_silent, kafka_unreachable

        consumer = kafka_consumer(self.settings, group_id=FEED_GROUP,
                                  max_partition_fetch_bytes=FETCH_PARTITION_BYTES)
        heap = HeapFreezer(self.settings.stream_realtime_gc_freeze_seconds)
        young = YoungThreshold(self.settings.stream_realtime_gc_young_threshold)
        pauses = GcPauses()
        self.writer.gc_pauses = pauses
        try:
            young.install()
            pauses.install()
            parts = feed_partitions(_partitions(consumer, self.topic), self.index, self.feeds)
            tps = [TopicPartition(self.topic, p) for p in parts]
            if self.feeds > 1:
                log.info("real-time tile feed #%d of %d: partitions %s of %s%s", self.index,
                         self.feeds, ",".join(map(str, parts)), self.topic,
                         " (with the sales tiles and the top lists)" if self.index == 0 else "")
            consumer.assign(tps)
            self._rewind(consumer, tps)
            if self.new_checkpoint:
                self._warn_unread(consumer, tps)
            self.writer.connect()
            last_report = last_commit = last_heard = time.monotonic()
            uncommitted = False
            kafka = _Outage.of_kafka(self.settings, self.index)
            redis_out = _Outage.of_redis(self.settings, self.index)

            replay = False  # seek back to the last commit before the next poll

            def commit() -> None:
                nonlocal last_commit, uncommitted
                consumer.commit(timeout_ms=KAFKA_CALL_MS)
                last_commit, uncommitted = time.monotonic(), False

            while True:
                if self._abandoned():  # every row polled so far is flushed
                    if uncommitted:
                        commit()
                    log.info("real-time tile feed #%d: stopped with its driver; what it has "
                             "not written is applied after the next start", self.index)
                    break
                try:
                    if kafka.down_since is not None:  # back? then replay from the last commit
                        if (problem := kafka_unreachable(self.settings)) is not None:
                            # no client call until the broker accepts a connection: a call
                            # sent earlier waits out its timeout (the feed came back 65 s
                            # after Kafka did) and logs each of kafka-python's retries
                            if self._stop.is_set():
                                kafka.stopped()
                                break
                            kafka.down(problem)
                            time.sleep(1.0)
                            continue
                        replay = True
                    if replay:  # after an outage of either: a Kafka call, handled below
                        if self.folder is not None:  # what it folded may not be stored
                            self.folder.reset()
                        self._rewind(consumer, tps)
                        if kafka.down_since is not None:
                            # the offset lookup is answered by the group's coordinator; the
                            # partitions' leaders may not be elected yet after a restart: back
                            # once they answer too (or the next idle ask told a second outage)
                            consumer.end_offsets(tps, timeout_ms=KAFKA_CALL_MS)
                        replay = False
                        kafka.back()
                    cycle = time.monotonic()
                    polled = consumer.poll(timeout_ms=POLL_MS, max_records=MAX_FLUSH_ROWS)
                    records = [r for part in polled.values() for r in part]
                    if records:
                        last_heard = cycle
                        self._idle.clear()
                        self._apply(records)
                        redis_out.back()
                        uncommitted = True
                        if time.monotonic() - last_commit >= COMMIT_SECONDS:
                            commit()
                        heap.step()
                        rest = MIN_CYCLE_S - (time.monotonic() - cycle)
                        if rest > 0:
                            time.sleep(rest)
                    else:
                        if self.writer.top_dirty:
                            self.writer.flush(final=True)
                            redis_out.back()
                        if self._at_end(consumer, tps):
                            if uncommitted:  # caught up: what is in Redis is committed
                                commit()
                            self._idle.set()
                            if self._stop.is_set():
                                break
                        if cycle - last_heard >= KAFKA_IDLE_CHECK_S:
                            # an empty poll says nothing of a broker that crashed (kafka-python
                            # retries quietly), so a feed with no tiles to write checks it
                            last_heard = cycle
                            if (problem := kafka_unreachable(self.settings)) is not None:
                                kafka.down(problem)
                                uncommitted, replay = False, True
                                continue
                            # a connection taken is not a broker serving (hung, no leader, a
                            # proxy with nothing behind it): the partitions' leaders must
                            # answer, or this times out, an outage handled below
                            consumer.end_offsets(tps, timeout_ms=KAFKA_CALL_MS)
                    if time.monotonic() - last_report >= REPORT_SECONDS:
                        self.writer.report()
                        last_report = time.monotonic()
                except Exception as exc:
                    if is_kafka_outage(exc):
                        if self._stop.is_set():
                            kafka.stopped()
                            break
                        # raises once it has lasted too long; a timeout carries no message
                        # ("KafkaTimeoutError: None"): then what is down is said instead
                        kafka.down(exc if not isinstance(exc, KafkaTimeoutError) else
                                   kafka_unreachable(self.settings) or kafka_silent(self.settings))
                        uncommitted = False  # what was written since the commit is replayed
                        replay = True
                        time.sleep(1.0)
                        continue
                    if not is_redis_outage(exc):
                        raise
                    if self._stop.is_set():
                        redis_out.stopped()
                        break
                    redis_out.down(exc)  # raises once it has lasted too long
                    time.sleep(1.0)
                    self.writer.disconnect()
                    self.writer.connect()
                    # not here: Kafka may be away too (its failure here ended the feed)
                    uncommitted, replay = False, True
            if redis_out.down_since is None:
                self.writer.report()
        except BaseException as exc:  # noqa: BLE001 - surfaced by check()
            log.error("real-time tile feed failed: %s", exc)
            self._error = exc
        finally:
            pauses.remove()
            young.remove()
            consumer.close()
            self.writer.disconnect()

    def _apply(self, records: list[Any]) -> None:
        """One poll's records to Redis (:func:`apply_rows`), before any commit."""
        skipped = apply_rows(self.writer, self.folder,
                             ((r.partition, r.value, r.timestamp / 1000) for r in records))
        if skipped:  # a restart's replay: said, as it is not lost work
            log.info("real-time tile feed #%d: %d role rows skipped, applied before (sent "
                     "again by a restarted query, or read again since the last commit)",
                     self.index, skipped)

    def _warn_unread(self, consumer: Any, tps: list[Any]) -> None:
        """Say so when a new checkpoint's feed starts with another query's tiles to write.

        The feed's consumer group outlives a checkpoint, so a query started on a new
        (or wiped) checkpoint has its tiles written after whatever an earlier query sent
        and the feed had not yet applied. Those are full tiles of that query's state:
        right to write when the new query reads on where it stopped, but when Redis was
        emptied for a fresh start (or the events topic changed) they bring the earlier
        run's entities back, and the feed writes them before any of the new query's. The
        feed cannot tell which, so, as the micro-batch tiles' claim does, the operator
        is told, with the count and the fix.
        """
        ends = consumer.end_offsets(tps)
        unread = sum(max(0, ends[tp] - consumer.position(tp)) for tp in tps)
        if unread:
            log.warning(
                "real-time tile feed: this query's checkpoint is new, and %s holds %d tiles an "
                "earlier query sent that the feed (group %s-feed) has not written to Redis; "
                "they are written first. If Redis was emptied for a fresh start they bring "
                "that run's values back: then stop, and start again with a tile topic of its "
                "own (SHOPSTREAM_KAFKA_TOPIC_RT_TILES) or after deleting the group's offsets.",
                self.topic, unread, QUERY_NAME)

    @staticmethod
    def _at_end(consumer: Any, tps: list[Any]) -> bool:
        """Whether the feed has read every tile the topic held as of its last fetches.

        The end of each partition comes from the fetch responses (``highwater``), not from
        a ``ListOffsets`` request: the broker answers a connection's requests in order, so
        one sent after an empty poll waited behind the consumer's parked fetch (up to its
        ``fetch.max.wait.ms``, 500 ms) whenever no tile came meanwhile. A partition not
        fetched yet is asked for."""
        ends = {tp: consumer.highwater(tp) for tp in tps}
        missing = [tp for tp, end in ends.items() if end is None]
        if missing:
            ends.update(consumer.end_offsets(missing))
        return all(consumer.position(tp) >= ends[tp] for tp in tps)

    @staticmethod
    def _rewind(consumer: Any, tps: list[Any]) -> None:
        for tp in tps:
            committed = consumer.committed(tp, timeout_ms=KAFKA_CALL_MS)
            if committed is None:
                consumer.seek_to_beginning(tp)
            else:
                consumer.seek(tp, committed)


class _Outage:
    """A tile feed's view of an outage of Kafka or Redis: told once when it begins, then
    every ``OUTAGE_REPORT_S``, and when it ends; given up (the error raised) after its
    bound. The feed replays from its last commit after either: full tiles, which rewrite
    the same values."""

    def __init__(self, server: str, bound_s: float, knob: str, index: int) -> None:
        """``knob``: the settings that make ``bound_s``, named in the first line."""
        self.server, self.bound_s, self.knob, self.index = server, bound_s, knob, index
        self.down_since: float | None = None
        self._told = 0.0

    @classmethod
    def of_kafka(cls, settings: Settings, index: int) -> _Outage:
        """As long as Spark's source of the query rides one out."""
        return cls("Kafka", settings.kafka_outage_seconds, "SHOPSTREAM_STREAM_KAFKA_ATTEMPTS x "
                   "(SHOPSTREAM_STREAM_KAFKA_TIMEOUT_SECONDS + 1 s)", index)

    @classmethod
    def of_redis(cls, settings: Settings, index: int) -> _Outage:
        """As long as a micro-batch retries its online writes."""
        return cls("Redis", settings.stream_redis_outage_seconds,
                   "SHOPSTREAM_STREAM_REDIS_OUTAGE_SECONDS", index)

    def down(self, cause: BaseException | str) -> None:
        """Note the outage (its first line, then every ``OUTAGE_REPORT_S``); raise
        ``cause`` (or a :class:`StreamFailed` of it) once it has lasted the bound."""
        now = time.monotonic()
        reason = str(cause).splitlines()[0][:300]
        if self.down_since is None:
            self.down_since = self._told = now
            log.warning("real-time tile feed #%d: %s unreachable (%s); retrying for up to %.0f s "
                        "(%s)", self.index, self.server, reason, self.bound_s, self.knob)
        elif now - self.down_since > self.bound_s:
            if isinstance(cause, BaseException):
                raise cause
            raise StreamFailed(f"{self.server} unreachable for {now - self.down_since:.0f} s: "
                               f"{reason}")
        elif now - self._told >= OUTAGE_REPORT_S:
            self._told = now
            log.warning("real-time tile feed #%d: %s still unreachable after %.0f s of %.0f s (%s)",
                        self.index, self.server, now - self.down_since, self.bound_s, reason)

    def stopped(self) -> None:
        log.warning("real-time tile feed #%d: stopped while %s is unreachable; the tiles it "
                    "has not committed are applied after the next start", self.index, self.server)

    def back(self) -> None:
        """Note the end of an outage, if there was one."""
        if self.down_since is None:
            return
        log.info("real-time tile feed #%d: %s is back after %.0f s; the tiles since the last "
                 "commit are written again", self.index, self.server,
                 time.monotonic() - self.down_since)
        self.down_since = None


OUTAGE_REPORT_S = 30.0
"""While Kafka or Redis is away, a tile feed says so this often."""

KAFKA_IDLE_CHECK_S = 5.0
"""A feed whose polls bring no tiles checks this often that a Kafka bootstrap server accepts
a connection and that its partitions' leaders answer (their end offsets, within
``KAFKA_CALL_MS``): its polls would not tell an outage, so one would go unsaid and unbounded
while the query's source, which does notice, stopped the job."""

KAFKA_CALL_MS = 10_000
"""How long a tile feed's offset commit or lookup may wait for Kafka: without a timeout
kafka-python retries a retriable failure (no group coordinator while the broker is away)
with no end; past it the call raises ``KafkaTimeoutError``, one more sign of the outage."""


FEED_GROUP = f"{QUERY_NAME}-feed"
"""The feeds' Kafka consumer group: each commits the offsets of its own partitions."""


def feed_partitions(partitions: list[int], index: int, feeds: int) -> list[int]:
    """The tile topic's partitions feed ``index`` of ``feeds`` applies: ``p % feeds == index``.

    Partition 0, where :func:`tile_messages` puts every sales tile, is feed 0's. A user's
    or an item's tiles all go to one partition (the key's), so each feed keeps the running
    sums of its own entities only, and per-key order holds."""
    if not 0 <= index < feeds:
        raise ValueError(f"feed index {index} is not in 0..{feeds - 1}")
    mine = [p for p in partitions if p % feeds == index]
    if not mine:
        raise RuntimeError(
            f"real-time tile feed #{index} of {feeds} has no partition to apply: the tile "
            f"topic has {len(partitions)}. Set SHOPSTREAM_STREAM_REALTIME_FEEDS to at most "
            f"{len(partitions)}, or use a tile topic with more partitions "
            "(SHOPSTREAM_KAFKA_TOPIC_RT_TILES; it is created with "
            "SHOPSTREAM_KAFKA_TOPIC_PARTITIONS)")
    return mine


def _partitions(consumer: Any, topic: str, timeout_s: float = 60.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while True:
        parts = consumer.partitions_for_topic(topic)
        if parts:
            return sorted(parts)
        if time.monotonic() > deadline:
            raise RuntimeError(f"topic {topic} has no partitions (does it exist?)")
        time.sleep(0.2)


SALES_PARTITION = 0
"""The tile topic's partition of every sales tile: the sales totals and the top lists need
them all, in one feed (:func:`feed_partitions`)."""


def tile_messages(tiles: DataFrame) -> DataFrame:
    """Tile rows (or role rows) -> Kafka messages for the feed: key ``kind|key`` (per-key
    order), value the full row as JSON, nulls kept (the feed reads every field). Sales
    tiles go to :data:`SALES_PARTITION`; the others to the producer's partition of their
    key (a null ``partition`` column)."""
    from pyspark.sql import functions as F

    return tiles.select(
        F.concat_ws("|", "kind", "key").alias("key"),
        F.when(F.col("kind") == "sales", F.lit(SALES_PARTITION)).alias("partition"),
        F.to_json(F.struct(*[F.col(c) for c in tiles.columns]),
                  {"ignoreNullFields": "false"}).alias("value"))


def ensure_topic(settings: Settings) -> int:
    """Create the tiles topic if it is missing (a managed Kafka may want it made
    beforehand); returns its partitions (an existing topic keeps its own count)."""
    from kafka.admin import NewTopic
    from kafka.errors import TopicAlreadyExistsError

    from pipelines.connections import kafka_admin

    topic = feed_topic(settings)
    admin = kafka_admin(settings)
    try:
        if topic not in set(admin.list_topics()):
            try:
                admin.create_topics([NewTopic(topic, settings.kafka_topic_partitions, 1)])
                return settings.kafka_topic_partitions
            except TopicAlreadyExistsError:
                pass
        described = [t for t in admin.describe_topics([topic])  # "name" in kafka-python 3
                     if t.get("name", t.get("topic")) == topic]
        return len(described[0]["partitions"]) if described else settings.kafka_topic_partitions
    finally:
        admin.close()


# ------------------------------------------------------------------- query
class Feeds:
    """The tile feeds of one driver: #0 a thread of it (:class:`TileFeed`), the others
    processes (:class:`pipelines.streaming.feed_process.FeedProcess`), as one."""

    def __init__(self, settings: Settings, *, new_checkpoint: bool = False,
                 partitions: int | None = None) -> None:
        """``partitions``: the tile topic's (default: ``kafka_topic_partitions``, which it is
        created with). A feed applies whole partitions, so there are at most that many: the
        default ``stream_realtime_feeds`` is cut to it, a value set explicitly must fit."""
        from pipelines.streaming.feed_process import FeedProcess

        n = settings.stream_realtime_feeds
        partitions = partitions or settings.kafka_topic_partitions
        if n > partitions:
            if "stream_realtime_feeds" in settings.model_fields_set:
                raise ValueError(
                    f"SHOPSTREAM_STREAM_REALTIME_FEEDS={n} is more than the tile topic's "
                    f"{partitions} partitions ({feed_topic(settings)}): a feed applies "
                    "whole partitions, so some would have none")
            n = partitions
        self.count = n
        self.first = TileFeed(settings, new_checkpoint=new_checkpoint, feeds=n)
        self.others = [FeedProcess(settings, k, n, new_checkpoint=new_checkpoint)
                       for k in range(1, n)]

    def start(self) -> None:
        self.first.start()
        for feed in self.others:
            feed.start()

    def check(self) -> None:
        """Raise when a feed has failed (a feed only ends when it is stopped)."""
        self.first.check()
        for feed in self.others:
            feed.check()

    def caught_up(self) -> bool:
        """Every tile the query has sent so far is in Redis."""
        return self.first.caught_up() and all(feed.caught_up() for feed in self.others)

    def stop(self, timeout_s: float = 120.0) -> None:
        """Each writes what the topic holds, then stops (all asked first, so they drain
        side by side); raises the first failure."""
        for feed in self.others:  # SIGTERM now; stop() below waits
            feed.ask_stop()
        failure: BaseException | None = None
        for feed in (self.first, *self.others):
            try:
                feed.stop(timeout_s)
            except BaseException as exc:  # noqa: BLE001 - the others still stop
                failure = failure or exc
        if failure is not None:
            raise failure


class RealtimeQuery:
    """The running Real-time query and its feeds, with the hooks :func:`pipelines.stream.run_stream` uses."""

    def __init__(self, query: StreamingQuery, feed: Feeds, spark: SparkSession,
                 settings: Settings, snapshots: bool = True) -> None:
        self.query = query
        self.feed = feed
        self.spark = spark
        self.settings = settings
        self.snapshots = snapshots
        self.checkpoint_seconds = settings.stream_realtime_checkpoint_seconds

    def check(self) -> None:
        """Raise when a feed has failed: the query alone would run on with nothing applying
        its tiles."""
        self.feed.check()

    def caught_up(self) -> bool:
        if self.query.exception() is not None:
            raise self.query.exception()  # type: ignore[misc]
        progress = self.query.lastProgress
        return (progress is not None and not progress.get("numInputRows", 0)
                and self.feed.caught_up())

    def stop(self) -> None:
        """Stop the query, then the feed; then write the snapshots its last flushes asked for
        (the caller stopped the Parquet sinks' process, which writes them while the job
        runs, first: :mod:`pipelines.streaming.rt_snapshots`).

        A Real-time epoch runs until its checkpoint, so the stop lands mid-epoch: Spark
        aborts it and logs every task's abort as an ERROR with its stack; one INFO line
        says what that means instead (nothing is lost: the epoch's input is read again on
        the next start, and its full tiles rewrite the same values)."""
        try:
            self._stop_query()
        finally:
            self.feed.stop()
        if self.snapshots and self.query.exception() is None:
            left = AskedSnapshots(self.settings, self.spark, "at the stop")
            try:
                left.drain(self.settings.stream_stop_grace_seconds)
            finally:
                left.close()

    def _stop_query(self) -> None:
        if self.query.isActive:
            log.info("real-time query %s: stopping mid-epoch; its input since the last "
                     "checkpoint (at most %ss) is read again at the next start, with the "
                     "same results", QUERY_NAME, self.checkpoint_seconds)
            group = str(self.query.runId)  # the job group of the query's epochs
            with quiet_loggers(self.spark, STOP_NOISE_LOGGERS):
                self.query.stop()
                _await_tasks(self.spark, group, STOP_TASKS_SECONDS)


STOP_TASKS_SECONDS = 10.0
"""How long a stop waits for the aborted epoch's tasks to end (they log their aborts
after ``query.stop()`` returns) before Spark's loggers are turned back on."""


def _await_tasks(spark: SparkSession, group: str, timeout_s: float) -> None:
    """Until no stage of the job group ``group`` has a running task, or ``timeout_s``."""
    tracker = spark.sparkContext.statusTracker()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        running = 0
        for job_id in tracker.getJobIdsForGroup(group):
            job = tracker.getJobInfo(job_id)
            for stage_id in job.stageIds if job is not None else ():
                stage = tracker.getStageInfo(stage_id)
                running += stage.numActiveTasks if stage is not None else 0
        if not running:
            return
        time.sleep(0.1)


STOP_NOISE_LOGGERS = (
    "org.apache.spark.broadcast.TorrentBroadcast",
    "org.apache.spark.sql.execution.datasources.v2.WriteToDataSourceV2Exec",
    "org.apache.spark.sql.execution.datasources.v2.DataWritingSparkTask",
    "org.apache.spark.util.ErrorNotifier",
    "org.apache.spark.util.Utils",
)
"""Where Spark logs the aborted epoch of a Real-time query stopped on purpose (an
``InterruptedException`` per task, "streaming shuffle writer closed before termination",
a broadcast of the next epoch's plan interrupted)."""


def required_slots(settings: Settings) -> int:
    """Task slots the Real-time driver holds: Kafka partitions + 2 one-partition stateful
    stages, all at once (with fewer free slots the pipelined stage group fails with
    CONCURRENT_SCHEDULER_INSUFFICIENT_SLOT when it starts its next batch). Nothing else
    runs beside the query in this driver: the Parquet sinks' micro-batch query and the
    feature snapshots run in a process of their own
    (:mod:`pipelines.streaming.offline_process`), on its own slots, and the snapshots
    left at a stop are written once the query has stopped."""
    return settings.kafka_topic_partitions + 2


class SlotsError(RuntimeError):
    """The Spark master has fewer task slots than the Real-time query holds at once."""


def check_slots(spark: SparkSession, settings: Settings) -> None:
    """Fail early, with the fix, when the cluster cannot hold both queries' tasks."""
    slots = spark.sparkContext.defaultParallelism
    master = spark.sparkContext.master
    if master.startswith("local"):
        inner = master[len("local"):].strip("[]").split(",")[0] or "1"
        slots = (os.cpu_count() or 1) if inner == "*" else int(inner)
    need = required_slots(settings)
    if slots < need:
        raise SlotsError(
            f"Real-time Mode needs {need} concurrent task slots ({settings.kafka_topic_partitions} "
            f"Kafka partitions + 2 stateful stages, all at once) but "
            f"{master} has {slots}; Spark would fail with "
            "CONCURRENT_SCHEDULER_INSUFFICIENT_SLOT. Set SHOPSTREAM_SPARK_MASTER=local["
            f"{need}] (threads; they may exceed the cores) or add executors.")


def realtime_tiles(spark: SparkSession, settings: Settings,
                   source_options: Mapping[str, str] | None = None) -> DataFrame:
    """What the Real-time query sends, before its sink: the events topic validated,
    deduplicated and tiled (:func:`features.tiles.keyed_tiles`), as the feed's messages.

    ``source_options`` override the Kafka source's (subscription, starting offsets, ...):
    the tile feed benchmark (``benchmarks/tile_feed.py``) makes its rows with this, from
    a topic of its own, so it measures the feed on the rows the query really sends.
    """
    from features.tiles import keyed_tiles

    tiles = keyed_tiles(_realtime_events(spark, settings, source_options),
                        slide_seconds=settings.feature_slide_seconds,
                        last_items_n=settings.feature_last_items_n)
    return tile_messages(tiles)


@contextmanager
def one_shuffle_partition(spark: SparkSession) -> Iterator[None]:
    """Queries started inside run their shuffles (the dedup's) in one partition.

    The Real-time query needs it (it holds Kafka partitions + 1 slot per stateful stage),
    and the roles shape's fold relies on it: through one shuffle partition the role rows
    of a source partition reach their tile partition in source-offset order. With two,
    two tasks interleave them, and the fold skips every row below an offset already
    applied as applied before (:mod:`pipelines.streaming.folding`): increments lost."""
    previous = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.shuffle.partitions", "1")
    try:
        yield
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", previous)


def realtime_roles(spark: SparkSession, settings: Settings,
                   source_options: Mapping[str, str] | None = None) -> DataFrame:
    """The same query without its aggregation: each valid, deduplicated event once per role
    (:func:`features.tiles.role_events`), with its source partition and offset, as Kafka
    messages keyed and partitioned as :func:`tile_messages` keys tiles. A consumer folds
    them into the same tiles (:func:`pipelines.streaming.pyfeatures.role_row` and
    ``merge_keyed``); the source offsets let it skip what a restarted query sends again.

    What ``shopstream stream`` runs with ``stream_realtime_shape=roles``; the feeds fold the
    rows (:mod:`pipelines.streaming.folding`). ``benchmarks/realtime_query.py`` measures
    its CPU against :func:`realtime_tiles`.
    """
    from features.tiles import role_events

    return tile_messages(role_events(_realtime_events(spark, settings, source_options, carry=True),
                                     slide_seconds=settings.feature_slide_seconds,
                                     carry=("source_partition", "source_offset")))


def _realtime_events(spark: SparkSession, settings: Settings,
                     source_options: Mapping[str, str] | None, *, carry: bool = False
                     ) -> DataFrame:
    """The events topic validated and deduplicated within the watermark (``carry``: with
    each event's ``source_partition`` and ``source_offset``)."""
    from pyspark.sql import functions as F

    from features.events import EVENT_IDENTITY, VALID_COLUMNS
    from features.validation import with_verdict
    from pipelines.stream import RAW_COLUMNS

    options = {"subscribe": settings.kafka_topic_events,
               "startingOffsets": settings.stream_starting_offsets, **(source_options or {})}
    raw = (spark.readStream.format("kafka").options(**settings.spark_kafka_source_options())
           .options(**options).load())
    checked = with_verdict(raw.select(*RAW_COLUMNS), now=F.col("timestamp"),
                           check_key=settings.stream_check_key)
    source = ((F.col("partition").alias("source_partition"),
               F.col("offset").alias("source_offset")) if carry else ())
    return (checked.where(F.col("reason").isNull()).select(*VALID_COLUMNS, *source)
            .withWatermark("event_time", f"{settings.feature_allowed_lateness_seconds} seconds")
            .dropDuplicates(list(EVENT_IDENTITY)))


def _has_offsets(spark: SparkSession, checkpoint: str) -> bool:
    """Whether a query has started on ``checkpoint`` before (Spark made its offset log)."""
    from pipelines.spark import uri_exists

    return uri_exists(spark, f"{checkpoint.rstrip('/')}/offsets")


def feed_topic(settings: Settings) -> str:
    """The topic from the Real-time query to its feeds: ``kafka_topic_rt_tiles`` for full
    tiles, ``<it>.roles`` for role rows (``stream_realtime_shape``): a feed takes one kind."""
    topic = settings.kafka_topic_rt_tiles
    return topic if settings.stream_realtime_shape == "tiles" else f"{topic}.roles"


def realtime_checkpoint(settings: Settings) -> str:
    """The Real-time query's checkpoint; each shape has its own (their state differs)."""
    from pipelines.stream import query_checkpoint

    name = QUERY_NAME if settings.stream_realtime_shape == "tiles" else f"{QUERY_NAME}-roles"
    return query_checkpoint(settings, name)


def tile_sink_options(settings: Settings) -> dict[str, str]:
    """The Real-time query's Kafka sink: the connection, the tile topic, and the producer's
    linger (``stream_realtime_tiles_linger_ms``: a request per tile cost the broker and
    the query's JVM a fifth of the machine at 2,000 events/s)."""
    return {**settings.spark_kafka_options(),
            "kafka.linger.ms": str(settings.stream_realtime_tiles_linger_ms),
            "topic": feed_topic(settings)}


def start_realtime(spark: SparkSession, settings: Settings, *,
                   snapshots: bool = True) -> RealtimeQuery:
    """Start the Real-time online query (see the module docstring); returns at once.
    ``snapshots=False``: no feature snapshots are written at the stop (the entities are
    still noted, and the requests stay in Redis)."""
    from pipelines.stream import check_checkpoint_topic

    checkpoint = realtime_checkpoint(settings)
    check_checkpoint_topic(spark, checkpoint, settings)
    roles = settings.stream_realtime_shape == "roles"
    out = (realtime_roles if roles else realtime_tiles)(spark, settings)
    partitions = ensure_topic(settings)
    feed = Feeds(settings, new_checkpoint=not _has_offsets(spark, checkpoint),
                 partitions=partitions)
    feed.start()
    # one shuffle partition per stateful stage: the query holds Kafka partitions + 2 slots
    try:
        with scheduler_pool(spark, STREAM_POOL), one_shuffle_partition(spark):
            query = (
                out.writeStream.queryName(QUERY_NAME)
                .outputMode("update")
                .format("kafka")
                .options(**tile_sink_options(settings))
                .option("checkpointLocation", checkpoint)
                .trigger(realTime=f"{settings.stream_realtime_checkpoint_seconds} seconds")
                .start()
            )
    except BaseException:
        feed.stop()
        raise
    log.info("real-time online query %s started (checkpoint every %ss), %s via %s to %d "
             "feed%s", QUERY_NAME, settings.stream_realtime_checkpoint_seconds,
             "role rows to fold" if roles else "tiles", feed_topic(settings), feed.count,
             "s" if feed.count > 1 else "")
    return RealtimeQuery(query, feed, spark, settings, snapshots=snapshots)
