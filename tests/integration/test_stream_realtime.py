"""The Real-time Mode online path: same tiles and features as features/, and end to end.

The Real-time writer cannot call DataFrame functions (it runs per row on the
executors), so its one-aggregation tiles and its Python finalize must agree
with :mod:`features.tiles` / :mod:`features.windows`; these tests pin that.
The end-to-end test runs ``shopstream stream --mode realtime`` (micro-batch
query for the Parquet sinks + Real-time query for Redis) on the data set of
``test_stream.py``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from pipelines.settings import Settings
from tests.integration.test_stream import (
    REPO,
    _env,
    check_stores,
    create_topic,
    expected_outcome,
    produce,
    stream_settings,
    wave1,
)
from tests.integration.test_stream_state import EVENT_SCHEMA, _events, _sorted_rows

pytestmark = pytest.mark.integration

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

AS_OF = datetime(2024, 6, 1, 11, 14, 30, tzinfo=UTC)


def _rt_rows(spark: Any, events: Any) -> dict[str, list[dict[str, Any]]]:
    from features.tiles import keyed_tiles
    from pipelines.streaming.pyfeatures import TILE_OF_ROW

    out: dict[str, list[dict[str, Any]]] = {"user": [], "item": [], "sales": []}
    for row in keyed_tiles(events, slide_seconds=60, last_items_n=4).collect():
        out[row["kind"]].append(row.asDict(recursive=True))
    out["user_tiles"] = [dict(TILE_OF_ROW["user"](r), user_id=r["key"]) for r in out["user"]]
    out["item_tiles"] = [dict(TILE_OF_ROW["item"](r), item_id=r["key"]) for r in out["item"]]
    return out


def test_a_static_batch_is_tiled_as_the_streaming_aggregation_tiles_it(spark: Any) -> None:
    """keyed_tiles groups a static batch by a hash and the tile's start (a faster sort), and
    a stream by the watermarked window: the same rows, in one shuffle when partitioned."""
    from pyspark.sql import functions as F

    from features.tiles import keyed_tiles

    def ordered(tiles: Any) -> Any:  # the two arrays whose order is unspecified
        return tiles.withColumns({c: F.array_sort(c) for c in ("items_viewed", "category_weights")})

    events = spark.createDataFrame(_events(600, 5), EVENT_SCHEMA)
    windowed = ordered(keyed_tiles(events, slide_seconds=60, last_items_n=4, windowed=True))
    batch = keyed_tiles(events, slide_seconds=60, last_items_n=4, partitions=3)
    assert batch.schema == windowed.schema
    assert ordered(batch).count() == windowed.count() > 100
    assert (ordered(batch).exceptAll(windowed).count() == 0
            and windowed.exceptAll(ordered(batch)).count() == 0)
    plan = batch._jdf.queryExecution().executedPlan().toString()
    assert "_group_hash" in plan and "window" not in plan.lower()
    assert plan.count("Exchange") == 1, plan
    # each latest-value column is computed only for the kinds that read it (KEYED_TILE_COLUMNS)
    filled = {row["kind"]: row.asDict() for row in batch.groupBy("kind").agg(
        *[F.count(c).alias(c) for c in ("category_id", "region", "item_id", "price", "price_us")],
        F.count("*").alias("rows")).collect()}
    assert filled["user"] == dict(kind="user", category_id=0, region=0, item_id=0, price=0,
                                  price_us=0, rows=filled["user"]["rows"])
    assert filled["item"]["item_id"] == 0 and filled["sales"]["price"] == 0
    assert filled["sales"]["price_us"] == 0
    assert filled["item"]["category_id"] == filled["item"]["rows"] > 0
    assert filled["item"]["price"] > 0
    assert filled["sales"]["item_id"] == filled["sales"]["rows"] > 0


def _flush_rows(writer: Any, rows: Any) -> None:
    """Add every tile row to a connected ``RealtimeWriter`` and flush them as a final flush."""
    for row in rows:
        writer.add(row)
    writer.flush(final=True)


def _assert_online_equals(got: dict[str, Any], want: dict[str, Any], key: str) -> None:
    """Online features read back equal the expected ones: floats to 1e-9, the rest exactly."""
    assert got.keys() >= want.keys(), key
    for name, value in want.items():
        if isinstance(value, float):
            assert got[name] == pytest.approx(value, rel=1e-9, abs=1e-12), (key, name)
        else:
            assert got[name] == value, (key, name)


def test_one_aggregation_gives_the_tiles_of_features_tiles(spark: Any) -> None:
    from features.tiles import item_tiles, sales_tiles, user_tiles

    events = spark.createDataFrame(_events(400, 21), EVENT_SCHEMA)
    rt = _rt_rows(spark, events)
    expected_users = {(r["user_id"], r["tile_start"]): r.asDict(recursive=True) for r in
                      user_tiles(events, slide_seconds=60, last_items_n=4).collect()}
    assert len(rt["user_tiles"]) == len(expected_users)
    for tile in rt["user_tiles"]:
        want = expected_users[(tile["user_id"], tile["tile_start"])]
        assert (tile["views"], tile["carts"], tile["purchases"]) == (
            want["views"], want["carts"], want["purchases"])
        assert tile["spend"] == pytest.approx(want["spend"], rel=1e-12)
        assert sorted(tile["items_viewed"]) == sorted(want["items_viewed"])
        assert sorted((c["category_id"], c["weight"]) for c in tile["category_weights"]) == sorted(
            (c["category_id"], c["weight"]) for c in want["category_weights"])
        assert [e["item_id"] for e in tile["last_viewed"]] == [
            e["item_id"] for e in want["last_viewed"]]
    expected_items = _sorted_rows(item_tiles(events, slide_seconds=60), ["item_id", "tile_start"])
    got_items = sorted(rt["item_tiles"], key=lambda r: (r["item_id"], str(r["tile_start"])))
    assert [(r["item_id"], r["tile_start"], r["category_id"], r["views"], r["units"])
            for r in got_items] == [(r["item_id"], r["tile_start"], r["category_id"], r["views"],
                                     r["units"]) for r in expected_items]
    expected_sales = {(r["item_id"], r["category_id"], r["region"], r["tile_start"]):
                      (r["purchases"], r["units"]) for r in
                      sales_tiles(events, slide_seconds=60).collect()}
    assert {(r["item_id"], r["category_id"], r["region"], r["tile_start"]):
            (r["purchases"], r["units"]) for r in rt["sales"]} == expected_sales


def test_python_finalize_agrees_with_features_windows(spark: Any) -> None:
    from features.tiles import item_tiles, sales_tiles, user_tiles
    from features.windows import (
        finalize_item_features,
        finalize_top_items,
        finalize_user_features,
    )
    from pipelines.streaming.pyfeatures import finalize_item, finalize_user, top_items

    # events over 2 hours, as of a time inside the last tile: both windows and the head matter
    events = spark.createDataFrame(
        _events(600, 22, start=AS_OF - timedelta(hours=2), span_s=7200), EVENT_SCHEMA
    ).where(f"event_time <= timestamp'{AS_OF:%Y-%m-%d %H:%M:%S}'")
    rt = _rt_rows(spark, events)

    spark_users = {r["user_id"]: r.asDict() for r in finalize_user_features(
        user_tiles(events, slide_seconds=60, last_items_n=4), AS_OF, slide_seconds=60,
        last_items_n=4).collect()}
    by_user: dict[str, list[dict[str, Any]]] = {}
    for tile in rt["user_tiles"]:
        by_user.setdefault(tile["user_id"], []).append(tile)
    assert set(by_user) == set(spark_users)
    for user, tiles in by_user.items():
        mine = finalize_user(user, tiles, AS_OF, slide_seconds=60, last_items_n=4)
        want = spark_users[user]
        for name, value in mine.items():
            expected = want[name]
            if name in ("event_timestamp", "last_event_time") and expected is not None:
                expected = expected.replace(tzinfo=UTC)
            if isinstance(value, float):
                assert value == pytest.approx(expected, rel=1e-9), (user, name)
            elif name == "category_affinity_weights":
                assert value == pytest.approx(expected), (user, name)
            else:
                assert value == expected, (user, name)

    spark_items = {r["item_id"]: r.asDict() for r in finalize_item_features(
        item_tiles(events, slide_seconds=60), AS_OF, slide_seconds=60).collect()}
    by_item: dict[str, list[dict[str, Any]]] = {}
    for tile in rt["item_tiles"]:
        by_item.setdefault(tile["item_id"], []).append(tile)
    for item, tiles in by_item.items():
        mine = finalize_item(item, tiles, AS_OF, slide_seconds=60)
        want = spark_items[item]
        for name, value in mine.items():
            expected = want[name]
            if name == "event_timestamp":
                expected = expected.replace(tzinfo=UTC)
            if isinstance(value, float):
                assert value == pytest.approx(expected, rel=1e-9), (item, name)
            else:
                assert value == expected, (item, name)

    spark_top = sorted((r["kind"], r["window"], r["category_id"] or "", r["region"] or "",
                        r["rank"], r["item_id"], round(r["score"], 9))
                       for r in finalize_top_items(sales_tiles(events, slide_seconds=60), AS_OF,
                                                   slide_seconds=60, top_n=3).collect())
    mine_top = sorted((r["kind"], r["window"], r["category_id"] or "", r["region"] or "",
                       r["rank"], r["item_id"], round(r["score"], 9))
                      for r in top_items(rt["sales"], AS_OF, slide_seconds=60, top_n=3))
    assert mine_top == spark_top and spark_top


def test_rows_after_a_throttled_top_write_reach_the_lists_on_the_final_flush(
    spark: Any, settings: Settings, redis_client: Any,
) -> None:
    """Top lists are ranked at most every TOP_EVERY_SECONDS (longer after a slow ranking);
    rows that change a sales tile right after a top write must still reach the lists when nothing more is waiting
    (the bug that left the corpus's sales out of the lists at the end of a Real-time epoch)."""
    from pipelines.online_writer import top_item_key
    from pipelines.streaming.realtime import RealtimeWriter

    rows, last_rows, late_item = _rows_and_last(spark)
    writer = RealtimeWriter(settings)
    writer.connect()
    try:
        for row in rows:
            writer.add(row)
        writer.flush()  # tiles and the top lists (the first top write)
        key = top_item_key("top", "1h", "global")
        assert redis_client.exists(key)
        for row in last_rows:
            writer.add(row)
        writer.flush()  # within the throttle: tiles written, lists not yet
        assert late_item not in {m.decode() for m in redis_client.zrange(key, 0, -1)}
        writer.flush(final=True)
        assert late_item in {m.decode() for m in redis_client.zrange(key, 0, -1)}
    finally:
        writer.disconnect()


def test_a_feed_without_the_sales_writes_a_stray_sales_tile_but_no_lists_and_says_so(
    spark: Any, settings: Settings, redis_client: Any, caplog: pytest.LogCaptureFixture,
) -> None:
    """A sales tile on another partition than the sales feed's (sent by a query from before
    that rule) is written by the feed that reads it, never dropped; that feed keeps no
    totals, so it ranks no lists, and a WARNING says the lists take the change later."""
    import logging

    from pipelines.online_writer import top_item_key
    from pipelines.streaming.realtime import RealtimeWriter, _decode_tile, rt_tiles_key

    rows, last_rows, _ = _rows_and_last(spark)
    caplog.set_level(logging.WARNING, logger="pipelines.streaming.realtime")
    writer = RealtimeWriter(settings, sales=False, feed=1)
    writer.connect()
    try:
        for row in rows + last_rows:
            writer.add(row)
        writer.flush(final=True)
    finally:
        writer.disconnect()
    sales = [r for r in rows + last_rows if r["kind"] == "sales"]
    assert sales
    for row in sales:
        stored = redis_client.hget(rt_tiles_key("sales", str(row["tile_start"])), row["key"])
        assert stored is not None and _decode_tile(stored)["units"] == row["units"]
    assert not redis_client.exists(top_item_key("top", "1h", "global"))
    warned = [r.getMessage() for r in caplog.records if "is not on partition 0" in r.getMessage()]
    assert len(warned) == 1, warned  # once, not per tile
    assert "feed #1" in warned[0]


def test_items_keep_their_windows_across_a_day_of_flushes_and_late_tiles(
    spark: Any, settings: Settings, redis_client: Any,
) -> None:
    """The feed keeps each item's sums as of its clock (``RunningItems``) and reads only the
    tiles that leave its windows. Over 26 hours of events written in eight flushes, each
    with late events in new tiles and in stored ones, out of the hour (some out of the
    day), every item a flush touches is online with :func:`finalize_item` over all its
    tiles so far."""
    import random

    from features.feast_layout import ITEM_STATS
    from pipelines.streaming.pyfeatures import TILE_OF_ROW, finalize_item, from_us
    from pipelines.streaming.realtime import RealtimeWriter, rt_clock_key
    from pipelines.verify import _normalized, _read_online

    rnd = random.Random(5)
    events = sorted(_events(480, 31, start=AS_OF - timedelta(hours=26), span_s=26 * 3600),
                    key=lambda e: e[2])
    parts = [events[i * 60:(i + 1) * 60] for i in range(8)]
    for k, part in enumerate(parts[1:], start=1):
        earlier = [e for p in parts[:k] for e in p]
        for j in range(3):  # copies of this part's events 1-30 hours behind its first one
            e = rnd.choice(part)
            part.append((f"late-{k}-{j}", e[1], part[0][2] - timedelta(minutes=rnd.randint(60, 1800)),
                         *e[3:]))
        for j in range(3):  # and of earlier events, into their (stored) tiles
            part.append((f"again-{k}-{j}", *rnd.choice(earlier)[1:]))
    writer = RealtimeWriter(settings)
    writer.connect()
    seen: list[tuple] = []
    try:
        for part in parts:
            seen += part
            every = keyed_rows_of(spark, spark.createDataFrame(seen, EVENT_SCHEMA))
            touched = {(r["kind"], r["key"], r["tile_start"])
                       for r in keyed_rows_of(spark, spark.createDataFrame(part, EVENT_SCHEMA))}
            # full tiles, as the Real-time query emits them
            _flush_rows(writer, [row for row in every
                                 if (row["kind"], row["key"], row["tile_start"]) in touched])
            as_of = from_us(int(redis_client.get(rt_clock_key())))
            items = sorted({key for kind, key, _ in touched if kind == "item"})
            online = _read_online(redis_client, ITEM_STATS, items)
            for item in items:
                tiles = [TILE_OF_ROW["item"](r) for r in every
                         if r["kind"] == "item" and r["key"] == item]
                want = _normalized(ITEM_STATS, finalize_item(item, tiles, as_of, slide_seconds=60))
                assert online[item][1].keys() == want.keys()
                _assert_online_equals(online[item][1], want, item)
        assert len(writer._items) > 0
    finally:
        writer.disconnect()


def test_a_new_feed_reads_only_tiles_in_a_window_and_deletes_older_ones(
    spark: Any, settings: Settings, redis_client: Any,
) -> None:
    """Entity tile hashes keep the key TTL (days) from their last write. A feed that loads a
    user or item (a restart, an eviction) decodes only the tiles of the last day, deletes
    the older ones from Redis, and still writes the features of every tile in a window."""
    from features.feast_layout import ITEM_STATS, USER_ACTIVITY
    from pipelines.streaming.pyfeatures import TILE_OF_ROW, finalize_item, finalize_user, from_us
    from pipelines.streaming.realtime import RealtimeWriter, rt_clock_key, rt_tiles_key
    from pipelines.verify import _normalized, _read_online

    events = _events(400, 37, start=AS_OF - timedelta(hours=40), span_s=40 * 3600)
    rows = keyed_rows_of(spark, spark.createDataFrame(events, EVENT_SCHEMA))
    first = RealtimeWriter(settings)
    first.connect()
    try:
        _flush_rows(first, rows)
    finally:
        first.disconnect()
    clock = int(redis_client.get(rt_clock_key()))
    newest = max(r["tile_start"] for r in rows)
    horizon = newest - 86_400
    assert any(r["tile_start"] <= horizon for r in rows if r["kind"] != "sales")

    again = RealtimeWriter(settings)  # nothing in memory: every entity is loaded
    again.connect()
    try:
        _flush_rows(again, [row for row in rows if row["tile_start"] == newest])
    finally:
        again.disconnect()
    assert int(redis_client.get(rt_clock_key())) == clock
    as_of = from_us(clock)
    touched = {(r["kind"], r["key"]) for r in rows if r["tile_start"] == newest}
    for kind, spec, finalize in (
        ("user", USER_ACTIVITY, lambda k, t: finalize_user(
            k, t, as_of, slide_seconds=60, last_items_n=settings.feature_last_items_n)),
        ("item", ITEM_STATS, lambda k, t: finalize_item(k, t, as_of, slide_seconds=60)),
    ):
        keys = sorted(k for kd, k in touched if kd == kind)
        assert keys, kind
        online = _read_online(redis_client, spec, keys)
        for key in keys:
            mine = [r for r in rows if r["kind"] == kind and r["key"] == key]
            stored = {int(f) for f in redis_client.hkeys(rt_tiles_key(kind, key))}
            assert stored == {r["tile_start"] for r in mine if r["tile_start"] > horizon}, key
            want = _normalized(spec, finalize(key, [TILE_OF_ROW[kind](r) for r in mine]))
            _assert_online_equals(online[key][1], want, key)


def test_a_user_cache_smaller_than_one_flush_still_writes_every_user(
    spark: Any, settings: Settings, redis_client: Any,
) -> None:
    """SHOPSTREAM_STREAM_REALTIME_USER_CACHE_TILES below what one flush loads: the cache
    goes over for the flush and back under after it; every touched user is online."""
    from features.feast_layout import USER_ACTIVITY
    from pipelines.streaming.realtime import RealtimeWriter
    from pipelines.verify import _read_online

    rows, _, _ = _rows_and_last(spark)
    users = sorted({r["key"] for r in rows if r["kind"] == "user"})
    assert len(users) > 1
    writer = RealtimeWriter(settings.model_copy(update={"stream_realtime_user_cache_tiles": 1}))
    writer.connect()
    try:
        _flush_rows(writer, rows)
        assert len(writer._users) <= 1
        online = _read_online(redis_client, USER_ACTIVITY, users)
        assert all(online[u][1]["views_24h"] + online[u][1]["carts_24h"]
                   + online[u][1]["purchases_24h"] > 0 for u in users)
    finally:
        writer.disconnect()


def _run_until_caught_up(feed: Any, timeout_s: float, what: str) -> None:
    """Start ``feed``, wait until it has applied the topic, stop it."""
    feed.start()
    deadline = time.monotonic() + timeout_s
    while not feed.caught_up():
        assert time.monotonic() < deadline, f"{what} within {timeout_s:.0f} s"
        time.sleep(0.1)
    feed.stop()


def _two_flushes(spark: Any, settings: Settings) -> tuple[list[dict[str, Any]],
                                                             list[dict[str, Any]], int, int]:
    """Tile rows of 20 minutes written in two flushes: the tiles up to the third, then the
    rest; returns both parts and the clock's tile after each flush."""
    import redis

    from pipelines.connections import redis_kwargs
    from pipelines.streaming.realtime import RealtimeWriter, rt_snapshot_keys

    rows, _, _ = _rows_and_last(spark)
    tiles = sorted({r["tile_start"] for r in rows})
    early = [r for r in rows if r["tile_start"] <= tiles[2]]
    later = [r for r in rows if r["tile_start"] > tiles[2]]
    writer = RealtimeWriter(settings)
    client = redis.Redis(**redis_kwargs(settings))
    writer.connect()
    try:
        _flush_rows(writer, early)
        assert client.hlen(rt_snapshot_keys()[1]) == 0, "a snapshot asked for by the first flush"
        _flush_rows(writer, later)
        assert client.hlen(rt_snapshot_keys()[1]) == 1
    finally:
        writer.disconnect()
        client.close()
    return early, later, tiles[2], tiles[-1]


def test_the_writer_notes_touched_entities_and_asks_for_a_snapshot_in_a_new_tile(
    spark: Any, settings: Settings, redis_client: Any,
) -> None:
    """The entities a flush touches go to the set of the clock's tile; when a flush moves
    the clock into a later tile, the snapshot of the tiles since the last boundary is asked
    for (once), with the boundary moved in the same step."""
    from pipelines.stream_state import dirty_key
    from pipelines.streaming.realtime import rt_snapshot_keys

    early, later, first_tile, last_tile = _two_flushes(spark, settings)
    boundary, asked = rt_snapshot_keys()
    assert int(redis_client.get(boundary)) == last_tile
    assert redis_client.hgetall(asked) == {str(last_tile).encode(): str(first_tile).encode()}
    for kind in ("user", "item"):
        for part, tile in ((early, first_tile), (later, last_tile)):
            touched = {r["key"] for r in part if r["kind"] == kind}
            assert {m.decode() for m in redis_client.smembers(dirty_key(kind, tile))} == touched


def _check_snapshot(settings: Settings, redis_client: Any, rows: list[dict[str, Any]]) -> int:
    """The snapshot tables hold the entities of ``rows`` with the rows Redis holds for them,
    and one set of top lists; returns how many rows the tables hold."""
    import pandas as pd

    from features.feast_layout import ITEM_STATS, USER_ACTIVITY
    from pipelines.offline_store import snapshot_path
    from pipelines.verify import _read_online

    total = 0
    for spec, kind in ((USER_ACTIVITY, "user"), (ITEM_STATS, "item")):
        snap = pd.read_parquet(snapshot_path(settings, spec.name))
        assert sorted(snap[spec.join_key]) == sorted({r["key"] for r in rows if r["kind"] == kind})
        served = _read_online(redis_client, spec, list(snap[spec.join_key]))
        for row in snap.to_dict("records"):
            assert row["event_timestamp"].to_pydatetime() == served[row[spec.join_key]][0]
        total += len(snap)
    top = pd.read_parquet(snapshot_path(settings, "top_items"))
    assert len(top) > 0 and top["created"].nunique() == 1
    return total + len(top)


def test_the_parquet_sinks_process_writes_the_snapshots_the_feed_asks_for(
    make_settings: Callable[..., Settings], spark: Any, kafka_broker: Any, redis_client: Any,
    topic: str, tmp_path: Path,
) -> None:
    """``shopstream stream --offline-only --realtime-snapshots`` (what Real-time Mode runs beside
    its online query) writes a snapshot the feed asked for: the first tiles' entities with
    the rows Redis holds for them, and the top lists; then the request is gone."""
    from pipelines.streaming.realtime import rt_snapshot_keys

    settings = make_settings(kafka_topic_events=topic, data_dir=str(tmp_path / "data"))
    early, _, _, _ = _two_flushes(spark, settings)
    log_path = tmp_path / "sinks.log"
    with open(log_path, "ab") as log:
        job = subprocess.run([sys.executable, "-m", "pipelines.cli", "stream", "--offline-only",
                              "--realtime-snapshots", "--until-idle", "2"], cwd=REPO,
                             env=_env(settings), stdout=log, stderr=subprocess.STDOUT, timeout=600)
    assert job.returncode == 0, log_path.read_text()[-3000:]
    assert redis_client.hlen(rt_snapshot_keys()[1]) == 0
    _check_snapshot(settings, redis_client, early)
    assert "feature snapshot of the tiles" in log_path.read_text()
    assert "(Parquet sinks' process)" in " ".join(log_path.read_text().split())


def test_snapshots_left_at_the_stop_are_written_once(
    spark: Any, make_settings: Callable[..., Settings], redis_client: Any, tmp_path: Path,
) -> None:
    """What the Real-time driver does at its stop, after the sinks' process has gone: the
    snapshot still asked for is written, and a second drain finds nothing more to write."""
    from pipelines.streaming.rt_snapshots import AskedSnapshots, rt_snapshot_keys

    settings = make_settings(data_dir=str(tmp_path / "data"))
    early, _, _, _ = _two_flushes(spark, settings)
    counts = []
    for expected in (1, 0):
        left = AskedSnapshots(settings, spark, "at the stop")
        try:
            assert left.drain(120)
        finally:
            left.close()
        assert left.written == expected
        assert redis_client.hlen(rt_snapshot_keys()[1]) == 0
        counts.append(_check_snapshot(settings, redis_client, early))
    assert counts[0] == counts[1], "the second drain added rows"


@pytest.mark.parametrize("feeds", [1, 2])
def test_tile_feed_applies_what_spark_sends_through_kafka(
    spark: Any, make_settings: Callable[..., Settings], kafka_broker: Any, redis_client: Any,
    topic: str, feeds: int,
) -> None:
    """Tiles sent by Spark's Kafka sink, as the query encodes them, land in Redis exactly (same
    tile values, the last sale in the top lists), and the feed commits what it applied. With
    two feeds (the second a process of its own) each applies its partitions: every sales
    tile is on the first's, users and items on both."""
    from kafka import TopicPartition

    from features.online_keys import stream_progress_key
    from features.tiles import keyed_tiles
    from pipelines.connections import kafka_consumer
    from pipelines.online_writer import top_item_key
    from pipelines.streaming.pyfeatures import TILE_OF_ROW
    from pipelines.streaming.realtime import (
        QUERY_NAME,
        SALES_PARTITION,
        Feeds,
        _decode_tile,
        rt_tiles_key,
        tile_messages,
    )

    settings = make_settings(kafka_topic_rt_tiles=topic, stream_realtime_feeds=feeds,
                             stream_realtime_shape="tiles")
    events = spark.createDataFrame(_events(300, 23, start=AS_OF - timedelta(minutes=20),
                                           span_s=1200), EVENT_SCHEMA)
    events = events.unionByName(spark.createDataFrame(
        [("e-last", "purchase", AS_OF, "u0", "s", "ci-last", "c0", "UK", 3.0, 2, "web")],
        EVENT_SCHEMA))
    sent_from = time.time()
    (tile_messages(keyed_tiles(events, slide_seconds=60, last_items_n=4))
     .write.format("kafka").options(**settings.spark_kafka_options()).option("topic", topic)
     .save())

    _run_until_caught_up(Feeds(settings), 60, "the feeds did not catch up")
    took = time.time() - sent_from
    partitions: dict[str, set[int]] = {"user": set(), "item": set(), "sales": set()}
    reader = kafka_consumer(settings, topic, consumer_timeout_ms=2000)
    try:
        for message in reader:
            partitions[message.key.decode().split("|", 1)[0]].add(message.partition)
    finally:
        reader.close()
    assert partitions["sales"] == {SALES_PARTITION}
    assert partitions["user"] == partitions["item"] == {0, 1}

    # the freshness report names where the time went: the query's part (the tiles were
    # sent years after their events) and the feed's (sent -> in Redis, this test's time)
    progress = {k.decode(): float(v) for k, v in redis_client.hgetall(stream_progress_key()).items()
                if k.startswith(b"rt_") and k.endswith(b"_s")}
    years = sent_from - AS_OF.timestamp()  # the newest event is at AS_OF, the oldest 20 min before
    assert years <= progress["rt_query_p50_s"] <= progress["rt_query_max_s"] <= years + 1200 + took
    assert 0 <= progress["rt_feed_p50_s"] <= progress["rt_feed_max_s"] <= took
    assert progress["rt_query_max_s"] - 0.001 <= progress["rt_freshness_max_s"] <= (
        progress["rt_query_max_s"] + progress["rt_feed_max_s"] + 0.001)
    # the first feed keeps the top lists: how many top writes, and how long they took
    top_writes = int(redis_client.hget(stream_progress_key(), "rt_top_writes") or 0)
    assert top_writes >= 1
    assert 0 <= progress["rt_top_write_p50_s"] <= progress["rt_top_write_max_s"] <= took
    # a top write follows a sales change: how long the lists lagged it, at least one write
    assert progress["rt_top_write_p50_s"] - 0.001 <= progress["rt_top_lag_max_s"] <= took
    # and for Prometheus, in the textfile beside the job's
    from prometheus_client.parser import text_string_to_metric_families

    from pipelines.stream_metrics import realtime_textfile_path

    textfile = realtime_textfile_path(settings)
    assert textfile is not None
    exported = {(s.labels.get("part"), s.labels.get("quantile")): s.value
                for family in text_string_to_metric_families(textfile.read_text())
                for s in family.samples if s.name == "shopstream_stream_rt_freshness_seconds"}
    for part, field in (("total", "freshness"), ("query", "query"), ("feed", "feed")):
        assert exported[(part, "1")] == pytest.approx(progress[f"rt_{field}_max_s"], abs=0.001)
    assert [s.value for family in text_string_to_metric_families(textfile.read_text())
            for s in family.samples if s.name == "shopstream_stream_rt_top_writes"] == [top_writes]
    if feeds == 2:  # the second feed's figures: fields and a textfile of its own
        second = redis_client.hgetall(stream_progress_key())
        assert float(second[b"rt1_feed_max_s"]) <= took and int(second[b"rt1_tiles_written"]) > 0
        other = realtime_textfile_path(settings, 1)
        assert other is not None and 'feed="1"' in other.read_text()

    expected = keyed_rows_of(spark, events)
    for row in expected:
        if row["kind"] == "sales":
            continue
        stored = redis_client.hget(rt_tiles_key(row["kind"], row["key"]), str(row["tile_start"]))
        assert _decode_tile(stored) == TILE_OF_ROW[row["kind"]](row), (row["kind"], row["key"])
    top = {m.decode() for m in redis_client.zrange(top_item_key("top", "1h", "global"), 0, -1)}
    assert "ci-last" in top

    consumer = kafka_consumer(settings, group_id=f"{QUERY_NAME}-feed")
    try:
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
        ends = consumer.end_offsets(tps)
        assert {tp: consumer.committed(tp) or 0 for tp in tps} == ends
    finally:
        consumer.close()


def test_the_tile_topic_gives_its_own_partition_count_to_the_feeds(
    make_settings: Callable[..., Settings], kafka_broker: Any, topic: str,
) -> None:
    """A new tile topic is made with ``kafka_topic_partitions``; an existing one keeps its
    count, and that count, not the setting, bounds the feeds (the default is cut to it)."""
    from pipelines.streaming.realtime import Feeds, ensure_topic

    fresh = make_settings(kafka_topic_rt_tiles=f"{topic}.new", kafka_topic_partitions=3,
                          stream_realtime_shape="tiles")
    assert ensure_topic(fresh) == 3
    assert ensure_topic(fresh) == 3  # again, now existing
    existing = make_settings(kafka_topic_rt_tiles=topic, kafka_topic_partitions=5,
                             stream_realtime_shape="tiles")
    assert ensure_topic(existing) == 2  # the fixture's topic has the session's 2
    assert Feeds(existing.model_copy(update={"stream_realtime_feeds": 2}),
                 partitions=ensure_topic(existing)).count == 2
    single = make_settings(kafka_topic_rt_tiles=f"{topic}.one", kafka_topic_partitions=1,
                           stream_realtime_shape="tiles")
    assert ensure_topic(single) == 1
    assert Feeds(make_settings(kafka_topic_rt_tiles=f"{topic}.one", stream_realtime_shape="tiles"),
                 partitions=ensure_topic(single)).count == 1


def test_the_feed_is_at_the_end_only_once_it_has_read_every_partition_to_its_end(
    settings: Settings, topic: str,
) -> None:
    """The feed's caught-up check reads each partition's end from its fetches, without a
    request that would queue behind a parked fetch; it must still see unread tiles, and a
    partition it has not fetched yet."""
    from kafka import TopicPartition

    from pipelines.connections import kafka_consumer, kafka_producer
    from pipelines.streaming.realtime import TileFeed

    producer = kafka_producer(settings)
    try:
        for i in range(6):
            producer.send(topic, key=b"user|u%d" % i, value=b"{}", partition=i % 2)
        producer.flush()
    finally:
        producer.close()
    consumer = kafka_consumer(settings)
    try:
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
        assert len(tps) >= 2, "the test needs two partitions"
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        assert not TileFeed._at_end(consumer, tps), "nothing fetched yet, six tiles unread"
        read = 0
        deadline = time.monotonic() + 30
        while read < 6:
            assert time.monotonic() < deadline, f"read {read} of 6 tiles"
            polled = consumer.poll(timeout_ms=200, max_records=1)
            read += sum(len(part) for part in polled.values())
            if read < 6:
                assert not TileFeed._at_end(consumer, tps), f"at the end after {read} of 6 tiles"
        assert TileFeed._at_end(consumer, tps)
    finally:
        consumer.close()


def test_a_new_checkpoints_feed_warns_of_tiles_an_earlier_query_left(
    spark: Any, make_settings: Callable[..., Settings], kafka_broker: Any, redis_client: Any,
    topic: str, caplog: pytest.LogCaptureFixture,
) -> None:
    """The feed's consumer group outlives a checkpoint: a query on a new checkpoint gets the
    tiles an earlier query sent and the feed had not applied written first. The operator is
    told how many (a restart on the same checkpoint, whose own tiles they are, is not)."""
    from features.tiles import keyed_tiles
    from pipelines.streaming.realtime import TileFeed, tile_messages

    settings = make_settings(kafka_topic_rt_tiles=topic, stream_realtime_shape="tiles")

    def send(n_events: int, seed: int) -> int:
        events = spark.createDataFrame(_events(n_events, seed, start=AS_OF - timedelta(minutes=5),
                                               span_s=300), EVENT_SCHEMA)
        messages = tile_messages(keyed_tiles(events, slide_seconds=60, last_items_n=4))
        messages.write.format("kafka").options(**settings.spark_kafka_options()).option(
            "topic", topic).save()
        return messages.count()

    caplog.set_level(logging.WARNING, logger="pipelines.streaming.realtime")
    send(40, 5)
    _run_until_caught_up(TileFeed(settings), 60, "the feed did not catch up")  # a restart
    assert "has not written to Redis" not in caplog.text

    left = send(30, 6)
    _run_until_caught_up(TileFeed(settings, new_checkpoint=True), 60, "the feed did not catch up")
    warnings = [r.getMessage() for r in caplog.records if "has not written to Redis" in r.getMessage()]
    assert len(warnings) == 1, caplog.text
    assert f"{topic} holds {left} tiles an earlier query sent" in warnings[0]

    caplog.clear()  # nothing left unread: a new checkpoint now starts clean, and is not warned
    _run_until_caught_up(TileFeed(settings, new_checkpoint=True), 60, "the feed did not catch up")
    assert "has not written to Redis" not in caplog.text


def _rows_and_last(spark: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]], str]:
    events = spark.createDataFrame(_events(300, 23, start=AS_OF - timedelta(minutes=20),
                                           span_s=1200), EVENT_SCHEMA)
    late_item = "ci-last"
    last = spark.createDataFrame([("e-last", "purchase", AS_OF, "u0", "s", late_item, "c0", "UK",
                                   3.0, 2, "web")], EVENT_SCHEMA)
    last_rows = keyed_rows_of(spark, last)
    assert any(r["kind"] == "sales" for r in last_rows)
    return keyed_rows_of(spark, events), last_rows, late_item


def keyed_rows_of(spark: Any, events: Any) -> list[dict[str, Any]]:
    """What the Real-time query hands its writer: keyed tile rows as plain dicts."""
    from features.tiles import keyed_tiles

    return [r.asDict(recursive=True)
            for r in keyed_tiles(events, slide_seconds=60, last_items_n=4).collect()]


def test_role_rows_spark_sends_through_kafka_fold_into_the_tiles_of_their_events(
    spark: Any, make_settings: Callable[..., Settings], kafka_broker: Any, topic: str,
    tmp_path: Path,
) -> None:
    """The Real-time query's shape without an aggregation (realtime_roles): from the events
    topic (a duplicate and a malformed record among them) to Kafka messages, each event once
    per role with its source partition and offset, sales on their own partition; folded in
    order, they give keyed_tiles' rows of the valid, deduplicated events."""
    import orjson

    from pipelines.connections import kafka_consumer, kafka_producer
    from pipelines.streaming.pyfeatures import fold_role, role_row
    from pipelines.streaming.realtime import (
        SALES_PARTITION,
        ensure_topic,
        feed_topic,
        realtime_roles,
        tile_sink_options,
    )
    from tests.integration.test_stream_state import _canonical_row

    settings = make_settings(kafka_topic_events=f"{topic}.events", kafka_topic_rt_tiles=topic,
                             stream_realtime_shape="roles")
    create_topic(settings, settings.kafka_topic_events)
    ensure_topic(settings)  # the role rows' own topic, <topic>.roles
    rows = _events(200, 31, start=AS_OF - timedelta(minutes=20), span_s=1200)
    names = EVENT_SCHEMA.replace(",", "").split()[0::2]
    producer = kafka_producer(settings)
    try:
        for row in [*rows, rows[0]]:  # rows[0] twice: the query keeps it once
            doc = {k: v for k, v in zip(names, row, strict=True) if v is not None}
            doc["event_time"] = doc["event_time"].isoformat().replace("+00:00", "Z")
            producer.send(settings.kafka_topic_events, key=doc["user_id"].encode(),
                          value=orjson.dumps(doc))
        producer.send(settings.kafka_topic_events, key=b"u0", value=b'{"event_id": "bad"')
        producer.flush()
    finally:
        producer.close()

    query = (realtime_roles(spark, settings, {"startingOffsets": "earliest"}).writeStream
             .outputMode("update").format("kafka").options(**tile_sink_options(settings))
             .option("checkpointLocation", str(tmp_path / "roles-checkpoint"))
             .trigger(availableNow=True).start())
    query.awaitTermination(300)
    assert query.exception() is None

    folded: dict[tuple[str, str, int], dict[str, Any]] = {}
    sources: set[tuple[int, int]] = set()
    reader = kafka_consumer(settings, feed_topic(settings), consumer_timeout_ms=3000)
    try:
        for message in reader:
            event = orjson.loads(message.value)
            assert message.key.decode() == f"{event['kind']}|{event['key']}"
            if event["kind"] == "sales":
                assert message.partition == SALES_PARTITION
            sources.add((event["source_partition"], event["source_offset"]))
            one = role_row(event["kind"], event["key"], event["tile_start"], event,
                           last_items_n=4)
            at = (event["kind"], event["key"], event["tile_start"])
            folded[at] = fold_role(folded[at], one, last_items_n=4) if at in folded else one
    finally:
        reader.close()
    assert len(sources) == len(rows)  # every valid event once, each with its own offset

    expected = {(r["kind"], r["key"], r["tile_start"]): r
                for r in keyed_rows_of(spark, spark.createDataFrame(rows, EVENT_SCHEMA))}
    assert folded.keys() == expected.keys()
    for at, want in expected.items():
        assert _canonical_row(folded[at]) == _canonical_row(want), at


def _sinks_process(log_path: Path, timeout_s: float = 60.0) -> int | None:
    """The pid of the Parquet sinks' process, from the driver's log line about it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        logged = " ".join(log_path.read_text().split())  # the console log wraps long lines
        found = re.search(r"Parquet sinks: process (\d+) \(shopstream stream --offline-only", logged)
        if found:
            return int(found.group(1))
        time.sleep(0.5)
    return None


def _feed_process(log_path: Path, timeout_s: float = 60.0) -> int | None:
    """The pid of the second tile feed's process, from the driver's log line about it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        logged = " ".join(log_path.read_text().split())
        found = re.findall(r"real-time tile feed #1 of 2: process (\d+)", logged)
        if found:
            return int(found[-1])
        time.sleep(0.5)
    return None


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def _jvm_of(pid: int, timeout_s: float = 60.0) -> str:
    """The command line of the JVM a Python process started (its Spark driver), once it runs."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for entry in Path("/proc").iterdir():
            try:
                stat = (entry / "stat").read_text()
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except (OSError, ValueError):
                continue
            if int(stat[stat.rindex(")") + 2:].split()[1]) == pid and "java" in cmdline:
                return cmdline
        time.sleep(0.5)
    raise AssertionError(f"process {pid} started no JVM within {timeout_s:.0f} s")


def _autogroup(pid: int) -> str | None:
    """The kernel's scheduling autogroup of a process, or None where there is none to read."""
    try:
        fields = Path(f"/proc/{pid}/autogroup").read_text().split()
    except OSError:
        return None
    return fields[0] if fields else None


def _threads_nice(pid: int) -> set[int]:
    """The nice values of every thread of ``pid`` and of the processes under it (its JVM)."""
    from pipelines.streaming.offline_process import descendants

    found = set()
    for process in (pid, *descendants(pid)):
        with contextlib.suppress(FileNotFoundError):
            for tid in os.listdir(f"/proc/{process}/task"):
                with contextlib.suppress(ProcessLookupError):
                    found.add(os.getpriority(os.PRIO_PROCESS, int(tid)))
    return found


def _realtime_settings(make_settings: Callable[..., Settings], tmp_path: Path,
                       prefix: str, shape: str = "roles") -> Settings:
    """A Real-time job's settings on a topic of its own (created): 5 s epochs, two tile feeds
    (the second a process), the task slots Real-time Mode holds at once, and a 10 s trigger
    for the Parquet sinks' process (not the 30 s default: ``--until-idle`` waits a trigger
    interval before it stops that process, and the end-to-end test runs it twice); ``shape``:
    what the query sends its feeds (``stream_realtime_shape``)."""
    from pipelines.streaming.realtime import required_slots

    topic = f"{prefix}.{tmp_path.name[-20:]}".replace("_", "-")
    settings = stream_settings(make_settings, tmp_path, topic, stream_mode="realtime",
                               stream_realtime_checkpoint_seconds=5, stream_realtime_feeds=2,
                               stream_realtime_offline_trigger_seconds=10.0,
                               stream_realtime_shape=shape)
    settings = settings.model_copy(update={"spark_master": f"local[{required_slots(settings)}]"})
    create_topic(settings, topic)
    return settings


@pytest.mark.parametrize("shape", ["tiles", "roles"])
def test_stream_in_real_time_mode_writes_what_the_batch_recomputes(
    make_settings: Callable[..., Settings], kafka_broker: Any, redis_client: Any, spark: Any,
    tmp_path: Path, shape: str,
) -> None:
    """Wave 1 only (no late events): the Real-time online values equal the batch values, and
    the feature snapshots hold what serving read. The first 300 records go in before the
    job starts, the rest once the feed has written them, so the clock enters new tiles
    after the feed's first flush and snapshots are due (one flush of everything asks for
    none). Both shapes: full tiles from the query, or role rows the feeds fold."""
    from pipelines.streaming.realtime import STOP_NOISE_LOGGERS, rt_snapshot_keys

    settings = _realtime_settings(make_settings, tmp_path, "rtm", shape)
    first = wave1()
    produce(settings, first[:300])
    env = _env(settings)
    boundary, asked = rt_snapshot_keys()
    log_path = tmp_path / "stream.log"
    with open(log_path, "ab") as log:
        job = subprocess.Popen([sys.executable, "-m", "pipelines.cli", "stream", "--until-idle",
                                "30"], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 600
            while not redis_client.exists(boundary):
                assert job.poll() is None, log_path.read_text()[-3000:]
                assert time.monotonic() < deadline, "the feed wrote nothing within 600 s"
                time.sleep(0.2)
            # the Parquet sinks' query runs as a process of its own (at a lower CPU priority
            # once caught up: below)
            sinks = _sinks_process(log_path)
            assert sinks is not None, log_path.read_text()[-3000:]
            # the Real-time query's driver collects with G1 (short pauses), the sinks' with
            # Parallel (throughput; Settings.spark_gc)
            assert "-XX:+UseG1GC" in _jvm_of(job.pid).split()
            assert "-XX:+UseParallelGC" in _jvm_of(sinks).split()
            # ...which counts only within the driver's session (the kernel's autogroups)
            assert os.getsid(sinks) == os.getsid(job.pid)
            assert os.getpgid(sinks) != os.getpgid(job.pid), "a Ctrl-C would reach it"
            # (a kernel without autogroups, or with them off, leaves the file missing or empty)
            if _autogroup(job.pid) is not None:
                assert _autogroup(sinks) == _autogroup(job.pid)
            # the second tile feed: a process of the same session, its own process group
            feed = _feed_process(log_path)
            assert feed is not None and _alive(feed), log_path.read_text()[-3000:]
            assert os.getsid(feed) == os.getsid(job.pid) and os.getpgid(feed) != os.getpgid(job.pid)
            # `shopstream status` hears the running driver's heartbeat
            from datetime import UTC, datetime

            from pipelines.stream_metrics import read_progress, stream_health

            beat_deadline = time.monotonic() + 30
            while not read_progress(settings, client=redis_client).get("job_heartbeat"):
                assert time.monotonic() < beat_deadline, "no heartbeat within 30 s"
                time.sleep(0.2)
            verdict = stream_health(read_progress(settings, client=redis_client), datetime.now(UTC))
            assert verdict.state == "running", verdict
            # each event of the sinks' query (a batch, an idle trigger) touches the pulse its
            # driver watches, or the driver would take it for stalled
            pulse = settings.run_path / f"offline-sinks.{job.pid}.pulse"
            pulse_deadline = time.monotonic() + 300
            while not pulse.exists():
                assert job.poll() is None, log_path.read_text()[-3000:]
                assert time.monotonic() < pulse_deadline, "the sinks' query sent no pulse in 300 s"
                time.sleep(0.2)
            produce(settings, first[300:])
            # started at the driver's priority; once its query has caught up (a batch within
            # its trigger, or an idle report: Spark's first comes 10 s after the last batch,
            # within the 30 s of --until-idle), the driver nices every thread of it and its JVM
            niced = settings.stream_realtime_offline_nice
            assert niced > 0
            while _threads_nice(sinks) != {niced}:
                assert job.poll() is None, log_path.read_text()[-3000:]
                assert time.monotonic() < pulse_deadline, (
                    f"the sinks' threads at nice {_threads_nice(sinks)}, not +{niced}")
                time.sleep(0.2)
            assert job.wait(timeout=900) == 0, log_path.read_text()[-3000:]
        finally:
            if job.poll() is None:
                job.kill()
    check_stores(spark, settings, expected_outcome(first))
    assert redis_client.hlen(asked) == 0, "snapshots asked for and not written"
    assert "real-time: feature snapshot of the tiles" in log_path.read_text()
    # the Parquet sinks' query ran at its own, longer trigger beside the Real-time query
    logged = " ".join(log_path.read_text().split())  # the console log wraps long lines
    assert f"trigger {settings.stream_realtime_offline_trigger_seconds}s (Parquet sinks" in logged
    # the stop lands mid-epoch: one line says so, none of Spark's per-task abort traces
    assert "stopping mid-epoch" in logged
    assert not pulse.exists(), "the driver leaves its sinks' pulse file behind"
    # started at the driver's priority, niced once caught up, and kept there
    assert ("caught up with the topic" in logged
            and f"now at nice +{settings.stream_realtime_offline_nice}" in logged), logged[-3000:]
    assert "has not caught up with the topic for" not in logged
    noise = [line for line in log_path.read_text().splitlines()
             if " ERROR " in line and any(line.split(" ERROR ")[1].startswith(name.rsplit(".", 1)[1])
                                          for name in STOP_NOISE_LOGGERS)]
    assert not noise, noise[:5]
    # nor Spark's warnings of the same stop: each killed task, a job group with nothing to cancel
    assert "TaskKilled" not in logged and "Cannot find active jobs" not in logged, [
        line for line in log_path.read_text().splitlines()
        if "TaskKilled" in line or "Cannot find active jobs" in line][:5]
    # a first start on a new checkpoint, with a tile topic of its own: nothing of another's
    assert "has not written to Redis" not in logged
    assert "blocking the event loop" not in logged  # kafka-python's slow-step noise is dropped


@pytest.mark.parametrize("shape", ["tiles", "roles"])
def test_real_time_mode_killed_twice_mid_stream_gives_the_same_results(
    make_settings: Callable[..., Settings], kafka_broker: Any, redis_client: Any, spark: Any,
    tmp_path: Path, shape: str,
) -> None:
    """``kill -9`` of the Real-time driver (its JVM with it; the Parquet sinks' process gets
    the kernel's parent-death signal) twice while it writes, each time restarted at once,
    as a supervisor would: the query replays its input since its last epoch, the feed its
    tiles since its last commit, both rewriting the same full values, and the sinks'
    process its micro-batch. The stores end exactly as the batch recomputation says. With
    role rows (``roles``) a replay is increments, not full values: the feeds skip what they
    applied before by its source offset."""
    import signal

    from pipelines.stream import query_checkpoint
    from pipelines.streaming.realtime import feed_topic, realtime_checkpoint, rt_clock_key

    settings = _realtime_settings(make_settings, tmp_path, "rtkill", shape)
    first = wave1()
    env = _env(settings)
    log_path = tmp_path / "stream.log"
    rt_commits = Path(realtime_checkpoint(settings)) / "commits"
    sink_commits = Path(query_checkpoint(settings)) / "commits"
    sent = 0
    for part in (1, 2):  # two crashes, each while the feed is writing what was just sent
        cut = part * len(first) // 3
        mid = (sent + cut) // 2
        produce(settings, first[sent:mid])
        clock_before = redis_client.get(rt_clock_key())
        epochs_before, batches_before = _committed(rt_commits), _committed(sink_commits)
        with open(log_path, "ab") as log:
            job = subprocess.Popen([sys.executable, "-m", "pipelines.cli", "stream"], cwd=REPO,
                                   env=env, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        try:
            deadline = time.monotonic() + 600
            # mid-stream: this run's feed has written tiles, and both queries have
            # committed work of their own (an epoch, a micro-batch) that the restart must
            # not redo wrongly
            while (redis_client.get(rt_clock_key()) == clock_before
                   or _committed(rt_commits) <= epochs_before
                   or _committed(sink_commits) <= batches_before):
                assert job.poll() is None, log_path.read_text()[-3000:]
                assert time.monotonic() < deadline, "no tiles, epoch or batch within 600 s"
                time.sleep(0.1)
            # more input right after an epoch's checkpoint (5 s epochs), the kill once the
            # query has sent rows of it: the next query sends them again
            epochs = _committed(rt_commits)
            while _committed(rt_commits) == epochs:
                assert time.monotonic() < deadline, "no second epoch within 600 s"
                time.sleep(0.05)
            rows_before = _topic_end(settings, feed_topic(settings))
            produce(settings, first[mid:cut])
            sent = cut
            while _topic_end(settings, feed_topic(settings)) == rows_before:
                assert job.poll() is None, log_path.read_text()[-3000:]
                assert time.monotonic() < deadline, "the query sent nothing within 600 s"
                time.sleep(0.05)
            time.sleep(0.3 * part)  # somewhere inside the feeds' writes and the sinks' batches
            feed = _feed_process(log_path)
            assert feed is not None and _alive(feed), log_path.read_text()[-3000:]
        finally:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait(timeout=60)
        # the second feed stops with its driver (after its running flush), not draining on
        # beside the next driver's own
        gone = time.monotonic() + 30
        while _alive(feed):
            assert time.monotonic() < gone, "the second tile feed outlived its driver by 30 s"
            time.sleep(0.1)
    produce(settings, first[sent:])
    with open(log_path, "ab") as log:
        job = subprocess.Popen([sys.executable, "-m", "pipelines.cli", "stream", "--until-idle",
                                "12"], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            assert job.wait(timeout=900) == 0, log_path.read_text()[-3000:]
        finally:
            if job.poll() is None:
                job.kill()
    check_stores(spark, settings, expected_outcome(first))
    if shape == "roles":  # the replays happened, and were skipped, not applied twice
        assert "role rows skipped, applied before" in log_path.read_text()


def _topic_end(settings: Settings, topic: str) -> int:
    """Messages a topic has held (the sum of its partitions' end offsets)."""
    from kafka import TopicPartition

    from pipelines.connections import kafka_consumer

    consumer = kafka_consumer(settings)
    try:
        tps = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
        return sum(consumer.end_offsets(tps).values()) if tps else 0
    finally:
        consumer.close()


def _committed(commits: Path) -> int:
    """Batches (epochs) a query's checkpoint marks done."""
    return sum(1 for f in commits.iterdir() if f.name.isdigit()) if commits.exists() else 0


def test_too_few_task_slots_for_real_time_mode_is_one_line_naming_the_setting(
    make_settings: Callable[..., Settings], kafka_broker: Any, redis_client: Any, tmp_path: Path,
) -> None:
    """``shopstream stream --mode realtime`` on the default ``local[2]`` ended in a
    ``RuntimeError`` traceback (its message had the fix, 30 lines down)."""
    settings = _realtime_settings(make_settings, tmp_path, "rtslots")
    settings = settings.model_copy(update={"spark_master": "local[2]"})
    job = subprocess.run([sys.executable, "-m", "pipelines.cli", "stream", "--until-idle", "5"],
                         cwd=REPO, env=_env(settings), capture_output=True, text=True, timeout=300)
    said = " ".join(job.stderr.split())
    assert job.returncode == 2, said[-3000:]
    assert "Traceback" not in job.stderr, said[-3000:]
    need = settings.kafka_topic_partitions + 2
    assert f"error: Real-time Mode needs {need} concurrent task slots" in said, said[-3000:]
    assert f"Set SHOPSTREAM_SPARK_MASTER=local[{need}]" in said, said[-3000:]
