"""The stream's Python twin of the window rules: edges a user would trip over (no servers).

Agreement with the Spark functions on random data is checked in
``tests/integration/test_stream_realtime.py`` / ``test_stream_state.py``.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest

from pipelines.streaming import pyfeatures as pyf

T = datetime(2024, 6, 1, 12, 0, 30, tzinfo=UTC)
TILE = pyf.tile_of(T, 60)  # 12:00:00


def _user_tile(start: int, *, views: int = 1, item: str = "i1", us: int | None = None,
               category: str = "c1", weight: float = 1.0) -> dict:
    us = us if us is not None else (start + 10) * 1_000_000
    return {"tile_start": start, "views": views, "carts": 0, "purchases": 0, "spend": 0.0,
            "items_viewed": [item], "category_weights": [{"category_id": category, "weight": weight}],
            "last_event_us": us, "last_viewed": [{"event_us": us, "item_id": item}]}


def test_tile_of_floors_datetimes_and_microseconds_alike() -> None:
    assert pyf.tile_of(T, 60) == pyf.tile_of(pyf.to_us(T), 60) == int(
        datetime(2024, 6, 1, 12, 0, tzinfo=UTC).timestamp())
    assert pyf.from_us(pyf.to_us(T)) == T


@pytest.mark.parametrize(("offset", "short", "long"), [
    (0, True, True),                 # the partial tile containing T
    (-3540, True, True),             # the 60th most recent tile
    (-3600, False, True),            # the 61st: out of 1h, in 24h
    (-86_340, False, True),
    (-86_400, False, False),         # out of every window
    (60, False, False),              # after T's tile: ignored
])
def test_windows_hold_the_w_over_s_most_recent_tiles(offset: int, short: bool, long: bool) -> None:
    assert pyf.in_window(TILE + offset, TILE, "1h") is short
    assert pyf.in_window(TILE + offset, TILE, "24h") is long


def test_user_features_sum_tiles_by_window_and_rank_recent_items() -> None:
    tiles = [
        _user_tile(TILE, views=2, item="a", category="shoes", weight=3.0),
        _user_tile(TILE - 3600, views=5, item="b", category="hats", weight=1.0),
        _user_tile(TILE - 86_400, views=7, item="c"),  # expired: contributes nothing
    ]
    row = pyf.finalize_user("u1", tiles, T, slide_seconds=60, last_items_n=10)
    assert (row["views_1h"], row["views_24h"]) == (2, 7)
    assert row["distinct_items_viewed_1h"] == 1
    assert row["top_category"] == "shoes"
    assert row["category_affinity_ids"] == ["shoes", "hats"]
    assert row["last_viewed_items"] == ["a", "b"]
    assert row["last_event_time"] == datetime(2024, 6, 1, 12, 0, 10, tzinfo=UTC)
    assert row["event_timestamp"] == T


def test_an_entity_with_only_expired_tiles_reads_zeros() -> None:
    row = pyf.finalize_user("u1", [_user_tile(TILE - 86_400)], T, slide_seconds=60, last_items_n=3)
    assert row["views_24h"] == 0 and row["last_event_time"] is None
    assert row["top_category"] is None and row["last_viewed_items"] == []


def test_merging_a_tile_twice_counts_it_twice_so_the_marker_must_guard_replays() -> None:
    a = _user_tile(TILE, views=1, item="x", us=pyf.to_us(T))
    b = _user_tile(TILE, views=2, item="y", us=pyf.to_us(T - timedelta(seconds=5)))
    merged = pyf.merge_user(a, b, last_items_n=5)
    assert merged["views"] == 3 and merged["items_viewed"] == ["x", "y"]
    assert [e["item_id"] for e in merged["last_viewed"]] == ["x", "y"]
    assert pyf.merge_user(merged, b, last_items_n=5)["views"] == 5


def test_item_category_follows_the_latest_event_ties_to_the_greatest_id() -> None:
    base = {"tile_start": TILE, "views": 1, "carts": 0, "purchases": 1, "units": 2, "revenue": 5.0}
    old = {**base, "category_id": "b", "category_us": 10}
    new = {**base, "category_id": "a", "category_us": 20}
    tie = {**base, "category_id": "c", "category_us": 20}
    assert pyf.merge_item(old, new)["category_id"] == "a"
    assert pyf.merge_item(new, tie)["category_id"] == "c"
    row = pyf.finalize_item("i1", [pyf.merge_item(old, new)], T, slide_seconds=60)
    assert row["units_1h"] == 4 and row["conversion_rate_1h"] == 1.0
    assert row["trending_score"] == pytest.approx((4 + 1) / (4 / 24 + 1))


def test_top_lists_rank_by_units_then_item_id_per_scope() -> None:
    def sale(item: str, units: int, cat: str = "c", reg: str = "UK", start: int = TILE) -> dict:
        return {"tile_start": start, "item_id": item, "category_id": cat, "region": reg,
                "purchases": 1, "units": units, "revenue": float(units)}

    rows = pyf.top_items([sale("b", 3), sale("a", 3), sale("z", 5, cat="d", reg="FR"),
                          sale("old", 9, start=TILE - 7200)], T, slide_seconds=60, top_n=2)
    global_1h = [(r["rank"], r["item_id"]) for r in rows
                 if (r["kind"], r["window"], r["category_id"], r["region"]) == ("top", "1h", None, None)]
    assert global_1h == [(1, "z"), (2, "a")]
    global_24h = [r["item_id"] for r in rows
                  if (r["kind"], r["window"], r["category_id"], r["region"]) == ("top", "24h", None, None)]
    assert global_24h == ["old", "z"]
    assert not any(r["item_id"] == "old" for r in rows if r["kind"] == "trend")


def test_last_purchased_items_are_the_latest_distinct_purchases_of_24h() -> None:
    def bought(start: int, item: str, us: int) -> dict:
        return dict(_user_tile(start, views=0, item="v"), purchases=1,
                    last_purchased=[{"event_us": us, "item_id": item}])

    t0 = pyf.to_us(T)
    a = bought(TILE, "p1", t0 - 5_000_000)
    b = bought(TILE, "p2", t0 - 1_000_000)
    merged = pyf.merge_user(a, b, last_items_n=5)
    assert [e["item_id"] for e in merged["last_purchased"]] == ["p2", "p1"]
    tiles = [merged, bought(TILE - 7200, "p1", t0 - 7_200_000_000),  # p1 again, older
             bought(TILE - 3600, "p3", t0 - 3_600_000_000),
             bought(TILE - 86_400, "gone", t0 - 86_400_000_000)]  # left the 24h window
    row = pyf.finalize_user("u1", tiles, T, slide_seconds=60, last_items_n=5)
    assert row["last_purchased_items"] == ["p2", "p1", "p3"]
    assert pyf.finalize_user("u1", tiles, T, slide_seconds=60, last_items_n=2)[
        "last_purchased_items"] == ["p2", "p1"]


def test_tiles_stored_before_last_purchased_existed_count_as_no_purchases() -> None:
    old = _user_tile(TILE)  # no "last_purchased" key, as tiles written by an earlier version
    assert "last_purchased" not in old
    row = pyf.finalize_user("u1", [old], T, slide_seconds=60, last_items_n=3)
    assert row["last_purchased_items"] == []
    merged = pyf.merge_user(old, dict(old, last_purchased=[{"event_us": 1, "item_id": "x"}]),
                            last_items_n=3)
    assert [e["item_id"] for e in merged["last_purchased"]] == ["x"]


def test_an_item_base_moved_tile_by_tile_finalizes_like_all_tiles() -> None:
    """A day and a half of minute tiles, the clock moving forward in uneven steps: the
    base (closed tiles, moved by adding and removing) plus the open tiles gives
    finalize_item's values at every step -- also once every tile has left a window,
    where the sums must be exactly zero and the category gone."""
    import random

    rnd = random.Random(7)
    slide, lateness = 60, 10
    start = TILE - 36 * 3600
    tiles = {}
    for k in range(36 * 60):
        if rnd.random() < 0.6 or k < 5:
            t = start + k * slide
            tiles[t] = {"tile_start": t, "category_id": f"c{rnd.randrange(3)}",
                        "category_us": t * 1_000_000 + rnd.randrange(59_000_000),
                        "views": rnd.randrange(9), "carts": rnd.randrange(3),
                        "purchases": rnd.randrange(2), "units": rnd.randrange(4),
                        "revenue": rnd.choice((0.1, 0.2, 19.99, 1e6 / 3))}
    windows = {w: s // slide for w, s in pyf.WINDOW_SECONDS.items()}
    base: pyf.ItemBase | None = None
    current = start + 20 * slide
    steps = 0
    while current <= start + 36 * 3600 + 30 * 3600:  # runs on a day past the last tile
        open_from = current - lateness * slide
        ranges = {w: (current - n * slide + slide, max(current - n * slide + slide, open_from))
                  for w, n in windows.items()}
        if base is None:
            base = pyf.ItemBase(ranges)
            for w, (a, b) in ranges.items():
                base.add_all(w, [tiles[t] for t in range(a, b, slide) if t in tiles])
        else:
            for w, (a2, b2) in ranges.items():
                a, b = base.ranges[w]
                for t in range(max(b, a2), b2, slide):
                    if t in tiles:
                        base.add(w, tiles[t])
                for t in range(a, min(a2, b), slide):
                    if t in tiles:
                        base.remove(w, tiles[t])
            base.ranges = ranges
        base = pyf.ItemBase.from_json(base.to_json())  # stored between batches
        as_of = pyf.from_us(current * 1_000_000 + 5)
        end_long = ranges[pyf.LONG_WINDOW][1]
        open_tiles = [tiles[t] for t in range(end_long, current + slide, slide) if t in tiles]
        got = base.finalize("i", open_tiles, as_of, slide_seconds=slide)
        want = pyf.finalize_item("i", tiles.values(), as_of, slide_seconds=slide)
        assert got.keys() == want.keys()
        for name, value in want.items():
            if isinstance(value, float):
                assert got[name] == pytest.approx(value, rel=1e-12, abs=1e-9), (current, name)
            else:
                assert got[name] == value, (current, name)
        current += slide * rnd.choice((1, 1, 2, 7, 61))
        steps += 1
    assert steps > 100
    assert got["views_24h"] == 0 and got["revenue_24h"] == 0.0 and got["category_id"] is None


def _random_user_tile(rnd: random.Random, t: int) -> dict[str, Any]:
    """A user tile as the stream stores it: lists ranked latest first and distinct."""
    def entries(k: int) -> list[dict[str, Any]]:
        raw = [{"event_us": t * 1_000_000 + rnd.randrange(59_000_000),
                "item_id": f"i{rnd.randrange(12)}"} for _ in range(k)]
        return [{"event_us": e["event_us"], "item_id": e["item_id"]}
                for e in pyf._latest_entries(raw, 4)]
    viewed = entries(rnd.randrange(4))
    weights = {f"c{rnd.randrange(5)}": rnd.choice((1.0, 3.0, 5.0, 0.1, 1e6 / 3))
               for _ in range(rnd.randrange(1, 3))}
    return {"tile_start": t, "views": len(viewed), "carts": rnd.randrange(3),
            "purchases": rnd.randrange(2), "spend": rnd.choice((0.0, 0.0, 19.99, 0.1, 1e6 / 3)),
            "items_viewed": sorted({e["item_id"] for e in viewed}),
            "category_weights": [{"category_id": c, "weight": w} for c, w in sorted(weights.items())],
            "last_event_us": max([e["event_us"] for e in viewed], default=t * 1_000_000 + 7),
            "last_viewed": viewed, "last_purchased": entries(rnd.choice((0, 0, 0, 1, 3)))}


def _move_base(base: Any, tiles: dict[int, Any], ranges: dict[str, tuple[int, int]],
               slide: int) -> None:
    """What the stream's pass does to a base: per window, add the tiles that closed (in
    start order), then remove those that left."""
    for w, (a2, b2) in ranges.items():
        a, b = base.ranges[w]
        if a2 >= b:
            base.reset(w)
            base.add_all(w, [tiles[t] for t in range(a2, b2, slide) if t in tiles])
            continue
        for t in range(b, b2, slide):
            if t in tiles:
                base.add(w, tiles[t])
        for t in range(a, a2, slide):
            if t in tiles:
                base.remove(w, tiles[t])
    base.ranges = ranges


def test_a_user_base_moved_tile_by_tile_finalizes_like_all_tiles() -> None:
    """A day and a half of a busy user's minute tiles, the clock moving forward in uneven
    steps (some past a whole window): the base (closed tiles, stored as JSON between
    batches, moved by adding and removing) plus the open tiles gives finalize_user's
    row at every step -- the sums, the items of the hour, the categories in order, the
    last event and both last-items lists -- and an empty row once every tile has left."""
    rnd = random.Random(11)
    slide, lateness, n = 60, 10, 3
    start = TILE - 36 * 3600
    tiles = {start + k * slide: _random_user_tile(rnd, start + k * slide)
             for k in range(36 * 60) if rnd.random() < 0.5 or k < 5}
    windows = {w: s // slide for w, s in pyf.WINDOW_SECONDS.items()}
    base: pyf.UserBase | None = None
    current = start + 20 * slide
    steps = 0
    while current <= start + 36 * 3600 + 26 * 3600:
        open_from = current - lateness * slide
        ranges = {w: (current - k * slide + slide, max(current - k * slide + slide, open_from))
                  for w, k in windows.items()}
        if base is None:
            base = pyf.UserBase(ranges, last_items_n=n)
            for w, (a, b) in ranges.items():
                base.add_all(w, [tiles[t] for t in range(a, b, slide) if t in tiles])
        else:
            _move_base(base, tiles, ranges, slide)
        base = pyf.UserBase.from_json(base.to_json())  # stored between batches
        as_of = pyf.from_us(current * 1_000_000 + 5)
        end_long = ranges[pyf.LONG_WINDOW][1]
        open_tiles = [tiles[t] for t in range(end_long, current + slide, slide) if t in tiles]
        got = base.finalize("u", open_tiles, as_of, slide_seconds=slide)
        want = pyf.finalize_user("u", tiles.values(), as_of, slide_seconds=slide, last_items_n=n)
        assert list(got) == list(want)
        for name, value in want.items():
            if isinstance(value, float):
                assert got[name] == pytest.approx(value, rel=1e-12, abs=1e-9), (current, name)
            elif name == "category_affinity_weights":
                assert got[name] == pytest.approx(value, rel=1e-12), (current, name)
            else:
                assert got[name] == value, (current, name)
        current += slide * rnd.choice((1, 1, 2, 7, 61))
        steps += 1
    assert steps > 100
    assert got["views_24h"] == 0 and got["spend_24h"] == 0.0 and got["last_event_time"] is None
    assert got["last_viewed_items"] == [] and got["category_affinity_ids"] == []


def test_a_user_base_refuses_a_tile_older_than_its_newest() -> None:
    """The last-items lists hold only if tiles come in start order: a base given an older
    tile says so instead of keeping wrong lists."""
    base = pyf.UserBase({w: (TILE - 7200, TILE) for w in pyf.WINDOW_SECONDS}, last_items_n=3)
    base.add(pyf.LONG_WINDOW, _user_tile(TILE - 60))
    with pytest.raises(ValueError, match="start order"):
        base.add(pyf.LONG_WINDOW, _user_tile(TILE - 120))


def test_user_lists_from_the_newest_tiles_equal_the_latest_of_all_entries() -> None:
    """finalize_user reads last-items lists newest tile first and stops early: the same
    lists as ranking every entry of the 24h window, whatever order the tiles come in."""
    import random

    rnd = random.Random(7)
    for _ in range(200):
        tiles = []
        for k in range(rnd.randrange(1, 8)):
            start = TILE - 60 * rnd.randrange(0, 1500) if k else TILE
            if any(t["tile_start"] == start for t in tiles):
                continue
            entries = _as_stored([{"event_us": (start + rnd.randrange(60)) * 1_000_000,
                                   "item_id": f"i{rnd.randrange(6)}"} for _ in range(rnd.randrange(4))])
            tile = _user_tile(start)
            tile["last_viewed"] = entries
            tile["last_purchased"] = entries[:1]
            tile["last_event_us"] = max([e["event_us"] for e in entries], default=start * 1_000_000)
            tiles.append(tile)
        n = rnd.randrange(1, 5)
        row = pyf.finalize_user("u", tiles, T, slide_seconds=60, last_items_n=n)
        live = [t for t in tiles if pyf.in_window(t["tile_start"], TILE, "24h")]
        assert row["last_viewed_items"] == pyf.latest_distinct(
            (e for t in live for e in t["last_viewed"]), n)
        assert row["last_purchased_items"] == pyf.latest_distinct(
            (e for t in live for e in t["last_purchased"]), n)
        last = max((t["last_event_us"] for t in live), default=None)
        assert row["last_event_time"] == (pyf.from_us(last - last % 1_000_000) if last else None)
        rnd.shuffle(tiles)
        assert pyf.finalize_user("u", tiles, T, slide_seconds=60, last_items_n=n) == row


def _as_stored(entries: list[dict]) -> list[dict]:
    """Last-items entries as a tile stores them (features.tiles.latest_distinct_items):
    latest first, ties by item, each item once."""
    out, seen = [], set()
    for e in sorted(entries, key=lambda e: (-e["event_us"], e["item_id"])):
        if e["item_id"] not in seen:
            seen.add(e["item_id"])
            out.append(e)
    return out


def test_merged_user_tiles_keep_their_lists_ranked_as_stored() -> None:
    """finalize_user reads a tile's last-items lists in stored order, so a merge must store
    them ranked, ties (same microsecond) included."""
    import random

    rnd = random.Random(3)
    for _ in range(300):
        def tile() -> dict:
            t = _user_tile(TILE)
            for name in ("last_viewed", "last_purchased"):
                t[name] = _as_stored([{"event_us": (TILE + rnd.randrange(3)) * 1_000_000,
                                       "item_id": f"i{rnd.randrange(8)}"}
                                      for _ in range(rnd.randrange(6))])[:4]
            return t

        a, b = tile(), tile()
        merged = pyf.merge_user(a, b, last_items_n=4)
        for name in ("last_viewed", "last_purchased"):
            assert merged[name] == _as_stored([*a[name], *b[name]])[:4]


def test_running_users_follow_the_feeds_writes_and_stay_bounded() -> None:
    cache = pyf.RunningUsers(60, max_tiles=5, max_idle_s=100.0)
    cache.put("u1", _user_tile(TILE), TILE, now=0.0)  # not loaded: a write alone proves nothing
    assert not cache.known("u1")
    cache.load("u1", [_user_tile(TILE - 60), _user_tile(TILE - 86_400)], TILE, now=0.0)
    cache.put("u1", _user_tile(TILE, views=4), TILE, now=1.0)
    cache.put("u1", _user_tile(TILE, views=6), TILE, now=2.0)  # a later full value replaces it
    assert sorted((t["tile_start"], t["views"]) for t in cache.tiles("u1")) == [
        (TILE - 86_400, 1), (TILE - 60, 1), (TILE, 6)]
    assert cache.tile_count == 3
    assert cache.finalize("u1", T, last_items_n=3)["views_24h"] == 7

    cache.trim(TILE, now=3.0)  # out of every window
    assert [t["tile_start"] for t in cache.tiles("u1")] == [TILE - 60, TILE] and cache.tile_count == 2

    cache.load("u2", [_user_tile(TILE - 60 * k) for k in range(3)], TILE, now=4.0)
    cache.load("u3", [_user_tile(TILE)], TILE, now=5.0)
    cache.trim(TILE, now=6.0)  # 6 tiles > 5: the least recently touched user goes
    assert not cache.known("u1") and cache.known("u2") and cache.known("u3")
    assert cache.tile_count == 4

    cache.trim(TILE, now=104.5)  # u2 idle 100.5 s: Redis may have expired its key
    assert not cache.known("u2") and cache.known("u3") and len(cache) == 1

    cache.load("u4", [_user_tile(TILE - 60 * k) for k in range(5)], TILE, now=105.0)
    assert cache.known("u3") and cache.tile_count == 6  # over until the flush is finalized
    assert cache.finalize("u4", T, last_items_n=3)["views_1h"] == 5
    cache.bound()
    assert not cache.known("u3") and cache.known("u4") and cache.tile_count == 5


def test_running_users_finalize_like_all_tiles_as_writes_and_the_clock_go_on() -> None:
    """Two users over a day and a half of minute tiles: tiles written (and rewritten with
    more events), the clock moving in uneven steps, trims, a reload from what is stored
    (one with tiles after the clock): at every step the running sums give finalize_user's
    values over every stored tile -- also once the windows are empty again."""
    import random

    rnd = random.Random(11)
    slide = 60
    start = TILE - 36 * 3600
    stored: dict[str, dict[int, dict]] = {"a": {}, "b": {}}
    users = pyf.RunningUsers(slide, max_tiles=10_000, max_idle_s=1e9)

    def tile(t: int) -> dict:
        items = sorted({f"i{rnd.randrange(12)}" for _ in range(rnd.randrange(1, 4))})
        entries = [{"event_us": t * 1_000_000 + rnd.randrange(60_000_000), "item_id": i}
                   for i in items]
        return {"tile_start": t, "views": rnd.randrange(5), "carts": rnd.randrange(2),
                "purchases": rnd.randrange(2), "spend": rnd.choice((0.0, 0.0, 19.99, 0.1, 3.0)),
                "items_viewed": items,
                "category_weights": [{"category_id": f"c{rnd.randrange(4)}",
                                      "weight": rnd.choice((1.0, 3.0, 5.0, 0.5))}],
                "last_event_us": max(e["event_us"] for e in entries), "last_viewed": entries,
                "last_purchased": entries[:1] if rnd.random() < 0.3 else []}

    current = start
    steps = 0
    while current <= start + 36 * 3600 + 25 * 3600:
        for user in stored:
            if current <= start + 36 * 3600 and rnd.random() < 0.5:
                # this tile, or (late events) one of the last few
                t = current - slide * rnd.choice((0, 0, 0, 1, 3))
                value = tile(t)
                stored[user][t] = value
                users.put(user, value, current, now=float(steps))
            if not users.known(user):
                users.load(user, stored[user].values(), current, now=float(steps))
        if steps % 50 == 7:  # a reload, as after an eviction: tiles later than its clock too
            ahead = current + 5 * slide
            stored["b"][ahead] = tile(ahead)
            users.load("b", stored["b"].values(), current, now=float(steps))
        as_of = pyf.from_us(current * 1_000_000 + 5)
        for user, tiles in stored.items():
            got = users.finalize(user, as_of, last_items_n=3)
            want = pyf.finalize_user(user, tiles.values(), as_of, slide_seconds=slide,
                                     last_items_n=3)
            assert got.keys() == want.keys()
            for name, value in want.items():
                if isinstance(value, float):
                    assert got[name] == pytest.approx(value, rel=1e-12, abs=1e-9), (steps, name)
                elif name == "category_affinity_weights":
                    assert got[name] == pytest.approx(value, rel=1e-12), (steps, name)
                else:
                    assert got[name] == value, (steps, user, name)
        current += slide * rnd.choice((1, 1, 1, 2, 7, 61))
        users.trim(current, now=float(steps))
        assert users.tile_count == sum(len(users.tiles(u)) for u in stored if users.known(u))
        steps += 1
    assert steps > 200
    assert not users.known("a")  # nothing of it left in any window: forgotten
    users.load("a", stored["a"].values(), current, now=float(steps))
    row = users.finalize("a", pyf.from_us(current * 1_000_000), last_items_n=3)
    assert row["views_24h"] == 0 and row["spend_24h"] == 0.0 and row["top_category"] is None
    assert row["distinct_items_viewed_1h"] == 0 and row["last_viewed_items"] == []


@pytest.mark.parametrize("seed", range(4))
def test_replacing_a_tile_changes_the_sums_as_removing_it_and_adding_the_new_one(seed: int) -> None:
    """The feed replaces the clock's tile of a user at every event of it: the running sums
    after a replacement are those of removing the old value and adding the new one, for a
    tile that grows (an event more), one that changes everywhere, equal lists, and lists
    holding an entry twice (no producer makes them; they still count)."""
    import random

    rnd = random.Random(seed)

    def entries(n: int) -> list[dict]:
        cats = rnd.sample(range(12), n)
        return [{"category_id": f"c{c}", "weight": rnd.choice((1.0, 3.0, 5.0, 0.5, 0.1))}
                for c in sorted(cats)]

    def tile(cats: list[dict], items: list[str]) -> dict:
        return {"views": rnd.randrange(9), "carts": rnd.randrange(3),
                "purchases": rnd.randrange(3), "spend": rnd.choice((0.0, 19.99, 0.1, 3.0)),
                "items_viewed": items, "category_weights": cats}

    def grown(t: dict) -> dict:
        cats = [dict(e) for e in t["category_weights"]]
        if cats and rnd.random() < 0.7:
            rnd.choice(cats)["weight"] += rnd.choice((1.0, 3.0, 5.0))
        else:
            cats.append({"category_id": f"c{rnd.randrange(12, 15)}", "weight": 1.0})
        items = sorted({*t["items_viewed"], f"i{rnd.randrange(30)}"})
        return {**t, "views": t["views"] + 1, "spend": t["spend"] + rnd.choice((0.0, 0.1)),
                "category_weights": cats, "items_viewed": items}

    def state(user: pyf._User) -> tuple:
        return (user.counts, user.spend, {c: list(h) for c, h in user.weights.items()},
                dict(user.items))

    base = [tile(entries(rnd.randrange(1, 6)), [f"i{rnd.randrange(30)}" for _ in range(3)])
            for _ in range(5)]
    for step in range(200):
        old = rnd.choice(base)
        kind = rnd.randrange(4)
        if kind == 0:
            new = grown(old)
        elif kind == 1:
            new = tile(entries(rnd.randrange(0, 6)), [f"i{rnd.randrange(30)}" for _ in range(4)])
        elif kind == 2:
            new = {**old, "views": old["views"] + 1}  # same lists
        else:  # entries twice, in the old value or the new one
            doubled = [*old["category_weights"], *old["category_weights"][:1]]
            new = grown(old)
            old = {**old, "category_weights": doubled,
                   "items_viewed": [*old["items_viewed"], *old["items_viewed"][:1]]}
            if rnd.random() < 0.5:
                old, new = new, old
        for window in pyf.WINDOW_SECONDS:
            fast, slow = pyf._User(0, 0.0), pyf._User(0, 0.0)
            for other in base:  # what the windows hold besides
                fast.add(other, window, 1)
                slow.add(other, window, 1)
            fast.add(old, window, 1)
            slow.add(old, window, 1)
            fast.replace(old, new, window)
            slow.add(old, window, -1)
            slow.add(new, window, 1)
            assert state(fast) == state(slow), (seed, step, kind, window)
        base[rnd.randrange(len(base))] = new


def test_the_python_activity_weights_are_the_tiles_weights() -> None:
    from features.tiles import ACTIVITY_WEIGHTS
    from pipelines.streaming import pyfeatures

    assert dict(pyfeatures.ACTIVITY_WEIGHTS) == dict(ACTIVITY_WEIGHTS)


def _role_events(rnd: random.Random, n: int) -> list[dict[str, Any]]:
    """Events of few users, items and categories, many at the same microsecond (the ties
    of the last-item lists and the latest-value columns), prices now and then missing."""
    out = []
    for _ in range(n):
        event_type = rnd.choice(["view", "view", "add_to_cart", "purchase"])
        out.append({"event_type": event_type, "event_us": 1_780_000_000_000_000 + rnd.randrange(6),
                    "item_id": f"i{rnd.randrange(7)}", "category_id": f"c{rnd.randrange(4)}",
                    "region": rnd.choice(["FR", "UK", "DE"]),
                    "price": rnd.choice([None, 3.25, 9.5, 0.1]) if event_type != "purchase"
                    else rnd.choice([9.5, 0.1]),
                    "quantity": rnd.randint(1, 3)})
    return out


@pytest.mark.parametrize("seed", range(12))
def test_folding_one_role_row_equals_merging_it(seed: int) -> None:
    """The Real-time feed's fold (``fold_role``) gives ``merge_keyed``'s row, byte for byte
    once encoded (key order, list order, floats), whether the held row is in memory or read
    back from Redis as JSON, and for lists shorter than the items seen; neither row it
    is given changes."""
    rnd = random.Random(seed)
    n = rnd.choice([1, 2, 3, 10])
    for kind, key in (("user", "u1"), ("item", "i1"), ("sales", "i1|c1|FR")):
        held_fold = held_merge = None
        for event in _role_events(rnd, 60):
            one = pyf.role_row(kind, key, 1_780_000_000, event, last_items_n=n)
            if held_fold is None:
                held_fold = held_merge = one
                continue
            if rnd.random() < 0.3:  # read back from the store
                held_fold = orjson.loads(orjson.dumps(held_fold))
            before = orjson.dumps(held_fold), orjson.dumps(one)
            folded = pyf.fold_role(held_fold, one, last_items_n=n)
            # its rows share entries: the old row must stay as it was (the writer holds it)
            assert (orjson.dumps(held_fold), orjson.dumps(one)) == before
            held_fold = folded
            held_merge = pyf.merge_keyed(held_merge, one, last_items_n=n)
            assert orjson.dumps(held_fold) == orjson.dumps(held_merge), (kind, event)


def test_a_folded_user_row_holds_each_item_category_and_latest_entry_in_its_place() -> None:
    """What ``fold_role`` must give, written out: items sorted, categories summed by id, the
    last viewed items latest first (a later view of an item moves it up, an earlier one
    does not), cut to ``last_items_n``."""
    base = {"event_type": "view", "category_id": "c2", "region": "FR", "price": 2.0,
            "quantity": 1}
    events = [{**base, "event_us": 10, "item_id": "b"},
              {**base, "event_us": 30, "item_id": "a", "category_id": "c1"},
              {**base, "event_us": 20, "item_id": "c", "event_type": "add_to_cart"},
              {**base, "event_us": 5, "item_id": "a"},
              {**base, "event_us": 40, "item_id": "b", "category_id": "c3"},
              {**base, "event_us": 40, "item_id": "d"}]
    row = pyf.role_row("user", "u", 0, events[0], last_items_n=3)
    for event in events[1:]:
        row = pyf.fold_role(row, pyf.role_row("user", "u", 0, event, last_items_n=3),
                            last_items_n=3)
    assert row["views"] == 5 and row["carts"] == 1
    assert row["items_viewed"] == ["a", "b", "d"]
    view, cart = pyf.ACTIVITY_WEIGHTS["view"], pyf.ACTIVITY_WEIGHTS["add_to_cart"]
    assert row["category_weights"] == [{"category_id": "c1", "weight": view},
                                       {"category_id": "c2", "weight": 3 * view + cart},
                                       {"category_id": "c3", "weight": view}]
    assert row["last_viewed"] == [{"event_us": 40, "item_id": "b"},
                                  {"event_us": 40, "item_id": "d"},
                                  {"event_us": 30, "item_id": "a"}]
    assert row["max_us"] == 40 and row["last_purchased"] == []
