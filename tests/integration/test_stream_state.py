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


def test_merging_tiles_of_two_halves_equals_tiles_of_the_whole(spark: Any) -> None:
    from features.tiles import item_tiles, sales_tiles, user_tiles
    from pipelines.stream_state import merge_item_tiles, merge_sales_tiles, merge_user_tiles

    first = spark.createDataFrame(_events(300, 1), EVENT_SCHEMA)
    second = spark.createDataFrame(_events(300, 2), EVENT_SCHEMA)
    whole = first.unionByName(second)

    users = merge_user_tiles(
        user_tiles(first, slide_seconds=60, last_items_n=3).unionByName(
            user_tiles(second, slide_seconds=60, last_items_n=3)), last_items_n=3)
    expected = user_tiles(whole, slide_seconds=60, last_items_n=3)
    keys = ["user_id", "tile_start"]
    assert _unordered(_sorted_rows(users, keys), "category_weights") == _unordered(
        _sorted_rows(expected, keys), "category_weights")

    items = merge_item_tiles(item_tiles(first, slide_seconds=60).unionByName(
        item_tiles(second, slide_seconds=60)))
    assert _sorted_rows(items, ["item_id", "tile_start"]) == _sorted_rows(
        item_tiles(whole, slide_seconds=60), ["item_id", "tile_start"])

    sales = merge_sales_tiles(sales_tiles(first, slide_seconds=60).unionByName(
        sales_tiles(second, slide_seconds=60)))
    keys = ["item_id", "category_id", "region", "tile_start"]
    assert _sorted_rows(sales, keys) == _sorted_rows(sales_tiles(whole, slide_seconds=60), keys)


def test_tile_json_keeps_microseconds(spark: Any) -> None:
    from pyspark.sql import functions as F

    from features.tiles import user_tiles
    from pipelines.stream_state import USER, tile_from_json, tile_to_json

    tiles = user_tiles(spark.createDataFrame(_events(50, 3), EVENT_SCHEMA), slide_seconds=60,
                       last_items_n=5)
    schema = tiles.select(*USER.value_columns).schema
    back = tiles.select("user_id", "tile_start",
                        tile_from_json(tile_to_json(tiles, USER.value_columns), schema).alias("t"))
    back = back.select("user_id", "tile_start", "t.*")
    keys = ["user_id", "tile_start"]
    assert _sorted_rows(back, keys) == _sorted_rows(tiles, keys)
    assert back.where(F.unix_micros("last_event_time") % 1000 != 0).count() > 0


def test_a_replayed_batch_changes_nothing(
    make_settings: Callable[..., Settings], redis_client: Any, spark: Any,
) -> None:
    """Apply batch 0 and 1, then batch 1 again (a replay): state and features are unchanged."""
    from features.tiles import item_tiles, sales_tiles, user_tiles
    from features.windows import finalize_item_features, finalize_user_features
    from pipelines.connections import redis_kwargs
    from pipelines.stream_state import TileStore

    settings = make_settings()
    store = TileStore(redis_kwargs(settings, timeout_ms=5000), slide_seconds=60, last_items_n=5,
                      long_window_seconds=86_400, ttl_seconds=3600)
    batches = [spark.createDataFrame(_events(200, seed), EVENT_SCHEMA) for seed in (10, 11)]

    def apply(batch_id: int, prev_us: int | None) -> tuple[int, Any]:
        from pyspark.sql import functions as F

        events = batches[batch_id]
        as_of_us = events.agg(F.max(F.unix_micros("event_time"))).first()[0]
        if prev_us is not None:
            as_of_us = max(as_of_us, prev_us)
        merged = store.apply(
            spark, batch_id=batch_id, as_of_us=as_of_us, prev_as_of_us=prev_us,
            user_delta=user_tiles(events, slide_seconds=60, last_items_n=5),
            item_delta=item_tiles(events, slide_seconds=60),
            sales_delta=sales_tiles(events, slide_seconds=60))
        as_of = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=as_of_us)
        users = _sorted_rows(finalize_user_features(merged.users, as_of, slide_seconds=60,
                                                    last_items_n=5).drop("created"), ["user_id"])
        items = _sorted_rows(finalize_item_features(merged.items, as_of, slide_seconds=60)
                             .drop("created"), ["item_id"])
        merged.release()
        return as_of_us, (users, items)

    clock0, _ = apply(0, None)
    clock1, features = apply(1, clock0)
    state = {k: redis_client.hgetall(k) for k in redis_client.scan_iter("ss:v1:tiles:*")}
    _, replayed = apply(1, clock0)  # a crash after the writes: Spark runs batch 1 again
    assert {k: redis_client.hgetall(k) for k in redis_client.scan_iter("ss:v1:tiles:*")} == state
    assert replayed == features

    # and the state equals the tiles of both batches together
    both = batches[0].unionByName(batches[1])
    as_of = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=clock1)
    expected = _sorted_rows(finalize_user_features(
        user_tiles(both, slide_seconds=60, last_items_n=5), as_of, slide_seconds=60,
        last_items_n=5).drop("created"), ["user_id"])
    assert features[0] == expected
    expected_items = _sorted_rows(finalize_item_features(
        item_tiles(both, slide_seconds=60), as_of, slide_seconds=60).drop("created"), ["item_id"])
    assert features[1] == expected_items
