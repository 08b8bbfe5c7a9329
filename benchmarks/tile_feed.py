"""Real-time tile feed: tile rows/s the feed writes to Redis, against the raw limit.

In Real-time Mode the query sends full tile rows to a Kafka topic and one thread of the
driver, the feed (:class:`pipelines.streaming.realtime.TileFeed`), writes them to Redis
with the touched entities' features and the top lists. The query sends rows as fast as
events come; the feed's capacity against that load decides how long any burst takes to
drain: after every epoch boundary, at a start, after a pause. The drain takes
backlog / (capacity - load), so at 80 % of capacity a 3 s stall takes 12 s to drain.

Setup, not timed: a generated backlog goes through the tiles the Real-time query
computes (the same validation, deduplication and ``keyed_tiles``:
:func:`pipelines.streaming.realtime.realtime_tiles`), in micro-batches of ``--batch``
events in update mode. It lands in a tiles topic as full tile rows, each key's tile
once per micro-batch it changed in. The query sends one per event; the feed merges
those of a poll into one, so a poll's worth of events is close to a micro-batch.

Measured, alternately (``--repeats`` times each, ABBA order), on a Redis emptied each time:

- **the feed**: a fresh :class:`TileFeed` drains the topic from its start (tile rows/s);
- **the feeds**: ``--feeds`` of them (``stream_realtime_feeds``: the first a thread, the
  others processes, each on its share of the topic's partitions) drain it together;
- **the peer, raw Kafka + raw Redis**: a plain kafka-python consumer polls the same
  topic, and one pipelined ``HSET`` per row goes to the same redis-server. That is the
  cost of moving the rows alone, with no features.

Then the same rows in **live-sized flushes** (``--live-flush`` rows each, read from the
topic once, so Kafka is out of both): a drain takes up to 30,000 rows a flush and merges
the rows of one tile, but caught up the feed flushes every 20 ms, about 80 rows at
2,000 events/s, each row a touch of its own. Its cost per row there (thread CPU) is what
the live load costs it; the peer writes the same flushes with one pipelined ``HSET`` a row.

``--shape`` picks what the query sends (``stream_realtime_shape``): ``roles``, the default,
each valid event once per role with its source offset, which the feed folds into the
tiles (:class:`pipelines.streaming.folding.RoleFolder`) before it writes them, in the
drains and in the live-sized flushes alike; ``tiles``, full tile rows from the query's
aggregation. Either way the peer moves the same messages raw.

Last, the **top write** the first feed makes up to four times a second, for ``--top-keys``
sales keys with each of ``--top-changes`` sales between two writes: the feed's (only the
lists whose units changed are ranked again,
:class:`pipelines.streaming.pyfeatures.TopLists`), every list ranked (the feed's before),
and the peer, raw Redis writing the same lists whole with no ranking.

Usage: ``python -m benchmarks.tile_feed [--events N] [--batch B] [--repeats R] [--live-flush F]
[--feeds K] [--shape roles|tiles] [--top-keys N] [--top-changes 10,200]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS_DIR, BenchResult, bench_settings, plot_bars

__all__ = ["main"]

DRAIN_TIMEOUT_S = 900.0
TOPIC_PARTITIONS = 2
"""The tiles topic's partitions: as many feeds at most (one per core here)."""
LIVE_FLUSH_ROWS = 80
"""Rows per flush when the feed keeps up at 2,000 events/s: about 4,000 tile rows/s, a flush
every 20 ms (``pipelines.streaming.realtime.MIN_CYCLE_S``)."""


def _say(text: str) -> None:
    print(f"[tile feed] {text}", flush=True)


def _tiles_topic(settings: Any, spark: Any, events_topic: str, batch: int) -> int:
    """The backlog's messages as the Real-time query of ``settings.stream_realtime_shape``
    sends them, in the feed's topic (:func:`pipelines.streaming.realtime.feed_topic`);
    returns their count."""
    from pipelines.streaming.realtime import (
        ensure_topic,
        feed_topic,
        one_shuffle_partition,
        realtime_roles,
        realtime_tiles,
    )

    ensure_topic(settings)
    build = realtime_roles if settings.stream_realtime_shape == "roles" else realtime_tiles
    out = build(spark, settings, {"subscribe": events_topic, "startingOffsets": "earliest",
                                  "maxOffsetsPerTrigger": str(batch)})
    topic = feed_topic(settings)
    with one_shuffle_partition(spark):  # as the job's query: role rows in offset order
        query = (out.writeStream.queryName("bench-tile-rows").outputMode("update")
                 .format("kafka").options(**settings.spark_kafka_options())
                 .option("topic", topic)
                 .option("checkpointLocation",
                         str(Path(settings.data_dir) / "checkpoints" / topic))
                 .trigger(availableNow=True).start())
    query.awaitTermination()
    return _topic_size(settings, topic)


def _topic_size(settings: Any, topic: str) -> int:
    from kafka import TopicPartition

    from pipelines.connections import kafka_consumer

    consumer = kafka_consumer(settings)
    try:
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or [])]
        return sum(consumer.end_offsets(tps).values())
    finally:
        consumer.close()


def _rewind_feed_group(settings: Any) -> None:
    """The feed's consumer group back at the topic's start (the feed resumes from it)."""
    from kafka import TopicPartition
    from kafka.structs import OffsetAndMetadata

    from pipelines.connections import kafka_consumer
    from pipelines.streaming.realtime import FEED_GROUP, feed_topic

    topic = feed_topic(settings)
    consumer = kafka_consumer(settings, group_id=FEED_GROUP)
    try:
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or [])]
        consumer.assign(tps)
        consumer.commit({tp: OffsetAndMetadata(0, "", -1) for tp in tps})
    finally:
        consumer.close()


def _empty_redis(settings: Any) -> None:
    from pipelines.connections import redis_client

    client = redis_client(settings)
    try:
        client.flushdb()
    finally:
        client.close()


def _redis_keys(settings: Any) -> int:
    from pipelines.connections import redis_client

    client = redis_client(settings)
    try:
        return int(client.dbsize())
    finally:
        client.close()


def _feed_run(settings: Any, rows: int, feeds: int = 1) -> float:
    """Seconds ``feeds`` fresh feeds (:class:`pipelines.streaming.realtime.Feeds`) take to
    write every row of the topic."""
    from pipelines.streaming.realtime import Feeds

    _empty_redis(settings)
    _rewind_feed_group(settings)
    feed = Feeds(settings.model_copy(update={"stream_realtime_feeds": feeds}))
    started = time.monotonic()
    feed.start()
    try:
        while not feed.caught_up():
            if time.monotonic() - started > DRAIN_TIMEOUT_S:
                raise RuntimeError(f"the feed did not write {rows:,} tile rows in "
                                   f"{DRAIN_TIMEOUT_S:.0f} s")
            time.sleep(0.02)
        return time.monotonic() - started
    finally:
        feed.stop()


def _raw_run(settings: Any, rows: int) -> float:
    """Seconds a plain consumer takes to poll every row and ``HSET`` each to Redis."""
    from kafka import TopicPartition

    from pipelines.connections import kafka_consumer, redis_client
    from pipelines.streaming.realtime import feed_topic

    _empty_redis(settings)
    topic = feed_topic(settings)
    consumer = kafka_consumer(settings)
    client = redis_client(settings)
    try:
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or [])]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        started, seen = time.monotonic(), 0
        while seen < rows:
            if time.monotonic() - started > DRAIN_TIMEOUT_S:
                raise RuntimeError(f"the plain consumer read {seen:,} of {rows:,} rows in "
                                   f"{DRAIN_TIMEOUT_S:.0f} s")
            polled = consumer.poll(timeout_ms=200, max_records=10_000)
            pipe = client.pipeline(transaction=False)
            for part in polled.values():
                for record in part:
                    pipe.hset(b"bench:tile:" + (record.key or b""), b"v", record.value)
                    seen += 1
            pipe.execute()
        return time.monotonic() - started
    finally:
        consumer.close()
        client.close()


def _topic_records(settings: Any, rows: int) -> list[tuple[int, bytes, float]]:
    """Every message of the feed's topic (partition, value, send time in epoch seconds), as a
    consumer polls them."""
    from kafka import TopicPartition

    from pipelines.connections import kafka_consumer
    from pipelines.streaming.realtime import feed_topic

    topic = feed_topic(settings)
    consumer = kafka_consumer(settings)
    try:
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or [])]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        records: list[tuple[int, bytes, float]] = []
        started = time.monotonic()
        while len(records) < rows:
            if time.monotonic() - started > DRAIN_TIMEOUT_S:
                raise RuntimeError(f"read {len(records):,} of {rows:,} tile rows in "
                                   f"{DRAIN_TIMEOUT_S:.0f} s")
            for part in consumer.poll(timeout_ms=200, max_records=10_000).values():
                records.extend((r.partition, r.value, r.timestamp / 1000) for r in part)
        return records
    finally:
        consumer.close()


def _live_feed_run(settings: Any, records: list[tuple[int, bytes, float]], flush_rows: int
                   ) -> tuple[float, float, int]:
    """(seconds, thread CPU seconds, role rows skipped as applied before: 0 unless the
    setup's rows came out of offset order) the feed's writer takes for ``records`` in flushes of
    ``flush_rows``, with the feed's collector settings, on an emptied Redis; role rows are
    folded first and the fold's rows and marks stored after each flush: the feed's own step
    (:func:`pipelines.streaming.realtime.apply_rows`)."""
    from pipelines.streaming.folding import RoleFolder
    from pipelines.streaming.heap import HeapFreezer, YoungThreshold
    from pipelines.streaming.realtime import RealtimeWriter, apply_rows

    _empty_redis(settings)
    writer = RealtimeWriter(settings)
    folder = RoleFolder(settings) if settings.stream_realtime_shape == "roles" else None
    young = YoungThreshold(settings.stream_realtime_gc_young_threshold)
    heap = HeapFreezer(settings.stream_realtime_gc_freeze_seconds)
    writer.connect()
    young.install()
    try:
        started, cpu, skipped = time.monotonic(), time.thread_time(), 0
        for i in range(0, len(records), flush_rows):
            skipped += apply_rows(writer, folder, records[i:i + flush_rows])
            heap.step()
        writer.flush(final=True)
        return time.monotonic() - started, time.thread_time() - cpu, skipped
    finally:
        young.remove()
        writer.disconnect()


def _live_raw_run(settings: Any, records: list[tuple[int, bytes, float]], flush_rows: int
                  ) -> float:
    """Seconds one pipelined ``HSET`` per row takes for ``records``, a pipeline per flush."""
    from pipelines.connections import redis_client

    _empty_redis(settings)
    client = redis_client(settings)
    try:
        started = time.monotonic()
        for i in range(0, len(records), flush_rows):
            pipe = client.pipeline(transaction=False)
            for n, (_, value, _) in enumerate(records[i:i + flush_rows]):
                pipe.hset(b"bench:tile:%d" % ((i + n) % 50_000), b"v", value)
            pipe.execute()
        return time.monotonic() - started
    finally:
        client.close()


TOP_WRITES = 12
"""Top writes timed per system and number of changes (after two not timed)."""


def _sales_keys(keys: int) -> list[tuple[str, str, str]]:
    """Up to ``keys`` distinct (item, category, region) keys, the same each call: items of
    70 categories (an item's category is its own) sold in 5 regions."""
    import random

    rnd = random.Random(keys)
    return sorted({(f"item-{i}", f"cat-{i % 70}",
                    rnd.choice(("north", "south", "east", "west", "central")))
                   for i in (rnd.randrange(max(keys // 2, 1)) for _ in range(keys))})


def _top_write_run(settings: Any, keys: int, changes: int, which: str
                   ) -> tuple[float, dict[bytes, Any]]:
    """Median seconds of a top write for ``keys`` sales keys with ``changes`` sales between
    two writes, on an emptied Redis. ``which``: ``lists``, the feed's top write (the totals'
    :class:`~pipelines.streaming.pyfeatures.TopLists`, changed lists ranked again, then
    written: :func:`~pipelines.streaming.realtime.write_top`); ``full``, every list ranked from the
    totals into rows for :func:`~pipelines.online_writer.write_top_items` (the feed's top
    write before TopLists); ``raw``, the peer: the same lists written with a pipelined
    ``DEL``, ``ZADD`` and ``EXPIRE`` each, no ranking. The same seeded sales for all three,
    so each leaves the same sorted sets in Redis (returned: name -> members and scores)."""
    import random

    from pipelines import online_writer
    from pipelines.connections import redis_client
    from pipelines.streaming import pyfeatures as pyf
    from pipelines.streaming.realtime import _scope, write_top

    rnd = random.Random(keys + 1)
    slide = settings.feature_slide_seconds
    current = 1_700_000_400 - 1_700_000_400 % slide
    sales = _sales_keys(keys)
    totals = pyf.SalesTotals(current, slide, {k: {"1h": rnd.choice((0, 0, 1, 2, 3)),
                                                  "24h": rnd.randint(1, 40)} for k in sales})
    top_n = settings.feature_top_n
    written = online_writer.TopListsWritten()
    _empty_redis(settings)
    client = redis_client(settings)
    times = []
    try:
        for n in range(TOP_WRITES + 2):
            for _ in range(changes):
                totals.change(current, rnd.choice(sales), rnd.randint(1, 3))
            as_of = pyf.from_us((current + 30) * 1_000_000 + n * 1000)
            lists = {} if which != "raw" else {  # untimed for the peer: it only writes them
                (k, w, _scope(c, r)): m for (k, w, c, r), m in totals.top_lists(top_n=top_n).items()}
            started = time.perf_counter()
            if which == "lists":
                write_top(client, totals, as_of, top_n=top_n, written=written)
            elif which == "full":
                online_writer.write_top_items(
                    client, pyf.rank_top_items(totals.units, as_of, top_n=top_n), top_n=top_n,
                    prune=True, written=written)
            else:
                pipe = client.pipeline(transaction=False)
                for spec, members in lists.items():
                    name = online_writer.top_item_key(*spec)
                    pipe.delete(name)
                    pipe.zadd(name, members)
                    pipe.expire(name, 3600)
                pipe.execute()
            if n >= 2:
                times.append(time.perf_counter() - started)
        left = {name: client.zrange(name, 0, -1, withscores=True)
                for name in client.scan_iter(count=1000) if client.type(name) == b"zset"}
        return statistics.median(times), left
    finally:
        client.close()


def main(argv: list[str] | None = None) -> BenchResult:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=200_000, help="backlog events")
    parser.add_argument("--batch", type=int, default=2_000,
                        help="events per micro-batch of the tile rows' setup")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each, alternating")
    parser.add_argument("--live-flush", type=int, default=LIVE_FLUSH_ROWS,
                        help="rows per flush in the live-sized runs")
    parser.add_argument("--feeds", type=int, default=TOPIC_PARTITIONS,
                        help=f"feeds side by side in the third drain (1: no such run; at most "
                             f"the topic's {TOPIC_PARTITIONS} partitions)")
    parser.add_argument("--shape", choices=("roles", "tiles"), default="roles",
                        help="what the Real-time query sends the feed (stream_realtime_shape; "
                             "default roles, the job's default): role rows to fold, or whole tiles")
    parser.add_argument("--top-keys", type=int, default=12_000,
                        help="sales keys (item, category, region) of the top-write runs "
                             "(0: none)")
    parser.add_argument("--top-changes", default="10,200",
                        help="sales between two top writes, one run each (comma-separated)")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR, help="where plots go")
    args = parser.parse_args(argv if argv is not None else [])
    if min(args.events, args.batch, args.repeats, args.live_flush, args.feeds) <= 0:
        parser.error("--events, --batch, --repeats, --live-flush and --feeds must be positive")
    if args.feeds > TOPIC_PARTITIONS:
        parser.error(f"--feeds: at most the tile topic's {TOPIC_PARTITIONS} partitions")
    try:
        top_changes = [int(x) for x in args.top_changes.split(",") if x.strip()]
    except ValueError:
        parser.error(f"--top-changes: comma-separated whole numbers, not {args.top_changes!r}")
    if args.top_keys < 0 or any(n <= 0 for n in top_changes):
        parser.error("--top-keys must be 0 or more and --top-changes positive")

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from benchmarks.streaming_throughput import _backlog
    from pipelines.infra import KafkaBroker, RedisServer
    from pipelines.spark import spark_session

    tag = uuid.uuid4().hex[:8]
    what = "role rows" if args.shape == "roles" else "tile rows"
    did = "role rows folded into tiles" if args.shape == "roles" else "tiles"
    events_topic = f"bench.tf.{tag}"
    settings = bench_settings("tile_feed", kafka_topic_partitions=TOPIC_PARTITIONS,
                              spark_master="local[2]",
                              spark_shuffle_partitions=2,
                              # the fold's marks are per events topic: the backlog's
                              kafka_topic_events=events_topic,
                              kafka_topic_rt_tiles=f"bench.tiles.{tag}",
                              stream_realtime_shape=args.shape)
    broker, redis = KafkaBroker(settings), RedisServer(settings)
    redis.start()
    broker.start()
    result = BenchResult(
        name="tile_feed",
        title="Real-time tile feed: tile rows/s written to Redis with the features",
        targets={"capacity": "well above the rows the Real-time query sends "
                             "(about 2,000-2,600/s at 1,000 events/s)"},
    )
    try:
        _say(f"backlog of {args.events:,} events")
        _backlog(settings, events_topic, args.events)
        spark = spark_session(settings, app_name="bench-tile-feed")
        try:
            rows = _tiles_topic(settings, spark, events_topic, args.batch)
        finally:
            spark.stop()
        _say(f"{rows:,} {what} (micro-batches of {args.batch:,} events)")
        systems = ["raw", "feed"] + (["feeds"] if args.feeds > 1 else [])
        times: dict[str, list[float]] = {k: [] for k in systems}
        keys: dict[str, int] = {}  # what a run left in Redis: the feed's features and tiles
        drains = [w for r in range(args.repeats)  # ABC CBA ...
                  for w in (systems if r % 2 == 0 else systems[::-1])]
        order = [("raw", "feed")[(i + i // 2) % 2] for i in range(2 * args.repeats)]  # ABBA...
        for i, which in enumerate(drains, 1):
            seconds = (_raw_run(settings, rows) if which == "raw" else
                       _feed_run(settings, rows, args.feeds if which == "feeds" else 1))
            times[which].append(seconds)
            keys[which] = _redis_keys(settings)
            _say(f"run {i}/{len(drains)}, {which}: {rows:,} rows in {seconds:.2f} s "
                 f"({rows / seconds:,.0f} rows/s)")
        median = {k: statistics.median(v) for k, v in times.items()}
        result.rows.append({"system": f"shopstream TileFeed ({did}, features, top lists)",
                            "rows": rows, "runs": len(times["feed"]),
                            "median_s": median["feed"], "rows_per_s": rows / median["feed"],
                            "runs_s": ", ".join(f"{s:.2f}" for s in times["feed"]),
                            "redis_keys": keys["feed"]})
        result.rows.append({"system": "plain Kafka consumer + pipelined HSET per row (raw limit)",
                            "rows": rows, "runs": len(times["raw"]),
                            "median_s": median["raw"], "rows_per_s": rows / median["raw"],
                            "runs_s": ", ".join(f"{s:.2f}" for s in times["raw"]),
                            "redis_keys": keys["raw"]})
        result.ratios["tile rows/s: the feed / raw Kafka + raw Redis"] = median["raw"] / median["feed"]
        if "feeds" in median:
            result.rows.append({"system": f"shopstream {args.feeds} feeds side by side (one "
                                          "thread, the others processes; by partition)",
                                "rows": rows, "runs": len(times["feeds"]),
                                "median_s": median["feeds"], "rows_per_s": rows / median["feeds"],
                                "runs_s": ", ".join(f"{s:.2f}" for s in times["feeds"]),
                                "redis_keys": keys["feeds"]})
            result.ratios[f"tile rows/s: {args.feeds} feeds / raw Kafka + raw Redis"] = (
                median["raw"] / median["feeds"])
            result.ratios[f"tile rows/s: {args.feeds} feeds / one feed"] = (
                median["feed"] / median["feeds"])
        records = _topic_records(settings, rows)
        live: dict[str, list[float]] = {"feed": [], "raw": [], "cpu": [], "skipped": []}
        for i, which in enumerate(order, 1):
            if which == "feed":
                seconds, cpu, skipped = _live_feed_run(settings, records, args.live_flush)
                live["cpu"].append(cpu)
                live["skipped"].append(skipped)
            else:
                seconds = _live_raw_run(settings, records, args.live_flush)
            live[which].append(seconds)
            _say(f"live-sized flushes, run {i}/{len(order)}, {which}: {rows:,} rows in "
                 f"{seconds:.2f} s ({rows / seconds:,.0f} rows/s)")
        live_median = {k: statistics.median(v) for k, v in live.items()}
        result.rows.append({"system": f"shopstream feed's writer, flushes of {args.live_flush} rows",
                            "rows": rows, "runs": len(live["feed"]),
                            "median_s": live_median["feed"],
                            "rows_per_s": rows / live_median["feed"],
                            "cpu_us_per_row": live_median["cpu"] / rows * 1e6,
                            # every role row folded: none taken for one applied before
                            "skipped": max(live["skipped"]),
                            "runs_s": ", ".join(f"{s:.2f}" for s in live["feed"])})
        result.rows.append({"system": f"pipelined HSET per row, flushes of {args.live_flush} rows "
                                      "(raw Redis)",
                            "rows": rows, "runs": len(live["raw"]),
                            "median_s": live_median["raw"],
                            "rows_per_s": rows / live_median["raw"],
                            "runs_s": ", ".join(f"{s:.2f}" for s in live["raw"])})
        result.ratios[f"tile rows/s in flushes of {args.live_flush}: the feed / raw Redis"] = (
            live_median["raw"] / live_median["feed"])
        result.notes.append(
            f"{args.events:,} generated events (2 % malformed, duplicates) in micro-batches of "
            f"{args.batch:,}: {rows:,} {what} (SHOPSTREAM_STREAM_REALTIME_SHAPE={args.shape}; "
            f"the rows of every figure here) on {TOPIC_PARTITIONS} partitions; drains in "
            f"the order {', '.join(drains)}, Redis emptied before each, the feeds fresh ones "
            "each time")
        result.notes.append(
            f"live-sized flushes: the same rows from memory (Kafka out of both), "
            f"{args.live_flush} a flush, one touch per row; the feed's thread CPU per row is "
            "what the live load costs it (rows/s x CPU per row = the share of a core it needs)")
        for changes in top_changes if args.top_keys else []:
            top_s, left = {}, {}
            for which in ("lists", "full", "raw"):
                top_s[which], left[which] = _top_write_run(settings, args.top_keys, changes,
                                                           which)
                _say(f"top writes, {args.top_keys:,} sales keys, {changes} sales between two, "
                     f"{which}: {top_s[which] * 1e3:.1f} ms")
            for which, system in (
                    ("lists", "shopstream top write (lists whose units changed ranked again)"),
                    ("full", "shopstream top write, every list ranked (before TopLists)"),
                    ("raw", "raw Redis: DEL + ZADD + EXPIRE of every list (no ranking)")):
                result.rows.append({"system": f"{system}, {changes} sales between writes",
                                    "rows": len(_sales_keys(args.top_keys)),
                                    "runs": TOP_WRITES,
                                    "median_s": top_s[which], "top_lists": len(left[which]),
                                    # the lists it left are the feed's: ranked alike
                                    "same_lists": left[which] == left["lists"]})
            result.ratios[f"top writes/s, {changes} sales between writes: shopstream / raw "
                          "Redis"] = top_s["raw"] / top_s["lists"]
            result.ratios[f"top writes/s, {changes} sales between writes: changed lists "
                          "ranked / every list ranked"] = top_s["full"] / top_s["lists"]
        if args.top_keys:
            result.notes.append(
                f"top writes: up to {args.top_keys:,} generated sales keys (rows: the keys; "
                f"items of 70 categories sold in 5 regions), top {settings.feature_top_n}, the "
                f"median of {TOP_WRITES} writes after 2, each after that many random sales; "
                "the peer writes the same lists whole, unranked")
        bars: dict[str, list[float | None]] = {
            "shopstream feed": [rows / median["feed"], rows / live_median["feed"]],
            "raw peer": [rows / median["raw"], rows / live_median["raw"]],
        }
        if "feeds" in median:  # drains only: the live-sized runs measure one writer's cost
            bars[f"shopstream, {args.feeds} feeds"] = [rows / median["feeds"], None]
        result.plots.append(str(plot_bars(
            ["drain", f"flushes of {args.live_flush}"],
            {"tile rows/s (median)": bars},
            args.results_dir / "tile_feed.png", title="Real-time tile feed")))
    finally:
        broker.stop()
        redis.stop()
    return result


if __name__ == "__main__":  # pragma: no cover
    from benchmarks.common import write_result

    write_result(main(sys.argv[1:]))
