"""Window features on a small hand-written event set whose every answer is known.

The as-of time ``T`` is 12:00:00 (a tile boundary, slide 60 s). With the tiling
rule, the 1h window as of ``T`` is the tiles 11:01 .. 12:00 (the last one partial,
events <= T only) and the 24h window the tiles from 12:01 the day before.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from features.events import VALID_COLUMNS
from features.tiles import item_metadata, item_tiles, sales_tiles, user_tiles
from features.windows import (
    ITEM_FEATURE_COLUMNS,
    TOP_ITEM_COLUMNS,
    USER_FEATURE_COLUMNS,
    features_over_time,
    finalize_item_features,
    finalize_top_items,
    finalize_user_features,
)

pytestmark = pytest.mark.integration

T = datetime(2024, 3, 10, 12, 0, tzinfo=UTC)
SLIDE = 60
N_LAST = 3
SCHEMA = (
    "event_id string, event_type string, event_time timestamp, user_id string, "
    "session_id string, item_id string, category_id string, region string, "
    "price double, quantity int, device string"
)


def ev(eid: str, kind: str, at: datetime, user: str, item: str, cat: str, region: str = "UK",
       price: float | None = None, qty: int = 1) -> tuple[Any, ...]:
    return (eid, kind, at, user, "s-" + user, item, cat, region, price, qty, None)


EVENTS = [
    ev("e01", "view", T - timedelta(minutes=30), "u1", "A", "c1"),
    ev("e02", "view", T - timedelta(minutes=14, seconds=50), "u1", "B", "c1"),
    ev("e03", "view", T - timedelta(minutes=10), "u1", "A", "c1"),  # A again
    ev("e04", "add_to_cart", T - timedelta(minutes=5), "u1", "A", "c1", price=10.0, qty=2),
    ev("e05", "purchase", T, "u1", "A", "c1", price=10.0, qty=2),  # exactly at T: counts
    ev("e06", "purchase", T + timedelta(microseconds=1), "u1", "B", "c1", price=5.5),  # after T
    ev("e07", "view", T - timedelta(hours=1, seconds=1), "u1", "C", "c2"),  # tile 10:59: 24h only
    ev("e08", "view", T - timedelta(minutes=59), "u1", "D", "c2"),  # tile 11:01: inside 1h
    ev("e09", "purchase", T - timedelta(hours=23), "u1", "C", "c2", region="FR", price=100.0),
    ev("e10", "view", T - timedelta(hours=24), "u1", "E", "c3"),  # tile T-24h: outside 24h
    ev("e11", "view", T - timedelta(hours=24) + timedelta(seconds=60), "u1", "F", "c3"),
    ev("e12", "view", T + timedelta(seconds=10), "u2", "H", "c1"),  # only after T
    ev("e13", "purchase", T - timedelta(hours=24) + timedelta(seconds=20), "u3", "G", "c4",
       price=1.0),  # tile T-24h: just left the 24h window at T
    ev("e14", "purchase", T - timedelta(minutes=40), "u4", "I", "c2", region="FR", price=3.0),
]


@pytest.fixture(scope="module")
def events(spark: Any) -> Any:
    return spark.createDataFrame(EVENTS, SCHEMA).select(*VALID_COLUMNS).cache()


@pytest.fixture(scope="module")
def at_t(events: Any) -> Any:
    """features_over_time at T and T + 30 s (same tile as the events just after T)."""
    frames = features_over_time(events, start=T, step_seconds=30, count=2, slide_seconds=SLIDE,
                                last_items_n=N_LAST, top_n=2, created=T)
    return {
        "users": {(r["user_id"], r["event_timestamp"]): r.asDict() for r in frames.users.collect()},
        "items": {(r["item_id"], r["event_timestamp"]): r.asDict() for r in frames.items.collect()},
        "top": [r.asDict() for r in frames.top_items.collect()],
    }


def naive(ts: datetime) -> datetime:
    """Spark returns session-time-zone (UTC) timestamps as naive datetimes."""
    return ts.astimezone(UTC).replace(tzinfo=None)


def user(at_t: dict, uid: str, ts: datetime = T) -> dict:
    return at_t["users"][(uid, naive(ts))]


def item(at_t: dict, iid: str, ts: datetime = T) -> dict:
    return at_t["items"][(iid, naive(ts))]


def test_user_features_exact_at_tile_boundary(at_t: dict) -> None:
    u1 = user(at_t, "u1")
    assert {k: u1[k] for k in USER_FEATURE_COLUMNS if k != "created"} == {
        "user_id": "u1",
        "views_1h": 4,  # e01 e02 e03 e08; e07 (tile 10:59) is outside
        "views_24h": 6,  # + e07 e11; e10 (tile T-24h) is outside
        "carts_1h": 1,
        "carts_24h": 1,
        "purchases_1h": 1,  # e05 at T; e06 one microsecond later does not leak
        "purchases_24h": 2,  # + e09
        "spend_1h": 20.0,
        "spend_24h": 120.0,
        "distinct_items_viewed_1h": 3,  # A, B, D
        "last_event_time": naive(T),
        "top_category": "c1",
        "category_affinity_ids": ["c1", "c2", "c3"],
        "category_affinity_weights": [11.0, 7.0, 1.0],  # 3 views+cart 3+purchase 5; 2 views+5; 1
        "last_viewed_items": ["A", "B", "D"],  # most recent distinct first
        "last_purchased_items": ["A", "C"],  # e05 at T, e09; e06 (B) is after T
        "event_timestamp": naive(T),
    }
    assert u1["created"] == naive(T)


def test_user_features_event_after_as_of_counts_at_next_as_of(at_t: dict) -> None:
    later = T + timedelta(seconds=30)
    u1 = user(at_t, "u1", later)
    assert (u1["purchases_1h"], u1["spend_1h"], u1["purchases_24h"]) == (2, 25.5, 3)
    assert u1["last_purchased_items"] == ["B", "A", "C"]  # e06 now counts, most recent first
    assert ("u2", naive(T)) not in at_t["users"]  # its only event is after T
    assert user(at_t, "u2", later)["views_1h"] == 1


def test_user_leaving_24h_window_gets_one_zero_row(at_t: dict) -> None:
    u3 = user(at_t, "u3")  # its only event is in the tile T-24h, which left the window at T
    assert (u3["purchases_24h"], u3["spend_24h"], u3["views_24h"]) == (0, 0.0, 0)
    assert u3["top_category"] is None and u3["category_affinity_ids"] == []
    assert u3["last_event_time"] is None and u3["last_viewed_items"] == []
    assert u3["last_purchased_items"] == []  # e13 left the 24h window with its tile
    assert ("u3", naive(T + timedelta(seconds=30))) not in at_t["users"]  # only one such row


def test_item_features_and_conversion_rate(at_t: dict) -> None:
    a = item(at_t, "A")
    assert {k: a[k] for k in ITEM_FEATURE_COLUMNS if k not in ("created", "trending_score")} == {
        "item_id": "A", "category_id": "c1",
        "views_1h": 2, "views_24h": 2, "carts_1h": 1, "carts_24h": 1,
        "purchases_1h": 1, "purchases_24h": 1, "units_1h": 2, "units_24h": 2,
        "revenue_1h": 20.0, "revenue_24h": 20.0,
        "conversion_rate_1h": 0.5, "conversion_rate_24h": 0.5,
        "event_timestamp": naive(T),
    }
    assert a["trending_score"] == pytest.approx((2 + 1) / (2 / 24 + 1))
    b = item(at_t, "B")  # viewed; its purchase is after T
    assert (b["views_1h"], b["purchases_1h"], b["conversion_rate_1h"], b["trending_score"]) == (
        1, 0, 0.0, 1.0)
    c = item(at_t, "C")  # viewed just outside 1h, bought 23h ago
    assert (c["views_1h"], c["views_24h"], c["units_1h"], c["units_24h"]) == (0, 1, 0, 1)
    assert c["conversion_rate_1h"] == 0.0  # zero views: defined as 0.0
    assert c["conversion_rate_24h"] == 1.0
    assert c["revenue_24h"] == 100.0
    assert c["trending_score"] == pytest.approx(1 / (1 / 24 + 1))
    i = item(at_t, "I")  # bought without a view: zero views -> 0.0
    assert (i["purchases_1h"], i["conversion_rate_1h"]) == (1, 0.0)
    e = item(at_t, "E")  # its only view is in the tile T-24h: one all-zero row
    assert (e["views_24h"], e["category_id"]) == (0, None)
    assert ("H", naive(T)) not in at_t["items"]


def top_list(at_t: dict, kind: str, window: str, category: str | None = None,
             region: str | None = None, ts: datetime = T) -> list[tuple[str, float, int]]:
    rows = [r for r in at_t["top"] if r["kind"] == kind and r["window"] == window
            and r["category_id"] == category and r["region"] == region
            and r["event_timestamp"] == naive(ts)]
    return [(r["item_id"], r["score"], r["rank"]) for r in sorted(rows, key=lambda r: r["rank"])]


def test_top_items_per_scope_with_ties_and_top_n(at_t: dict) -> None:
    # 24h units: A 2, C 1, I 1 (tie broken by item_id), G outside; top_n = 2 cuts I
    assert top_list(at_t, "top", "24h") == [("A", 2.0, 1), ("C", 1.0, 2)]
    assert top_list(at_t, "top", "1h") == [("A", 2.0, 1), ("I", 1.0, 2)]
    assert top_list(at_t, "top", "24h", region="FR") == [("C", 1.0, 1), ("I", 1.0, 2)]
    assert top_list(at_t, "top", "24h", category="c2") == [("C", 1.0, 1), ("I", 1.0, 2)]
    assert top_list(at_t, "top", "24h", category="c1", region="UK") == [("A", 2.0, 1)]
    assert top_list(at_t, "top", "1h", region="UK") == [("A", 2.0, 1)]
    trend = top_list(at_t, "trend", "1h")
    assert [i for i, _, _ in trend] == ["A", "I"]
    assert trend[0][1] == pytest.approx(3 / (2 / 24 + 1))
    assert trend[1][1] == pytest.approx(2 / (1 / 24 + 1))
    assert not [r for r in at_t["top"] if r["window"] == "24h" and r["kind"] == "trend"]
    assert set(at_t["top"][0]) == set(TOP_ITEM_COLUMNS)


def test_finalize_with_literal_as_of_matches_batch(events: Any, at_t: dict) -> None:
    """The stream's path (tiles of events <= T, finalize at a literal T) gives the same rows."""
    from pyspark.sql import functions as F

    upto = events.where(F.col("event_time") <= F.lit(T))
    users = finalize_user_features(
        user_tiles(upto, slide_seconds=SLIDE, last_items_n=N_LAST), T,
        slide_seconds=SLIDE, last_items_n=N_LAST, created=T)
    items = finalize_item_features(item_tiles(upto, slide_seconds=SLIDE), T,
                                   slide_seconds=SLIDE, created=T)
    top = finalize_top_items(sales_tiles(upto, slide_seconds=SLIDE), T, slide_seconds=SLIDE,
                             top_n=2, created=T)
    stream_users = {r["user_id"]: r.asDict() for r in users.collect()}
    assert stream_users["u1"] == user(at_t, "u1")
    stream_items = {r["item_id"]: r.asDict() for r in items.collect()}
    for iid in ("A", "B", "C", "D", "F", "I"):
        assert stream_items[iid] == item(at_t, iid)
    batch_top = sorted((tuple(r.values()) for r in at_t["top"]
                        if r["event_timestamp"] == naive(T)), key=repr)
    assert sorted((tuple(r) for r in top.collect()), key=repr) == batch_top


def test_item_metadata_latest_values(events: Any) -> None:
    rows = {r["item_id"]: r for r in item_metadata(events).collect()}
    assert (rows["A"]["category_id"], rows["A"]["region"], rows["A"]["price"]) == ("c1", "UK", 10.0)
    # C: bought in FR 23h before T, viewed in UK later; the view carries no price
    assert (rows["C"]["region"], rows["C"]["price"]) == ("UK", 100.0)
    assert rows["D"]["price"] is None


def test_tiles_run_as_streaming_aggregation(spark: Any, events: Any, tmp_path: Any) -> None:
    """The tile functions are legal in a watermarked streaming groupBy (append and update)."""
    source = str(tmp_path / "events")
    events.write.parquet(source)
    stream = spark.readStream.schema(events.schema).parquet(source).withWatermark(
        "event_time", "10 minutes")
    built = {
        "users": user_tiles(stream, slide_seconds=SLIDE, last_items_n=N_LAST),
        "items": item_tiles(stream, slide_seconds=SLIDE),
        "sales": sales_tiles(stream, slide_seconds=SLIDE),
    }
    for name, df in built.items():
        table = f"tiles_{name}_{tmp_path.name}".replace("-", "_")
        query = (df.writeStream.format("memory").queryName(table).outputMode("update")
                 .option("checkpointLocation", str(tmp_path / f"ck-{name}")).start())
        try:
            query.processAllAvailable()
        finally:
            query.stop()
        streamed = spark.table(table)
        batch = {"users": user_tiles(events, slide_seconds=SLIDE, last_items_n=N_LAST),
                 "items": item_tiles(events, slide_seconds=SLIDE),
                 "sales": sales_tiles(events, slide_seconds=SLIDE)}[name]
        assert streamed.count() == batch.count() > 0
