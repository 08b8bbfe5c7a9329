"""The stream's tile store: merge rules and idempotent batches, on real Spark and Redis."""

from __future__ import annotations

import os
import random
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from pipelines.settings import Settings

pytestmark = pytest.mark.integration

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers need the venv (redis)

EVENT_SCHEMA = (
    "event_id string, event_type string, event_time timestamp, user_id string, "
    "session_id string, item_id string, category_id string, region string, price double, "
    "quantity int, device string"
)
T0 = datetime(2024, 6, 1, 11, 0, tzinfo=UTC)


def _events(n: int, seed: int, *, start: datetime = T0, span_s: int = 900) -> list[tuple]:
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        kind = rnd.choice(("view", "view", "view", "add_to_cart", "purchase"))
        when = start + timedelta(microseconds=rnd.randrange(span_s * 1_000_000))
        price = round(rnd.uniform(1, 50), 2) if kind != "view" else None
        out.append((f"e{seed}-{i}", kind, when, f"u{rnd.randrange(4)}", "s", f"i{rnd.randrange(6)}",
                    f"c{rnd.randrange(3)}", rnd.choice(("UK", "FR")), price, rnd.randrange(1, 4),
                    "web"))
    return out


def _sorted_rows(df: Any, keys: list[str]) -> list[dict[str, Any]]:
    def norm(value: Any) -> Any:
        if isinstance(value, list):
            items = [norm(v) for v in value]
            return sorted(items, key=repr) if all(not isinstance(v, dict) for v in items) else items
        if hasattr(value, "asDict"):
            return {k: norm(v) for k, v in value.asDict().items()}
        if isinstance(value, float):
            return round(value, 9)
        return value

    rows = [{k: norm(v) for k, v in r.asDict().items()} for r in df.collect()]
    return sorted(rows, key=lambda r: tuple(str(r[k]) for k in keys))


def _unordered(rows: list[dict[str, Any]], column: str) -> list[dict[str, Any]]:
    for row in rows:
        row[column] = sorted(row[column], key=repr)
    return rows


def _tiles(spark: Any, events: Any) -> dict[tuple[str, str, int], dict[str, Any]]:
    """(kind, key, tile_start) -> tile dict, as the stream's Python pass receives them."""
    from pipelines.stream_state import keyed_rows
    from pipelines.streaming.pyfeatures import TILE_OF_ROW

    rows = keyed_rows(events, slide_seconds=60, last_items_n=3, partitions=2).toArrow().to_pylist()
    return {(r["kind"], r["key"], r["tile_start"]): TILE_OF_ROW[r["kind"]](r) for r in rows}


def _canonical(tile: dict[str, Any]) -> dict[str, Any]:
    out = dict(tile)
    for name in ("items_viewed",):
        if name in out:
            out[name] = sorted(out[name])
    if "category_weights" in out:
        out["category_weights"] = sorted((c["category_id"], round(c["weight"], 9))
                                         for c in out["category_weights"])
    for name in ("spend", "revenue"):
        if name in out:
            out[name] = round(out[name], 9)
    return out


def test_merging_tiles_of_two_halves_equals_tiles_of_the_whole(spark: Any) -> None:
    """The Python merge rules against features.tiles: tiles(A) + tiles(B) == tiles(A + B)."""
    from pipelines.streaming.pyfeatures import MERGE

    # views at the same microsecond, the last of their tile, in each half: ties go by item
    tie = T0 + timedelta(seconds=60, microseconds=-1)

    def view_at_tie(item: str) -> tuple:
        return (f"tie-{item}", "view", tie, "u0", "s", item, "c0", "UK", None, 1, "web")

    first = spark.createDataFrame(_events(300, 1) + [view_at_tie("i5"), view_at_tie("i1")],
                                  EVENT_SCHEMA)
    second = spark.createDataFrame(_events(300, 2) + [view_at_tie("i3")], EVENT_SCHEMA)
    merged = dict(_tiles(spark, first))
    for key, tile in _tiles(spark, second).items():
        assert _lists_ranked(tile), key
        merged[key] = MERGE[key[0]](merged[key], tile, last_items_n=3) if key in merged else tile
    whole = _tiles(spark, first.unionByName(second))
    assert merged.keys() == whole.keys()
    for key in whole:
        assert _canonical(merged[key]) == _canonical(whole[key]), key
        # the feature pass reads the last-items lists in stored order (pyfeatures._ranked)
        assert _lists_ranked(merged[key]) and _lists_ranked(whole[key]), key
    tile = ("user", "u0", int(T0.timestamp()))
    for tiles in (merged, whole):
        assert [e["item_id"] for e in tiles[tile]["last_viewed"]] == ["i1", "i3", "i5"]


def _lists_ranked(tile: dict[str, Any]) -> bool:
    """Whether a tile's last-items lists are latest first, ties by item, each item once."""
    for name in ("last_viewed", "last_purchased"):
        order = [(-int(e["event_us"]), e["item_id"]) for e in tile.get(name, ())]
        if order != sorted(order) or len({i for _, i in order}) != len(order):
            return False
    return True


def test_single_events_folded_one_by_one_give_the_rows_of_keyed_tiles(spark: Any) -> None:
    """Spark's role_events (each event once per role, no aggregation), each made a row by
    role_row and folded with fold_role (the feed's fold) in order, give the rows Spark's
    one aggregation gives for the whole set: every column, including the max_by ones (region, price and its
    time), ties of equal times, a priced view, and a sales key Spark url-encodes."""
    from features.tiles import role_events
    from pipelines.stream_state import keyed_rows
    from pipelines.streaming.pyfeatures import fold_role, role_row

    tie = T0 + timedelta(seconds=60, microseconds=-1)
    rows = _events(500, 11) + [
        ("tie-a", "view", tie, "u0", "s", "i5", "c0", "UK", None, 1, "web"),
        ("tie-b", "view", tie, "u0", "s", "i1", "c2", "FR", 9.5, 2, "web"),  # a priced view
        ("tie-c", "purchase", tie, "u1", "s", "i1", "c1", "UK", 3.25, 3, "web"),
        ("odd", "purchase", tie, "u2", "s", "i 2|x", "c/1", "Côte d'Ivoire", 1.5, 1, "web"),
    ]
    events = spark.createDataFrame(rows, EVENT_SCHEMA)
    folded: dict[tuple[str, str, int], dict[str, Any]] = {}
    roles = role_events(events, slide_seconds=60).toArrow().to_pylist()
    assert len(roles) == 2 * len(rows) + sum(r[1] == "purchase" for r in rows)
    for event in roles:
        one = role_row(event["kind"], event["key"], event["tile_start"], event, last_items_n=3)
        at = (event["kind"], event["key"], event["tile_start"])
        folded[at] = fold_role(folded[at], one, last_items_n=3) if at in folded else one

    whole = {(r["kind"], r["key"], r["tile_start"]): r for r in keyed_rows(
        events, slide_seconds=60, last_items_n=3, partitions=2).toArrow().to_pylist()}
    assert folded.keys() == whole.keys()
    for at, want in whole.items():
        got = folded[at]
        assert set(got) == set(want), at
        assert _canonical_row(got) == _canonical_row(want), at
    # i1's last events in its first tile are two at one microsecond: each max_by takes the
    # greater value (category c2 over c1, region UK over FR, price 9.50 over 3.25)
    first = int(T0.timestamp())
    item = folded[("item", "i1", first)]
    assert (item["category_id"], item["region"], item["price"]) == ("c2", "UK", 9.5)
    assert [e["item_id"] for e in folded[("user", "u0", first)]["last_viewed"]][:2] == ["i1", "i5"]
    assert ("sales", "i+2%7Cx|c%2F1|C%C3%B4te+d%27Ivoire", first) in folded


def test_the_per_key_pass_gets_every_tile_in_arrow_batches_bounded_by_rows(spark: Any) -> None:
    """The tiles reach the per-key pass as Arrow batches. The session leaves the batches
    without a byte bound (``ARROW_UNBOUNDED_BYTES``: under one, Spark's writer sizes the
    whole batch after every row); a batch is still bounded by its rows
    (``maxRecordsPerBatch``), and every tile arrives exactly once."""
    import pyarrow as pa

    from pipelines.spark import ARROW_UNBOUNDED_BYTES
    from pipelines.stream_state import keyed_rows

    assert int(spark.conf.get("spark.sql.execution.arrow.maxBytesPerBatch")) == (
        ARROW_UNBOUNDED_BYTES)
    events = spark.createDataFrame(_events(400, 5), EVENT_SCHEMA)
    tiles = keyed_rows(events, slide_seconds=60, last_items_n=3, partitions=2)
    expected = sorted((r["kind"], r["key"], r["tile_start"]) for r in tiles.collect())

    def received(batches: Any) -> Any:
        for batch in batches:
            yield pa.RecordBatch.from_pydict({
                "rows": [batch.num_rows] * batch.num_rows,
                "kind": batch.column("kind"), "key": batch.column("key"),
                "tile_start": batch.column("tile_start")})

    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "7")
    try:
        got = tiles.mapInArrow(received, "rows long, kind string, key string, tile_start long"
                               ).collect()
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    assert len(expected) > 20
    assert sorted((r["kind"], r["key"], r["tile_start"]) for r in got) == expected
    assert max(r["rows"] for r in got) == 7


def _canonical_row(row: dict[str, Any]) -> dict[str, Any]:
    """A keyed row with its unordered parts sorted and its doubles to 1e-9."""
    out = dict(row)
    out["items_viewed"] = sorted(out["items_viewed"] or [])
    out["category_weights"] = sorted((c["category_id"], round(c["weight"], 9))
                                     for c in out["category_weights"] or [])
    for name in ("last_viewed", "last_purchased"):
        out[name] = [(int(e["event_us"]), e["item_id"]) for e in out[name] or []]
    for name in ("spend", "price"):
        if out[name] is not None:
            out[name] = round(out[name], 9)
    return out


def test_item_metadata_from_keyed_tiles_equals_features_tiles(spark: Any) -> None:
    """The pass takes item metadata from the one aggregation's item rows; it must be
    :func:`features.tiles.item_metadata`, including a price older than the latest event."""
    from features.tiles import item_metadata
    from pipelines.stream_state import keyed_rows
    from pipelines.streaming.pyfeatures import ItemMetadata

    rows = _events(400, 5)
    # i0's latest event is a view (no price) in a later tile than its latest priced event
    last = max(r[2] for r in rows) + timedelta(minutes=3)
    rows.append(("late-view", "view", last, "u0", "s", "i0", "c9", "DE", None, 1, "web"))
    events = spark.createDataFrame(rows, EVENT_SCHEMA)
    fold = ItemMetadata()
    for row in keyed_rows(events, slide_seconds=60, last_items_n=3, partitions=2).toArrow().to_pylist():
        if row["kind"] == "item":
            fold.add(row)
    got = {r["item_id"]: r for r in fold.rows()}
    want = {r["item_id"]: r.asDict() for r in item_metadata(events).collect()}
    assert got.keys() == want.keys()
    for item, row in want.items():
        mine = got[item]
        assert (mine["category_id"], mine["region"], mine["price"]) == (
            row["category_id"], row["region"], row["price"]), item
        assert mine["event_time"] == row["event_time"].replace(tzinfo=UTC), item
    assert got["i0"]["region"] == "DE" and got["i0"]["price"] is not None


def test_a_replayed_batch_changes_nothing(
    make_settings: Callable[..., Settings], redis_client: Any, spark: Any,
) -> None:
    """Apply batch 0 and 1, then batch 1 again (a replay): Redis is unchanged, and the
    online features equal features.windows over both batches' tiles."""
    from features.feast_layout import ITEM_STATS, USER_ACTIVITY
    from features.tiles import item_tiles, user_tiles
    from features.windows import finalize_item_features, finalize_user_features
    from pipelines.connections import redis_kwargs
    from pipelines.stream_state import TileStore
    from pipelines.verify import compare_values

    settings = make_settings()
    store = TileStore(redis_kwargs(settings, timeout_ms=5000), slide_seconds=60, last_items_n=5,
                      long_window_seconds=86_400, ttl_seconds=3600, top_n=5)
    batches = [spark.createDataFrame(_events(200, seed), EVENT_SCHEMA) for seed in (10, 11)]
    clock = max(max(e[2] for e in _events(200, seed)) for seed in (10, 11))
    clock_us = (clock - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)

    def snapshot() -> dict[bytes, dict[bytes, bytes]]:
        return {k: redis_client.hgetall(k) for k in redis_client.scan_iter("ss:v1:*")
                if redis_client.type(k) == b"hash"}

    store.apply(spark, batches[0], batch_id=0, as_of_us=clock_us)
    store.apply(spark, batches[1], batch_id=1, as_of_us=clock_us)
    store.write_top_here(batch_id=1, as_of_us=clock_us)
    state = snapshot()
    store.apply(spark, batches[1], batch_id=1, as_of_us=clock_us)  # Spark replays batch 1
    store.write_top_here(batch_id=1, as_of_us=clock_us)
    assert snapshot() == state

    both = batches[0].unionByName(batches[1])
    for spec, rows in (
        (USER_ACTIVITY, finalize_user_features(user_tiles(both, slide_seconds=60, last_items_n=5),
                                               clock, slide_seconds=60, last_items_n=5)),
        (ITEM_STATS, finalize_item_features(item_tiles(both, slide_seconds=60), clock,
                                            slide_seconds=60)),
    ):
        expected = rows.collect()
        assert expected
        for row in expected:
            online = spec.decode(redis_client.hgetall(spec.redis_key(row[spec.join_key])))
            _, encoded = spec.encode(row.asDict())
            assert compare_values(spec, online, spec.decode(encoded)) == [], row[spec.join_key]


def test_a_batch_never_overwrites_features_of_a_later_event_time(
    make_settings: Callable[..., Settings], redis_client: Any, spark: Any,
) -> None:
    """Features another writer stored as of a later time (a materialization run ahead of
    the stream) stay; the other touched entities get the batch's."""
    from features.feast_layout import (
        ITEM_STATS,
        USER_ACTIVITY,
        decode_timestamp,
        encode_timestamp,
        timestamp_field,
    )
    from pipelines.connections import redis_kwargs
    from pipelines.stream_state import TileStore

    settings = make_settings()
    store = TileStore(redis_kwargs(settings, timeout_ms=5000), slide_seconds=60, last_items_n=5,
                      long_window_seconds=86_400, ttl_seconds=3600, top_n=5)
    events = _events(200, 12)
    clock = max(e[2] for e in events)
    clock_us = (clock - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
    later = clock + timedelta(hours=1)
    held = {spec: spec.redis_key(key) for spec, key in ((USER_ACTIVITY, "u0"), (ITEM_STATS, "i0"))}
    for spec, key in held.items():
        redis_client.hset(key, timestamp_field(spec.name), encode_timestamp(later))

    store.apply(spark, spark.createDataFrame(events, EVENT_SCHEMA), batch_id=0,
                as_of_us=clock_us)

    for spec, key in held.items():  # untouched: no feature written beside the later time
        assert redis_client.hkeys(key) == [timestamp_field(spec.name)], spec.name
        assert decode_timestamp(redis_client.hget(key, timestamp_field(spec.name))) == later
    for spec, key in ((USER_ACTIVITY, "u1"), (ITEM_STATS, "i1")):  # touched by the batch too
        stored = redis_client.hget(spec.redis_key(key), timestamp_field(spec.name))
        assert decode_timestamp(stored) == clock, (spec.name, key)


def test_a_new_checkpoints_batches_reach_the_tiles_an_earlier_one_left(
    make_settings: Callable[..., Settings], redis_client: Any, spark: Any,
) -> None:
    """Batch ids start again at 0 on a new checkpoint. An earlier checkpoint's run left
    its markers at batch 40 on these keys; the new run's batches 0 and 1 are new
    events, not replays: afterwards the features equal features.windows over all of
    them, and replaying the new run's batch 1 still changes nothing."""
    from features.feast_layout import USER_ACTIVITY
    from features.tiles import user_tiles
    from features.windows import finalize_user_features
    from pipelines.connections import redis_kwargs
    from pipelines.stream_state import MARKER_FIELD, TileStore, tiles_key
    from pipelines.verify import compare_values

    settings = make_settings()
    store = TileStore(redis_kwargs(settings, timeout_ms=5000), slide_seconds=60, last_items_n=5,
                      long_window_seconds=86_400, ttl_seconds=3600, top_n=5)
    seeds = (20, 21, 22)
    batches = [spark.createDataFrame(_events(200, seed), EVENT_SCHEMA) for seed in seeds]
    clock = max(max(e[2] for e in _events(200, seed)) for seed in seeds)
    clock_us = (clock - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)

    assert store.claim("old-run") is None  # what the job records on its first batch
    store.apply(spark, batches[0], batch_id=40, as_of_us=clock_us, run="old-run")
    assert store.claim("new-run") == "old-run"  # the new run sees (and warns) whose tiles
    assert store.claim("new-run") == "new-run"
    user = _events(200, seeds[1])[0][3]
    assert redis_client.hget(tiles_key("user", user), MARKER_FIELD) is not None
    store.apply(spark, batches[1], batch_id=0, as_of_us=clock_us, run="new-run")
    store.apply(spark, batches[2], batch_id=1, as_of_us=clock_us, run="new-run")
    assert redis_client.hget(tiles_key("user", user), MARKER_FIELD) in (b"new-run:0",
                                                                        b"new-run:1")
    state = {k: redis_client.hgetall(k) for k in redis_client.scan_iter("ss:v1:tiles:*")}
    store.apply(spark, batches[2], batch_id=1, as_of_us=clock_us, run="new-run")  # a replay
    assert {k: redis_client.hgetall(k) for k in redis_client.scan_iter("ss:v1:tiles:*")} == state

    every = batches[0].unionByName(batches[1]).unionByName(batches[2])
    expected = finalize_user_features(user_tiles(every, slide_seconds=60, last_items_n=5), clock,
                                      slide_seconds=60, last_items_n=5).collect()
    assert expected
    for row in expected:
        online = USER_ACTIVITY.decode(redis_client.hgetall(USER_ACTIVITY.redis_key(row["user_id"])))
        _, encoded = USER_ACTIVITY.encode(row.asDict())
        assert compare_values(USER_ACTIVITY, online, USER_ACTIVITY.decode(encoded)) == [], \
            row["user_id"]


def test_users_items_and_top_lists_over_a_day_of_batches_equal_a_recomputation(
    make_settings: Callable[..., Settings], redis_client: Any, spark: Any,
) -> None:
    """Batches over 32 h, the clock moving by minutes or by hours, each with events down
    to the allowed lateness before the previous clock: after every batch the user and
    item features (a base over the closed tiles plus the open ones) and the top lists
    equal features.windows over every event so far; tiles that left the 24h window are
    gone, and a replayed top write changes nothing."""
    from features.feast_layout import ITEM_STATS, USER_ACTIVITY
    from features.tiles import item_tiles, sales_tiles, user_tiles
    from features.windows import finalize_item_features, finalize_top_items, finalize_user_features
    from pipelines.connections import redis_kwargs
    from pipelines.stream_state import (
        BASE_FIELD,
        TileStore,
        sales_tile_key,
        tiles_key,
        top_base_key,
    )
    from pipelines.streaming.snapshot import TOP_SCHEMA, served_top_rows
    from pipelines.verify import compare_values

    TOP_FIELDS = [c.split()[0] for c in TOP_SCHEMA.split(", ")]

    settings = make_settings()
    lateness_s = 600
    store = TileStore(redis_kwargs(settings, timeout_ms=5000), slide_seconds=60, last_items_n=5,
                      long_window_seconds=86_400, ttl_seconds=7 * 86_400, top_n=4)
    everything: list[tuple] = []
    prev_clock_us: int | None = None
    open_from: int | None = None

    def epoch_us(ts: datetime) -> int:
        return (ts - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)

    def rows_of(frame: Any) -> list[tuple]:
        return sorted((r["kind"], r["window"], r["category_id"] or "", r["region"] or "",
                       r["rank"], r["item_id"], round(r["score"], 9)) for r in frame)

    # minutes the clock moves per batch: small steps move the bases tile by tile, jumps
    # past a window's range refill it, and the last steps run past 24h of history
    steps = [180, 7, 3, 180, 12, 1, 1200, 9, 2, 240, 30, 61]
    for batch_id, step in enumerate(steps):
        start, span_s = T0, step * 60
        if prev_clock_us is not None:  # the oldest an accepted event can be
            start = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(
                microseconds=prev_clock_us - lateness_s * 1_000_000)
            span_s += lateness_s
        batch = _events(150, 100 + batch_id, start=start, span_s=span_s)
        everything += batch
        clock_us = max(prev_clock_us or 0, max(epoch_us(e[2]) for e in batch))
        open_from = (None if prev_clock_us is None
                     else store.tile_of(prev_clock_us - lateness_s * 1_000_000))
        store.apply(spark, spark.createDataFrame(batch, EVENT_SCHEMA), batch_id=batch_id,
                    as_of_us=clock_us, open_from=open_from)
        store.write_top_here(batch_id=batch_id, as_of_us=clock_us, open_from=open_from)
        got = [dict(zip(TOP_FIELDS, r, strict=True))
               for r in served_top_rows([], redis_kwargs=store.redis_kwargs)]
        clock = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=clock_us)
        every = spark.createDataFrame(everything, EVENT_SCHEMA)
        expected = finalize_top_items(sales_tiles(every, slide_seconds=60), clock,
                                      slide_seconds=60, top_n=4).collect()
        assert expected, batch_id
        assert rows_of(got) == rows_of([r.asDict() for r in expected]), f"batch {batch_id}"
        items = finalize_item_features(item_tiles(every, slide_seconds=60), clock,
                                       slide_seconds=60).collect()
        assert len(items) == 6, batch_id
        for row in items:
            online = ITEM_STATS.decode(redis_client.hgetall(ITEM_STATS.redis_key(row["item_id"])))
            _, encoded = ITEM_STATS.encode(row.asDict())
            assert compare_values(ITEM_STATS, online, ITEM_STATS.decode(encoded)) == [], (
                batch_id, row["item_id"])
        users = finalize_user_features(user_tiles(every, slide_seconds=60, last_items_n=5), clock,
                                       slide_seconds=60, last_items_n=5).collect()
        assert len(users) == 4, batch_id
        for row in users:
            online = USER_ACTIVITY.decode(
                redis_client.hgetall(USER_ACTIVITY.redis_key(row["user_id"])))
            _, encoded = USER_ACTIVITY.encode(row.asDict())
            assert compare_values(USER_ACTIVITY, online, USER_ACTIVITY.decode(encoded)) == [], (
                batch_id, row["user_id"])
        if batch_id > 0:
            assert redis_client.hexists(tiles_key("item", "i0"), BASE_FIELD), batch_id
            assert redis_client.hexists(tiles_key("user", "u0"), BASE_FIELD), batch_id
        prev_clock_us = clock_us

    assert prev_clock_us is not None
    first_kept = store.tile_of(prev_clock_us) - 86_400 + 60
    item_tiles_left = [int(f) for f in redis_client.hkeys(tiles_key("item", "i0"))
                       if not f.startswith(b"_")]
    assert item_tiles_left and min(item_tiles_left) >= first_kept, sorted(item_tiles_left)[:5]
    user_tiles_left = [int(f) for f in redis_client.hkeys(tiles_key("user", "u0"))
                       if not f.startswith(b"_")]
    assert user_tiles_left and min(user_tiles_left) >= first_kept, sorted(user_tiles_left)[:5]
    per_tile = [int(k.decode().rsplit(":", 1)[1])
                for k in redis_client.scan_iter(sales_tile_key(0).rsplit(":", 1)[0] + ":*")]
    assert per_tile and min(per_tile) >= first_kept, sorted(per_tile)[:5]
    base = redis_client.hgetall(top_base_key())
    store.write_top_here(batch_id=len(steps) - 1, as_of_us=prev_clock_us,
                         open_from=open_from)  # a replay
    assert redis_client.hgetall(top_base_key()) == base


@pytest.mark.parametrize("writer", ["reader", "spark"])
def test_a_snapshot_records_the_rows_and_lists_serving_reads(
    make_settings: Callable[..., Settings], redis_client: Any, spark: Any, tmp_path: Any,
    monkeypatch: pytest.MonkeyPatch, writer: str,
) -> None:
    """Two batches whose clocks are in different tiles, then the snapshot of the first
    tile: one row per entity touched in it -- the row Redis holds, which is the batch
    recomputation as of that row's own timestamp -- none for an entity touched only
    later, and every top list as stored, ranked as the backfill ranks. Written by the
    reader process (a local store) or by Spark (an object store), the tables read back
    alike, in Spark's types."""
    import pandas as pd

    from features.feast_layout import ITEM_STATS, USER_ACTIVITY
    from features.tiles import item_tiles, user_tiles
    from features.windows import finalize_item_features, finalize_user_features
    from pipelines.connections import redis_kwargs
    from pipelines.offline_store import snapshot_path
    from pipelines.online_writer import top_item_key
    from pipelines.stream_state import TileStore
    from pipelines.streaming import snapshot as snap
    from pipelines.streaming.snapshot import write_served_snapshot
    from pipelines.verify import compare_values

    settings = make_settings(data_dir=str(tmp_path / "data"))  # snapshot tables of its own
    kwargs = redis_kwargs(settings, timeout_ms=5000)
    store = TileStore(kwargs, slide_seconds=60, last_items_n=5, long_window_seconds=86_400,
                      ttl_seconds=3600, top_n=3)
    first = _events(120, 21, span_s=300)
    first.append(("only-first", "purchase", T0 + timedelta(seconds=5), "u-first", "s", "i0", "c0",
                  "UK", 3.5, 2, "web"))
    clock0 = max(e[2] for e in first)
    second = _events(120, 22, start=clock0, span_s=300)
    second.append(("only-second", "view", clock0 + timedelta(seconds=1), "u-second", "s", "i1",
                   "c1", "FR", None, 1, "web"))
    clock1 = max(e[2] for e in second)

    def epoch_us(ts: datetime) -> int:
        return (ts - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)

    for batch_id, (rows, clock) in enumerate(((first, clock0), (second, clock1))):
        store.apply(spark, spark.createDataFrame(rows, EVENT_SCHEMA), batch_id=batch_id,
                    as_of_us=epoch_us(clock))
        store.write_top_here(batch_id=batch_id, as_of_us=epoch_us(clock))
    tile0, tile1 = store.tile_of(epoch_us(clock0)), store.tile_of(epoch_us(clock1))
    assert tile0 < tile1

    if writer == "spark":
        monkeypatch.setattr(snap, "_stages_locally", lambda _: False)
    write_served_snapshot(spark, settings, kwargs, range(tile0, tile1, 60), stage_id=1)
    # Spark reads the types it writes itself, whichever wrote the tables
    for spec in (USER_ACTIVITY, ITEM_STATS):
        want = snap._struct(snap.view_schema(spec)).simpleString()[:-1]
        got = spark.read.parquet(snapshot_path(settings, spec.name)).schema.simpleString()
        assert got == want + ",created:timestamp,event_date:date>", spec.name

    def recomputed(spec: Any, entity: str, as_of: datetime) -> dict[str, Any]:
        events = spark.createDataFrame(first + (second if as_of == clock1 else []), EVENT_SCHEMA)
        if spec is USER_ACTIVITY:
            frame = finalize_user_features(user_tiles(events, slide_seconds=60, last_items_n=5),
                                           as_of, slide_seconds=60, last_items_n=5)
        else:
            frame = finalize_item_features(item_tiles(events, slide_seconds=60), as_of,
                                           slide_seconds=60)
        row = frame.where(frame[spec.join_key] == entity).collect()[0].asDict()
        return spec.decode(spec.encode(row)[1])

    for spec, touched in ((USER_ACTIVITY, {e[3] for e in first}),
                          (ITEM_STATS, {e[5] for e in first})):
        snap = pd.read_parquet(snapshot_path(settings, spec.name))
        assert sorted(snap[spec.join_key]) == sorted(touched), spec.name  # once each
        for row in snap.to_dict("records"):
            entity = row[spec.join_key]
            as_of = row["event_timestamp"].to_pydatetime()
            later = entity in {e[3] if spec is USER_ACTIVITY else e[5] for e in second}
            assert as_of == (clock1 if later else clock0), entity
            served = spec.decode(redis_client.hgetall(spec.redis_key(entity)))
            mine = {name: (row[name].tolist() if hasattr(row[name], "tolist") else row[name])
                    for name in spec.feature_names}
            mine = {k: (None if isinstance(v, float) and v != v else v) for k, v in mine.items()}
            mine = {k: (v.to_pydatetime() if hasattr(v, "to_pydatetime") else v)
                    for k, v in mine.items()}
            assert compare_values(spec, mine, served) == [], entity
            assert compare_values(spec, mine, recomputed(spec, entity, as_of)) == [], entity
    assert "u-first" in set(pd.read_parquet(snapshot_path(settings, "user_activity"))["user_id"])

    top = pd.read_parquet(snapshot_path(settings, "top_items"))
    assert len(top) > 0 and set(top["event_timestamp"]) == {
        pd.Timestamp(clock1.replace(microsecond=clock1.microsecond // 1000 * 1000))}
    for (kind, window, category, region), rows in top.groupby(
            ["kind", "window", "category_id", "region"], dropna=False):
        from features.online_keys import scope_for

        scope = scope_for(None if pd.isna(category) else category,
                          None if pd.isna(region) else region)
        stored = redis_client.zrange(top_item_key(kind, window, scope), 0, -1, withscores=True)
        want = sorted(((m.decode(), s) for m, s in stored), key=lambda p: (-p[1], p[0]))
        got = rows.sort_values("rank")
        assert list(got["rank"]) == list(range(1, len(want) + 1))
        assert list(zip(got["item_id"], got["score"], strict=True)) == want, (kind, window, scope)


def test_a_snapshot_interrupted_and_run_again_is_written_once(
    make_settings: Callable[..., Settings], redis_client: Any, spark: Any,
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any,
) -> None:
    """A process that dies after staging a snapshot, or after moving it in but before its
    done-marker, leaves work that the next process's run finishes: every row once, with
    the values the first run read, not those Redis holds by then."""
    import pandas as pd

    from pipelines.connections import redis_kwargs
    from pipelines.offline_store import snapshot_path
    from pipelines.stream_state import TileStore
    from pipelines.streaming import snapshot as snap

    settings = make_settings(data_dir=str(tmp_path / "data"))  # snapshot tables of its own
    kwargs = redis_kwargs(settings, timeout_ms=5000)
    store = TileStore(kwargs, slide_seconds=60, last_items_n=5, long_window_seconds=86_400,
                      ttl_seconds=3600, top_n=3)

    def epoch_us(ts: datetime) -> int:
        return (ts - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)

    def apply(batch_id: int, rows: list[tuple]) -> int:
        clock = epoch_us(max(e[2] for e in rows))
        store.apply(spark, spark.createDataFrame(rows, EVENT_SCHEMA), batch_id=batch_id,
                    as_of_us=clock)
        store.write_top_here(batch_id=batch_id, as_of_us=clock)
        return store.tile_of(clock)

    def table(name: str) -> pd.DataFrame:
        df = pd.read_parquet(snapshot_path(settings, name)).drop(columns=["created", "event_date"])
        key = [c for c in df.columns if c not in ("score",)][:3]
        return df.sort_values([*key, "event_timestamp"]).reset_index(drop=True)

    first = _events(80, 31, span_s=120)
    tile = apply(0, first)
    generations = range(tile, tile + 60, 60)

    # 1. staged, then the process dies before any file moved in
    def dies(*_: Any, **__: Any) -> int:
        raise OSError("killed")

    with monkeypatch.context() as patch:
        patch.setattr(snap._Files, "move_data_files", dies)
        with pytest.raises(OSError):
            snap.write_served_snapshot(spark, settings, kwargs, generations, stage_id=5)
    later = max(e[2] for e in first) + timedelta(seconds=1)
    apply(1, _events(80, 32, start=later, span_s=60))  # Redis moves on: newer rows
    marks: list[int] = []
    snap.write_served_snapshot(spark, settings, kwargs, generations, stage_id=5,
                               done=lambda: marks.append(5))
    assert marks == [5]
    once = {name: table(name) for name in ("user_activity", "item_stats", "top_items")}
    assert set(once["user_activity"]["user_id"]) == {e[3] for e in first}
    # the first run's reads: before batch 1, so as of batch 0's clock
    assert set(once["user_activity"]["event_timestamp"]) == {
        pd.Timestamp(max(e[2] for e in first))}

    # 2. moved in, then the process dies before the done-marker: the run again adds nothing
    def crash() -> None:
        raise OSError("killed")

    with pytest.raises(OSError):
        snap.write_served_snapshot(spark, settings, kwargs, generations, stage_id=6, done=crash)
    twice = {name: table(name) for name in once}
    snap.write_served_snapshot(spark, settings, kwargs, generations, stage_id=6,
                               done=lambda: marks.append(6))
    assert marks == [5, 6]
    for name in once:
        pd.testing.assert_frame_equal(table(name), twice[name])
        assert len(twice[name]) > len(once[name]), name
        assert not twice[name].astype(str).duplicated().any(), name  # stage 6 added once


def test_a_new_checkpoint_never_takes_a_snapshot_staged_by_an_earlier_one(
    make_settings: Callable[..., Settings], redis_client: Any, spark: Any, tmp_path: Any,
) -> None:
    """Batch ids start again at 0 on a new checkpoint. A snapshot an earlier checkpoint
    staged for its batch 7 and never moved in (its process died, then the checkpoint
    was wiped) is not what this checkpoint's batch 7 writes: the new snapshot has the
    entities Redis holds now, and none of the stale staged rows."""
    import pandas as pd
    from pyspark.sql import functions as F

    from features.feast_layout import USER_ACTIVITY
    from pipelines.offline_store import snapshot_path
    from pipelines.stream_state import BatchLog, SnapshotMark
    from pipelines.streaming.online import OnlineFeatures
    from pipelines.streaming.snapshot import local_frame, staging_path, view_schema

    settings = make_settings(data_dir=str(tmp_path / "data"))  # snapshot tables of its own
    online = OnlineFeatures(settings)
    store = online.store
    rows = _events(60, 41, span_s=120)
    clock = max(e[2] for e in rows)
    clock_us = (clock - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
    store.apply(spark, spark.createDataFrame(rows, EVENT_SCHEMA), batch_id=0, as_of_us=clock_us)
    tile = store.tile_of(clock_us)

    old_log = BatchLog(spark, str(tmp_path / "old-checkpoint"))
    new_log = BatchLog(spark, str(tmp_path / "new-checkpoint"))
    assert old_log.run_id() != new_log.run_id()
    assert BatchLog(spark, str(tmp_path / "new-checkpoint")).run_id() == new_log.run_id()
    # what the earlier checkpoint left: complete staged tables of its batch 7 (under its
    # run id, and under the bare batch id the staging used before run ids)
    stale = [("u-stale", *([None] * len(USER_ACTIVITY.features)), clock)]
    for stage in (f"{old_log.run_id()}-7", 7):
        frame = local_frame(spark, stale, view_schema(USER_ACTIVITY))
        frame.withColumn("created", F.current_timestamp()).write.mode("overwrite").parquet(
            staging_path(settings, stage, USER_ACTIVITY.name))

    online._write_snapshot(spark, new_log, SnapshotMark(tile + 60, tile, 7), None)

    snap = pd.read_parquet(snapshot_path(settings, USER_ACTIVITY.name))
    assert "u-stale" not in set(snap["user_id"])
    assert sorted(snap["user_id"]) == sorted({e[3] for e in rows})
    assert new_log.marked("snapshot", 7)


def test_a_snapshot_has_every_touched_entity_once_in_one_file_per_table(
    make_settings: Callable[..., Settings], redis_client: Any, spark: Any, tmp_path: Any,
) -> None:
    """Many entities touched in one slide: each is in its table once, and each table
    gets one file per snapshot (not one per task or chunk: the offline store would
    fill with small files, one set per minute)."""
    from pathlib import Path

    import pandas as pd

    from features.feast_layout import ITEM_STATS, USER_ACTIVITY
    from pipelines.connections import redis_kwargs
    from pipelines.offline_store import snapshot_path
    from pipelines.stream_state import TileStore
    from pipelines.streaming import snapshot as snap

    settings = make_settings(data_dir=str(tmp_path / "data"))  # snapshot tables of its own
    kwargs = redis_kwargs(settings, timeout_ms=5000)
    store = TileStore(kwargs, slide_seconds=60, last_items_n=5, long_window_seconds=86_400,
                      ttl_seconds=3600, top_n=3)
    rnd = random.Random(41)
    events = [(f"e41-{i}", "purchase" if i % 5 == 0 else "view",
               T0 + timedelta(seconds=rnd.randrange(50)), f"user{i % 1370}", "s",
               f"item{i % 230}", "c0", "UK", 2.0 if i % 5 == 0 else None, 1, "web")
              for i in range(3000)]
    clock = max(e[2] for e in events)
    clock_us = (clock - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
    store.apply(spark, spark.createDataFrame(events, EVENT_SCHEMA), batch_id=0, as_of_us=clock_us)
    store.write_top_here(batch_id=0, as_of_us=clock_us)
    tile = store.tile_of(clock_us)

    snap.write_served_snapshot(spark, settings, kwargs, range(tile, tile + 60, 60), stage_id=1)
    for spec, entities in ((USER_ACTIVITY, {f"user{i}" for i in range(1370)}),
                           (ITEM_STATS, {f"item{i}" for i in range(230)})):
        table = pd.read_parquet(snapshot_path(settings, spec.name))
        assert sorted(table[spec.join_key]) == sorted(entities), spec.name
        files = list(Path(snapshot_path(settings, spec.name)).rglob("*.parquet"))
        assert len(files) == 1, (spec.name, files)
    top = Path(snapshot_path(settings, "top_items"))
    assert len(pd.read_parquet(top)) > 0 and len(list(top.rglob("*.parquet"))) == 1


def test_the_bytes_of_a_batch_copy_on_disk_are_told_and_none_when_it_fits(spark: Any) -> None:
    """``spilled_bytes``, which the job reads after holding each batch: a checkpoint whose
    blocks Spark put on disk counts them (as Spark's storage status does), one held in
    memory counts none, and so does a frame that is not a checkpoint; once released,
    nothing is left to count."""
    from pyspark import StorageLevel

    from pipelines.stream_state import release, spilled_bytes

    frame = spark.range(200_000).selectExpr("id", "repeat(cast(id as string), 8) AS text")
    on_disk = frame.localCheckpoint(eager=True, storageLevel=StorageLevel.DISK_ONLY)
    in_memory = frame.localCheckpoint(eager=True, storageLevel=StorageLevel.MEMORY_ONLY)
    try:
        on_disk_bytes = spilled_bytes(on_disk)
        rdd_id = on_disk._jdf.queryExecution().analyzed().rdd().id()
        status = [info for info in spark.sparkContext._jsc.sc().getRDDStorageInfo()
                  if info.id() == rdd_id]
        assert len(status) == 1 and status[0].numCachedPartitions() >= 1
        assert on_disk_bytes == status[0].diskSize() > 200_000 * 8  # at least the ids
        assert spilled_bytes(in_memory) == 0
        assert spilled_bytes(frame) == 0
        assert on_disk.count() == 200_000
    finally:
        release(on_disk)
        release(in_memory)
    assert spilled_bytes(on_disk) == 0
