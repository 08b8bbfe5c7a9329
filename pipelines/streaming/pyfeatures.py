"""Plain-Python twins of :mod:`features.tiles` merging and :mod:`features.windows` finalizing.

The streaming job updates the online store key by key on the executors, where
DataFrame functions cannot run: the micro-batch path in a ``mapPartitions``
pass, the Real-time path in a ``foreach`` writer. These functions do what the
Spark ones do, rule for rule; ``tests/integration/test_stream_realtime.py`` and
``test_stream_state.py`` run both over the same data and require the same
values (doubles to 1e-9), and ``shopstream verify`` compares the stream's output
with the backfill's Spark computation.

Tiles are dicts with epoch-microsecond times (no time zones on the way):

* user: ``tile_start, views, carts, purchases, spend, items_viewed,
  category_weights [{category_id, weight}], last_event_us, last_viewed
  [{event_us, item_id}], last_purchased [{event_us, item_id}]`` (tiles stored
  before ``last_purchased`` existed lack it and count as having none)
* item: ``tile_start, category_id, category_us, views, carts, purchases, units, revenue``
* sales: ``tile_start, item_id, category_id, region, purchases, units, revenue``

Pure: no I/O, no Spark.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections import OrderedDict, defaultdict
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from fractions import Fraction
from typing import Any

import orjson

from features.windows import LONG_WINDOW, SHORT_WINDOW, WINDOW_SECONDS

__all__ = [
    "EPOCH",
    "to_us",
    "from_us",
    "tile_of",
    "in_window",
    "latest_distinct",
    "merge_user",
    "merge_item",
    "merge_sales",
    "MERGE",
    "TILE_OF_ROW",
    "role_row",
    "merge_keyed",
    "fold_role",
    "ItemMetadata",
    "finalize_user",
    "finalize_item",
    "ITEM_SUMS",
    "ItemBase",
    "UserBase",
    "trending_score",
    "sales_units",
    "rank_top_items",
    "top_items",
    "SalesKey",
    "SalesTotals",
    "TopLists",
    "RunningItems",
    "RunningUsers",
]

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def to_us(ts: datetime) -> int:
    return (ts - EPOCH) // timedelta(microseconds=1)


def from_us(us: int) -> datetime:
    return EPOCH + timedelta(microseconds=int(us))


def tile_of(ts: datetime | int, slide: int) -> int:
    """``tile_start`` in epoch seconds of a datetime or of epoch microseconds."""
    seconds = int(ts) // 1_000_000 if isinstance(ts, int) else (ts - EPOCH) // timedelta(seconds=1)
    return seconds - seconds % slide


def in_window(tile_start: int, current: int, window: str) -> bool:
    """:func:`features.windows.in_window`: one of the ``W/s`` most recent tiles as of ``current``."""
    return current - WINDOW_SECONDS[window] < tile_start <= current


def _latest_entries(entries: Iterable[Mapping[str, Any]], n: int) -> list[dict[str, Any]]:
    """:func:`features.tiles.latest_distinct_items`: most recent first, ties by item, distinct."""
    ordered = sorted(entries, key=lambda e: (-int(e["event_us"]), e["item_id"]))
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for e in ordered:
        if e["item_id"] not in seen:
            seen.add(e["item_id"])
            out.append({"event_us": int(e["event_us"]), "item_id": e["item_id"]})
            if len(out) == n:
                break
    return out


def latest_distinct(entries: Iterable[Mapping[str, Any]], n: int) -> list[str]:
    return [e["item_id"] for e in _latest_entries(entries, n)]


# ------------------------------------------------------------------ merge
def merge_user(a: Mapping[str, Any], b: Mapping[str, Any], *, last_items_n: int) -> dict[str, Any]:
    """The user tile of the union of two event sets (same user, same tile)."""
    weights: dict[str, float] = defaultdict(float)
    for entry in (*a["category_weights"], *b["category_weights"]):
        weights[entry["category_id"]] += float(entry["weight"])
    return {
        "tile_start": a["tile_start"],
        "views": int(a["views"]) + int(b["views"]),
        "carts": int(a["carts"]) + int(b["carts"]),
        "purchases": int(a["purchases"]) + int(b["purchases"]),
        "spend": float(a["spend"]) + float(b["spend"]),
        "items_viewed": sorted(set(a["items_viewed"]) | set(b["items_viewed"])),
        "category_weights": [{"category_id": c, "weight": w} for c, w in sorted(weights.items())],
        "last_event_us": max(int(a["last_event_us"]), int(b["last_event_us"])),
        "last_viewed": _latest_entries((*a["last_viewed"], *b["last_viewed"]), last_items_n),
        "last_purchased": _latest_entries(
            (*a.get("last_purchased", ()), *b.get("last_purchased", ())), last_items_n),
    }


def merge_item(a: Mapping[str, Any], b: Mapping[str, Any], **_: Any) -> dict[str, Any]:
    """The item tile of the union (the latest event's category wins; ties: greatest id)."""
    latest = max((a, b), key=lambda t: (int(t["category_us"]), t["category_id"]))
    return {
        "tile_start": a["tile_start"],
        "category_id": latest["category_id"],
        "category_us": int(latest["category_us"]),
        **{k: int(a[k]) + int(b[k]) for k in ("views", "carts", "purchases", "units")},
        "revenue": float(a["revenue"]) + float(b["revenue"]),
    }


def merge_sales(a: Mapping[str, Any], b: Mapping[str, Any], **_: Any) -> dict[str, Any]:
    return {
        **{k: a[k] for k in ("tile_start", "item_id", "category_id", "region")},
        "purchases": int(a["purchases"]) + int(b["purchases"]),
        "units": int(a["units"]) + int(b["units"]),
        "revenue": float(a["revenue"]) + float(b["revenue"]),
    }


MERGE = {"user": merge_user, "item": merge_item, "sales": merge_sales}
"""Merge rule per tile kind."""


# ------------------------------------------------- rows of features.tiles.keyed_tiles
def _user_tile(row: Mapping[str, Any]) -> dict[str, Any]:
    return {"tile_start": row["tile_start"], "views": row["views"], "carts": row["carts"],
            "purchases": row["purchases"], "spend": row["spend"],
            "items_viewed": row["items_viewed"], "category_weights": row["category_weights"],
            "last_event_us": row["max_us"], "last_viewed": row["last_viewed"],
            "last_purchased": row["last_purchased"]}


def _item_tile(row: Mapping[str, Any]) -> dict[str, Any]:
    return {"tile_start": row["tile_start"], "category_id": row["category_id"],
            "category_us": row["max_us"], "views": row["views"], "carts": row["carts"],
            "purchases": row["purchases"], "units": row["units"], "revenue": row["spend"]}


def _sales_tile(row: Mapping[str, Any]) -> dict[str, Any]:
    return {"tile_start": row["tile_start"], "item_id": row["item_id"],
            "category_id": row["category_id"], "region": row["region"],
            "purchases": row["purchases"], "units": row["units"], "revenue": row["spend"]}


TILE_OF_ROW = {"user": _user_tile, "item": _item_tile, "sales": _sales_tile}
"""A :func:`features.tiles.keyed_tiles` row (as a dict) -> the tile dict of its kind."""


# ------------------------------------------ keyed_tiles rows of single events, merged
ACTIVITY_WEIGHTS: Mapping[str, float] = {"view": 1.0, "add_to_cart": 3.0, "purchase": 5.0}
""":data:`features.tiles.ACTIVITY_WEIGHTS` (a test holds them equal)."""
_ROLE_SUMS = ("views", "carts", "purchases", "units")
_LATEST_BY = {"category_id": "max_us", "item_id": "max_us", "region": "max_us", "price": "price_us"}
"""The row's ``max_by`` columns and the time each is taken at (the latest event's, or the
latest priced event's); equal times go to the greater value, as ``max_by`` of the struct
(time, value) does."""


def role_row(kind: str, key: str, tile_start: int, event: Mapping[str, Any], *,
             last_items_n: int) -> dict[str, Any]:
    """The :func:`features.tiles.keyed_tiles` row of one event in one of its roles.

    Why: Real-time Mode's aggregation (Spark's streamline processor, its result
    projection after every event and its 100-key cache of variable-width buffers) was
    about three quarters of the Real-time query's CPU at 1,500 events/s
    (docs/streaming-performance.md). A query that sends each event's roles as they are,
    and a feed that folds them into tiles with :func:`merge_keyed`, reach the same rows
    (``tests/integration/test_stream_state.py``).

    ``event``: ``event_type``, ``event_us`` (epoch microseconds), ``item_id``,
    ``category_id``, ``region``, ``price``, ``quantity`` of a valid event; ``kind`` and
    ``key`` as the query's explode gives them (a sales key is Spark's ``url_encode``).
    """
    event_type, us, item = event["event_type"], int(event["event_us"]), event["item_id"]
    user, sales = kind == "user", kind == "sales"
    purchase = event_type == "purchase"
    price = event["price"]
    quantity = int(event["quantity"])
    priced = kind == "item" and price is not None
    entry = [{"event_us": us, "item_id": item}]
    return {
        "kind": kind, "key": key, "tile_start": int(tile_start),
        "views": int(event_type == "view"), "carts": int(event_type == "add_to_cart"),
        "purchases": int(purchase),
        "spend": float(price) * float(quantity) if purchase else 0.0,
        "units": quantity if purchase else 0,
        "items_viewed": [item] if user and event_type == "view" else [],
        "category_weights": ([{"category_id": event["category_id"],
                               "weight": ACTIVITY_WEIGHTS[event_type]}] if user else []),
        "last_viewed": entry if user and event_type == "view" and last_items_n > 0 else [],
        "last_purchased": entry if user and purchase and last_items_n > 0 else [],
        "category_id": None if user else event["category_id"],
        "item_id": item if sales else None,
        "region": None if user else event["region"],
        "price": float(price) if priced else None,
        "max_us": us,
        "price_us": us if priced else None,
    }


def merge_keyed(a: Mapping[str, Any], b: Mapping[str, Any], *, last_items_n: int
                ) -> dict[str, Any]:
    """The :func:`features.tiles.keyed_tiles` row of the union of two event sets (same
    kind, key and tile): what the aggregation gives, with the list orders of
    :func:`merge_user` (items sorted, categories by id, last items latest first)."""
    out: dict[str, Any] = {"kind": a["kind"], "key": a["key"], "tile_start": a["tile_start"]}
    for name in _ROLE_SUMS:
        out[name] = int(a[name]) + int(b[name])
    out["spend"] = float(a["spend"]) + float(b["spend"])
    if a["kind"] == "user":
        weights: dict[str, float] = defaultdict(float)
        for entry in (*a["category_weights"], *b["category_weights"]):
            weights[entry["category_id"]] += float(entry["weight"])
        out["items_viewed"] = sorted(set(a["items_viewed"]) | set(b["items_viewed"]))
        out["category_weights"] = [{"category_id": c, "weight": w}
                                   for c, w in sorted(weights.items())]
        out["last_viewed"] = _latest_entries((*a["last_viewed"], *b["last_viewed"]),
                                             last_items_n)
        out["last_purchased"] = _latest_entries((*a["last_purchased"], *b["last_purchased"]),
                                                last_items_n)
    else:
        for name in ("items_viewed", "category_weights", "last_viewed", "last_purchased"):
            out[name] = []
    for name, at in _LATEST_BY.items():
        out[name] = _latest_value(a, b, name, at)
    out["max_us"] = max(int(a["max_us"]), int(b["max_us"]))
    times = [int(t) for t in (a["price_us"], b["price_us"]) if t is not None]
    out["price_us"] = max(times) if times else None
    return out


def fold_role(held: Mapping[str, Any], one: Mapping[str, Any], *, last_items_n: int
              ) -> dict[str, Any]:
    """``merge_keyed(held, one)`` where ``one`` is a :func:`role_row` (a single event) and
    ``held`` a row ``role_row`` or ``merge_keyed`` gave (its lists in their order, without
    repeats): the same row, key for key and in the same order, without sorting anything.

    Why: the Real-time feed of the ``roles`` shape applies every role row this way, and
    ``merge_keyed`` sorted and rebuilt each of a user row's lists every time: about a third
    of the fold's CPU (docs/streaming-performance.md, "The fold without sorting"). One event adds
    at most one item, one category and one last-item entry, each put in its place.
    ``tests/unit/test_stream_pyfeatures.py`` compares the two on random event streams.
    """
    out: dict[str, Any] = {"kind": held["kind"], "key": held["key"],
                           "tile_start": held["tile_start"]}
    for name in _ROLE_SUMS:
        out[name] = int(held[name]) + int(one[name])
    out["spend"] = float(held["spend"]) + float(one["spend"])
    if held["kind"] == "user":
        out["items_viewed"] = _with_item(held["items_viewed"], one["items_viewed"])
        out["category_weights"] = _with_weight(held["category_weights"],
                                               one["category_weights"])
        out["last_viewed"] = _with_entry(held["last_viewed"], one["last_viewed"], last_items_n)
        out["last_purchased"] = _with_entry(held["last_purchased"], one["last_purchased"],
                                            last_items_n)
    else:
        for name in ("items_viewed", "category_weights", "last_viewed", "last_purchased"):
            out[name] = []
    for name, at in _LATEST_BY.items():
        out[name] = _later_value(held[at], held[name], one[at], one[name])
    out["max_us"] = max(int(held["max_us"]), int(one["max_us"]))
    times = [int(t) for t in (held["price_us"], one["price_us"]) if t is not None]
    out["price_us"] = max(times) if times else None
    return out


def _with_item(items: list[str], added: list[str]) -> list[str]:
    """``sorted(set(items) | set(added))`` for ``items`` sorted without repeats, ``added`` of
    one item at most."""
    if not added:
        return list(items)
    item = added[0]
    at = bisect.bisect_left(items, item)
    if at < len(items) and items[at] == item:
        return list(items)
    return [*items[:at], item, *items[at:]]


def _with_weight(weights: list[dict[str, Any]], added: list[dict[str, Any]]
                 ) -> list[dict[str, Any]]:
    """The categories' summed weights, by category, of ``weights`` (by category, without
    repeats) and ``added`` (one category at most), as :func:`merge_keyed` sums them. The
    entries not changed are shared with ``weights``: no one changes an entry in place."""
    out = list(weights)
    if not added:
        return out
    category = added[0]["category_id"]
    for at, entry in enumerate(out):
        if entry["category_id"] == category:
            out[at] = {"category_id": category,
                       "weight": float(entry["weight"]) + float(added[0]["weight"])}
            return out
        if entry["category_id"] > category:
            out.insert(at, added[0])
            return out
    out.append(added[0])
    return out


def _with_entry(entries: list[dict[str, Any]], added: list[dict[str, Any]], n: int
                ) -> list[dict[str, Any]]:
    """``_latest_entries(entries + added, n)`` for ``entries`` in that function's order
    (latest first, ties by item, one per item) and ``added`` of one entry at most; the
    entries are shared, as :func:`_with_weight`'s are."""
    if not added:
        return entries[:n]
    new = added[0]
    us, item = new["event_us"], new["item_id"]
    out = list(entries)
    for at, entry in enumerate(out):
        if entry["item_id"] == item:  # the item's later entry wins
            if entry["event_us"] >= us:
                return out[:n]
            del out[at]
            break
    rank = (-us, item)
    at = next((i for i, e in enumerate(out) if (-e["event_us"], e["item_id"]) > rank),
              len(out))
    out.insert(at, new)
    return out[:n]


def _later_value(a_t: Any, a_v: Any, b_t: Any, b_v: Any) -> Any:
    """:func:`_latest_value` of two rows' (time, value) pairs."""
    if a_t is None or a_v is None:
        return b_v if b_t is not None and b_v is not None else None
    if b_t is None or b_v is None:
        return a_v
    return max((int(a_t), a_v), (int(b_t), b_v))[1]


def _latest_value(a: Mapping[str, Any], b: Mapping[str, Any], name: str, at: str) -> Any:
    """``max_by(name, struct(time, name))`` of two rows' values (a null time: no value)."""
    held = [(int(r[at]), r[name]) for r in (a, b) if r[at] is not None and r[name] is not None]
    return max(held)[1] if held else None


class ItemMetadata:
    """:func:`features.tiles.item_metadata` folded over item rows of ``keyed_tiles``.

    Category and region come from the row with the latest event, the price from
    the row with the latest priced event (tiles cover disjoint times, so there
    are no ties across rows).
    """

    def __init__(self) -> None:
        self._latest: dict[str, Mapping[str, Any]] = {}
        self._priced: dict[str, Mapping[str, Any]] = {}

    def add(self, row: Mapping[str, Any]) -> None:
        key = row["key"]
        old = self._latest.get(key)
        if old is None or int(row["max_us"]) > int(old["max_us"]):
            self._latest[key] = row
        if row["price_us"] is not None:
            old = self._priced.get(key)
            if old is None or int(row["price_us"]) > int(old["price_us"]):
                self._priced[key] = row

    def rows(self) -> list[dict[str, Any]]:
        """Rows of :data:`features.tiles.ITEM_METADATA_COLUMNS`."""
        out = []
        for key, row in self._latest.items():
            priced = self._priced.get(key)
            out.append({"item_id": key, "category_id": row["category_id"],
                        "region": row["region"],
                        "price": priced["price"] if priced is not None else None,
                        "event_time": from_us(int(row["max_us"]))})
        return out


# ---------------------------------------------------------------- finalize
def _window_sums(tiles: list[Mapping[str, Any]], current: int, ints: tuple[str, ...],
                 floats: tuple[str, ...]) -> dict[str, Any]:
    """``{name}_{window}`` sums of the tiles in each window (tiles in their given order).

    One pass over the tiles (each tile's windows found once); adding in tile order
    from 0 gives the same doubles as summing each window on its own.
    """
    sums: dict[str, Any] = {}
    for name in ints:
        for w in WINDOW_SECONDS:
            sums[f"{name}_{w}"] = 0
    for name in floats:
        for w in WINDOW_SECONDS:
            sums[f"{name}_{w}"] = 0.0
    for t in tiles:
        start = int(t["tile_start"])
        windows = [w for w in WINDOW_SECONDS if in_window(start, current, w)]
        if not windows:
            continue
        for name in ints:
            value = int(t[name])
            for w in windows:
                sums[f"{name}_{w}"] += value
        for name in floats:
            value = float(t[name])
            for w in windows:
                sums[f"{name}_{w}"] += value
    return sums


def finalize_user(user_id: str, tiles: Iterable[Mapping[str, Any]], as_of: datetime, *,
                  slide_seconds: int, last_items_n: int) -> dict[str, Any]:
    """:func:`features.windows.finalize_user_features` for one user.

    Tiles are taken in start order (sums too), and the last-items lists and the last
    event time come from the newest tiles only: a tile holds the events of its own
    ``slide_seconds``, so every entry of a later tile is later than any of an earlier one.
    """
    current = tile_of(as_of, slide_seconds)
    tiles = sorted((t for t in tiles if int(t["tile_start"]) <= current),
                   key=lambda t: int(t["tile_start"]))
    row: dict[str, Any] = {"user_id": user_id}
    sums = _window_sums(tiles, current, ("views", "carts", "purchases"), ("spend",))
    for name in ("views", "carts", "purchases", "spend"):
        for w in WINDOW_SECONDS:
            row[f"{name}_{w}"] = sums[f"{name}_{w}"]
    short = [t for t in tiles if in_window(int(t["tile_start"]), current, SHORT_WINDOW)]
    long = [t for t in tiles if in_window(int(t["tile_start"]), current, LONG_WINDOW)]
    row["distinct_items_viewed_1h"] = len({i for t in short for i in t["items_viewed"]})
    last = int(long[-1]["last_event_us"]) if long else None
    row["last_event_time"] = from_us(last - last % 1_000_000) if last is not None else None
    weights: dict[str, float] = defaultdict(float)
    for t in long:
        for entry in t["category_weights"]:
            weights[entry["category_id"]] += float(entry["weight"])
    affinity = sorted(weights.items(), key=lambda kv: (-kv[1], kv[0]))
    row["top_category"] = affinity[0][0] if affinity else None
    row["category_affinity_ids"] = [c for c, _ in affinity]
    row["category_affinity_weights"] = [w for _, w in affinity]
    row["last_viewed_items"] = _latest_from_newest(long, "last_viewed", last_items_n)
    row["last_purchased_items"] = _latest_from_newest(long, "last_purchased", last_items_n)
    row["event_timestamp"] = as_of
    return row


def _latest_from_newest(tiles: list[Mapping[str, Any]], field: str, n: int) -> list[str]:
    """:func:`latest_distinct` of the ``field`` entries of ``tiles`` (in start order), reading
    tiles newest first and stopping once ``n`` distinct items are found: time-disjoint
    tiles order their entries as wholes."""
    return _first_distinct((_ranked(t.get(field, ())) for t in reversed(tiles)), n)


_TREND_RATIO = WINDOW_SECONDS[SHORT_WINDOW] / WINDOW_SECONDS[LONG_WINDOW]


def trending_score(units_short: int, units_long: int) -> float:
    """:func:`features.windows.trending_score` (the ratio computed once: a top write scores
    every item sold in the hour)."""
    return (float(units_short) + 1.0) / (float(units_long) * _TREND_RATIO + 1.0)


def _latest_category(tiles: Iterable[Mapping[str, Any]]) -> tuple[int, str] | None:
    """``(category_us, category_id)`` of the tile with the latest event (ties: greatest id)."""
    return max(((int(t["category_us"]), t["category_id"]) for t in tiles), default=None)


def _later(a: tuple[int, str] | None, b: tuple[int, str] | None) -> tuple[int, str] | None:
    return b if a is None else a if b is None else max(a, b)


def _item_row(item_id: str, sums: Mapping[str, Any], latest: tuple[int, str] | None,
              as_of: datetime) -> dict[str, Any]:
    row: dict[str, Any] = {"item_id": item_id, "category_id": latest[1] if latest else None}
    for name in ITEM_SUMS:
        for w in WINDOW_SECONDS:
            row[f"{name}_{w}"] = sums[f"{name}_{w}"]
    for w in WINDOW_SECONDS:
        views, buys = row[f"views_{w}"], row[f"purchases_{w}"]
        row[f"conversion_rate_{w}"] = buys / views if views > 0 else 0.0
    row["trending_score"] = trending_score(row[f"units_{SHORT_WINDOW}"], row[f"units_{LONG_WINDOW}"])
    row["event_timestamp"] = as_of
    return row


ITEM_SUMS: tuple[str, ...] = ("views", "carts", "purchases", "units", "revenue")
"""The summed fields of an item tile (``revenue`` a double, the others integers)."""


def finalize_item(item_id: str, tiles: Iterable[Mapping[str, Any]], as_of: datetime, *,
                  slide_seconds: int) -> dict[str, Any]:
    """:func:`features.windows.finalize_item_features` for one item."""
    current = tile_of(as_of, slide_seconds)
    tiles = [t for t in tiles if int(t["tile_start"]) <= current]
    long = [t for t in tiles if in_window(int(t["tile_start"]), current, LONG_WINDOW)]
    sums = _window_sums(tiles, current, ITEM_SUMS[:-1], ("revenue",))
    return _item_row(item_id, sums, _latest_category(long), as_of)


class ItemBase:
    """An item's sums over each window's *closed* tiles (no later batch changes them).

    The stream moves it forward tile by tile (:meth:`add` the tiles that closed,
    :meth:`remove` those that left a window) instead of summing up to 1,440 tiles
    per item and batch. Integers are exact; revenue is kept as an exact fraction
    of the doubles added and removed (a rebuild starts from their exactly rounded
    ``fsum``), so subtracting leaves no drift, and an emptied window is exactly 0;
    its value is within the verifier's 1e-9 of any summation order. The latest category is only needed over the long window:
    tiles cover disjoint times, so the tile holding it is the last of the range
    to leave, and the range is then empty.
    """

    def __init__(self, ranges: Mapping[str, tuple[int, int]]) -> None:
        self.ranges = dict(ranges)
        self.sums = {w: dict.fromkeys(ITEM_SUMS[:-1], 0) for w in WINDOW_SECONDS}
        self.revenue = {w: Fraction(0) for w in WINDOW_SECONDS}
        self.count = dict.fromkeys(WINDOW_SECONDS, 0)
        self.latest: tuple[int, str] | None = None

    def add(self, window: str, tile: Mapping[str, Any], sign: int = 1) -> None:
        sums = self.sums[window]
        for name in ITEM_SUMS[:-1]:
            sums[name] += sign * int(tile[name])
        revenue = float(tile["revenue"])
        if revenue:  # most tiles hold views only: a Fraction costs more than the rest
            self.revenue[window] += Fraction(sign * revenue)
        self.count[window] += sign
        if self.count[window] == 0:
            self.revenue[window] = Fraction(0)
        if window == LONG_WINDOW:
            if sign > 0:
                self.latest = _later(self.latest, _latest_category([tile]))
            elif self.count[window] == 0:
                self.latest = None

    def add_all(self, window: str, tiles: list[Mapping[str, Any]]) -> None:
        """:meth:`add` of many tiles at once (a rebuild): revenue through ``math.fsum``,
        exactly rounded, one fraction per window instead of one per tile."""
        if not tiles:
            return
        sums = self.sums[window]
        for name in ITEM_SUMS[:-1]:
            sums[name] += sum(int(t[name]) for t in tiles)
        self.revenue[window] += Fraction(math.fsum(float(t["revenue"]) for t in tiles))
        self.count[window] += len(tiles)
        if window == LONG_WINDOW:
            self.latest = _later(self.latest, _latest_category(tiles))

    def remove(self, window: str, tile: Mapping[str, Any]) -> None:
        self.add(window, tile, -1)

    def reset(self, window: str) -> None:
        """Empty one window (its whole range is to be added again)."""
        self.sums[window] = dict.fromkeys(ITEM_SUMS[:-1], 0)
        self.revenue[window] = Fraction(0)
        self.count[window] = 0
        if window == LONG_WINDOW:
            self.latest = None

    def finalize(self, item_id: str, open_tiles: Iterable[Mapping[str, Any]], as_of: datetime, *,
                 slide_seconds: int) -> dict[str, Any]:
        """:func:`finalize_item` over the base's tiles plus ``open_tiles`` (those after it)."""
        current = tile_of(as_of, slide_seconds)
        sums: dict[str, Any] = {}
        revenue = dict(self.revenue)
        latest = self.latest
        for w in WINDOW_SECONDS:
            for name in ITEM_SUMS[:-1]:
                sums[f"{name}_{w}"] = self.sums[w][name]
        for t in open_tiles:
            start = int(t["tile_start"])
            for w in WINDOW_SECONDS:
                if in_window(start, current, w):
                    for name in ITEM_SUMS[:-1]:
                        sums[f"{name}_{w}"] += int(t[name])
                    revenue[w] += Fraction(float(t["revenue"]))
                    if w == LONG_WINDOW:
                        latest = _later(latest, _latest_category([t]))
        for w in WINDOW_SECONDS:
            sums[f"revenue_{w}"] = float(revenue[w])
        return _item_row(item_id, sums, latest, as_of)

    def to_json(self) -> bytes:
        return orjson.dumps({
            "r": {w: list(r) for w, r in self.ranges.items()},
            "s": self.sums, "n": self.count,
            "v": {w: [str(f.numerator), str(f.denominator)] for w, f in self.revenue.items()},
            "c": list(self.latest) if self.latest else None,
        })

    @classmethod
    def from_json(cls, raw: bytes | str) -> ItemBase:
        doc = orjson.loads(raw)
        base = cls({w: (int(r[0]), int(r[1])) for w, r in doc["r"].items()})
        base.sums = {w: {k: int(v) for k, v in s.items()} for w, s in doc["s"].items()}
        base.count = {w: int(n) for w, n in doc["n"].items()}
        base.revenue = {w: Fraction(int(p), int(q)) for w, (p, q) in doc["v"].items()}
        base.latest = (int(doc["c"][0]), doc["c"][1]) if doc["c"] else None
        return base


def sales_units(sales: Iterable[Mapping[str, Any]], current: int
                ) -> dict[tuple[str, str, str], dict[str, int]]:
    """Units per ``(item, category, region)`` and window of the sales tiles as of tile ``current``."""
    units: dict[tuple[str, str, str], dict[str, int]] = defaultdict(
        lambda: dict.fromkeys(WINDOW_SECONDS, 0))
    for t in sales:
        start = int(t["tile_start"])
        if start > current:
            continue
        windows = [w for w in WINDOW_SECONDS if in_window(start, current, w)]
        if windows:
            per_window = units[(t["item_id"], t["category_id"], t["region"])]
            for w in windows:
                per_window[w] += int(t["units"])
    return units


def rank_top_items(units: Mapping[tuple[str, str, str], Mapping[str, int]], as_of: datetime, *,
                   top_n: int) -> list[dict[str, Any]]:
    """Rows of ``TOP_ITEM_COLUMNS`` from units per ``(item, category, region)`` and window
    (:func:`sales_units`): every scope, ranked by score descending, then item ascending.

    Runs on every top write (each micro-batch; up to four times a second in Real-time
    Mode) over every item sold in the day, so it keeps one flat dict per window and picks
    each list's ``top_n`` with a heap rather than sorting it: 12,000 sales keys took
    about 190 ms with a dict per (scope, item) and full sorts.
    """
    per_window: dict[str, dict[tuple[str | None, str | None, str], int]] = {
        w: {} for w in WINDOW_SECONDS}
    for (item, cat, reg), by_window in units.items():
        for w, sums in per_window.items():
            n = int(by_window.get(w, 0))
            if n:  # a scope with nothing sold in the window is in no list of it
                for k in ((None, None, item), (cat, None, item), (None, reg, item),
                          (cat, reg, item)):
                    sums[k] = sums.get(k, 0) + n
    lists: dict[tuple[str, str, str | None, str | None], list[tuple[float, str]]] = defaultdict(list)
    for w, sums in per_window.items():
        for (scope_cat, scope_reg, item), n in sums.items():
            if n > 0:
                lists[("top", w, scope_cat, scope_reg)].append((-float(n), item))
    long_sums = per_window[LONG_WINDOW]
    for key, n in per_window[SHORT_WINDOW].items():
        if n > 0:
            lists[("trend", SHORT_WINDOW, key[0], key[1])].append(
                (-trending_score(n, long_sums.get(key, 0)), key[2]))
    rows = []
    for (kind, window, list_cat, list_reg), entries in lists.items():
        # (-score, item): score descending, then item ascending, as the Spark ranking
        for rank, (neg_score, top_item) in enumerate(heapq.nsmallest(top_n, entries), start=1):
            rows.append({"kind": kind, "window": window, "category_id": list_cat,
                         "region": list_reg, "item_id": top_item, "score": -neg_score,
                         "rank": rank, "event_timestamp": as_of})
    return rows


def top_items(sales: Iterable[Mapping[str, Any]], as_of: datetime, *, slide_seconds: int,
              top_n: int) -> list[dict[str, Any]]:
    """:func:`features.windows.finalize_top_items` (rows of ``TOP_ITEM_COLUMNS``)."""
    current = tile_of(as_of, slide_seconds)
    return rank_top_items(sales_units(sales, current), as_of, top_n=top_n)


SalesKey = tuple[str, str, str]
"""``(item_id, category_id, region)``: the key of a sales tile."""

ScopeKey = tuple[str, str | None, str | None]
"""``(window, category_id or None, region or None)``: whose units a top list ranks."""

TopName = tuple[str, str, str | None, str | None]
"""``(kind, window, category_id or None, region or None)``: one top list."""


class SalesTotals:
    """:func:`sales_units` as of the clock's tile, kept up to date by changes instead of
    summed from every tile each time.

    Why: the Real-time feed ranks the top lists up to four times a second. Summing every
    sales tile of the 24h window for each ranking (1,440 tiles at a one-minute slide,
    each holding every item sold in its minute) costs more with every hour the stream
    has run. Here a tile's new full value adds its change in units (new minus the value
    it replaces) to the windows that hold the tile as of the clock, and moving the clock
    into a later tile subtracts the tiles that left each window. Units are integers, so
    the totals stay exactly those of :func:`sales_units` over the current tiles.

    ``units``: ``(item, category, region)`` -> units per window; keys whose units are
    zero in every window are dropped.
    """

    def __init__(self, current: int, slide: int,
                 units: Mapping[SalesKey, Mapping[str, int]] | None = None) -> None:
        self.current = current
        self.slide = slide
        self.units: dict[SalesKey, dict[str, int]] = {
            k: dict(v) for k, v in (units or {}).items() if any(v.values())}
        self.lists = TopLists()
        for key, by_window in self.units.items():
            for w, n in by_window.items():
                self.lists.add(key, w, n)

    @classmethod
    def from_tiles(cls, tiles: Iterable[Mapping[str, Any]], current: int, slide: int
                   ) -> SalesTotals:
        """The totals over every sales tile of the windows as of tile ``current``."""
        return cls(current, slide, sales_units(tiles, current))

    @staticmethod
    def window_tiles(current: int, slide: int) -> range:
        """Every tile of the longest window as of ``current`` (what :meth:`from_tiles` needs)."""
        return range(_first_tile_after(current - WINDOW_SECONDS[LONG_WINDOW], slide),
                     current + 1, slide)

    def leaving(self, current: int) -> list[int]:
        """Tiles that leave some window when the clock moves into tile ``current``: what
        :meth:`advance` needs to read (their values before any later change)."""
        out: set[int] = set()
        for seconds in WINDOW_SECONDS.values():
            out.update(self._leaving(seconds, current))
        return sorted(out)

    def _leaving(self, seconds: int, current: int) -> range:
        return _leaving_tiles(self.current, current, seconds, self.slide)

    def advance(self, current: int, tiles: Mapping[int, Iterable[Mapping[str, Any]]]) -> None:
        """Move the clock to tile ``current``, subtracting the tiles that left each window
        (``tiles``: tile start -> its sales tiles, for every start :meth:`leaving` named;
        a start missing or empty had no sales). A ``current`` not later is ignored."""
        if current <= self.current:
            return
        for window, seconds in WINDOW_SECONDS.items():
            for start in self._leaving(seconds, current):
                for t in tiles.get(start, ()):
                    self._add((t["item_id"], t["category_id"], t["region"]), (window,),
                              -int(t["units"]))
        self.current = current

    def change(self, tile_start: int, key: SalesKey, delta: int) -> None:
        """A sales tile's units changed by ``delta``: add it to the windows that hold the tile."""
        if delta:
            self._add(key, [w for w in WINDOW_SECONDS if in_window(tile_start, self.current, w)],
                      delta)

    def _add(self, key: SalesKey, windows: Iterable[str], delta: int) -> None:
        per_window = self.units.get(key)
        if per_window is None:
            per_window = self.units[key] = dict.fromkeys(WINDOW_SECONDS, 0)
        for w in windows:
            per_window[w] += delta
            self.lists.add(key, w, delta)
        if not any(per_window.values()):
            del self.units[key]

    def top_lists(self, *, top_n: int) -> dict[TopName, dict[str, float]]:
        """:func:`rank_top_items` of :attr:`units` as lists (:meth:`TopLists.lists`),
        re-ranking only those whose units changed since the last call."""
        return self.lists.lists(top_n=top_n)


class TopLists:
    """The lists :func:`rank_top_items` gives, kept ranked and re-ranked only where units
    changed.

    Why: the Real-time feed ranks up to four times a second, and ranking every list from
    the totals took 107 ms for 12,000 sales keys (summing each scope a third of it,
    building every list's entries more than half), although between two rankings only
    the scopes of the items sold since change. Here each change adds its units to the
    four scopes of its key (global, category, region, both) in its window and marks them;
    :meth:`lists` re-ranks the marked scopes' lists (a ``trend`` list, once, when its
    scope's short or long units changed) and reuses the others'. Units are integers and
    each list is ranked by the same entries and the same heap selection, so the lists are
    exactly :func:`rank_top_items`'s.
    """

    def __init__(self) -> None:
        self._units: dict[ScopeKey, dict[str, int]] = {}
        self._dirty: set[ScopeKey] = set()
        self._ranked: dict[TopName, dict[str, float]] = {}  # -> its top items, best first
        self._top_n: int | None = None

    def add(self, key: SalesKey, window: str, delta: int) -> None:
        """Key ``(item, category, region)`` sold ``delta`` more units in ``window``."""
        if not delta:
            return
        item, cat, reg = key
        for scope in ((window, None, None), (window, cat, None), (window, None, reg),
                      (window, cat, reg)):
            units = self._units.get(scope)
            if units is None:
                units = self._units[scope] = {}
            n = units.get(item, 0) + delta
            if n:
                units[item] = n
            else:
                del units[item]
                if not units:
                    del self._units[scope]
            self._dirty.add(scope)

    def lists(self, *, top_n: int) -> dict[TopName, dict[str, float]]:
        """Every list :func:`rank_top_items` ranks, by ``(kind, window, category or None,
        region or None)``: its top ``top_n`` items and their scores, best first (the rows'
        ``rank`` order). A list that did not change is the same dict as in the last answer
        (never changed in place), so a writer can keep what it wrote without copying."""
        if top_n != self._top_n:  # every list again: the cut moved
            self._top_n = top_n
            self._ranked.clear()
            self._dirty.update(self._units)
        trends: set[tuple[str | None, str | None]] = set()  # a sale changes both windows
        for window, cat, reg in self._dirty:
            self._rank(("top", window, cat, reg), self._entries(window, cat, reg), top_n)
            if window in (SHORT_WINDOW, LONG_WINDOW):
                trends.add((cat, reg))
        for cat, reg in trends:
            self._rank(("trend", SHORT_WINDOW, cat, reg), self._trend_entries(cat, reg), top_n)
        self._dirty.clear()
        return dict(self._ranked)

    def _rank(self, name: TopName, entries: list[tuple[float, str]], top_n: int) -> None:
        if entries:  # (-score, item): score descending, then item ascending, as Spark's
            self._ranked[name] = {item: -neg for neg, item in heapq.nsmallest(top_n, entries)}
        else:  # nothing sold in the scope and window: in no list
            self._ranked.pop(name, None)

    def _entries(self, window: str, cat: str | None, reg: str | None) -> list[tuple[float, str]]:
        units = self._units.get((window, cat, reg), {})
        return [(-float(n), item) for item, n in units.items() if n > 0]

    def _trend_entries(self, cat: str | None, reg: str | None) -> list[tuple[float, str]]:
        short = self._units.get((SHORT_WINDOW, cat, reg), {})
        long = self._units.get((LONG_WINDOW, cat, reg), {})
        return [(-trending_score(n, long.get(item, 0)), item)
                for item, n in short.items() if n > 0]


def _first_tile_after(t: int, slide: int) -> int:
    """The first tile start (a multiple of ``slide``) later than ``t``."""
    return t - t % slide + slide


class RunningItems:
    """Per item, :class:`ItemBase` sums over *every* tile of each window as of the clock's
    tile, kept by changes: what :func:`finalize_item` computes, without reading the tiles.

    Why: the Real-time feed finalizes every item a flush touches (up to fifty flushes a
    second), and a popular item holds a tile for every minute of the day: reading and
    summing its 1,440 tiles per touch grows with every hour the stream has run. Here a
    tile's new full value replaces the old one in the windows that hold it, and the clock
    moving on removes the tiles that left each window (read by the caller: only those).
    Tiles cover disjoint times, so the latest category is in the newest tile and survives
    removals of older ones (:class:`ItemBase`).

    In memory of one process (the feed, the only writer of these tiles): an item is
    rebuilt from its stored tiles on its first touch, and :meth:`clear` forgets
    everything when the process can no longer be sure its changes reached Redis.
    """

    def __init__(self, slide: int) -> None:
        self.slide = slide
        self._items: dict[str, tuple[int, ItemBase]] = {}

    def __len__(self) -> int:
        return len(self._items)

    def clear(self) -> None:
        self._items.clear()

    def known(self, item: str) -> bool:
        return item in self._items

    def leaving(self, item: str, current: int) -> list[int]:
        """The item's tiles that leave some window when its clock moves into ``current``."""
        since, _ = self._items[item]
        out: set[int] = set()
        for seconds in WINDOW_SECONDS.values():
            out.update(_leaving_tiles(since, current, seconds, self.slide))
        return sorted(out)

    def rebuild(self, item: str, tiles: Iterable[Mapping[str, Any]], current: int) -> None:
        """Start the item from every stored tile (as of tile ``current``)."""
        base = ItemBase({})
        tiles = list(tiles)  # read once per window
        for w in WINDOW_SECONDS:
            base.add_all(w, [t for t in tiles if in_window(int(t["tile_start"]), current, w)])
        self._items[item] = (current, base)

    def advance(self, item: str, current: int, tiles: Mapping[int, Mapping[str, Any]]) -> None:
        """Move the item's clock to ``current``: remove the tiles that left each window
        (``tiles``: start -> the tile as the sums hold it, for the starts :meth:`leaving`
        named; a missing start had no tile)."""
        since, base = self._items[item]
        if current <= since:
            return
        for w, seconds in WINDOW_SECONDS.items():
            for start in _leaving_tiles(since, current, seconds, self.slide):
                if start in tiles:
                    base.remove(w, tiles[start])
        self._items[item] = (current, base)

    def replace(self, item: str, old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> None:
        """A tile's new full value (``old``: the value it replaces, ``None`` if new), after
        :meth:`advance` to the clock."""
        current, base = self._items[item]
        start = int(new["tile_start"])
        for w in WINDOW_SECONDS:
            if in_window(start, current, w):
                if old is not None:
                    base.remove(w, old)
                base.add(w, new)

    def finalize(self, item: str, as_of: datetime) -> dict[str, Any]:
        """:func:`finalize_item` of the item as of ``as_of`` (in its clock's tile)."""
        _, base = self._items[item]
        return base.finalize(item, (), as_of, slide_seconds=self.slide)

    def forget_before(self, current: int) -> None:
        """Drop items whose clock is a whole long window behind ``current`` (every window
        of theirs is empty now; a later touch rebuilds them)."""
        horizon = current - WINDOW_SECONDS[LONG_WINDOW]
        for item in [i for i, (since, _) in self._items.items() if since <= horizon]:
            del self._items[item]


def _ranked(entries: Iterable[Mapping[str, Any]]) -> list[str]:
    """The items of a tile's last-items entries, latest first (ties by item).

    The entries are stored in that order already: the tiles' two producers,
    :func:`features.tiles.latest_distinct_items` (Spark) and :func:`merge_user`
    (:func:`_latest_entries`), rank them so, distinct (the tests check both). Sorting
    them again was 5 % of the micro-batch pass's CPU and 16 % of the Real-time feed's
    time at 2,000 events/s (py-spy).
    """
    return [e["item_id"] for e in entries]


def _ranked_lists(tile: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """A user tile's last-viewed and last-purchased items, each :func:`_ranked`."""
    return _ranked(tile.get("last_viewed", ())), _ranked(tile.get("last_purchased", ()))


def _first_distinct(lists: Iterable[list[str]], n: int) -> list[str]:
    """The first ``n`` distinct items of the lists in turn (tiles newest first, each ranked)."""
    out: list[str] = []
    seen: set[str] = set()
    for items in lists:
        for item in items:
            if item not in seen:
                seen.add(item)
                out.append(item)
                if len(out) == n:
                    return out
    return out


def _affinity(held: Mapping[str, list[Any]]) -> tuple[list[str], list[float]]:
    """Categories by weight, heaviest first, ties by category (as :func:`finalize_user`),
    and their weights, from :class:`_User`'s ``weights``.

    Two sorts in C instead of one keyed by a Python function: by category, then by
    weight, descending and stable, so equal weights keep the categories' order. A user
    active all day holds dozens of categories and is ranked again at every touch: the
    keyed sort was 12 % of the Real-time feed's time at 2,000 events/s (py-spy)."""
    ids = sorted(held)
    weights = [float(held[c][0]) for c in ids]
    order = sorted(range(len(ids)), key=weights.__getitem__, reverse=True)
    return [ids[i] for i in order], [weights[i] for i in order]


def _exact(value: float) -> int | Fraction:
    """A double as an exact number: an ``int`` when it is whole (the activity weights, most
    prices in cents are not), else a ``Fraction``; sums of these never drift."""
    return int(value) if value.is_integer() else Fraction(value)


class _UserSums:
    """A user's window sums over some of its tiles, exact, so tiles can be taken out again:
    the counts and spend per window, the long window's category weights and the short
    window's items viewed, each with the number of tiles holding it
    (:class:`RunningUsers`' users, :class:`UserBase`)."""

    __slots__ = ("counts", "spend", "weights", "items")

    def __init__(self) -> None:
        self.counts = {w: [0, 0, 0] for w in WINDOW_SECONDS}  # views, carts, purchases
        self.spend: dict[str, int | Fraction] = dict.fromkeys(WINDOW_SECONDS, 0)
        # long window: category -> [exact weight, tiles holding it]
        self.weights: dict[str, list[Any]] = {}
        # short window: item -> tiles holding it among their items viewed
        self.items: dict[str, int] = {}

    def add(self, tile: Mapping[str, Any], window: str, sign: int) -> None:
        counts = self.counts[window]
        counts[0] += sign * int(tile["views"])
        counts[1] += sign * int(tile["carts"])
        counts[2] += sign * int(tile["purchases"])
        spend = float(tile["spend"])
        if spend:
            self.spend[window] += sign * _exact(spend)
        if window == LONG_WINDOW:
            self._add_weights(tile["category_weights"], sign)
        if window == SHORT_WINDOW:
            self._add_items(tile["items_viewed"], sign)

    def replace(self, old: Mapping[str, Any], new: Mapping[str, Any], window: str) -> None:
        """``add(old, window, -1)`` then ``add(new, window, 1)``, touching only what differs.

        Why: the feed replaces the clock's tile of a user at every event of it, and that
        tile's lists grow through the minute (a dozen items viewed and categories by its
        end): removing and adding every entry made each row cost more the later it came
        in the minute, while one event changes one or two entries. The sums are exact, so
        the result is the same numbers; a list holding an entry twice (no producer makes
        one) takes the entry-by-entry way.
        """
        counts = self.counts[window]
        counts[0] += int(new["views"]) - int(old["views"])
        counts[1] += int(new["carts"]) - int(old["carts"])
        counts[2] += int(new["purchases"]) - int(old["purchases"])
        was, now = float(old["spend"]), float(new["spend"])
        if was != now:
            self.spend[window] += _exact(now) - _exact(was)
        if window == LONG_WINDOW:
            self._replace_weights(old["category_weights"], new["category_weights"])
        if window == SHORT_WINDOW:
            self._replace_items(old["items_viewed"], new["items_viewed"])

    def _replace_weights(self, old: list[Mapping[str, Any]], new: list[Mapping[str, Any]]
                         ) -> None:
        if old == new:
            return
        before = {e["category_id"]: float(e["weight"]) for e in old}
        if len(before) != len(old):
            self._add_weights(old, -1)
            self._add_weights(new, 1)
            return
        for entry in new:
            cat = entry["category_id"]
            weight = float(entry["weight"])
            had = before.pop(cat, None)
            if had is None:  # in the new tile only
                self._shift_weight(cat, _exact(weight), 1)
            elif had != weight:
                self._shift_weight(cat, _exact(weight) - _exact(had), 0)
        for cat, had in before.items():  # in the old tile only
            self._shift_weight(cat, -_exact(had), -1)

    def _shift_weight(self, cat: str, weight: int | Fraction, tiles: int) -> None:
        """One category's long-window weight and count of tiles holding it, changed by these
        (as :meth:`_add_weights` changes them: gone when no tile holds it)."""
        held = self.weights.get(cat)
        if held is None:
            held = self.weights[cat] = [0, 0]
        held[0] += weight
        held[1] += tiles
        if not held[1]:
            del self.weights[cat]

    def _add_weights(self, entries: list[Mapping[str, Any]], sign: int) -> None:
        weights = self.weights
        for entry in entries:
            cat = entry["category_id"]
            held = weights.get(cat)
            if held is None:
                held = weights[cat] = [0, 0]
            held[0] += sign * _exact(float(entry["weight"]))
            held[1] += sign
            if not held[1]:
                del weights[cat]

    def _replace_items(self, old: list[str], new: list[str]) -> None:
        if old == new:
            return
        before = set(old)
        if len(before) != len(old):
            self._add_items(old, -1)
            self._add_items(new, 1)
            return
        items = self.items
        for item in new:
            if item in before:
                before.discard(item)
            else:
                items[item] = items.get(item, 0) + 1
                if not items[item]:
                    del items[item]
        for item in before:  # in the old tile only
            n = items.get(item, 0) - 1
            if n:
                items[item] = n
            else:
                del items[item]

    def _add_items(self, entries: list[str], sign: int) -> None:
        items = self.items
        for item in entries:
            n = items.get(item, 0) + sign
            if n:
                items[item] = n
            else:
                del items[item]


class _User(_UserSums):
    """One user's tiles and their sums per window as of tile ``since`` (:class:`RunningUsers`)."""

    __slots__ = ("since", "ahead", "touched", "tiles", "ranked")

    def __init__(self, since: int, touched: float) -> None:
        super().__init__()
        self.since = since
        self.ahead = False  # holds a tile after ``since`` (in no window yet)
        self.touched = touched
        self.tiles: dict[int, Mapping[str, Any]] = {}
        # per tile, its last-viewed and last-purchased items, latest first: ranked when a
        # finalize first reads the tile (only the newest few are: it stops at N items)
        self.ranked: dict[int, tuple[list[str], list[str]]] = {}


_COUNT_COLUMNS = tuple((f"{name}_{w}", w, i) for i, name in enumerate(("views", "carts", "purchases"))
                       for w in WINDOW_SECONDS)
_SPEND_COLUMNS = tuple((f"spend_{w}", w) for w in WINDOW_SECONDS)


def _user_row(user_id: str, sums: _UserSums, distinct_items: int, last_us: int | None,
              weights: Mapping[str, list[Any]], viewed: list[str], purchased: list[str],
              as_of: datetime) -> dict[str, Any]:
    """:func:`finalize_user`'s row from exact sums (:class:`RunningUsers`, :class:`UserBase`)."""
    row: dict[str, Any] = {"user_id": user_id}
    counts = sums.counts
    for column, w, i in _COUNT_COLUMNS:
        row[column] = counts[w][i]
    for column, w in _SPEND_COLUMNS:
        row[column] = float(sums.spend[w])
    row["distinct_items_viewed_1h"] = distinct_items
    row["last_event_time"] = from_us(last_us - last_us % 1_000_000) if last_us is not None else None
    ids, affinity = _affinity(weights)
    row["top_category"] = ids[0] if ids else None
    row["category_affinity_ids"] = ids
    row["category_affinity_weights"] = affinity
    row["last_viewed_items"] = viewed
    row["last_purchased_items"] = purchased
    row["event_timestamp"] = as_of
    return row


def _in_front(items: list[str], start: int, held: list[list[Any]], n: int) -> list[list[Any]]:
    """The first ``n`` distinct of ``items`` (a newer tile's, tagged with its start) then
    ``held``'s entries."""
    out: list[list[Any]] = []
    seen: set[str] = set()
    for entry in (*([item, start] for item in items), *held):
        if entry[0] not in seen:
            seen.add(entry[0])
            out.append(entry)
            if len(out) == n:
                break
    return out


def _exact_json(value: int | Fraction) -> list[str]:
    return [str(value.numerator), str(value.denominator)]


def _exact_of(doc: list[str]) -> int | Fraction:
    p, q = int(doc[0]), int(doc[1])
    return p if q == 1 else Fraction(p, q)


class UserBase:
    """A user's features over each window's *closed* tiles: :class:`ItemBase` for users.

    Why: a batch that touched a user read, decoded and summed every tile of the user's
    24 hours, so a user active all day (a tile a minute) cost up to 1,440 tiles at each
    touch, and a live stream's per-key pass grew with every hour it ran. The stream moves
    the base forward as it moves an item's (:meth:`add` the tiles that closed,
    :meth:`remove` those that left a window) and a batch reads only the base and the open
    tiles, plus the tiles the base moves over.

    Sums, category weights and the short window's items viewed are exact
    (:class:`_UserSums`), so removing leaves no drift. The last event is the newest
    tile's, the last of the range to leave. The last-items lists keep the first
    ``last_items_n`` distinct items of the long window's tiles, newest tile first, each
    with its tile: a tile that closes is newer than every tile of the base, so its items
    go in front; a tile that leaves is the oldest, so dropping its entries leaves the
    first distinct items of the rest (when one of them was among those kept, every item
    of the newer tiles was too). Tiles must be added in start order (the stream does).
    """

    __slots__ = ("ranges", "n", "sums", "count", "last", "viewed", "purchased")

    def __init__(self, ranges: Mapping[str, tuple[int, int]], *, last_items_n: int) -> None:
        self.ranges = dict(ranges)
        self.n = last_items_n
        self.sums = _UserSums()
        self.count = dict.fromkeys(WINDOW_SECONDS, 0)
        self.last: tuple[int, int] | None = None  # (tile start, last event µs) of the newest
        self.viewed: list[list[Any]] = []  # [item, tile start], latest first
        self.purchased: list[list[Any]] = []

    def add(self, window: str, tile: Mapping[str, Any], sign: int = 1) -> None:
        self.sums.add(tile, window, sign)
        self.count[window] += sign
        if window != LONG_WINDOW:
            return
        start = int(tile["tile_start"])
        if sign > 0:
            if self.last is not None and start <= self.last[0]:
                raise ValueError(f"user tile {start} added after tile {self.last[0]}: "
                                 "a base takes its tiles in start order")
            self.last = (start, int(tile["last_event_us"]))
            viewed, purchased = _ranked_lists(tile)
            self.viewed = _in_front(viewed, start, self.viewed, self.n)
            self.purchased = _in_front(purchased, start, self.purchased, self.n)
        else:
            self.viewed = [e for e in self.viewed if e[1] != start]
            self.purchased = [e for e in self.purchased if e[1] != start]
            if self.count[window] == 0:
                self.last = None

    def add_all(self, window: str, tiles: list[Mapping[str, Any]]) -> None:
        """:meth:`add` of each tile, in start order (a rebuild)."""
        for tile in tiles:
            self.add(window, tile)

    def remove(self, window: str, tile: Mapping[str, Any]) -> None:
        self.add(window, tile, -1)

    def reset(self, window: str) -> None:
        """Empty one window (its whole range is to be added again)."""
        sums = self.sums
        sums.counts[window] = [0, 0, 0]
        sums.spend[window] = 0
        self.count[window] = 0
        if window == LONG_WINDOW:
            sums.weights = {}
            self.last = None
            self.viewed, self.purchased = [], []
        if window == SHORT_WINDOW:
            sums.items = {}

    def finalize(self, user_id: str, open_tiles: Iterable[Mapping[str, Any]], as_of: datetime,
                 *, slide_seconds: int) -> dict[str, Any]:
        """:func:`finalize_user` over the base's tiles plus ``open_tiles`` (those after it,
        in start order)."""
        current = tile_of(as_of, slide_seconds)
        sums = _UserSums()
        base = self.sums
        sums.counts = {w: list(c) for w, c in base.counts.items()}
        sums.spend = dict(base.spend)
        sums.weights = {c: list(held) for c, held in base.weights.items()}
        extra: set[str] = set()  # items viewed in the hour's open tiles, not in the base's
        last = self.last[1] if self.last is not None else None
        newest: list[Mapping[str, Any]] = []
        for tile in open_tiles:
            start = int(tile["tile_start"])
            if not in_window(start, current, LONG_WINDOW):
                continue
            for w in WINDOW_SECONDS:
                if w != LONG_WINDOW and not in_window(start, current, w):
                    continue
                counts = sums.counts[w]
                counts[0] += int(tile["views"])
                counts[1] += int(tile["carts"])
                counts[2] += int(tile["purchases"])
                spend = float(tile["spend"])
                if spend:
                    sums.spend[w] += _exact(spend)
            sums._add_weights(tile["category_weights"], 1)
            if in_window(start, current, SHORT_WINDOW):
                extra.update(i for i in tile["items_viewed"] if i not in base.items)
            last = int(tile["last_event_us"])
            newest.append(tile)
        newest.reverse()
        ranked = [_ranked_lists(t) for t in newest]
        n = self.n
        viewed = _first_distinct((*(r[0] for r in ranked), [e[0] for e in self.viewed]), n)
        purchased = _first_distinct((*(r[1] for r in ranked), [e[0] for e in self.purchased]), n)
        return _user_row(user_id, sums, len(base.items) + len(extra), last, sums.weights,
                         viewed, purchased, as_of)

    def to_json(self) -> bytes:
        sums = self.sums
        return orjson.dumps({
            "r": {w: list(r) for w, r in self.ranges.items()}, "n": self.n, "k": self.count,
            "c": sums.counts, "s": {w: _exact_json(v) for w, v in sums.spend.items()},
            "w": {c: [*_exact_json(held[0]), held[1]] for c, held in sums.weights.items()},
            "i": sums.items, "l": list(self.last) if self.last else None,
            "v": self.viewed, "p": self.purchased,
        })

    @classmethod
    def from_json(cls, raw: bytes | str) -> UserBase:
        doc = orjson.loads(raw)
        base = cls({w: (int(r[0]), int(r[1])) for w, r in doc["r"].items()},
                   last_items_n=int(doc["n"]))
        base.count = {w: int(k) for w, k in doc["k"].items()}
        sums = base.sums
        sums.counts = {w: [int(x) for x in c] for w, c in doc["c"].items()}
        sums.spend = {w: _exact_of(v) for w, v in doc["s"].items()}
        sums.weights = {c: [_exact_of(held[:2]), int(held[2])] for c, held in doc["w"].items()}
        sums.items = {i: int(k) for i, k in doc["i"].items()}
        base.last = (int(doc["l"][0]), int(doc["l"][1])) if doc["l"] else None
        base.viewed = [[e[0], int(e[1])] for e in doc["v"]]
        base.purchased = [[e[0], int(e[1])] for e in doc["p"]]
        return base


class RunningUsers:
    """Per user, the tiles the feed last read or wrote and their sums per window as of the
    clock: what :func:`finalize_user` computes, without reading or summing every tile.

    Why: in live traffic (the benchmark's users, 500 events/s) reading, decoding and
    summing every stored tile of each touched user took 60 % of the feed's time (py-spy),
    and a user active all day holds a tile for each of its active minutes. Here a user is
    loaded from Redis on its first touch; then each tile the feed writes replaces its old
    value in the windows that hold it, and the clock moving on removes the tiles that left
    a window (they are in memory). The feed is the only writer of these tiles. Counts are
    integers; spend and category weights are exact (:func:`_exact`), so a removal leaves
    no drift, and the doubles are the exactly rounded sums (within the verifier's 1e-9 of
    Spark's, which adds in no fixed order).

    Bounded: at most ``max_tiles`` tiles (least recently touched users go first), no
    tile out of every window, and no user untouched for ``max_idle_s`` (half the keys'
    TTL: Redis may have expired a key whose user was idle longer).
    """

    def __init__(self, slide: int, *, max_tiles: int, max_idle_s: float) -> None:
        self.slide = slide
        self.max_tiles = max_tiles
        self.max_idle_s = max_idle_s
        self._users: OrderedDict[str, _User] = OrderedDict()
        self._count = 0
        # tile start -> users holding a tile there: trim visits only what it forgets
        self._at: dict[int, set[str]] = defaultdict(set)
        self.loads = 0
        """Users loaded from Redis so far (first touches, and touches after an eviction)."""

    def __len__(self) -> int:
        return len(self._users)

    @property
    def tile_count(self) -> int:
        return self._count

    def known(self, user: str) -> bool:
        return user in self._users

    def load(self, user: str, tiles: Iterable[Mapping[str, Any]], current: int,
             now: float) -> None:
        """The user's tiles as stored in Redis (this flush's writes included), as of tile
        ``current``."""
        self._drop(user)
        state = self._users[user] = _User(current, now)
        state.tiles = {int(t["tile_start"]): t for t in tiles}
        self._count += len(state.tiles)
        self.loads += 1
        for start, tile in state.tiles.items():
            self._at[start].add(user)
            state.ahead |= start > current
            for w in WINDOW_SECONDS:
                if in_window(start, current, w):
                    state.add(tile, w, 1)

    def put(self, user: str, tile: Mapping[str, Any], current: int, now: float) -> None:
        """A tile the feed wrote (its full value; ``current``: the clock's tile, not before
        the tile's); ignored for a user not loaded."""
        state = self._users.get(user)
        if state is None:
            return
        self._advance(state, current)
        start = int(tile["tile_start"])
        old = state.tiles.get(start)
        for w in WINDOW_SECONDS:
            if in_window(start, current, w):
                if old is not None:
                    state.replace(old, tile, w)
                else:
                    state.add(tile, w, 1)
        if old is None:
            self._count += 1
            self._at[start].add(user)
        state.tiles[start] = tile
        state.ranked.pop(start, None)
        state.touched = now
        self._users.move_to_end(user)

    def tiles(self, user: str) -> list[Mapping[str, Any]]:
        return list(self._users[user].tiles.values())

    def finalize(self, user: str, as_of: datetime, *, last_items_n: int) -> dict[str, Any]:
        """:func:`finalize_user` of the user's tiles as of ``as_of`` (not before its clock)."""
        state = self._users[user]
        current = tile_of(as_of, self.slide)
        self._advance(state, current)
        # newest first, only those in the long window (older ones wait for trim)
        floor = current - WINDOW_SECONDS[LONG_WINDOW]
        starts = sorted(state.tiles, reverse=True)
        if starts and (starts[-1] <= floor or starts[0] > current):  # until trim / ahead
            starts = [s for s in starts if floor < s <= current]
        last = int(state.tiles[starts[0]]["last_event_us"]) if starts else None
        return _user_row(
            user, state, len(state.items), last, state.weights,
            _first_distinct((self._ranked(state, s)[0] for s in starts), last_items_n),
            _first_distinct((self._ranked(state, s)[1] for s in starts), last_items_n), as_of)

    def trim(self, current: int, now: float) -> None:
        """As of the clock's tile ``current``: forget tiles out of every window (and users
        left without any), users idle too long, then the least recently touched users
        while over ``max_tiles``."""
        horizon = current - WINDOW_SECONDS[LONG_WINDOW]
        for start in sorted(s for s in self._at if s <= horizon):
            for user in self._at.pop(start):
                state = self._users[user]
                self._advance(state, current)  # their sums must not hold what is forgotten
                del state.tiles[start]
                state.ranked.pop(start, None)
                self._count -= 1
                if not state.tiles:
                    del self._users[user]
        while self._users:
            state = next(iter(self._users.values()))
            if (state.touched >= now - self.max_idle_s and self._count <= self.max_tiles
                    and state.tiles):
                break
            self._drop(next(iter(self._users)))

    def bound(self) -> None:
        """Drop the least recently touched users while over ``max_tiles``: called once the
        users a flush touched are finalized (one flush may go over, none stays over)."""
        while self._count > self.max_tiles and self._users:
            self._drop(next(iter(self._users)))

    def clear(self) -> None:
        self._users.clear()
        self._at.clear()
        self._count = 0

    @staticmethod
    def _ranked(state: _User, start: int) -> tuple[list[str], list[str]]:
        ranked = state.ranked.get(start)
        if ranked is None:
            ranked = state.ranked[start] = _ranked_lists(state.tiles[start])
        return ranked

    def _advance(self, state: _User, current: int) -> None:
        """Remove from each window the tiles that left it since the user's clock (and add
        those a stored clock behind them loaded early, which the clock now reached)."""
        since = state.since
        if current <= since:
            return
        tiles = state.tiles
        for w, seconds in WINDOW_SECONDS.items():
            leaving = _leaving_tiles(since, current, seconds, self.slide)
            if len(leaving) <= len(tiles):
                gone = [tiles[s] for s in leaving if s in tiles]
            else:
                gone = [t for s, t in tiles.items() if s in leaving]
            for tile in gone:
                state.add(tile, w, -1)
        if state.ahead:
            for start, tile in tiles.items():
                if since < start <= current:
                    for w in WINDOW_SECONDS:
                        if in_window(start, current, w):
                            state.add(tile, w, 1)
            state.ahead = any(start > current for start in tiles)
        state.since = current

    def _drop(self, user: str) -> None:
        state = self._users.pop(user, None)
        if state is not None:
            self._count -= len(state.tiles)
            for start in state.tiles:
                users = self._at.get(start)
                if users is not None:
                    users.discard(user)
                    if not users:
                        del self._at[start]


def _leaving_tiles(since: int, current: int, seconds: int, slide: int) -> range:
    """Tiles in a ``seconds`` window as of tile ``since`` and not as of ``current``."""
    return range(_first_tile_after(since - seconds, slide), min(current - seconds, since) + 1, slide)
