"""The online writer against real Redis and Feast: Feast's exact layout, atomic top lists."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from features import online_keys
from features.feast_layout import ITEM_STATS, USER_ACTIVITY
from pipelines.settings import Settings

pytestmark = pytest.mark.integration

T = datetime(2024, 3, 10, 12, 0, tzinfo=UTC)


def user_row(user_id: str, ts: datetime = T, **overrides: Any) -> dict[str, Any]:
    row = {
        "user_id": user_id, "views_1h": 3, "views_24h": 9, "carts_1h": 1, "carts_24h": 2,
        "purchases_1h": 0, "purchases_24h": 1, "spend_1h": 0.0, "spend_24h": 12.5,
        "distinct_items_viewed_1h": 2, "last_event_time": ts - timedelta(seconds=7),
        "top_category": "c1", "category_affinity_ids": ["c1", "c2"],
        "category_affinity_weights": [6.0, 1.0], "last_viewed_items": ["i9", "i3"],
        "last_purchased_items": ["i3"], "event_timestamp": ts, "created": ts,
    }
    row.update(overrides)
    return row


def item_row(item_id: str, ts: datetime = T, **overrides: Any) -> dict[str, Any]:
    row = {
        "item_id": item_id, "category_id": "c1", "views_1h": 10, "views_24h": 40,
        "carts_1h": 2, "carts_24h": 5, "purchases_1h": 1, "purchases_24h": 4,
        "units_1h": 2, "units_24h": 7, "revenue_1h": 19.98, "revenue_24h": 69.93,
        "conversion_rate_1h": 0.1, "conversion_rate_24h": 0.1, "trending_score": 2.5,
        "event_timestamp": ts, "created": ts,
    }
    row.update(overrides)
    return row


# a user with every kind of null / empty value Feast can hold
EMPTY_USER = user_row("u-empty", top_category=None, last_event_time=None,
                      category_affinity_ids=[], category_affinity_weights=[],
                      last_viewed_items=[], last_purchased_items=[])
USERS = [user_row("u1"), user_row("ü:2*", views_1h=0, spend_24h=0.25), EMPTY_USER]
ITEMS = [item_row("A"), item_row("B", category_id=None, conversion_rate_1h=0.0)]


@pytest.fixture()
def store_settings(make_settings: Callable[..., Settings], tmp_path: Path, redis_server: Any) -> Settings:
    return make_settings(data_dir=str(tmp_path / "data"))


@pytest.fixture()
def store(store_settings: Settings) -> Any:
    from pipelines.feast_store import feature_store

    return feature_store(store_settings)


def snapshot(client: Any) -> dict[bytes, dict[bytes, bytes]]:
    return {k: client.hgetall(k) for k in client.keys("*")}


def online(store: Any, users: list[str], items: list[str]) -> dict[str, list[Any]]:
    rows = [{"user_id": u, "item_id": i} for u, i in zip(users, items, strict=True)]
    refs = [f"{spec.name}:{name}" for spec in (USER_ACTIVITY, ITEM_STATS)
            for name in spec.feature_names]  # every feature (ranking_v1 is a subset)
    return store.get_online_features(
        features=refs, entity_rows=rows,
        full_feature_names=True,
    ).to_dict()


def test_write_entity_rows_is_byte_identical_to_feast(store: Any, redis_client: Any,
                                                      store_settings: Settings) -> None:
    from pipelines.online_writer import write_entity_rows

    store.write_to_online_store("user_activity", pd.DataFrame(USERS))
    store.write_to_online_store("item_stats", pd.DataFrame(ITEMS))
    feast_written = snapshot(redis_client)
    feast_ttls = {k: redis_client.ttl(k) for k in feast_written}
    redis_client.flushdb()

    ttl = store_settings.online_ttl_seconds
    assert write_entity_rows(redis_client, USER_ACTIVITY, USERS, ttl_seconds=ttl) == 3
    assert write_entity_rows(redis_client, ITEM_STATS, ITEMS, ttl_seconds=ttl) == 2
    assert snapshot(redis_client) == feast_written
    assert all(0 < redis_client.ttl(k) <= ttl for k in feast_written)
    assert all(0 < t <= ttl for t in feast_ttls.values())


def test_get_online_features_returns_written_values(store: Any, redis_client: Any,
                                                    store_settings: Settings) -> None:
    from pipelines.online_writer import write_entity_rows

    write_entity_rows(redis_client, USER_ACTIVITY, USERS, ttl_seconds=60)
    write_entity_rows(redis_client, ITEM_STATS, ITEMS, ttl_seconds=60)
    got = online(store, ["u1", "ü:2*", "u-empty", "nobody"], ["A", "B", "A", "zzz"])
    for i, expected in enumerate([*USERS, None]):
        for name, _ in USER_ACTIVITY.features:
            value = got[f"user_activity__{name}"][i]
            if expected is None:
                assert value is None
            elif name == "last_event_time" and expected[name] is not None:
                assert value == expected[name].replace(microsecond=0)
            elif expected[name] == [] or expected[name] is None:
                assert value in ([], None)  # Feast returns an empty list for an empty array
            else:
                assert value == expected[name], name
    for i, expected in enumerate([ITEMS[0], ITEMS[1], ITEMS[0], None]):
        for name, _ in ITEM_STATS.features:
            value = got[f"item_stats__{name}"][i]
            assert value == (None if expected is None else expected[name]), name


def test_write_entity_rows_never_overwrites_newer(store: Any, redis_client: Any) -> None:
    from pipelines.online_writer import write_entity_rows

    newer = user_row("u1", ts=T + timedelta(minutes=1), views_1h=5)
    write_entity_rows(redis_client, USER_ACTIVITY, [newer])
    assert write_entity_rows(redis_client, USER_ACTIVITY, [user_row("u1", views_1h=1)]) == 0
    assert online(store, ["u1"], ["A"])["user_activity__views_1h"] == [5]
    # several rows of one entity in a batch: the latest event timestamp wins
    rows = [user_row("u2", ts=T + timedelta(minutes=2), views_1h=7), user_row("u2", views_1h=2)]
    write_entity_rows(redis_client, USER_ACTIVITY, rows)
    assert online(store, ["u2"], ["A"])["user_activity__views_1h"] == [7]


def test_write_entity_features_from_spark_partitions(spark: Any, store: Any, redis_client: Any,
                                                     store_settings: Settings) -> None:
    from pipelines.online_writer import write_entity_features

    rows = [user_row(f"u{i}", views_24h=i) for i in range(50)]
    df = spark.createDataFrame(pd.DataFrame(rows)).repartition(3)
    write_entity_features(df, store_settings, USER_ACTIVITY)
    got = online(store, [f"u{i}" for i in range(50)], ["A"] * 50)
    assert got["user_activity__views_24h"] == list(range(50))


def top_row(item: str, score: float, rank: int, *, kind: str = "top", window: str = "24h",
            category: str | None = None, region: str | None = None, ts: datetime = T) -> dict:
    return {"kind": kind, "window": window, "category_id": category, "region": region,
            "item_id": item, "score": score, "rank": rank, "event_timestamp": ts, "created": ts}


def test_write_top_items_replaces_lists_trims_and_prunes(redis_client: Any) -> None:
    from pipelines.online_writer import write_top_items

    rows = [top_row(f"i{n}", float(100 - n), n + 1) for n in range(5)]
    rows += [top_row("x", 3.0, 1, region="United Kingdom"), top_row("y", 1.0, 1, category="c|1")]
    rows += [top_row("t", 2.5, 1, kind="trend", window="1h")]
    assert write_top_items(redis_client, rows, top_n=3) == 4
    global_key = online_keys.top_sellers_key("24h", online_keys.scope_global())
    assert redis_client.zrevrange(global_key, 0, -1, withscores=True) == [
        (b"i0", 100.0), (b"i1", 99.0), (b"i2", 98.0)]  # trimmed to top 3
    uk_key = online_keys.top_sellers_key("24h", online_keys.scope_for(region="United Kingdom"))
    assert redis_client.zrange(uk_key, 0, -1) == [b"x"]
    trend_key = online_keys.trending_key("1h", online_keys.scope_global())
    assert redis_client.zscore(trend_key, "t") == 2.5
    assert 0 < redis_client.ttl(global_key) <= online_keys.TOP_TTL
    meta = redis_client.hgetall(online_keys.top_meta_key())
    field = online_keys.top_meta_field("top", "24h", online_keys.scope_global()).encode()
    assert int(meta[field]) == int(T.timestamp() * 1000)
    assert not redis_client.keys(online_keys.key("tmp", "*"))  # no temporary keys left

    # next as-of: the UK list lost its sales; prune removes it and its meta field
    later = T + timedelta(hours=1)
    rows2 = [top_row("i9", 5.0, 1, ts=later), top_row("y", 2.0, 1, category="c|1", ts=later)]
    write_top_items(redis_client, rows2, top_n=3, prune=True)
    assert redis_client.zrange(global_key, 0, -1) == [b"i9"]
    assert not redis_client.exists(uk_key)
    meta = redis_client.hgetall(online_keys.top_meta_key())
    uk_field = online_keys.top_meta_field("top", "24h", online_keys.scope_for(region="United Kingdom"))
    assert uk_field.encode() not in meta
    assert redis_client.exists(trend_key)  # other kinds / windows are not pruned

    # an older as-of never overwrites a newer list
    write_top_items(redis_client, [top_row("old", 9.0, 1, ts=T)], top_n=3, prune=True)
    assert redis_client.zrange(global_key, 0, -1) == [b"i9"]


def test_a_writer_that_remembers_its_lists_rewrites_only_changed_ones(redis_client: Any) -> None:
    """With ``written``, an unchanged list keeps its members (not rewritten: a marker put
    in it survives) and gets the new as-of; a changed one, one another writer stamped
    since, and one older than ``max_age_s`` are rewritten; a pruned one is forgotten."""
    from pipelines.online_writer import TopListsWritten, write_top_items

    def ms(ts: datetime) -> int:
        return int(ts.timestamp() * 1000)

    def as_of(scope: str) -> int:
        field = online_keys.top_meta_field("top", "24h", scope)
        return int(redis_client.hget(online_keys.top_meta_key(), field))

    glob, uk = online_keys.scope_global(), online_keys.scope_for(region="United Kingdom")
    global_key = online_keys.top_sellers_key("24h", glob)
    uk_key = online_keys.top_sellers_key("24h", uk)

    def rows(ts: datetime, uk_item: str = "x") -> list[dict]:
        return [top_row("i0", 9.0, 1, ts=ts), top_row("i1", 8.0, 2, ts=ts),
                top_row(uk_item, 3.0, 1, region="United Kingdom", ts=ts)]

    written = TopListsWritten()
    assert write_top_items(redis_client, rows(T), top_n=3, prune=True, written=written) == 2
    assert len(written) == 2
    redis_client.zadd(global_key, {"marker": 1.0})  # shows whether a list was rewritten
    redis_client.zadd(uk_key, {"marker": 1.0})

    t1 = T + timedelta(seconds=1)
    assert write_top_items(redis_client, rows(t1, uk_item="z"), top_n=3, prune=True,
                           written=written) == 2
    assert redis_client.zscore(global_key, "marker") == 1.0  # unchanged: left alone
    assert as_of(glob) == ms(t1)  # ...but stamped with the new as-of
    assert redis_client.zrange(uk_key, 0, -1) == [b"z"]  # changed: rewritten
    assert as_of(uk) == ms(t1)

    # another writer stamped the global list since: rewritten although unchanged
    write_top_items(redis_client, [top_row("i0", 9.0, 1, ts=t1 + timedelta(milliseconds=1)),
                                   top_row("i1", 8.0, 2, ts=t1 + timedelta(milliseconds=1))],
                    top_n=3)
    redis_client.zadd(global_key, {"marker": 1.0})
    t2 = T + timedelta(seconds=2)
    write_top_items(redis_client, rows(t2, uk_item="z"), top_n=3, prune=True, written=written)
    assert redis_client.zscore(global_key, "marker") is None
    assert as_of(glob) == ms(t2)

    # members written longer ago than max_age_s are rewritten (a list evicted under
    # maxmemory comes back)
    redis_client.delete(global_key)
    written.max_age_s = 0.0
    write_top_items(redis_client, rows(T + timedelta(seconds=3), uk_item="z"), top_n=3,
                    prune=True, written=written)
    assert redis_client.zrevrange(global_key, 0, -1) == [b"i0", b"i1"]

    # the UK scope sold nothing: pruned, and forgotten by the writer
    t4 = T + timedelta(seconds=4)
    write_top_items(redis_client, rows(t4)[:2], top_n=3, prune=True, written=written)
    assert not redis_client.exists(uk_key)
    assert len(written) == 1


def test_write_top_items_readers_never_see_a_partial_list(redis_client: Any,
                                                         store_settings: Settings) -> None:
    from pipelines.connections import redis_client as make_client
    from pipelines.online_writer import write_top_items

    key = online_keys.top_sellers_key("1h", online_keys.scope_global())
    lists = {p: [f"{p}{n:03d}" for n in range(200)] for p in "ab"}
    write_top_items(redis_client, [top_row(i, 1000.0 - n, n + 1, window="1h")
                                   for n, i in enumerate(lists["a"])], top_n=200)
    stop = threading.Event()
    seen: list[list[bytes]] = []

    def read() -> None:
        reader = make_client(store_settings, timeout_ms=2000)
        while not stop.is_set():
            seen.append(reader.zrevrange(key, 0, -1))
        reader.close()

    thread = threading.Thread(target=read)
    thread.start()
    try:
        for round_ in range(1, 40):
            prefix = "ab"[round_ % 2]
            rows = [top_row(i, 1000.0 - n, n + 1, window="1h", ts=T + timedelta(minutes=round_))
                    for n, i in enumerate(lists[prefix])]
            write_top_items(redis_client, rows, top_n=200)
    finally:
        stop.set()
        thread.join(timeout=10)
    assert len(seen) > 10
    whole = {tuple(i.encode() for i in v) for v in lists.values()}
    assert all(tuple(reply) in whole for reply in seen)


def test_write_item_metadata(redis_client: Any) -> None:
    from pipelines.online_writer import write_item_metadata

    rows = [{"item_id": "A:1", "category_id": "c1", "region": "UK", "price": 2.55,
             "event_time": T},
            {"item_id": "B", "category_id": "c2", "region": "FR", "price": None,
             "event_time": T}]
    assert write_item_metadata(redis_client, rows, ttl_seconds=3600) == 2
    a = redis_client.hgetall(online_keys.item_meta_key("A:1"))
    assert a == {b"category_id": b"c1", b"region": b"UK", b"price": b"2.55",
                 b"updated_ms": str(int(T.timestamp() * 1000)).encode()}
    assert b"price" not in redis_client.hgetall(online_keys.item_meta_key("B"))
    assert 0 < redis_client.ttl(online_keys.item_meta_key("B")) <= 3600


def test_push_source_writes_the_same_layout(store: Any, redis_client: Any) -> None:
    """Feast's own push path (what the stream could use instead) lands in the same hash."""
    from feast.data_source import PushMode

    from pipelines.online_writer import write_entity_rows

    store.push("user_activity_push", pd.DataFrame([user_row("u1")]), to=PushMode.ONLINE)
    pushed = snapshot(redis_client)
    redis_client.flushdb()
    write_entity_rows(redis_client, USER_ACTIVITY, [user_row("u1")])
    assert snapshot(redis_client) == pushed
