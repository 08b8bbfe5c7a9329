"""The Real-time feed's running top-list totals equal a full recount at every step (no servers).

:class:`pipelines.streaming.pyfeatures.SalesTotals` replaces summing every sales tile of
the 24h window per ranking; if a change or a window exit were lost or counted twice,
the top sellers would drift from what the backfill computes. Each test replays what the
feed does (read the leaving tiles before writing, move the clock, add each new full
tile's change) and compares with :func:`pipelines.streaming.pyfeatures.sales_units`
over every tile then stored.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from pipelines.streaming import pyfeatures as pyf

SLIDE = 600  # 10-minute tiles: 6 per hour, 144 per day
KEYS = [("i1", "c1", "north"), ("i2", "c1", "south"), ("i3", "c2", "north")]


def _recount(store: dict[tuple[int, tuple[str, str, str]], int], current: int) -> dict[Any, dict[str, int]]:
    tiles = [{"tile_start": start, "item_id": k[0], "category_id": k[1], "region": k[2],
              "units": units} for (start, k), units in store.items()]
    return {k: v for k, v in pyf.sales_units(tiles, current).items() if any(v.values())}


class _Feed:
    """The feed's order of operations over an in-memory tile store."""

    def __init__(self, current: int) -> None:
        self.store: dict[tuple[int, tuple[str, str, str]], int] = {}
        self.totals = pyf.SalesTotals(current, SLIDE)

    def tiles(self, starts: list[int]) -> dict[int, list[dict[str, Any]]]:
        out: dict[int, list[dict[str, Any]]] = {}
        for (start, k), units in self.store.items():
            if start in starts:
                out.setdefault(start, []).append({"item_id": k[0], "category_id": k[1],
                                                  "region": k[2], "units": units})
        return out

    def flush(self, current: int, updates: list[tuple[int, tuple[str, str, str], int]]) -> None:
        current = max(current, self.totals.current)  # the clock only moves forward
        self.totals.advance(current, self.tiles(self.totals.leaving(current)))
        for start, key, units in updates:
            old = self.store.get((start, key), 0)
            self.store[(start, key)] = units
            self.totals.change(start, key, units - old)


def test_a_tile_counts_in_both_windows_then_leaves_the_hour_then_the_day() -> None:
    t0 = 1_700_000_400 - 1_700_000_400 % SLIDE
    feed = _Feed(t0)
    feed.flush(t0, [(t0, KEYS[0], 2)])
    assert feed.totals.units == {KEYS[0]: {"1h": 2, "24h": 2}}
    feed.flush(t0, [(t0, KEYS[0], 5)])  # the same tile again, full value: +3, not +5
    assert feed.totals.units == {KEYS[0]: {"1h": 5, "24h": 5}}
    feed.flush(t0 + 3600, [])  # the hour has moved past it
    assert feed.totals.units == {KEYS[0]: {"1h": 0, "24h": 5}}
    feed.flush(t0 + 86_400, [])  # the day too: the key is gone
    assert feed.totals.units == {}


def test_a_late_change_to_a_tile_outside_the_hour_counts_only_in_the_day() -> None:
    t0 = 1_700_000_400 - 1_700_000_400 % SLIDE
    feed = _Feed(t0)
    feed.flush(t0, [(t0, KEYS[1], 1)])
    feed.flush(t0 + 2 * 3600, [(t0, KEYS[1], 4)])
    assert feed.totals.units == {KEYS[1]: {"1h": 0, "24h": 4}}
    assert feed.totals.units == _recount(feed.store, feed.totals.current)


@pytest.mark.parametrize("seed", range(6))
def test_random_changes_and_clock_moves_match_a_full_recount(seed: int) -> None:
    rnd = random.Random(seed)
    current = 1_700_000_400 - 1_700_000_400 % SLIDE
    feed = _Feed(current)
    for _ in range(400):
        # mostly small steps, sometimes past the hour or the whole day, sometimes none
        step = rnd.choice([0, 0, 1, 1, 2, 5, 7, 150])
        current += step * SLIDE
        updates = []
        for _ in range(rnd.randint(0, 4)):
            back = rnd.choice([0, 0, 1, 3, 8, 40, 200])  # some far behind every window
            updates.append((current - back * SLIDE, rnd.choice(KEYS), rnd.randint(0, 6)))
        feed.flush(current, updates)
        assert feed.totals.units == _recount(feed.store, feed.totals.current)


def _built_from_tiles(seed: int, keys: list[tuple[str, str, str]], n: int
                      ) -> tuple[list[dict[str, Any]], pyf.SalesTotals, Any]:
    """``n`` random sales tiles of ``keys`` over 200 slides, the totals built from those in
    the windows (as the feed's first flush builds them), and an as-of in the current tile."""
    rnd = random.Random(seed)
    current = 1_700_000_400 - 1_700_000_400 % SLIDE
    tiles = [{"tile_start": current - rnd.randint(0, 200) * SLIDE, "item_id": k[0],
              "category_id": k[1], "region": k[2], "units": rnd.randint(1, 9)}
             for k in (rnd.choice(keys) for _ in range(n))]
    totals = pyf.SalesTotals.from_tiles(
        [t for t in tiles if t["tile_start"] in pyf.SalesTotals.window_tiles(current, SLIDE)],
        current, SLIDE)
    return tiles, totals, pyf.from_us((current + 30) * 1_000_000)


def test_totals_built_from_the_tiles_match_and_rank_like_top_items() -> None:
    tiles, totals, as_of = _built_from_tiles(7, KEYS, 300)
    assert pyf.rank_top_items(totals.units, as_of, top_n=3) == pyf.top_items(
        tiles, as_of, slide_seconds=SLIDE, top_n=3)


# ------------------------------------------------------------ items
def _grow(rnd: random.Random, old: dict[str, Any] | None, start: int) -> dict[str, Any]:
    """A tile's next full value: more events than ``old``, the latest category at a later
    time within the tile."""
    base = old or {"tile_start": start, "category_id": "c0", "category_us": start * 1_000_000,
                   "views": 0, "carts": 0, "purchases": 0, "units": 0, "revenue": 0.0}
    bought = rnd.randint(0, 2)
    event_us = start * 1_000_000 + rnd.randint(0, SLIDE * 1_000_000 - 1)
    latest = max((base["category_us"], base["category_id"]), (event_us, rnd.choice(["c0", "c1", "c2"])))
    return {**base, "views": base["views"] + rnd.randint(0, 3), "carts": base["carts"] + rnd.randint(0, 1),
            "purchases": base["purchases"] + bought, "units": base["units"] + bought * rnd.randint(1, 3),
            "revenue": base["revenue"] + bought * rnd.choice([0.1, 9.99, 1234.5, 1e-3]),
            "category_us": latest[0], "category_id": latest[1]}


def _same_item_row(mine: dict[str, Any], want: dict[str, Any]) -> None:
    assert mine.keys() == want.keys()
    for name, value in want.items():
        if isinstance(value, float):
            assert mine[name] == pytest.approx(value, rel=1e-9, abs=1e-12), name
        else:
            assert mine[name] == value, name


@pytest.mark.parametrize("seed", range(6))
def test_running_items_match_finalize_item_over_the_stored_tiles(seed: int) -> None:
    """The feed's order: known items move their clock (leaving tiles as stored before this
    flush), then each new full tile replaces the old; unknown ones are rebuilt from what is
    stored after the flush. Every touched item finalizes as :func:`finalize_item` does."""
    rnd = random.Random(seed)
    items = ["a", "b", "c"]
    store: dict[str, dict[int, dict[str, Any]]] = {i: {} for i in items}
    running = pyf.RunningItems(SLIDE)
    current = 1_700_000_400 - 1_700_000_400 % SLIDE
    for step in range(300):
        current += rnd.choice([0, 0, 1, 1, 2, 6, 150]) * SLIDE
        if step % 97 == 96:
            running.clear()  # as after a Redis outage: rebuilt on the next touch
        running.forget_before(current)
        writes: dict[str, dict[int, dict[str, Any]]] = {}
        for _ in range(rnd.randint(1, 4)):
            item = rnd.choice(items)
            start = current - rnd.choice([0, 0, 1, 4, 7, 200]) * SLIDE
            old = writes.get(item, {}).get(start) or store[item].get(start)
            writes.setdefault(item, {})[start] = _grow(rnd, old, start)
        as_of = pyf.from_us(current * 1_000_000 + 17)
        for item, tiles in writes.items():
            before = dict(store[item])
            store[item].update(tiles)
            if running.known(item):
                running.advance(item, current, {s: before[s] for s in running.leaving(item, current)
                                                if s in before})
                for start, tile in tiles.items():
                    running.replace(item, before.get(start), tile)
            else:
                running.rebuild(item, list(store[item].values()), current)
            _same_item_row(running.finalize(item, as_of),
                           pyf.finalize_item(item, list(store[item].values()), as_of,
                                             slide_seconds=SLIDE))


# ------------------------------------------------------------ top lists
def _as_lists(rows: list[dict[str, Any]]) -> dict[Any, list[tuple[str, float]]]:
    """Rows of :func:`rank_top_items` as lists: name -> (item, score) in rank order."""
    lists: dict[Any, list[tuple[int, str, float]]] = {}
    for r in rows:
        lists.setdefault((r["kind"], r["window"], r["category_id"], r["region"]), []).append(
            (r["rank"], r["item_id"], r["score"]))
    return {name: [(item, score) for _, item, score in sorted(entries)]
            for name, entries in lists.items()}


def _listed(lists: dict[Any, dict[str, float]]) -> dict[Any, list[tuple[str, float]]]:
    return {name: list(members.items()) for name, members in lists.items()}


@pytest.mark.parametrize("seed", range(6))
def test_top_lists_ranked_from_changes_equal_a_full_ranking_at_every_step(seed: int) -> None:
    """The feed ranks from :meth:`SalesTotals.top_lists`, which re-ranks only the lists whose
    units changed; a change not marking its lists (a scope, a window, the trend list that
    reads both windows) would leave a stale list that a full ranking would not give. Many
    items over few scopes and a cut of 3 so that entries move in and out of the lists, with
    ties (same units) ordered by item."""
    rnd = random.Random(seed)
    keys = [(f"i{n}", f"c{n % 3}", ("north", "south")[n % 2]) for n in range(12)]
    current = 1_700_000_400 - 1_700_000_400 % SLIDE
    feed = _Feed(current)
    ranked = 0
    for step in range(300):
        current += rnd.choice([0, 0, 1, 1, 2, 5, 7, 150]) * SLIDE
        updates = []
        for _ in range(rnd.randint(0, 5)):
            back = rnd.choice([0, 0, 1, 3, 8, 40, 200])
            updates.append((current - back * SLIDE, rnd.choice(keys), rnd.randint(0, 4)))
        feed.flush(current, updates)
        if step % 3 == 0:  # rankings far apart too: many changes between two of them
            continue
        as_of = pyf.from_us((feed.totals.current + 30) * 1_000_000)
        top_n = 5 if step > 250 else 3  # a new cut ranks every list again
        mine = _listed(feed.totals.top_lists(top_n=top_n))
        assert mine == _as_lists(pyf.rank_top_items(feed.totals.units, as_of, top_n=top_n))
        ranked += sum(map(len, mine.values()))
    assert ranked > 1000  # the lists were not empty all along


def test_top_lists_of_totals_built_from_tiles_rank_like_top_items() -> None:
    keys = [(f"i{n}", f"c{n % 4}", ("north", "south", "east")[n % 3]) for n in range(20)]
    tiles, totals, as_of = _built_from_tiles(11, keys, 400)
    want = pyf.top_items(tiles, as_of, slide_seconds=SLIDE, top_n=4)
    assert {r["kind"] for r in want} == {"top", "trend"}
    assert _listed(totals.top_lists(top_n=4)) == _as_lists(want)
