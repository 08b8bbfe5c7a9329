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


def test_totals_built_from_the_tiles_match_and_rank_like_top_items() -> None:
    rnd = random.Random(7)
    current = 1_700_000_400 - 1_700_000_400 % SLIDE
    tiles = [{"tile_start": current - rnd.randint(0, 200) * SLIDE, "item_id": k[0],
              "category_id": k[1], "region": k[2], "units": rnd.randint(1, 9)}
             for k in (rnd.choice(KEYS) for _ in range(300))]
    totals = pyf.SalesTotals.from_tiles(
        [t for t in tiles if t["tile_start"] in pyf.SalesTotals.window_tiles(current, SLIDE)],
        current, SLIDE)
    as_of = pyf.from_us((current + 30) * 1_000_000)
    assert pyf.rank_top_items(totals.units, as_of, top_n=3) == pyf.top_items(
        tiles, as_of, slide_seconds=SLIDE, top_n=3)
